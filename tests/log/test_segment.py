"""One segment: Kafka's LogSegmentTest scenarios (spec 2.2-2.7, 5.4, 10.4) on real files."""

from __future__ import annotations

import gc
import os
import random
import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shale.sidecar.log.errors import InvalidIndexEntryError
from shale.sidecar.log.records import Record, decode_batch, encode_batch
from shale.sidecar.log.segment import LogSegment, filename_prefix, offset_from_filename
from support.logtest_util import FakeClock, segment_batches

SETTINGS = settings(max_examples=40, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])

INT32_MAX = 2**31 - 1


def make_segment(directory, base: int, *, interval: int = 10, max_index_size: int = 1000,
                 clock: FakeClock | None = None, **kw) -> LogSegment:
    return LogSegment(str(directory), base, index_interval_bytes=interval, max_index_size=max_index_size,
                      now_ms=clock or FakeClock(), **kw)


def records(offset: int, *values: str, ts: int | None = None) -> bytes:
    """Kafka's LogSegmentTest.records: consecutive offsets from `offset`, every timestamp offset * 10."""
    t = offset * 10 if ts is None else ts
    return encode_batch([Record(offset + i, t, None, v.encode()) for i, v in enumerate(values)])


def append(seg: LogSegment, data: bytes, largest_ts: int | None = None) -> None:
    h = decode_batch(data).header
    seg.append(h.last_offset, h.max_timestamp if largest_ts is None else largest_ts, h.last_offset, data)


def values(data: bytes) -> list[tuple[int, bytes | None]]:
    out = []
    pos = 0
    while pos < len(data):
        size = 12 + struct.unpack_from(">i", data, pos + 8)[0]
        if pos + size > len(data):
            break
        out += [(r.offset, r.value) for r in decode_batch(data[pos : pos + size]).records]
        pos += size
    return out


# --- reads ------------------------------------------------------------------------------------

def test_read_on_empty_segment(tmp_path) -> None:
    seg = make_segment(tmp_path, 40)
    assert seg.read(40, 300) is None
    assert seg.next_offset == 40


def test_read_before_first_offset(tmp_path) -> None:
    seg = make_segment(tmp_path, 40)
    ms = records(50, "hello", "there", "little", "bee")
    append(seg, ms)
    sl = seg.read(41, 300)
    assert sl.read() == ms


def test_read_after_last(tmp_path) -> None:
    seg = make_segment(tmp_path, 40)
    append(seg, records(50, "hello", "there"))
    assert seg.read(52, 200) is None


def test_read_from_gap(tmp_path) -> None:
    seg = make_segment(tmp_path, 40)
    ms = records(50, "hello", "there")
    ms2 = records(60, "alpha", "beta")
    append(seg, ms)
    append(seg, ms2)
    sl = seg.read(55, 200)
    assert sl.position == len(ms) and sl.read() == ms2


def test_read_max_position_and_min_one_message(tmp_path) -> None:
    seg = make_segment(tmp_path, 40)
    ms = records(50, "hello", "there")
    ms2 = records(60, "alpha", "beta")
    append(seg, ms)
    append(seg, ms2)
    assert seg.read(50, 10_000).read() == ms + ms2
    assert seg.read(50, 10_000, max_position=len(ms)).read() == ms
    assert seg.read(50, 1).size == 1  # a partial batch: clients skip it, as in Kafka
    assert seg.read(50, 1, min_one_message=True).read() == ms


def test_next_offset_calculation(tmp_path) -> None:
    seg = make_segment(tmp_path, 40)
    assert seg.next_offset == 40
    append(seg, records(50, "hello", "there", "you"))
    assert seg.next_offset == 53


# --- truncation -------------------------------------------------------------------------------

