"""The sidecar's Kafka server against real, unmodified clients (kafka-python and aiokafka)."""

from __future__ import annotations

import asyncio
import logging
import socket
import struct
import threading
import time

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.structs import TopicPartition as AioTP
from kafka import KafkaConsumer, KafkaProducer
from kafka import TopicPartition as KTP
from kafka.errors import KafkaError

from shale.sidecar.log.log_dir import LogDir
from shale.sidecar.log.topic_partition import TopicPartition as SidecarTP
from shale.sidecar.server.apis.broker import Broker
from shale.sidecar.topic_config import TopicConfig
from shale.sidecar.topics.registry import NodeAddress, TopicRegistry, TopicSpec

TOPICS = {
    "kp-acks1": 2,
    "kp-acksall": 1,
    "kp-gzip": 1,
    "kp-acks0": 1,
    "aio": 2,
    "offsets": 1,
    "after-bad-frame": 1,
    "pipelined": 1,
}


class BrokerThread:
    """The broker on its own event loop in a background thread, as it will run in the sidecar."""

    def __init__(self, path: str) -> None:
        cfg = TopicConfig.from_mapping({})
        self.log_dir = LogDir(path, lambda topic: cfg)
        self.registry = TopicRegistry(self.log_dir, NodeAddress(0, "127.0.0.1", 0))
        for name, parts in TOPICS.items():
            self.registry.put(TopicSpec(name, parts, cfg))
        self.broker = Broker(self.registry, host="127.0.0.1", port=0)
        self.loop = asyncio.new_event_loop()
        self._started = threading.Event()
        self._stop: asyncio.Event | None = None
        self._error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name="shale-broker", daemon=True)

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_until_complete(self._main())
        except BaseException as exc:  # noqa: BLE001 - reported to the test thread
            self._error = exc
            self._started.set()
        finally:
            self.loop.close()

    async def _main(self) -> None:
        self._stop = asyncio.Event()
        await self.broker.start()
        self.registry.node = NodeAddress(0, "127.0.0.1", self.broker.port)
        self._started.set()
        await self._stop.wait()
        await self.broker.close()

    def start(self) -> "BrokerThread":
        self.thread.start()
        assert self._started.wait(10), "broker did not start"
        if self._error:
            raise self._error
        return self

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self._stop.set)
        self.thread.join(10)
        assert not self.thread.is_alive()
        self.log_dir.close()
        if self._error:
            raise self._error

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.broker.port}"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    b = BrokerThread(str(tmp_path_factory.mktemp("logdir"))).start()
    yield b
    b.stop()


def _produce_kp(server, topic: str, messages, **config) -> list:
    producer = KafkaProducer(bootstrap_servers=server.bootstrap, linger_ms=5, **config)
    try:
        futures = [producer.send(topic, key=k, value=v, partition=p) for p, k, v in messages]
        producer.flush(10)
        return [f.get(timeout=10) for f in futures]
    finally:
        producer.close(5)


def _consume_kp(server, tps: list[KTP], count: int) -> list:
    consumer = KafkaConsumer(bootstrap_servers=server.bootstrap, group_id=None, enable_auto_commit=False,
                             fetch_max_wait_ms=200)
    try:
        consumer.assign(tps)
        consumer.seek_to_beginning()
        got = []
        deadline = time.monotonic() + 15
        while len(got) < count and time.monotonic() < deadline:
            for records in consumer.poll(timeout_ms=200).values():
                got.extend(records)
        return got
    finally:
        consumer.close()


def _messages(n: int, partitions: int, tag: str) -> list[tuple[int, bytes, bytes]]:
    return [(i % partitions, f"{tag}-k{i}".encode(), f"{tag}-v{i}".encode() * (1 + i % 7)) for i in range(n)]


def _check_roundtrip(sent, metas, got) -> None:
    assert len(got) == len(sent)
    # Offsets assigned per partition, in send order, from 0.
    per_partition: dict[int, list] = {}
    for (p, k, v), meta in zip(sent, metas):
        assert meta.partition == p
        per_partition.setdefault(p, []).append((meta.offset, k, v))
    for p, rows in per_partition.items():
        assert [o for o, _, _ in rows] == list(range(len(rows)))
    read = {}
    for r in got:
        read.setdefault(r.partition, []).append((r.offset, r.key, r.value))
    assert read == per_partition


