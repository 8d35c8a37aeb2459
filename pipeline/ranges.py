"""Offset ranges: what one Spark task reads, how big partitions are split, and how a trigger is rate-limited.

The rules follow Spark's Kafka source: `minPartitions` splits each partition in proportion to its
share of all offsets (KafkaOffsetRangeCalculator), `maxRecordsPerPartition` then cuts any range
above that many offsets into equal pieces, and `maxOffsetsPerTrigger` gives each partition
its proportional share of the limit (KafkaMicroBatchStream.rateLimit), here with the remainder
handed out so the shares add up to the limit exactly.
"""

from __future__ import annotations

from dataclasses import dataclass

from pyspark.sql.datasource import InputPartition


@dataclass(frozen=True)
class OffsetRange:
    """Offsets [start, end) of one topic partition; `min_timestamp` (ms) lets the read skip older batches."""

    topic: str
    partition: int
    start: int
    end: int
    min_timestamp: int | None = None

    @property
    def size(self) -> int:
        return max(0, self.end - self.start)

    def __str__(self) -> str:
        return f"{self.topic}-{self.partition} [{self.start}, {self.end})"


class RangePartition(InputPartition):
    """The InputPartition Spark ships to an executor: one offset range."""

    def __init__(self, offset_range: OffsetRange) -> None:
        super().__init__(offset_range)
        self.range = offset_range


def split_ranges(ranges: list[OffsetRange], min_partitions: int | None,
                 max_records: int | None = None) -> list[OffsetRange]:
    """The tasks of a read: `minPartitions`, then `maxRecordsPerPartition` (no task above that many offsets)."""
    out: list[OffsetRange] = []
    for r in split_for_min_partitions(ranges, min_partitions):
        out.extend(_pieces(r, -(-r.size // max_records) if max_records else 1))
    return out


def split_for_min_partitions(ranges: list[OffsetRange], min_partitions: int | None) -> list[OffsetRange]:
    """Split ranges into about `min_partitions` pieces, big partitions into more pieces than small ones."""
    ranges = [r for r in ranges if r.size > 0]
    if not min_partitions or min_partitions <= len(ranges):
        return ranges
    total = sum(r.size for r in ranges)
    out: list[OffsetRange] = []
    for r in ranges:
        out.extend(_pieces(r, max(1, min(r.size, round(r.size / total * min_partitions)))))
    return out


def _pieces(r: OffsetRange, parts: int) -> list[OffsetRange]:
    """`r` cut into `parts` contiguous ranges whose sizes differ by at most one."""
    return [OffsetRange(r.topic, r.partition, r.start + r.size * i // parts, r.start + r.size * (i + 1) // parts,
                        r.min_timestamp) for i in range(parts)]


def rate_limit(start: dict[tuple[str, int], int], latest: dict[tuple[str, int], int],
               max_offsets: int | None) -> dict[tuple[str, int], int]:
    """End offsets that advance the partitions by at most `max_offsets` offsets in all, each by its share.

    `start` holds every partition of `latest`. A partition whose latest offset is below its start
    (truncated) stays where it is: a stream never goes back.
    """
    available = {tp: max(0, latest[tp] - start[tp]) for tp in latest}
    total = sum(available.values())
    if max_offsets is None or total <= max_offsets:
        return {tp: start[tp] + available[tp] for tp in latest}
    shares = {tp: n * max_offsets // total for tp, n in available.items()}
    left = max_offsets - sum(shares.values())
    # The remainder goes one by one to the partitions that lost the most to rounding (ties: in order).
    for tp in sorted(available, key=lambda tp: (-(available[tp] * max_offsets % total), tp)):
        if left == 0:
            break
        if shares[tp] < available[tp]:
            shares[tp] += 1
            left -= 1
    return {tp: start[tp] + shares[tp] for tp in latest}
