"""Consumer groups with unmodified clients (confluent-kafka, kafka-python, aiokafka) against a real node.

Each client subscribes with a group, consumes, commits, closes and comes back to exactly where it
committed; two members of one group split a 4-partition topic and the survivor takes everything when
the other leaves; committed offsets survive a restart of the whole node; and what the coordinator wrote
to `__consumer_offsets` is read back from the `.log` files in Kafka's record layout.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from dataclasses import dataclass, field

import confluent_kafka
import pytest
from aiokafka import AIOKafkaConsumer
from aiokafka.structs import TopicPartition as AioTP
from kafka import KafkaConsumer
from kafka import TopicPartition as KpTP
from kafka.protocol.consumer.group import JoinGroupRequest, JoinGroupResponse
from test_offset_records import KAFKA_SCHEMAS

from shale.sidecar.server.coordinator.group.model import GroupState
from shale.sidecar.server.coordinator.group.offset_records import (
    OFFSETS_TOPIC,
    GroupMetadataKey,
    OffsetCommitKey,
    decode_group_metadata_value,
    decode_key,
    decode_offset_commit_value,
    partition_for,
)
from support.clients_util import build, call, read_frame, request_frame, stored_batches, stored_records
from support.kafka_schema_util import message_classes
from support.node_util import NodeThread, topic_manifest, wait_for, write_manifests

CLIENTS = ("confluent", "kafka-python", "aiokafka")
FAST = {"group.initial.rebalance.delay.ms": "100"}
HEARTBEAT_MS = 300
SESSION_MS = 6000


@pytest.fixture
def dirs(tmp_path):
    write_manifests(tmp_path / "topics" / "topics.yaml",
                    *[topic_manifest(f"resume-{c}", 2) for c in CLIENTS],
                    *[topic_manifest(f"split-{c}", 4) for c in CLIENTS],
                    topic_manifest("restart", 2), topic_manifest("static", 2))
    return tmp_path / "data", tmp_path / "topics"


@pytest.fixture
def node(dirs):
    with NodeThread(*dirs, overrides=FAST) as n:
        yield n


def produce(bootstrap: str, topic: str, tag: str, count: int, partitions: int) -> None:
    producer = confluent_kafka.Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    errors = []
    for i in range(count):
        producer.produce(topic, key=f"{tag}-{i}".encode(), value=f"{tag}-{i}".encode(), partition=i % partitions,
                         on_delivery=lambda err, _msg: err and errors.append(err))
    assert producer.flush(20) == 0 and errors == []


# -- one consumer: consume, commit, close; a new consumer of the group resumes -------------------------------------


@dataclass
class Session:
    """What one consumer of a group saw: (partition, offset, value) and its committed offsets afterwards."""

    messages: list[tuple[int, int, bytes]] = field(default_factory=list)
    committed: dict[int, int] = field(default_factory=dict)


def consume_and_commit(client: str, bootstrap: str, group: str, topic: str, count: int, partitions: int) -> Session:
    """Subscribe, read `count` messages, commit synchronously, read the commits back with the client's API, close."""
    if client == "confluent":
        return _confluent_session(bootstrap, group, topic, count, partitions)
    if client == "kafka-python":
        return _kafka_python_session(bootstrap, group, topic, count, partitions)
    return asyncio.run(_aiokafka_session(bootstrap, group, topic, count, partitions))


def _confluent_session(bootstrap, group, topic, count, partitions) -> Session:
    consumer = confluent_kafka.Consumer({
        "bootstrap.servers": bootstrap, "group.id": group, "auto.offset.reset": "earliest",
        "enable.auto.commit": False, "heartbeat.interval.ms": HEARTBEAT_MS, "session.timeout.ms": SESSION_MS})
    out = Session()
    try:
        consumer.subscribe([topic])
        deadline = time.monotonic() + 30
        while len(out.messages) < count and time.monotonic() < deadline:
            msg = consumer.poll(0.2)
            if msg is not None and msg.error() is None:
                out.messages.append((msg.partition(), msg.offset(), msg.value()))
        consumer.commit(asynchronous=False)
        tps = consumer.committed([confluent_kafka.TopicPartition(topic, p) for p in range(partitions)], timeout=10)
        out.committed = {tp.partition: tp.offset for tp in tps}
    finally:
        consumer.close()
    return out