@pytest.mark.parametrize("topic,config", [
    ("kp-acks1", {"acks": 1}),
    ("kp-acksall", {"acks": "all", "enable_idempotence": False}),
    ("kp-gzip", {"acks": 1, "compression_type": "gzip"}),
])
def test_kafka_python_produce_and_consume(server, topic, config):
    parts = TOPICS[topic]
    sent = _messages(40, parts, topic)
    metas = _produce_kp(server, topic, sent, **config)
    got = _consume_kp(server, [KTP(topic, p) for p in range(parts)], len(sent))
    _check_roundtrip(sent, metas, got)
    if "compression_type" in config:  # the batches were stored as the client compressed them
        stored = server.log_dir.get_or_create(SidecarTP(topic, 0)).read(0, 1 << 20).read()
        assert struct.unpack_from(">h", stored, 21)[0] & 0x7 == 1  # attributes: gzip


def test_kafka_python_acks0(server):
    """acks=0: the broker appends and sends no response; the records are there to read."""
    topic = "kp-acks0"
    sent = _messages(20, 1, topic)
    _produce_kp(server, topic, sent, acks=0)
    got = _consume_kp(server, [KTP(topic, 0)], len(sent))
    assert [(r.offset, r.key, r.value) for r in got] == [(i, k, v) for i, (_, k, v) in enumerate(sent)]


def test_aiokafka_produce_and_consume(server):
    topic, parts = "aio", TOPICS["aio"]
    sent = _messages(30, parts, "aio")

    async def run():
        producer = AIOKafkaProducer(bootstrap_servers=server.bootstrap, acks="all")
        await producer.start()
        try:
            metas = [await (await producer.send(topic, key=k, value=v, partition=p)) for p, k, v in sent]
        finally:
            await producer.stop()
        consumer = AIOKafkaConsumer(bootstrap_servers=server.bootstrap, group_id=None, enable_auto_commit=False,
                                    fetch_max_wait_ms=200)
        await consumer.start()
        try:
            tps = [AioTP(topic, p) for p in range(parts)]
            consumer.assign(tps)
            await consumer.seek_to_beginning(*tps)
            got = []
            async with asyncio.timeout(15):
                while len(got) < len(sent):
                    for records in (await consumer.getmany(timeout_ms=200)).values():
                        got.extend(records)
            return metas, got
        finally:
            await consumer.stop()

    metas, got = asyncio.run(run())
    _check_roundtrip(sent, metas, got)


def test_fetch_waits_for_new_data(server):
    """A consumer parked at the log end gets a record produced while its fetch is waiting."""
    topic = "after-bad-frame"  # any topic; offsets checked relative to the current end
    consumer = KafkaConsumer(bootstrap_servers=server.bootstrap, group_id=None, enable_auto_commit=False,
                             fetch_max_wait_ms=5000)
    try:
        tp = KTP(topic, 0)
        consumer.assign([tp])
        consumer.seek_to_end()
        end = consumer.position(tp)
        assert consumer.poll(timeout_ms=300) == {}
        started = time.monotonic()
        threading.Timer(0.3, lambda: _produce_kp(server, topic, [(0, b"late", b"value")], acks=1)).start()
        got = []
        while not got and time.monotonic() - started < 4:
            got = consumer.poll(timeout_ms=200).get(tp, [])
        # Delivered well before the 5 s max wait: the append woke the fetch.
        assert time.monotonic() - started < 4
        assert [(r.offset, r.key, r.value) for r in got] == [(end, b"late", b"value")]
    finally:
        consumer.close()


