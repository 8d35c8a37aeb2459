"""A partition log: Kafka's UnifiedLogTest scenarios (spec 4, 5.1, 5.5, 10.7) and bad appends (1.1, 1.8)."""

from __future__ import annotations

import os
import random
import struct

import pytest

from shale.sidecar.log.compression import Compression
from shale.sidecar.log.errors import (
    CorruptRecordError,
    InvalidRecordError,
    OffsetOutOfRangeError,
    RecordTooLargeError,
)
from shale.sidecar.log.log import EARLIEST_TIMESTAMP, LATEST_TIMESTAMP, InvalidTimestampError, Log
from shale.sidecar.log.records import (
    ControlType,
    Record,
    TimestampType,
    check_batch,
    decode_batch,
    encode_batch,
    encode_control_key,
    encode_end_txn_marker,
)
from support.logtest_util import (
    T0,
    FakeClock,
    all_records,
    dir_snapshot,
    read_batch_at,
    records_batch,
    simple_batch,
)

INT32_MAX = 2**31 - 1


def open_log(tmp_path, config, clock=None, name="topic-0", **kw) -> Log:
    return Log(str(tmp_path / name), config, clock=clock or FakeClock(), **kw)


def log_files(log: Log, suffix: str) -> list[str]:
    return sorted(n for n in os.listdir(log.dir) if n.endswith(suffix))


# --- rolling ----------------------------------------------------------------------------------

def test_size_based_log_roll(tmp_path, make_config, clock) -> None:
    set_size = len(simple_batch(ts=clock()))
    msg_per_seg = 10
    log = open_log(tmp_path, make_config({"segment.bytes": msg_per_seg * (set_size - 1)}), clock)
    assert len(log.segments) == 1
    for _ in range(msg_per_seg + 1):
        log.append(simple_batch(ts=clock()))
    assert len(log.segments) == 2
    # roll when size > segment.bytes - new bytes: the 10th append no longer fits.
    assert log.segments[1].base_offset == 9 and log.segments[0].size == 9 * set_size
    assert log_files(log, ".log") == ["00000000000000000000.log", "00000000000000000009.log"]


def test_time_based_log_roll_during_append(tmp_path, make_config, clock) -> None:
    log = open_log(tmp_path, make_config({"segment.ms": 3600}), clock)
    segment_ms = 3600
    assert len(log.segments) == 1
    # Records without timestamps: the roll uses the wall clock since the segment was created.
    clock.sleep(segment_ms + 1)
    log.append(simple_batch())
    assert len(log.segments) == 1, "doesn't roll if doing so creates an empty segment"
    log.append(simple_batch())
    assert len(log.segments) == 2, "rolls on this append since time has expired"
    for n in (3, 4):
        clock.sleep(segment_ms + 1)
        log.append(simple_batch())
        assert len(log.segments) == n
    # A timestamped record into a segment whose first record had none: still the wall clock.
    ts = clock() + segment_ms + 1
    log.append(simple_batch(ts=ts))
    assert len(log.segments) == 4
    clock.sleep(segment_ms + 1)
    log.append(simple_batch(ts=ts))
    assert len(log.segments) == 5, "a new segment is rolled"
    clock.sleep(segment_ms + 1)
    log.append(simple_batch(ts=ts))
    assert len(log.segments) == 5, "the roll depends on the timestamp of the segment's first record, not the clock"
    log.append(simple_batch(ts=clock()))
    assert len(log.segments) == 6, "a record segment.ms after the first one rolls the segment"


@pytest.mark.parametrize("seed", range(8))
def test_time_based_log_roll_jitter(tmp_path, make_config, clock, seed) -> None:
    max_jitter = 20 * 60
    segment_ms = 60 * 60
    log = open_log(tmp_path, make_config({"segment.ms": segment_ms, "segment.jitter.ms": max_jitter}), clock,
                   rng=random.Random(seed))
    jitter = log.active_segment.roll_jitter_ms
    assert 0 <= jitter < max_jitter
    log.append(simple_batch(ts=clock()))
    clock.sleep(segment_ms - max_jitter)
    log.append(simple_batch(ts=clock()))
    assert len(log.segments) == 1, "does not roll earlier than the max jitter"
    clock.sleep(max_jitter - jitter + 1)
    log.append(simple_batch(ts=clock()))
    assert len(log.segments) == 2, "rolls after segment.ms minus the random jitter"


