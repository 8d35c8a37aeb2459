"""The batch reader of `format("shale")`: planning on the driver, one offset range per Spark task.

Spark calls `pushFilters` and `partitions` in one Python worker on the driver, then ships this
object (pickled, with the pushdown it learned) to the executors, which call `read`.
"""

from __future__ import annotations

from typing import Iterator

import pyarrow as pa
from pyspark.sql.datasource import DataSourceReader, Filter, InputPartition

from .backend import open_catalog, read_batches
from .latest import reduce_latest
from .options import SourceOptions
from .pushdown import Pushdown, push_filters
from .ranges import RangePartition
from .read_plan import plan_batch
from .schema import arrow_schema


class ShaleBatchReader(DataSourceReader):
    def __init__(self, opts: SourceOptions) -> None:
        self.opts = opts
        self.pushdown = Pushdown()

    def pushFilters(self, filters: list[Filter]) -> Iterator[Filter]:
        self.pushdown, rest = push_filters(filters, latest=self.opts.latest)
        yield from rest

    def partitions(self) -> list[InputPartition]:
        catalog = open_catalog(self.opts)
        try:
            ranges = plan_batch(catalog, self.opts, self.pushdown)
        finally:
            catalog.close()
        return [RangePartition(r) for r in ranges]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, RangePartition):
            return iter(())  # Spark's stand-in partition when the plan has none: nothing to read
        batches = read_batches(self.opts, partition.range)
        if self.opts.latest:
            return reduce_latest(batches, arrow_schema(self.opts.include_headers))
        return batches
