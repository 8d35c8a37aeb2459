"""read_committed through a real `shale serve`: transactional batches and end-transaction markers written with
Produce (the coordinator is part 2 of docs/transactions.md; until then the markers come from the test), read back
by unmodified confluent-kafka and kafka-python consumers with isolation.level=read_committed, raw Fetch and
ListOffsets at both isolation levels, /status and /metrics, and the same answers after a SIGKILL."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request

import confluent_kafka
import pytest
from aiokafka import AIOKafkaConsumer
from aiokafka.structs import TopicPartition as AioTP
from kafka import KafkaConsumer
from kafka import TopicPartition as KpTP
from kafka.protocol.consumer.fetch import FetchRequest, FetchResponse
from kafka.protocol.consumer.offsets import ListOffsetsRequest, ListOffsetsResponse
from kafka.protocol.producer.produce import ProduceRequest, ProduceResponse

from clients_util import build, call, partition_dir
from node_util import ServeProcess, start_replicated_cluster, topic_manifest, wait_for, write_manifests
from shale.sidecar.log.records import ControlType, Record, encode_batch, encode_control_key, encode_end_txn_marker
from shale.sidecar.log.transaction_index import AbortedTxn, parse_entries

TOPIC = "rc"
READ_UNCOMMITTED, READ_COMMITTED = 0, 1


def data(value: bytes, pid: int | None = None) -> bytes:
    ts = int(time.time() * 1000)
    if pid is None:
        return encode_batch([Record(0, ts, b"k", value)])
    return encode_batch([Record(0, ts, b"k", value)], producer_id=pid, producer_epoch=0, base_sequence=0,
                        is_transactional=True)


def end(pid: int, ctype: ControlType) -> bytes:
    return encode_batch([Record(0, int(time.time() * 1000), encode_control_key(ctype), encode_end_txn_marker(0))],
                        producer_id=pid, producer_epoch=0, is_transactional=True, is_control=True)


def produce(port: int, batch: bytes) -> int:
    req = build(ProduceRequest, {"transactional_id": "rc-test", "acks": -1, "timeout_ms": 5000, "topic_data": [
        {"name": TOPIC, "partition_data": [{"index": 0, "records": batch}]}]}, 9)
    [part] = call(port, req, ProduceResponse).responses[0].partition_responses
    assert part.error_code == 0, part
    return part.base_offset


def fetch(port: int, isolation: int, offset: int = 0):
    req = build(FetchRequest, {
        "replica_id": -1, "max_wait_ms": 0, "min_bytes": 0, "max_bytes": 1 << 20, "isolation_level": isolation,
        "session_id": 0, "session_epoch": -1, "rack_id": "",
        "topics": [{"topic": TOPIC, "partitions": [{"partition": 0, "fetch_offset": offset,
                                                    "partition_max_bytes": 1 << 20}]}],
        "forgotten_topics_data": []}, 12)
    return call(port, req, FetchResponse).responses[0].partitions[0]


def latest(port: int, isolation: int) -> int:
    req = build(ListOffsetsRequest, {"replica_id": -1, "isolation_level": isolation, "topics": [
        {"name": TOPIC, "partitions": [{"partition_index": 0, "timestamp": -1}]}]}, 5)
    [part] = call(port, req, ListOffsetsResponse).topics[0].partitions
    assert part.error_code == 0
    return part.offset


def confluent_read_committed(bootstrap: str) -> list[bytes]:
    """Values up to the partition's end for a read_committed librdkafka consumer (its EOF is the LSO)."""
    consumer = confluent_kafka.Consumer({"bootstrap.servers": bootstrap, "group.id": "rc-reader",
                                         "isolation.level": "read_committed", "enable.partition.eof": True,
                                         "enable.auto.commit": False})
    values = []
    try:
        consumer.assign([confluent_kafka.TopicPartition(TOPIC, 0, confluent_kafka.OFFSET_BEGINNING)])
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            if msg.error():
                assert msg.error().code() == confluent_kafka.KafkaError._PARTITION_EOF, msg.error()
                return values
            values.append(msg.value())
        raise AssertionError(f"no end of partition within 30 s; read {values}")
    finally:
        consumer.close()


