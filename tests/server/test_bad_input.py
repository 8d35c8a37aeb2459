"""Bad input never crashes `shale serve` and never changes what it stored.

Against a live server process: random frames, every truncation of real Produce/Fetch/Metadata frames,
impossible size prefixes, unknown API keys and versions, and Produce requests whose batches are
corrupt or break the topic's rules. Each answer is Kafka's (a closed connection for a frame it cannot
serve; KIP-511's v0 reply for a too-new ApiVersions; per-partition error codes for bad batches), the
server logs an error naming the client or the topic-partition, and afterwards the data directory is
byte-for-byte what it was (checkpoints aside) and a normal client is still served.
"""

from __future__ import annotations

import random
import socket
import struct
import time
import uuid
from pathlib import Path

import pytest
from kafka import KafkaConsumer, KafkaProducer
from kafka import TopicPartition as KpTP
from kafka.protocol.consumer.fetch import FetchRequest
from kafka.protocol.metadata.api_versions import ApiVersionsRequest, ApiVersionsResponse
from kafka.protocol.metadata.metadata import MetadataRequest
from kafka.protocol.producer.produce import ProduceRequest, ProduceResponse

from shale.sidecar.log.compression import Compression
from shale.sidecar.log.records import Record, compute_crc, encode_batch
from support.clients_util import build, call, closes_without_reply, exchange, file_state, read_frame, request_frame
from support.node_util import ServeProcess, topic_manifest, wait_for, write_manifests

PLAIN, TIMES, COMPACT = "bad-plain", "bad-times", "bad-compact"
MAX_MESSAGE_BYTES = 4096
HOUR_MS = 3_600_000
MAX_FRAME_BYTES = 100 * 1024 * 1024  # Kafka's socket.request.max.bytes default, the server's frame limit
CLIENT = "bad-client"

# Kafka error codes
CORRUPT_MESSAGE, MESSAGE_TOO_LARGE, INVALID_REQUIRED_ACKS = 2, 10, 21
INVALID_TIMESTAMP, UNSUPPORTED_VERSION, INVALID_RECORD = 32, 35, 87


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    base = tmp_path_factory.mktemp("bad-input")
    write_manifests(base / "topics" / "bad.yaml",
                    topic_manifest(PLAIN, 1, {"max.message.bytes": MAX_MESSAGE_BYTES}),
                    topic_manifest(TIMES, 1, {"message.timestamp.before.max.ms": HOUR_MS,
                                              "message.timestamp.after.max.ms": HOUR_MS}),
                    topic_manifest(COMPACT, 1, {"cleanup.policy": "compact"}))
    proc = ServeProcess(base / "data", base / "topics").start()
    producer = KafkaProducer(bootstrap_servers=proc.bootstrap, acks="all", enable_idempotence=False)
    try:  # real data to keep intact
        for topic in (PLAIN, TIMES, COMPACT):
            for i in range(20):
                producer.send(topic, key=b"seed-%d" % i, value=b"seed value %d" % i, partition=0)
        producer.flush(15)
    finally:
        producer.close(5)
    yield proc
    assert proc.proc.poll() is None, f"shale serve died:\n{proc.log()[-5000:]}"
    assert proc.terminate() == 0


@pytest.fixture
def unharmed(server):
    """Snapshot the data files; after the test, the server must be alive, the files unchanged, and a
    normal client served (its record lands right after the data that was there)."""
    data_dir = Path(server.data_dir)
    before = file_state(data_dir)
    log_start = len(server.log())
    yield lambda: server.log()[log_start:]
    assert server.proc.poll() is None, f"shale serve died:\n{server.log()[-5000:]}"
    changed = before.diff(file_state(data_dir))
    assert not changed, f"bad input changed stored data: {changed}"
    _normal_client_still_served(server)


def _normal_client_still_served(server: ServeProcess) -> None:
    producer = KafkaProducer(bootstrap_servers=server.bootstrap, acks="all", enable_idempotence=False)
    try:
        meta = producer.send(PLAIN, key=b"after", value=b"still served", partition=0).get(timeout=15)
    finally:
        producer.close(5)
    consumer = KafkaConsumer(bootstrap_servers=server.bootstrap, group_id=None, enable_auto_commit=False)
    try:
        tp = KpTP(PLAIN, 0)
        consumer.assign([tp])
        consumer.seek(tp, meta.offset)
        got = []
        deadline = time.monotonic() + 15
        while not got and time.monotonic() < deadline:
            got = consumer.poll(timeout_ms=200).get(tp, [])
        assert [(r.offset, r.key, r.value) for r in got[:1]] == [(meta.offset, b"after", b"still served")]
    finally:
        consumer.close()


