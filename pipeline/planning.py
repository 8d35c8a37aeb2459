"""From options to offsets: which partitions, where each read starts and ends (Spark's Kafka rules).

Precedence as in Spark: a timestamp option beats the by-timestamp JSON, which beats the offsets
option. A starting offset below the log start offset is data loss (an error unless
`failOnDataLoss=false`, which starts at the log start instead); offsets past the end are clamped.
Partitions a JSON spec leaves out get the option's default (earliest to start, latest to end).
"""

from __future__ import annotations

import logging

from .backend import TP, Catalog
from .options import EARLIEST, LATEST, OffsetSpec, OptionError, SourceOptions, Subscription
from .pushdown import Pushdown
from .ranges import OffsetRange, split_ranges

log = logging.getLogger(__name__)


class DataLossError(RuntimeError):
    """Offsets asked for are no longer in the log (retention or DeleteRecords removed them)."""


def subscribed_partitions(catalog: Catalog, sub: Subscription, *, require_topics: bool) -> list[TP]:
    """The topic partitions the subscription names that exist now, sorted."""
    topics = catalog.topics(None if sub.kind == "subscribePattern" else list(sub.topics))
    if sub.kind == "assign":
        missing = [f"{t}-{p}" for t, p in sub.assigned if p not in topics.get(t, ())]
        if missing:
            raise OptionError(f"assigned partitions do not exist: {', '.join(missing)}")
        return sorted(sub.assigned)
    if sub.kind == "subscribe":
        missing = [t for t in sub.topics if t not in topics]
        if missing and require_topics:
            raise OptionError(f"subscribed topics do not exist: {', '.join(missing)}")
        for t in missing:
            log.info("subscribed topic %s does not exist yet", t)
    return sorted((t, p) for t, parts in topics.items() if sub.matches(t) for p in parts)


def _from_spec(spec: OffsetSpec, tp: TP, low: int, high: int, default: str) -> int:
    if isinstance(spec, dict):
        value = spec.get(tp[0], {}).get(tp[1])
        if value is None:
            value = EARLIEST if default == "earliest" else LATEST
    else:
        value = EARLIEST if spec == "earliest" else LATEST
    return low if value == EARLIEST else high if value == LATEST else value


def starting_offsets(catalog: Catalog, opts: SourceOptions, marks: dict[TP, tuple[int, int]],
                     default: str) -> dict[TP, int]:
    """Where each partition's read begins."""
    stamps = _stamps(opts.starting_timestamp, opts.starting_offsets_by_timestamp, marks)
    found = catalog.offsets_for_timestamp(stamps) if stamps else {}
    out = {}
    for tp, (low, high) in marks.items():
        if tp in stamps:
            offset = found.get(tp)
            if offset is None:
                if opts.timestamp_strategy == "error":
                    raise OptionError(f"{tp[0]}-{tp[1]}: no record at or after timestamp {stamps[tp]} "
                                      "(startingOffsetsByTimestampStrategy=latest starts at the end instead)")
                offset = high
        else:
            offset = _from_spec(opts.starting_offsets, tp, low, high, default)
        if offset < low:
            if opts.fail_on_data_loss:
                raise DataLossError(f"{tp[0]}-{tp[1]}: starting offset {offset} is below the log start offset {low}: "
                                    "those records were deleted (failOnDataLoss=false starts at the log start)")
            offset = low
        out[tp] = min(offset, high)
    return out


def ending_offsets(catalog: Catalog, opts: SourceOptions, marks: dict[TP, tuple[int, int]]) -> dict[TP, int]:
    """Where each partition's batch read ends (exclusive)."""
    stamps = _stamps(opts.ending_timestamp, opts.ending_offsets_by_timestamp, marks)
    found = catalog.offsets_for_timestamp(stamps) if stamps else {}
    out = {}
    for tp, (low, high) in marks.items():
        if tp in stamps:
            offset = found.get(tp)
            offset = high if offset is None else offset
        else:
            offset = _from_spec(opts.ending_offsets, tp, low, high, "latest")
        out[tp] = max(low, min(offset, high))
    return out


def _stamps(global_ts: int | None, per_partition: dict | None, marks: dict[TP, tuple[int, int]]) -> dict[TP, int]:
    if global_ts is not None:
        return {tp: global_ts for tp in marks}
    if per_partition:
        return {tp: per_partition[tp[0]][tp[1]] for tp in marks if tp[1] in per_partition.get(tp[0], {})}
    return {}


def plan_batch(catalog: Catalog, opts: SourceOptions, pushdown: Pushdown) -> list[OffsetRange]:
    """The offset ranges of a batch read, after pushdown, split for minPartitions and
    maxRecordsPerPartition (not for the latest view, which reduces each partition whole in its task)."""
    tps = [tp for tp in subscribed_partitions(catalog, opts.subscription, require_topics=True)
           if pushdown.keeps_partition(tp[1])]
    marks = catalog.watermarks(tps)
    starts = starting_offsets(catalog, opts, marks, "earliest")
    ends = ending_offsets(catalog, opts, marks)
    ranges = []
    for tp in tps:
        narrowed = pushdown.narrow(OffsetRange(tp[0], tp[1], starts[tp], ends[tp]))
        if narrowed is not None:
            ranges.append(narrowed)
    if opts.latest:
        return ranges
    return split_ranges(ranges, opts.min_partitions, opts.max_records_per_partition)