def test_pipelined_answers_keep_request_order_behind_a_waiting_fetch(server):
    """One write carries a Fetch that waits at the log end, then ApiVersions, Metadata, a Produce to the very
    partition the Fetch waits on, and ListOffsets. The later requests are handled while the Fetch waits (the
    Produce wakes it, so it answers with that record, long before its max wait), yet every answer comes back
    in request order; then, with nothing ahead, requests are answered at once again, still in order."""
    from kafka.protocol.consumer.fetch import FetchRequest, FetchResponse
    from kafka.protocol.consumer.offsets import ListOffsetsRequest, ListOffsetsResponse
    from kafka.protocol.metadata.api_versions import ApiVersionsRequest, ApiVersionsResponse
    from kafka.protocol.metadata.metadata import MetadataRequest, MetadataResponse
    from kafka.protocol.producer.produce import ProduceRequest, ProduceResponse
    from kafka.record.default_records import DefaultRecordBatchBuilder

    from support.clients_util import build, read_frame, request_frame

    topic = "pipelined"
    end = server.registry.local_log(topic, 0).log_end_offset
    batch = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=0, producer_id=-1,
                                      producer_epoch=-1, base_sequence=-1, batch_size=1 << 20)
    batch.append(0, timestamp=1_700_000_000_000, key=b"k", value=b"woke the fetch", headers=[])
    requests = [
        (build(FetchRequest, {"max_wait_ms": 10_000, "min_bytes": 1, "max_bytes": 1 << 20, "topics": [
            {"topic": topic, "partitions": [{"partition": 0, "fetch_offset": end, "partition_max_bytes": 1 << 20}]}]},
            version=11), FetchResponse),
        (ApiVersionsRequest(version=2), ApiVersionsResponse),
        (build(MetadataRequest, {"topics": [{"name": topic}]}, version=9), MetadataResponse),
        (build(ProduceRequest, {"acks": 1, "timeout_ms": 5000, "topic_data": [{"name": topic, "partition_data": [
            {"index": 0, "records": bytes(batch.build())}]}]}, version=9), ProduceResponse),
        (build(ListOffsetsRequest, {"replica_id": -1, "topics": [
            {"name": topic, "partitions": [{"partition_index": 0, "timestamp": -1}]}]}, version=5), ListOffsetsResponse),
    ]
    with socket.create_connection(("127.0.0.1", server.broker.port), timeout=15) as sock:
        started = time.monotonic()
        sock.sendall(b"".join(request_frame(req, correlation_id=100 + i) for i, (req, _) in enumerate(requests)))
        answers = []
        for req, response_cls in requests:
            frame = read_frame(sock)
            assert frame is not None, "the server closed the connection"
            answers.append(response_cls.decode(frame, version=req.API_VERSION, header=True))
        assert time.monotonic() - started < 8  # the Produce woke the Fetch: not its 10 s max wait
        assert [a.header.correlation_id for a in answers] == [100, 101, 102, 103, 104]
        fetched, versions, metadata, produced, offsets = answers
        records = fetched.responses[0].partitions[0].records
        assert b"woke the fetch" in records
        assert versions.error_code == 0 and metadata.topics[0].name == topic
        assert produced.responses[0].partition_responses[0].base_offset == end
        assert offsets.topics[0].partitions[0].offset == end + 1

        # Nothing ahead now: each answered at once, in order, on the same connection.
        sock.sendall(b"".join(request_frame(ApiVersionsRequest(version=2), correlation_id=200 + i) for i in range(3)))
        assert [ApiVersionsResponse.decode(read_frame(sock), version=2, header=True).header.correlation_id
                for _ in range(3)] == [200, 201, 202]


def test_list_offsets(server):
    topic = "offsets"
    base = int(time.time() * 1000) - 100_000
    producer = KafkaProducer(bootstrap_servers=server.bootstrap, acks=1)
    try:
        metas = [producer.send(topic, value=b"x%d" % i, partition=0, timestamp_ms=base + 1000 * i)
                 for i in range(10)]
        producer.flush(10)
        assert [m.get(10).offset for m in metas] == list(range(10))
    finally:
        producer.close(5)
    tp = KTP(topic, 0)
    consumer = KafkaConsumer(bootstrap_servers=server.bootstrap, group_id=None, enable_auto_commit=False)
    try:
        assert consumer.beginning_offsets([tp]) == {tp: 0}
        assert consumer.end_offsets([tp]) == {tp: 10}
        found = consumer.offsets_for_times({tp: base + 3500})[tp]
        assert (found.offset, found.timestamp) == (4, base + 4000)
        assert consumer.offsets_for_times({tp: base + 99_000})[tp] is None
    finally:
        consumer.close()

    async def aio():
        c = AIOKafkaConsumer(bootstrap_servers=server.bootstrap, group_id=None, enable_auto_commit=False)
        await c.start()
        try:
            atp = AioTP(topic, 0)
            return (await c.beginning_offsets([atp]))[atp], (await c.end_offsets([atp]))[atp], \
                (await c.offsets_for_times({atp: base + 2000}))[atp]
        finally:
            await c.stop()

    begin, end, at = asyncio.run(aio())
    assert (begin, end, at.offset, at.timestamp) == (0, 10, 2, base + 2000)


