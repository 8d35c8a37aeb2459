"""Moving replicas between the log dirs of one node: AlterReplicaLogDirs, its copy threads, their pauses.

Kafka's ReplicaAlterLogDirsManager with the leak of KAFKA-9087 designed out (docs/moves.md, section 3): each
move is one thread that takes the cleaning pause `move:<id>` before it creates the future replica and
releases it in a `finally` on every way out — done, failed, cancelled by another AlterReplicaLogDirs
(KAFKA-19458), its topic deleted. Only a node stopping (or killed) keeps the pause: it is persisted with
the future replica, and the move resumes at the next start; a persisted pause whose move is gone is released
at load (`CleanerManager.load_pauses`). Copies share one throttle,
`replica.alter.log.dirs.io.max.bytes.per.second`. The swap runs where appends run (`run_exclusive`: the event
loop), so no produce is under way while the source log closes.
"""

from __future__ import annotations

import copy
import logging
import os
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Callable, TypeVar

from ...log.cleaner_manager import CleaningStateError
from ...log.future_replica import CHUNK_BYTES, FutureCopy, MoveCancelled, future_dir_name
from ...log.log import now_ms
from ...log.log_dirs import LogDirs
from ...log.pause_owners import MOVE, PauseOwner
from ...log.throttler import Throttler
from ...log.topic_partition import TopicPartition
from ...protocol.error_codes import (
    INVALID_TOPIC_EXCEPTION,
    KAFKA_STORAGE_ERROR,
    LOG_DIR_NOT_FOUND,
    NONE,
    REPLICA_NOT_AVAILABLE,
)

logger = logging.getLogger(__name__)

T = TypeVar("T")
PENDING, COPYING, SWAPPING, DONE, FAILED, CANCELLED = "pending", "copying", "swapping", "done", "failed", "cancelled"
SWAP_BELOW_BYTES = CHUNK_BYTES  # what is left to copy when the swap (appends held) takes over
POLL_S = 0.05  # between rounds with nothing new to copy


@dataclass
class Move:
    """One replica's move, as /status and DescribeLogDirs show it."""

    id: str
    tp: TopicPartition
    source: str
    target: str
    started_ms: int
    state: str = PENDING
    reason: str = ""
    bytes_copied: int = 0
    bytes_remaining: int | None = None
    copied_through: int = 0  # the future replica's log end, at segment granularity (DescribeLogDirs' lag)
    finished_ms: int | None = None
    cancel: threading.Event = field(default_factory=threading.Event, repr=False)
    thread: threading.Thread | None = field(default=None, repr=False)

    @property
    def owner(self) -> PauseOwner:
        return PauseOwner(MOVE, self.id)

    @property
    def running(self) -> bool:
        return self.state in (PENDING, COPYING, SWAPPING)


