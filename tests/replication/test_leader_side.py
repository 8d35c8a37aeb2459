"""The leader side of replication on a real node: `shale serve`'s StorageNode with a real etcd, real Kafka
clients, and the test itself playing the followers over Kafka's wire protocol (Fetch v12 with a replica id,
as a follower node sends it), so each step of the leader's rules can be watched: acks=all parked until every
ISR member has fetched the records, NOT_ENOUGH_REPLICAS, epochs in requests fenced, diverging epochs,
OffsetForLeaderEpoch, Metadata, and a fenced leader that stops acknowledging (docs/replication.md).
"""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path

import pytest
from kafka import KafkaConsumer, KafkaProducer
from kafka import TopicPartition as KTP
from kafka.errors import NotEnoughReplicasError, NotLeaderForPartitionError
from kafka.protocol.consumer.fetch import FetchRequest, FetchResponse
from kafka.protocol.consumer.offsets import (
    ListOffsetsRequest,
    ListOffsetsResponse,
    OffsetForLeaderEpochRequest,
    OffsetForLeaderEpochResponse,
)
from kafka.protocol.metadata.metadata import MetadataRequest, MetadataResponse
from kafka.protocol.producer.produce import ProduceRequest, ProduceResponse

from shale.sidecar.log.log import parse_batch_set
from shale.sidecar.log.records import Record, encode_batch
from shale.sidecar.log.topic_partition import TopicPartition
from shale.sidecar.protocol.error_codes import (
    FENCED_LEADER_EPOCH,
    NONE,
    NOT_ENOUGH_REPLICAS,
    NOT_LEADER_OR_FOLLOWER,
    OFFSET_OUT_OF_RANGE,
    REQUEST_TIMED_OUT,
    UNKNOWN_LEADER_EPOCH,
)
from shale.sidecar.replication.store.etcd_store import EtcdStore
from shale.sidecar.replication.store_records import NodeRegistration
from shale.sidecar.server.network.socket_server import MAX_HANDLING_PER_CONNECTION
from support.clients_util import build, call, read_frame, request_frame
from support.node_util import NodeThread, topic_manifest, wait_for, write_manifests

TOPIC = "replicated"
TP = TopicPartition(TOPIC, 0)
CLUSTER = "leader-side"
# Sessions long enough that a loaded machine does not fence a node by accident (the fencing test waits for it).
OVERRIDES = {"broker.session.timeout.ms": "4000", "broker.heartbeat.interval.ms": "500",
             "offsets.topic.replication.factor": "1", "replica.lag.time.max.ms": "600000"}


class Follower:
    """A follower node played by the test: a session in the store (long, so no renewals are needed) and Fetch
    v12 requests with its replica id."""

    def __init__(self, etcd, node_id: int, *, leads: bool = False) -> None:
        self.node_id = node_id
        # A played leader's Kafka port takes connections and never answers: a live node that is slow, not a dead
        # one (a refused port would let the node under test, its follower, end this session at once:
        # docs/replication.md "early end"). A played follower's port refuses, so that clients asking it for
        # metadata fail at once instead of waiting out their request timeout.
        self.listener = socket.create_server(("127.0.0.1", 0), backlog=16) if leads else None
        self.port = self.listener.getsockname()[1] if self.listener is not None else 9
        self.store = EtcdStore([etcd.endpoint], CLUSTER, timeout_s=10.0)  # the test's calls may wait on a busy etcd
        self.store.open_session(NodeRegistration(node_id, f"test-{node_id}-{time.monotonic_ns()}", "127.0.0.1",
                                                 self.port), ttl_ms=60_000)

    def leave(self) -> None:
        self.store.close_session()
        self.store.close()
        if self.listener is not None:
            self.listener.close()

    def fetch(self, port: int, offset: int, *, last_fetched_epoch: int = -1, current_leader_epoch: int = -1,
              max_wait_ms: int = 0):
        return fetch(port, offset, replica_id=self.node_id, last_fetched_epoch=last_fetched_epoch,
                     current_leader_epoch=current_leader_epoch, max_wait_ms=max_wait_ms)


