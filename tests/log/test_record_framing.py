"""Produce validation walks every record's length prefix (Kafka's LogValidator iterates every record)."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings, strategies as st

from shale.sidecar.log import records
from shale.sidecar.log._cleaner_kernel import records_fill
from shale.sidecar.log.compression import Compression
from shale.sidecar.log.errors import InvalidRecordError
from shale.sidecar.log.records import BATCH_OVERHEAD, Record, check_batch, check_record_framing, encode_batch


def python_walk(data: bytes, count: int) -> bool:
    """The pure-Python walk alone (what a checkout without the C extension runs)."""
    fake = dataclasses.replace(check_batch(encode_batch([Record(0, 0, b"k", b"v")])), records_count=count)
    saved = records._records_fill
    records._records_fill = None
    try:
        check_record_framing(fake, data)
        return True
    except InvalidRecordError:
        return False
    finally:
        records._records_fill = saved


@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=64), st.integers(min_value=0, max_value=8))
def test_c_and_python_walks_agree_on_any_bytes(data, count):
    assert records_fill(data, count) == python_walk(data, count)


@pytest.mark.parametrize("codec", list(Compression))
def test_a_well_formed_batch_passes_and_a_miscounted_one_is_refused(codec):
    batch = encode_batch([Record(i, 1000 + i, b"k%d" % i, b"v" * i) for i in range(5)], compression=codec)
    header = check_batch(batch)
    check_record_framing(header, memoryview(batch)[BATCH_OVERHEAD:])
    for count in (4, 6):
        wrong = dataclasses.replace(header, records_count=count)
        with pytest.raises(InvalidRecordError, match="offset 0"):
            check_record_framing(wrong, memoryview(batch)[BATCH_OVERHEAD:], "t-0")
