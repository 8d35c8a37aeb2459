"""A transactional producer spoken in raw requests (kafka-python's request classes), for tests that must place
each batch and each transaction's end at an exact offset: InitProducerId, AddPartitionsToTxn, Produce of its
own transactional batches (sequences kept per partition) and EndTxn — the markers are the coordinator's."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import confluent_kafka
from kafka.protocol.metadata.find_coordinator import FindCoordinatorRequest, FindCoordinatorResponse
from kafka.protocol.producer.produce import ProduceRequest, ProduceResponse
from kafka.protocol.producer.transaction import (
    AddOffsetsToTxnRequest,
    AddOffsetsToTxnResponse,
    AddPartitionsToTxnRequest,
    AddPartitionsToTxnResponse,
    EndTxnRequest,
    EndTxnResponse,
    InitProducerIdRequest,
    InitProducerIdResponse,
    TxnOffsetCommitRequest,
    TxnOffsetCommitResponse,
)

from shale.sidecar.log.records import Record, encode_batch
from support.clients_util import build, call
from support.node_util import wait_for


def produce_raw(port: int, topic: str, partition: int, batch: bytes, transactional_id: str | None = None,
                version: int = 9):
    """One batch with acks=all; the partition's response (error code, base offset, error message)."""
    req = build(ProduceRequest, {"transactional_id": transactional_id, "acks": -1, "timeout_ms": 5000, "topic_data": [
        {"name": topic, "partition_data": [{"index": partition, "records": batch}]}]}, version)
    [part] = call(port, req, ProduceResponse).responses[0].partition_responses
    return part


def plain(port: int, topic: str, value: bytes, partition: int = 0) -> int:
    """A non-transactional record; its offset."""
    part = produce_raw(port, topic, partition, encode_batch([Record(0, int(time.time() * 1000), b"k", value)]))
    assert part.error_code == 0, part
    return part.base_offset


def coordinator_port(port: int, transactional_id: str, timeout: float = 60.0) -> int:
    """The port of the id's coordinator, asked of the node on `port` (FindCoordinator key type 1) until one is
    named: a new cluster creates `__transaction_state` and elects its leaders on the first ask."""
    def ask() -> int | None:
        resp = call(port, build(FindCoordinatorRequest, {"key": transactional_id, "key_type": 1}, 3),
                    FindCoordinatorResponse)
        return resp.port if resp.error_code == 0 else None

    return wait_for(ask, timeout, interval=0.2, what=f"a coordinator for {transactional_id!r}")