def fetch(port: int, offset: int, *, replica_id: int = -1, last_fetched_epoch: int = -1,
          current_leader_epoch: int = -1, max_wait_ms: int = 0):
    """One Fetch of the partition; with `max_wait_ms`, a long poll that waits for at least one byte."""
    request = build(FetchRequest, {
        "replica_id": replica_id, "max_wait_ms": max_wait_ms, "min_bytes": 1 if max_wait_ms else 0,
        "max_bytes": 1 << 20, "isolation_level": 0,
        "session_id": 0, "session_epoch": -1, "topics": [{"topic": TOPIC, "partitions": [{
            "partition": 0, "current_leader_epoch": current_leader_epoch, "fetch_offset": offset,
            "last_fetched_epoch": last_fetched_epoch, "log_start_offset": 0, "partition_max_bytes": 1 << 20}]}],
        "forgotten_topics_data": [], "rack_id": ""}, version=12)
    return call(port, request, FetchResponse, timeout=max_wait_ms / 1000 + 10).responses[0].partitions[0]


def batches(records: bytes | None) -> list[tuple[int, int, int]]:
    """(base offset, last offset, partition leader epoch) of each batch of a fetched record set."""
    if not records:
        return []
    return [(h.base_offset, h.base_offset + h.last_offset_delta, h.partition_leader_epoch)
            for _, h in parse_batch_set(records, "fetched").headers]


def latest(port: int, *, replica_id: int = -1, current_leader_epoch: int = -1):
    request = build(ListOffsetsRequest, {"replica_id": replica_id, "isolation_level": 0, "topics": [
        {"name": TOPIC, "partitions": [{"partition_index": 0, "current_leader_epoch": current_leader_epoch,
                                        "timestamp": -1}]}]}, version=7)
    return call(port, request, ListOffsetsResponse).topics[0].partitions[0]


def metadata(port: int):
    request = build(MetadataRequest, {"topics": [{"name": TOPIC}], "allow_auto_topic_creation": False}, version=9)
    return call(port, request, MetadataResponse)


def epoch_end(port: int, epoch: int, current_leader_epoch: int = -1):
    request = build(OffsetForLeaderEpochRequest, {"replica_id": -1, "topics": [{"topic": TOPIC, "partitions": [
        {"partition": 0, "current_leader_epoch": current_leader_epoch, "leader_epoch": epoch}]}]}, version=4)
    return call(port, request, OffsetForLeaderEpochResponse).topics[0].partitions[0]


def produce(port: int, values: list[bytes], *, acks: int, timeout_ms: int = 30_000):
    return produce_response(port, values, acks=acks, timeout_ms=timeout_ms).responses[0].partition_responses[0]


def produce_response(port: int, values: list[bytes], *, acks: int, timeout_ms: int = 30_000, version: int = 9):
    request = produce_request(values, acks=acks, timeout_ms=timeout_ms, version=version)
    return call(port, request, ProduceResponse, timeout=timeout_ms / 1000 + 10)


def produce_request(values: list[bytes], *, acks: int, timeout_ms: int = 30_000, version: int = 9):
    now = int(time.time() * 1000)
    batch = encode_batch([Record(i, now, None, v) for i, v in enumerate(values)])
    return build(ProduceRequest, {"transactional_id": None, "acks": acks, "timeout_ms": timeout_ms,
                                  "topic_data": [{"name": TOPIC, "partition_data": [
                                      {"index": 0, "records": batch}]}]}, version=version)


def start_node(tmp_path: Path, etcd, *, replicas=(0, 1, 2), min_isr: int = 2) -> NodeThread:
    topics = tmp_path / "topics" / "topics.yaml"
    if not topics.exists():
        write_manifests(topics, topic_manifest(TOPIC, 1, {"min.insync.replicas": min_isr},
                                               assignment={"partitions": [list(replicas)]}))
    return NodeThread(tmp_path / "data", topics.parent, node_id=0, store=etcd.url, cluster_id=CLUSTER,
                      overrides=OVERRIDES).start()