def _kafka_python_session(bootstrap, group, topic, count, partitions) -> Session:
    consumer = KafkaConsumer(topic, bootstrap_servers=bootstrap, group_id=group, auto_offset_reset="earliest",
                             enable_auto_commit=False, heartbeat_interval_ms=HEARTBEAT_MS,
                             session_timeout_ms=SESSION_MS, fetch_max_wait_ms=100)
    out = Session()
    try:
        deadline = time.monotonic() + 30
        while len(out.messages) < count and time.monotonic() < deadline:
            for records in consumer.poll(timeout_ms=200).values():
                out.messages.extend((r.partition, r.offset, r.value) for r in records)
        consumer.commit()
        out.committed = {p: consumer.committed(KpTP(topic, p)) for p in range(partitions)}
    finally:
        consumer.close()
    return out


async def _aiokafka_session(bootstrap, group, topic, count, partitions) -> Session:
    consumer = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, group_id=group, auto_offset_reset="earliest",
                                enable_auto_commit=False, heartbeat_interval_ms=HEARTBEAT_MS,
                                session_timeout_ms=SESSION_MS, fetch_max_wait_ms=100)
    await consumer.start()
    out = Session()
    try:
        deadline = time.monotonic() + 30
        while len(out.messages) < count and time.monotonic() < deadline:
            for records in (await consumer.getmany(timeout_ms=200)).values():
                out.messages.extend((r.partition, r.offset, r.value) for r in records)
        await consumer.commit()
        out.committed = {p: await consumer.committed(AioTP(topic, p)) for p in range(partitions)}
    finally:
        await consumer.stop()
    return out


def _values(session: Session) -> set[bytes]:
    return {v for _, _, v in session.messages}


@pytest.mark.parametrize("client", CLIENTS)
def test_a_consumer_resumes_from_the_offsets_its_group_committed(node, client):
    topic, group = f"resume-{client}", f"resume-group-{client}"
    produce(node.bootstrap, topic, "first", 10, 2)
    first = consume_and_commit(client, node.bootstrap, group, topic, 10, 2)
    assert _values(first) == {f"first-{i}".encode() for i in range(10)}
    assert first.committed == {0: 5, 1: 5}  # the client's own committed() reads what the coordinator stored

    produce(node.bootstrap, topic, "second", 10, 2)
    second = consume_and_commit(client, node.bootstrap, group, topic, 10, 2)
    # auto.offset.reset=earliest would have replayed "first": the group's commits decide where it starts.
    assert sorted(second.messages) == [(p, 5 + i, f"second-{2 * i + p}".encode()) for p in range(2) for i in range(5)]
    assert second.committed == {0: 10, 1: 10}

    group_state = node.node.groups.groups[group]
    assert group_state.state is GroupState.EMPTY and not group_state.members  # both consumers left on close
    assert group_state.generation >= 4  # at least: joined, emptied, joined, emptied


def test_committed_offsets_and_the_group_survive_a_restart_of_the_node(dirs):
    with NodeThread(*dirs, overrides=FAST) as n:
        produce(n.bootstrap, "restart", "before", 8, 2)
        first = consume_and_commit("kafka-python", n.bootstrap, "restart-group", "restart", 8, 2)
        assert first.committed == {0: 4, 1: 4}
        produce(n.bootstrap, "restart", "after", 6, 2)
        generation = n.node.groups.groups["restart-group"].generation
    with NodeThread(*dirs, overrides=FAST) as n:  # the same data directory, a new process state
        group = n.node.groups.groups["restart-group"]
        assert (group.state, group.generation, group.protocol_type) == (GroupState.EMPTY, generation, "consumer")
        assert group.offsets[("restart", 0)].offset == 4
        second = consume_and_commit("confluent", n.bootstrap, "restart-group", "restart", 6, 2)
        assert sorted(second.messages) == [(p, 4 + i, f"after-{2 * i + p}".encode()) for p in range(2)
                                           for i in range(3)]
        assert second.committed == {0: 7, 1: 7}


