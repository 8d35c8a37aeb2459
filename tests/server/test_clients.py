"""Unmodified Kafka clients against a real `shale serve` process.

Four clients, as applications use them: confluent-kafka (librdkafka 2.16), kafka-python 3, aiokafka and
Debian's `kcat` (librdkafka 2.0.2, the "old librdkafka" of kafka-protocol.md G3, in its own process).
Each one produces with every acks setting and every codec, reads everything back through manual
assignment, and lists offsets by time. What the clients see is checked against the bytes the server
wrote (`.log` files read directly): offsets, keys, values, headers, timestamps, and the codec each
batch was stored with — a broker that makes old librdkafka fall back to no compression (G3) fails here.
librdkafka also enables LZ4 only if the broker advertises FindCoordinator (rdkafka_feature.c), so the
lz4 cases need the group coordinator's APIs advertised.
"""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import confluent_kafka
import cramjam
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.structs import TopicPartition as AioTP
from confluent_kafka.admin import AdminClient, OffsetSpec
from kafka import KafkaConsumer, KafkaProducer
from kafka import TopicPartition as KpTP
from kafka.protocol.producer.produce import ProduceRequest, ProduceResponse
from kafka.protocol.producer.transaction import InitProducerIdRequest, InitProducerIdResponse

from shale.sidecar.log.compression import Compression, compress
from shale.sidecar.log.records import BATCH_OVERHEAD, Header, Record, TimestampType, decode_batch, encode_batch
from support.clients_util import build, call, raw_batches, stored_batches, stored_records
from support.node_util import ServeProcess, topic_manifest, write_manifests

KCAT = "/usr/bin/kcat"
CLIENTS = ("confluent", "kafka-python", "aiokafka", "kcat")
LIBRDKAFKA_CLIENTS = ("confluent", "kcat")
# (acks, codec): every acks setting, every codec, each with some acks setting.
CASES = {
    "acks0": (0, "none"),
    "acks1": (1, "none"),
    "acksall": (-1, "none"),
    "gzip": (1, "gzip"),
    "snappy": (-1, "snappy"),
    "lz4": (0, "lz4"),
    "zstd": (-1, "zstd"),
}
CODEC_IDS = {"none": Compression.NONE, "gzip": Compression.GZIP, "snappy": Compression.SNAPPY,
             "lz4": Compression.LZ4, "zstd": Compression.ZSTD}
PARTITIONS = 2
COUNT = 24
TIMES_TOPIC = "times"
TIMES_BASE = 1_700_000_000_000  # fixed CreateTime timestamps for the ListOffsets checks
IDEMPOTENT = ("confluent", "kafka-python", "aiokafka")


def _topic(client: str, case: str) -> str:
    return f"{client}-{case}"


@dataclass(frozen=True)
class Msg:
    """A record as sent (timestamp None: the client's clock) or as read back (with its offset)."""

    partition: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...]
    timestamp: int | None
    offset: int | None = None


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    if not Path(KCAT).exists():
        pytest.fail(f"{KCAT} is missing: `apt-get install kcat` (the Makefile installs it); it is the old-librdkafka "
                    f"client these tests need")
    base = tmp_path_factory.mktemp("clients")
    topics = [topic_manifest(_topic(c, case), PARTITIONS) for c in CLIENTS for case in CASES]
    topics += [topic_manifest(_topic(c, "idempotent"), PARTITIONS) for c in IDEMPOTENT]
    topics += [topic_manifest(TIMES_TOPIC, 1), topic_manifest("raw-idempotent", 1)]
    write_manifests(base / "topics" / "clients.yaml", *topics)
    proc = ServeProcess(base / "data", base / "topics").start()
    yield proc
    assert proc.proc.poll() is None, f"shale serve died during the client tests:\n{proc.log()[-5000:]}"
    assert proc.terminate() == 0, proc.log()[-5000:]