def leader_record(node: NodeThread, epoch: int | None = None, isr=None):
    """Wait until node 0 leads (in `epoch`, with `isr`, if given) and return its record."""
    def led():
        replicas = node.node.replicas
        record = replicas.record(TP)
        if record is None or replicas.leader(TP) is None:
            return None
        if (epoch is not None and record.leader_epoch != epoch) or (isr is not None and record.isr != tuple(isr)):
            return None
        return record
    return wait_for(led, 60, what=f"node 0 to lead {TP} (epoch {epoch}, isr {isr})")


def test_acks_all_is_answered_once_every_isr_member_has_fetched_the_records(tmp_path, etcd):
    followers = [Follower(etcd, 1), Follower(etcd, 2)]
    node = start_node(tmp_path, etcd)
    try:
        record = leader_record(node, isr=(0, 1, 2))
        port = node.node.broker.port
        producer = KafkaProducer(bootstrap_servers=node.bootstrap, acks="all", linger_ms=0, retries=0)
        try:
            future = producer.send(TOPIC, b"v0", partition=0)
            wait_for(lambda: latest(port, replica_id=1).offset == 1, what="the leader's append")
            assert latest(port).offset == 0 and not future.is_done  # appended, not committed

            first = followers[0].fetch(port, 0)
            assert first.error_code == NONE
            assert batches(first.records) == [(0, 0, record.leader_epoch)]  # stamped with the leader epoch
            assert followers[0].fetch(port, 1, last_fetched_epoch=record.leader_epoch).error_code == NONE
            # Node 2 is in the ISR and has not fetched: nothing is committed yet, whatever node 1 has.
            assert latest(port).offset == 0 and not future.is_done
            assert consumed(node, 0) == []

            followers[1].fetch(port, 0)
            reply = followers[1].fetch(port, 1, last_fetched_epoch=record.leader_epoch)
            assert reply.high_watermark == 1  # the follower learns the new high watermark in the same answer
            assert future.get(timeout=10).offset == 0
            assert latest(port).offset == 1 and latest(port).leader_epoch == record.leader_epoch
            assert [m.value for m in consumed(node, 1)] == [b"v0"]
        finally:
            producer.close(5)
    finally:
        node.stop()
        for f in followers:
            f.leave()


def test_pipelined_acks_all_produces_beyond_a_few_wait_their_turn(tmp_path, etcd):
    """12 acks=all Produces pipelined on one connection while no follower fetches: only
    MAX_HANDLING_PER_CONNECTION are appended (and parked); the rest are read and wait, so a producer with a deep
    queue cannot append ahead of its followers without bound (a 1.2 GB librdkafka phase timed out at the ISR).
    As the followers fetch, the rest are appended in order and answered in order, offsets 0..11."""
    followers = [Follower(etcd, 1), Follower(etcd, 2)]
    node = start_node(tmp_path, etcd)
    try:
        record = leader_record(node, isr=(0, 1, 2))
        port = node.node.broker.port
        with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
            sock.sendall(b"".join(request_frame(produce_request([b"v%d" % i], acks=-1), i + 1, "pipelined")
                                  for i in range(12)))
            wait_for(lambda: latest(port, replica_id=1).offset == MAX_HANDLING_PER_CONNECTION,
                     what="the first requests' appends")
            time.sleep(0.5)  # the node has read every frame by now; none of the rest may start
            assert latest(port, replica_id=1).offset == MAX_HANDLING_PER_CONNECTION

            fetched = {f.node_id: 0 for f in followers}

            def followers_caught_up() -> bool:
                for f in followers:
                    got = batches(f.fetch(port, fetched[f.node_id], current_leader_epoch=record.leader_epoch,
                                          last_fetched_epoch=record.leader_epoch if fetched[f.node_id] else -1
                                          ).records)
                    fetched[f.node_id] = got[-1][1] + 1 if got else fetched[f.node_id]
                return latest(port).offset == 12  # the high watermark: every request appended and replicated
            wait_for(followers_caught_up, what="the followers to fetch all twelve")
            answers = [ProduceResponse.decode(read_frame(sock), version=9, header=True) for _ in range(12)]
        assert [(a.header.correlation_id, a.responses[0].partition_responses[0].error_code,
                 a.responses[0].partition_responses[0].base_offset) for a in answers] == \
            [(i + 1, NONE, i) for i in range(12)]
    finally:
        node.stop()
        for f in followers:
            f.leave()


