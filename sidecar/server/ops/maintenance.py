"""The node's background log work: Kafka's LogManager schedule and the cleaner threads.

A `Scheduler` thread runs the periodic tasks with Kafka's names and settings:

| task | every | does |
|---|---|---|
| `kafka-log-retention` | `log.retention.check.interval.ms` | retention of logs whose policy is delete only |
| `kafka-log-flusher` | `log.flush.scheduler.interval.ms` | `Log.maybe_flush` (each topic's `flush.ms`) |
| `kafka-recovery-point-checkpoint` | `log.flush.offset.checkpoint.interval.ms` | `LogDir.checkpoint` |
| `kafka-log-start-offset-checkpoint` | `log.flush.start.offset.checkpoint.interval.ms` | `LogDir.checkpoint` |
| `kafka-delete-logs` | 1 s | `Log.delete_expired_files` (`file.delete.delay.ms`) |
| `PeriodicProducerExpirationCheck` | `producer.id.expiration.check.interval.ms` | `Log.remove_expired_producers` |

Each starts after `log.initial.task.delay.ms`. Compacted logs (`compact` and `compact,delete`) get
retention from the cleaner threads after every cleaning attempt (`LogCleaner._retain_compacted`), as
in Kafka, so with `log.cleaner.enable=false` they get none. Kafka deletes each `.deleted` segment with
a one-off task at exactly `file.delete.delay.ms`; one task polling every second does the same job
without a timer per segment.

Every per-log step holds the log's lock and first checks that the log is still the directory's, so a
topic deleted meanwhile is skipped rather than written to. Errors are logged with the topic-partition
and counted per task (`TaskStatus`); nothing a task raises stops the scheduler.

Cleaning states follow Kafka's LogCleanerManager: retention of a delete-only log pauses its cleaning
for the duration (and skips logs paused or being cleaned), a topic deletion aborts and pauses cleaning
of each partition before its log goes (`before_delete`) and forgets the partition after
(`topic_changed`), and a topic that stops being compacted has its running pass aborted. A pass left
"in progress" by a cleaner thread that died is ended rather than waited for, so a deletion never
hangs the event loop.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from dataclasses import dataclass
from typing import Callable

from ...log.cleaner_manager import CleanerManager, CleaningState, CleaningStateError
from ...log.log import Log, now_ms
from ...log.log_cleaner import LogCleaner
from ...log.log_dir import LogDir
from ...log.log_dirs import LogDirs
from ...log.pause_owners import ABORT, DELETION, RETENTION, PauseOwner
from ...log.retention import delete_old_segments
from ...log.topic_partition import TopicPartition
from ...plural import plural
from ...server_config import ServerConfig
from ...topics.registry import TopicRegistry

logger = logging.getLogger(__name__)

FILE_DELETE_CHECK_INTERVAL_MS = 1000
_MAX_WAIT_S = 3600.0  # a wait longer than threading.TIMEOUT_MAX overflows; Long.MAX periods wait in steps


@dataclass
class TaskStatus:
    """What a scheduled task has done, for /status and /metrics."""

    name: str
    interval_ms: int
    runs: int = 0
    errors: int = 0  # failed runs plus failed per-partition steps
    last_run_ms: int | None = None
    last_error: str = ""

    def failed(self, message: str) -> None:
        self.errors += 1
        self.last_error = message


@dataclass(order=True)
class _Entry:
    due_s: float
    seq: int
    status: TaskStatus
    fn: Callable[[], None]
    period_s: float


class Scheduler:
    """Kafka's KafkaScheduler in one thread: periodic tasks, each run isolated from the others' failures."""

    def __init__(self, name: str = "shale-scheduler", clock: Callable[[], int] = now_ms) -> None:
        self.name = name
        self.clock = clock
        self._cond = threading.Condition()
        self._queue: list[_Entry] = []
        self._seq = itertools.count()
        self._stopped = False
        self._thread: threading.Thread | None = None

    def schedule(self, status: TaskStatus, fn: Callable[[], None], delay_ms: int, period_ms: int) -> None:
        """Run `fn` after `delay_ms`, then every `period_ms` (once if `period_ms` <= 0, as KafkaScheduler)."""
        entry = _Entry(time.monotonic() + delay_ms / 1000, next(self._seq), status, fn, period_ms / 1000)
        with self._cond:
            heapq.heappush(self._queue, entry)
            self._cond.notify_all()

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        self._thread.start()

    def shutdown(self, timeout_s: float = 30.0) -> None:
        """Stop taking tasks and wait for the one running, if any."""
        with self._cond:
            self._stopped = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout_s)
            if self._thread.is_alive():
                logger.error("scheduler thread %s did not stop within %.0f s", self.name, timeout_s)

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._stopped:
                    now = time.monotonic()
                    if self._queue and self._queue[0].due_s <= now:
                        break
                    wait = self._queue[0].due_s - now if self._queue else _MAX_WAIT_S
                    self._cond.wait(min(wait, _MAX_WAIT_S))
                if self._stopped:
                    return
                entry = heapq.heappop(self._queue)
                if entry.period_s > 0:
                    heapq.heappush(self._queue, _Entry(time.monotonic() + entry.period_s, next(self._seq),
                                                       entry.status, entry.fn, entry.period_s))
            self._run_one(entry)

    def _run_one(self, entry: _Entry) -> None:
        status = entry.status
        try:
            entry.fn()
        except Exception as exc:  # noqa: BLE001 - a task failure must not end the scheduler
            status.failed(f"{type(exc).__name__}: {exc}")
            logger.exception("scheduled task %s failed", status.name)
        finally:
            status.runs += 1
            status.last_run_ms = self.clock()


class Maintenance:
    """Scheduled log tasks and the cleaner threads of one node's log directories."""

    def __init__(self, log_dir: LogDir | LogDirs, registry: TopicRegistry, config: ServerConfig, *,
                 clock: Callable[[], int] = now_ms,
                 file_delete_check_interval_ms: int = FILE_DELETE_CHECK_INTERVAL_MS) -> None:
        self.log_dir = log_dir
        self.registry = registry
        self.config = config
        self.clock = clock
        self.manager = CleanerManager(log_dir.paths, lambda: dict(log_dir.logs), clock, dir_of=log_dir.dir_of)
        self.cleaner = LogCleaner(self.manager, lambda: dict(log_dir.logs), config.cleaner_config(), clock)
        self.scheduler = Scheduler(clock=clock)
        self._stopping = threading.Event()
        self._deleting: set[TopicPartition] = set()  # paused by before_delete, forgotten once their log is gone
        self._compacted: dict[str, bool] = {}  # topic -> compact, to notice compact -> not compact
        c = config
        self.tasks: dict[str, TaskStatus] = {}
        for name, interval, fn in (
            ("kafka-log-retention", c.log_retention_check_interval_ms, self.run_retention),
            ("kafka-log-flusher", c.log_flush_scheduler_interval_ms, self.run_flush),
            ("kafka-recovery-point-checkpoint", c.log_flush_offset_checkpoint_interval_ms, self.run_checkpoint),
            ("kafka-log-start-offset-checkpoint", c.log_flush_start_offset_checkpoint_interval_ms,
             self.run_checkpoint),
            ("kafka-delete-logs", file_delete_check_interval_ms, self.run_delete_expired_files),
            ("PeriodicProducerExpirationCheck", c.producer_id_expiration_check_interval_ms,
             self.run_producer_expiration),
        ):
            status = self.tasks[name] = TaskStatus(name, interval)
            self.scheduler.schedule(status, (lambda f=fn, s=status: f(s)), c.log_initial_task_delay_ms, interval)
        registry.before_delete.append(self.before_delete)

    # -- lifecycle -------------------------------------------------------------------------------

    def start(self) -> None:
        self.scheduler.start()
        self.cleaner.start()
        logger.info("maintenance started: %s%s, retention every %d ms, checkpoints every %d ms",
                    plural(len(self.cleaner.cleaners), "cleaner thread"),
                    "" if self.config.log_cleaner_enable else " (log.cleaner.enable=false)",
                    self.config.log_retention_check_interval_ms, self.config.log_flush_offset_checkpoint_interval_ms)

    def shutdown(self) -> None:
        """Stop the scheduler (a running task finishes its current log) and the cleaner (a pass is aborted)."""
        self._stopping.set()
        self.scheduler.shutdown()
        self.cleaner.shutdown()

    # -- topic changes (called on the event loop) ------------------------------------------------

    def before_delete(self, tp: TopicPartition) -> None:
        """Kafka's abortAndPauseCleaning before a log is deleted: wait for a running pass to stop."""
        self.pause(tp, PauseOwner(DELETION))
        self._deleting.add(tp)

    def topic_changed(self, name: str) -> None:
        """After a topic was created, changed or deleted: forget deleted partitions, wake the cleaner."""
        for tp in [tp for tp in self._deleting if tp not in self.log_dir.logs]:
            self._deleting.discard(tp)
            self.manager.forget(tp)
        spec = self.registry.topics.get(name)
        compact = spec is not None and spec.config.compact
        if self._compacted.get(name) and spec is not None and not compact:
            # Kafka's updateTopicConfig: abortCleaning of each partition. It may wait for a pass; not on the loop.
            tps = [TopicPartition(name, p) for p in self.registry.local_partitions(spec)]
            threading.Thread(target=self._abort_cleaning, args=(tps,), name=f"shale-abort-cleaning-{name}",
                             daemon=True).start()
        if spec is None:
            self._compacted.pop(name, None)
        else:
            self._compacted[name] = compact
        self.cleaner.wake()

    # -- pausing ---------------------------------------------------------------------------------

    def pause(self, tp: TopicPartition, owner: PauseOwner | str | None = None) -> int:
        """Abort a running pass (waiting for it) and add `owner`'s pause; return the pause count.

        Unlike a bare `CleanerManager.pause`, this never waits forever: a pass left behind by a dead
        cleaner thread is ended, and a concurrent abort of the same pass is waited out.
        """
        while True:
            if (self.cleaner.live_threads == 0
                    and self.manager.state(tp).state in (CleaningState.IN_PROGRESS, CleaningState.ABORTED)):
                # The thread that had this partition died mid-pass: nobody would ever acknowledge an abort,
                # and waiting for one would hang the caller (the event loop, for a deletion). End the pass.
                logger.warning("cleaning of %s was left %s by a dead cleaner thread; ending it", tp,
                               self.manager.state(tp).state.value)
                try:
                    self.manager.done_cleaning(tp, None)
                except CleaningStateError:
                    pass
            try:
                return self.manager.pause(tp, owner)
            except CleaningStateError:  # another abort of the same pass is under way: it ends soon
                time.sleep(0.01)

    def resume(self, tp: TopicPartition, owner: PauseOwner | str | None = None) -> int:
        """Release `owner`'s pause (CleaningStateError if it holds none); return the remaining count."""
        count = self.manager.resume(tp, owner)
        if count == 0:
            self.cleaner.wake()
        return count

    def _abort_cleaning(self, tps: list[TopicPartition]) -> None:
        for tp in tps:
            self.pause(tp, PauseOwner(ABORT))
            self._resume_quietly(tp, PauseOwner(ABORT))

    def _resume_quietly(self, tp: TopicPartition, owner: PauseOwner) -> None:
        try:
            self.manager.resume(tp, owner)
        except CleaningStateError:  # the partition was deleted (and forgotten) meanwhile
            logger.debug("%s: nothing to resume, its cleaning state was reset", tp)

    # -- tasks -----------------------------------------------------------------------------------

    def _logs(self) -> dict[TopicPartition, Log]:
        with self.log_dir.lock:
            return dict(self.log_dir.logs)

    def _on_log(self, status: TaskStatus, what: str, tp: TopicPartition, log: Log,
                step: Callable[[Log], object]) -> None:
        """Run one step on one log under its lock, unless it was deleted; log and count a failure."""
        try:
            with log.lock:
                if self.log_dir.logs.get(tp) is not log:
                    return
                step(log)
        except Exception as exc:  # noqa: BLE001 - one partition's disk error must not stop the others
            status.failed(f"{tp}: {type(exc).__name__}: {exc}")
            logger.error("%s of %s failed: %s", what, tp, exc, exc_info=True)

    def run_retention(self, status: TaskStatus) -> None:
        """Kafka's cleanupLogs for delete-only logs: each paused for cleaning while its segments go."""
        now = self.clock()
        for tp, log in self._logs().items():
            if self._stopping.is_set():
                return
            if log.config.compact:
                continue  # the cleaner threads run retention on these
            if self.manager.state(tp).state not in (CleaningState.IDLE, CleaningState.UNCLEANABLE):
                continue  # paused (by an operator, a deletion) or being cleaned: Kafka skips it too
            try:
                self.manager.pause(tp, PauseOwner(RETENTION))
            except CleaningStateError:  # a pass of a log that just became compacted is being aborted
                continue
            try:
                self._on_log(status, "retention", tp, log, lambda lg: delete_old_segments(lg, now))
            finally:
                self._resume_quietly(tp, PauseOwner(RETENTION))

    def run_flush(self, status: TaskStatus) -> None:
        """Kafka's flushDirtyLogs: fsync the logs whose `flush.ms` has passed since their last flush."""
        for tp, log in self._logs().items():
            if self._stopping.is_set():
                return
            self._on_log(status, "flush", tp, log, Log.maybe_flush)

    def run_checkpoint(self, status: TaskStatus) -> None:
        """Write the recovery points and log start offsets."""
        try:
            self.log_dir.checkpoint()
        except Exception as exc:  # noqa: BLE001 - counted and retried at the next interval
            status.failed(f"{self.log_dir.path}: {type(exc).__name__}: {exc}")
            logger.error("writing the checkpoints of %s failed: %s", self.log_dir.path, exc, exc_info=True)

    def run_delete_expired_files(self, status: TaskStatus) -> None:
        for tp, log in self._logs().items():
            if self._stopping.is_set():
                return
            self._on_log(status, "deleting expired segment files", tp, log, Log.delete_expired_files)

    def run_producer_expiration(self, status: TaskStatus) -> None:
        """Kafka's removeExpiredProducers: forget idempotent producers idle for `producer.id.expiration.ms`."""
        now = self.clock()
        for tp, log in self._logs().items():
            if self._stopping.is_set():
                return
            self._on_log(status, "producer id expiration", tp, log, lambda lg: lg.remove_expired_producers(now))
