"""Independent oracles: kafka-python and aiokafka (pure Python and Cython) read what Shale writes, and
Shale reads — and appends, stores and serves back — what their batch builders write, for every codec."""

from __future__ import annotations

import os

import pytest
from aiokafka.record import default_records as aio_default
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kafka.record import MemoryRecords as KafkaMemoryRecords
from kafka.record.default_records import DefaultRecordBatch as KafkaBatch
from kafka.record.default_records import DefaultRecordBatchBuilder as KafkaBuilder
from kafka.record.util import decode_varint as kafka_decode_varint
from kafka.record.util import encode_varint as kafka_encode_varint

from shale.sidecar.log.compression import Compression
from shale.sidecar.log.log import Log
from shale.sidecar.log.records import Record, TimestampType, check_batch, decode_batch, encode_batch
from shale.sidecar.log.varint import decode_varlong, encode_varint
from support.logtest_util import FakeClock, all_records, batch_specs, make_config

SETTINGS = settings(max_examples=60, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])

try:
    from aiokafka.record._crecords import DefaultRecordBatch as AioCBatch
    from aiokafka.record._crecords import DefaultRecordBatchBuilder as AioCBuilder
except ImportError:  # the wheel without extensions: only the pure-Python classes exist
    AioCBatch = AioCBuilder = None

DECODERS = {"kafka-python": KafkaBatch, "aiokafka-py": aio_default._DefaultRecordBatchPy}
BUILDERS = {"kafka-python": KafkaBuilder, "aiokafka-py": aio_default._DefaultRecordBatchBuilderPy}
if AioCBatch is not None:
    DECODERS["aiokafka-cython"] = AioCBatch
    BUILDERS["aiokafka-cython"] = AioCBuilder


def test_both_aiokafka_implementations_are_present() -> None:
    # The Cython extension ships in the pinned aiokafka wheel; the oracle must exercise it.
    assert AioCBatch is not None and "aiokafka-cython" in DECODERS
    assert aio_default.DefaultRecordBatch is AioCBatch


# --- Shale writes, the clients read -----------------------------------------------------------

@pytest.mark.parametrize("client", list(DECODERS))
@SETTINGS
@given(spec=batch_specs())
def test_clients_decode_what_shale_encodes(client, spec) -> None:
    kw, records = spec
    data = encode_batch(records, **kw)
    ours = check_batch(data)
    b = DECODERS[client](bytes(data))
    assert b.validate_crc()
    assert b.base_offset == kw["base_offset"]
    assert b.magic == 2
    assert b.compression_type == ours.compression
    assert b.timestamp_type == int(kw["timestamp_type"])
    assert b.is_transactional == kw["is_transactional"]
    assert b.is_control_batch == kw["is_control"]
    assert b.last_offset_delta == ours.last_offset_delta
    assert b.first_timestamp == ours.base_timestamp
    assert b.max_timestamp == ours.max_timestamp
    assert (b.producer_id, b.producer_epoch, b.base_sequence) == (kw["producer_id"], kw["producer_epoch"],
                                                                  kw["base_sequence"])
    assert b.next_offset == ours.next_offset
    got = [(r.offset, r.timestamp, r.key, r.value, list(r.headers)) for r in b]
    lat = kw["timestamp_type"] is TimestampType.LOG_APPEND_TIME
    want = [(r.offset, kw["max_timestamp"] if lat else r.timestamp, r.key, r.value,
             [(h.key, h.value) for h in r.headers]) for r in records]
    assert got == want


def test_kafka_python_reads_a_shale_segment_file_as_a_fetch_response(tmp_path) -> None:
    """A `.log` file is a plain record set: a client parses it batch by batch, as a Fetch response."""
    log = Log(str(tmp_path / "t-0"), make_config({"index.interval.bytes": 1}), clock=FakeClock())
    expected = []
    for i, codec in enumerate(list(Compression) * 2):
        recs = [(b"k%d" % j, b"value %d %d " % (i, j) * 5, 1000 + i) for j in range(3)]
        log.append(encode_batch([Record(j, ts, k, v) for j, (k, v, ts) in enumerate(recs)], compression=codec))
        expected += [(3 * i + j, 1000 + i, k, v) for j, (k, v, _ts) in enumerate(recs)]
    log.close()
    with open(log.segments[0].log_path, "rb") as f:
        mr = KafkaMemoryRecords(f.read())
    got = []
    codecs = []
    while True:
        batch = mr.next_batch()
        if batch is None:
            break
        assert batch.validate_crc()
        codecs.append(batch.compression_type)
        got += [(r.offset, r.timestamp, r.key, r.value) for r in batch]
    assert got == expected
    assert codecs == [int(c) for c in list(Compression) * 2]


@settings(max_examples=200, deadline=None)
@given(st.integers(-(2**63), 2**63 - 1))
def test_varints_match_kafka_python(value: int) -> None:
    out = bytearray()
    kafka_encode_varint(value, out.append)
    assert bytes(out) == encode_varint(value)
    assert kafka_decode_varint(bytes(out), 0) == decode_varlong(bytes(out), 0)


# --- the clients write, Shale reads, stores and serves ----------------------------------------

CLIENT_CODECS = [Compression.NONE, Compression.GZIP, Compression.SNAPPY, Compression.LZ4, Compression.ZSTD]