def test_time_based_roll_is_capped_by_max_compaction_lag_on_compacted_topics(tmp_path, make_config, clock) -> None:
    cfg = make_config({"segment.ms": 10_000, "max.compaction.lag.ms": 100, "cleanup.policy": "compact"})
    log = open_log(tmp_path, cfg, clock)
    log.append(simple_batch(key=b"k", ts=T0))
    log.append(simple_batch(key=b"k", ts=T0 + 100))
    assert len(log.segments) == 1
    log.append(simple_batch(key=b"k", ts=T0 + 101))
    assert len(log.segments) == 2
    plain = open_log(tmp_path, make_config({"segment.ms": 10_000, "max.compaction.lag.ms": 100}), clock, name="p-0")
    plain.append(simple_batch(ts=T0))
    plain.append(simple_batch(ts=T0 + 5000))
    assert len(plain.segments) == 1, "max.compaction.lag.ms only caps segment.ms when the topic is compacted"


def test_roll_segment_that_already_exists(tmp_path, make_config, clock) -> None:
    """KAFKA-6388: an empty active segment at the new base is replaced, not an error."""
    log = open_log(tmp_path, make_config({"segment.ms": 3600}), clock)
    log.roll(0)
    assert len(log.segments) == 1
    log.append(encode_batch([Record(0, clock(), b"k1", b"v1")]), assign_offsets=False)
    assert len(log.segments) == 1 and log.active_segment.base_offset == 0
    log.append(encode_batch([Record(1, clock() + 10, b"k2", b"v2")]), assign_offsets=False)
    assert log.log_end_offset == 2
    assert read_batch_at(log, 0).header.last_offset == 0
    assert read_batch_at(log, 1).header.last_offset == 1
    log.roll()
    assert log.active_segment.base_offset == 2 and len(log.segments) == 2
    log.active_segment.offset_index.resize(0)  # force a roll of the empty active segment on the next append
    log.append(encode_batch([Record(2, clock() + 12, b"k3", b"v3")]), assign_offsets=False)
    assert log.active_segment.offset_index.max_entries > 1
    assert read_batch_at(log, 2).header.last_offset == 2
    assert len(log.segments) == 2
    assert log_files(log, ".log") == ["00000000000000000000.log", "00000000000000000002.log"]


def test_roll_never_goes_below_the_log_end(tmp_path, make_config, clock) -> None:
    log = open_log(tmp_path, make_config(), clock)
    log.append(simple_batch(ts=clock()))
    assert log.roll(0).base_offset == 1, "max(requested base, log end)"
    assert [s.base_offset for s in log.segments] == [0, 1]
    # Rolling further (a follower's expected next offset) keeps the empty segment, as LocalLog.roll does.
    assert log.roll(7).base_offset == 7
    assert [s.base_offset for s in log.segments] == [0, 1, 7]
    assert log.segments[1].size == 0 and os.path.getsize(log.segments[1].offset_index.path) == 0
    assert log_files(log, ".log") == ["00000000000000000000.log", "00000000000000000001.log",
                                      "00000000000000000007.log"]
    assert log.log_end_offset == 1 and log.read(1, 100) is None


def test_relative_offset_overflow_rolls(tmp_path, make_config, clock) -> None:
    log = open_log(tmp_path, make_config(), clock)
    log.append(encode_batch([Record(0, clock(), b"k", b"v")]), assign_offsets=False)
    far = INT32_MAX + 2
    assert log.active_segment.should_roll(max_segment_bytes=2**31, max_segment_ms=2**62, messages_size=1,
                                          max_timestamp=clock(), max_offset=far, now_ms=clock())
    log.append(encode_batch([Record(far, clock(), b"k", b"v")]), assign_offsets=False)
    assert [s.base_offset for s in log.segments] == [0, far]
    log.append(encode_batch([Record(far + 1, clock(), b"k", b"v")]), assign_offsets=False)
    assert [s.base_offset for s in log.segments] == [0, far]
    assert log.log_end_offset == far + 2
    assert read_batch_at(log, 1).header.base_offset == far