def test_truncate(tmp_path) -> None:
    seg = make_segment(tmp_path, 40)
    offset = 40
    for _ in range(30):
        ms1 = records(offset, "hello")
        ms2 = records(offset + 1, "hello")
        append(seg, ms1, -1)
        append(seg, ms2, -1)
        assert values(seg.read(offset, 10_000).read()) == [(offset, b"hello"), (offset + 1, b"hello")]
        seg.truncate_to(offset + 1)
        assert seg.read(offset, 10_000).read() == ms1
        assert seg.next_offset == offset + 1
        offset += 1


def test_truncate_full_resets_create_time(tmp_path) -> None:
    clock = FakeClock()
    seg = make_segment(tmp_path, 40, clock=clock)
    append(seg, records(40, "hello", "there"), -1)
    clock.sleep(500)
    roll = dict(max_segment_bytes=2**31, max_segment_ms=499, messages_size=10, max_timestamp=-1, max_offset=42)
    assert seg.should_roll(now_ms=clock(), **roll), "500 ms of wall clock passed since creation"
    seg.truncate_to(0)
    assert seg.created_ms == clock()
    assert not seg.should_roll(now_ms=clock(), **roll)
    assert not seg.time_index.is_full and not seg.offset_index.is_full
    assert seg.read(0, 1024) is None and seg.size == 0
    again = records(40, "hello", "there")
    append(seg, again, -1)
    assert seg.read(40, 1024).read() == again


def test_truncate_to_an_offset_in_a_gap(tmp_path) -> None:
    """shouldTruncateEvenIfOffsetPointsToAGapInTheLog."""
    seg = make_segment(tmp_path, 40)
    append(seg, records(40, "first message"))
    append(seg, records(43, "message after gap"))
    seg.truncate_to(41)
    assert seg.next_offset == 41
    assert seg.read(41, 1000) is None


def test_truncate_into_the_middle_of_a_batch_cuts_the_batch(tmp_path) -> None:
    seg = make_segment(tmp_path, 0)
    first = records(0, "a", "b")
    append(seg, first)
    append(seg, records(2, "c", "d", "e"))
    removed = seg.truncate_to(3)
    assert seg.next_offset == 2 and seg.size == len(first) and removed > 0
    assert os.path.getsize(seg.log_path) == len(first)


def test_truncate_empty_segment(tmp_path) -> None:
    clock = FakeClock()
    seg = make_segment(tmp_path, 0, clock=clock)
    seg.close()
    reopened = make_segment(tmp_path, 0, clock=clock)
    assert os.path.getsize(reopened.offset_index.path) == 0 and os.path.getsize(reopened.time_index.path) == 0
    assert reopened.offset_index.is_full, "a trimmed empty index has no slot"
    clock.sleep(500)
    reopened.truncate_to(57)
    assert reopened.created_ms == clock()
    assert not reopened.time_index.is_full and not reopened.offset_index.is_full
    roll = dict(max_segment_bytes=INT32_MAX, max_segment_ms=300_000, messages_size=1024, max_timestamp=-1)
    assert not reopened.should_roll(max_offset=100, now_ms=clock(), **roll)
    clock.sleep(300_001)
    assert not reopened.should_roll(max_offset=100, now_ms=clock(), **roll), "never roll an empty segment for time"
    assert reopened.should_roll(max_offset=INT32_MAX + 200, now_ms=clock(), **roll), "but roll if the offset can't fit"


def test_reload_largest_timestamp_and_next_offset_after_truncation(tmp_path) -> None:
    record_size = len(records(0, "hello"))
    seg = make_segment(tmp_path, 40, interval=2 * record_size - 1)
    offset = 40
    for _ in range(30):
        append(seg, records(offset, "hello"))
        offset += 1
    assert seg.next_offset == offset
    assert seg.time_index.entries == 30 // 2 - 1 == 14
    assert seg.offset_index.entries == 14
    # Entries on appends 3, 5, ..., 29: (the append's offset -> its start position).
    assert [seg.offset_index.entry(i) for i in range(14)] == [(42 + 2 * i, (2 + 2 * i) * record_size) for i in range(14)]
    seg.truncate_to(41)
    assert seg.time_index.entries == 0
    assert seg.largest_timestamp == 400
    assert seg.next_offset == 41