# -- two members split a topic; when one leaves the other takes it all -----------------------------------------------


class ThreadMember:
    """A kafka-python or confluent consumer polling in its own thread; records its assignment and messages."""

    def __init__(self, client: str, bootstrap: str, group: str, topic: str) -> None:
        self.client, self.bootstrap, self.group, self.topic = client, bootstrap, group, topic
        self.assignment: frozenset[int] = frozenset()
        self.values: set[bytes] = set()
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"{client}-member", daemon=True)

    def start(self) -> "ThreadMember":
        self._thread.start()
        return self

    def close(self) -> None:
        self._stop.set()
        self._thread.join(30)
        assert not self._thread.is_alive(), f"{self.client} consumer did not close"
        if self.error is not None:
            raise self.error

    def _run(self) -> None:
        try:
            if self.client == "kafka-python":
                self._run_kafka_python()
            else:
                self._run_confluent()
        except BaseException as exc:  # noqa: BLE001 - reported by close()
            self.error = exc

    def _run_kafka_python(self) -> None:
        consumer = KafkaConsumer(self.topic, bootstrap_servers=self.bootstrap, group_id=self.group,
                                 auto_offset_reset="earliest", heartbeat_interval_ms=HEARTBEAT_MS,
                                 session_timeout_ms=SESSION_MS, fetch_max_wait_ms=100)
        try:
            while not self._stop.is_set():
                for records in consumer.poll(timeout_ms=100).values():
                    self.values.update(r.value for r in records)
                self.assignment = frozenset(tp.partition for tp in consumer.assignment())
        finally:
            consumer.close()

    def _run_confluent(self) -> None:
        consumer = confluent_kafka.Consumer({
            "bootstrap.servers": self.bootstrap, "group.id": self.group, "auto.offset.reset": "earliest",
            "heartbeat.interval.ms": HEARTBEAT_MS, "session.timeout.ms": SESSION_MS})
        try:
            consumer.subscribe([self.topic])
            while not self._stop.is_set():
                msg = consumer.poll(0.1)
                if msg is not None and msg.error() is None:
                    self.values.add(msg.value())
                self.assignment = frozenset(tp.partition for tp in consumer.assignment())
        finally:
            consumer.close()


def _split(a: frozenset[int], b: frozenset[int]) -> bool:
    return len(a) == len(b) == 2 and a | b == {0, 1, 2, 3}


@pytest.mark.parametrize("client", ["confluent", "kafka-python"])
def test_two_members_split_a_topic_and_the_survivor_takes_it_all(node, client):
    topic, group = f"split-{client}", f"split-group-{client}"
    a = ThreadMember(client, node.bootstrap, group, topic).start()
    try:
        wait_for(lambda: a.assignment == {0, 1, 2, 3}, 30, what=f"{client}: the first member to own all partitions")
        b = ThreadMember(client, node.bootstrap, group, topic).start()
        try:
            wait_for(lambda: _split(a.assignment, b.assignment), 30, what=f"{client}: two members splitting 2+2")
            state = node.node.groups.groups[group]
            assert len(state.members) == 2 and state.state is GroupState.STABLE
            split_generation = state.generation
        finally:
            b.close()  # LeaveGroup
        wait_for(lambda: a.assignment == {0, 1, 2, 3}, 30, what=f"{client}: the survivor to own all partitions")
        assert state.generation > split_generation and len(state.members) == 1
        produce(node.bootstrap, topic, "late", 8, 4)
        wait_for(lambda: a.values >= {f"late-{i}".encode() for i in range(8)}, 30,
                 what=f"{client}: the survivor to read every partition")
    finally:
        a.close()