def _frame(api_key: int, version: int, body: bytes = b"", correlation_id: int = 7, client_id: str = CLIENT) -> bytes:
    """A size-prefixed request with a v1 header (api key, version, correlation id, client id) and `body`."""
    cid = client_id.encode()
    payload = struct.pack(">hhih", api_key, version, correlation_id, len(cid)) + cid + body
    return struct.pack(">i", len(payload)) + payload


def _real_frames() -> dict[str, bytes]:
    """Frames as kafka-python (flexible versions) and aiokafka (older, non-flexible ones) send them."""
    batch = encode_batch([Record(i, int(time.time() * 1000), b"k%d" % i, b"v%d" % i) for i in range(3)])
    frames = {}
    for v in (9, 7):
        frames[f"Produce v{v}"] = build(ProduceRequest, {"transactional_id": None, "acks": -1, "timeout_ms": 5000,
                                                         "topic_data": [{"name": PLAIN, "partition_data": [
                                                             {"index": 0, "records": batch}]}]}, v)
    for v in (12, 11):
        frames[f"Fetch v{v}"] = build(FetchRequest, {
            "replica_id": -1, "max_wait_ms": 100, "min_bytes": 1, "max_bytes": 1 << 20, "isolation_level": 0,
            "session_id": 0, "session_epoch": -1, "rack_id": "",
            "topics": [{"topic": PLAIN, "partitions": [{"partition": 0, "fetch_offset": 0,
                                                        "partition_max_bytes": 1 << 20}]}],
            "forgotten_topics_data": []}, v)
    for v in (12, 5):
        frames[f"Metadata v{v}"] = build(MetadataRequest, {"topics": [{"name": PLAIN}],
                                                           "allow_auto_topic_creation": False}, v)
    return {name: request_frame(req, 9, CLIENT)[4:] for name, req in frames.items()}


# -- frames ----------------------------------------------------------------------------------------


def test_random_frames(server, unharmed):
    """Random bytes in a frame, and random bodies behind a known API key and version: the server
    answers well-formed frames or hangs up, and always closes a connection it cannot read."""
    rng = random.Random(2024)
    known = [(0, 9), (1, 12), (2, 7), (3, 12), (18, 3), (0, 3), (1, 4), (3, 0)]
    sent = 0
    for i in range(300):
        if i % 2:
            payload = rng.randbytes(rng.randrange(0, 200))
        else:
            key, version = rng.choice(known)
            payload = struct.pack(">hhi", key, version, i) + rng.randbytes(rng.randrange(0, 120))
        reply, closed = exchange(server.port, struct.pack(">i", len(payload)) + payload)
        assert closed
        while reply:  # anything that came back is whole response frames
            (size,) = struct.unpack_from(">i", reply)
            assert 4 <= size <= len(reply) - 4, reply[:64]
            reply = reply[4 + size:]
        sent += 1
    # A stream of garbage with no frame structure at all.
    for _ in range(20):
        exchange(server.port, rng.randbytes(rng.randrange(1, 5000)))
    assert sent == 300
    assert "malformed request frame" in unharmed()


def test_truncated_frames(server, unharmed):
    """Every prefix of real Produce, Fetch and Metadata frames: framed as a whole (size = prefix length),
    the server closes without answering; cut off on the wire, it closes without answering either."""
    frames = _real_frames()
    tried = 0
    for name, frame in frames.items():
        for cut in range(len(frame)):
            part = frame[:cut]
            assert closes_without_reply(server.port, struct.pack(">i", cut) + part), f"{name} cut at {cut}"
            reply, closed = exchange(server.port, struct.pack(">i", len(frame)) + part)
            assert closed and reply == b"", f"{name} cut on the wire at {cut}: {reply[:40]!r}"
            tried += 2
    assert tried == 2 * sum(len(f) for f in frames.values())
    log = unharmed()
    assert f"closing connection of client '{CLIENT}'" in log and "malformed request frame" in log


@pytest.mark.parametrize("size", [-1, -(2**31), MAX_FRAME_BYTES + 1, 2**31 - 1])
def test_impossible_size_prefix(server, unharmed, size):
    """Negative sizes and sizes over the frame limit close the connection before anything is read
    (Kafka's InvalidReceiveException), even with megabytes following."""
    assert closes_without_reply(server.port, struct.pack(">i", size))
    assert closes_without_reply(server.port, struct.pack(">i", size) + bytes(4 << 20))
    assert f"frame size {size} outside" in unharmed()


