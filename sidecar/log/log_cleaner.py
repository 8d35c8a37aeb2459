"""The cleaner threads: each loops grab-filthiest → clean → checkpoint → retention of compacted logs → back off.

Broker-level settings (`log.cleaner.*`) live in `CleanerConfig`; the dedupe buffer is
split between the threads as in Kafka. A pass that fails marks its partition
uncleanable (with the reason) instead of retrying it in a loop; an error that escapes
the loop kills the thread and shows in `dead_threads`.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from typing import Callable, Mapping

from .cleaner import Cleaner, CleanerStats, CleaningAbortedError
from .cleaner_manager import CleanerManager, CleaningState, LogCleaningError
from .offset_map import OffsetMap
from .pause_owners import SHUTDOWN, PauseOwner
from .retention import delete_old_segments
from .throttler import Throttler
from .topic_partition import TopicPartition

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class CleanerConfig:
    """Kafka's broker cleaner settings, with its defaults."""

    enable: bool = True
    threads: int = 1
    dedupe_buffer_size: int = 134_217_728
    io_buffer_load_factor: float = 0.9
    io_max_bytes_per_second: float = float("inf")
    backoff_ms: int = 15_000
    producer_id_expiration_ms: int = 86_400_000

    def __post_init__(self) -> None:
        if self.threads < 0:
            raise ValueError(f"Invalid value {self.threads} for configuration log.cleaner.threads: Value must be at least 0")
        if self.backoff_ms < 0:
            raise ValueError(f"Invalid value {self.backoff_ms} for configuration log.cleaner.backoff.ms: Value must be at least 0")
        if not 0 < self.io_buffer_load_factor <= 1:
            raise ValueError(f"Invalid value {self.io_buffer_load_factor} for configuration "
                             "log.cleaner.io.buffer.load.factor: must be in (0, 1]")

    @property
    def map_memory_per_thread(self) -> int:
        return min(self.dedupe_buffer_size // max(self.threads, 1), 2**31 - 1)


@dataclass
class ThreadStatus:
    index: int
    alive: bool = True
    last_stats: CleanerStats | None = None
    last_clean_ms: dict[TopicPartition, int] = field(default_factory=dict)
    error: str = ""


class LogCleaner:
    """Cleaner threads over the logs of one directory."""

    def __init__(self, manager: CleanerManager, logs: Callable[[], Mapping[TopicPartition, object]],
                 config: CleanerConfig, clock: Callable[[], int]) -> None:
        self.manager = manager
        self.logs = logs
        self.config = config
        self.clock = clock
        self.throttler = Throttler(config.io_max_bytes_per_second)
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._threads: list[threading.Thread] = []
        self.status = [ThreadStatus(i) for i in range(config.threads)]
        self.last_clean_ms: dict[TopicPartition, int] = {}
        self.cleaners = [
            Cleaner(OffsetMap(config.map_memory_per_thread, config.io_buffer_load_factor), clock=clock,
                    check_aborted=lambda log: manager.check_aborted(log.topic_partition), throttle=self.throttler,
                    producer_expiration_ms=config.producer_id_expiration_ms)
            for _ in range(config.threads)
        ] if config.enable else []

    # -- lifecycle -------------------------------------------------------------------------------

    def start(self) -> None:
        for i, cleaner in enumerate(self.cleaners):
            t = threading.Thread(target=self._run, args=(i, cleaner), name=f"shale-log-cleaner-thread-{i}", daemon=True)
            self._threads.append(t)
            t.start()

    def shutdown(self, timeout_s: float = 30.0) -> None:
        """Stop the threads; a pass in progress is aborted at its next check."""
        self._stop.set()
        self._wake.set()
        aborted = self.manager.abort_in_progress()
        for t in self._threads:
            t.join(timeout_s)
        for tp in aborted:  # the abort paused them, owned by `shutdown`
            state = self.manager.state(tp)  # still aborted: its thread died mid-pass
            if state.state is CleaningState.PAUSED and PauseOwner(SHUTDOWN) in state.owners:
                self.manager.resume(tp, PauseOwner(SHUTDOWN))

    def wake(self) -> None:
        """Cut the back-off short (tests, config changes)."""
        self._wake.set()

    @property
    def dead_threads(self) -> int:
        return sum(1 for s in self.status[: len(self._threads)] if not s.alive)

    @property
    def live_threads(self) -> int:
        return sum(1 for t in self._threads if t.is_alive())

    def _run(self, index: int, cleaner: Cleaner) -> None:
        status = self.status[index]
        try:
            while not self._stop.is_set():
                cleaned = self.clean_once(cleaner, index)
                if not cleaned:
                    self._wake.wait(self.config.backoff_ms / 1000.0)
                    self._wake.clear()
        except BaseException as e:  # a thread that dies is counted, as Kafka's DeadThreadCount
            status.alive = False
            status.error = repr(e)
            logger.exception("log cleaner thread %d died", index)

    # -- one iteration ---------------------------------------------------------------------------

    def clean_once(self, cleaner: Cleaner, index: int = 0) -> bool:
        """Clean the filthiest log if any, then run retention on compacted logs; True if a log was cleaned."""
        cleaned = self._clean_filthiest(cleaner, index)
        self._retain_compacted()
        return cleaned

    def _clean_filthiest(self, cleaner: Cleaner, index: int) -> bool:
        try:
            grabbed = self.manager.grab_filthiest_compacted_log()
        except LogCleaningError as e:  # Kafka's tryCleanFilthiestLog: mark that partition, keep the thread alive
            self.manager.mark_uncleanable(e.tp, str(e))
            return False
        if grabbed is None:
            return False
        tp, ltc = grabbed
        end_offset = None
        try:
            logger.info("Beginning cleaning of log %s", tp)
            end_offset, stats = cleaner.clean(ltc)
            self.status[index].last_stats = stats
            self.last_clean_ms[tp] = self.clock()
            logger.info("\n\t%s", stats.summary(index, str(tp), ltc.first_dirty_offset, end_offset))
            if stats.invalid_messages:
                logger.warning("\tFound %d invalid messages during compaction.", stats.invalid_messages)
        except CleaningAbortedError:
            logger.info("Cleaning of %s was aborted", tp)
        except Exception as e:
            self.manager.mark_uncleanable(tp, f"{type(e).__name__}: {e}")
        finally:
            self.manager.done_cleaning(tp, end_offset)
        return True

    def _retain_compacted(self) -> None:
        doomed = self.manager.deletable_logs()
        try:
            now = self.clock()
            for tp, log in doomed:
                try:
                    delete_old_segments(log, now)
                except Exception as e:
                    self.manager.mark_uncleanable(tp, f"retention failed: {type(e).__name__}: {e}")
        finally:
            self.manager.done_deleting([tp for tp, _ in doomed])
