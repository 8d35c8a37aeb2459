"""`TopicRegistry.apply_store_topics`: how a node applies the control store's topic records from each view —
the part of "Topics created through the API" (docs/replication.md) that must never lose data. A real LogDir on
real files; one-replica assignments on this node, so no replica manager is involved."""

from __future__ import annotations

from pathlib import Path

import pytest

from shale.sidecar.log.log_dir import LogDir
from shale.sidecar.log.topic_partition import TopicPartition
from shale.sidecar.replication.topic_record import TopicRecord
from shale.sidecar.topic_config import TopicConfig
from shale.sidecar.topics.registry import NodeAddress, TopicRegistry, TopicSpec

RECORD = TopicRecord("orders", "b3JkZXJzLXRvcGljLWlkMQ", ((0,), (0,)), {"retention.ms": "60000"})


@pytest.fixture
def registry(tmp_path: Path):
    log_dir = LogDir(str(tmp_path), lambda topic: TopicConfig.from_mapping({}))
    yield TopicRegistry(log_dir, NodeAddress(0, "127.0.0.1", 9092))
    log_dir.close()


def partition_dirs(registry: TopicRegistry, topic: str) -> list[str]:
    return sorted(p.name for p in Path(registry.log_dir.path).iterdir() if p.name.startswith(f"{topic}-")
                  and not p.name.endswith("-delete"))


def test_a_record_creates_the_topic_with_its_id_and_config_and_its_removal_deletes_it(registry):
    assert registry.apply_store_topics({"orders": RECORD}) == []
    spec = registry.topics["orders"]
    assert (spec.origin, spec.partitions, spec.assignment) == ("api", 2, ((0,), (0,)))
    assert registry.topic_id("orders") == RECORD.topic_id and spec.config.retention_ms == 60000
    assert partition_dirs(registry, "orders") == ["orders-0", "orders-1"]
    assert registry.apply_store_topics({"orders": RECORD}) == []  # the same view again changes nothing
    assert registry.apply_store_topics({}) == ["orders"]
    assert "orders" not in registry.topics and partition_dirs(registry, "orders") == []


def test_a_view_with_an_unreadable_topic_record_deletes_nothing(registry):
    registry.apply_store_topics({"orders": RECORD})
    assert registry.apply_store_topics({}, complete=False) == []
    assert "orders" in registry.topics and partition_dirs(registry, "orders") == ["orders-0", "orders-1"]


def test_a_record_never_overrides_a_manifest_topic(registry):
    manifest = TopicSpec("orders", 1, TopicConfig.from_mapping({}), origin="manifest:/topics/orders.yaml")
    registry.put(manifest)
    registry.apply_store_topics({"orders": RECORD})
    assert registry.topics["orders"] == manifest
    registry.apply_store_topics({})
    assert registry.topics["orders"] == manifest  # nor does a record's absence delete it


def test_a_topic_deleted_and_created_again_loses_the_old_topics_records(registry):
    registry.apply_store_topics({"orders": RECORD})
    log = registry.log_dir.logs[TopicPartition("orders", 0)]
    again = TopicRecord("orders", "b3JkZXJzLXRvcGljLWlkMg", ((0,),))
    registry.apply_store_topics({"orders": again})
    assert registry.topic_id("orders") == again.topic_id and registry.topics["orders"].partitions == 1
    assert registry.log_dir.logs[TopicPartition("orders", 0)] is not log
    assert registry.log_dir.topic_id(TopicPartition("orders", 0)) == again.topic_id


def test_a_record_with_a_config_this_node_refuses_keeps_the_topic_as_it_is(registry):
    registry.apply_store_topics({"orders": RECORD})
    before = registry.topics["orders"]
    bad = TopicRecord("orders", RECORD.topic_id, RECORD.assignment, {"retention.ms": "soon"})
    registry.apply_store_topics({"orders": bad})
    assert registry.topics["orders"] == before
