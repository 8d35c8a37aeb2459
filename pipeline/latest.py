"""The latest view of a topic: one row per key with its latest value, tombstoned keys left out.

It is what compaction converges to, computed from whatever the log holds right now, so it is the
same before and after the cleaner runs: per (topic, partition, key) the record with the highest
offset wins, and if that record is a tombstone (null value) the key is gone. Records without a key
have no "latest" and are left out, as compaction refuses them.

Two ways to get it:
- `latest_view(df)` / `read(spark, {..., "latest": "true"})`: a Spark aggregation (`max_by` over the
  offset per key). It shuffles and spills like any Spark aggregation, so it scales to any number of
  keys, and it works on any DataFrame of the source schema (a stream's micro-batch too).
- `spark.read.format("shale").option("latest", "true")`: the data source reduces each partition
  inside its read task with Arrow (no shuffle). A task holds one whole partition in memory, so
  this suits topics whose partitions fit in an executor's memory; `minPartitions` is ignored.
"""

from __future__ import annotations

from typing import Iterable, Iterator, Mapping

import pyarrow as pa
import pyarrow.compute as pc


def latest_view(df):
    """Per (topic, partition, key) the highest-offset record, without the keys whose latest is a tombstone."""
    from pyspark.sql import functions as F

    columns = df.columns
    latest = (df.where(F.col("key").isNotNull())
              .groupBy("topic", "partition", "key")
              .agg(F.max_by(F.struct(*[F.col(c) for c in columns]), F.col("offset")).alias("latest")))
    return latest.select("latest.*").where(F.col("value").isNotNull())


def read(spark, options: Mapping[str, str]):
    """`spark.read.format("shale")` with `options`; `latest=true` is computed by Spark (`latest_view`)."""
    opts = {k: v for k, v in options.items() if k.lower() != "latest"}
    df = spark.read.format("shale").options(**opts).load()
    latest = next((v for k, v in options.items() if k.lower() == "latest"), "false")
    return latest_view(df) if str(latest).lower() == "true" else df


def reduce_latest(batches: Iterable[pa.RecordBatch], schema: pa.Schema) -> Iterator[pa.RecordBatch]:
    """The latest view of one partition's record batches (all of them: it needs the whole partition)."""
    table = pa.Table.from_batches(list(batches), schema=schema)
    if table.num_rows == 0:
        return
    keyed = table.filter(pc.is_valid(table["key"]))
    winners = keyed.group_by("key").aggregate([("offset", "max")])["offset_max"]
    latest = keyed.filter(pc.and_(pc.is_in(keyed["offset"], value_set=winners), pc.is_valid(keyed["value"])))
    latest = latest.sort_by("offset")
    yield from latest.combine_chunks().to_batches(max_chunksize=65536)