def test_a_parked_follower_fetch_wakes_for_records_and_a_consumer_fetch_for_the_high_watermark(tmp_path, etcd):
    """The leader wakes a follower's long poll as soon as records are appended (the acks=all round trip waits
    for it), and a consumer's when the high watermark rises; a rise alone leaves a follower's waiting, as
    Kafka's DelayedFetch of a follower reads to the log end."""
    followers = [Follower(etcd, 1), Follower(etcd, 2)]
    node = start_node(tmp_path, etcd)
    try:
        record = leader_record(node, isr=(0, 1, 2))
        broker, port, epoch = node.node.broker, node.node.broker.port, record.leader_epoch
        assert produce(port, [b"v0"], acks=1).error_code == NONE
        assert batches(followers[0].fetch(port, 0).records) == [(0, 0, epoch)]
        assert batches(followers[1].fetch(port, 0).records) == [(0, 0, epoch)]
        answers: dict[str, object] = {}

        def long_poll(name: str, **kw) -> threading.Thread:
            thread = threading.Thread(target=lambda: answers.__setitem__(name, fetch(port, **kw)))
            thread.start()
            return thread

        parked = lambda n: len(broker.purgatory.events.get(TP, ())) == n  # noqa: E731 - the broker's parked fetches
        follower = long_poll("follower", offset=1, replica_id=1, last_fetched_epoch=epoch, max_wait_ms=120_000)
        wait_for(lambda: parked(1), what="node 1's fetch to be parked")
        consumer = long_poll("consumer", offset=0, max_wait_ms=120_000)
        wait_for(lambda: parked(2), what="the consumer's fetch to be parked")

        # Node 2 reaches offset 1: the high watermark rises to 1, which the consumer may read; node 1 may not.
        assert followers[1].fetch(port, 1, last_fetched_epoch=epoch).high_watermark == 1
        consumer.join(60)
        assert not consumer.is_alive() and batches(answers["consumer"].records) == [(0, 0, epoch)]
        assert follower.is_alive() and "follower" not in answers and parked(1)

        assert produce(port, [b"v1"], acks=1).error_code == NONE  # an append: node 1's fetch answers with it
        follower.join(60)
        assert not follower.is_alive() and batches(answers["follower"].records) == [(1, 1, epoch)]
        assert answers["follower"].high_watermark == 1
    finally:
        node.stop()
        for f in followers:
            f.leave()


def consumed(node: NodeThread, count: int) -> list:
    consumer = KafkaConsumer(bootstrap_servers=node.bootstrap, group_id=None, enable_auto_commit=False,
                             fetch_max_wait_ms=100)
    try:
        consumer.assign([KTP(TOPIC, 0)])
        consumer.seek_to_beginning()
        got: list = []
        polls = 0
        while len(got) < count or (count == 0 and polls < 3):
            polls += 1
            for records in consumer.poll(timeout_ms=200).values():
                got.extend(records)
            assert polls < 100, f"read {len(got)} of {count} records"
        return got
    finally:
        consumer.close()


def test_not_enough_replicas_refuses_acks_all_before_appending(tmp_path, etcd):
    follower = Follower(etcd, 1)
    node = start_node(tmp_path, etcd, replicas=(0, 1), min_isr=2)
    try:
        leader_record(node, isr=(0, 1))
        port = node.node.broker.port
        follower.leave()  # its session ends: the leader shrinks it out at once
        leader_record(node, isr=(0,))
        refused = produce(port, [b"never"], acks=-1)
        assert refused.error_code == NOT_ENOUGH_REPLICAS
        assert latest(port, replica_id=1).offset == 0  # nothing was written
        with KafkaProducer(bootstrap_servers=node.bootstrap, acks="all", retries=0) as producer:
            with pytest.raises(NotEnoughReplicasError):
                producer.send(TOPIC, b"never either", partition=0).get(timeout=10)
        accepted = produce(port, [b"acks=1 needs no ISR"], acks=1)
        assert (accepted.error_code, accepted.base_offset) == (NONE, 0)
        assert latest(port).offset == 0  # under min.insync.replicas the high watermark stays (KAFKA-15583)
    finally:
        node.stop()