def test_index_resizing_at_truncation(tmp_path, make_config, clock) -> None:
    set_size = len(simple_batch(ts=clock()))
    msg_per_seg = 10
    cfg = make_config({"segment.bytes": msg_per_seg * set_size, "index.interval.bytes": set_size - 1,
                       "segment.index.bytes": 4096})
    log = open_log(tmp_path, cfg, clock)
    for _ in range(msg_per_seg):
        clock.sleep(1)
        log.append(simple_batch(ts=clock()))
    assert len(log.segments) == 1
    clock.sleep(msg_per_seg)
    for _ in range(msg_per_seg):
        clock.sleep(1)
        log.append(simple_batch(ts=clock()))
    assert len(log.segments) == 2
    first = log.segments[0]
    assert first.offset_index.max_entries == msg_per_seg - 1 == first.offset_index.entries
    assert first.time_index.max_entries == msg_per_seg - 1
    log.truncate_to(0)
    assert len(log.segments) == 1
    assert log.segments[0].offset_index.max_entries == 4096 // 8
    assert log.segments[0].time_index.max_entries == 4096 // 12
    for _ in range(msg_per_seg):
        clock.sleep(1)
        log.append(simple_batch(ts=clock()))
    assert len(log.segments) == 1


def test_preallocated_indexes_are_trimmed_on_roll_and_close(tmp_path, make_config, clock) -> None:
    cfg = make_config({"segment.index.bytes": 4096, "index.interval.bytes": 1, "segment.bytes": 700})
    log = open_log(tmp_path, cfg, clock)
    for i in range(30):
        log.append(simple_batch(ts=T0 + i))
    assert len(log.segments) > 2
    for seg in log.segments[:-1]:
        assert os.path.getsize(seg.offset_index.path) == 8 * seg.offset_index.entries > 0
        assert os.path.getsize(seg.time_index.path) == 12 * seg.time_index.entries > 0
        assert os.path.getsize(seg.log_path) == seg.size
    active = log.active_segment
    assert os.path.getsize(active.offset_index.path) == 4096
    assert os.path.getsize(active.time_index.path) == 4092
    counts = [(s.offset_index.entries, s.time_index.entries) for s in log.segments]
    lookups = [log.offset_for_timestamp(T0 + i) for i in range(30)]
    log.close()
    for seg in log.segments:
        assert os.path.getsize(seg.offset_index.path) == 8 * counts[log.segments.index(seg)][0]
        assert os.path.getsize(seg.time_index.path) == 12 * counts[log.segments.index(seg)][1]
    again = open_log(tmp_path, cfg, clock)
    assert [(s.offset_index.entries, s.time_index.entries) for s in again.segments] == counts
    assert os.path.getsize(again.active_segment.offset_index.path) == 4096, "the active segment is preallocated again"
    assert [again.offset_for_timestamp(T0 + i) for i in range(30)] == lookups == [(i, T0 + i) for i in range(30)]


def test_time_index_keeps_its_last_slot_for_the_roll_entry(tmp_path, make_config, clock) -> None:
    set_size = len(simple_batch(ts=T0))
    cfg = make_config({"segment.index.bytes": 60, "index.interval.bytes": 2 * set_size - 1})
    log = open_log(tmp_path, cfg, clock)
    for i in range(40):
        log.append(simple_batch(ts=T0 + 10 * i))
    assert len(log.segments) > 3
    for seg in log.segments[:-1]:
        assert seg.time_index.entries <= 5
        ts, off = seg.time_index.last_entry
        assert (ts, off) == seg.max_timestamp_and_offset == (T0 + 10 * (seg.next_offset - 1), seg.next_offset - 1)
    # The time index fills (4 of 5 slots) before the 7-slot offset index: that is what rolled.
    assert log.segments[0].offset_index.entries == 4 and log.segments[0].next_offset == 9


