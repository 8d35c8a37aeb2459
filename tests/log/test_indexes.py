"""`.index` and `.timeindex`: Kafka's OffsetIndexTest and TimeIndexTest scenarios (spec 2.3, 2.4, 10.5)."""

from __future__ import annotations

import os
import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shale.sidecar.log.errors import InvalidIndexEntryError
from shale.sidecar.log.offset_index import OffsetIndex
from shale.sidecar.log.time_index import TimeIndex

SETTINGS = settings(max_examples=60, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])


def offset_index(tmp_path, base=0, max_entries=30, name="00000000000000000000.index") -> OffsetIndex:
    return OffsetIndex(str(tmp_path / name), base, max_entries * 8)


def time_index(tmp_path, base=45, max_entries=30, name="00000000000000000045.timeindex") -> TimeIndex:
    return TimeIndex(str(tmp_path / name), base, max_entries * 12)


# --- offset index -----------------------------------------------------------------------------

@SETTINGS
@given(base=st.integers(0, 2**40), gaps=st.lists(st.integers(1, 5000), min_size=1, max_size=200),
       targets=st.lists(st.integers(-10, 1_000_000), min_size=1, max_size=30))
def test_random_lookup(tmp_path_factory, base, gaps, targets) -> None:
    """Kafka's randomLookupTest: lookup = the largest entry <= target, else (base, 0)."""
    d = tmp_path_factory.mktemp("idx")
    idx = OffsetIndex(str(d / "a.index"), base, 8 * len(gaps))
    entries = []
    off, pos = base, 0
    for g in gaps:
        off += g
        pos += g * 3
        idx.append(off, pos)
        entries.append((off, pos))
    assert idx.is_full
    for t in targets + [e[0] for e in entries]:
        target = base + t if t < 1_000_000 else t
        below = [e for e in entries if e[0] <= target]
        assert idx.lookup(target) == (below[-1] if below else (base, 0))


def test_lookup_extreme_cases(tmp_path) -> None:
    idx = offset_index(tmp_path, base=45, max_entries=30)
    assert idx.lookup(45) == (45, 0)
    assert idx.lookup(10_000) == (45, 0), "an empty index means: start at position 0"
    for i in range(30):
        idx.append(45 + i * 2 + 1, i * 100)
    assert idx.is_full
    assert idx.lookup(46) == (46, 0)  # the first entry
    assert idx.lookup(45) == (45, 0)  # below the first entry
    assert idx.lookup(45 + 59) == (104, 2900)  # the last entry
    assert idx.lookup(2**40) == (104, 2900)


def test_append_too_many(tmp_path) -> None:
    idx = offset_index(tmp_path, max_entries=10)
    for i in range(10):
        idx.append(i + 1, i)
    with pytest.raises(InvalidIndexEntryError, match="full"):
        idx.append(11, 10)
    assert idx.entries == 10


def test_append_out_of_order(tmp_path) -> None:
    idx = offset_index(tmp_path)
    idx.append(51, 0)
    with pytest.raises(InvalidIndexEntryError):
        idx.append(50, 1)
    with pytest.raises(InvalidIndexEntryError):
        idx.append(51, 1)  # must be strictly greater
    assert idx.entries == 1 and idx.last_offset == 51


def test_relative_offset_must_fit_int32(tmp_path) -> None:
    idx = offset_index(tmp_path, base=100)
    assert idx.can_append_offset(100 + 2**31 - 1) and not idx.can_append_offset(100 + 2**31)
    assert not idx.can_append_offset(99)
    with pytest.raises(InvalidIndexEntryError):
        idx.append(100 + 2**31, 0)
    with pytest.raises(InvalidIndexEntryError):
        idx.append(99, 0)
    idx.append(100 + 2**31 - 1, 0)
    assert idx.entry(0) == (100 + 2**31 - 1, 0)


def test_entry_overflow(tmp_path) -> None:
    """Kafka's testEntryOverflow: fetching a slot past the entries is an error, not a zero entry."""
    idx = offset_index(tmp_path)
    with pytest.raises(IndexError):
        idx.entry(0)
    idx.append(1, 0)
    assert idx.entry(0) == (1, 0)
    with pytest.raises(IndexError):
        idx.entry(1)