def test_two_aiokafka_members_split_a_topic_and_the_survivor_takes_it_all(node):
    topic, group = "split-aiokafka", "split-group-aiokafka"

    def consumer() -> AIOKafkaConsumer:
        return AIOKafkaConsumer(topic, bootstrap_servers=node.bootstrap, group_id=group, auto_offset_reset="earliest",
                                heartbeat_interval_ms=HEARTBEAT_MS, session_timeout_ms=SESSION_MS,
                                fetch_max_wait_ms=100)

    def parts(c: AIOKafkaConsumer) -> frozenset[int]:
        return frozenset(tp.partition for tp in c.assignment())

    async def until(predicate, what: str) -> None:
        deadline = time.monotonic() + 30
        while not predicate():
            assert time.monotonic() < deadline, f"timed out waiting for {what}"
            await asyncio.sleep(0.05)

    async def main() -> None:
        a, b = consumer(), consumer()
        await a.start()
        values: set[bytes] = set()

        async def pump() -> None:
            while True:
                for records in (await a.getmany(timeout_ms=100)).values():
                    values.update(r.value for r in records)

        pumping = asyncio.ensure_future(pump())
        try:
            await until(lambda: parts(a) == {0, 1, 2, 3}, "the first member to own all partitions")
            await b.start()
            try:
                await until(lambda: _split(parts(a), parts(b)), "two members splitting 2+2")
                split_generation = node.node.groups.groups[group].generation
            finally:
                await b.stop()
            await until(lambda: parts(a) == {0, 1, 2, 3}, "the survivor to own all partitions")
            assert node.node.groups.groups[group].generation > split_generation
            await asyncio.get_running_loop().run_in_executor(None, produce, node.bootstrap, topic, "late", 8, 4)
            await until(lambda: values >= {f"late-{i}".encode() for i in range(8)}, "the survivor to read it all")
        finally:
            pumping.cancel()
            await asyncio.gather(pumping, return_exceptions=True)
            await a.stop()

    asyncio.run(main())


# -- static membership ---------------------------------------------------------------------------------------------


def test_a_restarted_static_member_gets_its_partitions_back_without_a_rebalance(node):
    def run_once() -> tuple[frozenset[int], str]:
        consumer = confluent_kafka.Consumer({
            "bootstrap.servers": node.bootstrap, "group.id": "static-group", "group.instance.id": "pod-0",
            "heartbeat.interval.ms": HEARTBEAT_MS, "session.timeout.ms": 30000})
        try:
            consumer.subscribe(["static"])
            wait_for(lambda: consumer.poll(0.1) is None and consumer.assignment(), 30, what="an assignment")
            return frozenset(tp.partition for tp in consumer.assignment()), consumer.memberid()
        finally:
            consumer.close()  # a static member does not send LeaveGroup: it stays in the group

    first, first_id = run_once()
    group = node.node.groups.groups["static-group"]
    generation = group.generation
    assert first == {0, 1} and list(group.static_members) == ["pod-0"]
    second, second_id = run_once()
    assert second == {0, 1} and second_id != first_id
    assert group.generation == generation  # the new member id took over the old one's place: no rebalance
    assert group.static_members == {"pod-0": second_id} and list(group.members) == [second_id]


# -- what is on disk ------------------------------------------------------------------------------------------------


