"""A node's log dirs (Kafka's `log.dirs`, JBOD): `LogDir`'s interface over several directories.

Each dir keeps its own `.lock`, clean-shutdown marker, recovery and checkpoints (`LogDir`); this class
places new partitions (the dir with the fewest partitions, current and future, as Kafka's LogManager
`nextLogDirs`), keeps one map of every partition's log, and carries out the two directory-level steps of a
log-dir move (docs/moves.md): recovering cut swaps before anything loads, and the swap itself.
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Callable, Sequence

from .errors import LogError
from .free_space import FreeFloor
from .future_replica import (
    FutureCopy,
    PendingMove,
    drop_swapped_out,
    future_dir_name,
    recover_moves,
    remove_future,
    swap_in,
    swap_out,
)
from .log import Log, now_ms
from .log_dir import LogDir
from .producer_state import DEFAULT_PRODUCER_ID_EXPIRATION_MS
from .topic_partition import TopicPartition

logger = logging.getLogger(__name__)


def parse_log_dirs(text: str) -> list[str]:
    """Kafka's `log.dirs`: comma-separated paths (blanks around them ignored); ValueError when none is given."""
    paths = [p.strip() for p in text.split(",") if p.strip()]
    if not paths:
        raise ValueError(f"no log dir in {text!r}")
    return paths


class DuplicatePartitionError(LogError):
    """The same partition is in two log dirs and no move explains it: which copy is right is not ours to guess."""


