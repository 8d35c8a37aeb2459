"""A log dir's free-space floor: clients' Produce and followers' fetches stop at it, so the cleaner has room.

Why: a full disk refuses every write, and the cleaner writes a group's cleaned segments before it deletes the
dirty ones, so a compacted topic on a full disk cannot clean itself back under its limit (the end state of
KAFKA-9087). The floor (`log.dir.min.free.bytes`, `log.dir.min.free.ratio` of the filesystem; the larger wins) is a
reserve: a client's Produce that would leave less free is refused with KAFKA_STORAGE_ERROR, and a follower does not
fetch while less is free, while what frees space or must not stall (the cleaner and its swap, retention,
checkpoints, transaction markers, coordinator writes) goes on writing into it. Kafka has no such setting
(docs/day-2-operations.md, "The free-space floor").

Free space is read with statvfs on the produce path itself (one system call, ~1 µs; no thread has to keep a flag
fresh). Between two samples the bytes admitted since the last one are taken off it, and a new sample is read when
the last is `SAMPLE_INTERVAL_MS` old or, so counted, less than twice the floor is left: a stale sample would let a
fast producer (hundreds of MB/s on tmpfs) write megabytes into the reserve. A request is admitted only if its bytes
fit above the floor; the native Produce (one record, size not asked) is the only writer that can cross it.
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
from dataclasses import dataclass
from typing import Callable

logger = logging.getLogger(__name__)

SAMPLE_INTERVAL_MS = 100  # the oldest sample a produce is admitted on
REFUSAL_LOG_INTERVAL_MS = 10_000  # one line per dir this often while produce is refused


def _monotonic_ms() -> int:
    return time.monotonic_ns() // 1_000_000


@dataclass(frozen=True, slots=True)
class FreeFloor:
    """The broker settings: the floor is the larger of `min_free_bytes` and `min_free_ratio` of the filesystem."""

    min_free_bytes: int = 0
    min_free_ratio: float = 0.0

    def bytes_for(self, total: int) -> int:
        """The floor, in bytes, of a filesystem of `total` bytes."""
        return max(self.min_free_bytes, math.ceil(self.min_free_ratio * total))

    @property
    def off(self) -> bool:
        return self.min_free_bytes <= 0 and self.min_free_ratio <= 0


@dataclass(frozen=True, slots=True)
class Sample:
    """One statvfs of a log dir: the bytes an unprivileged writer has free, the filesystem's size, the floor."""

    free: int
    total: int
    floor: int
    at_ms: int

    def fits(self, size: int) -> bool:
        """Whether `size` more bytes leave the floor free (always, without a floor: 0, or an unreadable filesystem)."""
        return not self.floor or self.free - size >= self.floor


class DirSpace:
    """One log dir's free space as the produce path sees it: sampled when stale, refusals counted and logged."""

    def __init__(self, path: str, floor: FreeFloor, *, clock: Callable[[], int] = _monotonic_ms,
                 statvfs: Callable[[str], os.statvfs_result] = os.statvfs) -> None:
        self.path = path
        self.floor = floor
        self._clock = clock
        self._statvfs = statvfs
        self._lock = threading.Lock()  # questions come from the event loop, the I/O thread and /metrics
        self.last: Sample | None = None
        self._admitted = 0  # bytes of Produce admitted since `last` was read
        self.refusing = False  # the last Produce was refused, and no sample since has room for it
        self._refused_size = 0  # ... its bytes
        self.refused = 0  # clients' Produce refused by the floor since the start
        self._refused_before = 0  # ... when the dir last began to refuse
        self._logged_ms: int | None = None
        self._unlogged = 0

    def sample(self) -> Sample:
        """Read the filesystem now (and end a refusal if the last refused request now fits)."""
        try:
            st = self._statvfs(self.path)
            total, free = st.f_blocks * st.f_frsize, st.f_bavail * st.f_frsize
        except OSError as e:  # the dir's own writes will name the fault; the floor does not guess
            logger.error("log dir %s: cannot read its free space: %s", self.path, e)
            total = free = 0
        now = Sample(free, total, self.floor.bytes_for(total) if total else 0, self._clock())
        with self._lock:
            self.last, self._admitted = now, 0
            if self.refusing and now.fits(self._refused_size):
                self._accept_again(now.free, now.floor)
        return now

    def fresh(self) -> Sample:
        """The last sample, read again if it is SAMPLE_INTERVAL_MS old or if, less the bytes admitted since, it
        leaves less than twice the floor (no new object on the way: the native Produce asks at every request)."""
        last = self.last
        if (last is None or (last.floor and last.free - self._admitted < 2 * last.floor)
                or self._clock() - last.at_ms >= SAMPLE_INTERVAL_MS):
            return self.sample()
        return last

    def has_room(self, size: int = 0) -> bool:
        """Whether `size` more bytes of writes that may not use the reserve (clients' Produce, a follower's fetches)
        stay above the floor now."""
        return self.floor.off or self.fresh().fits(size + self._admitted)

    def produce_refusal(self, where: str, size: int) -> tuple[str, bool] | None:
        """None if a client's Produce of `size` bytes to `where` (a topic-partition in this dir) may write, counted
        as admitted; else the reason, and whether to log it now (one line per dir every REFUSAL_LOG_INTERVAL_MS,
        with the count it stands for)."""
        if self.floor.off:
            return None
        s = self.fresh()
        with self._lock:
            free = s.free - self._admitted
            if s.fits(size + self._admitted):
                self._admitted += size
                if self.refusing:
                    self._accept_again(free, s.floor)
                return None
            if not self.refusing:
                logger.warning("log dir %s: %d bytes free, at its floor of %d bytes (log.dir.min.free.bytes, "
                               "log.dir.min.free.ratio of %d): Produce is refused with KAFKA_STORAGE_ERROR until the "
                               "cleaner or retention frees space", self.path, free, s.floor, s.total)
                self.refusing, self._refused_before, self._logged_ms, self._unlogged = True, self.refused, None, 0
            self._refused_size = size
            self.refused += 1
            self._unlogged += 1
            now = self._clock()
            log = self._logged_ms is None or now - self._logged_ms >= REFUSAL_LOG_INTERVAL_MS
            count = self._unlogged
            if log:
                self._logged_ms, self._unlogged = now, 0
        more = f" ({count} refused in this dir since the last such line)" if log and count > 1 else ""
        return (f"{where}: log dir {self.path} has {free} bytes free; {size} more would leave less than its floor of "
                f"{s.floor} bytes (log.dir.min.free.bytes, log.dir.min.free.ratio), kept for the cleaner and retention"
                f"{more}"), log

    def _accept_again(self, free: int, floor: int) -> None:
        """The refusal ends (under the lock)."""
        self.refusing = False
        logger.warning("log dir %s: %d bytes free, above its floor of %d bytes: Produce is accepted again (%d "
                       "refused meanwhile)", self.path, free, floor, self.refused - self._refused_before)
