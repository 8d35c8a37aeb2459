"""The node's HTTP endpoints over real HTTP (urllib) against a real node fed by a real Kafka client."""

from __future__ import annotations

import re
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from kafka import KafkaProducer
from prometheus_client.parser import text_string_to_metric_families

from shale.sidecar.log.cleaner_manager import CleaningState
from shale.sidecar.log.log import now_ms
from shale.sidecar.log.topic_partition import TopicPartition
from support.http_util import get_json, request, sample, scrape
from support.node_util import NodeThread, topic_manifest, wait_for, write_manifests

DOCS = Path(__file__).resolve().parents[2] / "docs" / "metrics.md"
TASKS = {"kafka-log-retention", "kafka-log-flusher", "kafka-recovery-point-checkpoint",
         "kafka-log-start-offset-checkpoint", "kafka-delete-logs", "PeriodicProducerExpirationCheck"}


def families(port: int) -> dict[str, str]:
    _, body, _ = request(port, "/metrics")
    return {f.name: f.type for f in text_string_to_metric_families(body.decode())}


def produce_each(bootstrap: str, topic: str, records, partition: int = 0) -> None:
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks=1, enable_idempotence=False, linger_ms=0)
    try:
        for key, value in records:
            producer.send(topic, key=key, value=value, partition=partition).get(10)
    finally:
        producer.close()


@pytest.fixture
def node(tmp_path):
    write_manifests(tmp_path / "topics" / "topics.yaml",
                    topic_manifest("events", 2, {"segment.bytes": 1024}),
                    # never cleaned (the ratio must exceed 1): its figures hold still while the test reads them
                    topic_manifest("orders", 1, {"cleanup.policy": "compact", "segment.bytes": 1024,
                                                 "min.cleanable.dirty.ratio": 1}))
    (tmp_path / "topics" / "broken.yaml").write_text("kind: Topic\nmetadata: {name: broken}\nspec: [not, a, map]\n")
    with NodeThread(tmp_path / "data", tmp_path / "topics", node_id=3) as n:
        yield n


def test_metrics_match_the_engine_after_producing_with_a_real_client(node):
    produce_each(node.bootstrap, "events", [(b"e%d" % i, b"x" * 100) for i in range(12)], partition=0)
    produce_each(node.bootstrap, "events", [(b"e%d" % i, b"x" * 100) for i in range(3)], partition=1)
    produce_each(node.bootstrap, "orders", [(b"o%d" % (i % 3), b"y" * 100) for i in range(20)])
    metrics = scrape(node.node.http_port)

    logs = dict(node.node.log_dir.logs)
    for tp, log in logs.items():
        labels = {"topic": tp.topic, "partition": tp.partition}
        assert sample(metrics, "shale_log_size_bytes", **labels) == log.size_in_bytes
        assert sample(metrics, "shale_log_segments", **labels) == len(log.segments)
        assert sample(metrics, "shale_log_start_offset", **labels) == log.log_start_offset
        assert sample(metrics, "shale_log_end_offset", **labels) == log.log_end_offset
        states = {s.value: sample(metrics, "shale_cleaning_state", **labels, state=s.value) for s in CleaningState}
        assert sorted(states.values()) == [0, 0, 0, 0, 1]
    assert sample(metrics, "shale_log_end_offset", topic="events", partition=0) == 12
    assert sample(metrics, "shale_log_segments", topic="events", partition=0) > 1
    assert sample(metrics, "shale_data_dir_bytes_used") == sum(log.size_in_bytes for log in logs.values())
    assert 0 < sample(metrics, "shale_data_dir_bytes_free") <= sample(metrics, "shale_data_dir_bytes_total")

    # The dirty ratio is the cleaner manager's own figure: several segments, never cleaned, so all dirty.
    orders = logs[TopicPartition("orders", 0)]
    manager = node.node.maintenance.manager
    ltc = manager.log_to_clean(orders, manager.cleanable_offsets(TopicPartition("orders", 0), orders, None, now_ms()),
                               now_ms())
    assert sample(metrics, "shale_log_dirty_ratio", topic="orders", partition=0) == ltc.cleanable_ratio == 1.0
    assert sample(metrics, "shale_log_min_cleanable_dirty_ratio", topic="orders", partition=0) == 1.0
    assert ("shale_log_dirty_ratio", frozenset({("topic", "events"), ("partition", "0")})) not in metrics

    # One Produce request per record, each counted and timed.
    assert sample(metrics, "shale_requests_total", api="Produce") == 35
    assert sample(metrics, "shale_request_duration_seconds_count", api="Produce") == 35
    assert sample(metrics, "shale_request_duration_seconds_bucket", api="Produce", le="+Inf") == 35
    assert 0 < sample(metrics, "shale_request_duration_seconds_sum", api="Produce") < 35 * 10
    assert sample(metrics, "shale_requests_total", api="Metadata") >= 1

    assert sample(metrics, "shale_node_ready") == 1
    assert sample(metrics, "shale_cleaner_threads_live") == 1
    assert sample(metrics, "shale_cleaner_threads_dead") == 0
    assert sample(metrics, "shale_uncleanable_partitions") == 0
    assert sample(metrics, "shale_manifest_errors") == 1
    assert {dict(labels)["task"] for name, labels in metrics if name == "shale_maintenance_task_runs_total"} == TASKS