def kafka_python_read_committed(bootstrap: str) -> list[bytes]:
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False,
                             isolation_level="read_committed", fetch_max_wait_ms=100)
    tp = KpTP(TOPIC, 0)
    try:
        consumer.assign([tp])
        consumer.seek_to_beginning()
        stop = consumer.end_offsets([tp])[tp]  # ListOffsets with the consumer's isolation level: the LSO
        values = []
        deadline = time.monotonic() + 30
        while consumer.position(tp) < stop:
            assert time.monotonic() < deadline, f"position {consumer.position(tp)} never reached {stop}; {values}"
            for records in consumer.poll(timeout_ms=500).values():
                values += [r.value for r in records]
        return values
    finally:
        consumer.close()


def aiokafka_read_committed(bootstrap: str) -> list[bytes]:
    async def run() -> list[bytes]:
        consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False,
                                    isolation_level="read_committed", fetch_max_wait_ms=100)
        await consumer.start()
        tp = AioTP(TOPIC, 0)
        try:
            consumer.assign([tp])
            await consumer.seek_to_beginning(tp)
            stop = (await consumer.end_offsets([tp]))[tp]
            values = []
            async with asyncio.timeout(30):
                while await consumer.position(tp) < stop:
                    for records in (await consumer.getmany(timeout_ms=200)).values():
                        values += [r.value for r in records]
            return values
        finally:
            await consumer.stop()

    return asyncio.run(run())


def status_lso(server: ServeProcess) -> int:
    with urllib.request.urlopen(f"http://127.0.0.1:{server.http_port}/status", timeout=10) as resp:
        doc = json.load(resp)
    return doc["topics"][TOPIC]["partitions"][0]["last_stable_offset"]


def metrics_lso(server: ServeProcess) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{server.http_port}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    line = next(ln for ln in text.splitlines()
                if ln.startswith("shale_log_last_stable_offset{") and f'topic="{TOPIC}"' in ln)
    return float(line.rsplit(" ", 1)[1])


@pytest.fixture
def server(tmp_path):
    topics = write_manifests(tmp_path / "topics" / "rc.yaml", topic_manifest(TOPIC, 1))
    node = ServeProcess(tmp_path / "data", topics.parent).start()
    yield node
    if node.proc.poll() is None:
        node.terminate()


def test_read_committed_readers_see_committed_data_up_to_the_lso_and_after_a_sigkill(server) -> None:
    port = server.port
    for batch in (data(b"p0"), encode_batch([Record(0, 0, b"k", b"a1"), Record(1, 0, b"k", b"a2")], producer_id=1000,
                                            producer_epoch=0, base_sequence=0, is_transactional=True),
                  data(b"b1", 2000), data(b"p1"), end(1000, ControlType.ABORT), data(b"b2", 2000),
                  end(2000, ControlType.COMMIT), data(b"p2"), data(b"c1", 3000), data(b"p3")):
        produce(port, batch)
    # offsets: p0 0, a1-a2 1-2, b1 3, p1 4, ABORT 5, b2 6, COMMIT 7, p2 8, c1 9 (open), p3 10
    committed = [b"p0", b"b1", b"p1", b"b2", b"p2"]
    assert latest(port, READ_COMMITTED) == 9 and latest(port, READ_UNCOMMITTED) == 11
    part = fetch(port, READ_COMMITTED)
    assert (part.error_code, part.high_watermark, part.last_stable_offset) == (0, 11, 9)
    assert [(a.producer_id, a.first_offset) for a in part.aborted_transactions] == [(1000, 1)]
    assert fetch(port, READ_COMMITTED, 6).aborted_transactions == [], "the abort ended before offset 6"
    assert fetch(port, READ_UNCOMMITTED).aborted_transactions is None
    assert confluent_read_committed(server.bootstrap) == committed
    assert kafka_python_read_committed(server.bootstrap) == committed
    assert aiokafka_read_committed(server.bootstrap) == committed
    assert status_lso(server) == 9 and metrics_lso(server) == 9

    produce(port, end(3000, ControlType.COMMIT))  # 11
    produce(port, data(b"d1", 4000))  # 12
    produce(port, end(4000, ControlType.ABORT))  # 13
    committed += [b"c1", b"p3"]
    assert latest(port, READ_COMMITTED) == latest(port, READ_UNCOMMITTED) == 14
    assert confluent_read_committed(server.bootstrap) == committed

    server.kill()  # SIGKILL: the restart recovers the segment and rebuilds its `.txnindex`
    server.start()
    assert latest(port, READ_COMMITTED) == 14
    part = fetch(port, READ_COMMITTED)
    assert [(a.producer_id, a.first_offset) for a in part.aborted_transactions] == [(1000, 1), (4000, 12)]
    assert confluent_read_committed(server.bootstrap) == committed
    assert kafka_python_read_committed(server.bootstrap) == committed
    assert aiokafka_read_committed(server.bootstrap) == committed
    index = partition_dir(server.data_dir, TOPIC, 0) / "00000000000000000000.txnindex"
    # ABORT of 1000 at 5 while 2000's transaction was open from 3; ABORT of 4000 at 13 with none open
    assert parse_entries(index.read_bytes(), str(index)) == [AbortedTxn(1000, 1, 5, 3), AbortedTxn(4000, 12, 13, 14)]
    wait_for(lambda: status_lso(server) == 14, 10, what="/status to show the LSO")