def test_the_offsets_log_holds_kafkas_records(node, dirs):
    topic, group = "resume-kafka-python", "disk-group"
    produce(node.bootstrap, topic, "x", 6, 2)
    session = consume_and_commit("kafka-python", node.bootstrap, group, topic, 6, 2)
    assert session.committed == {0: 3, 1: 3}
    partition = partition_for(group, 50)
    records = []
    for r in stored_records(dirs[0], OFFSETS_TOPIC, partition):
        key = decode_key(r.key)
        if getattr(key, "group", None) != group:
            continue  # another group hashed onto the same partition
        if isinstance(key, OffsetCommitKey):
            records.append((key, decode_offset_commit_value(r.value) if r.value is not None else None, r.timestamp))
        else:
            records.append((key, decode_group_metadata_value(r.value) if r.value is not None else None, r.timestamp))
    # The same bytes through Kafka's own message definitions (see test_offset_records): the same values.
    oracle = message_classes(KAFKA_SCHEMAS)
    for r in stored_records(dirs[0], OFFSETS_TOPIC, partition):
        key = decode_key(r.key)
        if isinstance(key, OffsetCommitKey) and key.group == group and r.value is not None:
            theirs = oracle["OffsetCommitValue"].decode(r.value)
            ours = decode_offset_commit_value(r.value)
            assert (theirs.version, theirs.offset, theirs.leader_epoch, theirs.metadata, theirs.commit_timestamp) == (
                3, ours.offset, ours.leader_epoch, ours.metadata, ours.commit_timestamp)
        elif isinstance(key, GroupMetadataKey) and key.group == group and r.value is not None:
            theirs = oracle["GroupMetadataValue"].decode(r.value)
            ours = decode_group_metadata_value(r.value)
            assert (theirs.version, theirs.generation, theirs.protocol, theirs.leader,
                    [(m.member_id, m.client_id, m.assignment) for m in theirs.members]) == (
                3, ours.generation, ours.protocol, ours.leader,
                [(m.member_id, m.client_id, m.assignment) for m in ours.members])
    commits = {(k.topic, k.partition): v for k, v, _ in records if isinstance(k, OffsetCommitKey)}
    assert {tp: v.offset for tp, v in commits.items()} == {(topic, 0): 3, (topic, 1): 3}
    # kafka-python commits the leader epoch of the last record it read (OffsetCommit v6+): the batch's.
    epochs = {p: stored_batches(dirs[0], topic, p)[-1].header.partition_leader_epoch for p in range(2)}
    assert {tp: v.leader_epoch for tp, v in commits.items()} == {(topic, p): epochs[p] for p in range(2)}
    assert all(v.metadata == "" and v.expire_timestamp == -1 for v in commits.values())
    assert all(v.commit_timestamp == ts for k, v, ts in records if isinstance(k, OffsetCommitKey))
    metadata = [v for k, v, _ in records if isinstance(k, GroupMetadataKey)]
    # After the rebalance the leader's assignment was stored; on close the group went empty.
    joined, emptied = metadata[0], metadata[-1]
    assert (joined.protocol_type, joined.protocol, joined.generation) == ("consumer", "range", 1)
    (member,) = joined.members
    assert member.member_id == joined.leader and member.client_host == "/127.0.0.1"
    assert member.client_id.startswith("kafka-python") and member.session_timeout == SESSION_MS
    assert member.assignment and member.subscription
    # (The client may rejoin once more, e.g. when its metadata arrives after its first join.)
    assert emptied.generation == max(v.generation for v in metadata[:-1]) + 1
    assert (emptied.protocol, emptied.leader, emptied.members) == (None, None, ())
    spec = node.node.registry.topics[OFFSETS_TOPIC]
    assert spec.internal and spec.config.compact and spec.partitions == 50


# -- shutdown -------------------------------------------------------------------------------------------------------


def test_stopping_the_node_answers_a_waiting_join_group_with_not_coordinator(dirs):
    def join_request(member_id: str = ""):
        return build(JoinGroupRequest, {"group_id": "blocked", "session_timeout_ms": 60000,
                                        "rebalance_timeout_ms": 300000, "member_id": member_id,
                                        "protocol_type": "consumer",
                                        "protocols": [{"name": "range", "metadata": b""}]}, 3)

    node = NodeThread(*dirs, overrides=FAST).start()
    try:
        first = call(node.node.broker.port, join_request(), JoinGroupResponse)
        assert (first.error_code, first.generation_id) == (0, 1)
        # A second member: the group now waits up to 300 s for the first one to rejoin, which it never does.
        sock = socket.create_connection(("127.0.0.1", node.node.broker.port), timeout=30)
        sock.sendall(request_frame(join_request(), correlation_id=5))
        wait_for(lambda: len(node.node.groups.groups["blocked"].members) == 2, what="the second join to arrive")
    finally:
        node.stop()  # must not wait for the rebalance timeout
    with sock:
        reply = read_frame(sock)
    assert reply is not None, "the waiting JoinGroup got no answer"
    answer = JoinGroupResponse.decode(reply, version=3, header=True)
    assert (answer.header.correlation_id, answer.error_code) == (5, 16)  # NOT_COORDINATOR: find it again
