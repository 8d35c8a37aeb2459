"""Incremental fetch sessions (KIP-227) on a real `shale serve`: raw Fetch v12 requests built by kafka-python's
own protocol classes on one connection, and kafka-python's consumer, which asks for a session by itself.

The failure cases of docs/fetch-sessions.md that need a process: a stale epoch, an unknown session, and a
restarted node that lost its sessions.
"""

from __future__ import annotations

import socket
import time

import pytest
from kafka import KafkaConsumer, KafkaProducer
from kafka import TopicPartition as KTP
from kafka.protocol.consumer.fetch import FetchRequest, FetchResponse

from support.clients_util import build, read_frame, request_frame
from support.node_util import ServeProcess, fetch_sessions, topic_manifest, wait_for, write_manifests

TOPIC = "sessioned"
PARTITIONS = 3
FETCH_SESSION_ID_NOT_FOUND, INVALID_FETCH_SESSION_EPOCH = 70, 71


@pytest.fixture
def node(tmp_path):
    write_manifests(tmp_path / "topics" / "t.yaml", topic_manifest(TOPIC, PARTITIONS))
    proc = ServeProcess(tmp_path / "data", tmp_path / "topics").start()
    yield proc
    if proc.proc.poll() is None:
        assert proc.terminate() == 0, proc.log()[-3000:]