def test_find_offset_by_timestamp(tmp_path) -> None:
    size = len(records(0, "msg00"))
    seg = make_segment(tmp_path, 40, interval=2 * size - 1)
    for i in range(40, 50):
        append(seg, records(i, f"msg{i}"))
    assert seg.largest_timestamp == 490
    assert seg.find_offset_by_timestamp(420, 0)[0] == 42  # an indexed timestamp
    assert seg.find_offset_by_timestamp(421, 0)[0] == 43
    assert seg.find_offset_by_timestamp(430, 0)[0] == 43  # an un-indexed timestamp
    assert seg.find_offset_by_timestamp(431, 0)[0] == 44
    assert seg.find_offset_by_timestamp(491, 0) is None  # beyond the last timestamp
    assert seg.find_offset_by_timestamp(401, 0)[0] == 41  # before the first indexed timestamp
    assert seg.find_offset_by_timestamp(399, 0) == (40, 400)  # before the first timestamp
    assert seg.find_offset_by_timestamp(399, 45) == (45, 450)  # starting offset respected


def test_find_offset_by_timestamp_inside_a_batch_with_unordered_timestamps(tmp_path) -> None:
    seg = make_segment(tmp_path, 0)
    append(seg, encode_batch([Record(0, 500, None, b"a"), Record(1, 100, None, b"b"), Record(2, 700, None, b"c"),
                              Record(3, 600, None, b"d")]))
    assert seg.find_offset_by_timestamp(550, 0) == (2, 700)
    assert seg.find_offset_by_timestamp(50, 0) == (0, 500)
    assert seg.find_offset_by_timestamp(50, 1) == (1, 100)
    assert seg.find_offset_by_timestamp(650, 3) is None


def test_change_file_suffixes(tmp_path) -> None:
    seg = make_segment(tmp_path, 40)
    append(seg, records(40, "hello"))
    names = {f"00000000000000000040{s}" for s in (".log", ".index", ".timeindex")}
    assert names <= set(os.listdir(tmp_path))
    seg.change_suffix("", ".deleted")
    assert set(os.listdir(tmp_path)) == {n + ".deleted" for n in names}
    assert seg.log_path.endswith(".log.deleted")
    seg.change_suffix(".deleted", "")
    assert set(os.listdir(tmp_path)) == names
    assert seg.read(40, 100).read() == records(40, "hello")


def test_file_names_are_20_digit_base_offsets(tmp_path) -> None:
    assert filename_prefix(0) == "00000000000000000000"
    assert filename_prefix(1048576) == "00000000000001048576"
    assert filename_prefix(2**63 - 1) == "09223372036854775807"
    assert offset_from_filename("00000000000001048576.index.deleted") == 1048576
    make_segment(tmp_path, 1048576).close()
    assert sorted(os.listdir(tmp_path)) == ["00000000000001048576.index", "00000000000001048576.log",
                                             "00000000000001048576.timeindex"]


def test_append_offset_overflow_is_refused(tmp_path) -> None:
    seg = make_segment(tmp_path, 0)
    data = records(INT32_MAX + 1, "x")
    with pytest.raises(InvalidIndexEntryError):
        seg.append(INT32_MAX + 1, 10, INT32_MAX + 1, data)
    assert seg.size == 0 and os.path.getsize(seg.log_path) == 0
    seg.append(INT32_MAX, 10, INT32_MAX, records(INT32_MAX, "y"))
    assert seg.next_offset == INT32_MAX + 1


