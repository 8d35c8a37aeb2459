"""Turning Spark's pushed filters on partition, offset and timestamp into less to read.

`partition` and `offset` predicates are exact (a range of offsets is exactly the rows with those
offsets), so Spark is told they are handled and does not evaluate them again. A lower bound on
`timestamp` only prunes: whole segments and batches whose largest timestamp is below it are
skipped, but record timestamps need not grow with offsets, so the filter goes back to Spark too.

For the latest view (`latest=true`) only partition filters are pushed: "the latest record of a key
among offsets below X" is not "the latest record of a key, if its offset is below X".
"""

from __future__ import annotations

import calendar
import datetime as dt
from dataclasses import dataclass, replace
from typing import Iterable

from pyspark.sql.datasource import (
    EqualTo,
    Filter,
    GreaterThan,
    GreaterThanOrEqual,
    In,
    IsNotNull,
    LessThan,
    LessThanOrEqual,
    Not,
)

from .ranges import OffsetRange

_NEVER_NULL = ("partition", "offset", "timestamp", "timestampType", "topic")


@dataclass(frozen=True)
class Pushdown:
    """What the pushed filters allow: partitions, offsets [offset_min, offset_end), timestamps >= timestamp_min (ms)."""

    partitions: frozenset[int] | None = None  # None: every partition
    excluded: frozenset[int] = frozenset()
    partition_min: int | None = None
    partition_max: int | None = None  # inclusive
    offset_min: int | None = None
    offset_end: int | None = None  # exclusive
    timestamp_min: int | None = None

    def keeps_partition(self, partition: int) -> bool:
        return ((self.partitions is None or partition in self.partitions) and partition not in self.excluded
                and (self.partition_min is None or partition >= self.partition_min)
                and (self.partition_max is None or partition <= self.partition_max))

    def narrow(self, r: OffsetRange) -> OffsetRange | None:
        """The part of `r` the filters can match, or None if nothing can."""
        if not self.keeps_partition(r.partition):
            return None
        start = r.start if self.offset_min is None else max(r.start, self.offset_min)
        end = r.end if self.offset_end is None else min(r.end, self.offset_end)
        if end <= start:
            return None
        ts = r.min_timestamp
        if self.timestamp_min is not None:
            ts = self.timestamp_min if ts is None else max(ts, self.timestamp_min)
        return replace(r, start=start, end=end, min_timestamp=ts)


def push_filters(filters: Iterable[Filter], *, latest: bool = False) -> tuple[Pushdown, list[Filter]]:
    """(what to prune by, the filters Spark must still evaluate)."""
    p = Pushdown()
    rest: list[Filter] = []
    for f in filters:
        handled = _apply(f, latest)
        if handled is None:
            rest.append(f)
            continue
        new, exact = handled
        p = _merge(p, new)
        if not exact:
            rest.append(f)
    return p, rest


def _apply(f: Filter, latest: bool) -> tuple[Pushdown, bool] | None:
    """The pushdown of one filter and whether it is exact; None if it cannot be pushed."""
    attr = getattr(f, "attribute", ())
    column = attr[0] if len(attr) == 1 else None
    if isinstance(f, IsNotNull) and column in _NEVER_NULL:
        return Pushdown(), True
    if column == "partition":
        return _partition(f)
    if latest:
        return None
    if column == "offset":
        return _offset(f)
    if column == "timestamp":
        return _timestamp(f)
    return None


def _partition(f: Filter) -> tuple[Pushdown, bool] | None:
    if isinstance(f, In) and all(_is_int(v) for v in f.value):
        return Pushdown(partitions=frozenset(f.value)), True
    if isinstance(f, Not) and isinstance(f.child, EqualTo) and f.child.attribute == ("partition",) \
            and _is_int(f.child.value):
        return Pushdown(excluded=frozenset([f.child.value])), True
    value = getattr(f, "value", None)
    if not _is_int(value):
        return None
    if isinstance(f, EqualTo):
        return Pushdown(partitions=frozenset([value])), True
    bounds = {GreaterThan: (value + 1, None), GreaterThanOrEqual: (value, None),
              LessThan: (None, value - 1), LessThanOrEqual: (None, value)}.get(type(f))
    if bounds is None:
        return None
    return Pushdown(partition_min=bounds[0], partition_max=bounds[1]), True


def _offset(f: Filter) -> tuple[Pushdown, bool] | None:
    if isinstance(f, In) and f.value and all(_is_int(v) for v in f.value):
        return Pushdown(offset_min=min(f.value), offset_end=max(f.value) + 1), len(f.value) == 1
    value = getattr(f, "value", None)
    if not _is_int(value):
        return None
    bounds = {EqualTo: (value, value + 1), GreaterThan: (value + 1, None), GreaterThanOrEqual: (value, None),
              LessThan: (None, value), LessThanOrEqual: (None, value + 1)}.get(type(f))
    if bounds is None:
        return None
    return Pushdown(offset_min=bounds[0], offset_end=bounds[1]), True


def _timestamp(f: Filter) -> tuple[Pushdown, bool] | None:
    value = getattr(f, "value", None)
    if not isinstance(value, dt.datetime) or type(f) not in (EqualTo, GreaterThan, GreaterThanOrEqual):
        return None
    micros = epoch_micros(value)
    # Record timestamps are whole milliseconds: ts_ms * 1000 > micros, or >= micros.
    minimum = micros // 1000 + 1 if isinstance(f, GreaterThan) else -(-micros // 1000)
    return Pushdown(timestamp_min=minimum), False


def epoch_micros(value: dt.datetime) -> int:
    """Microseconds since the epoch; a naive datetime is taken as UTC."""
    if value.tzinfo is not None:
        value = value.astimezone(dt.timezone.utc)
    return calendar.timegm(value.timetuple()) * 1_000_000 + value.microsecond


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _merge(a: Pushdown, b: Pushdown) -> Pushdown:
    """Both sets of conditions at once (filters are ANDed)."""
    def tighter(x, y, pick):
        return y if x is None else x if y is None else pick(x, y)

    if a.partitions is None:
        parts = b.partitions
    elif b.partitions is None:
        parts = a.partitions
    else:
        parts = a.partitions & b.partitions
    return Pushdown(
        partitions=parts,
        excluded=a.excluded | b.excluded,
        partition_min=tighter(a.partition_min, b.partition_min, max),
        partition_max=tighter(a.partition_max, b.partition_max, min),
        offset_min=tighter(a.offset_min, b.offset_min, max),
        offset_end=tighter(a.offset_end, b.offset_end, min),
        timestamp_min=tighter(a.timestamp_min, b.timestamp_min, max),
    )