def test_a_parked_produce_times_out_and_one_whose_isr_shrank_answers_after_append(tmp_path, etcd, caplog):
    followers = [Follower(etcd, 1), Follower(etcd, 2)]
    node = start_node(tmp_path, etcd, min_isr=2)
    try:
        record = leader_record(node, isr=(0, 1, 2))
        port = node.node.broker.port
        timed_out = produce(port, [b"a"], acks=-1, timeout_ms=300)
        assert (timed_out.error_code, timed_out.base_offset) == (REQUEST_TIMED_OUT, 0)  # appended, not acknowledged
        # Slow replication is the cluster's state, not a server error (a deep producer queue logged thousands).
        assert [r.levelname for r in caplog.records if "refused with error 7:" in r.getMessage()] == ["WARNING"]
        for f in followers:
            f.fetch(port, 1, last_fetched_epoch=record.leader_epoch)
        assert latest(port).offset == 1  # committed once both fetched past it
        followers[1].leave()  # the ISR shrinks to {0, 1}: still at min.insync.replicas
        leader_record(node, isr=(0, 1))
        followers[0].fetch(port, 1, last_fetched_epoch=record.leader_epoch)
        assert produce(port, [b"b"], acks=-1, timeout_ms=300).error_code == REQUEST_TIMED_OUT
        followers[0].fetch(port, 2, last_fetched_epoch=record.leader_epoch)
        assert latest(port).offset == 2
    finally:
        node.stop()
        followers[0].leave()


def test_epochs_in_requests_divergence_and_offset_for_leader_epoch(tmp_path, etcd):
    node = start_node(tmp_path, etcd, replicas=(0, 1), min_isr=1)  # node 1 not live: the ISR is {0}
    try:
        old = leader_record(node, isr=(0,)).leader_epoch
        assert produce(node.node.broker.port, [b"a", b"b", b"c"], acks=-1).base_offset == 0
    finally:
        node.stop()
    node = start_node(tmp_path, etcd, replicas=(0, 1), min_isr=1)  # a new incarnation: re-elected, a new epoch
    follower = None
    try:
        record = leader_record(node, isr=(0,))
        new = record.leader_epoch
        assert new > old
        port = node.node.broker.port
        assert produce(port, [b"d", b"e"], acks=-1).base_offset == 3
        assert (epoch_end(port, old).leader_epoch, epoch_end(port, old).end_offset) == (old, 3)
        assert (epoch_end(port, new).leader_epoch, epoch_end(port, new).end_offset) == (new, 5)
        assert (epoch_end(port, new + 5).leader_epoch, epoch_end(port, new + 5).end_offset) == (-1, -1)  # unknown
        assert epoch_end(port, new, current_leader_epoch=new - 1).error_code == FENCED_LEADER_EPOCH
        assert epoch_end(port, new, current_leader_epoch=new + 1).error_code == UNKNOWN_LEADER_EPOCH

        assert fetch(port, 0, current_leader_epoch=new - 1).error_code == FENCED_LEADER_EPOCH
        assert fetch(port, 0, current_leader_epoch=new + 1).error_code == UNKNOWN_LEADER_EPOCH
        assert batches(fetch(port, 0, current_leader_epoch=new).records) == [(0, 2, old), (3, 4, new)]
        assert latest(port, current_leader_epoch=new - 1).error_code == FENCED_LEADER_EPOCH
        answer = latest(port, current_leader_epoch=new)
        assert (answer.error_code, answer.offset, answer.leader_epoch) == (NONE, 5, new)

        follower = Follower(etcd, 1)
        wait_for(lambda: node.node.replicas.view.is_live(1), what="node 1's session in the view")
        # A follower whose log ends in the old epoch at offset 4 (a tail the new epoch replaced): back to 3.
        diverged = follower.fetch(port, 4, last_fetched_epoch=old, current_leader_epoch=new)
        assert diverged.error_code == NONE and not diverged.records
        assert (diverged.diverging_epoch.epoch, diverged.diverging_epoch.end_offset) == (old, 3)
        # A follower claiming an epoch later than the leader's: no end offset can be given (Kafka's answer).
        ahead = follower.fetch(port, 6, last_fetched_epoch=new + 5, current_leader_epoch=new)
        assert ahead.error_code == OFFSET_OUT_OF_RANGE
        # Once it agrees and has caught up, it joins the ISR.
        follower.fetch(port, 3, last_fetched_epoch=old, current_leader_epoch=new)
        follower.fetch(port, 5, last_fetched_epoch=new, current_leader_epoch=new)
        leader_record(node, epoch=new, isr=(0, 1))
        meta = metadata(port).topics[0].partitions[0]
        assert (meta.error_code, meta.leader_id, meta.leader_epoch) == (NONE, 0, new)
        assert (list(meta.replica_nodes), list(meta.isr_nodes), list(meta.offline_replicas)) == ([0, 1], [0, 1], [])
        assert sorted(b.node_id for b in metadata(port).brokers) == [0, 1]
    finally:
        node.stop()
        if follower is not None:
            follower.leave()