def test_roll_uses_the_first_batch_timestamp_when_reopened(tmp_path) -> None:
    """testGetFirstBatchTimestamp + time-based roll in record time."""
    clock = FakeClock()
    seg = make_segment(tmp_path, 0, clock=clock)
    append(seg, records(0, "a", ts=1000))
    append(seg, records(1, "b", ts=5000))
    seg.close()
    seg = make_segment(tmp_path, 0, clock=clock)
    assert seg.offset_index.is_full, "reopened with trimmed indexes"
    seg.resize_indexes(1000)  # what the loader does to the active segment
    roll = dict(max_segment_bytes=INT32_MAX, max_segment_ms=100, messages_size=10, max_offset=2, now_ms=clock())
    assert not seg.should_roll(max_timestamp=1100, **roll)
    assert seg.should_roll(max_timestamp=1101, **roll), "1101 - first batch's 1000 > 100"
    assert seg.roll_jitter_ms == 0


def test_time_index_last_slot_is_used_on_become_inactive(tmp_path) -> None:
    size = len(records(0, "hello"))
    seg = make_segment(tmp_path, 0, interval=2 * size - 1, max_index_size=60)  # 5 time slots, 7 offset slots
    roll = dict(max_segment_bytes=INT32_MAX, max_segment_ms=2**62, messages_size=size, max_timestamp=0, now_ms=0)
    for i in range(9):
        assert not seg.should_roll(max_offset=i, **roll)
        append(seg, records(i, "hello"))
    assert seg.time_index.entries == 4 and seg.time_index.is_full
    assert seg.should_roll(max_offset=9, **roll), "a full time index rolls the segment"
    append(seg, records(9, "hello"))  # no entry for this append; its timestamp is the segment's largest
    seg.on_become_inactive()
    assert seg.time_index.entries == 5 and seg.time_index.last_entry == (90, 9)
    assert os.path.getsize(seg.time_index.path) == 60
    assert os.path.getsize(seg.offset_index.path) == 8 * seg.offset_index.entries == 32


# --- the index.interval.bytes rule, exactly -------------------------------------------------

@st.composite
def appends(draw):
    """Appends of 1-3 batches, each batch 1-4 records with random value sizes and timestamps."""
    out = []
    offset = 0
    for _ in range(draw(st.integers(1, 40))):
        parts = []
        for _b in range(draw(st.integers(1, 3))):
            n = draw(st.integers(1, 4))
            recs = [Record(offset + i, draw(st.integers(0, 10_000)), b"k", b"x" * draw(st.integers(0, 150)))
                    for i in range(n)]
            offset += n
            parts.append(encode_batch(recs))
        out.append(parts)
    return out


@SETTINGS
@given(appends(), st.integers(0, 600))
def test_index_entries_follow_the_interval_rule_exactly(tmp_path_factory, batch_sets, interval) -> None:
    seg = make_segment(tmp_path_factory.mktemp("s"), 0, interval=interval, max_index_size=8 * 1000)
    expected_offsets, expected_times = [], []
    since = 0
    position = 0
    max_ts = (-1, 0)
    batch_list = []
    for parts in batch_sets:
        data = b"".join(parts)
        headers = []
        at = position
        for p in parts:
            h = decode_batch(p).header
            headers.append(h)
            batch_list.append((at, h))
            at += len(p)
        last = headers[-1].last_offset
        set_max = max(h.max_timestamp for h in headers)
        # Kafka keeps the first batch reaching the maximum.
        set_max_off = next(h.last_offset for h in headers if h.max_timestamp == set_max)
        seg.append(last, set_max, set_max_off, data)
        if set_max > max_ts[0]:
            max_ts = (set_max, set_max_off)
        if since > interval:
            expected_offsets.append((last, position))
            if not expected_times or max_ts[0] > expected_times[-1][0]:
                expected_times.append(max_ts)
            since = 0
        since += len(data)
        position += len(data)
    assert [seg.offset_index.entry(i) for i in range(seg.offset_index.entries)] == expected_offsets
    assert [seg.time_index.entry(i) for i in range(seg.time_index.entries)] == expected_times
    assert seg.max_timestamp_and_offset == max_ts
    # Every offset is found from the index hint.
    for pos, h in batch_list:
        for off in range(h.base_offset, h.last_offset + 1):
            assert seg.translate_offset(off).position == pos

    # Recovery rebuilds per batch (section 2.5): entry (batch last offset -> batch position).
    seg.recover()
    rebuilt, last_entry, running = [], 0, (-1, 0)
    rebuilt_times = []
    for pos, h in batch_list:
        if h.max_timestamp > running[0]:
            running = (h.max_timestamp, h.last_offset)
        if pos - last_entry > interval:
            rebuilt.append((h.last_offset, pos))
            if running[0] > (rebuilt_times[-1][0] if rebuilt_times else -1):
                rebuilt_times.append(running)
            last_entry = pos
    if running[0] > (rebuilt_times[-1][0] if rebuilt_times else -1):
        rebuilt_times.append(running)  # the final entry recover() adds
    assert [seg.offset_index.entry(i) for i in range(seg.offset_index.entries)] == rebuilt
    assert [seg.time_index.entry(i) for i in range(seg.time_index.entries)] == rebuilt_times
    for pos, h in batch_list:
        assert seg.translate_offset(h.base_offset).position == pos