@dataclass
class RawTransactions:
    """One transactional id's producer: `port` is its coordinator's node, `leader_port` the partitions' leader's
    (the same node unless given)."""

    port: int
    transactional_id: str
    leader_port: int | None = None
    timeout_ms: int = 60000
    producer_id: int = -1
    epoch: int = -1
    sequences: dict[tuple[str, int], int] = field(default_factory=dict)

    def init(self) -> "RawTransactions":
        resp = call(self.port, build(InitProducerIdRequest, {
            "transactional_id": self.transactional_id, "transaction_timeout_ms": self.timeout_ms,
            "producer_id": -1, "producer_epoch": -1}, 4), InitProducerIdResponse)
        assert resp.error_code == 0, resp
        self.producer_id, self.epoch = resp.producer_id, resp.producer_epoch
        return self

    def add(self, topic: str, *partitions: int) -> int:
        resp = call(self.port, build(AddPartitionsToTxnRequest, {
            "v3_and_below_transactional_id": self.transactional_id, "v3_and_below_producer_id": self.producer_id,
            "v3_and_below_producer_epoch": self.epoch,
            "v3_and_below_topics": [{"name": topic, "partitions": list(partitions)}]}, 3), AddPartitionsToTxnResponse)
        [codes] = [{p.partition_index: p.partition_error_code for p in t.results_by_partition}
                   for t in resp.results_by_topic_v3_and_below]
        [code] = set(codes.values())
        return code

    def batch(self, topic: str, partition: int, *values: bytes, timestamp: int | None = None) -> bytes:
        """This producer's next transactional batch for the partition (the sequence is taken only once sent)."""
        ts = int(time.time() * 1000) if timestamp is None else timestamp
        return encode_batch([Record(i, ts, b"k", v) for i, v in enumerate(values)], producer_id=self.producer_id,
                            producer_epoch=self.epoch, base_sequence=self.sequences.get((topic, partition), 0),
                            is_transactional=True)

    def send(self, topic: str, partition: int, *values: bytes, version: int = 9, timestamp: int | None = None):
        """Produce the next batch; the partition's response. The sequence moves on only if it was appended."""
        part = produce_raw(self.leader_port or self.port, topic, partition,
                           self.batch(topic, partition, *values, timestamp=timestamp), self.transactional_id, version)
        if part.error_code == 0:
            self.sequences[(topic, partition)] = self.sequences.get((topic, partition), 0) + len(values)
        return part

    def write(self, topic: str, partition: int, *values: bytes, timestamp: int | None = None) -> int:
        """Add the partition if needed, produce, and return the first offset."""
        assert self.add(topic, partition) == 0
        part = self.send(topic, partition, *values, timestamp=timestamp)
        assert part.error_code == 0, part
        return part.base_offset

    def commit_offset(self, group_id: str, topic: str, partition: int, offset: int) -> None:
        """AddOffsetsToTxn, then TxnOffsetCommit of one offset (a group without members: generation -1)."""
        added = call(self.port, build(AddOffsetsToTxnRequest, {
            "transactional_id": self.transactional_id, "producer_id": self.producer_id,
            "producer_epoch": self.epoch, "group_id": group_id}, 3), AddOffsetsToTxnResponse)
        assert added.error_code == 0, added
        resp = call(self.port, build(TxnOffsetCommitRequest, {
            "transactional_id": self.transactional_id, "group_id": group_id, "producer_id": self.producer_id,
            "producer_epoch": self.epoch, "generation_id": -1, "member_id": "", "group_instance_id": None,
            "topics": [{"name": topic, "partitions": [{"partition_index": partition, "committed_offset": offset,
                                                       "committed_leader_epoch": -1,
                                                       "committed_metadata": ""}]}]}, 3), TxnOffsetCommitResponse)
        [code] = [p.error_code for t in resp.topics for p in t.partitions]
        assert code == 0, resp

    def end(self, commit: bool) -> int:
        resp = call(self.port, build(EndTxnRequest, {
            "transactional_id": self.transactional_id, "producer_id": self.producer_id,
            "producer_epoch": self.epoch, "committed": commit}, 3), EndTxnResponse)
        return resp.error_code

    def commit(self) -> None:
        assert self.end(True) == 0

    def abort(self) -> None:
        assert self.end(False) == 0


def read_to_end(bootstrap: str, topic: str, partitions: int, isolation: str = "read_committed",
                timeout: float = 60.0) -> dict[tuple[int, int], tuple[bytes | None, bytes | None]]:
    """(partition, offset) -> (key, value) of every record a librdkafka consumer reads from the start of each
    partition to its end — the LSO for read_committed — in offset order; a record read twice fails."""
    consumer = confluent_kafka.Consumer({"bootstrap.servers": bootstrap, "group.id": f"reader-{isolation}",
                                         "isolation.level": isolation, "enable.partition.eof": True,
                                         "enable.auto.commit": False})
    got: dict[tuple[int, int], tuple[bytes | None, bytes | None]] = {}
    at_end: set[int] = set()
    try:
        consumer.assign([confluent_kafka.TopicPartition(topic, p, confluent_kafka.OFFSET_BEGINNING)
                         for p in range(partitions)])
        deadline = time.monotonic() + timeout
        while len(at_end) < partitions:
            assert time.monotonic() < deadline, f"no end of {topic} within {timeout} s; read {got}"
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            if msg.error():
                assert msg.error().code() == confluent_kafka.KafkaError._PARTITION_EOF, msg.error()
                at_end.add(msg.partition())
                continue
            at = (msg.partition(), msg.offset())
            assert at not in got, f"{topic}-{at[0]} offset {at[1]} read twice"
            got[at] = (msg.key(), msg.value())
    finally:
        consumer.close()
    return dict(sorted(got.items()))