def test_a_leader_that_cannot_renew_its_session_stops_acknowledging(tmp_path, etcd):
    follower = Follower(etcd, 1)
    node = start_node(tmp_path, etcd, replicas=(0, 1), min_isr=1)
    try:
        record = leader_record(node, isr=(0, 1))
        port = node.node.broker.port
        follower.fetch(port, 0, last_fetched_epoch=-1, current_leader_epoch=record.leader_epoch)
        assert produce(port, [b"committed"], acks=1).base_offset == 0
        follower.fetch(port, 1, last_fetched_epoch=record.leader_epoch, current_leader_epoch=record.leader_epoch)
        assert latest(port).offset == 1
        with KafkaProducer(bootstrap_servers=node.bootstrap, acks="all", retries=0, linger_ms=0) as producer:
            parked = producer.send(TOPIC, b"parked", partition=0)  # node 1 never fetches it
            wait_for(lambda: latest(port, replica_id=1).offset == 2, what="the parked append")
            etcd.sigstop()  # no renewal can succeed: the leader fences itself within the session
            try:
                with pytest.raises(NotLeaderForPartitionError):
                    parked.get(timeout=20)
                assert produce(port, [b"refused"], acks=1).error_code == NOT_LEADER_OR_FOLLOWER
                # Reads of committed data go on.
                assert [m.value for m in consumed(node, 1)] == [b"committed"]
            finally:
                etcd.sigcont()
    finally:
        node.stop()
        follower.leave()


def test_a_follower_answers_not_leader_and_names_the_leader(tmp_path, etcd):
    leader = Follower(etcd, 1, leads=True)  # live first in the replica list: the record makes it the leader
    node = start_node(tmp_path, etcd, replicas=(1, 0), min_isr=1)
    try:
        def following():
            record = node.node.replicas.record(TP)
            part = node.node.replicas.partitions.get(TP)
            return record is not None and part is not None and part.state.role.value == "follower" and record
        record = wait_for(following, 60, what="node 0 to follow node 1")
        port = node.node.broker.port
        answer = produce_response(port, [b"x"], acks=1, version=12)
        part = answer.responses[0].partition_responses[0]
        assert part.error_code == NOT_LEADER_OR_FOLLOWER
        assert (part.current_leader.leader_id, part.current_leader.leader_epoch) == (1, record.leader_epoch)
        assert [(e.node_id, e.host, e.port) for e in answer.node_endpoints] == [(1, "127.0.0.1", leader.port)]
        refused = fetch(port, 0, current_leader_epoch=record.leader_epoch)
        assert refused.error_code == NOT_LEADER_OR_FOLLOWER and refused.current_leader.leader_id == 1
        assert latest(port).error_code == NOT_LEADER_OR_FOLLOWER
        assert epoch_end(port, record.leader_epoch).error_code == NOT_LEADER_OR_FOLLOWER
        meta = metadata(port).topics[0].partitions[0]
        assert (meta.leader_id, list(meta.replica_nodes), list(meta.isr_nodes)) == (1, [1, 0], [1, 0])
    finally:
        node.stop()
        leader.leave()