def test_build_time_index_when_not_assigning_offsets(tmp_path, make_config, clock) -> None:
    log = open_log(tmp_path, make_config({"segment.bytes": 10000, "index.interval.bytes": 1}), clock)
    for i in range(100):
        log.append(encode_batch([Record(100 + i, clock() + i, None, str(i).encode())]), assign_offsets=False)
    assert sum(s.time_index.entries for s in log.segments) == 99
    assert log.active_segment.time_index.last_entry[0] == clock() + 99


def test_append_with_out_of_order_offsets_is_refused(tmp_path, make_config, clock) -> None:
    log = open_log(tmp_path, make_config(), clock)
    data = b"".join(encode_batch([Record(o, clock(), b"key", b"value")]) for o in (0, 1, 3, 2, 4))
    before = dir_snapshot(log.dir)
    with pytest.raises(InvalidRecordError, match="topic-0"):
        log.append(data, assign_offsets=False)
    assert log.log_end_offset == 0 and dir_snapshot(log.dir) == before


def test_follower_append_below_the_log_end_is_refused(tmp_path, make_config, clock) -> None:
    log = open_log(tmp_path, make_config(), clock)
    log.append(encode_batch([Record(5, clock(), b"k", b"v")]), assign_offsets=False)
    before = dir_snapshot(log.dir)
    with pytest.raises(InvalidRecordError, match="out of order"):
        log.append(encode_batch([Record(5, clock(), b"k", b"v")]), assign_offsets=False)
    assert log.log_end_offset == 6 and dir_snapshot(log.dir) == before


# --- reads ------------------------------------------------------------------------------------

def test_append_and_read_with_sequential_offsets(tmp_path, make_config, clock) -> None:
    log = open_log(tmp_path, make_config({"segment.bytes": 71}), clock)
    values = [str(i).encode() for i in range(0, 100, 2)]
    for v in values:
        log.append(simple_batch(v))
    assert len(log.segments) == len(values), "every append rolls with segment.bytes = 71"
    for i, v in enumerate(values):
        batch = read_batch_at(log, i)
        assert batch.header.last_offset == i
        assert batch.records[0].key is None and batch.records[0].value == v
    assert read_batch_at(log, len(values)) is None, "reading at the log end returns nothing"


def test_append_and_read_with_non_sequential_offsets(tmp_path, make_config, clock) -> None:
    log = open_log(tmp_path, make_config({"segment.bytes": 72}), clock)
    ids = list(range(50)) + list(range(50, 200, 7))
    for i in ids:
        log.append(encode_batch([Record(i, -1, None, str(i).encode())]), assign_offsets=False)
    for i in range(50, max(ids)):
        want = next(x for x in ids if x >= i)
        rec = read_batch_at(log, i).records[0]
        assert rec.offset == want and rec.value == str(want).encode()


@pytest.mark.parametrize("codec", list(Compression), ids=lambda c: c.config_name)
def test_compressed_messages(tmp_path, make_config, clock, codec) -> None:
    log = open_log(tmp_path, make_config({"segment.bytes": 200}), clock)
    log.append(records_batch([(None, b"hello", 1), (None, b"there", 2)], compression=codec))
    log.append(records_batch([(None, b"alpha", 3), (None, b"beta", 4)], compression=codec))
    # Reading any offset of a compressed batch returns the whole batch.
    assert [read_batch_at(log, o).records[0].offset for o in range(4)] == [0, 0, 2, 2]
    assert [r.value for r in all_records(log)] == [b"hello", b"there", b"alpha", b"beta"]
    assert all(decode_batch(read_batch_at_bytes(log, o)).header.compression is codec for o in (0, 2))


def read_batch_at_bytes(log: Log, offset: int) -> bytes:
    data = log.read(offset, 1, min_one_message=True).read()
    return data[: 12 + struct.unpack_from(">i", data, 8)[0]]