def _raw_exchange(port: int, payload: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(payload)
        chunks = []
        while True:
            data = s.recv(65536)
            if not data:
                return b"".join(chunks)
            chunks.append(data)


def test_malformed_frames_close_only_that_connection(server, caplog):
    port = server.broker.port
    # Metadata v4 header with a client id, then a body cut short inside its topic array's length.
    bad = struct.pack(">hhih", 3, 4, 7, 3) + b"bad" + b"\xff\xff\xff"
    with caplog.at_level(logging.ERROR, logger="shale.sidecar.server.apis.broker"):
        assert _raw_exchange(port, struct.pack(">i", len(bad)) + bad) == b""  # closed, no reply
        assert _raw_exchange(port, struct.pack(">i", 200 * 1024 * 1024)) == b""  # over the frame limit
        assert _raw_exchange(port, struct.pack(">i", 3) + b"abc") == b""  # too short for a header
    messages = [r.getMessage() for r in caplog.records]
    assert any("'bad'" in m and "malformed" in m for m in messages), messages
    assert any("frame size" in m for m in messages), messages
    # The server still serves a normal client.
    sent = [(0, b"k", b"still alive")]
    metas = _produce_kp(server, "after-bad-frame", sent, acks=1)
    got = _consume_kp(server, [KTP("after-bad-frame", 0)], metas[0].offset + 1)
    assert (got[-1].offset, got[-1].key, got[-1].value) == (metas[0].offset, b"k", b"still alive")


def test_api_versions_too_new_gets_v0_unsupported_version(server):
    req = struct.pack(">hhih", 18, 99, 42, 1) + b"c"
    reply = _raw_exchange_one(server.broker.port, struct.pack(">i", len(req)) + req)
    size, corr, error, n = struct.unpack_from(">iihi", reply)
    assert (corr, error, n) == (42, 35, 1)
    assert struct.unpack_from(">hhh", reply, 14) == (18, 0, 4)


def _raw_exchange_one(port: int, payload: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(payload)
        buf = b""
        while len(buf) < 4 or len(buf) < 4 + struct.unpack_from(">i", buf)[0]:
            data = s.recv(65536)
            assert data, "connection closed before a reply"
            buf += data
        return buf


def test_produce_to_unknown_topic_fails(server):
    producer = KafkaProducer(bootstrap_servers=server.bootstrap, acks=1, max_block_ms=2000, retries=0)
    try:
        with pytest.raises(KafkaError):
            producer.send("no-such-topic", value=b"x").get(timeout=10)
    finally:
        producer.close(5)


def test_produce_to_unknown_partition_gets_error_code(server):
    """The broker's own answer (not the client's metadata check): UNKNOWN_TOPIC_OR_PARTITION per partition."""
    from kafka.protocol.producer.produce import ProduceRequest, ProduceResponse

    topic_cls = ProduceRequest._struct.fields["topic_data"].data_class  # nested structs must be instances
    part_cls = topic_cls._struct.fields["partition_data"].data_class
    req = ProduceRequest(version=9, transactional_id=None, acks=1, timeout_ms=1000, topic_data=[
        topic_cls(name="no-such-topic", partition_data=[part_cls(index=0, records=b"")]),
        topic_cls(name="aio", partition_data=[part_cls(index=99, records=b"")]),
    ])
    req.with_header(correlation_id=5, client_id="raw")
    reply = _raw_exchange_one(server.broker.port, req.encode(header=True, framed=True))
    resp = ProduceResponse.decode(reply[4:], version=9, header=True)
    codes = {(t.name, p.index): p.error_code for t in resp.responses for p in t.partition_responses}
    assert codes == {("no-such-topic", 0): 3, ("aio", 99): 3}
