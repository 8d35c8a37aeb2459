"""`decode_columns` gives exactly what `decode_records` gives, as lists — with the C kernel and without it."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shale.sidecar.log import records
from shale.sidecar.log.compression import Compression
from shale.sidecar.log.errors import CorruptRecordError
from shale.sidecar.log.records import (
    BATCH_OVERHEAD,
    Header,
    Record,
    RecordColumns,
    TimestampType,
    check_batch,
    decode_columns,
    decode_records,
    encode_batch,
)


def as_columns(recs: list[Record]) -> RecordColumns:
    return RecordColumns([r.offset for r in recs], [r.timestamp for r in recs], [r.key for r in recs],
                         [r.value for r in recs], [[(h.key, h.value) for h in r.headers] or None for r in recs])


def pure_python(header, body) -> RecordColumns:
    saved = records._records_columns
    records._records_columns = None
    try:
        return decode_columns(header, body)
    finally:
        records._records_columns = saved


record_lists = st.lists(
    st.tuples(st.integers(-5, 5_000), st.none() | st.binary(max_size=12), st.none() | st.binary(max_size=40),
              st.lists(st.tuples(st.text(max_size=6), st.none() | st.binary(max_size=6)), max_size=3)),
    min_size=1, max_size=8,
)


@settings(max_examples=300, deadline=None)
@given(record_lists, st.sampled_from(list(Compression)), st.integers(0, 2**40), st.booleans())
def test_columns_equal_the_records(recs, codec, base_offset, log_append):
    batch = encode_batch(
        [Record(base_offset + i, ts, k, v, tuple(Header(hk, hv) for hk, hv in hs)) for i, (ts, k, v, hs) in enumerate(recs)],
        compression=codec,
        timestamp_type=TimestampType.LOG_APPEND_TIME if log_append else TimestampType.CREATE_TIME,
    )
    header, body = check_batch(batch), memoryview(batch)[BATCH_OVERHEAD:]
    expected = as_columns(decode_records(header, body))
    assert decode_columns(header, body) == expected
    assert pure_python(header, body) == expected


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=80), st.integers(0, 6))
def test_on_any_bytes_the_c_pass_agrees_or_leaves_python_to_decide(data, count):
    header = dataclasses.replace(check_batch(encode_batch([Record(0, 0, b"k", b"v")])), records_count=count)
    try:
        expected = as_columns(decode_records(header, data))
    except CorruptRecordError:
        with pytest.raises(CorruptRecordError):
            decode_columns(header, data)
        assert records._records_columns(data, count, 0, 0, False, 0) is None
    else:
        assert decode_columns(header, data) == expected


def test_invalid_utf8_header_keys_are_replaced_as_python_does():
    batch = encode_batch([Record(0, 1, b"k", b"v", (Header("ab", b"x"),))])
    header = check_batch(batch)
    body = bytearray(batch[BATCH_OVERHEAD:])
    at = body.index(b"ab")
    body[at:at + 2] = b"\xff\xfe"  # not UTF-8: the header key must come out as U+FFFD twice, as in Python
    assert decode_columns(header, bytes(body)).headers == [[("\ufffd\ufffd", b"x")]]
    assert pure_python(header, bytes(body)).headers == [[("\ufffd\ufffd", b"x")]]