def test_read_at_log_gap(tmp_path, make_config, clock) -> None:
    log = open_log(tmp_path, make_config({"segment.bytes": 300}), clock)
    for i in range(0, 50, 5):  # gaps of four offsets, as compaction leaves
        log.append(encode_batch([Record(i, clock(), b"k", b"v%d" % i)]), assign_offsets=False)
    for o in range(0, 46):
        assert read_batch_at(log, o).records[0].offset == (o + 4) // 5 * 5


def test_read_bounds(tmp_path, make_config, clock) -> None:
    log = open_log(tmp_path, make_config({"segment.bytes": 200}), clock)
    for i in range(10):
        log.append(simple_batch(b"v%d" % i, ts=clock()))
    assert log.read(10, 100) is None
    with pytest.raises(OffsetOutOfRangeError, match="topic-0"):
        log.read(11, 100)
    with pytest.raises(OffsetOutOfRangeError):
        log.read(-1, 100)
    # max_offset (a high watermark) bounds what is returned.
    sl = log.read(log.segments[-1].base_offset, 10_000, max_offset=log.log_end_offset - 1)
    got = [r.offset for r in decode_many(sl.read())]
    assert got == list(range(log.segments[-1].base_offset, 9))
    assert log.read(5, 100, max_offset=5) is None
    log.increment_log_start_offset(4)
    with pytest.raises(OffsetOutOfRangeError):
        log.read(3, 100)
    assert read_batch_at(log, 4).records[0].value == b"v4"
    with pytest.raises(OffsetOutOfRangeError):
        log.increment_log_start_offset(11)
    assert log.offset_for_timestamp(EARLIEST_TIMESTAMP) == (4, -1)
    assert log.offset_for_timestamp(LATEST_TIMESTAMP) == (10, -1)


def decode_many(data: bytes) -> list[Record]:
    out, pos = [], 0
    while pos + 12 <= len(data):
        size = 12 + struct.unpack_from(">i", data, pos + 8)[0]
        if pos + size > len(data):
            break
        out += decode_batch(data[pos : pos + size]).records
        pos += size
    return out


def test_offset_for_timestamp_across_segments(tmp_path, make_config, clock) -> None:
    log = open_log(tmp_path, make_config({"segment.bytes": 250, "index.interval.bytes": 1}), clock)
    stamps = [100, 90, 300, 250, 260, 500, 480, 490, 700, 10]
    for ts in stamps:
        log.append(simple_batch(ts=ts))
    assert len(log.segments) > 3
    for target in range(0, 720, 5):
        want = next(((o, t) for o, t in enumerate(stamps) if t >= target), None)
        assert log.offset_for_timestamp(target) == want, target


# --- truncation -------------------------------------------------------------------------------

