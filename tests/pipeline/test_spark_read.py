"""Batch reads through Spark against a real `shale serve`: the wire read equals what an independent Kafka
client consumes, the file read equals the wire read, the offset options follow Spark's Kafka source,
and pushed filters prune partitions and segments (checked in the readers' scan reports)."""

from __future__ import annotations

import datetime as dt
import json
import os
import time

import pytest
from pyspark.sql import functions as F
from spark_util import consume_all, produce, rows, scan_reports, start_serve

from shale.pipeline.options import SourceOptions
from shale.pipeline.wire import WireCluster
from support.node_util import topic_manifest, wait_for

CODECS = ["none", "gzip", "snappy", "lz4", "zstd"]
T0 = (int(time.time()) - 86400) * 1000  # CreateTime timestamps a day back, one second apart


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    work = tmp_path_factory.mktemp("read")
    topics = [
        topic_manifest("mixed", 3, {"segment.bytes": 4096, "index.interval.bytes": 256}),
        topic_manifest("appendtime", 1, {"message.timestamp.type": "LogAppendTime"}),
        topic_manifest("timed", 2, {"segment.bytes": 2048, "index.interval.bytes": 128}),
        topic_manifest("expiring", 1, {"segment.bytes": 1024, "retention.ms": 60000}),
    ]
    node = start_serve(work, topics, "--override", "log.retention.check.interval.ms=200")
    try:
        for i, codec in enumerate(CODECS):
            produce(node.bootstrap, "mixed", [
                {"key": None if n % 17 == 0 else b"key-%d" % (n % 40),
                 "value": None if n % 13 == 0 else b"%s-value-%d" % (codec.encode(), n),
                 "headers": [("n", b"%d" % n), ("empty", None)] if n % 4 == 0 else None,
                 "partition": 2 if n % 50 == 0 else None}
                for n in range(i * 300, (i + 1) * 300)], **{"compression.type": codec, "batch.size": 2000})
        produce(node.bootstrap, "appendtime", [{"key": b"a%d" % n, "value": b"v"} for n in range(50)])
        now = int(time.time() * 1000)
        produce(node.bootstrap, "expiring", [{"key": b"e%d" % n, "value": b"y" * 50, "timestamp": T0 + n if n < 80 else now}
                                             for n in range(100)], **{"batch.size": 500})
        produce(node.bootstrap, "timed", [{"key": b"t%d" % n, "value": b"x" * 20, "timestamp": T0 + n * 1000,
                                           "partition": n % 2} for n in range(600)], **{"batch.size": 1000})
        yield node
    finally:
        node.terminate()


def read(spark, node, **options):
    reader = spark.read.format("shale")
    for k, v in {"bootstrap.servers": node.bootstrap, **options}.items():
        reader = reader.option(k, v)
    return reader.load()


def from_files(spark, node, **options):
    reader = spark.read.format("shale").option("path", node.data_dir)
    for k, v in options.items():
        reader = reader.option(k, v)
    return reader.load()


def test_wire_read_equals_what_a_kafka_client_consumes(spark, node):
    expected = consume_all(node.bootstrap, "mixed") + consume_all(node.bootstrap, "appendtime")
    got = rows(read(spark, node, subscribe="mixed,appendtime", includeHeaders="true"))
    assert len(got) == 1550 and got == sorted(expected)
    assert {r.timestamp_type for r in got if r.topic == "appendtime"} == {1}
    assert {r.timestamp_type for r in got if r.topic == "mixed"} == {0}
    assert any(r.headers == (("n", b"0"), ("empty", None)) for r in got)
    assert any(r.key is None for r in got) and any(r.value is None for r in got)


def test_file_read_equals_wire_read(spark, node):
    wire = rows(read(spark, node, subscribe="mixed,appendtime,timed", includeHeaders="true"))
    files = rows(from_files(spark, node, subscribe="mixed,appendtime,timed", includeHeaders="true"))
    assert len(files) == 2150 and files == wire
    assert any(r.headers for r in files)
    by_default = from_files(spark, node, subscribe="appendtime")  # Spark's default: includeHeaders=false
    assert "headers" not in by_default.columns and by_default.count() == 50