def _messages(topic: str, client: str, count: int = COUNT) -> list[Msg]:
    """Distinct keys, values and headers per record; a null key and a null value among them."""
    now = int(time.time() * 1000)
    out = []
    for i in range(count):
        key = None if i == 3 else f"{topic}-key-{i}".encode()
        value = None if i == 5 else f"{topic}-value-{i}-".encode() * (20 + i % 5)  # compressible
        if client == "kcat":  # text only, same headers for every record of a run, the client's clock
            out.append(Msg(i % PARTITIONS, key, value, (("kcat-h", b"x"), ("empty", b"")), None))
        else:
            value = value if value is None else value + bytes([0, 255, i])  # binary too
            headers = tuple((f"h{j}", f"{i}-{j}".encode()) for j in range(i % 3))
            out.append(Msg(i % PARTITIONS, key, value, headers, now - 60_000 + i))
    return out


# -- producers: return the acknowledged offset of every message (None with acks=0) ----------------------


def _produce_confluent(bootstrap: str, topic: str, msgs: list[Msg], acks: int, codec: str,
                       **extra) -> list[int | None]:
    producer = confluent_kafka.Producer({"bootstrap.servers": bootstrap, "acks": str(acks),
                                         "compression.type": codec, "linger.ms": 5, **extra})
    reports: dict[int, tuple] = {}
    for i, m in enumerate(msgs):
        producer.produce(topic, key=m.key, value=m.value, partition=m.partition, headers=list(m.headers),
                         timestamp=m.timestamp or 0,
                         on_delivery=lambda err, rec, i=i: reports.__setitem__(i, (err, rec)))
    try:
        remaining = producer.flush(20)
    except (confluent_kafka.KafkaException, SystemError) as exc:  # a fatal error surfaces from flush()
        raise AssertionError(f"confluent-kafka failed producing to {topic}: {exc.__cause__ or exc}") from exc
    assert remaining == 0, f"confluent-kafka did not deliver everything to {topic}"
    errors = {i: err for i, (err, _) in reports.items() if err is not None}
    assert not errors, f"delivery to {topic} failed: {errors}"
    return [None if acks == 0 else reports[i][1].offset() for i in range(len(msgs))]


def _produce_kafka_python(bootstrap: str, topic: str, msgs: list[Msg], acks: int, codec: str,
                          **extra) -> list[int | None]:
    # Idempotence is kafka-python 3's default; these cases are about acks and codecs (see test_idempotent_producer).
    config = {"acks": "all" if acks == -1 else acks, "linger_ms": 5, "max_block_ms": 15000,
              "enable_idempotence": False, **extra}
    if codec != "none":
        config["compression_type"] = codec
    producer = KafkaProducer(bootstrap_servers=bootstrap, **config)
    try:
        futures = [producer.send(topic, key=m.key, value=m.value, partition=m.partition, headers=list(m.headers),
                                 timestamp_ms=m.timestamp) for m in msgs]
        producer.flush(20)
        metas = [f.get(timeout=20) for f in futures]
    finally:
        producer.close(10)
    return [None if acks == 0 else meta.offset for meta in metas]


def _produce_aiokafka(bootstrap: str, topic: str, msgs: list[Msg], acks: int, codec: str,
                      **extra) -> list[int | None]:
    async def run():
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all" if acks == -1 else acks,
                                    compression_type=None if codec == "none" else codec, linger_ms=5, **extra)
        async with asyncio.timeout(30):
            await producer.start()
            try:
                futures = [await producer.send(topic, key=m.key, value=m.value, partition=m.partition,
                                               headers=list(m.headers), timestamp_ms=m.timestamp) for m in msgs]
                return [await f for f in futures]
            finally:
                await producer.stop()

    metas = asyncio.run(run())
    return [None if acks == 0 else meta.offset for meta in metas]


def _produce_kcat(bootstrap: str, topic: str, msgs: list[Msg], acks: int, codec: str) -> list[int | None]:
    """One kcat process per partition; `-v -v` makes it print each delivery report with its offset."""
    acked: dict[int, list[int]] = {}
    for p in range(PARTITIONS):
        lines = [f"{(m.key or b'').decode()}\t{(m.value or b'').decode()}" for m in msgs if m.partition == p]
        headers = [arg for name, value in msgs[0].headers for arg in ("-H", f"{name}={value.decode()}")]
        run = subprocess.run(
            [KCAT, "-b", bootstrap, "-P", "-v", "-v", "-t", topic, "-p", str(p), "-K", "\t", "-Z", *headers,
             "-X", f"acks={acks}", "-X", f"compression.codec={codec}", "-X", "linger.ms=5"],
            input="\n".join(lines) + "\n", capture_output=True, text=True, timeout=30)
        assert run.returncode == 0 and "delivery failed" not in run.stderr.lower(), f"kcat -P failed: {run.stderr}"
        reports = re.findall(r"Message delivered to partition (\d+) \(offset (-?\d+)\)", run.stderr)
        assert len(reports) == len(lines) and {int(q) for q, _ in reports} == {p}, run.stderr
        acked[p] = [int(o) for _, o in reports]
    if acks == 0:
        return [None] * len(msgs)
    return [acked[m.partition].pop(0) for m in msgs]