def test_aborted_transactions_travel_with_records_sent_from_the_file(server) -> None:
    """A slice large enough for sendfile is encoded around the file range: its aborted list must still be there."""
    big = b"x" * (200 * 1024)
    produce(server.port, data(big, 5000))  # 0
    produce(server.port, end(5000, ControlType.ABORT))  # 1
    produce(server.port, data(b"after"))  # 2
    part = fetch(server.port, READ_COMMITTED)
    assert len(part.records) > 64 * 1024 and part.last_stable_offset == 3
    assert [(a.producer_id, a.first_offset) for a in part.aborted_transactions] == [(5000, 0)]
    assert confluent_read_committed(server.bootstrap) == [b"after"]


def test_replicas_index_the_same_aborts_and_a_new_leader_serves_read_committed(tmp_path, etcd) -> None:
    """Followers rebuild producer state and `.txnindex` from the leader's batches: byte-identical files, and after
    the leader's SIGKILL the new leader answers read_committed readers as the old one did."""
    cluster = start_replicated_cluster(tmp_path, etcd, 2, topic_manifest(TOPIC, 1, replicas=2))
    try:
        leader = cluster.wait_for_isr(TOPIC, 0).leader
        port = cluster.servers[leader].port
        for batch in (data(b"p0"), data(b"a1", 1000), data(b"b1", 2000), end(1000, ControlType.ABORT),
                      data(b"b2", 2000), end(2000, ControlType.COMMIT), data(b"c1", 3000)):
            produce(port, batch)  # acks=all: answered once the follower has it
        # offsets: p0 0, a1 1, b1 2, ABORT 3, b2 4, COMMIT 5, c1 6 (open)
        part = fetch(port, READ_COMMITTED)
        assert (part.high_watermark, part.last_stable_offset) == (7, 6)
        assert [(a.producer_id, a.first_offset) for a in part.aborted_transactions] == [(1000, 1)]
        assert confluent_read_committed(cluster.bootstrap) == [b"p0", b"b1", b"b2"]
        cluster.wait_identical_below(TOPIC, 0, 7, (0, 1))
        follower = 1 - leader
        indexes = [partition_dir(cluster.data_dir(n), TOPIC, 0) / "00000000000000000000.txnindex" for n in (0, 1)]
        assert indexes[0].read_bytes() == indexes[1].read_bytes() == AbortedTxn(1000, 1, 3, 2).encode()

        cluster.kill(leader)
        assert cluster.wait_for_leader(TOPIC, 0, excluding=(leader,)).leader == follower
        port = cluster.servers[follower].port
        wait_for(lambda: latest(port, READ_COMMITTED) == 6, 30, what="the new leader's LSO")
        part = fetch(port, READ_COMMITTED)
        assert [(a.producer_id, a.first_offset) for a in part.aborted_transactions] == [(1000, 1)]
        assert confluent_read_committed(cluster.servers[follower].bootstrap) == [b"p0", b"b1", b"b2"]
        produce(port, end(3000, ControlType.COMMIT))  # 7
        assert latest(port, READ_COMMITTED) == 8
        assert confluent_read_committed(cluster.servers[follower].bootstrap) == [b"p0", b"b1", b"b2", b"c1"]
    finally:
        cluster.stop()