def test_fetch_upper_bound_offset(tmp_path) -> None:
    idx = offset_index(tmp_path, base=0)
    assert idx.fetch_upper_bound_position(0, 5) is None
    for off, pos in ((0, 0), (1, 10), (2, 23), (3, 37)):
        idx.append(off, pos)
    assert idx.fetch_upper_bound_position(0, 5) == 10
    assert idx.fetch_upper_bound_position(0, 10) == 10
    assert idx.fetch_upper_bound_position(0, 23) == 23
    assert idx.fetch_upper_bound_position(0, 22) == 23
    assert idx.fetch_upper_bound_position(10, 24) == 37
    assert idx.fetch_upper_bound_position(37, 1) is None
    assert idx.fetch_upper_bound_position(0, 200) is None
    assert idx.fetch_upper_bound_position(10, 200) is None


def test_reopen_counts_entries_from_file_length(tmp_path) -> None:
    idx = offset_index(tmp_path, base=0, max_entries=30)
    idx.append(51, 0)
    idx.append(52, 1)
    idx.close()
    path = tmp_path / "00000000000000000000.index"
    assert path.stat().st_size == 16, "close trims the preallocated file to its entries"
    assert path.read_bytes() == struct.pack(">iiii", 51, 0, 52, 1)
    again = OffsetIndex(str(path), 0, 30 * 8)
    assert again.entries == 2 and again.max_entries == 2
    assert again.lookup(51) == (51, 0) and again.lookup(52) == (52, 1)
    assert again.last_offset == 52
    with pytest.raises(InvalidIndexEntryError):
        again.append(53, 2)  # a reopened, trimmed index is full


def test_untrimmed_file_looks_full_of_zero_entries(tmp_path) -> None:
    """Why trimming matters: a preallocated file reopened counts every slot as an entry."""
    idx = offset_index(tmp_path, base=0, max_entries=30)
    idx.append(5, 0)
    idx.flush()
    idx.mm.close()  # a crash: no trim
    idx.mm = None
    again = OffsetIndex(idx.path, 0, 30 * 8)
    assert again.entries == 30


def test_truncate(tmp_path) -> None:
    idx = OffsetIndex(str(tmp_path / "t.index"), 0, 10 * 8)
    idx.truncate_to(0)
    for i in range(1, 10):
        idx.append(i, i)
    idx.truncate_to(12)
    assert idx.lookup(10) == (9, 9), "unchanged by truncating past the end"
    assert idx.last_offset == 9
    idx.append(10, 10)
    idx.truncate_to(10)
    assert idx.lookup(10) == (9, 9), "the exact-match entry goes"
    assert idx.last_offset == 9
    idx.append(10, 10)
    idx.truncate_to(5)
    assert idx.lookup(10) == (4, 4)
    assert idx.last_offset == 4
    idx.append(5, 5)
    idx.truncate_to(0)
    assert idx.entries == 0
    idx.append(0, 0)
    assert idx.entries == 1


@SETTINGS
@given(offsets=st.lists(st.integers(0, 500), min_size=1, max_size=40, unique=True), target=st.integers(-5, 520))
def test_truncate_keeps_entries_below_target(tmp_path_factory, offsets, target) -> None:
    offsets.sort()
    idx = OffsetIndex(str(tmp_path_factory.mktemp("i") / "t.index"), 0, 8 * 64)
    for o in offsets:
        idx.append(o, o * 10)
    idx.truncate_to(target)
    kept = [o for o in offsets if o < target]
    assert [idx.entry(i)[0] for i in range(idx.entries)] == kept
    idx.append(kept[-1] + 1 if kept else 0, 1)  # appends work after a truncation
    assert idx.entries == len(kept) + 1


def test_preallocation_rounds_down_and_trim(tmp_path) -> None:
    oi = OffsetIndex(str(tmp_path / "a.index"), 0, 100)
    ti = TimeIndex(str(tmp_path / "a.timeindex"), 0, 100)
    assert os.path.getsize(oi.path) == 96 and oi.max_entries == 12
    assert os.path.getsize(ti.path) == 96 and ti.max_entries == 8
    # Kafka's default segment.index.bytes gives a 10485756-byte time index (section 2.4).
    big = TimeIndex(str(tmp_path / "b.timeindex"), 0, 10485760)
    assert os.path.getsize(big.path) == 10485756
    big.close()
    assert os.path.getsize(big.path) == 0
    oi.append(3, 7)
    ti.maybe_append(100, 3)
    oi.trim_to_valid_size()
    ti.trim_to_valid_size()
    assert os.path.getsize(oi.path) == 8 and os.path.getsize(ti.path) == 12
    oi.resize(80)
    assert os.path.getsize(oi.path) == 80 and oi.max_entries == 10 and oi.lookup(3) == (3, 7)
    with pytest.raises(ValueError):
        OffsetIndex(str(tmp_path / "c.index"), 0, 7)