client_record = st.tuples(
    st.none() | st.binary(max_size=16),
    # Repetitive values so that compression pays off (the clients send uncompressed otherwise).
    st.none() | st.builds(lambda seed, n: seed * n, st.binary(min_size=1, max_size=8), st.integers(0, 60)),
    st.lists(st.tuples(st.text(max_size=6), st.none() | st.binary(max_size=8)), max_size=2),
    st.integers(0, 2**41),
)


def build_with(client: str, codec: Compression, recs, *, producer=(-1, -1, -1), transactional=False) -> bytes:
    builder = BUILDERS[client](2, int(codec), int(transactional), producer[0], producer[1], producer[2], 1 << 20)
    for i, (k, v, headers, ts) in enumerate(recs):
        assert builder.append(i, ts, k, v, headers) is not None
    return bytes(builder.build())


@pytest.mark.parametrize("codec", CLIENT_CODECS, ids=lambda c: c.config_name)
@pytest.mark.parametrize("client", list(BUILDERS))
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(recs=st.lists(client_record, min_size=1, max_size=8), head=st.lists(client_record, min_size=1, max_size=3))
def test_shale_decodes_appends_and_serves_client_batches(tmp_path_factory, client, codec, recs, head) -> None:
    data = build_with(client, codec, recs)
    h = check_batch(data)
    payload = sum(len(v or b"") for _k, v, _h, _t in recs)
    if codec is not Compression.NONE and payload > 200:
        assert h.compression is codec, "a compressible batch is sent compressed"
    decoded = decode_batch(data)
    want = [(i, ts, k, v, tuple((hk, hv) for hk, hv in hs)) for i, (k, v, hs, ts) in enumerate(recs)]
    assert [(r.offset, r.timestamp, r.key, r.value, tuple((x.key, x.value) for x in r.headers))
            for r in decoded.records] == want

    # Appended as a leader after other data: only the base offset changes, the CRC still holds.
    d = tmp_path_factory.mktemp("oracle")
    log = Log(str(d / "t-0"), make_config({"index.interval.bytes": 1}), clock=FakeClock())
    log.append(build_with(client, Compression.NONE, head))
    info = log.append(data)
    assert (info.first_offset, info.last_offset) == (len(head), len(head) + len(recs) - 1)
    sl = log.read(len(head), 1 << 20)
    stored = sl.read()
    assert stored[:8] == len(head).to_bytes(8, "big") and as_single_replica_stores(data)[8:] == stored[8:]
    # ... and the clients read what the log serves.
    b = DECODERS[client](stored)
    assert b.validate_crc()
    assert [(r.offset, r.key, r.value) for r in b] == [(len(head) + i, k, v) for i, (k, v, _h, _t) in enumerate(recs)]
    log.close()
    again = Log(str(d / "t-0"), make_config({"index.interval.bytes": 1}), clock=FakeClock(),
                had_clean_shutdown=False)
    assert [(r.offset, r.value) for r in all_records(again)][len(head):] == \
        [(len(head) + i, v) for i, (_k, v, _h, _t) in enumerate(recs)]
    again.close()


def as_single_replica_stores(batch: bytes) -> bytes:
    """A client's batch as a single-replica log keeps it: the producer's partition leader epoch (bytes 12-16,
    outside the CRC; kafka-python writes 0) becomes -1, "no epoch" — a log without replication has none."""
    return batch[:12] + b"\xff\xff\xff\xff" + batch[16:]


@pytest.mark.parametrize("client", ["kafka-python", "aiokafka-py"])
def test_idempotent_and_transactional_client_batches(tmp_path, client) -> None:
    recs = [(b"k", b"v" * 40, [], 1000 + i) for i in range(4)]
    if client == "kafka-python":
        builder = KafkaBuilder(2, int(Compression.ZSTD), 0, -1, -1, -1, 1 << 20)
        builder.set_producer_state(1234, 5, 77, True)
        for i, (k, v, hs, ts) in enumerate(recs):
            builder.append(i, ts, k, v, hs)
        data = bytes(builder.build())
    else:
        data = build_with(client, Compression.ZSTD, recs, producer=(1234, 5, 77), transactional=True)
    h = check_batch(data)
    assert (h.producer_id, h.producer_epoch, h.base_sequence, h.is_transactional) == (1234, 5, 77, True)
    assert h.compression is Compression.ZSTD
    assert [r.sequence for r in decode_batch(data).records] == [77, 78, 79, 80]
    log = Log(str(tmp_path / "t-0"), make_config(), clock=FakeClock())
    log.append(data)
    stored = log.read(0, 1 << 20).read()
    assert check_batch(stored).last_sequence == 80
    assert stored == as_single_replica_stores(data)


@pytest.mark.parametrize("codec", CLIENT_CODECS, ids=lambda c: c.config_name)
def test_clients_read_shale_compressed_batches_with_large_payloads(codec) -> None:
    """Several snappy/lz4 blocks (> 64 KiB) and the clients' own codec readers."""
    recs = [Record(i, 5000 + i, b"key-%d" % i, os.urandom(8) * 1500) for i in range(12)]
    data = encode_batch(recs, compression=codec)
    for client, dec in DECODERS.items():
        b = dec(data)
        assert b.validate_crc(), client
        assert [(r.offset, r.value) for r in b] == [(r.offset, r.value) for r in recs], client
