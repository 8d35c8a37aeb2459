"""CreateTopics, DescribeConfigs, AlterConfigs and IncrementalAlterConfigs against a real node, through the
admin clients of kafka-python, confluent-kafka (librdkafka) and aiokafka, and raw requests for the corners
no client exposes."""

from __future__ import annotations

import asyncio
import socket
import struct
import time
import uuid
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.admin import NewTopic as AioNewTopic
from aiokafka.admin.config_resource import ConfigResource as AioResource
from aiokafka.admin.config_resource import ConfigResourceType as AioType
from aiokafka.structs import TopicPartition as AioTP
from confluent_kafka import KafkaError, KafkaException, Producer
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigSource,
    ResourceType,
)
from confluent_kafka.admin import (
    ConfigResource as CResource,
)
from confluent_kafka.admin import (
    NewTopic as CNewTopic,
)
from kafka import KafkaConsumer, KafkaProducer
from kafka import TopicPartition as KTP
from kafka.admin import ConfigResource, KafkaAdminClient
from kafka.protocol.admin.configs import (
    AlterConfigsRequest,
    AlterConfigsResponse,
    DescribeConfigsRequest,
    DescribeConfigsResponse,
    IncrementalAlterConfigsRequest,
    IncrementalAlterConfigsResponse,
)
from kafka.protocol.admin.topics import CreateTopicsRequest, CreateTopicsResponse

from shale.sidecar.log.topic_partition import TopicPartition
from shale.sidecar.topic_config import CONFIG_KEYS, TopicConfig
from shale.sidecar.topics.registry import API_TOPICS_FILE, topic_uuid
from support.node_util import NodeThread, free_port, topic_manifest, write_manifests

DECLARED = "declared"  # the topic the manifest declares in every test


@pytest.fixture
def dirs(tmp_path):
    topics = tmp_path / "topics"
    write_manifests(topics / "declared.yaml", topic_manifest(DECLARED, 1, {"retention.ms": 86400000}))
    return tmp_path / "data", topics


@pytest.fixture
def node(dirs):
    with NodeThread(*dirs) as n:
        yield n


@pytest.fixture
def kp_admin(node):
    admin = KafkaAdminClient(bootstrap_servers=node.bootstrap, client_id="admin-test")
    yield admin
    admin.close()


def created(node, name: str):
    return node.node.registry.topics.get(name)


def live_config(node, name: str, partition: int = 0) -> TopicConfig:
    """The config object the partition's Log reads at every append, roll and retention check."""
    return node.node.log_dir.logs[TopicPartition(name, partition)].config


def data_dirs(node, prefix: str) -> list[str]:
    """The partition directories on disk whose names start with `prefix`."""
    root = Path(node.node.log_dir.path)
    return sorted(d.name for d in root.iterdir() if d.is_dir() and d.name.startswith(prefix))


def kp_results(response: dict) -> dict[str, tuple[int, str | None]]:
    return {t["name"]: (t["error_code"], t["error_message"]) for t in response["topics"]}


def kp_describe(admin: KafkaAdminClient, name: str, **kw) -> dict:
    return admin.describe_configs([ConfigResource("TOPIC", name)], config_filter="all", **kw)["topic"][name]


# -- raw requests ----------------------------------------------------------------------------------

RESPONSES = {19: CreateTopicsResponse, 32: DescribeConfigsResponse, 33: AlterConfigsResponse,
             44: IncrementalAlterConfigsResponse}