class LogDirMoves:
    """The node's log-dir moves: started by AlterReplicaLogDirs, resumed at start, ended on every way out."""

    def __init__(self, log_dirs: LogDirs, maintenance, *, io_max_bytes_per_second: float,
                 run_exclusive: Callable[[Callable[[], T]], T] | None = None, clock: Callable[[], int] = now_ms) -> None:
        self.log_dirs = log_dirs
        self.maintenance = maintenance
        self.clock = clock
        self.run_exclusive = run_exclusive or (lambda fn: fn())
        self.moves: dict[TopicPartition, Move] = {}  # the running or last move of each partition
        self.bytes_moved_total = 0
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._copying = threading.local()  # `.cancel`: the Event of the move this copy thread runs
        # Checked at every chunk: a move must not copy a burst before the limit applies (a copy is bulk I/O).
        self.throttle = Throttler(io_max_bytes_per_second, sleep=self._sleep, check_interval_s=0)
        maintenance.registry.before_delete.append(self.topic_deleted)

    # -- start and stop ----------------------------------------------------------------------------

    def owner_exists(self, tp: TopicPartition, owner: PauseOwner) -> bool:
        """For `CleanerManager.load_pauses`: a move's pause holds while its future replica exists."""
        if owner.kind != MOVE:
            return True
        future = self.log_dirs.futures.get(tp)
        return future is not None and future[0] == owner.id

    def load(self) -> None:
        """At start, before the cleaner runs: keep the pauses whose owners exist, release the others."""
        self.maintenance.manager.load_pauses(self.owner_exists)

    def start(self) -> None:
        """Resume the moves whose future replicas were found at load (their copy starts again)."""
        for tp, (move_id, target) in sorted(self.log_dirs.futures.items(), key=lambda item: str(item[0])):
            move = Move(move_id, tp, self.log_dirs.dir_of(tp) or "", target.path, self.clock())
            logger.info("%s: resuming move %s from %s to %s", tp, move_id, move.source, move.target)
            self._launch(move, resume=True)

    def shutdown(self) -> None:
        """Stop every copy; each keeps its future replica and pause, and resumes at the next start."""
        self._stopping.set()
        with self._lock:
            running = [m for m in self.moves.values() if m.thread is not None]
        for move in running:
            move.cancel.set()
        for move in running:
            move.thread.join(30)

    # -- AlterReplicaLogDirs ---------------------------------------------------------------------

    def alter(self, tp: TopicPartition, path: str) -> int:
        """Kafka's alterReplicaLogDirs for one partition; returns the error code (the copy runs on its own).

        Kafka's checks in its order: a topic whose future directory name would not fit a file name
        (INVALID_TOPIC_EXCEPTION), a path that is not one of the log dirs as listed, absolute
        (LOG_DIR_NOT_FOUND), a dir that is not a writable directory any more, Kafka's offline dir
        (KAFKA_STORAGE_ERROR), a partition this node does not host (REPLICA_NOT_AVAILABLE)."""
        try:
            future_dir_name(tp, "0" * 32)  # a move id is 32 hex digits, as Kafka's
        except ValueError as exc:
            logger.warning("%s: cannot move to %s: %s", tp, path, exc)
            return INVALID_TOPIC_EXCEPTION
        target = self.log_dirs.by_path(path) if os.path.isabs(path) else None
        if target is None:
            return LOG_DIR_NOT_FOUND
        if not (os.path.isdir(target.path) and os.access(target.path, os.W_OK | os.X_OK)):
            logger.warning("%s: cannot move to %s: the log dir is not a writable directory", tp, target.path)
            return KAFKA_STORAGE_ERROR
        source = self.log_dirs.dir_of(tp)
        if source is None:
            return REPLICA_NOT_AVAILABLE
        with self._lock:
            current = self.moves.get(tp)
            if current is not None and current.running:
                if current.target == target.path:
                    return NONE  # the same move again: nothing new, and no second pause (KAFKA-16709)
                self._cancel(current, f"replaced by a move to {target.path}")
            if target.path == source:
                return NONE  # already there; a move elsewhere, if any, is cancelled
            move = Move(uuid.uuid4().hex, tp, source, target.path, self.clock())
            self._launch(move, resume=False, after=current)
        logger.info("%s: move %s from %s to %s started", tp, move.id, source, target.path)
        return NONE

    def topic_deleted(self, tp: TopicPartition) -> None:
        """TopicRegistry's before_delete: the move ends (its thread releases the pause); the future goes with the log."""
        with self._lock:
            move = self.moves.get(tp)
            if move is not None and move.running:
                self._cancel(move, "its topic was deleted")

    def _cancel(self, move: Move, reason: str) -> None:
        move.reason = reason
        move.cancel.set()

    # -- the copy thread ---------------------------------------------------------------------------

    def _launch(self, move: Move, *, resume: bool, after: Move | None = None) -> None:
        move.thread = threading.Thread(target=self._run, args=(move, resume, after), daemon=True,
                                       name=f"shale-log-dir-move-{move.tp}")
        self.moves[move.tp] = move
        move.thread.start()

    def _run(self, move: Move, resume: bool, after: Move | None) -> None:
        tp = move.tp
        try:
            self._copy_and_swap(move, resume, after)
            outcome = (DONE, "")
        except Exception as exc:  # noqa: BLE001 - every way out releases the pause below
            if move.cancel.is_set() and self._stopping.is_set() and not move.reason:
                # The node stops: the future replica and the (persisted) pause wait for the next start.
                logger.info("%s: move %s interrupted by the shutdown; it resumes at the next start", tp, move.id)
                return
            if move.cancel.is_set() or isinstance(exc, MoveCancelled):
                outcome = (CANCELLED, move.reason or str(exc))
                logger.warning("%s: move %s to %s cancelled: %s", tp, move.id, move.target, outcome[1])
            else:
                outcome = (FAILED, f"{type(exc).__name__}: {exc}")
                logger.error("%s: move %s from %s to %s failed: %s", tp, move.id, move.source, move.target,
                             outcome[1], exc_info=True)
            try:
                self.log_dirs.drop_future(tp, move.id)
            except OSError as e:
                logger.error("%s: cannot remove the future replica of move %s in %s: %s", tp, move.id, move.target, e)
        except BaseException:
            self._release(move)
            raise
        self._release(move)  # before the state says the move ended: whoever sees it ended sees the pause gone
        move.state, move.reason, move.finished_ms = *outcome, self.clock()
        if outcome[0] == DONE:
            move.bytes_remaining = 0
            logger.info("%s: move %s done: %s -> %s, %d bytes copied", tp, move.id, move.source, move.target,
                        move.bytes_copied)

    def _copy_and_swap(self, move: Move, resume: bool, after: Move | None) -> None:
        """Pause, create (or restart) the future replica, copy until nearly caught up, swap on the loop."""
        tp = move.tp
        if after is not None and after.thread is not None:
            after.thread.join()  # its future replica is gone before this one is made
        if move.cancel.is_set():
            raise MoveCancelled(move.reason)
        self.maintenance.pause(tp, move.owner)  # persisted before the future replica exists
        copy = self.log_dirs.resume_future(tp, move.id) if resume else self.log_dirs.add_future(
            tp, move.id, self.log_dirs.by_path(move.target))
        copy.throttle = lambda n: (self._moved(move, n), self.throttle(n))
        copy.cancelled = self._copying.cancel = move.cancel
        move.state = COPYING
        while True:
            log = self.log_dirs.logs.get(tp)
            if log is None:
                raise MoveCancelled("its topic was deleted")
            _, move.bytes_remaining = copy.plan(log)
            move.copied_through = copy.copied_through(log)
            if move.bytes_remaining <= SWAP_BELOW_BYTES:
                move.state = SWAPPING
                self.run_exclusive(lambda: self._swap(move, copy))
                return
            if copy.step(log) == 0:
                move.cancel.wait(POLL_S)

    def _swap(self, move: Move, copy: FutureCopy) -> None:
        """On the event loop: the last bytes, the renames, the new log served, the cleaner's checkpoint moved."""
        if move.cancel.is_set():
            raise MoveCancelled(move.reason)
        copy.throttle = lambda n: self._moved(move, n)  # appends wait meanwhile: the rest (one chunk) goes unthrottled
        manager = self.maintenance.manager
        first_dirty = manager.read_checkpoint().get(move.tp)
        new = self.log_dirs.swap(move.tp, move.id, copy)
        replication = self.maintenance.registry.replication
        replica = replication.partitions.get(move.tp) if replication is not None else None
        if replica is not None:
            replica.log = new  # the replica manager leads or follows with the moved log from now on
        if first_dirty is not None:  # now in the target dir's file, and gone from the source's (KAFKA-8362)
            manager.update_checkpoint(move.tp, first_dirty)
        self.maintenance.topic_changed(move.tp.topic)  # wakes the cleaner

    def _moved(self, move: Move, n: int) -> None:
        """A chunk copied: the move's progress and the node's total, visible while the throttle holds the copy."""
        with self._lock:
            self.bytes_moved_total += n
            move.bytes_copied += n
            if move.bytes_remaining is not None:
                move.bytes_remaining = max(move.bytes_remaining - n, 0)

    def _release(self, move: Move) -> None:
        try:
            self.maintenance.resume(move.tp, move.owner)
        except CleaningStateError as exc:  # a deleted partition's pauses went with it
            logger.debug("%s: no pause of move %s to release: %s", move.tp, move.id, exc)

    # -- throttle ----------------------------------------------------------------------------------

    def _sleep(self, seconds: float) -> None:
        """The throttle's sleep, cut short by the sleeping copy's cancel (or the shutdown, which cancels every
        copy): a move throttled to ~0 still ends. An Event, not a notification: a cancel that lands before the
        wait starts is not lost (the move replaced by a second AlterReplicaLogDirs would sleep out its debt)."""
        cancel = getattr(self._copying, "cancel", None)
        if cancel is None:
            time.sleep(seconds)
        else:
            cancel.wait(seconds)

    # -- figures -----------------------------------------------------------------------------------

    def snapshot(self) -> dict[TopicPartition, Move]:
        """Each move as it is now: copies, so a reader's figures do not change under it while it reads."""
        with self._lock:
            return {tp: copy.copy(move) for tp, move in self.moves.items()}