# --- recovery ---------------------------------------------------------------------------------

def _nonsense(path: str, position: int, size: int, seed: int) -> None:
    with open(path, "r+b") as f:
        f.seek(position)
        f.write(random.Random(seed).randbytes(size))


def test_recovery_fixes_corrupt_index(tmp_path) -> None:
    seg = make_segment(tmp_path, 0, max_index_size=1500)
    for i in range(100):
        append(seg, records(i, str(i)), -1)
    path = seg.offset_index.path
    _nonsense(path, 5, os.path.getsize(path) - 5, seed=1)
    seg.recover()
    for i in range(100):
        sl = seg.read(i, 1, max_position=seg.size, min_one_message=True)
        assert values(sl.read())[0][0] == i
    for k in range(seg.offset_index.entries):
        off, pos = seg.offset_index.entry(k)
        assert decode_batch(seg.read(off, 1, min_one_message=True).read()).header.last_offset == off
        assert seg.read(off, 1, min_one_message=True).position == pos


def test_recovery_fixes_corrupt_time_index(tmp_path) -> None:
    seg = make_segment(tmp_path, 0, max_index_size=1500)
    for i in range(100):
        append(seg, records(i, str(i)))
    path = seg.time_index.path
    _nonsense(path, 5, os.path.getsize(path) - 5, seed=2)
    seg.recover()
    for i in range(100):
        assert seg.find_offset_by_timestamp(i * 10, 0)[0] == i
        if i:
            assert seg.find_offset_by_timestamp(i * 10 - 2, 0)[0] == i
    assert seg.time_index.last_entry == (990, 99)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(corrupt_at=st.integers(0, 19), delta=st.integers(0, 14), seed=st.integers(0, 2**32))
def test_recovery_with_corrupt_message(tmp_path_factory, corrupt_at, delta, seed) -> None:
    seg = make_segment(tmp_path_factory.mktemp("c"), 0)
    for i in range(20):
        append(seg, records(i, str(i)), -1)
    position = seg.translate_offset(corrupt_at).position + delta
    _nonsense(seg.log_path, position, seg.size - position, seed)
    before_size = seg.size
    truncated = seg.recover()
    assert [off for _pos, b in segment_batches(seg) for off in [r.offset for r in b.records]] == list(range(corrupt_at))
    assert seg.next_offset == corrupt_at
    assert truncated == before_size - seg.size
    assert os.path.getsize(seg.log_path) == seg.size


