"""Produce validation walks every record (Kafka's LogValidator iterates every record of a produced batch).

The C walk (`records_check`) only ever says "valid" or "let Python decide", so what it must never do is
call valid a batch that the pure-Python decoder refuses; on well-formed batches the two must agree.
"""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shale.sidecar.log import records
from shale.sidecar.log._append_kernel import records_check
from shale.sidecar.log.compression import Compression
from shale.sidecar.log.errors import InvalidRecordError, InvalidTimestampError
from shale.sidecar.log.records import BATCH_OVERHEAD, Header, Record, check_batch, check_records, encode_batch

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


def python_accepts(header, data: bytes, require_key: bool, ts_range: tuple[int, int] | None) -> bool:
    """The pure-Python path alone (what a checkout without the C extension runs)."""
    saved = records._records_check
    records._records_check = None
    try:
        check_records(header, data, "t-0 offset 0", require_key=require_key, timestamp_range=ts_range)
        return True
    except InvalidRecordError:
        return False
    finally:
        records._records_check = saved


def c_accepts(header, data: bytes, require_key: bool, ts_range: tuple[int, int] | None) -> bool:
    lo, hi = ts_range or (INT64_MIN, INT64_MAX)
    return records_check(data, header.records_count, require_key, header.base_timestamp, lo, hi)


BASE = check_batch(encode_batch([Record(0, 1_000, b"k", b"v")]))
ts_ranges = st.none() | st.tuples(st.integers(0, 2_000), st.integers(0, 2_000))


@settings(max_examples=600, deadline=None)
@given(st.binary(max_size=80), st.integers(min_value=0, max_value=8), st.booleans(), ts_ranges)
def test_c_never_accepts_what_python_refuses(data, count, require_key, ts_range):
    header = dataclasses.replace(BASE, records_count=count)
    if c_accepts(header, data, require_key, ts_range):
        assert python_accepts(header, data, require_key, ts_range)


records_strategy = st.lists(
    st.builds(
        lambda i, ts, key, value, hdrs: (ts, key, value, hdrs),
        st.integers(), st.integers(0, 2_000), st.none() | st.binary(max_size=12), st.none() | st.binary(max_size=40),
        st.lists(st.tuples(st.text(max_size=5), st.none() | st.binary(max_size=5)), max_size=3),
    ),
    min_size=1,
    max_size=6,
)


def c_accepts_compressed(header, body: bytes, require_key: bool, ts_range: tuple[int, int] | None) -> bool:
    data = records.decompress(header.compression, body) if header.compression else body
    return c_accepts(header, data, require_key, ts_range)


@settings(max_examples=400, deadline=None)
@given(records_strategy, st.booleans(), ts_ranges, st.sampled_from(list(Compression)))
def test_c_and_python_agree_on_well_formed_batches(recs, require_key, ts_range, codec):
    batch = encode_batch([
        Record(i, ts, key, value, tuple(Header(k, v) for k, v in hdrs)) for i, (ts, key, value, hdrs) in enumerate(recs)
    ], compression=codec)
    header = check_batch(batch)
    body = bytes(batch[BATCH_OVERHEAD:])
    assert c_accepts_compressed(header, body, require_key, ts_range) == python_accepts(header, body, require_key, ts_range)


@settings(max_examples=400, deadline=None)
@given(records_strategy, st.booleans(), ts_ranges, st.integers(0, 12))
def test_c_never_accepts_a_truncated_or_padded_batch_that_python_refuses(recs, require_key, ts_range, cut):
    batch = encode_batch([Record(i, ts, key, value) for i, (ts, key, value, _) in enumerate(recs)])
    header = check_batch(batch)
    body = bytes(batch[BATCH_OVERHEAD:])
    mutated = body[: max(0, len(body) - cut)] if cut else body + b"\x00"
    if c_accepts(header, mutated, require_key, ts_range):
        assert python_accepts(header, mutated, require_key, ts_range)


@pytest.mark.parametrize("codec", list(Compression))
def test_a_well_formed_batch_passes_and_a_miscounted_one_is_refused(codec):
    batch = encode_batch([Record(i, 1000 + i, b"k%d" % i, b"v" * i) for i in range(5)], compression=codec)
    header = check_batch(batch)
    check_records(header, memoryview(batch)[BATCH_OVERHEAD:], require_key=True, timestamp_range=(1000, 1004))
    for count in (4, 6):
        wrong = dataclasses.replace(header, records_count=count)
        with pytest.raises(InvalidRecordError, match="offset 0"):
            check_records(wrong, memoryview(batch)[BATCH_OVERHEAD:], "t-0")


def test_a_keyless_record_and_a_late_timestamp_are_named():
    batch = encode_batch([Record(0, 1000, b"k", b"v"), Record(1, 1001, None, b"v"), Record(2, 5000, b"k", b"v")])
    header, body = check_batch(batch), memoryview(batch)[BATCH_OVERHEAD:]
    check_records(header, body, "t-0 offset 7")  # neither check asked for: framing alone is fine
    with pytest.raises(InvalidRecordError, match="without key in t-0 offset 7"):
        check_records(header, body, "t-0 offset 7", require_key=True)
    with pytest.raises(InvalidTimestampError, match="timestamp 5000 of record at t-0 offset 7 is out of range"):
        check_records(header, body, "t-0 offset 7", timestamp_range=(0, 2000))
