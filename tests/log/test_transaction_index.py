"""`.txnindex`: Kafka's format byte for byte, its search and truncation (Kafka's TransactionIndexTest), and the
file's life with its segment (created on the first abort, renamed, truncated, deleted)."""

from __future__ import annotations

import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shale.sidecar.log.errors import CorruptIndexError
from shale.sidecar.log.segment import CLEANED_SUFFIX, DELETED_SUFFIX, LogSegment
from shale.sidecar.log.transaction_index import (
    ENTRY_SIZE,
    AbortedTxn,
    TransactionIndex,
    consistency_problems,
    encode_entries,
    parse_entries,
)
from support.logtest_util import FakeClock

# Kafka's TransactionIndexTest.testCollectAbortedTransactions fixture
SEARCHED = [AbortedTxn(0, 0, 10, 11), AbortedTxn(1, 5, 15, 13), AbortedTxn(2, 18, 35, 25), AbortedTxn(3, 32, 50, 40)]


def test_entry_is_kafkas_34_big_endian_bytes() -> None:
    golden = bytes.fromhex("0000" "0000000000000005" "000000000000000a" "0000000000000014" "000000000000000f")
    assert AbortedTxn(producer_id=5, first_offset=10, last_offset=20, last_stable_offset=15).encode() == golden
    assert ENTRY_SIZE == 34
    assert parse_entries(golden, "x.txnindex") == [AbortedTxn(5, 10, 20, 15)]
    assert str(AbortedTxn(5, 10, 20, 15)) == \
        "version: 0 producerId: 5 firstOffset: 10 lastOffset: 20 lastStableOffset: 15"  # DumpLogSegments' line


entries = st.lists(st.builds(AbortedTxn, st.integers(-1, 2**63 - 1), st.integers(0, 2**63 - 1),
                             st.integers(0, 2**63 - 1), st.integers(0, 2**63 - 1)), max_size=20)


@given(entries, st.integers(0, ENTRY_SIZE - 1))
@settings(max_examples=200, deadline=None)
def test_round_trip_ignores_a_partial_last_entry(txns: list[AbortedTxn], partial: int) -> None:
    data = encode_entries(txns)
    assert len(data) == ENTRY_SIZE * len(txns)
    assert parse_entries(data + b"\x00" * partial, "x.txnindex") == txns


def test_unknown_version_is_refused_with_the_path() -> None:
    data = b"\x00\x01" + AbortedTxn(1, 2, 3, 4).encode()[2:]
    with pytest.raises(CorruptIndexError, match=r"version 1 in transaction index .*y\.txnindex"):
        parse_entries(data, "y.txnindex")


@pytest.mark.parametrize("fetch_offset, upper_bound, expected, complete", [
    (0, 100, SEARCHED, False),
    (0, 32, SEARCHED[:3], True),
    (0, 35, SEARCHED, True),
    (10, 35, SEARCHED, True),
    (11, 35, SEARCHED[1:4], True),
    (20, 41, SEARCHED[2:4], False),
])
def test_collect_aborted_transactions(tmp_path, fetch_offset, upper_bound, expected, complete) -> None:
    index = TransactionIndex(str(tmp_path / "00000000000000000000.txnindex"), 0)
    for txn in SEARCHED:
        index.append(txn)
    reopened = TransactionIndex(index.path, 0)  # from the file, not the cache
    for idx in (index, reopened):
        found = idx.collect(fetch_offset, upper_bound)
        assert (found.aborted, found.complete) == (expected, complete)


def test_truncate_to_drops_entries_whose_marker_is_at_or_past_the_offset(tmp_path) -> None:
    txns = [AbortedTxn(0, 0, 10, 2), AbortedTxn(1, 5, 15, 16), AbortedTxn(2, 18, 35, 25), AbortedTxn(3, 32, 50, 40)]
    index = TransactionIndex(str(tmp_path / "00000000000000000000.txnindex"), 0)
    for txn in txns:
        index.append(txn)
    index.truncate_to(51)
    assert TransactionIndex(index.path, 0).entries == txns
    index.truncate_to(50)
    assert TransactionIndex(index.path, 0).entries == txns[:3]
    assert os.path.getsize(index.path) == 3 * ENTRY_SIZE
    index.truncate_to(0)
    assert TransactionIndex(index.path, 0).entries == [] and index.entries == []


def test_last_offset_must_increase(tmp_path) -> None:
    index = TransactionIndex(str(tmp_path / "00000000000000000000.txnindex"), 0)
    index.append(AbortedTxn(1, 5, 15, 16))
    with pytest.raises(CorruptIndexError, match="must increase sequentially"):
        index.append(AbortedTxn(0, 0, 15, 16))
    assert TransactionIndex(index.path, 0).entries == [AbortedTxn(1, 5, 15, 16)], "the refused entry is not written"


def test_a_partial_entry_left_by_a_crash_is_cut_before_the_next_append(tmp_path) -> None:
    path = str(tmp_path / "00000000000000000000.txnindex")
    with open(path, "wb") as f:
        f.write(AbortedTxn(1, 0, 3, 4).encode() + b"\x00\x00\x00")
    index = TransactionIndex(path, 0)
    index.append(AbortedTxn(2, 4, 9, 10))
    assert TransactionIndex(path, 0).entries == [AbortedTxn(1, 0, 3, 4), AbortedTxn(2, 4, 9, 10)]
    assert os.path.getsize(path) == 2 * ENTRY_SIZE


def test_consistency_problems_are_kafkas_sanity_rules() -> None:
    assert consistency_problems(SEARCHED, 0) == []
    problems = consistency_problems([AbortedTxn(1, 5, 4, 6), AbortedTxn(2, 0, 4, 5)], 10)
    assert len(problems) == 4 and "below the base offset 10" in problems[0] and "after its last offset" in problems[1]
    assert "not greater than the previous 4" in problems[3]


def test_the_file_lives_with_its_segment(tmp_path) -> None:
    seg = LogSegment(str(tmp_path), 100, index_interval_bytes=4096, max_index_size=1024, now_ms=FakeClock())
    name = "00000000000000000100.txnindex"
    seg.flush()
    assert not os.path.exists(tmp_path / name), "no file until the first abort, as in Kafka"
    seg.txn_index.append(AbortedTxn(7, 100, 105, 106))
    seg.txn_index.append(AbortedTxn(8, 101, 109, 110))
    seg.flush()
    assert (tmp_path / name).read_bytes() == encode_entries(seg.txn_index.entries)
    seg.truncate_to(107)  # the segment is empty below 107 too (no batches): entries at or past 107 go
    assert TransactionIndex(str(tmp_path / name), 100).entries == [AbortedTxn(7, 100, 105, 106)]
    seg.change_suffix("", CLEANED_SUFFIX)
    assert os.path.exists(tmp_path / (name + CLEANED_SUFFIX)) and not os.path.exists(tmp_path / name)
    seg.change_suffix(CLEANED_SUFFIX, DELETED_SUFFIX)
    assert os.path.exists(tmp_path / (name + DELETED_SUFFIX))
    seg.delete_files()
    assert not any(n.startswith("00000000000000000100") for n in os.listdir(tmp_path))