def test_truncate_to(tmp_path, make_config, clock) -> None:
    set_size = len(simple_batch(ts=clock()))
    msg_per_seg = 10
    log = open_log(tmp_path, make_config({"segment.bytes": msg_per_seg * set_size}), clock)
    for _ in range(msg_per_seg):
        log.append(simple_batch(ts=clock()))
    assert len(log.segments) == 1 and log.log_end_offset == msg_per_seg
    last, size = log.log_end_offset, log.size_in_bytes
    log.truncate_to(log.log_end_offset)
    assert (log.log_end_offset, log.size_in_bytes) == (last, size)
    log.truncate_to(log.log_end_offset + 1)
    assert (log.log_end_offset, log.size_in_bytes) == (last, size)
    log.truncate_to(msg_per_seg // 2)
    assert log.log_end_offset == msg_per_seg // 2 and log.size_in_bytes < size
    log.truncate_to(0)
    assert log.log_end_offset == 0 and log.size_in_bytes == 0
    for _ in range(msg_per_seg):
        log.append(simple_batch(ts=clock()))
    assert (log.log_end_offset, log.size_in_bytes) == (last, size)
    log.truncate_fully_and_start_at(log.log_end_offset - (msg_per_seg - 1))
    assert log.log_end_offset == last - (msg_per_seg - 1) and log.size_in_bytes == 0
    assert log.log_start_offset == 1 and log.segments[0].base_offset == 1
    for _ in range(msg_per_seg):
        log.append(simple_batch(ts=clock()))
    assert log.log_end_offset > msg_per_seg and log.size_in_bytes == size
    log.truncate_to(0)  # before the first segment: start over at 0
    assert log.log_end_offset == 0 and log.size_in_bytes == 0 and log.log_start_offset == 0


def test_truncation_deletes_later_segments_asynchronously(tmp_path, make_config, clock) -> None:
    log = open_log(tmp_path, make_config({"segment.bytes": 200, "file.delete.delay.ms": 1000}), clock)
    for i in range(12):
        log.append(simple_batch(ts=clock()))
    bases = [s.base_offset for s in log.segments]
    assert len(bases) >= 3
    log.truncate_to(bases[1])
    assert [s.base_offset for s in log.segments] == bases[:2] and log.log_end_offset == bases[1]
    doomed = [f"{b:020d}.log.deleted" for b in bases[2:]]
    assert set(doomed) <= set(os.listdir(log.dir))
    assert log.delete_expired_files() == 0, "not before file.delete.delay.ms"
    clock.sleep(1000)
    assert log.delete_expired_files() == len(bases) - 2
    assert not [n for n in os.listdir(log.dir) if n.endswith(".deleted")]
    assert log.recovery_point <= log.log_end_offset


# --- flushing ---------------------------------------------------------------------------------

def test_flush_messages_moves_the_recovery_point(tmp_path, make_config, clock) -> None:
    log = open_log(tmp_path, make_config({"flush.messages": 3}), clock)
    points = []
    for _ in range(7):
        log.append(simple_batch(ts=clock()))
        points.append(log.recovery_point)
    assert points == [0, 0, 3, 3, 3, 6, 6]
    log.append(records_batch([(None, b"a", 1), (None, b"b", 1), (None, b"c", 1)]))
    assert log.recovery_point == 10


def test_flush_ms_via_maybe_flush(tmp_path, make_config, clock) -> None:
    log = open_log(tmp_path, make_config({"flush.ms": 1000}), clock)
    log.append(simple_batch(ts=clock()))
    clock.sleep(999)
    assert not log.maybe_flush() and log.recovery_point == 0
    clock.sleep(1)
    assert log.maybe_flush() and log.recovery_point == 1
    assert log.last_flush_ms == clock()
    clock.sleep(5000)
    assert not log.maybe_flush(), "nothing unflushed"


def test_roll_and_close_move_the_recovery_point(tmp_path, make_config, clock) -> None:
    log = open_log(tmp_path, make_config(), clock)
    for _ in range(3):
        log.append(simple_batch(ts=clock()))
    assert log.recovery_point == 0
    log.roll()
    assert log.recovery_point == 3 == log.active_segment.base_offset
    log.append(simple_batch(ts=clock()))
    log.close()
    assert log.recovery_point == 4


# --- timestamps -------------------------------------------------------------------------------

def test_log_append_time_topic_stamps_the_batch(tmp_path, make_config, clock) -> None:
    log = open_log(tmp_path, make_config({"message.timestamp.type": "LogAppendTime"}), clock)
    data = records_batch([(b"a", b"1", 5), (b"b", b"2", 6)], compression=Compression.LZ4)
    info = log.append(data)
    assert info.log_append_time == clock() and info.max_timestamp == clock()
    stored = read_batch_at_bytes(log, 0)
    h = check_batch(stored)  # the CRC was recomputed
    assert h.timestamp_type is TimestampType.LOG_APPEND_TIME and h.max_timestamp == clock()
    assert h.base_timestamp == 5, "baseTimestamp is left alone"
    assert [r.timestamp for r in decode_batch(stored).records] == [clock(), clock()]
    assert log.offset_for_timestamp(clock()) == (0, clock())


def test_create_time_window(tmp_path, make_config, clock) -> None:
    cfg = make_config({"message.timestamp.before.max.ms": 1000, "message.timestamp.after.max.ms": 500})
    log = open_log(tmp_path, cfg, clock)
    log.append(simple_batch(ts=clock() - 1000))
    log.append(simple_batch(ts=clock() + 500))
    before = dir_snapshot(log.dir)
    for ts in (clock() - 1001, clock() + 501):
        with pytest.raises(InvalidTimestampError, match="topic-0 offset 2"):
            log.append(simple_batch(ts=ts))
    assert dir_snapshot(log.dir) == before and log.log_end_offset == 2


def test_control_batches_need_no_key_on_compacted_topics(tmp_path, make_config, clock) -> None:
    log = open_log(tmp_path, make_config({"cleanup.policy": "compact"}), clock)
    marker = encode_batch([Record(0, clock(), encode_control_key(ControlType.ABORT), encode_end_txn_marker(0))],
                          producer_id=7, producer_epoch=0, is_transactional=True, is_control=True)
    assert len(marker) == 78
    log.append(marker)
    assert log.log_end_offset == 1


# --- bad input: the right error, the partition named, not a byte written -----------------------

def _refresh_crc(raw: bytearray) -> bytes:
    import crc32c

    struct.pack_into(">I", raw, 17, crc32c.crc32c(bytes(raw[21:])))
    return bytes(raw)


def _good(ts=T0) -> bytes:
    return records_batch([(b"k1", b"v1", ts), (b"k2", b"v2", ts + 1)])


def _corrupt_crc() -> bytes:
    raw = bytearray(_good())
    raw[-3] ^= 0xFF
    return bytes(raw)


def _wrong_magic() -> bytes:
    raw = bytearray(_good())
    raw[16] = 1
    return bytes(raw)


def _negative_count() -> bytes:
    raw = bytearray(_good())
    struct.pack_into(">i", raw, 57, -1)
    return _refresh_crc(raw)


def _count_mismatch() -> bytes:
    raw = bytearray(_good())
    struct.pack_into(">i", raw, 57, 1)
    return _refresh_crc(raw)


BAD_APPENDS = {
    "corrupt-crc": ({}, lambda: _corrupt_crc(), CorruptRecordError, r"crc.*topic-0|topic-0.*crc"),
    "second-batch-corrupt": ({}, lambda: _good() + _corrupt_crc(), CorruptRecordError, "topic-0"),
    "truncated": ({}, lambda: _good()[:-5], CorruptRecordError, "topic-0"),
    "truncated-second": ({}, lambda: _good() + _good()[:30], CorruptRecordError, "topic-0"),
    "header-only-fragment": ({}, lambda: _good()[:8], CorruptRecordError, "topic-0"),
    "wrong-magic": ({}, lambda: _wrong_magic(), CorruptRecordError, "magic.*topic-0"),
    "negative-record-count": ({}, lambda: _negative_count(), CorruptRecordError, "negative record count.*topic-0"),
    "count-vs-offset-delta": ({}, lambda: _count_mismatch(), InvalidRecordError, "topic-0 offset 3"),
    "empty": ({}, lambda: b"", CorruptRecordError, "topic-0"),
    "garbage": ({}, lambda: random.Random(5).randbytes(300), CorruptRecordError, "topic-0"),
    "max-message-bytes": ({"max.message.bytes": 100}, lambda: records_batch([(b"k", b"v" * 100, T0)]),
                          RecordTooLargeError, "topic-0 offset 3.*max.message.bytes"),
    "segment-bytes": ({"segment.bytes": 300}, lambda: _good() + _good() + _good() + _good(),
                      RecordTooLargeError, "topic-0.*segment.bytes"),
    "unkeyed-on-compacted": ({"cleanup.policy": "compact"},
                             lambda: records_batch([(b"k", b"v", T0), (None, b"v", T0)]),
                             InvalidRecordError, "without key in topic-0 offset 3"),
    "producer-log-append-time": ({}, lambda: records_batch([(b"k", b"v", T0)], max_timestamp=T0,
                                                           timestamp_type=TimestampType.LOG_APPEND_TIME),
                                 InvalidTimestampError, "LogAppendTime.*topic-0 offset 3"),
}


@pytest.mark.parametrize("case", list(BAD_APPENDS))
def test_bad_append_is_refused_and_leaves_the_log_untouched(tmp_path, make_config, clock, case) -> None:
    props, build, error, pattern = BAD_APPENDS[case]
    cfg = make_config({"segment.bytes": 1000, "index.interval.bytes": 1, **props})
    log = open_log(tmp_path, cfg, clock)
    log.append(records_batch([(b"a", b"1", T0)]))
    log.roll()
    log.append(records_batch([(b"b", b"2", T0), (b"c", b"3", T0)]))
    before = dir_snapshot(log.dir)
    state = (log.log_end_offset, log.recovery_point, [s.base_offset for s in log.segments], log.active_segment.size)
    with pytest.raises(error, match=pattern):
        log.append(build())
    assert dir_snapshot(log.dir) == before, "not a byte written"
    assert (log.log_end_offset, log.recovery_point, [s.base_offset for s in log.segments],
            log.active_segment.size) == state
    # The log is still fine: a good append goes where the bad one would have.
    info = log.append(records_batch([(b"d", b"4", T0)]))
    assert info.first_offset == 3
    assert [r.value for r in all_records(log)] == [b"1", b"2", b"3", b"4"]


def test_follower_append_on_a_log_append_time_topic_keeps_the_leaders_bytes(tmp_path, make_config, clock) -> None:
    """Only the leader stamps LogAppendTime; a follower stores the replicated batch unchanged."""
    log = open_log(tmp_path, make_config({"message.timestamp.type": "LogAppendTime"}), clock)
    leader_time = clock() - 5000
    data = encode_batch([Record(0, 10, b"k", b"v"), Record(1, 11, b"k2", b"v2")],
                        timestamp_type=TimestampType.LOG_APPEND_TIME, max_timestamp=leader_time)
    info = log.append(data, assign_offsets=False)
    assert info.max_timestamp == leader_time and info.log_append_time == -1
    assert read_batch_at_bytes(log, 0) == data
    assert [r.timestamp for r in all_records(log)] == [leader_time, leader_time]


def test_truncate_to_a_negative_offset_is_refused(tmp_path, make_config, clock) -> None:
    log = open_log(tmp_path, make_config(), clock)
    log.append(simple_batch(ts=clock()))
    before = dir_snapshot(log.dir)
    with pytest.raises(OffsetOutOfRangeError, match="topic-0"):
        log.truncate_to(-1)
    assert dir_snapshot(log.dir) == before and log.log_end_offset == 1


def test_follower_appends_skip_the_leaders_record_validation(tmp_path, make_config, clock) -> None:
    """appendAsFollower: no LogValidator (keys, timestamps) and ignoreRecordSize, since the leader accepted
    the data, possibly under an older config; segment.bytes still applies."""
    cfg = make_config({"cleanup.policy": "compact", "message.timestamp.before.max.ms": 1000,
                       "max.message.bytes": 100, "segment.bytes": 2000})
    log = open_log(tmp_path, cfg, clock)
    old_unkeyed = encode_batch([Record(0, clock() - 10**9, None, b"x" * 200)])
    assert len(old_unkeyed) > 100
    info = log.append(old_unkeyed, assign_offsets=False)
    assert info.last_offset == 0 and read_batch_at_bytes(log, 0) == old_unkeyed
    with pytest.raises(RecordTooLargeError, match="segment.bytes"):
        log.append(encode_batch([Record(1, clock(), b"k", b"x" * 2000)]), assign_offsets=False)
    # The leader path still validates all of it.
    for bad in (encode_batch([Record(0, clock(), None, b"v")]), encode_batch([Record(0, clock() - 10**9, b"k", b"v")]),
                encode_batch([Record(0, clock(), b"k", b"x" * 200)])):
        with pytest.raises((InvalidRecordError, RecordTooLargeError)):
            log.append(bad)
    assert log.log_end_offset == 1