PRODUCERS = {"confluent": _produce_confluent, "kafka-python": _produce_kafka_python,
             "aiokafka": _produce_aiokafka, "kcat": _produce_kcat}


# -- consumers: manual assignment from the beginning, until `count` records ---------------------------


def _consume_confluent(bootstrap: str, topic: str, count: int) -> list[Msg]:
    consumer = confluent_kafka.Consumer({"bootstrap.servers": bootstrap, "group.id": f"{topic}-reader",
                                         "enable.auto.commit": False, "fetch.wait.max.ms": 100})
    got = []
    try:
        consumer.assign([confluent_kafka.TopicPartition(topic, p, confluent_kafka.OFFSET_BEGINNING)
                         for p in range(PARTITIONS)])
        deadline = time.monotonic() + 20
        while len(got) < count and time.monotonic() < deadline:
            m = consumer.poll(0.2)
            if m is None:
                continue
            assert m.error() is None, f"confluent-kafka read error on {topic}: {m.error()}"
            ts_type, ts = m.timestamp()
            assert ts_type == confluent_kafka.TIMESTAMP_CREATE_TIME
            got.append(Msg(m.partition(), m.key(), m.value(), tuple(m.headers() or ()), ts, m.offset()))
    finally:
        consumer.close()
    return got


def _consume_kafka_python(bootstrap: str, topic: str, count: int) -> list[Msg]:
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False,
                             fetch_max_wait_ms=100)
    got = []
    try:
        consumer.assign([KpTP(topic, p) for p in range(PARTITIONS)])
        consumer.seek_to_beginning()
        deadline = time.monotonic() + 20
        while len(got) < count and time.monotonic() < deadline:
            for records in consumer.poll(timeout_ms=200).values():
                for r in records:
                    assert r.timestamp_type == 0  # CreateTime
                    got.append(Msg(r.partition, r.key, r.value, tuple(r.headers), r.timestamp, r.offset))
    finally:
        consumer.close()
    return got


def _consume_aiokafka(bootstrap: str, topic: str, count: int) -> list[Msg]:
    async def run():
        consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False,
                                    fetch_max_wait_ms=100)
        await consumer.start()
        got = []
        try:
            tps = [AioTP(topic, p) for p in range(PARTITIONS)]
            consumer.assign(tps)
            await consumer.seek_to_beginning(*tps)
            async with asyncio.timeout(20):
                while len(got) < count:
                    for records in (await consumer.getmany(timeout_ms=200)).values():
                        for r in records:
                            assert r.timestamp_type == 0
                            got.append(Msg(r.partition, r.key, r.value, tuple(r.headers), r.timestamp, r.offset))
        finally:
            await consumer.stop()
        return got

    return asyncio.run(run())


def _consume_kcat(bootstrap: str, topic: str, count: int) -> list[Msg]:
    got = []
    for p in range(PARTITIONS):
        run = subprocess.run([KCAT, "-b", bootstrap, "-C", "-t", topic, "-p", str(p), "-o", "beginning", "-e", "-J"],
                             capture_output=True, text=True, timeout=30)
        assert run.returncode == 0, f"kcat -C failed: {run.stderr}"
        for line in run.stdout.splitlines():
            r = json.loads(line)
            assert r["tstype"] == "create"
            h = r["headers"] or []
            headers = tuple((h[i], h[i + 1].encode()) for i in range(0, len(h), 2))
            got.append(Msg(r["partition"], None if r["key"] is None else r["key"].encode(),
                           None if r["payload"] is None else r["payload"].encode(), headers, r["ts"], r["offset"]))
    return got


CONSUMERS = {"confluent": _consume_confluent, "kafka-python": _consume_kafka_python,
             "aiokafka": _consume_aiokafka, "kcat": _consume_kcat}