class LogDirs:
    """Every partition log of a node, over one or more log dirs."""

    def __init__(self, paths: Sequence[str], config_for: Callable[[str], object], *,
                 clock: Callable[[], int] = now_ms,
                 producer_id_expiration_ms: int = DEFAULT_PRODUCER_ID_EXPIRATION_MS,
                 floor: FreeFloor = FreeFloor()) -> None:
        absolute = [os.path.abspath(p) for p in paths]
        if not absolute:
            raise ValueError("no log dir given")
        if len(set(absolute)) != len(absolute):
            raise ValueError(f"a log dir is listed twice: {', '.join(absolute)}")
        self.lock = threading.RLock()  # shared by every dir: one lock order for all of them
        self.dirs: list[LogDir] = []
        self.logs: dict[TopicPartition, Log] = {}
        self._home: dict[TopicPartition, LogDir] = {}
        self.futures: dict[TopicPartition, tuple[str, LogDir]] = {}  # tp -> (move id, target dir)
        try:
            for path in absolute:  # every dir locked before a move's renames touch two of them
                self.dirs.append(LogDir(path, config_for, clock=clock,
                                        producer_id_expiration_ms=producer_id_expiration_ms, load=False,
                                        floor=floor))
            self.pending_moves: list[PendingMove] = recover_moves(absolute)
            for d in self.dirs:
                d.lock = self.lock
                d.load()
                for tp, log in d.logs.items():
                    if tp in self._home:
                        raise DuplicatePartitionError(
                            f"partition {tp} is in two log dirs, {self._home[tp].path} and {d.path}, and no move "
                            f"explains it: remove the stale copy")
                    self.logs[tp] = log
                    self._home[tp] = d
        except BaseException:
            for d in self.dirs:
                d.release()
            raise
        by_path = {d.path: d for d in self.dirs}
        for move in self.pending_moves:
            self.futures[move.tp] = (move.move_id, by_path[move.target])
        self.path = self.dirs[0].path  # node files (API topics, producer ids) live in the first dir
        self.paths = [d.path for d in self.dirs]
        self.spaces = [d.space for d in self.dirs]
        self.is_new = all(d.is_new for d in self.dirs)
        self.had_clean_shutdown = all(d.had_clean_shutdown for d in self.dirs)

    # -- LogDir's interface ------------------------------------------------------------------------

    def dir_of(self, tp: TopicPartition) -> str | None:
        d = self._home.get(tp)
        return None if d is None else d.path

    def get_or_create(self, tp: TopicPartition, topic_id: str | None = None, config=None) -> Log:
        with self.lock:
            if tp in self.logs:
                return self.logs[tp]
            d = self._place()
            log = d.get_or_create(tp, topic_id, config)
            self.logs[tp] = log
            self._home[tp] = d
            return log

    def _place(self) -> LogDir:
        """Kafka's rule: the dir with the fewest partitions, counting future replicas; ties to the first listed."""
        counts = {d.path: len(d.logs) for d in self.dirs}
        for _, target in self.futures.values():
            counts[target.path] += 1
        return min(self.dirs, key=lambda d: counts[d.path])

    def topic_id(self, tp: TopicPartition) -> str | None:
        d = self._home.get(tp)
        return None if d is None else d.topic_id(tp)

    def delete(self, tp: TopicPartition) -> None:
        """Delete the partition Kafka's way in its dir, and its future replica if a move was copying it."""
        with self.lock:
            d = self._home.pop(tp)
            self.logs.pop(tp)
            future = self.futures.pop(tp, None)
            d.delete(tp)
        if future is not None:
            remove_future(future[1].path, tp, future[0])

    def checkpoint(self) -> None:
        with self.lock:
            for d in self.dirs:
                d.checkpoint()

    def close(self) -> bool:
        """Close every dir (each writes its own marker); True only if all were clean."""
        with self.lock:
            return all([d.close() for d in self.dirs])

    # -- moves -------------------------------------------------------------------------------------

    def by_path(self, path: str) -> LogDir | None:
        path = os.path.abspath(path)
        return next((d for d in self.dirs if d.path == path), None)

    def add_future(self, tp: TopicPartition, move_id: str, target: LogDir) -> FutureCopy:
        """Create the future directory of a new move (with the partition's `partition.metadata`)."""
        with self.lock:
            source = self._home[tp]
            copy = FutureCopy(os.path.join(source.path, str(tp)), os.path.join(target.path,
                                                                                 future_dir_name(tp, move_id)))
            metadata = os.path.join(copy.source, "partition.metadata")
            with open(metadata, "rb") as f:
                copy.create(f.read())
            self.futures[tp] = (move_id, target)
            return copy

    def resume_future(self, tp: TopicPartition, move_id: str) -> FutureCopy:
        """A future replica found at load: its copy starts again from an empty directory, under the same move."""
        with self.lock:
            _, target = self.futures[tp]
            remove_future(target.path, tp, move_id)
            self.futures.pop(tp)
        return self.add_future(tp, move_id, target)

    def drop_future(self, tp: TopicPartition, move_id: str) -> None:
        """A move that ends without its swap: its future directory goes."""
        with self.lock:
            entry = self.futures.get(tp)
            if entry is not None and entry[0] == move_id:
                self.futures.pop(tp)
            target = entry[1].path if entry is not None else None
        if target is not None:
            remove_future(target, tp, move_id)

    def swap(self, tp: TopicPartition, move_id: str, copy: FutureCopy) -> Log:
        """Close the source log, finish the copy, swap by the three renames and serve the new log; return it.

        The caller makes sure no append is under way: it runs this where the Python path's appends run (the event
        loop), and the log's lock, held throughout, keeps out the I/O thread's C appends, which decline while it is
        held and after it (the closed segments' descriptors can no longer be pinned). A failure before the first
        rename reopens the source as it was; one between the first two renames undoes the first.
        """
        with self.lock:
            log = self.logs[tp]
            source = self._home[tp]
            _, target = self.futures[tp]
            with log.lock:
                start, end = log.log_start_offset, log.log_end_offset
                high_watermark, replicated = log.checkpointed_high_watermark, log.replicated
                if not log.close():
                    source.logs.pop(tp)
                    self._reopen(source, tp, end, start, high_watermark, replicated)
                    raise LogError(f"{tp}: its producer snapshot could not be written in {source.path}; not swapped")
                source.logs.pop(tp)
                try:
                    copy.finish()
                    swap_out(source.path, tp, move_id)
                except BaseException:
                    self._reopen(source, tp, end, start, high_watermark, replicated)
                    raise
                try:
                    swap_in(target.path, tp, move_id)
                except BaseException:
                    os.rename(os.path.join(source.path, f"{tp}.{move_id}-swapout"), os.path.join(source.path, str(tp)))
                    self._reopen(source, tp, end, start, high_watermark, replicated)
                    raise
                self.futures.pop(tp, None)
                new = self._reopen(target, tp, end, start, high_watermark, replicated)
                target.checkpoint()  # its log start offset, before the old copy (and the source's entry) goes
                drop_swapped_out(source.path, tp, move_id)
                source.checkpoint()
                return new

    def _reopen(self, d: LogDir, tp: TopicPartition, end: int, start: int, high_watermark: int | None,
                replicated: bool) -> Log:
        """The log opened again as it was served: its high watermark and whether other replicas exist (without
        that, its high watermark would read as its log end and a leader would acknowledge `acks=all` at once)."""
        log = d.open_log(tp, recovery_point=end, log_start_offset=start)
        if high_watermark is not None:
            log.set_high_watermark_on_load(high_watermark)
        log.replicated = replicated
        self.logs[tp] = log
        self._home[tp] = d
        return log