def _recv_exactly(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        assert chunk, "the node closed the connection"
        data += chunk
    return data


def raw(node, request, version: int):
    """Send one request (a kafka-python protocol object) at `version` and decode the node's response."""
    request.API_VERSION = version
    request.with_header(correlation_id=42, client_id="raw-admin-test")
    with socket.create_connection(("127.0.0.1", node.node.broker.port), timeout=10) as sock:
        sock.sendall(request.encode(header=True, framed=True))
        (size,) = struct.unpack(">i", _recv_exactly(sock, 4))
        data = _recv_exactly(sock, size)
    response = RESPONSES[request.API_KEY].decode(data, version=version, header=True)
    assert response.header.correlation_id == 42
    return response


def incremental(node, resources, validate_only=False):
    response = raw(node, IncrementalAlterConfigsRequest(resources=resources, validate_only=validate_only), 1)
    return [(r.error_code, r.error_message) for r in response.responses]


# -- CreateTopics ----------------------------------------------------------------------------------


def test_kafka_python_creates_a_topic_and_reports_it_as_kafka_does(node, kp_admin):
    response = kp_admin.create_topics({"orders": {"num_partitions": 3, "replication_factor": 1,
                                                  "configs": {"cleanup.policy": "compact", "segment.ms": "100"}}})
    (topic,) = response["topics"]
    spec = created(node, "orders")
    assert spec is not None and spec.origin == "api" and spec.partitions == 3
    assert spec.config == TopicConfig.from_mapping({"cleanup.policy": "compact", "segment.ms": "100"})
    # v5+ fields: what was created, with every config and where its value comes from.
    assert (topic["error_code"], topic["num_partitions"], topic["replication_factor"]) == (0, 3, 1)
    assert uuid.UUID(str(topic["topic_id"])) == topic_uuid(node.node.registry.topic_id("orders"))
    configs = topic["configs"]
    assert set(configs) == {key.name for key in CONFIG_KEYS}
    assert configs["cleanup.policy"]["value"] == "compact"
    assert configs["cleanup.policy"]["config_source"] == "DYNAMIC_TOPIC_CONFIG"
    assert configs["retention.ms"] == {"value": "604800000", "read_only": False, "config_source": "DEFAULT_CONFIG",
                                       "is_sensitive": False}
    # One directory per partition, each log with the new config.
    assert data_dirs(node, "orders") == ["orders-0", "orders-1", "orders-2"]
    assert sorted(tp.partition for tp in node.node.log_dir.logs if tp.topic == "orders") == [0, 1, 2]
    assert all(live_config(node, "orders", p).compact for p in range(3))
    # Metadata shows it.
    assert {t["name"]: len(t["partitions"]) for t in kp_admin.describe_topics(["orders"])} == {"orders": 3}


def test_create_topics_refuses_what_kafka_refuses(node, kp_admin):
    response = kp_admin.create_topics({
        DECLARED: {},
        "bad name": {},
        "x" * 250: {},
        "rf3": {"replication_factor": 3},
        "rf0": {"replication_factor": 0},
        "p0": {"num_partitions": 0},
        "bad-config": {"configs": {"retention.ms": "forever"}},
        "unknown-config": {"configs": {"retention.msec": "1"}},
        "conflicting-config": {"configs": {"min.compaction.lag.ms": "10", "max.compaction.lag.ms": "5"}},
        "__transaction_state": {},
        "a_b": {},
        "a.b": {},
        "manual": {"assignments": {0: [0], 1: [0]}},
        "manual-elsewhere": {"assignments": {0: [7]}},
        "manual-two-replicas": {"assignments": {0: [0, 1]}},
        "manual-gap": {"assignments": {0: [0], 2: [0]}},
        "manual-with-count": {"num_partitions": 1, "assignments": {0: [0]}},
    }, raise_errors=False)
    results = kp_results(response)
    codes = {name: code for name, (code, _) in results.items()}
    assert codes == {
        DECLARED: 36, "bad name": 17, "x" * 250: 17, "rf3": 38, "rf0": 38, "p0": 37, "bad-config": 40,
        "unknown-config": 40, "conflicting-config": 40, "__transaction_state": 17, "a_b": 0, "a.b": 17,
        "manual": 0, "manual-elsewhere": 39, "manual-two-replicas": 38, "manual-gap": 39, "manual-with-count": 42,
    }
    assert results[DECLARED][1] == f"Topic '{DECLARED}' already exists."
    assert results["bad name"][1] == ('Topic name "bad name" is illegal, it contains a character other than '
                                      "ASCII alphanumerics, '.', '_' and '-'")
    assert "can't be longer than 249 characters" in results["x" * 250][1]
    assert results["rf3"][1].startswith("Unable to replicate the partition 3 time(s)")
    assert results["p0"][1] == "Number of partitions was set to an invalid non-positive value."
    assert results["bad-config"][1] == "Invalid value forever for configuration retention.ms: Not a number of type LONG"
    assert results["unknown-config"][1] == "Unknown topic config name: retention.msec"
    assert results["a.b"][1] == "Topic 'a.b' collides with existing topic: a_b"
    assert results["manual-with-count"][1] == ("A manual partition assignment was specified, but numPartitions was "
                                               "not set to -1.")
    # Only the good ones exist, the manual assignment honoured; the manifest topic is untouched.
    registry = node.node.registry
    assert sorted(n for n, s in registry.topics.items() if not s.internal) == ["a_b", DECLARED, "manual"]
    assert registry.topics["manual"].partitions == 2 and registry.topics["a_b"].partitions == 1
    assert registry.topics[DECLARED].origin.startswith("manifest:")
    assert sorted(tp.topic for tp in node.node.log_dir.logs if not tp.topic.startswith("__")) == [
        "a_b", DECLARED, "manual", "manual"]
    assert [d for d in data_dirs(node, "") if not d.startswith("__")] == ["a_b-0", f"{DECLARED}-0", "manual-0",
                                                                        "manual-1"]


def test_validate_only_answers_as_if_created_and_creates_nothing(node, kp_admin):
    response = kp_admin.create_topics({"dry": {"num_partitions": 2, "configs": {"retention.ms": "1000"}},
                                       "dry-bad": {"configs": {"retention.ms": "-5"}}},
                                      validate_only=True, raise_errors=False)
    by_name = {t["name"]: t for t in response["topics"]}
    assert by_name["dry"]["error_code"] == 0 and by_name["dry"]["num_partitions"] == 2
    assert by_name["dry"]["configs"]["retention.ms"]["value"] == "1000"
    assert by_name["dry-bad"]["error_code"] == 40
    assert "retention.ms" in by_name["dry-bad"]["error_message"]
    assert created(node, "dry") is None
    assert not any(tp.topic == "dry" for tp in node.node.log_dir.logs)
    assert data_dirs(node, "dry") == []
    assert "dry" not in kp_admin.list_topics()


def test_a_created_topic_takes_produce_and_fetch(node, kp_admin):
    kp_admin.create_topics({"events": {"num_partitions": 2}})
    producer = KafkaProducer(bootstrap_servers=node.bootstrap, acks=1, enable_idempotence=False, linger_ms=5)
    try:
        futures = [producer.send("events", key=b"k%d" % i, value=b"v%d" % i, partition=i % 2) for i in range(10)]
        producer.flush(10)
        metas = [f.get(timeout=10) for f in futures]
    finally:
        producer.close(5)
    assert sorted((m.partition, m.offset) for m in metas) == [(p, o) for p in range(2) for o in range(5)]
    consumer = KafkaConsumer(bootstrap_servers=node.bootstrap, group_id=None, enable_auto_commit=False,
                             fetch_max_wait_ms=100)
    try:
        consumer.assign([KTP("events", 0), KTP("events", 1)])
        consumer.seek_to_beginning()
        got = []
        deadline = time.monotonic() + 15
        while len(got) < 10 and time.monotonic() < deadline:
            for records in consumer.poll(timeout_ms=200).values():
                got.extend(records)
    finally:
        consumer.close()
    assert sorted((r.partition, r.offset, r.key, r.value) for r in got) == sorted(
        (i % 2, i // 2, b"k%d" % i, b"v%d" % i) for i in range(10))


def test_raw_create_topics_null_config_and_old_versions(node):
    response = raw(node, CreateTopicsRequest(topics=[("nulled", -1, -1, [], [("retention.ms", None)]),
                                                     ("old", 2, 1, [], [("segment.ms", "1000")])],
                                             timeout_ms=1000, validate_only=False), 2)
    results = {t.name: (t.error_code, t.error_message) for t in response.topics}
    assert results == {"nulled": (40, "Null value not supported for topic configs: retention.ms"), "old": (0, None)}
    assert created(node, "old").partitions == 2 and live_config(node, "old", 1).segment_ms == 1000
    # A name twice in one request: both refused, neither created (Kafka's ControllerApis).
    response = raw(node, CreateTopicsRequest(topics=[("twice", 1, 1, [], []), ("twice", 1, 1, [], [])],
                                             timeout_ms=1000, validate_only=False), 7)
    assert [(t.error_code, t.error_message) for t in response.topics] == [(42, "Duplicate topic name.")] * 2
    assert created(node, "twice") is None


# -- DescribeConfigs -------------------------------------------------------------------------------


def test_kafka_python_describe_configs_shows_values_sources_and_kafkas_defaults(node, kp_admin):
    kp_admin.create_topics({"described": {"configs": {"retention.ms": "1000", "cleanup.policy": "compact,delete",
                                                      "min.cleanable.dirty.ratio": "0.25"}}})
    configs = kp_describe(kp_admin, "described", include_synonyms=True)
    assert set(configs) == {key.name for key in CONFIG_KEYS}
    assert all(not c["read_only"] and not c["is_sensitive"] for c in configs.values())
    set_here = {name for name, c in configs.items() if c["config_source"] == "DYNAMIC_TOPIC_CONFIG"}
    assert set_here == {"retention.ms", "cleanup.policy", "min.cleanable.dirty.ratio"}
    assert {n: configs[n]["value"] for n in set_here} == {"retention.ms": "1000", "cleanup.policy": "compact,delete",
                                                          "min.cleanable.dirty.ratio": "0.25"}
    # The rest are Kafka's defaults.
    defaults = {"segment.bytes": "1073741824", "segment.ms": "604800000", "retention.bytes": "-1",
                "max.message.bytes": "1048588", "message.timestamp.type": "CreateTime", "compression.type": "producer",
                "delete.retention.ms": "86400000", "file.delete.delay.ms": "60000", "preallocate": "false",
                "max.compaction.lag.ms": "9223372036854775807", "leader.replication.throttled.replicas": ""}
    assert {n: (configs[n]["value"], configs[n]["config_source"]) for n in defaults} == {
        n: (v, "DEFAULT_CONFIG") for n, v in defaults.items()}
    # Synonyms: the topic's own value first, then the broker default it would otherwise take.
    assert configs["retention.ms"]["synonyms"] == [
        {"name": "retention.ms", "value": "1000", "source": "DYNAMIC_TOPIC_CONFIG"},
        {"name": "log.retention.hours", "value": "168", "source": "DEFAULT_CONFIG"}]
    assert configs["segment.bytes"]["synonyms"] == [
        {"name": "log.segment.bytes", "value": "1073741824", "source": "DEFAULT_CONFIG"}]
    assert configs["retention.ms"]["config_type"] == "LONG" and configs["cleanup.policy"]["config_type"] == "LIST"
    # The manifest's topic: its manifest config is the topic's own.
    declared = kp_describe(kp_admin, DECLARED)
    assert (declared["retention.ms"]["value"], declared["retention.ms"]["config_source"]) == (
        "86400000", "DYNAMIC_TOPIC_CONFIG")
    # The default filter ('modified') returns only what was set.
    modified = kp_admin.describe_configs([ConfigResource("TOPIC", "described")])["topic"]["described"]
    assert set(modified) == set_here


def test_raw_describe_configs_documentation_filter_and_refusals(node):
    response = raw(node, DescribeConfigsRequest(resources=[
        (2, DECLARED, ["retention.ms", "segment.bytes", "no.such.key"]),
        (2, "missing", None),
        (2, "bad/name", None),
        (4, "", None),
        (4, "0", ["node.id", "log.dirs", "num.partitions", "log.retention.hours"]),
        (4, "7", None),
        (4, "zero", None),
        (1, "whatever", None),
    ], include_synonyms=False, include_documentation=True), 3)
    topic, missing, bad, cluster, broker, other, named, unknown_type = response.results
    assert [(c.name, c.value, c.config_source, c.config_type) for c in topic.configs] == [
        ("retention.ms", "86400000", 1, 5), ("segment.bytes", "1073741824", 5, 3)]
    assert all(c.documentation and c.synonyms == [] for c in topic.configs)
    assert "retention.ms" not in topic.configs[1].documentation and "rolled" in topic.configs[1].documentation
    assert (missing.error_code, missing.error_message, missing.configs) == (
        3, "The topic 'missing' does not exist.", [])
    assert bad.error_code == 17
    assert (cluster.error_code, cluster.configs) == (0, [])  # the cluster-wide defaults: none
    values = {c.name: (c.value, c.read_only, c.config_source) for c in broker.configs}
    assert values == {"node.id": ("0", True, 4), "log.dirs": (node.node.log_dir.path, True, 4),
                      "num.partitions": ("1", True, 5), "log.retention.hours": ("168", True, 5)}
    assert (other.error_code, other.error_message) == (42, "Unexpected broker id, expected 0 or empty string, "
                                                           "but received 7")
    assert named.error_code == 42 and "must be an integer" in named.error_message
    assert unknown_type.error_code == 42 and unknown_type.resource_name == "whatever"
    # Version 1 (no documentation, no types) still answers.
    v1 = raw(node, DescribeConfigsRequest(resources=[(2, DECLARED, ["retention.ms"])], include_synonyms=True), 1)
    (entry,) = v1.results[0].configs
    assert (entry.value, entry.config_source, [s.name for s in entry.synonyms]) == (
        "86400000", 1, ["retention.ms", "log.retention.hours"])


def test_the_broker_resource_shows_the_node_settings_and_its_overrides(dirs):
    overrides = {"log.retention.check.interval.ms": "1000", "log.cleaner.threads": "2"}
    with NodeThread(*dirs, node_id=3, overrides=overrides) as n:
        admin = KafkaAdminClient(bootstrap_servers=n.bootstrap)
        try:
            configs = admin.describe_configs([ConfigResource("BROKER", "3")], config_filter="all")["broker"]["3"]
        finally:
            admin.close()
    shown = {name: (c["value"], c["config_source"]) for name, c in configs.items()}
    assert shown["node.id"] == ("3", "STATIC_BROKER_CONFIG")
    assert shown["log.retention.check.interval.ms"] == ("1000", "STATIC_BROKER_CONFIG")
    assert shown["log.cleaner.threads"] == ("2", "STATIC_BROKER_CONFIG")
    assert shown["log.cleaner.backoff.ms"] == ("15000", "DEFAULT_CONFIG")
    assert shown["log.segment.bytes"] == ("1073741824", "DEFAULT_CONFIG")
    assert shown["advertised.listeners"][0] == f"PLAINTEXT://127.0.0.1:{n.node.broker.port}"
    assert all(c["read_only"] for c in configs.values())


def test_the_broker_resource_names_each_setting_once_and_every_advertised_listener(dirs):
    """One entry per name (default.replication.factor was listed twice), and advertised.listeners as Kafka shows
    it: every listener, `NAME://host:port` (it named one PLAINTEXT address whatever the listeners)."""
    a, b = free_port(), free_port()
    overrides = {"listeners": f"INSIDE://127.0.0.1:{a},OUTSIDE://127.0.0.1:{b}",
                 "advertised.listeners": f"INSIDE://127.0.0.1:{a},OUTSIDE://outside.example:{b + 1}",
                 "listener.security.protocol.map": "INSIDE:PLAINTEXT,OUTSIDE:PLAINTEXT",
                 "inter.broker.listener.name": "INSIDE"}
    with NodeThread(*dirs, node_id=0, overrides=overrides) as n:
        response = raw(n, DescribeConfigsRequest(resources=[(4, "0", None)], include_synonyms=False), 1)
    names = [c.name for c in response.results[0].configs]
    assert len(names) == len(set(names)) and "default.replication.factor" in names
    shown = {c.name: c.value for c in response.results[0].configs}
    assert shown["advertised.listeners"] == f"INSIDE://127.0.0.1:{a},OUTSIDE://outside.example:{b + 1}"


# -- AlterConfigs and IncrementalAlterConfigs ------------------------------------------------------


def test_kafka_python_incremental_alter_changes_describe_and_the_live_log(node, kp_admin):
    kp_admin.create_topics({"tuned": {"num_partitions": 2, "configs": {"retention.ms": "1000"}}})
    result = kp_admin.alter_configs([ConfigResource("TOPIC", "tuned", {
        "segment.ms": "250",
        "max.message.bytes": ("SET", "200"),
        "cleanup.policy": ("APPEND", "compact"),
        "retention.ms": ("DELETE", None),
    })])
    assert result == {"topic": {"tuned": "OK"}}
    configs = kp_describe(kp_admin, "tuned")
    assert {n: (configs[n]["value"], configs[n]["config_source"]) for n in
            ("segment.ms", "max.message.bytes", "cleanup.policy", "retention.ms")} == {
        "segment.ms": ("250", "DYNAMIC_TOPIC_CONFIG"), "max.message.bytes": ("200", "DYNAMIC_TOPIC_CONFIG"),
        "cleanup.policy": ("delete,compact", "DYNAMIC_TOPIC_CONFIG"), "retention.ms": ("604800000", "DEFAULT_CONFIG")}
    # The partitions' logs hold the new config object, so the next append and roll use it...
    for p in range(2):
        cfg = live_config(node, "tuned", p)
        assert (cfg.segment_ms, cfg.max_message_bytes, cfg.cleanup_policy, cfg.retention_ms) == (
            250, 200, ("delete", "compact"), 604800000)
    # ...as a producer sees: a batch over the new max.message.bytes is refused, and so is a record without
    # a key now that the topic is compacted.
    producer = Producer({"bootstrap.servers": node.bootstrap, "linger.ms": 0, "compression.type": "none",
                         "retries": 0})
    outcomes = {}

    def send(what: str, partition: int, value: bytes, key: bytes | None) -> None:
        producer.produce("tuned", key=key, value=value, partition=partition,
                         on_delivery=lambda err, msg: outcomes.__setitem__(what, err.code() if err else "ok"))
        assert producer.flush(15) == 0

    send("too large", 0, b"x" * 1000, b"k")
    send("small", 1, b"small", b"k")
    send("no key", 1, b"small", None)
    assert outcomes == {"too large": KafkaError.MSG_SIZE_TOO_LARGE, "small": "ok", "no key": KafkaError.INVALID_RECORD}
    assert node.node.log_dir.logs[TopicPartition("tuned", 0)].log_end_offset == 0
    assert node.node.log_dir.logs[TopicPartition("tuned", 1)].log_end_offset == 1


def test_altering_a_manifest_topic_is_refused_and_changes_nothing(node, kp_admin, dirs):
    before = created(node, DECLARED)
    result = kp_admin.alter_configs([ConfigResource("TOPIC", DECLARED, {"retention.ms": "1"})])
    message = result["topic"][DECLARED]
    assert message.startswith("[Error 44] PolicyViolationError")
    assert str(dirs[1] / "declared.yaml") in message and "edit the manifest" in message
    # Legacy AlterConfigs (aiokafka sends it) and validate_only are refused the same way.
    assert incremental(node, [(2, DECLARED, [("retention.ms", 0, "1")])], validate_only=True)[0][0] == 44
    legacy = raw(node, AlterConfigsRequest(resources=[(2, DECLARED, [("retention.ms", "1")])], validate_only=False), 0)
    assert legacy.responses[0].error_code == 44
    assert created(node, DECLARED) == before and live_config(node, DECLARED).retention_ms == 86400000


def test_raw_incremental_alter_configs_operations_and_refusals(node):
    raw(node, CreateTopicsRequest(topics=[("inc", 1, 1, [], [("cleanup.policy", "compact")])], timeout_ms=1000,
                                  validate_only=False), 7)
    assert incremental(node, [(2, "inc", [("cleanup.policy", 2, "delete,compact"), ("retention.ms", 0, "5000")])]) == [
        (0, None)]
    assert live_config(node, "inc").cleanup_policy == ("compact", "delete")
    assert incremental(node, [(2, "inc", [("cleanup.policy", 3, "compact")])]) == [(0, None)]
    assert live_config(node, "inc").cleanup_policy == ("delete",)
    # validate_only checks and changes nothing.
    assert incremental(node, [(2, "inc", [("retention.ms", 0, "7")])], validate_only=True) == [(0, None)]
    assert live_config(node, "inc").retention_ms == 5000
    # A resource with one bad operation is refused as a whole.
    refusals = {
        "not a list": [("retention.ms", 2, "1")],
        "bad value": [("segment.ms", 0, "100"), ("retention.ms", 0, "-9")],
        "unknown key": [("retention.msec", 0, "1")],
        "null": [("retention.ms", 0, None)],
        "duplicate keys": [("retention.ms", 0, "1"), ("retention.ms", 1, None)],
        "unknown op": [("retention.ms", 9, "1")],
    }
    got = {why: incremental(node, [(2, "inc", ops)])[0] for why, ops in refusals.items()}
    assert got == {
        "not a list": (40, "Can't APPEND to key retention.ms because its type is not LIST."),
        "bad value": (40, "Invalid value -9 for configuration retention.ms: Value must be at least -1"),
        "unknown key": (40, "Unknown topic config name: retention.msec"),
        "null": (42, "Null value not supported for : retention.ms"),
        "duplicate keys": (42, "Error due to duplicate config keys"),
        "unknown op": (42, "Unknown operation type 9 for config retention.ms"),
    }
    cfg = live_config(node, "inc")
    assert (cfg.retention_ms, cfg.segment_ms) == (5000, 604800000)
    # Resources: twice in one request, unknown topic, broker settings, unknown type.
    assert incremental(node, [(2, "inc", []), (2, "inc", [])]) == [(42, "Each resource must appear at most once.")] * 2
    assert incremental(node, [(2, "nope", [("retention.ms", 0, "1")])]) == [(3, "The topic 'nope' does not exist.")]
    (code, message), = incremental(node, [(4, "0", [("log.retention.hours", 0, "1")])])
    assert code == 42 and "Cannot update these configs dynamically: log.retention.hours" in message
    assert incremental(node, [(4, "", [])]) == [(0, None)]
    assert incremental(node, [(16, "metrics", [])])[0][0] == 42
    # The node's internal topic is configured by the node.
    (code, message), = incremental(node, [(2, "__consumer_offsets", [("retention.ms", 0, "1")])])
    assert code == 44 and "internal topic" in message


def test_legacy_alter_configs_replaces_the_whole_override_set(node):
    raw(node, CreateTopicsRequest(topics=[("legacy", 1, 1, [], [("retention.ms", "1000"), ("segment.ms", "500")])],
                                  timeout_ms=1000, validate_only=False), 7)
    response = raw(node, AlterConfigsRequest(resources=[(2, "legacy", [("segment.ms", "700")])],
                                             validate_only=False), 1)
    assert [(r.error_code, r.error_message) for r in response.responses] == [(0, None)]
    assert created(node, "legacy").config.overrides() == {"segment.ms": "700"}  # retention.ms back to its default
    assert live_config(node, "legacy").retention_ms == 604800000
    nulls = raw(node, AlterConfigsRequest(resources=[(2, "legacy", [("segment.ms", None)])], validate_only=False), 0)
    assert [(r.error_code, r.error_message) for r in nulls.responses] == [
        (42, "Null value not supported for : segment.ms")]
    assert live_config(node, "legacy").segment_ms == 700


# -- restarts --------------------------------------------------------------------------------------


def test_created_and_altered_topics_survive_a_restart(dirs):
    with NodeThread(*dirs) as first:
        admin = KafkaAdminClient(bootstrap_servers=first.bootstrap)
        try:
            admin.create_topics({"kept": {"num_partitions": 2, "configs": {"retention.ms": "1000"}}})
            admin.alter_configs([ConfigResource("TOPIC", "kept", {"segment.ms": "300"})])
        finally:
            admin.close()
        producer = Producer({"bootstrap.servers": first.bootstrap})
        producer.produce("kept", value=b"survivor", partition=1)
        assert producer.flush(15) == 0
        topic_id = first.node.registry.topic_id("kept")
    assert (dirs[0] / API_TOPICS_FILE).exists()
    with NodeThread(*dirs) as second:
        spec = second.node.registry.topics["kept"]
        assert (spec.origin, spec.partitions, spec.config.overrides()) == (
            "api", 2, {"retention.ms": "1000", "segment.ms": "300"})
        assert second.node.registry.topic_id("kept") == topic_id
        assert live_config(second, "kept", 1).segment_ms == 300
        assert second.node.log_dir.logs[TopicPartition("kept", 1)].log_end_offset == 1
        admin = KafkaAdminClient(bootstrap_servers=second.bootstrap)
        try:
            configs = kp_describe(admin, "kept")
            assert (configs["segment.ms"]["value"], configs["segment.ms"]["config_source"]) == (
                "300", "DYNAMIC_TOPIC_CONFIG")
            assert kp_results(admin.create_topics({"kept": {}}, raise_errors=False))["kept"][0] == 36
        finally:
            admin.close()


# -- confluent-kafka (librdkafka) ------------------------------------------------------------------


def _kafka_error(future) -> KafkaError | None:
    try:
        future.result(timeout=15)
    except KafkaException as exc:
        return exc.args[0]
    return None


def test_confluent_admin_client(node):
    admin = AdminClient({"bootstrap.servers": node.bootstrap})
    futures = admin.create_topics([
        CNewTopic("c-good", 2, 1, config={"cleanup.policy": "compact", "retention.ms": "3600000"}),
        CNewTopic(DECLARED, 1, 1),
        CNewTopic("c-bad-config", 1, 1, config={"cleanup.policy": "shred"}),
        CNewTopic("c bad", 1, 1),
        CNewTopic("c-rf3", 1, 3),
    ])
    errors = {name: _kafka_error(f) for name, f in futures.items()}
    assert errors["c-good"] is None
    assert {name: e.code() for name, e in errors.items() if e} == {
        DECLARED: KafkaError.TOPIC_ALREADY_EXISTS, "c-bad-config": KafkaError.INVALID_CONFIG,
        "c bad": KafkaError.TOPIC_EXCEPTION, "c-rf3": KafkaError.INVALID_REPLICATION_FACTOR}
    assert errors["c-bad-config"].str() == ("Invalid value shred for configuration cleanup.policy: String must be "
                                            "one of: compact, delete")
    (dry,) = admin.create_topics([CNewTopic("c-dry", 1, 1)], validate_only=True).values()
    assert _kafka_error(dry) is None and created(node, "c-dry") is None

    # DescribeConfigs: values, sources (librdkafka sends v1 with synonyms), an unknown topic.
    resource = CResource(ResourceType.TOPIC, "c-good")
    configs = admin.describe_configs([resource])[resource].result(timeout=15)
    assert (configs["cleanup.policy"].value, configs["cleanup.policy"].source) == (
        "compact", ConfigSource.DYNAMIC_TOPIC_CONFIG.value)
    assert (configs["segment.bytes"].value, configs["segment.bytes"].source) == (
        "1073741824", ConfigSource.DEFAULT_CONFIG.value)
    assert configs["segment.bytes"].is_default and not configs["cleanup.policy"].is_default
    assert list(configs["retention.ms"].synonyms) == ["retention.ms", "log.retention.hours"]
    missing = CResource(ResourceType.TOPIC, "c-missing")
    assert _kafka_error(admin.describe_configs([missing])[missing]).code() == KafkaError.UNKNOWN_TOPIC_OR_PART
    broker = CResource(ResourceType.BROKER, "0")
    broker_configs = admin.describe_configs([broker])[broker].result(timeout=15)
    assert broker_configs["node.id"].value == "0" and broker_configs["node.id"].is_read_only

    # IncrementalAlterConfigs, then legacy AlterConfigs that replaces the whole set.
    change = CResource(ResourceType.TOPIC, "c-good", incremental_configs=[
        ConfigEntry("cleanup.policy", "delete", incremental_operation=AlterConfigOpType.APPEND),
        ConfigEntry("segment.ms", "60000", incremental_operation=AlterConfigOpType.SET)])
    assert _kafka_error(admin.incremental_alter_configs([change])[change]) is None
    assert created(node, "c-good").config.overrides() == {"cleanup.policy": "compact,delete",
                                                          "retention.ms": "3600000", "segment.ms": "60000"}
    assert live_config(node, "c-good", 1).delete and live_config(node, "c-good", 1).segment_ms == 60000
    replace = CResource(ResourceType.TOPIC, "c-good", set_config={"retention.ms": "7200000"})
    with pytest.warns(DeprecationWarning, match="alter_configs has been deprecated"):  # legacy on purpose
        (future,) = admin.alter_configs([replace]).values()
    assert _kafka_error(future) is None
    assert created(node, "c-good").config.overrides() == {"retention.ms": "7200000"}
    assert live_config(node, "c-good").cleanup_policy == ("delete",)
    refused = CResource(ResourceType.TOPIC, DECLARED, incremental_configs=[
        ConfigEntry("retention.ms", "1", incremental_operation=AlterConfigOpType.SET)])
    error = _kafka_error(admin.incremental_alter_configs([refused])[refused])
    assert error.code() == KafkaError.POLICY_VIOLATION and "edit the manifest" in error.str()


# -- aiokafka --------------------------------------------------------------------------------------


def test_aiokafka_admin_client(node):
    async def run():
        admin = AIOKafkaAdminClient(bootstrap_servers=node.bootstrap)
        await admin.start()
        try:
            created_response = await admin.create_topics([
                AioNewTopic("aio-good", 2, 1, topic_configs={"segment.bytes": "1048576"}),
                AioNewTopic("aio-dup", 1, 1), AioNewTopic("aio-dup", 1, 1),
                AioNewTopic(DECLARED, 1, 1),
                AioNewTopic("aio-rf3", 1, 3),
                AioNewTopic("aio-bad", 1, 1, topic_configs={"segment.bytes": "1"}),
            ])
            described = await admin.describe_configs([AioResource(AioType.TOPIC, "aio-good")])
            altered = await admin.alter_configs([AioResource(AioType.TOPIC, "aio-good", {"retention.ms": "90000"}),
                                                 AioResource(AioType.TOPIC, DECLARED, {"retention.ms": "1"})])
        finally:
            await admin.close()
        producer = AIOKafkaProducer(bootstrap_servers=node.bootstrap)
        await producer.start()
        try:
            meta = await (await producer.send("aio-good", b"hello", partition=1))
        finally:
            await producer.stop()
        consumer = AIOKafkaConsumer(bootstrap_servers=node.bootstrap, group_id=None, enable_auto_commit=False)
        await consumer.start()
        try:
            consumer.assign([AioTP("aio-good", 1)])
            await consumer.seek_to_beginning(AioTP("aio-good", 1))
            record = await asyncio.wait_for(consumer.getone(), 15)
        finally:
            await consumer.stop()
        return created_response, described, altered, meta, record

    created_response, described, altered, meta, record = asyncio.run(run())
    assert [(t[0], t[1]) for t in created_response.topic_errors] == [
        ("aio-good", 0), ("aio-dup", 42), ("aio-dup", 42), (DECLARED, 36), ("aio-rf3", 38), ("aio-bad", 40)]
    entries = {e[0]: e for e in described[0].resources[0][4]}  # (name, value, read_only, source, sensitive, ...)
    assert entries["segment.bytes"][1:4] == ("1048576", False, 1)
    assert entries["retention.ms"][1:4] == ("604800000", False, 5)
    assert [(r[0], r[3]) for r in altered[0].resources] == [(0, "aio-good"), (44, DECLARED)]
    assert created(node, "aio-good").config.overrides() == {"retention.ms": "90000"}  # legacy: the whole set
    assert (meta.partition, meta.offset, record.value, record.offset) == (1, 0, b"hello", 0)
    assert created(node, "aio-dup") is None