# -- checks ------------------------------------------------------------------------------------------


def _expected(msgs: list[Msg]) -> list[Msg]:
    """The messages with the offsets a broker must give them: per partition, in send order, from 0."""
    next_offset = [0] * PARTITIONS
    out = []
    for m in msgs:
        out.append(Msg(m.partition, m.key, m.value, m.headers, m.timestamp, next_offset[m.partition]))
        next_offset[m.partition] += 1
    return out


def _on_disk(data_dir: Path, topic: str) -> list[Msg]:
    out = []
    for p in range(PARTITIONS):
        for r in stored_records(data_dir, topic, p):
            out.append(Msg(p, r.key, r.value, tuple((h.key, h.value) for h in r.headers), r.timestamp, r.offset))
    return out


def _order(msgs: list[Msg]) -> list[Msg]:
    return sorted(msgs, key=lambda m: (m.partition, m.offset))


def _check_roundtrip(server: ServeProcess, topic: str, sent: list[Msg], acked: list[int | None],
                     read: list[Msg], started_ms: int, finished_ms: int) -> None:
    expected = _expected(sent)
    if acked[0] is not None:
        assert acked == [m.offset for m in expected], f"{topic}: acknowledged offsets"
    disk = _on_disk(Path(server.data_dir), topic)
    if sent[0].timestamp is None:  # the client's clock: take the stored timestamps, check they are from the run
        stamps = {(m.partition, m.offset): m.timestamp for m in disk}
        assert all(started_ms - 1000 <= ts <= finished_ms + 1000 for ts in stamps.values()), stamps
        expected = [Msg(m.partition, m.key, m.value, m.headers, stamps.get((m.partition, m.offset)), m.offset)
                    for m in expected]
    assert _order(disk) == _order(expected), f"{topic}: the records in the .log files"
    assert _order(read) == _order(expected), f"{topic}: the records the client read back"


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("client", CLIENTS)
def test_produce_and_read_back(server, client, case):
    acks, codec = CASES[case]
    topic = _topic(client, case)
    sent = _messages(topic, client)
    started = int(time.time() * 1000)
    acked = PRODUCERS[client](server.bootstrap, topic, sent, acks, codec)
    finished = int(time.time() * 1000)
    read = CONSUMERS[client](server.bootstrap, topic, len(sent))
    _check_roundtrip(server, topic, sent, acked, read, started, finished)
    # The batches were stored as the client compressed them (G3: old librdkafka disables codecs if the
    # broker advertises Produce min 3), with the client's CreateTime.
    raw = [rw for p in range(PARTITIONS) for rw in raw_batches(server.data_dir, topic, p)]
    batches = [decode_batch(data, where) for data, where in raw]
    assert batches
    assert CODEC_IDS[codec] in {b.header.compression for b in batches}, f"{client} {case}: no {codec} batch"
    for batch, (data, where) in zip(batches, raw):
        stored = batch.header.compression
        assert stored == CODEC_IDS[codec] or _librdkafka_sends_uncompressed(client, codec, data), (
            f"{client} {case}: batch at {where} stored with {stored.name}")
    assert {b.header.timestamp_type for b in batches} == {TimestampType.CREATE_TIME}


def _librdkafka_sends_uncompressed(client: str, codec: str, raw_batch: bytes) -> bool:
    """True if librdkafka would send this batch's records uncompressed under `codec`.

    librdkafka (rd_kafka_msgset_writer_compress) throws the compressed form away when it is larger
    than the records, as a one-record batch with a null value is. Its snappy is raw, unframed.
    """
    if client not in LIBRDKAFKA_CLIENTS:
        return False
    records = raw_batch[BATCH_OVERHEAD:]
    compressed = (cramjam.snappy.compress_raw(records) if codec == "snappy"
                  else compress(CODEC_IDS[codec], records))
    return len(compressed) > len(records)


# -- ListOffsets ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def times_topic(server) -> str:
    """Ten records at TIMES_BASE + 1000 * i, offsets 0..9."""
    msgs = [Msg(0, b"t%d" % i, b"v%d" % i, (), TIMES_BASE + 1000 * i) for i in range(10)]
    assert _produce_confluent(server.bootstrap, TIMES_TOPIC, msgs, -1, "none") == list(range(10))
    return TIMES_TOPIC


