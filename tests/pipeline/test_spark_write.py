"""Writing DataFrames to topics, batch and streaming, and reading them back: every row arrives with
its key, value, headers and partition; rows without a partition go where Kafka's Java client
(murmur2) would put them; bad writes are refused while the query is planned."""

from __future__ import annotations

import pytest
from kafka.partitioner.default import murmur2
from pyspark.sql import functions as F
from spark_util import consume_all, produce, rows, start_serve

from support.node_util import topic_manifest

PARTITIONS = 3


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    work = tmp_path_factory.mktemp("write")
    topics = [topic_manifest(name, PARTITIONS) for name in ("out", "a", "b", "source", "copy")]
    node = start_serve(work, topics)
    yield node
    node.terminate()


def writer(df, node, **options):
    w = df.write.format("shale").option("bootstrap.servers", node.bootstrap).mode("append")
    for k, v in options.items():
        w = w.option(k, v)
    return w


def read_topic(spark, node, topic):
    return (spark.read.format("shale").option("bootstrap.servers", node.bootstrap)
            .option("subscribe", topic).option("includeHeaders", "true").load())


def test_batch_write_round_trips(spark, node):
    # keys and values are unique where present, and never both null: (key, value) names a row
    data = [(f"k{i}" if i % 9 else None, None if i % 10 == 5 and i % 9 else b"v%d" % i,
             [(f"h{i}", b"x")] if i % 3 == 0 else [], i % PARTITIONS if i % 4 == 0 else None)
            for i in range(300)]
    df = spark.createDataFrame(data, "key string, value binary, headers array<struct<key:string,value:binary>>, "
                                     "partition int")
    writer(df, node, topic="out").save()
    got = rows(read_topic(spark, node, "out"))
    assert got == consume_all(node.bootstrap, "out")  # what a Kafka client sees too
    assert sorted(((r.key, r.value, r.headers) for r in got), key=repr) == sorted(
        ((None if k is None else k.encode(), v, tuple(h)) for k, v, h, _ in data), key=repr)
    placed = {(r.key, r.value): r.partition for r in got}
    for k, v, _, partition in data:
        key = None if k is None else k.encode()
        if partition is not None:
            assert placed[(key, v)] == partition
        elif key is not None:
            assert placed[(key, v)] == (murmur2(key) & 0x7FFFFFFF) % PARTITIONS  # the Java client's choice


def test_topic_column_and_string_values(spark, node):
    df = spark.createDataFrame([("a", "x", "1"), ("b", "y", "2"), ("a", "z", "3")], "topic string, key string, value string")
    writer(df, node).save()
    assert sorted((r.key, r.value) for r in rows(read_topic(spark, node, "a"))) == [(b"x", b"1"), (b"z", b"3")]
    assert [(r.key, r.value) for r in rows(read_topic(spark, node, "b"))] == [(b"y", b"2")]
    # the topic option wins over the column, as in Spark's Kafka sink
    writer(df, node, topic="b").save()
    assert len(rows(read_topic(spark, node, "b"))) == 4


@pytest.mark.parametrize("columns, mode, message", [
    ("key string", "append", "needs a value column"),
    ("value int", "append", "must be string or binary"),
    ("value string, partition long", "append", "partition must be int"),
    ("value string", "overwrite", "overwrite is not supported"),
])
def test_bad_writes_are_refused(spark, node, columns, mode, message):
    df = spark.createDataFrame([], columns)
    with pytest.raises(Exception, match=message):
        writer(df, node, topic="out").mode(mode).save()


def test_write_without_a_topic_is_refused(spark, node):
    with pytest.raises(Exception, match="say which topic to write"):
        writer(spark.createDataFrame([("v",)], "value string"), node).save()


def test_streaming_write_copies_a_topic(spark, node, tmp_path):
    produce(node.bootstrap, "source", [{"key": b"s%d" % i, "value": b"payload-%d" % i} for i in range(500)])
    stream = (spark.readStream.format("shale").option("bootstrap.servers", node.bootstrap)
              .option("subscribe", "source").option("startingOffsets", "earliest").option("maxOffsetsPerTrigger", "200")
              .load().select("key", "value", F.col("partition")))
    query = (stream.writeStream.format("shale").option("bootstrap.servers", node.bootstrap).option("topic", "copy")
             .option("checkpointLocation", str(tmp_path / "ckpt")).trigger(availableNow=True).start())
    try:
        assert query.awaitTermination(180), "the AvailableNow query did not finish in 180 s"
    finally:
        query.stop()
    assert query.exception() is None
    source, copy = rows(read_topic(spark, node, "source")), rows(read_topic(spark, node, "copy"))
    assert sorted((r.partition, r.key, r.value) for r in copy) == sorted((r.partition, r.key, r.value) for r in source)
    assert len(copy) == 500