def test_recovery_truncates_a_torn_tail_and_preallocated_zeros(tmp_path) -> None:
    seg = make_segment(tmp_path, 0, preallocate_bytes=64 * 1024)
    for i in range(5):
        append(seg, records(i, "v" * 50))
    real = seg.size
    assert os.path.getsize(seg.log_path) == 64 * 1024
    torn = records(5, "w" * 50)
    os.pwrite(seg.fileno(), torn[: len(torn) // 2], real)  # half a batch, then preallocated zeros
    seg.close_handles()  # a crash: nothing trimmed
    again = make_segment(tmp_path, 0)
    assert again.size == 64 * 1024
    assert again.recover() == 64 * 1024 - real
    assert again.size == real == os.path.getsize(again.log_path)
    assert again.next_offset == 5


def test_create_with_init_file_size_clean_shutdown(tmp_path) -> None:
    seg = make_segment(tmp_path, 40, preallocate_bytes=512 * 1024 * 1024)
    ms = records(50, "hello", "there")
    append(seg, ms, -1)
    ms2 = records(60, "alpha", "beta")
    append(seg, ms2, -1)
    assert seg.read(55, 200).read() == ms2
    assert os.path.getsize(seg.log_path) == 512 * 1024 * 1024
    old_size = seg.size
    seg.close()
    assert os.path.getsize(seg.log_path) == old_size, "closing trims the preallocated file"
    again = make_segment(tmp_path, 40, preallocate_bytes=512 * 1024 * 1024)
    assert again.read(55, 200).read() == ms2
    assert again.size == old_size == os.path.getsize(again.log_path)


def test_recovery_of_a_segment_with_more_batches_than_index_slots(tmp_path) -> None:
    """Appends index once per append, recovery once per batch: with multi-batch appends (a follower's
    fetches) and a small segment.index.bytes, recovery must not fail on a full index — the log would
    not load after a crash. Entries are sparse hints, so a full index only means longer scans."""
    seg = make_segment(tmp_path, 0, interval=0, max_index_size=60)  # 7 offset slots, 5 time slots
    offset = 0
    for _ in range(5):
        parts = []
        for _b in range(4):
            parts.append(records(offset, "v", ts=1000 + offset))
            offset += 1
        data = b"".join(parts)
        seg.append(offset - 1, 1000 + offset - 1, offset - 1, data)
    assert seg.offset_index.entries == 4
    seg.close_handles()
    again = make_segment(tmp_path, 0, interval=0, max_index_size=60)
    assert again.recover() == 0
    assert again.offset_index.entries == 7 and again.time_index.entries == 5
    assert again.time_index.last_entry == (1019, 19), "the final entry still takes the kept slot"
    for o in range(20):
        assert again.translate_offset(o).header.base_offset == o
        assert again.find_offset_by_timestamp(1000 + o, 0) == (o, 1000 + o)


def test_slice_read_into_reuses_and_grows_the_buffer(tmp_path) -> None:
    """`LogSlice.read_into` returns the same bytes as `read()`, in the caller's buffer, growing it if needed."""
    from shale.sidecar.log.log import Log
    from shale.sidecar.log.records import Record, encode_batch
    from shale.sidecar.topic_config import TopicConfig

    log = Log(str(tmp_path / "t-0"), TopicConfig.from_mapping({}))
    for i in range(5):
        log.append(encode_batch([Record(0, 1000 + i, b"k%d" % i, b"v" * 300)]))
    found = log.read(2, 10_000)
    buf = bytearray(16)
    view = found.read_into(buf)
    assert bytes(view) == found.read() and len(view) == found.size
    assert len(buf) >= found.size and view.obj is buf
    log.close()


def test_a_segment_dropped_without_close_releases_its_descriptor(tmp_path) -> None:
    # A Log abandoned after an error must not keep its `.log` files open for the life of the process.
    seg = LogSegment(str(tmp_path), 0, index_interval_bytes=4096, max_index_size=1024, now_ms=lambda: 0)
    fd = seg.fileno()
    os.fstat(fd)  # open
    del seg
    gc.collect()
    with pytest.raises(OSError):
        os.fstat(fd)
