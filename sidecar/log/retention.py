"""Retention: which old segments go (Kafka's deleteOldSegments), oldest first, never at or above the high watermark.

Three rules, each a predicate over (segment, next segment) walked from the oldest
segment and stopping at the first that fails: the log start offset moved past a
segment (any policy), `retention.ms` against the segment's largest timestamp, and
`retention.bytes` deleting whole segments only while the rest stays at or above it.
"""

from __future__ import annotations

from typing import Callable

from .segment import LogSegment

Predicate = Callable[[LogSegment, LogSegment | None], bool]


def deletable_segments(log, predicate: Predicate) -> list[LogSegment]:
    """The leading segments that satisfy `predicate` and lie wholly below the high watermark."""
    with log.lock:
        segments = list(log.segments)
        high_watermark = log.high_watermark
        log_end = log.log_end_offset
    out: list[LogSegment] = []
    for i, seg in enumerate(segments):
        nxt = segments[i + 1] if i + 1 < len(segments) else None
        upper = nxt.base_offset if nxt is not None else log_end
        last_and_empty = nxt is None and seg.size == 0
        if high_watermark >= upper and not last_and_empty and predicate(seg, nxt):
            out.append(seg)
        else:
            break
    return out


def delete_log_start_offset_breached(log) -> int:
    """Segments wholly below the log start offset (DeleteRecords, or an earlier deletion)."""
    start = log.log_start_offset
    doomed = deletable_segments(log, lambda seg, nxt: nxt is not None and nxt.base_offset <= start)
    return log.delete_segments(doomed, f"log start offset {start} breach")


def delete_retention_ms_breached(log, now_ms: int) -> int:
    retention_ms = log.config.retention_ms
    if retention_ms < 0:
        return 0
    doomed = deletable_segments(log, lambda seg, nxt: now_ms - seg.largest_timestamp > retention_ms)
    return log.delete_segments(doomed, f"retention.ms {retention_ms} breach")


def delete_retention_size_breached(log) -> int:
    retention_bytes = log.config.retention_bytes
    size = log.size_in_bytes
    if retention_bytes < 0 or size < retention_bytes:
        return 0
    remaining = [size - retention_bytes]

    def over(seg: LogSegment, _nxt: LogSegment | None) -> bool:
        if remaining[0] - seg.size >= 0:
            remaining[0] -= seg.size
            return True
        return False

    doomed = deletable_segments(log, over)
    return log.delete_segments(doomed, f"retention.bytes {retention_bytes} breach")


def delete_old_segments(log, now_ms: int) -> int:
    """All of retention for one log; the time and size rules apply only when the policy includes delete."""
    deleted = delete_log_start_offset_breached(log)
    if log.config.delete:
        deleted += delete_retention_size_breached(log)
        deleted += delete_retention_ms_breached(log, now_ms)
    return deleted