# (target timestamp, offset found or None) per Kafka's ListOffsets: first record at or after the target.
TIME_QUERIES = [(TIMES_BASE, 0), (TIMES_BASE + 3500, 4), (TIMES_BASE + 9000, 9), (TIMES_BASE + 99_000, None)]


def test_list_offsets_confluent(server, times_topic):
    consumer = confluent_kafka.Consumer({"bootstrap.servers": server.bootstrap, "group.id": "times-reader"})
    try:
        tp = confluent_kafka.TopicPartition(times_topic, 0)
        assert consumer.get_watermark_offsets(tp, timeout=10) == (0, 10)
        for ts, offset in TIME_QUERIES:
            [found] = consumer.offsets_for_times([confluent_kafka.TopicPartition(times_topic, 0, ts)], timeout=10)
            assert found.error is None and found.offset == (-1 if offset is None else offset), (ts, found)
    finally:
        consumer.close()
    admin = AdminClient({"bootstrap.servers": server.bootstrap})
    tp = confluent_kafka.TopicPartition(times_topic, 0)
    specs = {"earliest": OffsetSpec.earliest(), "latest": OffsetSpec.latest(),
             "max": OffsetSpec.max_timestamp(), "time": OffsetSpec.for_timestamp(TIMES_BASE + 3500)}
    got = {}
    for name, spec in specs.items():
        info = admin.list_offsets({tp: spec}, request_timeout=10)[tp].result(timeout=15)
        got[name] = (info.offset, info.timestamp)
    assert got["earliest"][0] == 0 and got["latest"][0] == 10
    assert got["max"] == (9, TIMES_BASE + 9000)
    assert got["time"] == (4, TIMES_BASE + 4000)


def test_list_offsets_kafka_python(server, times_topic):
    consumer = KafkaConsumer(bootstrap_servers=server.bootstrap, group_id=None, enable_auto_commit=False)
    try:
        tp = KpTP(times_topic, 0)
        assert consumer.beginning_offsets([tp]) == {tp: 0}
        assert consumer.end_offsets([tp]) == {tp: 10}
        for ts, offset in TIME_QUERIES:
            found = consumer.offsets_for_times({tp: ts})[tp]
            if offset is None:
                assert found is None, (ts, found)
            else:
                assert (found.offset, found.timestamp) == (offset, TIMES_BASE + 1000 * offset), (ts, found)
    finally:
        consumer.close()


def test_list_offsets_aiokafka(server, times_topic):
    async def run():
        consumer = AIOKafkaConsumer(bootstrap_servers=server.bootstrap, group_id=None, enable_auto_commit=False)
        await consumer.start()
        try:
            tp = AioTP(times_topic, 0)
            begin = (await consumer.beginning_offsets([tp]))[tp]
            end = (await consumer.end_offsets([tp]))[tp]
            found = [(await consumer.offsets_for_times({tp: ts}))[tp] for ts, _ in TIME_QUERIES]
            return begin, end, found
        finally:
            await consumer.stop()

    begin, end, found = asyncio.run(run())
    assert (begin, end) == (0, 10)
    for (ts, offset), f in zip(TIME_QUERIES, found):
        if offset is None:
            assert f is None, (ts, f)
        else:
            assert (f.offset, f.timestamp) == (offset, TIMES_BASE + 1000 * offset), (ts, f)


def test_list_offsets_kcat(server, times_topic):
    """kcat -Q: -2 earliest, -1 latest, else the first offset at or after the time (-1 if none)."""
    queries = [(-2, 0), (-1, 10)] + [(ts, -1 if offset is None else offset) for ts, offset in TIME_QUERIES]
    for ts, offset in queries:
        run = subprocess.run([KCAT, "-b", server.bootstrap, "-Q", "-t", f"{times_topic}:0:{ts}"],
                             capture_output=True, text=True, timeout=30)
        assert run.returncode == 0, run.stderr
        assert run.stdout.split() == [times_topic, "[0]", "offset", str(offset)], (ts, run.stdout, run.stderr)


# -- idempotent producers (InitProducerId) -------------------------------------------------------------


