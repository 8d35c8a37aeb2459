"""A running node follows its Topic manifests: topics appear, change, refuse bad edits and go, without a restart."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaError, Producer
from confluent_kafka import TopicPartition as CTP
from confluent_kafka.admin import AdminClient
from kafka.admin import KafkaAdminClient
from watchdog.events import DirMovedEvent, FileSystemEventHandler
from watchdog.observers import Observer

from shale.sidecar.log.topic_partition import TopicPartition
from shale.sidecar.topic_config import TopicConfig
from support.node_util import NodeThread, ServeProcess, topic_manifest, wait_for, write_manifests

# Retention runs every 100 ms from the start, so a config change shows in the log within a test's patience.
FAST = {"log.retention.check.interval.ms": "100", "log.initial.task.delay.ms": "0"}
# Every batch rolls a new segment; deleted segment files go at the next check (every second).
SMALL_SEGMENTS = {"segment.bytes": 100, "file.delete.delay.ms": 0}


@pytest.fixture
def dirs(tmp_path):
    topics = tmp_path / "topics"
    topics.mkdir()
    return tmp_path / "data", topics


@pytest.fixture
def node(dirs):
    with NodeThread(*dirs, overrides=FAST) as n:
        yield n


def settled(node) -> bool:
    """True once the event loop has finished its current callback: a reload is applied in one callback, so
    after this every partition log of a topic seen in the registry exists and deletions are complete."""
    node.call(lambda: None)
    return True


def spec(node, name):
    return node.node.registry.topics.get(name)


def log_of(node, name, partition=0):
    return node.node.log_dir.logs.get(TopicPartition(name, partition))


def produce_one_batch_each(bootstrap: str, topic: str, values: list[bytes], partition: int = 0) -> list[int]:
    """Send each value in its own batch (flush between), so that small segments roll at every one."""
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0, "acks": "all"})
    offsets = []
    for value in values:
        producer.produce(topic, key=b"k", value=value, partition=partition,
                         on_delivery=lambda err, msg: offsets.append(err or msg.offset()))
        assert producer.flush(15) == 0
    assert all(isinstance(o, int) for o in offsets), offsets
    return offsets


def consume_all(bootstrap: str, topic: str, partition: int, expected: int) -> list[bytes]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "unused", "enable.auto.commit": False})
    try:
        consumer.assign([CTP(topic, partition, 0)])
        got: list[bytes] = []

        def more() -> bool:
            msg = consumer.poll(0.2)
            if msg is not None and msg.error() is None:
                got.append(msg.value())
            return len(got) >= expected

        wait_for(more, what=f"{expected} records of {topic}-{partition}")
        return got
    finally:
        consumer.close()


def topic_error(bootstrap: str, topic: str):
    """The error Metadata gives a client for `topic` (None if it exists)."""
    metadata = AdminClient({"bootstrap.servers": bootstrap}).list_topics(topic, timeout=10)
    error = metadata.topics[topic].error
    return None if error is None else error.code()


def segment_files(partition_dir: Path) -> list[str]:
    return sorted(p.name for p in partition_dir.iterdir() if p.name.endswith((".log", ".deleted")))


def test_adding_a_manifest_creates_the_topic_for_clients(node, dirs):
    assert topic_error(node.bootstrap, "arrives") == KafkaError.UNKNOWN_TOPIC_OR_PART
    write_manifests(dirs[1] / "team" / "arrives.yaml", topic_manifest("arrives", 2, {"retention.ms": 3600000}))
    wait_for(lambda: spec(node, "arrives") and settled(node), what="the topic to be created")
    assert spec(node, "arrives").partitions == 2 and log_of(node, "arrives", 1).config.retention_ms == 3600000
    assert topic_error(node.bootstrap, "arrives") is None
    assert produce_one_batch_each(node.bootstrap, "arrives", [b"one", b"two"], partition=1) == [0, 1]
    assert consume_all(node.bootstrap, "arrives", 1, 2) == [b"one", b"two"]


def test_changing_retention_ms_deletes_old_segments_without_a_restart(node, dirs):
    manifest = dirs[1] / "retained.yaml"
    write_manifests(manifest, topic_manifest("retained", 1, {"retention.ms": 3600000, **SMALL_SEGMENTS}))
    wait_for(lambda: spec(node, "retained") and settled(node), what="the topic to be created")
    produce_one_batch_each(node.bootstrap, "retained", [b"v%d" % i for i in range(5)])
    log = log_of(node, "retained")
    assert [s.base_offset for s in log.segments] == [0, 1, 2, 3, 4]
    # Retention runs, but an hour has not passed: every segment stays.
    retention = node.node.maintenance.tasks["kafka-log-retention"]
    runs = retention.runs
    wait_for(lambda: retention.runs >= runs + 3, what="three retention runs")
    assert (log.log_start_offset, len(log.segments)) == (0, 5)

    write_manifests(manifest, topic_manifest("retained", 1, {"retention.ms": 1, **SMALL_SEGMENTS}))
    wait_for(lambda: log.config.retention_ms == 1, what="the log to get the new config")
    assert spec(node, "retained").config is log.config  # the very object the registry holds
    assert log_of(node, "retained") is log  # changed in place: no restart, no new log
    wait_for(lambda: log.log_start_offset == 5, what="retention to delete the old segments")
    assert [s.base_offset for s in log.segments] == [5] and log.log_end_offset == 5
    partition_dir = Path(log.dir)
    wait_for(lambda: segment_files(partition_dir) == ["00000000000000000005.log"],
             what="the deleted segments' files to go")
    assert produce_one_batch_each(node.bootstrap, "retained", [b"after"]) == [5]


def test_a_broken_manifest_changes_nothing_and_is_reported(node, dirs):
    manifest = dirs[1] / "steady.yaml"
    write_manifests(manifest, topic_manifest("steady", 2, {"retention.ms": 3600000, "cleanup.policy": "compact"}))
    wait_for(lambda: spec(node, "steady") and settled(node), what="the topic to be created")
    produce_one_batch_each(node.bootstrap, "steady", [b"a", b"b", b"c"])
    before, config = spec(node, "steady"), log_of(node, "steady").config

    manifest.write_text("apiVersion: shale.dev/v1alpha1\nkind: Topic\nmetadata: {name: steady\n")
    wait_for(lambda: str(manifest) in node.node.manifests.errors and settled(node),
             what="the YAML error to be reported")
    assert "not readable as YAML" in node.node.manifests.errors[str(manifest)]
    assert spec(node, "steady") is before and log_of(node, "steady").config is config

    write_manifests(manifest, topic_manifest("steady", 2, {"retention.ms": "-5", "cleanup.policy": "delete"}))
    key = f"{manifest}: steady"
    wait_for(lambda: key in node.node.manifests.errors and settled(node), what="the invalid value to be reported")
    assert "Invalid value -5 for configuration retention.ms" in node.node.manifests.errors[key]
    assert str(manifest) not in node.node.manifests.errors  # the YAML parses again
    assert spec(node, "steady") is before and log_of(node, "steady").config is config
    assert log_of(node, "steady").log_end_offset == 3
    assert consume_all(node.bootstrap, "steady", 0, 3) == [b"a", b"b", b"c"]

    write_manifests(manifest, topic_manifest("steady", 2, {"retention.ms": 7200000, "cleanup.policy": "compact"}))
    wait_for(lambda: log_of(node, "steady").config.retention_ms == 7200000 and node.node.manifests.errors == {},
             what="the fixed manifest to apply and its errors to clear")
    assert node.node.topic_errors == {}


class _Moves(FileSystemEventHandler):
    """Directory renames under the data directory, as inotify reports them."""

    def __init__(self) -> None:
        self.moves: list[tuple[str, str]] = []
        self.lock = threading.Lock()

    def on_moved(self, event) -> None:
        if isinstance(event, DirMovedEvent):
            with self.lock:
                self.moves.append((Path(event.src_path).name, Path(event.dest_path).name))


def test_removing_a_manifest_deletes_the_topic_kafkas_way(node, dirs):
    manifest = write_manifests(dirs[1] / "doomed.yaml", topic_manifest("doomed", 2))
    write_manifests(dirs[1] / "neighbour.yaml", topic_manifest("neighbour"))  # the last file would be held
    wait_for(lambda: spec(node, "doomed") and settled(node), what="the topic to be created")
    produce_one_batch_each(node.bootstrap, "doomed", [b"x", b"y"], partition=1)
    data = Path(node.node.log_dir.path)
    assert (data / "doomed-0").is_dir() and (data / "doomed-1").is_dir()

    moves = _Moves()
    observer = Observer()
    observer.schedule(moves, str(data), recursive=False)
    observer.start()
    try:
        manifest.unlink()
        wait_for(lambda: spec(node, "doomed") is None and settled(node), what="the topic to be deleted")
        wait_for(lambda: len(moves.moves) >= 2, what="the partition directories to be renamed")
    finally:
        observer.stop()
        observer.join(5)
    renamed = dict(moves.moves)
    assert sorted(renamed) == ["doomed-0", "doomed-1"]
    assert all(dest.startswith(src + ".") and dest.endswith("-delete") for src, dest in renamed.items())
    assert not any(p.name.startswith("doomed") for p in data.iterdir())  # renamed, then removed
    assert log_of(node, "doomed", 1) is None
    assert topic_error(node.bootstrap, "doomed") == KafkaError.UNKNOWN_TOPIC_OR_PART


def test_partitions_can_be_added_but_not_removed(node, dirs):
    manifest = write_manifests(dirs[1] / "growing.yaml", topic_manifest("growing", 1))
    wait_for(lambda: spec(node, "growing") and settled(node), what="the topic to be created")
    write_manifests(manifest, topic_manifest("growing", 3))
    wait_for(lambda: spec(node, "growing").partitions == 3 and settled(node), what="the new partitions")
    assert produce_one_batch_each(node.bootstrap, "growing", [b"p2"], partition=2) == [0]

    write_manifests(manifest, topic_manifest("growing", 2, {"retention.ms": 1000}))
    wait_for(lambda: "growing" in node.node.topic_errors and settled(node), what="the decrease to be refused")
    assert node.node.topic_errors["growing"] == ("topic growing: the number of partitions cannot be decreased "
                                                "(3 -> 2)")
    grown = spec(node, "growing")
    assert grown.partitions == 3 and grown.config == TopicConfig.from_mapping({})  # nothing of the refused spec
    assert log_of(node, "growing", 2).log_end_offset == 1
    assert consume_all(node.bootstrap, "growing", 2, 1) == [b"p2"]

    write_manifests(manifest, topic_manifest("growing", 4, {"retention.ms": 1000}))
    # topic_errors is replaced once the whole reload is applied: wait for both.
    wait_for(lambda: spec(node, "growing").partitions == 4 and node.node.topic_errors == {},
             what="the next increase, and the error to clear")
    assert log_of(node, "growing", 3).config.retention_ms == 1000


def test_shale_serve_follows_its_manifests(tmp_path):
    topics = tmp_path / "topics"
    topics.mkdir()
    overrides = [arg for key, value in FAST.items() for arg in ("--override", f"{key}={value}")]
    write_manifests(topics / "neighbour.yaml", topic_manifest("neighbour"))  # the last file would be held
    with ServeProcess(tmp_path / "data", topics, *overrides) as server:
        manifest = write_manifests(topics / "served.yaml",
                                   topic_manifest("served", 1, {"retention.ms": 3600000, **SMALL_SEGMENTS}))
        wait_for(lambda: topic_error(server.bootstrap, "served") is None, what="the topic to be served")
        produce_one_batch_each(server.bootstrap, "served", [b"s%d" % i for i in range(4)])
        partition_dir = tmp_path / "data" / "served-0"
        assert segment_files(partition_dir) == [f"{i:020d}.log" for i in range(4)]

        write_manifests(manifest, topic_manifest("served", 1, {"retention.ms": 1, **SMALL_SEGMENTS}))
        wait_for(lambda: segment_files(partition_dir) == [f"{4:020d}.log"],
                 what="retention to delete the old segments and their files")
        assert produce_one_batch_each(server.bootstrap, "served", [b"later"]) == [4]

        manifest.unlink()
        wait_for(lambda: not partition_dir.exists(), what="the topic's directory to be deleted")
        assert topic_error(server.bootstrap, "served") == KafkaError.UNKNOWN_TOPIC_OR_PART
        assert server.terminate() == 0
    assert f"topic served: its manifest was removed from {manifest}: deleting the topic" in server.log()
    assert "topic served deleted" in server.log()


def test_a_manifest_cannot_take_over_a_topic_created_through_the_api(node, dirs):
    admin = KafkaAdminClient(bootstrap_servers=node.bootstrap)
    try:
        admin.create_topics({"owned": {"configs": {"retention.ms": "1000"}}})
    finally:
        admin.close()
    write_manifests(dirs[1] / "owned.yaml", topic_manifest("owned", 2, {"retention.ms": 5}))
    wait_for(lambda: "owned" in node.node.topic_errors and settled(node), what="the manifest to be refused")
    assert node.node.topic_errors["owned"] == "topic owned already exists (created by api)"
    owned = spec(node, "owned")
    assert (owned.origin, owned.partitions, log_of(node, "owned").config.retention_ms) == ("api", 1, 1000)


def test_a_held_topic_deleted_through_the_registry_stays_deleted(node, dirs):
    """The last manifest removed is held (it looks like an unmounted volume); TopicRegistry.remove — what
    DeleteTopics calls — is then the explicit act, and the manifests forget the topic's last good spec."""
    manifest = write_manifests(dirs[1] / "last.yaml", topic_manifest("last", 2))
    wait_for(lambda: spec(node, "last") and settled(node), what="the topic to be created")
    produce_one_batch_each(node.bootstrap, "last", [b"kept"])
    manifest.unlink()
    wait_for(lambda: node.node.manifests.held and settled(node), what="the removal to be held")
    assert node.node.manifests.held["last"].reason == "manifests-missing"
    assert log_of(node, "last").log_end_offset == 1 and topic_error(node.bootstrap, "last") is None

    assert node.call(node.node.registry.remove, "last") is True
    assert node.node.manifests.held == {} and node.node.manifests.missing is None
    write_manifests(dirs[1] / "other.yaml", topic_manifest("other"))  # a reload: "last" does not come back
    wait_for(lambda: spec(node, "other") and settled(node), what="the next reload")
    assert spec(node, "last") is None and log_of(node, "last") is None
    assert not any(p.name.startswith("last-") for p in Path(node.node.log_dir.path).iterdir())
