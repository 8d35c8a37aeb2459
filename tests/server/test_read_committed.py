"""read_committed through a real `shale serve`: transactional batches and their ends written by raw transactional
producers (txn_util.py: InitProducerId, AddPartitionsToTxn, Produce, EndTxn — the markers are the coordinator's),
read back by unmodified confluent-kafka, kafka-python and aiokafka consumers with isolation.level=read_committed,
raw Fetch and ListOffsets at both isolation levels, /status and /metrics, and the same answers after a SIGKILL."""

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

from shale.sidecar.log.transaction_index import AbortedTxn, parse_entries
from support.clients_util import build, call, partition_dir
from support.node_util import ServeProcess, start_replicated_cluster, topic_manifest, wait_for, write_manifests
from support.txn_util import RawTransactions, coordinator_port, plain

TOPIC = "rc"
READ_UNCOMMITTED, READ_COMMITTED = 0, 1


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
    a, b, c, d = (RawTransactions(port, f"rc-{n}").init() for n in "abcd")
    assert plain(port, TOPIC, b"p0") == 0
    assert a.write(TOPIC, 0, b"a1", b"a2", timestamp=0) == 1
    assert b.write(TOPIC, 0, b"b1") == 3
    assert plain(port, TOPIC, b"p1") == 4
    a.abort()  # 5
    assert b.write(TOPIC, 0, b"b2") == 6
    b.commit()  # 7
    assert plain(port, TOPIC, b"p2") == 8
    assert c.write(TOPIC, 0, b"c1") == 9  # open
    assert plain(port, TOPIC, b"p3") == 10
    committed = [b"p0", b"b1", b"p1", b"b2", b"p2"]
    assert latest(port, READ_COMMITTED) == 9 and latest(port, READ_UNCOMMITTED) == 11
    part = fetch(port, READ_COMMITTED)
    assert (part.error_code, part.high_watermark, part.last_stable_offset) == (0, 11, 9)
    assert [(t.producer_id, t.first_offset) for t in part.aborted_transactions] == [(a.producer_id, 1)]
    assert fetch(port, READ_COMMITTED, 6).aborted_transactions == [], "the abort ended before offset 6"
    assert fetch(port, READ_UNCOMMITTED).aborted_transactions is None
    assert confluent_read_committed(server.bootstrap) == committed
    assert kafka_python_read_committed(server.bootstrap) == committed
    assert aiokafka_read_committed(server.bootstrap) == committed
    assert status_lso(server) == 9 and metrics_lso(server) == 9

    c.commit()  # 11
    assert d.write(TOPIC, 0, b"d1") == 12
    d.abort()  # 13
    committed += [b"c1", b"p3"]
    assert latest(port, READ_COMMITTED) == latest(port, READ_UNCOMMITTED) == 14
    assert confluent_read_committed(server.bootstrap) == committed

    server.kill()  # SIGKILL: the restart recovers the segment and rebuilds its `.txnindex`
    server.start()
    assert latest(port, READ_COMMITTED) == 14
    part = fetch(port, READ_COMMITTED)
    assert [(t.producer_id, t.first_offset) for t in part.aborted_transactions] == [(a.producer_id, 1),
                                                                                   (d.producer_id, 12)]
    assert confluent_read_committed(server.bootstrap) == committed
    assert kafka_python_read_committed(server.bootstrap) == committed
    assert aiokafka_read_committed(server.bootstrap) == committed
    index = partition_dir(server.data_dir, TOPIC, 0) / "00000000000000000000.txnindex"
    # ABORT of a at 5 while b's transaction was open from 3; ABORT of d at 13 with none open
    assert parse_entries(index.read_bytes(), str(index)) == [AbortedTxn(a.producer_id, 1, 5, 3),
                                                             AbortedTxn(d.producer_id, 12, 13, 14)]
    wait_for(lambda: status_lso(server) == 14, 10, what="/status to show the LSO")


