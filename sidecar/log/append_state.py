"""The state the C append (`_append_kernel.c`: `append_produced`) reads and writes, declared: its ABI.

A single replica's one-record append runs in one C call that reads the log, its active segment and that
segment's two index files, and moves a few counters (Log.append_in_c). What it may touch is declared here, as
slotted base classes of the Python objects that own the state, so there is one copy of each value and the
Python code reads and writes it as plain attributes: `Log` derives from `LogAppendState`, `LogSegment` from
`SegmentAppendState`, `MmapIndex` from `IndexAppendState`, `LeaderEpochCache` from `EpochCacheAppendState`;
the topic's limits are an `AppendLimits` made when the log's config is set.

C reads and writes these fields, and no other state, at their slot offsets: `declare_state` (called once by
log.py) finds each field the C code names among the slots of its declared class, so a field renamed, removed or
moved out of these classes fails at import instead of going unnoticed, and an object of another class is refused.
A field marked *written* is one the C append sets after a successful write; the rest it only reads. Besides, it
calls: the lock's `acquire(False)` and `release()`, `SEGMENT_FILES.acquire(file)` and `release(file)`, crc32c,
and a clock other than `now_ms`. Python stays authoritative: whatever these fields cannot decide (a roll, a page
of an index to allocate, a producer id, a fault to name), the C append declines with nothing changed and
Python's `Log.append` does it.

Why base classes and not a state object of their own: a separate object would be a second copy that every path
changing a segment (append, roll, truncation, recovery, the cleaner's swap, a config change) must keep in step,
and a stale copy would make C write at a wrong position; a slot is the attribute itself, read in C with one load
instead of a lookup by name (a one-record append costs less CPU than with the lookups it replaced).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:
    import mmap

    from .leader_epoch_cache import LeaderEpochCache
    from .log import StorageFailure
    from .offset_index import OffsetIndex
    from .open_files import OpenFile
    from .segment import LogSegment
    from .time_index import TimeIndex


@dataclass(frozen=True, slots=True)
class AppendLimits:
    """A topic config's limits on an append, as the C append checks them (made by `Log.config`'s setter)."""

    create_time: bool  # message.timestamp.type is CreateTime (LogAppendTime rewrites batches: Python's)
    timestamp_before_max_ms: int  # message.timestamp.before.max.ms
    timestamp_after_max_ms: int  # message.timestamp.after.max.ms
    segment_bytes: int  # segment.bytes: the largest set, and the roll by size
    max_message_bytes: int  # max.message.bytes: the largest batch
    compact: bool  # cleanup.policy has compact: every record needs a key
    max_segment_ms: int  # Log.max_segment_ms: segment.ms, capped by max.compaction.lag.ms on compacted topics
    flush_messages: int  # flush.messages: an append that reaches it is Python's (it flushes)

    @classmethod
    def of(cls, config: Any) -> AppendLimits:
        """From a TopicConfig (topic_config.py, a layer above the log engine)."""
        compact = config.compact
        max_segment_ms = config.segment_ms
        if compact and 0 < config.max_compaction_lag_ms < max_segment_ms:
            max_segment_ms = config.max_compaction_lag_ms
        return cls(config.message_timestamp_type == "CreateTime", config.message_timestamp_before_max_ms,
                   config.message_timestamp_after_max_ms, config.segment_bytes, config.max_message_bytes, compact,
                   max_segment_ms, config.flush_messages)


class IndexAppendState:
    """An index file's part (index.py: MmapIndex): where the C append writes an entry when one is due."""

    __slots__ = ("mm", "entries", "max_entries", "reserved", "writable")
    mm: mmap.mmap | None  # the file's shared map (None: closed, or an empty read-only file)
    entries: int  # valid entries; *written* when the append adds one
    max_entries: int  # slots the file holds: a full index is a roll, Python's
    reserved: int  # bytes [0, reserved) have blocks (MmapIndex.reserve): an entry past them is Python's
    writable: bool  # a read-only (reopened) index is Python's


class SegmentAppendState:
    """A segment's part (segment.py: LogSegment); the C append reads the active one's, `segments[-1]`."""

    __slots__ = ("file", "base_offset", "size", "created_ms", "roll_jitter_ms", "index_interval_bytes",
                 "bytes_since_last_index_entry", "rolling_ts", "max_ts", "offset_index", "time_index")
    file: OpenFile  # the `.log` file, pinned through open_files.SEGMENT_FILES while it is written
    base_offset: int
    size: int  # bytes in the `.log`: where the append writes; *written*
    created_ms: int  # when the segment was made (or emptied): a time roll when no batch has a timestamp
    roll_jitter_ms: int
    index_interval_bytes: int
    bytes_since_last_index_entry: int  # *written*
    rolling_ts: int | None  # the first batch's max timestamp for time rolls; None until read (Python's)
    max_ts: tuple[int, int] | None  # (largest timestamp, offset of its batch); None until loaded; *written*
    offset_index: OffsetIndex
    time_index: TimeIndex


class EpochCacheAppendState:
    """The leader-epoch cache's part (leader_epoch_cache.py): a failed checkpoint write is retried by Python."""

    __slots__ = ("dirty",)
    dirty: bool


class LogAppendState:
    """The log's part (log.py: Log)."""

    __slots__ = ("lock", "storage_failure", "leader_epoch_cache", "limits", "clock", "log_end_offset",
                 "recovery_point", "segments")
    lock: Any  # threading.RLock: taken without waiting, or the append is Python's
    storage_failure: StorageFailure | None  # a failed write: the next append is Python's (it logs the recovery)
    leader_epoch_cache: LeaderEpochCache
    limits: AppendLimits
    clock: Callable[[], int]  # read in C when it is log.now_ms
    log_end_offset: int  # *written*
    recovery_point: int  # with limits.flush_messages: a flush due is Python's
    segments: list[LogSegment]  # the last is the active segment
