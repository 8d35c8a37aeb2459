"""The v2 record batch codec: round trips, varints, the CRC-32C and bad input (spec sections 1.1-1.6, 12)."""

from __future__ import annotations

import dataclasses
import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shale.sidecar.log.compression import Compression
from shale.sidecar.log.errors import CorruptRecordError
from shale.sidecar.log.records import (
    BATCH_OVERHEAD,
    BatchHeader,
    ControlType,
    Record,
    TimestampType,
    check_batch,
    compute_crc,
    decode_batch,
    encode_batch,
    encode_control_key,
    encode_end_txn_marker,
    encode_record,
    parse_control_key,
    parse_end_txn_marker,
    set_base_offset,
    set_partition_leader_epoch,
    with_base_offset,
)
from shale.sidecar.log.varint import decode_varint, decode_varlong, encode_varint, varint_size
from support.logtest_util import batch_specs

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1
INT64_MIN = -(2**63)


# --- an independent CRC-32C (Castagnoli, reflected polynomial 0x82F63B78) ---------------------

def _make_table() -> list[int]:
    table = []
    for n in range(256):
        c = n
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    return table


_TABLE = _make_table()


def crc32c_reference(data: bytes) -> int:
    crc = 0xFFFFFFFF
    for b in data:
        crc = _TABLE[(crc ^ b) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def test_reference_crc_is_crc32c() -> None:
    # The standard check value of CRC-32C.
    assert crc32c_reference(b"123456789") == 0xE3069283


# --- round trip -------------------------------------------------------------------------------

@SETTINGS
@given(batch_specs())
def test_any_batch_round_trips(spec) -> None:
    kw, records = spec
    data = encode_batch(records, **kw)
    decoded = decode_batch(data)
    h = decoded.header
    n = len(records)

    assert h.base_offset == kw["base_offset"]
    assert h.batch_length == len(data) - 12
    assert h.size == len(data)
    assert h.partition_leader_epoch == kw["partition_leader_epoch"]
    assert h.magic == 2
    # An empty batch is the bare header with codec NONE, as Kafka's writeEmptyHeader makes it.
    assert h.compression is (kw["compression"] if n else Compression.NONE)
    assert h.timestamp_type is kw["timestamp_type"]
    assert h.is_transactional == kw["is_transactional"]
    assert h.is_control == kw["is_control"]
    assert h.producer_id == kw["producer_id"]
    assert h.producer_epoch == kw["producer_epoch"]
    assert h.base_sequence == kw["base_sequence"]
    assert h.records_count == n
    assert h.delete_horizon_ms == kw["delete_horizon_ms"]
    # Bits 7-15 of the attributes are written as zero.
    assert h.attributes & ~0x7F == 0
    if n:
        assert h.last_offset_delta == records[-1].offset - kw["base_offset"]
        assert h.last_offset == records[-1].offset
        if kw["delete_horizon_ms"] is None:
            assert h.base_timestamp == records[0].timestamp
        else:
            assert h.base_timestamp == kw["delete_horizon_ms"]
        if kw["timestamp_type"] is TimestampType.CREATE_TIME:
            assert h.max_timestamp == max(r.timestamp for r in records)
    else:
        assert len(data) == BATCH_OVERHEAD  # an empty v2 batch is exactly the header
        assert h.last_offset_delta == kw["last_offset_delta"]
        assert h.max_timestamp == kw["max_timestamp"]
        assert h.base_timestamp == (kw["delete_horizon_ms"] if kw["delete_horizon_ms"] is not None else -1)

    assert len(decoded.records) == n
    for want, got in zip(records, decoded.records):
        assert got.offset == want.offset
        assert got.key == want.key
        assert got.value == want.value
        assert got.headers == want.headers
        if kw["timestamp_type"] is TimestampType.LOG_APPEND_TIME:
            # Every record of a LogAppendTime batch reports the batch's max timestamp.
            assert got.timestamp == kw["max_timestamp"]
        else:
            assert got.timestamp == want.timestamp
        if kw["base_sequence"] >= 0:
            assert got.sequence == (kw["base_sequence"] + want.offset - kw["base_offset"]) % 2**31
        else:
            assert got.sequence == -1

    # The CRC is CRC-32C over [21, end) and is what check_batch accepts.
    assert struct.unpack_from(">I", data, 17)[0] == crc32c_reference(data[21:])
    assert check_batch(data) == h


@SETTINGS
@given(batch_specs(allow_empty=False), st.integers(0, 2**62))
def test_rewriting_base_offset_keeps_crc_valid(spec, new_base) -> None:
    kw, records = spec
    data = encode_batch(records, **kw)
    moved = with_base_offset(data, new_base)
    assert moved[8:] == data[8:]  # nothing under the CRC changed
    h = check_batch(moved)
    assert h.base_offset == new_base and h.crc == check_batch(data).crc
    shift = new_base - kw["base_offset"]
    assert [r.offset for r in decode_batch(moved).records] == [r.offset + shift for r in records]

    inplace = bytearray(data)
    set_base_offset(inplace, new_base)
    assert bytes(inplace) == moved
    set_partition_leader_epoch(inplace, 12345)
    assert check_batch(bytes(inplace)).partition_leader_epoch == 12345


@SETTINGS
@given(batch_specs(allow_empty=False), st.data())
def test_any_flipped_byte_under_the_crc_is_detected(spec, data) -> None:
    kw, records = spec
    raw = bytearray(encode_batch(records, **kw))
    pos = data.draw(st.integers(21, len(raw) - 1))
    flip = data.draw(st.integers(1, 255))
    raw[pos] ^= flip
    with pytest.raises(CorruptRecordError, match="crc"):
        check_batch(bytes(raw))


@SETTINGS
@given(batch_specs(allow_empty=False), st.data())
def test_bytes_outside_the_crc_do_not_affect_it(spec, data) -> None:
    # baseOffset (0-8) and partitionLeaderEpoch (12-16) are outside the CRC.
    kw, records = spec
    raw = bytearray(encode_batch(records, **kw))
    crc_before = compute_crc(raw)
    for pos in data.draw(st.lists(st.sampled_from([*range(0, 8), *range(12, 16)]), min_size=1, max_size=5)):
        raw[pos] ^= 0x5A
    assert compute_crc(raw) == crc_before
    check_batch(bytes(raw))


# --- exact bytes ------------------------------------------------------------------------------

def test_simple_batch_bytes_by_hand() -> None:
    """One record, key b"k", value b"v", as Kafka lays it out (sections 1.1 and 1.3)."""
    data = encode_batch([Record(0, 1000, b"k", b"v")])
    record_body = bytes([0x00, 0x00, 0x00, 0x02]) + b"k" + bytes([0x02]) + b"v" + bytes([0x00])
    record = bytes([len(record_body) * 2]) + record_body  # zigzag length
    header_wo_crc = struct.pack(">qiib", 0, 49 + len(record), -1, 2)
    after_crc = struct.pack(">hiqqqhii", 0, 0, 1000, 1000, -1, -1, -1, 1) + record
    expected = header_wo_crc + struct.pack(">I", crc32c_reference(after_crc)) + after_crc
    assert data == expected
    assert len(data) == 61 + len(record)


def test_end_transaction_marker_batch_is_78_bytes() -> None:
    key = encode_control_key(ControlType.COMMIT)
    value = encode_end_txn_marker(coordinator_epoch=7)
    assert key == b"\x00\x00\x00\x01" and value == b"\x00\x00\x00\x00\x00\x07"
    data = encode_batch([Record(100, 5, key, value)], producer_id=42, producer_epoch=3, is_transactional=True,
                        is_control=True)
    assert len(data) == 78
    assert struct.unpack_from(">i", data, 8)[0] == 66
    h = check_batch(data)
    assert h.is_control and h.is_transactional and h.attributes == 0x30
    rec = decode_batch(data).records[0]
    assert parse_control_key(rec.key) is ControlType.COMMIT
    assert parse_end_txn_marker(rec.value) == 7


def test_control_key_parsing_follows_kafka() -> None:
    assert parse_control_key(encode_control_key(ControlType.ABORT)) is ControlType.ABORT
    assert parse_control_key(b"\x00\x00\x00\x63") is ControlType.UNKNOWN
    assert parse_control_key(b"\x00\x00\x00\x01extra") is ControlType.COMMIT
    with pytest.raises(CorruptRecordError):
        parse_control_key(b"\x00\x00\x00")
    with pytest.raises(CorruptRecordError):
        parse_control_key(b"\xff\xff\x00\x00")  # negative version
    with pytest.raises(CorruptRecordError):
        parse_end_txn_marker(b"\x00\x00\x00")


def test_delete_horizon_is_stored_in_base_timestamp() -> None:
    data = encode_batch([Record(0, 500, b"k", None), Record(1, 700, b"k2", b"v")], delete_horizon_ms=10_000)
    h = check_batch(data)
    assert h.attributes & 0x40
    assert h.base_timestamp == 10_000 and h.delete_horizon_ms == 10_000
    assert h.max_timestamp == 700
    assert [r.timestamp for r in decode_batch(data).records] == [500, 700]
    # The record deltas are relative to the horizon: 500 - 10000 = -9500.
    first_record = data[61:]
    _, pos = decode_varint(first_record, 0)
    ts_delta, _ = decode_varlong(first_record, pos + 1)
    assert ts_delta == -9500


def test_negative_timestamp_delta_and_record_encoding() -> None:
    data = encode_batch([Record(10, 1000, None, b"a"), Record(11, 990, None, b"b")])
    assert [r.timestamp for r in decode_batch(data).records] == [1000, 990]
    assert check_batch(data).max_timestamp == 1000
    # encode_record: length varint first, attributes byte 0, then deltas.
    rec = encode_record(1, -10, None, b"b")
    assert rec == bytes([0x0E, 0x00, 0x13, 0x02, 0x01, 0x02]) + b"b" + b"\x00"


def test_large_offsets_and_sequence_wrap() -> None:
    base = 2**62
    data = encode_batch([Record(base, 1, b"a", b"1"), Record(base + 5, 2, b"b", b"2")],
                        producer_id=1, producer_epoch=0, base_sequence=INT32_MAX)
    h = check_batch(data)
    assert h.last_offset == base + 5
    assert h.last_sequence == 4  # INT32_MAX + 5 wraps past Int.MAX to 0 (Kafka's incrementSequence)
    assert [r.sequence for r in decode_batch(data).records] == [INT32_MAX, 4]


# --- varints ----------------------------------------------------------------------------------

@pytest.mark.parametrize("value,encoded", [(-1, b"\x01"), (0, b"\x00"), (1, b"\x02"), (63, b"\x7e"),
                                           (64, b"\x80\x01"), (-64, b"\x7f"), (-65, b"\x81\x01"),
                                           (INT32_MAX, b"\xfe\xff\xff\xff\x0f"),
                                           (-(2**31), b"\xff\xff\xff\xff\x0f")])
def test_varint_kafka_examples(value: int, encoded: bytes) -> None:
    assert encode_varint(value) == encoded
    assert decode_varint(encoded, 0) == (value, len(encoded))
    assert varint_size(value) == len(encoded)


@settings(max_examples=300, deadline=None)
@given(st.integers(INT64_MIN, INT64_MAX), st.binary(max_size=4))
def test_varlong_round_trip(value: int, prefix: bytes) -> None:
    enc = encode_varint(value)
    assert len(enc) == varint_size(value) <= 10
    assert decode_varlong(prefix + enc + b"\xff", len(prefix)) == (value, len(prefix) + len(enc))
    # Base-128 groups of the zigzag value, least significant first.
    zz = (value << 1) ^ (value >> 63)
    assert sum((b & 0x7F) << (7 * i) for i, b in enumerate(enc)) == zz & (2**64 - 1)


@settings(max_examples=300, deadline=None)
@given(st.integers(-(2**31), INT32_MAX))
def test_varint_int32_round_trip(value: int) -> None:
    enc = encode_varint(value)
    assert len(enc) <= 5
    assert decode_varint(enc, 0) == (value, len(enc))


def test_overlong_varints_are_corrupt() -> None:
    # A 5th byte with its high bit set is illegal for an int varint; 10 for a varlong.
    with pytest.raises(CorruptRecordError):
        decode_varint(b"\xff\xff\xff\xff\xff\x01", 0)
    with pytest.raises(CorruptRecordError):
        decode_varlong(b"\xff" * 10 + b"\x01", 0)
    with pytest.raises(CorruptRecordError):
        decode_varint(b"\x80", 0)  # runs off the end


# --- bad batches ------------------------------------------------------------------------------

def _good() -> bytearray:
    return bytearray(encode_batch([Record(0, 10, b"k1", b"v1"), Record(1, 11, b"k2", b"v2")]))


def _refresh_crc(raw: bytearray) -> bytes:
    struct.pack_into(">I", raw, 17, crc32c_reference(bytes(raw[21:])))
    return bytes(raw)


def test_corrupt_crc_is_refused_with_both_values() -> None:
    raw = _good()
    raw[-1] ^= 1
    with pytest.raises(CorruptRecordError, match=r"stored crc = \d+, computed crc = \d+"):
        decode_batch(bytes(raw), "t-0")


def test_truncated_batch_is_refused() -> None:
    raw = bytes(_good())
    for cut in (1, 10, len(raw) - 61):
        with pytest.raises(CorruptRecordError):
            check_batch(raw[:-cut])
    with pytest.raises(CorruptRecordError, match="smaller than the v2 header"):
        check_batch(raw[:60])


@pytest.mark.parametrize("magic", [0, 1, 3, 255])
def test_wrong_magic_is_refused(magic: int) -> None:
    raw = _good()
    raw[16] = magic
    with pytest.raises(CorruptRecordError, match="magic"):
        check_batch(_refresh_crc(raw))


def test_negative_record_count_is_refused() -> None:
    raw = _good()
    struct.pack_into(">i", raw, 57, -1)
    with pytest.raises(CorruptRecordError, match="negative record count"):
        check_batch(_refresh_crc(raw))


def test_record_count_disagreeing_with_the_records_is_refused() -> None:
    raw = _good()
    struct.pack_into(">i", raw, 57, 1)  # one record declared, two present
    with pytest.raises(CorruptRecordError, match="records still remaining"):
        decode_batch(_refresh_crc(raw))
    raw = _good()
    struct.pack_into(">i", raw, 57, 3)  # three declared, two present
    with pytest.raises(CorruptRecordError):
        decode_batch(_refresh_crc(raw))


@pytest.mark.parametrize("codec_id", [5, 6, 7])
def test_unknown_codec_is_refused(codec_id: int) -> None:
    raw = _good()
    raw[22] = codec_id
    with pytest.raises(CorruptRecordError, match="codec"):
        check_batch(_refresh_crc(raw))


def test_record_length_disagreeing_with_its_fields_is_refused() -> None:
    rec = bytearray(encode_record(0, 0, b"k", b"v"))
    rec[0] += 2  # declared one byte longer than the fields read
    body = bytes(rec) + b"\x00"
    raw = bytearray(encode_batch([Record(0, 0, b"k", b"v")]))
    raw = raw[:61] + body
    struct.pack_into(">i", raw, 8, len(raw) - 12)
    with pytest.raises(CorruptRecordError, match="record"):
        decode_batch(_refresh_crc(raw))


def test_compressed_garbage_is_refused() -> None:
    raw = bytearray(encode_batch([Record(0, 0, b"k", b"v" * 100)], compression=Compression.GZIP))
    raw[70:75] = b"\x00" * 5
    with pytest.raises(CorruptRecordError):
        decode_batch(_refresh_crc(raw))


@SETTINGS
@given(st.binary(min_size=0, max_size=200))
def test_random_bytes_are_refused_as_corrupt(garbage: bytes) -> None:
    try:
        decode_batch(garbage)
    except CorruptRecordError:
        return
    # Only a structurally valid batch may decode; random bytes virtually never are.
    assert check_batch(garbage).size == len(garbage)


_HEADER_LAYOUT = struct.Struct(">qiibIhiqqqhii")  # Kafka's DefaultRecordBatch header, field by field


@given(st.binary(min_size=61, max_size=80), st.integers(0, 19))
def test_batch_header_parse_reads_every_field_in_kafkas_layout(raw: bytes, pos: int) -> None:
    """BatchHeader.parse (built straight from one unpack since it is no longer frozen) gives each field of the
    61-byte header at `pos`, and equal headers hash alike (it is still used as a key, as the frozen one was)."""
    pos = min(pos, len(raw) - 61)
    header = BatchHeader.parse(raw, pos)
    names = [f.name for f in dataclasses.fields(BatchHeader)]
    assert [getattr(header, n) for n in names] == list(_HEADER_LAYOUT.unpack_from(raw, pos))
    again = BatchHeader.parse(bytes(raw), pos)
    assert again == header and hash(again) == hash(header)
    assert header.size == 12 + header.batch_length