def test_aborted_transactions_travel_with_records_sent_from_the_file(server) -> None:
    """A slice large enough for sendfile is encoded around the file range: its aborted list must still be there."""
    big = RawTransactions(server.port, "rc-big").init()
    assert big.write(TOPIC, 0, b"x" * (200 * 1024)) == 0
    big.abort()  # 1
    assert plain(server.port, TOPIC, b"after") == 2
    part = fetch(server.port, READ_COMMITTED)
    assert len(part.records) > 64 * 1024 and part.last_stable_offset == 3
    assert [(t.producer_id, t.first_offset) for t in part.aborted_transactions] == [(big.producer_id, 0)]
    assert confluent_read_committed(server.bootstrap) == [b"after"]


def test_replicas_index_the_same_aborts_and_a_new_leader_serves_read_committed(tmp_path, etcd) -> None:
    """Followers rebuild producer state and `.txnindex` from the leader's batches: byte-identical files, and after
    the leader's SIGKILL the new leader answers read_committed readers as the old one did."""
    # `__transaction_state` on both nodes (one partition), writable by the survivor alone after the kill.
    cluster = start_replicated_cluster(tmp_path, etcd, 2, topic_manifest(TOPIC, 1, replicas=2), extra=(
        "--override", "transaction.state.log.num.partitions=1", "--override",
        "transaction.state.log.replication.factor=2", "--override", "transaction.state.log.min.isr=1"))
    try:
        leader = cluster.wait_for_isr(TOPIC, 0).leader
        port = cluster.servers[leader].port

        def producer(tid: str) -> RawTransactions:
            return RawTransactions(coordinator_port(port, tid), tid, leader_port=port).init()

        a, b, c = producer("rc-a"), producer("rc-b"), producer("rc-c")
        assert plain(port, TOPIC, b"p0") == 0  # acks=all: answered once the follower has it
        assert a.write(TOPIC, 0, b"a1") == 1
        assert b.write(TOPIC, 0, b"b1") == 2
        a.abort()  # 3
        assert b.write(TOPIC, 0, b"b2") == 4
        b.commit()  # 5
        assert c.write(TOPIC, 0, b"c1") == 6  # open
        wait_for(lambda: cluster.high_watermark(TOPIC, 0) == 7, 30, what="the markers to replicate")
        part = fetch(port, READ_COMMITTED)
        assert (part.high_watermark, part.last_stable_offset) == (7, 6)
        assert [(t.producer_id, t.first_offset) for t in part.aborted_transactions] == [(a.producer_id, 1)]
        assert confluent_read_committed(cluster.bootstrap) == [b"p0", b"b1", b"b2"]
        cluster.wait_identical_below(TOPIC, 0, 7, (0, 1))
        follower = 1 - leader
        indexes = [partition_dir(cluster.data_dir(n), TOPIC, 0) / "00000000000000000000.txnindex" for n in (0, 1)]
        assert indexes[0].read_bytes() == indexes[1].read_bytes() == AbortedTxn(a.producer_id, 1, 3, 2).encode()

        cluster.kill(leader)
        assert cluster.wait_for_leader(TOPIC, 0, excluding=(leader,)).leader == follower
        port = cluster.servers[follower].port
        wait_for(lambda: latest(port, READ_COMMITTED) == 6, 30, what="the new leader's LSO")
        part = fetch(port, READ_COMMITTED)
        assert [(t.producer_id, t.first_offset) for t in part.aborted_transactions] == [(a.producer_id, 1)]
        assert confluent_read_committed(cluster.servers[follower].bootstrap) == [b"p0", b"b1", b"b2"]
        c.port = coordinator_port(port, "rc-c")  # the surviving node coordinates every id now
        wait_for(lambda: c.end(True) == 0, 30, what="the commit of rc-c")  # the marker at 7
        wait_for(lambda: latest(port, READ_COMMITTED) == 8, 30, what="the LSO past the commit")
        assert confluent_read_committed(cluster.servers[follower].bootstrap) == [b"p0", b"b1", b"b2", b"c1"]
    finally:
        cluster.stop()
