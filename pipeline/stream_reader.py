"""The streaming reader of `format("shale")`: offsets per partition, `maxOffsetsPerTrigger`,
`minOffsetsPerTrigger` with `maxTriggerDelay`, AvailableNow.

A stream offset is `{"topic": {"partition": next offset}}` (JSON, so partitions are strings), the
shape of Spark's Kafka source. Spark keeps it in the query's checkpoint; nothing is committed to
the server. Admission control (pyspark 4.2+): `getDefaultReadLimit` turns `maxOffsetsPerTrigger`
into `ReadMaxRows`, and `latestOffset(start, limit)` shares that limit among the partitions in
proportion to what each has waiting. With `Trigger.AvailableNow` the end offsets at the start of
the query are the target: later records wait for the next run.

Partitions that appear while the stream runs (new topics matching the subscription, more
partitions) are read from their earliest offset, as Spark's Kafka source does.
"""

from __future__ import annotations

import time
from typing import Callable, Iterator

import pyarrow as pa
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows, SupportsTriggerAvailableNow

from .backend import TP, Catalog, open_catalog, read_batches
from .options import SourceOptions
from .ranges import OffsetRange, RangePartition, rate_limit, split_ranges
from .read_plan import DataLossError, check_specs_cover, starting_offsets, subscribed_partitions


def encode_offsets(offsets: dict[TP, int]) -> dict:
    out: dict = {}
    for (t, p), off in sorted(offsets.items()):
        out.setdefault(t, {})[str(p)] = off
    return out


def decode_offsets(doc: dict) -> dict[TP, int]:
    return {(t, int(p)): int(off) for t, parts in doc.items() for p, off in parts.items()}


class ShaleStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Spark keeps one instance for the whole query in a Python worker on the driver, so the
    AvailableNow target and the time of the last trigger live on it between micro-batches."""

    def __init__(self, opts: SourceOptions, clock: Callable[[], float] = time.monotonic) -> None:
        self.opts = opts
        self._catalog: Catalog | None = None
        self._target: dict[TP, int] | None = None  # AvailableNow: nothing past these offsets
        self._clock = clock
        self._last_trigger: float | None = None  # when the last micro-batch was let through (minOffsetsPerTrigger)

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_catalog"] = None  # a client connection does not travel to the executors
        return state

    def _marks(self) -> dict[TP, tuple[int, int]]:
        if self._catalog is None:
            self._catalog = open_catalog(self.opts)
        tps = subscribed_partitions(self._catalog, self.opts.subscription, require_topics=False)
        return self._catalog.watermarks(tps)

    def initialOffset(self) -> dict:
        marks = self._marks()
        check_specs_cover(self.opts, list(marks))
        return encode_offsets(starting_offsets(self._catalog, self.opts, marks))

    def getDefaultReadLimit(self) -> ReadLimit:
        n = self.opts.max_offsets_per_trigger
        return ReadMaxRows(n) if n else ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = {tp: high for tp, (_, high) in self._marks().items()}

    def reportLatestOffset(self) -> dict | None:
        return encode_offsets({tp: high for tp, (_, high) in self._marks().items()})

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        marks = self._marks()
        begin = decode_offsets(start)
        for tp, (low, _) in marks.items():
            begin.setdefault(tp, low)  # a partition new since the last batch starts at its earliest
        latest = {tp: high for tp, (_, high) in marks.items()}
        for tp in begin:
            latest.setdefault(tp, begin[tp])  # gone from the metadata: stays where it is
        if self._target is not None:
            latest = {tp: min(off, self._target.get(tp, begin[tp])) for tp, off in latest.items()}
        if self._delay(begin, latest):
            return encode_offsets(begin)  # the same offsets as the start: Spark runs no micro-batch
        max_rows = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        return encode_offsets(rate_limit(begin, latest, max_rows))

    def _delay(self, begin: dict[TP, int], latest: dict[TP, int]) -> bool:
        """`minOffsetsPerTrigger`: hold the trigger back while fewer offsets wait, at most `maxTriggerDelay`.

        Spark's rule (KafkaMicroBatchStream.delayBatch): the first trigger always runs; later ones run
        once the delay since the last one has passed or enough offsets are waiting. AvailableNow
        ignores it: the run reads what is there and stops.
        """
        wanted = self.opts.min_offsets_per_trigger
        if wanted is None or self._target is not None:
            return False
        now = self._clock()
        if self._last_trigger is not None and (now - self._last_trigger) * 1000 < self.opts.max_trigger_delay_ms:
            if sum(max(0, latest[tp] - begin[tp]) for tp in latest) < wanted:
                return True
        self._last_trigger = now
        return False

    def partitions(self, start: dict, end: dict) -> list[InputPartition]:
        begin, until = decode_offsets(start), decode_offsets(end)
        marks = self._marks() if self.opts.fail_on_data_loss or set(until) - set(begin) else {}
        ranges = []
        for tp, stop in until.items():
            first = begin.get(tp, marks.get(tp, (0, 0))[0])
            low = marks.get(tp, (first, 0))[0]
            if self.opts.fail_on_data_loss and first < low and stop > first:
                raise DataLossError(f"{tp[0]}-{tp[1]}: offsets [{first}, {low}) were deleted before this stream "
                                    "read them (failOnDataLoss=false reads on from the log start)")
            first = max(first, low)
            if stop > first:
                ranges.append(OffsetRange(tp[0], tp[1], first, stop))
        split = split_ranges(ranges, self.opts.min_partitions, self.opts.max_records_per_partition)
        return [RangePartition(r) for r in split]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return read_batches(self.opts, partition.range)

    def commit(self, end: dict) -> None:
        pass  # offsets live in Spark's checkpoint; the server keeps no consumer position for us

    def stop(self) -> None:
        if self._catalog is not None:
            self._catalog.close()
            self._catalog = None