def test_status_has_a_stable_documented_shape_and_the_engines_values(node):
    produce_each(node.bootstrap, "events", [(b"e%d" % i, b"x" * 100) for i in range(12)])
    status, doc = get_json(node.node.http_port, "/status")
    assert status == 200
    assert set(doc) == {"version", "node_id", "phase", "ready", "time_ms", "data_dir", "topics", "cleaner",
                        "uncleanable_partitions", "maintenance", "errors", "manifests", "session_valid",
                        "log_dirs", "moves_bytes_copied", "replication_throttles"}
    assert doc["session_valid"] is None and doc["replication_throttles"] == {}  # no control store
    assert (doc["version"], doc["node_id"], doc["phase"], doc["ready"]) == (1, 3, "serving", True)
    logs = node.node.log_dir.logs
    assert doc["data_dir"]["path"] == node.node.log_dir.path
    assert doc["data_dir"]["bytes_used"] == sum(log.size_in_bytes for log in logs.values())
    assert doc["data_dir"]["had_clean_shutdown"] is False  # a new directory
    assert {"events", "orders"} <= set(doc["topics"])

    events = doc["topics"]["events"]["partitions"]
    assert [p["partition"] for p in events] == [0, 1]
    p0 = events[0]
    assert set(p0) == {"partition", "served", "log_start_offset", "log_end_offset", "recovery_point", "size_bytes",
                       "segments", "cleanup_policy", "cleaning", "dirty_ratio", "min_cleanable_dirty_ratio",
                       "last_clean_ms", "storage_error", "high_watermark", "replica", "last_stable_offset", "log_dir",
                       "move"}
    assert (p0["log_dir"], p0["move"]) == (node.node.log_dir.path, None)
    assert p0["high_watermark"] == 12 and p0["replica"] is None  # one replica: the high watermark is the log end
    assert p0["last_stable_offset"] == 12, "no transaction: the last stable offset is the high watermark"
    assert p0["storage_error"] is None and doc["data_dir"]["storage_failing_partitions"] == 0
    log = logs[TopicPartition("events", 0)]
    assert (p0["log_start_offset"], p0["log_end_offset"], p0["size_bytes"], p0["segments"]) == (
        log.log_start_offset, 12, log.size_in_bytes, len(log.segments))
    assert p0["served"] is True and p0["cleanup_policy"] == ["delete"]
    assert p0["dirty_ratio"] is None and p0["last_clean_ms"] is None
    assert set(p0["cleaning"]) == {"state", "since_ms", "seconds_in_state", "pause_count", "pause_owners",
                                 "uncleanable_reason"}
    assert doc["topics"]["orders"]["partitions"][0]["min_cleanable_dirty_ratio"] == 1.0

    cleaner = doc["cleaner"]
    assert (cleaner["enabled"], cleaner["threads_live"], cleaner["threads_dead"]) == (True, 1, 0)
    assert cleaner["threads"] == [{"index": 0, "alive": True, "error": None}]
    assert doc["uncleanable_partitions"] == []
    assert set(doc["maintenance"]["tasks"]) == TASKS and doc["maintenance"]["scheduler_alive"] is True
    assert doc["maintenance"]["tasks"]["kafka-log-retention"]["interval_ms"] == 300000
    assert [k for k in doc["errors"]["manifests"] if "broken.yaml" in k], doc["errors"]
    assert doc["errors"]["topics"] == {}
    assert doc["manifests"] == {"path": node.node.options.topics, "files": 2, "missing": None, "held": {},
                                "refusals": len(doc["errors"]["manifests"])}


def test_pause_and_resume_through_http_show_in_status_and_metrics(node):
    port = node.node.http_port
    before = now_ms()
    status, body = get_json(port, "/partitions/orders/0/pause", "POST")
    assert status == 200 and body == {"topic": "orders", "partition": 0, "state": "paused", "pause_count": 1,
                                      "pause_owners": ["anonymous:1"]}
    assert get_json(port, "/partitions/orders/0/pause", "POST")[1]["pause_count"] == 2

    cleaning = get_json(port, "/status")[1]["topics"]["orders"]["partitions"][0]["cleaning"]
    assert (cleaning["state"], cleaning["pause_count"]) == ("paused", 2)
    assert before <= cleaning["since_ms"] <= now_ms() and cleaning["seconds_in_state"] >= 0
    metrics = scrape(port)
    assert sample(metrics, "shale_cleaning_state", topic="orders", partition=0, state="paused") == 1
    assert sample(metrics, "shale_cleaning_state", topic="orders", partition=0, state="idle") == 0
    assert sample(metrics, "shale_cleaning_pause_count", topic="orders", partition=0) == 2

    assert get_json(port, "/partitions/orders/0/resume", "POST") == (
        200, {"topic": "orders", "partition": 0, "state": "paused", "pause_count": 1, "pause_owners": ["anonymous:1"]})
    status, body = get_json(port, "/partitions/orders/0/resume", "POST")
    assert status == 200 and body["pause_count"] == 0 and body["state"] != "paused"
    assert scrape(port)[("shale_cleaning_pause_count", frozenset({("topic", "orders"), ("partition", "0")}))] == 0

    status, body = get_json(port, "/partitions/orders/0/resume", "POST")
    assert status == 409 and "not paused" in body["error"] and "orders-0" in body["error"]
    for path in ("/partitions/nope/0/pause", "/partitions/orders/7/pause", "/partitions/orders/x/resume"):
        status, body = get_json(port, path, "POST")
        assert status == 404 and "no partition" in body["error"]
    assert get_json(port, "/partitions/orders/0/pause")[0] == 405  # GET
    assert get_json(port, "/nowhere")[0] == 404


