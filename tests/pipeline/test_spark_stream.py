"""Streaming reads: Trigger.AvailableNow with maxOffsetsPerTrigger delivers every record exactly once, in
micro-batches no larger than the limit; a restart from the checkpoint reads only what is new; the
default start is the latest offset; files stream like the wire."""

from __future__ import annotations

import pytest
from spark_util import produce, start_serve

from support.node_util import topic_manifest


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    work = tmp_path_factory.mktemp("stream")
    node = start_serve(work, [topic_manifest(t, 3, {"segment.bytes": 8192}) for t in ("events", "late", "filed")])
    yield node
    node.terminate()


def run_available_now(spark, source: dict, topic, checkpoint, **options):
    """One AvailableNow run into a Parquet sink; returns (batch ids with rows, rows per batch, all records).

    A file sink rather than foreachBatch: no Python callback from the JVM is needed, it keeps its own
    exactly-once log beside the checkpoint, and the progress reports give each micro-batch's size.
    All records the sink holds are returned, from earlier runs on the same checkpoint too.
    """
    reader = spark.readStream.format("shale").option("subscribe", topic)
    for k, v in (source | options).items():
        reader = reader.option(k, v)
    out = f"{checkpoint}-out"
    query = (reader.load().selectExpr("partition", "offset", "value").writeStream.format("parquet")
             .option("path", out).option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start())
    try:
        assert query.awaitTermination(180), "the AvailableNow query did not finish in 180 s"
    finally:
        query.stop()
    assert query.exception() is None
    sizes = [(p["batchId"], p["numInputRows"]) for p in query.recentProgress if p["numInputRows"]]
    rows = [(r.partition, r.offset, bytes(r.value)) for r in spark.read.parquet(out).collect()] if sizes else []
    return [b for b, _ in sizes], [n for _, n in sizes], rows


def wire(node) -> dict:
    return {"bootstrap.servers": node.bootstrap}


def records(produced, values):
    return sorted((p, o, v) for (p, o), v in zip(produced, values))


def test_available_now_delivers_every_record_exactly_once(spark, node, tmp_path):
    values = [b"e%d" % i for i in range(1000)]
    produced = produce(node.bootstrap, "events", [{"key": b"k%d" % (i % 37), "value": v} for i, v in enumerate(values)],
                       **{"batch.size": 4000})
    batches, sizes, delivered = run_available_now(spark, wire(node), "events", tmp_path / "ckpt",
                                                  startingOffsets="earliest", maxOffsetsPerTrigger="300")
    assert sorted(delivered) == records(produced, values)
    assert len(delivered) == len(set(delivered)) == 1000
    assert sizes == [300, 300, 300, 100]  # the limit, shared among partitions

    more = [b"m%d" % i for i in range(200)]
    produced_more = produce(node.bootstrap, "events", [{"key": b"x%d" % i, "value": v} for i, v in enumerate(more)])
    again, _, rows = run_available_now(spark, wire(node), "events", tmp_path / "ckpt", startingOffsets="earliest",
                                       maxOffsetsPerTrigger="300")
    assert sorted(rows) == sorted(records(produced, values) + records(produced_more, more))  # once each
    assert min(again) > max(batches)  # the checkpoint carried on


def test_a_new_stream_starts_at_the_latest_offset(spark, node, tmp_path):
    produce(node.bootstrap, "late", [{"key": b"old", "value": b"before"}] * 20)
    assert run_available_now(spark, wire(node), "late", tmp_path / "ckpt")[2] == []
    values = [b"after-%d" % i for i in range(30)]
    produced = produce(node.bootstrap, "late", [{"key": b"k%d" % i, "value": v} for i, v in enumerate(values)])
    _, sizes, rows = run_available_now(spark, wire(node), "late", tmp_path / "ckpt")
    assert sorted(rows) == records(produced, values) and sizes == [30]


def test_streaming_from_files_reads_the_same_records(spark, node, tmp_path):
    values = [b"f%d" % i for i in range(400)]
    produced = produce(node.bootstrap, "filed", [{"key": b"k%d" % i, "value": v} for i, v in enumerate(values)])
    _, sizes, rows = run_available_now(spark, {"path": node.data_dir}, "filed", tmp_path / "ckpt",
                                       startingOffsets="earliest", maxOffsetsPerTrigger="150")
    assert sorted(rows) == records(produced, values)
    assert sizes == [150, 150, 100]
