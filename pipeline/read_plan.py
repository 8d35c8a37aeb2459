"""From options to offsets: which partitions, where each read starts and ends (Spark's Kafka rules).

Precedence as in Spark: a timestamp option beats the by-timestamp JSON, which beats the offsets
option. A starting offset below the log start offset is data loss (an error unless
`failOnDataLoss=false`, which starts at the log start instead); offsets past the end are clamped.
A JSON spec (offsets or timestamps) must name exactly the partitions read, as Spark requires.
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


def check_specs_cover(opts: SourceOptions, tps: list[TP]) -> None:
    """Spark's rule for per-partition JSON options: they name every partition read, and only those.

    A partition left out would otherwise start or end somewhere the user never said; Spark's Kafka
    source refuses it with this message, so a job moved between the two behaves the same.
    """
    sides = (  # per side, the option that takes effect (the precedence above); the others are ignored
        (opts.starting_timestamp, ("startingOffsetsByTimestamp", opts.starting_offsets_by_timestamp),
         ("startingOffsets", opts.starting_offsets)),
        (opts.ending_timestamp, ("endingOffsetsByTimestamp", opts.ending_offsets_by_timestamp),
         ("endingOffsets", opts.ending_offsets)),
    )
    for global_ts, by_timestamp, by_offset in sides:
        option, spec = by_timestamp if by_timestamp[1] else by_offset
        if global_ts is not None or not isinstance(spec, dict):
            continue
        named = sorted((t, p) for t, parts in spec.items() for p in parts)
        if named != sorted(tps):
            raise OptionError(
                f"If {option} contains specific offsets, you must specify all TopicPartitions. Use -1 for latest, "
                f"-2 for earliest. Specified: {', '.join(f'{t}-{p}' for t, p in named)}. "
                f"Assigned: {', '.join(f'{t}-{p}' for t, p in sorted(tps))}")


def _from_spec(spec: OffsetSpec, tp: TP, low: int, high: int) -> int:
    value = spec[tp[0]][tp[1]] if isinstance(spec, dict) else EARLIEST if spec == "earliest" else LATEST
    return low if value == EARLIEST else high if value == LATEST else value


def _requested(catalog: Catalog, timestamp: int | None, by_timestamp: dict | None, spec: OffsetSpec,
               marks: dict[TP, tuple[int, int]], missing_timestamp_is_error: bool) -> dict[TP, int]:
    """The offset each partition's option asks for, before clamping: a timestamp's first record (the end
    when none is that late, unless that is an error) or the offsets spec; the precedence of the module doc."""
    stamps = _stamps(timestamp, by_timestamp, marks)
    found = catalog.offsets_for_timestamp(stamps) if stamps else {}
    out = {}
    for tp, (low, high) in marks.items():
        if tp not in stamps:
            out[tp] = _from_spec(spec, tp, low, high)
        elif (offset := found.get(tp)) is not None:
            out[tp] = offset
        elif missing_timestamp_is_error:
            raise OptionError(f"{tp[0]}-{tp[1]}: no record at or after timestamp {stamps[tp]} "
                              "(startingOffsetsByTimestampStrategy=latest starts at the end instead)")
        else:
            out[tp] = high
    return out


def starting_offsets(catalog: Catalog, opts: SourceOptions, marks: dict[TP, tuple[int, int]]) -> dict[TP, int]:
    """Where each partition's read begins (`check_specs_cover` has accepted the JSON options)."""
    requested = _requested(catalog, opts.starting_timestamp, opts.starting_offsets_by_timestamp,
                           opts.starting_offsets, marks, opts.timestamp_strategy == "error")
    out = {}
    for tp, offset in requested.items():
        low, high = marks[tp]
        if offset < low:
            if opts.fail_on_data_loss:
                raise DataLossError(f"{tp[0]}-{tp[1]}: starting offset {offset} is below the log start offset {low}: "
                                    "those records were deleted (failOnDataLoss=false starts at the log start)")
            offset = low
        out[tp] = min(offset, high)
    return out


def ending_offsets(catalog: Catalog, opts: SourceOptions, marks: dict[TP, tuple[int, int]]) -> dict[TP, int]:
    """Where each partition's batch read ends (exclusive)."""
    requested = _requested(catalog, opts.ending_timestamp, opts.ending_offsets_by_timestamp,
                           opts.ending_offsets, marks, False)
    return {tp: max(marks[tp][0], min(offset, marks[tp][1])) for tp, offset in requested.items()}


def _stamps(global_ts: int | None, per_partition: dict | None, marks: dict[TP, tuple[int, int]]) -> dict[TP, int]:
    if global_ts is not None:
        return {tp: global_ts for tp in marks}
    if per_partition:
        return {tp: per_partition[tp[0]][tp[1]] for tp in marks if tp[1] in per_partition.get(tp[0], {})}
    return {}


def plan_batch(catalog: Catalog, opts: SourceOptions, pushdown: Pushdown) -> list[OffsetRange]:
    """The offset ranges of a batch read, after pushdown, split for minPartitions and
    maxRecordsPerPartition (not for the latest view, which reduces each partition whole in its task)."""
    subscribed = subscribed_partitions(catalog, opts.subscription, require_topics=True)
    check_specs_cover(opts, subscribed)
    tps = [tp for tp in subscribed if pushdown.keeps_partition(tp[1])]
    marks = catalog.watermarks(tps)
    starts = starting_offsets(catalog, opts, marks)
    ends = ending_offsets(catalog, opts, marks)
    ranges = []
    for tp in tps:
        narrowed = pushdown.narrow(OffsetRange(tp[0], tp[1], starts[tp], ends[tp]))
        if narrowed is not None:
            ranges.append(narrowed)
    if opts.latest:
        return ranges
    return split_ranges(ranges, opts.min_partitions, opts.max_records_per_partition)
