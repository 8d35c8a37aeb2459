"""Kafka's `.snapshot` producer-state files: exact bytes, round trips, corruption, and dump-log's line."""

from __future__ import annotations

import io

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shale.sidecar.dump_log import dump_files
from shale.sidecar.log.producer_snapshot import (
    CorruptSnapshotError,
    ProducerEntry,
    encode_snapshot,
    format_entry,
    parse_snapshot,
)

INT16 = st.integers(-(2**15), 2**15 - 1)
INT32 = st.integers(-(2**31), 2**31 - 1)
INT64 = st.integers(-(2**63), 2**63 - 1)
entries = st.builds(ProducerEntry, INT64, INT16, INT32, INT64, INT32, INT64, INT32, INT64)


def test_empty_snapshot_is_kafkas_ten_bytes() -> None:
    """A real broker's empty snapshot: version 1, CRC-32C of four zero bytes, count 0."""
    assert encode_snapshot([]) == bytes.fromhex("000148674bc700000000")
    assert parse_snapshot(bytes.fromhex("000148674bc700000000")) == []


@given(st.lists(entries, max_size=20))
def test_any_snapshot_round_trips(items) -> None:
    data = encode_snapshot(items)
    assert len(data) == 10 + 46 * len(items)
    assert parse_snapshot(data) == items


@given(st.lists(entries, min_size=1, max_size=5), st.data())
def test_any_flipped_byte_is_caught(items, data) -> None:
    raw = bytearray(encode_snapshot(items))
    i = data.draw(st.integers(0, len(raw) - 1))
    raw[i] ^= data.draw(st.integers(1, 255))
    with pytest.raises(CorruptSnapshotError, match="snap-1"):
        parse_snapshot(bytes(raw), "snap-1")


def test_truncated_and_wrong_version_are_corrupt() -> None:
    good = encode_snapshot([ProducerEntry(1, 0, 5, 10, 2, 1000)])
    with pytest.raises(CorruptSnapshotError, match="shorter"):
        parse_snapshot(good[:5])
    with pytest.raises(CorruptSnapshotError):
        parse_snapshot(good[:-1])
    with pytest.raises(CorruptSnapshotError, match="unknown file version 2"):
        parse_snapshot(b"\x00\x02" + good[2:])


def test_dump_line_matches_real_kafka_output(tmp_path) -> None:
    """The line a real kafka-dump-log printed for a producer snapshot entry (DUMP_LOG_FORMAT.md §6)."""
    entry = ProducerEntry(producer_id=1004, producer_epoch=0, last_sequence=371, last_offset=371, offset_delta=1,
                          timestamp=1706471404037, coordinator_epoch=-1, current_txn_first_offset=-1)
    real = ("producerId: 1004 producerEpoch: 0 coordinatorEpoch: -1 currentTxnFirstOffset: OptionalLong.empty "
            "lastTimestamp: 1706471404037 firstSequence: 370 lastSequence: 371 lastOffset: 371 offsetDelta: 1 "
            "timestamp: 1706471404037")
    assert format_entry(entry) == real
    path = tmp_path / "00000000000000000372.snapshot"
    path.write_bytes(encode_snapshot([entry, ProducerEntry(7, 1, 0, 400, 0, 5, 3, 398)]))
    out = io.StringIO()
    assert dump_files([str(path)], out=out) == 0
    lines = out.getvalue().splitlines()
    assert lines[:2] == [f"Dumping {path}", real]
    assert "currentTxnFirstOffset: OptionalLong[398]" in lines[2] and "firstSequence: 0 " in lines[2]


def test_first_sequence_wraps_like_kafka() -> None:
    assert ProducerEntry(1, 0, 2, 10, 4, 0).first_sequence == 2**31 - 2
    assert ProducerEntry(1, 0, 2, 10, 4, 0).first_offset == 6


def test_corrupt_snapshot_is_reported_by_dump_log(tmp_path) -> None:
    path = tmp_path / "00000000000000000001.snapshot"
    path.write_bytes(b"\x00\x01garbage!!")
    out, err = io.StringIO(), io.StringIO()
    assert dump_files([str(path)], out=out, err=err) == 1
    assert "CRC is no longer valid" in err.getvalue()