# --- time index -------------------------------------------------------------------------------

def _append_entries(idx: TimeIndex, n: int, base: int = 45) -> None:
    for i in range(1, n + 1):
        idx.maybe_append(i * 10, i * 10 + base)


def test_time_lookup(tmp_path) -> None:
    idx = time_index(tmp_path)
    assert idx.lookup(100) == (-1, 45)
    _append_entries(idx, 29)
    assert idx.lookup(9) == (-1, 45)
    assert idx.lookup(25) == (20, 65)
    assert idx.lookup(30) == (30, 75)
    assert idx.lookup(10**9) == (290, 335)


def test_time_last_entry(tmp_path) -> None:
    idx = time_index(tmp_path)
    assert idx.last_entry == (-1, 45)
    idx.maybe_append(106, 57)
    assert idx.last_entry == (106, 57)


def test_time_truncate(tmp_path) -> None:
    idx = time_index(tmp_path)
    _append_entries(idx, 29)
    idx.truncate_to(45)
    assert idx.entries == 0
    _append_entries(idx, 29)
    idx.truncate_to(10 + 45)  # by offset: the first entry's offset goes with everything after it
    assert idx.entries == 0
    _append_entries(idx, 29)
    idx.truncate_to(101)  # between the entries for offsets 95 and 105
    assert idx.entries == 5 and idx.last_entry == (50, 95)


def test_time_append_keeps_the_last_slot(tmp_path) -> None:
    idx = time_index(tmp_path, max_entries=30)
    _append_entries(idx, 28)
    assert not idx.is_full
    idx.maybe_append(290, 290 + 45)
    assert idx.entries == 29 and idx.is_full, "full at maxEntries - 1"
    with pytest.raises(InvalidIndexEntryError):
        idx.maybe_append(10000, 1000)
    with pytest.raises(InvalidIndexEntryError):
        idx.maybe_append(10000, 28 * 10, skip_full_check=True)  # offset below the last entry
    idx.maybe_append(10000, 1000, skip_full_check=True)  # the roll/close entry takes the last slot
    assert idx.entries == 30 and idx.last_entry == (10000, 1000)


def test_time_append_rules(tmp_path) -> None:
    idx = time_index(tmp_path)
    idx.maybe_append(100, 50)
    idx.maybe_append(100, 60)  # same timestamp: silently skipped
    assert idx.entries == 1 and idx.last_entry == (100, 50)
    with pytest.raises(InvalidIndexEntryError):
        idx.maybe_append(99, 70)  # timestamps never go back
    with pytest.raises(InvalidIndexEntryError):
        idx.maybe_append(200, 49)  # nor offsets
    idx.maybe_append(200, 50)  # same offset with a larger timestamp is allowed
    assert idx.entries == 2
    # Records without timestamps (-1) never make an entry in an empty index.
    empty = time_index(tmp_path, name="e.timeindex")
    empty.maybe_append(-1, 45)
    assert empty.entries == 0


def test_time_index_entry_bytes_and_reopen(tmp_path) -> None:
    idx = time_index(tmp_path, base=45)
    idx.maybe_append(1_700_000_000_123, 50)
    idx.maybe_append(1_700_000_000_456, 60)
    idx.close()
    raw = (tmp_path / "00000000000000000045.timeindex").read_bytes()
    assert raw == struct.pack(">qiqi", 1_700_000_000_123, 5, 1_700_000_000_456, 15)
    again = TimeIndex(idx.path, 45, 30 * 12)
    assert again.entries == 2 and again.lookup(1_700_000_000_200) == (1_700_000_000_123, 50)


@SETTINGS
@given(steps=st.lists(st.tuples(st.integers(0, 50), st.integers(0, 5)), min_size=1, max_size=60),
       targets=st.lists(st.integers(-5, 3000), max_size=20))
def test_time_lookup_matches_brute_force(tmp_path_factory, steps, targets) -> None:
    idx = TimeIndex(str(tmp_path_factory.mktemp("t") / "t.timeindex"), 0, 12 * 100)
    ts, off = 0, 0
    entries = []
    for dts, doff in steps:
        ts += dts
        off += doff
        idx.maybe_append(ts, off)
        if ts > (entries[-1][0] if entries else -1):
            entries.append((ts, off))
        assert idx.entries == len(entries)
    for t in targets:
        below = [e for e in entries if e[0] <= t]
        assert idx.lookup(t) == (below[-1] if below else (-1, 0))