def test_offset_options_follow_spark(spark, node):
    everything = rows(read(spark, node, subscribe="mixed"))
    got = rows(read(spark, node, assign=json.dumps({"mixed": [0, 2]}),
                    startingOffsets=json.dumps({"mixed": {"0": 5, "2": -2}}),
                    endingOffsets=json.dumps({"mixed": {"0": 20, "2": -1}})))
    assert got == [r for r in everything if (r.partition == 0 and 5 <= r.offset < 20) or r.partition == 2]
    with pytest.raises(Exception, match="If endingOffsets contains specific offsets, you must specify all"):
        read(spark, node, assign=json.dumps({"mixed": [0, 2]}), endingOffsets=json.dumps({"mixed": {"0": 20}})).count()
    assert rows(read(spark, node, subscribePattern="mix.*")) == everything

    split = read(spark, node, subscribe="mixed", minPartitions="7", **{"kafka.group.id": "authorized-group"})
    assert split.rdd.getNumPartitions() >= 7 and rows(split) == everything
    capped = read(spark, node, subscribe="mixed", maxRecordsPerPartition="100", groupIdPrefix="reports")
    sizes = capped.groupBy(F.spark_partition_id().alias("task")).count().collect()
    assert max(r["count"] for r in sizes) <= 100 and len(sizes) >= 1500 // 100
    assert rows(capped) == everything

    timed = rows(read(spark, node, subscribe="timed"))
    start_ts = T0 + 400 * 1000
    since = rows(read(spark, node, subscribe="timed", startingTimestamp=str(start_ts)))
    assert since == [r for r in timed if r.timestamp >= start_ts]  # timestamps grow with offsets here
    assert rows(from_files(spark, node, subscribe="timed", startingTimestamp=str(start_ts))) == since
    with pytest.raises(Exception, match="no record at or after timestamp"):
        read(spark, node, subscribe="timed", startingTimestamp=str(T0 + 10**9)).collect()
    until = rows(read(spark, node, subscribe="timed", endingTimestamp=str(start_ts)))
    assert until == [r for r in timed if r.timestamp < start_ts]
    by_partition = rows(read(spark, node, subscribe="timed",
                             startingOffsetsByTimestamp=json.dumps({"timed": {"0": start_ts, "1": T0}})))
    assert by_partition == [r for r in timed if r.partition == 1 or r.timestamp >= start_ts]
    with pytest.raises(Exception, match="If startingOffsetsByTimestamp contains specific offsets"):
        read(spark, node, subscribe="timed", startingOffsetsByTimestamp=json.dumps({"timed": {"0": start_ts}})).count()
    late = read(spark, node, subscribe="timed", startingTimestamp=str(T0 + 10**9),
                startingOffsetsByTimestampStrategy="latest")
    assert late.count() == 0


@pytest.mark.parametrize("source", ["wire", "files"])
def test_partition_and_offset_filters_prune_what_is_read(spark, node, tmp_path, source):
    reports = tmp_path / "scan"
    df = (read if source == "wire" else from_files)(spark, node, subscribe="mixed", scanReportDir=str(reports))
    everything = rows(read(spark, node, subscribe="mixed"))
    bases = sorted(int(n[:20]) for n in os.listdir(os.path.join(node.data_dir, "mixed-1")) if n.endswith(".log"))
    assert len(bases) >= 3
    start, end = bases[1] + 5, bases[1] + 50  # inside the second segment
    filtered = df.where((F.col("partition") == 1) & (F.col("offset") >= start) & (F.col("offset") < end))
    assert rows(filtered) == [r for r in everything if r.partition == 1 and start <= r.offset < end]
    [report] = scan_reports(reports)
    assert (report["partition"], report["start"], report["end"], report["records"]) == (1, start, end, 45)
    if source == "files":
        assert report["segments_read"] == [bases[1]] and report["segments_listed"] == len(bases)
    else:
        assert report["fetch_start"] == start
    assert rows(df.where(F.col("partition").isin(7, 8))) == []


def test_timestamp_filter_skips_segments_by_the_time_index(spark, node, tmp_path):
    reports = tmp_path / "scan"
    since = dt.datetime.fromtimestamp((T0 + 500 * 1000) / 1000, tz=dt.timezone.utc)
    timed = rows(read(spark, node, subscribe="timed"))
    df = from_files(spark, node, subscribe="timed", scanReportDir=str(reports)).where(F.col("timestamp") >= since)
    assert rows(df) == [r for r in timed if r.timestamp >= T0 + 500 * 1000]
    by_partition = {r["partition"]: r for r in scan_reports(reports)}
    assert set(by_partition) == {0, 1}
    for report in by_partition.values():
        assert report["segments_skipped_by_time"], "early segments are skipped by their largest timestamp"
        assert len(report["segments_read"]) < report["segments_listed"]
        assert report["records"] == 50
    over_wire = read(spark, node, subscribe="timed", scanReportDir=str(tmp_path / "wire")).where(F.col("timestamp") >= since)
    assert rows(over_wire) == rows(df)
    assert {r["fetch_start"] for r in scan_reports(tmp_path / "wire")} == {250}  # ListOffsets by time


def test_offsets_deleted_by_retention_are_data_loss(spark, node):
    """80 records a day old, then 20 new, in a topic keeping a minute: retention deletes the old segments."""
    cluster = WireCluster(SourceOptions.parse({"bootstrap.servers": node.bootstrap, "subscribe": "expiring"}))
    try:
        low = wait_for(lambda: cluster.watermarks([("expiring", 0)])[("expiring", 0)][0], 30,
                       what="retention to move the log start offset")
    finally:
        cluster.close()
    from_zero = json.dumps({"expiring": {"0": 0}})
    for df in (read(spark, node, subscribe="expiring", startingOffsets=from_zero),
               from_files(spark, node, subscribe="expiring", startingOffsets=from_zero)):
        with pytest.raises(Exception, match=f"starting offset 0 is below the log start offset {low}"):
            df.collect()
    kept = rows(read(spark, node, subscribe="expiring", startingOffsets=from_zero, failOnDataLoss="false"))
    assert 0 < low <= 80
    assert kept == consume_all(node.bootstrap, "expiring") and kept[0].offset == low and len(kept) == 100 - low
    assert rows(from_files(spark, node, subscribe="expiring", startingOffsets=from_zero, failOnDataLoss="false")) == kept