def test_oversized_request_is_refused_unread(server, unharmed):
    """A request just over the limit: the server hangs up instead of buffering 100 MiB."""
    payload = _frame(0, 9, bytes(64))[4:]
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        sock.sendall(struct.pack(">i", MAX_FRAME_BYTES + 1) + payload)
        sent = len(payload)
        with pytest.raises((BrokenPipeError, ConnectionResetError)):
            chunk = bytes(1 << 20)
            while sent < MAX_FRAME_BYTES:  # the server stops reading: writing fails long before the end
                sock.sendall(chunk)
                sent += len(chunk)
    assert sent < MAX_FRAME_BYTES
    assert "outside 0..104857600 bytes" in unharmed()


@pytest.mark.parametrize("api_key", [-1, 7, 99, 1000, 32767])
def test_unknown_api_key_closes_the_connection(server, unharmed, api_key):
    """Kafka cannot parse the header of an API it does not know, and closes the connection."""
    assert closes_without_reply(server.port, _frame(api_key, 0, b"\x00" * 16))
    assert f"closing connection of client '{CLIENT}'" in unharmed()


def _advertised(port: int) -> dict[int, tuple[int, int]]:
    resp = call(port, ApiVersionsRequest(version=3, client_software_name="t", client_software_version="1"),
                ApiVersionsResponse)
    assert resp.error_code == 0
    return {k.api_key: (k.min_version, k.max_version) for k in resp.api_keys}


def test_unknown_versions(server, unharmed):
    """A version outside the advertised range: ApiVersions answers at v0 with UNSUPPORTED_VERSION and
    its own range (KIP-511); every other API closes the connection, as Kafka does."""
    advertised = _advertised(server.port)
    assert advertised[18][0] == 0
    checked = expected = 0
    for key, (lo, hi) in sorted(advertised.items()):
        versions = sorted({hi + 1, 32767, -1, lo - 1})
        expected += len(versions)
        for version in versions:
            frame = _frame(key, version, b"\x00" * 32, correlation_id=1000 + version)
            if key == 18:
                with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
                    sock.sendall(frame)
                    reply = read_frame(sock)
                assert reply is not None, f"ApiVersions v{version}: no reply"
                resp = ApiVersionsResponse.decode(reply, version=0, header=True)
                assert resp.header.correlation_id == 1000 + version
                assert resp.error_code == UNSUPPORTED_VERSION
                assert [(k.api_key, k.min_version, k.max_version) for k in resp.api_keys] == [(18, *advertised[18])]
            else:
                assert closes_without_reply(server.port, frame), f"api {key} v{version}"
            checked += 1
    assert checked == expected and len(advertised) >= 5
    assert f"closing connection of client '{CLIENT}'" in unharmed()


def test_version_above_advertised_but_decodable_is_refused(server, unharmed):
    """Fetch v13 names topics by id; the server advertises Fetch up to 12 (kafka-protocol.md G6), so a
    v13 request gets Kafka's answer to a version it does not serve: the connection closes."""
    advertised = _advertised(server.port)
    assert advertised[1][1] < 13
    req = build(FetchRequest, {
        "replica_id": -1, "max_wait_ms": 10, "min_bytes": 0, "max_bytes": 1 << 20, "isolation_level": 0,
        "session_id": 0, "session_epoch": -1, "rack_id": "",
        "topics": [{"topic_id": uuid.uuid4(), "partitions": [{"partition": 0, "fetch_offset": 0,
                                                              "partition_max_bytes": 1 << 20}]}],
        "forgotten_topics_data": []}, 13)
    assert closes_without_reply(server.port, request_frame(req, 5, CLIENT))
    assert "Fetch v13 is not supported" in unharmed()


# -- Produce with bad batches ----------------------------------------------------------------------


def _now() -> int:
    return int(time.time() * 1000)


def _batch(n: int = 3, *, key: bytes | None = b"k", ts: int | None = None, value_size: int = 10,
           compression: Compression = Compression.NONE) -> bytearray:
    ts = _now() if ts is None else ts
    return bytearray(encode_batch([Record(i, ts, None if key is None else key + b"%d" % i, b"v" * value_size)
                                   for i in range(n)], compression=compression))


def _recrc(b: bytearray) -> bytes:
    struct.pack_into(">I", b, 17, compute_crc(b))
    return bytes(b)