def test_healthz_and_readyz_follow_the_node_lifecycle(tmp_path):
    write_manifests(tmp_path / "topics" / "t.yaml", topic_manifest("t", 1))
    node = NodeThread(tmp_path / "data", tmp_path / "topics")
    port = node.node.http_port
    # Constructed (logs loaded) but not serving yet.
    assert get_json(port, "/readyz") == (503, {"ready": False, "phase": "recovering"})
    assert get_json(port, "/healthz")[0] == 200
    status, doc = get_json(port, "/status")
    assert (status, doc["version"], doc["phase"], doc["ready"]) == (200, 1, "recovering", False)
    node.start()
    assert get_json(port, "/readyz") == (200, {"ready": True, "phase": "serving"})
    assert get_json(port, "/healthz") == (200, {"status": "ok", "phase": "serving", "cleaner_threads_dead": 0})
    assert scrape(port)[("shale_node_ready", frozenset())] == 1

    # Hold the shutdown at its last step (closing the log directory) to look at the node while it stops.
    with node.node.log_dir.lock:
        node.node.stop()
        wait_for(lambda: get_json(port, "/readyz")[0] == 503, what="readiness to drop")
        assert get_json(port, "/readyz")[1] == {"ready": False, "phase": "stopping"}
        assert get_json(port, "/healthz")[0] == 200  # still alive while it stops
        assert node.thread.is_alive()
    node.thread.join(30)
    assert not node.thread.is_alive() and node.node.phase == "stopped"
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5)


def test_a_dead_cleaner_thread_is_reported_but_does_not_fail_liveness(tmp_path):
    write_manifests(tmp_path / "topics" / "t.yaml",
                    topic_manifest("fragile", 1, {"cleanup.policy": "compact", "segment.bytes": 1024,
                                                  "min.cleanable.dirty.ratio": 0.01}))
    data = tmp_path / "data"
    with NodeThread(data, tmp_path / "topics", overrides={"log.cleaner.backoff.ms": "50"}) as node:
        port = node.node.http_port
        # The cleaner checkpoint cannot be replaced: the first pass that finishes kills its thread.
        blocker = data / "cleaner-offset-checkpoint.tmp"
        blocker.mkdir()
        produce_each(node.bootstrap, "fragile", [(b"k%d" % (i % 3), b"z" * 100) for i in range(30)])
        wait_for(lambda: get_json(port, "/healthz")[1]["cleaner_threads_dead"] == 1, what="the cleaner thread to die")
        assert get_json(port, "/healthz")[0] == 200
        assert get_json(port, "/readyz")[0] == 200
        cleaner = get_json(port, "/status")[1]["cleaner"]
        assert (cleaner["threads_live"], cleaner["threads_dead"]) == (0, 1)
        assert cleaner["threads"][0]["alive"] is False and "IsADirectoryError" in cleaner["threads"][0]["error"]
        metrics = scrape(port)
        assert (sample(metrics, "shale_cleaner_threads_live"), sample(metrics, "shale_cleaner_threads_dead")) == (0, 1)
        produce_each(node.bootstrap, "fragile", [(b"k0", b"still served")])  # Kafka keeps running
        blocker.rmdir()


def test_every_exposed_metric_is_documented_and_every_documented_metric_is_exposed(node):
    produce_each(node.bootstrap, "events", [(b"k", b"v")])
    exposed = families(node.node.http_port)
    docs = DOCS.read_text()
    tables = docs.split("## Example alerts")[0]
    documented = set(re.findall(r"^\| `(shale_[a-z_]+)` \|", tables, re.M))
    alerts = docs.split("## Example alerts")[1].split("## `/status`")[0]

    def doc_name(name: str, kind: str) -> str:
        return name + "_total" if kind == "counter" else name

    exposed_names = {doc_name(name, kind) for name, kind in exposed.items()}
    assert exposed_names - documented == set(), "metrics missing from docs/metrics.md"
    assert documented - exposed_names == set(), "docs/metrics.md documents metrics that are not exposed"
    assert [m for m in sorted(documented) if m not in alerts] == [], "metrics without an example alert"
    for name, kind in exposed.items():  # the documented type is the exposed one
        row = re.search(rf"^\| `{doc_name(name, kind)}` \| (\w+) \|", tables, re.M)
        assert row and row.group(1) == kind, name