def _check_idempotent_batches(server: ServeProcess, topic: str, sent: list[Msg]) -> None:
    """Each partition's batches carry one producer id and epoch, and sequences that count its records from 0."""
    for p in range(PARTITIONS):
        batches = stored_batches(server.data_dir, topic, p)
        assert batches, f"nothing stored in {topic}-{p}"
        assert len({(b.header.producer_id, b.header.producer_epoch) for b in batches}) == 1
        assert batches[0].header.producer_id >= 0 and batches[0].header.producer_epoch >= 0, \
            f"{topic}-{p} was not written by an idempotent producer: {batches[0].header}"
        sequence = 0
        for b in batches:
            assert b.header.base_sequence == sequence, f"{topic}-{p}: {b.header}"
            sequence += b.header.records_count
        assert sequence == sum(1 for m in sent if m.partition == p)


@pytest.mark.parametrize("client", IDEMPOTENT)
def test_idempotent_producer(server, client):
    """confluent with enable.idempotence, kafka-python with its defaults (idempotent since 3.0), aiokafka
    with enable_idempotence: all need InitProducerId, and every batch then carries producer id/sequence."""
    topic = _topic(client, "idempotent")
    sent = _messages(topic, client)
    if client == "confluent":
        acked = _produce_confluent(server.bootstrap, topic, sent, -1, "none", **{"enable.idempotence": True})
    elif client == "kafka-python":
        producer_defaults = KafkaProducer.DEFAULT_CONFIG
        assert producer_defaults["enable_idempotence"] is True and producer_defaults["acks"] == -1
        producer = KafkaProducer(bootstrap_servers=server.bootstrap, max_block_ms=15000)  # defaults only
        try:
            futures = [producer.send(topic, key=m.key, value=m.value, partition=m.partition,
                                     headers=list(m.headers), timestamp_ms=m.timestamp) for m in sent]
            producer.flush(20)
            acked = [f.get(timeout=20).offset for f in futures]
        finally:
            producer.close(10)
    else:
        acked = _produce_aiokafka(server.bootstrap, topic, sent, -1, "none", enable_idempotence=True)
    read = CONSUMERS[client](server.bootstrap, topic, len(sent))
    _check_roundtrip(server, topic, sent, acked, read, 0, 0)
    _check_idempotent_batches(server, topic, sent)


def _produce_raw(port: int, topic: str, batch: bytes) -> tuple[int, int]:
    req = build(ProduceRequest, {"transactional_id": None, "acks": -1, "timeout_ms": 5000, "topic_data": [
        {"name": topic, "partition_data": [{"index": 0, "records": batch}]}]}, 9)
    [part] = call(port, req, ProduceResponse, client_id="raw-idempotent").responses[0].partition_responses
    return part.error_code, part.base_offset


def test_idempotent_retry_is_deduplicated(server):
    """A producer retrying a batch the broker already has gets the first append's offset, and the log
    holds the batch once (Kafka's producer state, kafka-protocol.md G11)."""
    topic = "raw-idempotent"
    init = build(InitProducerIdRequest, {"transactional_id": None, "transaction_timeout_ms": 60000,
                                         "producer_id": -1, "producer_epoch": -1}, 4)
    resp = call(server.port, init, InitProducerIdResponse, client_id="raw-idempotent")
    assert resp.error_code == 0 and resp.producer_id >= 0 and resp.producer_epoch >= 0, resp
    pid, epoch = resp.producer_id, resp.producer_epoch
    now = int(time.time() * 1000)

    def batch(sequence: int, n: int) -> bytes:
        records = [Record(i, now + i, b"k%d" % (sequence + i), b"v%d" % (sequence + i), (Header("h", b"1"),))
                   for i in range(n)]
        return encode_batch(records, producer_id=pid, producer_epoch=epoch, base_sequence=sequence)

    first = batch(0, 3)
    assert _produce_raw(server.port, topic, first) == (0, 0)
    assert _produce_raw(server.port, topic, first) == (0, 0)  # the retry: same answer, not appended again
    assert _produce_raw(server.port, topic, batch(3, 2)) == (0, 3)  # the next sequence goes on at offset 3
    stored = stored_batches(server.data_dir, topic, 0)
    assert [(b.header.base_offset, b.header.base_sequence, b.header.records_count) for b in stored] == \
        [(0, 0, 3), (3, 3, 2)]
    assert all(b.header.producer_id == pid for b in stored)