def _bad_crc() -> bytes:
    b = _batch()
    b[-1] ^= 0x01  # a value byte: the stored CRC no longer matches
    return bytes(b)


def _magic(m: int) -> bytes:
    b = _batch()
    b[16] = m
    return bytes(b)


def _count(count: int, last_offset_delta: int | None = None, records: int = 3) -> bytes:
    """recordsCount (byte 57) and lastOffsetDelta (byte 23) rewritten under a recomputed CRC."""
    b = _batch(records)
    struct.pack_into(">i", b, 57, count)
    if last_offset_delta is not None:
        struct.pack_into(">i", b, 23, last_offset_delta)
    return _recrc(b)


def _declared_length(delta: int) -> bytes:
    b = _batch()
    (length,) = struct.unpack_from(">i", b, 8)
    struct.pack_into(">i", b, 8, length + delta)
    return bytes(b)


def _tiny_length() -> bytes:
    b = _batch()
    struct.pack_into(">i", b, 8, 5)  # below Kafka's minimum record overhead (14)
    return bytes(b)


BAD_BATCHES = {
    # name: (topic, records, acks, expected error code)
    "bad crc": (PLAIN, _bad_crc, -1, CORRUPT_MESSAGE),
    "magic 1": (PLAIN, lambda: _magic(1), -1, INVALID_RECORD),
    "magic 7": (PLAIN, lambda: _magic(7), -1, INVALID_RECORD),
    "count differs from offset range": (PLAIN, lambda: _count(4), -1, INVALID_RECORD),
    "count and range above the records": (PLAIN, lambda: _count(4, 3), -1, INVALID_RECORD),
    "count and range below the records": (PLAIN, lambda: _count(2, 1), -1, INVALID_RECORD),
    "count zero": (PLAIN, lambda: _count(0, -1), -1, INVALID_RECORD),
    "declared length past the end": (PLAIN, lambda: _declared_length(+10), -1, INVALID_RECORD),
    "declared length below the minimum": (PLAIN, _tiny_length, -1, CORRUPT_MESSAGE),
    "no batch at all": (PLAIN, lambda: b"", -1, INVALID_RECORD),
    "two batches": (PLAIN, lambda: bytes(_batch()) + bytes(_batch()), -1, INVALID_RECORD),
    "larger than max.message.bytes": (PLAIN, lambda: bytes(_batch(1, value_size=MAX_MESSAGE_BYTES)), -1,
                                      MESSAGE_TOO_LARGE),
    "null key on a compacted topic": (COMPACT, lambda: bytes(_batch(key=None)), 1, INVALID_RECORD),
    "compressed null key on a compacted topic": (COMPACT, lambda: bytes(_batch(key=None, compression=Compression.GZIP)),
                                                 1, INVALID_RECORD),
    "timestamp too old": (TIMES, lambda: bytes(_batch(ts=_now() - 2 * HOUR_MS)), -1, INVALID_TIMESTAMP),
    "timestamp too new": (TIMES, lambda: bytes(_batch(ts=_now() + 2 * HOUR_MS)), 1, INVALID_TIMESTAMP),
    "acks=5": (PLAIN, lambda: bytes(_batch()), 5, INVALID_REQUIRED_ACKS),
    "acks=-2": (PLAIN, lambda: bytes(_batch()), -2, INVALID_REQUIRED_ACKS),
}


@pytest.mark.parametrize("version", [9, 7])
@pytest.mark.parametrize("case", list(BAD_BATCHES))
def test_bad_produce_gets_kafkas_error_and_appends_nothing(server, unharmed, case, version):
    topic, make, acks, expected = BAD_BATCHES[case]
    req = build(ProduceRequest, {"transactional_id": None, "acks": acks, "timeout_ms": 5000, "topic_data": [
        {"name": topic, "partition_data": [{"index": 0, "records": make()}]}]}, version)
    client = f"bad-producer-{version}"
    resp = call(server.port, req, ProduceResponse, client_id=client)
    [part] = resp.responses[0].partition_responses
    assert (part.error_code, part.base_offset) == (expected, -1), f"{case}: {part}"
    # The refusal is logged with the client and the topic-partition (the server writes it asynchronously).
    wait_for(lambda: f"produce from client '{client}'" in unharmed(), 5, what="the refusal in the server log")
    line = next(ln for ln in unharmed().splitlines() if f"produce from client '{client}'" in ln)
    assert f"{topic}-0" in line and f"error {expected}" in line, line