class Fetcher:
    """One connection sending Fetch v12 with session fields, as a consumer with a session does."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=15)
        self.correlation_id = 0

    def fetch(self, session_id: int, epoch: int, offsets: dict[int, int], *, forgotten: tuple[int, ...] = (),
              max_wait_ms: int = 0) -> FetchResponse:
        self.correlation_id += 1
        request = build(FetchRequest, {
            "replica_id": -1, "max_wait_ms": max_wait_ms, "min_bytes": 1, "max_bytes": 1 << 20,
            "isolation_level": 0, "session_id": session_id, "session_epoch": epoch, "rack_id": "",
            "topics": [{"topic": TOPIC, "partitions": [{
                "partition": p, "current_leader_epoch": -1, "fetch_offset": o, "last_fetched_epoch": -1,
                "log_start_offset": -1, "partition_max_bytes": 1 << 20} for p, o in offsets.items()]}] if offsets else [],
            "forgotten_topics_data": [{"topic": TOPIC, "partitions": list(forgotten)}] if forgotten else []}, 12)
        self.sock.sendall(request_frame(request, self.correlation_id))
        reply = read_frame(self.sock)
        assert reply is not None, "the server closed the connection instead of answering the Fetch"
        return FetchResponse.decode(reply, version=12, header=True)

    def close(self) -> None:
        self.sock.close()


def _answered(resp: FetchResponse) -> dict[int, tuple[int, int]]:
    """partition -> (records' bytes, high watermark) for each partition in the answer."""
    return {p.partition_index: (len(p.records or b""), p.high_watermark) for t in resp.responses for p in t.partitions}


def _produce(port: int, partition: int, count: int) -> None:
    producer = KafkaProducer(bootstrap_servers=f"127.0.0.1:{port}", acks=1, enable_idempotence=False)
    try:
        for i in range(count):
            producer.send(TOPIC, value=b"v%d" % i, partition=partition)
        producer.flush(15)
    finally:
        producer.close()


def test_a_session_answers_only_the_partitions_that_changed(node):
    fetcher = Fetcher(node.port)
    try:
        full = fetcher.fetch(0, 0, {p: 0 for p in range(PARTITIONS)})
        assert full.error_code == 0 and full.session_id > 0
        assert _answered(full) == {p: (0, 0) for p in range(PARTITIONS)}  # a full answer names every partition
        assert fetch_sessions(node.http_port) == (1, PARTITIONS)
        _produce(node.port, 1, 2)
        # No partition named: the session's three are read at their cached offsets; only partition 1 changed.
        changed = fetcher.fetch(full.session_id, 1, {}, max_wait_ms=5000)
        assert changed.error_code == 0 and changed.session_id == full.session_id
        got = _answered(changed)
        assert list(got) == [1] and got[1][0] > 0 and got[1][1] == 2
        # Partition 1 moves on to offset 2; nothing else happens: an empty answer after the wait.
        started = time.monotonic()
        quiet = fetcher.fetch(full.session_id, 2, {1: 2}, max_wait_ms=300)
        assert (quiet.error_code, _answered(quiet)) == (0, {}) and time.monotonic() - started >= 0.25
        # A record for partition 0 wakes the session's wait although the request named only partition 1.
        _produce(node.port, 0, 1)
        woken = fetcher.fetch(full.session_id, 3, {}, max_wait_ms=5000)
        assert list(_answered(woken)) == [0]
        forgot = fetcher.fetch(full.session_id, 4, {0: 1}, forgotten=(2,))
        assert forgot.error_code == 0 and fetch_sessions(node.http_port) == (1, PARTITIONS - 1)
    finally:
        fetcher.close()


def test_stale_epoch_and_unknown_session_are_refused_and_change_nothing(node):
    fetcher = Fetcher(node.port)
    try:
        full = fetcher.fetch(0, 0, {0: 0, 1: 0})
        assert fetcher.fetch(full.session_id, 1, {}).error_code == 0
        stale = fetcher.fetch(full.session_id, 1, {0: 5})  # a retry of an epoch already taken
        assert (stale.error_code, stale.session_id, _answered(stale)) == (INVALID_FETCH_SESSION_EPOCH, 0, {})
        unknown = fetcher.fetch(full.session_id ^ 1, 1, {})
        assert (unknown.error_code, _answered(unknown)) == (FETCH_SESSION_ID_NOT_FOUND, {})
        # The session is as it was: epoch 2 goes through, still reading partition 0 from offset 0 (not 5).
        _produce(node.port, 0, 1)
        after = fetcher.fetch(full.session_id, 2, {}, max_wait_ms=5000)
        assert after.error_code == 0 and list(_answered(after)) == [0]
        assert after.responses[0].partitions[0].records  # offset 0: the record, not an out-of-range error
    finally:
        fetcher.close()


def test_restarted_node_lost_its_sessions_and_a_full_fetch_opens_a_new_one(node):
    fetcher = Fetcher(node.port)
    full = fetcher.fetch(0, 0, {0: 0})
    fetcher.close()
    assert node.terminate() == 0
    node.start()
    fetcher = Fetcher(node.port)
    try:
        assert fetcher.fetch(full.session_id, 1, {}).error_code == FETCH_SESSION_ID_NOT_FOUND
        again = fetcher.fetch(0, 0, {0: 0})
        assert again.error_code == 0 and again.session_id > 0 and _answered(again) == {0: (0, 0)}
    finally:
        fetcher.close()


def test_kafka_python_consumer_reads_every_record_through_a_session(node):
    """kafka-python 3 asks for a session (FetchSessionHandler) and fetches incrementally from then on."""
    consumer = KafkaConsumer(bootstrap_servers=f"127.0.0.1:{node.port}", group_id=None, enable_auto_commit=False,
                             fetch_max_wait_ms=200)
    try:
        tps = [KTP(TOPIC, p) for p in range(PARTITIONS)]
        consumer.assign(tps)
        consumer.seek_to_beginning()
        got: dict[int, list[bytes]] = {p: [] for p in range(PARTITIONS)}
        for wave, partition in enumerate((0, 2, 1, 2)):  # records arrive on one partition at a time
            _produce(node.port, partition, 5)
            deadline = time.monotonic() + 15
            while sum(map(len, got.values())) < 5 * (wave + 1) and time.monotonic() < deadline:
                for tp, records in consumer.poll(timeout_ms=200).items():
                    got[tp.partition] += [r.value for r in records]
            assert wait_for(lambda: fetch_sessions(node.http_port)[0] == 1, what="the consumer's fetch session")
        assert got == {0: [b"v%d" % i for i in range(5)], 1: [b"v%d" % i for i in range(5)],
                       2: [b"v%d" % i for i in range(5)] * 2}
    finally:
        consumer.close()


def test_under_an_authorizer_consumers_fetch_without_a_session(tmp_path):
    """A session's unnamed partitions would not be authorized again on each fetch, so consumers get none there."""
    write_manifests(tmp_path / "topics" / "t.yaml", topic_manifest(TOPIC, PARTITIONS))
    node = ServeProcess(tmp_path / "data", tmp_path / "topics", "--override", "authorizer.class.name=shale",
                        "--override", "allow.everyone.if.no.acl.found=true").start()
    fetcher = Fetcher(node.port)
    try:
        _produce(node.port, 0, 1)
        full = fetcher.fetch(0, 0, {0: 0, 1: 0})
        assert (full.error_code, full.session_id) == (0, 0)
        assert _answered(full)[0][0] > 0 and fetch_sessions(node.http_port) == (0, 0)
    finally:
        fetcher.close()
        assert node.terminate() == 0, node.log()[-3000:]
