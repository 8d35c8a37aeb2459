"""The latest view equals a model of the writes — before the cleaner ran (cleaning paused) and after it
compacted the topic — computed by Spark (`latest_view`) and by the source's `latest=true`, over the
wire and from the files; and `latest_view` against a model for generated write sequences."""

from __future__ import annotations

import random
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from spark_util import produce, set_cleaning, start_serve, status, wait_for_clean

from shale.pipeline.files import DataDirectory, ScanStats
from shale.pipeline.latest import latest_view, read
from shale.pipeline.schema import BatchBuilder
from support.node_util import topic_manifest, wait_for

TOPIC = "state"
PARTITIONS = 2


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    work = tmp_path_factory.mktemp("latest")
    config = {"cleanup.policy": "compact", "segment.ms": 100, "min.cleanable.dirty.ratio": 0.01,
              "delete.retention.ms": 0}
    node = start_serve(work, [topic_manifest(TOPIC, PARTITIONS, config)], "--override", "log.cleaner.backoff.ms=100")
    yield node
    node.terminate()


def records_in_log(node) -> int:
    total = 0
    for p in range(PARTITIONS):
        stats = ScanStats()
        files = DataDirectory(node.data_dir).partition(TOPIC, p)
        for _ in files.read(0, files.log_end_offset(), None, BatchBuilder(TOPIC, p, False, rows=1 << 30), stats):
            pass
        total += stats.records
    return total


def views(spark, node) -> dict[str, dict]:
    """The latest view four ways, each as {key: value}, checked to have one row per key."""
    out = {}
    for source_name, source in (("wire", {"bootstrap.servers": node.bootstrap}), ("files", {"path": node.data_dir})):
        by_spark = read(spark, {**source, "subscribe": TOPIC, "latest": "true"})
        reader = spark.read.format("shale").option("subscribe", TOPIC).option("latest", "true")
        for k, v in source.items():
            reader = reader.option(k, v)
        for how, df in (("spark", by_spark), ("source", reader.load())):
            got = df.select("key", "value").collect()
            assert len(got) == len({r.key for r in got}), f"{how}/{source_name}: a key twice"
            out[f"{how}/{source_name}"] = {bytes(r.key): bytes(r.value) for r in got}
    return out


def test_latest_view_is_the_model_before_and_after_cleaning(spark, node):
    rng = random.Random(7)
    model: dict[bytes, bytes | None] = {}
    writes = 0
    set_cleaning(node, TOPIC, PARTITIONS, "pause")
    for _round in range(5):  # rounds further apart than segment.ms: each rolls a segment
        batch = []
        for _ in range(400):
            key = b"user-%d" % rng.randrange(120)
            value = None if rng.random() < 0.15 else b"v%d" % rng.randrange(10**6)
            batch.append({"key": key, "value": value})
            model[key] = value
        produce(node.bootstrap, TOPIC, batch)
        writes += len(batch)
        time.sleep(0.15)
    produce(node.bootstrap, TOPIC, [{"key": b"last", "value": b"rolls the previous segment"}])
    model[b"last"] = b"rolls the previous segment"
    writes += 1
    expected = {k: v for k, v in model.items() if v is not None}
    assert 0 < len(expected) < len(model)

    assert records_in_log(node) == writes, "paused: nothing cleaned yet"
    for name, view in views(spark, node).items():
        assert view == expected, f"before cleaning, {name}"

    resumed_ms = int(time.time() * 1000)
    set_cleaning(node, TOPIC, PARTITIONS, "resume")
    wait_for_clean(node, TOPIC, resumed_ms)
    wait_for(lambda: records_in_log(node) < writes / 2, 30, what="compaction to remove superseded records")
    assert all(p["last_clean_ms"] for p in status(node)["topics"][TOPIC]["partitions"])
    for name, view in views(spark, node).items():
        assert view == expected, f"after cleaning, {name}"


_writes = st.lists(st.tuples(st.integers(0, 2), st.sampled_from([b"a", b"b", b"c", b"d", None]),
                             st.one_of(st.none(), st.binary(min_size=1, max_size=3))), max_size=30)


@settings(max_examples=12, deadline=None)
@given(_writes)
def test_latest_view_semantics_against_a_model(spark, writes):
    """Per (partition, key) the highest offset wins; tombstoned keys and null keys are absent."""
    offsets = [0, 0, 0]
    data, model = [], {}
    for partition, key, value in writes:
        offset = offsets[partition]
        offsets[partition] += 1 + (offset % 2)  # gaps, as compaction leaves
        data.append((key, value, "t", partition, offset))
        if key is not None:
            model[(partition, key)] = (offset, value)
    df = spark.createDataFrame(data, "key binary, value binary, topic string, partition int, offset long")
    got = {(r.partition, bytes(r.key)): (r.offset, bytes(r.value)) for r in latest_view(df).collect()}
    assert got == {k: v for k, v in model.items() if v[1] is not None}
    assert latest_view(df).columns == df.columns
