"""Retention (delete policy): Kafka's UnifiedLogTest retention scenarios (spec 6, 10.7 items 83-84) on real files.

Each test names the Kafka test it mirrors. The high watermark of a Log is its log end offset
(one replica), so Kafka's updateHighWatermark calls have no counterpart here.
"""

from __future__ import annotations

import os
import time

import pytest
from cleaner_util import temp_files

from shale.sidecar.log.errors import OffsetOutOfRangeError
from shale.sidecar.log.log import Log
from shale.sidecar.log.records import Record, encode_batch
from shale.sidecar.log.retention import (
    deletable_segments,
    delete_log_start_offset_breached,
    delete_old_segments,
    delete_retention_ms_breached,
    delete_retention_size_breached,
)
from support.logtest_util import T0, FakeClock, make_config


def singleton(ts: int = -1, key: bytes | None = b"test", value: bytes = b"test") -> bytes:
    """Kafka's TestUtils.singletonRecords("test".getBytes, key = "test".getBytes, timestamp = ts)."""
    return encode_batch([Record(0, ts, key, value)])


RECORD_SIZE = len(singleton(ts=T0))


def open_log(tmp_path, clock, name: str = "test-0", **props) -> Log:
    return Log(str(tmp_path / name), make_config({key.replace("_", "."): v for key, v in props.items()}), clock=clock)


def append_n(log: Log, n: int, ts: int) -> None:
    for _ in range(n):
        log.append(singleton(ts=ts))


def segment_log(tmp_path, clock, ts: int, n: int = 15, **props) -> Log:
    """Kafka's createRecords x15 with segment.bytes = 5 records: three segments of five."""
    props.setdefault("segment_bytes", RECORD_SIZE * 5)
    log = open_log(tmp_path, clock, **props)
    append_n(log, n, ts)
    return log


# --- retention.bytes ---------------------------------------------------------------------------

def test_should_delete_size_based_segments(tmp_path, clock) -> None:  # UnifiedLogTest.shouldDeleteSizeBasedSegments
    log = segment_log(tmp_path, clock, ts=clock(), retention_bytes=RECORD_SIZE * 10)
    assert len(log.segments) == 3
    assert delete_old_segments(log, clock()) == 1
    assert len(log.segments) == 2, "whole segments go only while at least retention.bytes remain"
    assert log.log_start_offset == 5 and log.size_in_bytes == RECORD_SIZE * 10


def test_should_not_delete_size_based_segments_when_under_retention_size(tmp_path, clock) -> None:
    # UnifiedLogTest.shouldNotDeleteSizeBasedSegmentsWhenUnderRetentionSize
    log = segment_log(tmp_path, clock, ts=clock(), retention_bytes=RECORD_SIZE * 15)
    assert delete_old_segments(log, clock()) == 0
    assert len(log.segments) == 3


def test_retention_bytes_counts_the_active_segment_and_may_leave_less_than_a_segment_over(tmp_path, clock) -> None:
    # spec 6: size = every segment, active included; the log may stay above the limit by < 1 segment
    log = segment_log(tmp_path, clock, ts=clock(), n=13, retention_bytes=RECORD_SIZE * 4)
    assert [s.size // RECORD_SIZE for s in log.segments] == [5, 5, 3]
    # diff = 13 - 4 = 9 records: the first segment (5) goes, the second (5) would leave less than the limit
    assert delete_retention_size_breached(log) == 1
    assert [s.base_offset for s in log.segments] == [5, 10]
    assert 0 < log.size_in_bytes - RECORD_SIZE * 4 < log.segments[0].size
    assert delete_retention_size_breached(log) == 0


# --- retention.ms ------------------------------------------------------------------------------

def test_should_delete_time_based_segments_ready_to_be_deleted(tmp_path, clock) -> None:
    # UnifiedLogTest.shouldDeleteTimeBasedSegmentsReadyToBeDeleted: every segment, the active one included,
    # is past retention.ms; the active one is rolled first so one empty segment remains
    log = segment_log(tmp_path, clock, ts=10, retention_ms=10_000)
    assert len(log.segments) == 3
    old = list(log.segments)
    assert delete_old_segments(log, clock()) == 3
    assert len(log.segments) == 1
    assert log.active_segment.size == 0 and log.active_segment.base_offset == 15
    assert log.log_start_offset == log.log_end_offset == 15
    assert all(s.log_path.endswith(".log.deleted") for s in old)
    log.append(singleton(ts=clock()))
    assert log.log_end_offset == 16, "offsets continue after the deletion"


def test_should_not_delete_time_based_segments_when_none_ready_to_be_deleted(tmp_path, clock) -> None:
    # UnifiedLogTest.shouldNotDeleteTimeBasedSegmentsWhenNoneReadyToBeDeleted
    log = segment_log(tmp_path, clock, ts=clock(), retention_ms=10_000_000)
    assert delete_old_segments(log, clock()) == 0
    assert len(log.segments) == 3


def test_should_not_delete_segments_when_policy_does_not_include_delete(tmp_path, clock) -> None:
    # UnifiedLogTest.shouldNotDeleteSegmentsWhenPolicyDoesNotIncludeDelete
    log = segment_log(tmp_path, clock, ts=10, retention_ms=10_000, retention_bytes=RECORD_SIZE,
                      cleanup_policy="compact")
    assert delete_old_segments(log, clock()) == 0
    assert len(log.segments) == 3


def test_should_delete_segments_ready_to_be_deleted_when_cleanup_policy_is_compact_and_delete(tmp_path, clock) -> None:
    # UnifiedLogTest.shouldDeleteSegmentsReadyToBeDeletedWhenCleanupPolicyIsCompactAndDelete
    log = segment_log(tmp_path, clock, ts=10, retention_ms=10_000, cleanup_policy="compact,delete")
    assert delete_old_segments(log, clock()) == 3
    assert len(log.segments) == 1


def test_should_delete_start_offset_breached_segments_when_policy_does_not_include_delete(tmp_path, clock) -> None:
    # UnifiedLogTest.shouldDeleteStartOffsetBreachedSegmentsWhenPolicyDoesNotIncludeDelete
    log = segment_log(tmp_path, clock, ts=10, retention_ms=10_000, cleanup_policy="compact")
    assert len(log.segments) == 3
    log.increment_log_start_offset(5)
    assert delete_old_segments(log, clock()) == 1
    assert len(log.segments) == 2, "only the segment wholly below the log start offset goes"
    assert log.segments[0].base_offset <= log.log_start_offset
    assert all(s.base_offset > log.log_start_offset for s in log.segments[1:])


def test_retention_ms_uses_the_largest_timestamp_of_the_segment(tmp_path, clock) -> None:
    # docs #impl_deletes: the largest timestamp defines the segment's age, whatever the record order
    log = open_log(tmp_path, clock, segment_bytes=RECORD_SIZE * 3, retention_ms=1000)
    for ts in (clock() - 5000, clock(), clock() - 5000):  # a recent record in the middle
        log.append(singleton(ts=ts))
    for ts in (clock() - 5000,) * 3:
        log.append(singleton(ts=ts))
    log.append(singleton(ts=clock() + 500))
    assert [s.largest_timestamp for s in log.segments[:2]] == [clock(), clock() - 5000]
    assert delete_retention_ms_breached(log, clock()) == 0, "the oldest segment is young; nothing behind it goes"
    assert delete_retention_ms_breached(log, clock() + 1001) == 2
    assert [s.base_offset for s in log.segments] == [6]


def test_retention_ms_falls_back_to_mtime_without_timestamps(tmp_path) -> None:
    # spec 6/2.7: a segment without record timestamps is aged by its file's last-modified time
    now = int(time.time() * 1000)
    clock = FakeClock(now)
    log = open_log(tmp_path, clock, segment_bytes=RECORD_SIZE * 5, retention_ms=60_000)
    append_n(log, 12, -1)
    first, second = log.segments[0], log.segments[1]
    old = (now - 120_000) / 1000
    os.utime(first.log_path, (old, old))
    assert first.largest_timestamp == pytest.approx(now - 120_000, abs=1)
    assert delete_retention_ms_breached(log, now) == 1
    assert log.segments[0] is second and log.log_start_offset == 5


def test_negative_retention_disables_time_and_size_rules(tmp_path, clock) -> None:
    # UnifiedLog.deleteRetentionMsBreachedSegments / deleteRetentionSizeBreachedSegments: < 0 means unlimited
    log = segment_log(tmp_path, clock, ts=10, retention_ms=-1, retention_bytes=-1)
    assert delete_retention_ms_breached(log, clock()) == 0
    assert delete_retention_size_breached(log) == 0
    assert len(log.segments) == 3


# --- the walk ----------------------------------------------------------------------------------

def test_cannot_delete_segments_at_or_above_high_watermark(tmp_path, clock) -> None:
    # UnifiedLogTest.testCannotDeleteSegmentsAtOrAboveHighWatermark, the part a single replica has: with the
    # high watermark at the log end, everything may go, the active segment after a roll, the empty one never
    log = segment_log(tmp_path, clock, ts=10, retention_ms=10_000)
    assert log.high_watermark == log.log_end_offset == 15
    doomed = deletable_segments(log, lambda seg, nxt: True)
    assert [s.base_offset for s in doomed] == [0, 5, 10]
    assert delete_old_segments(log, clock()) == 3
    assert log.log_start_offset == 15 <= log.high_watermark
    assert deletable_segments(log, lambda seg, nxt: True) == [], "an empty active segment is never deletable"
    assert delete_old_segments(log, clock()) == 0


def test_deletable_segments_filter(tmp_path, clock) -> None:  # UnifiedLogTest.testDeletableSegmentsFilter
    log = open_log(tmp_path, clock, segment_bytes=1024 * 1024)
    for _ in range(9):
        log.append(singleton(ts=clock(), key=b"a", value=b"a"))
        log.roll()
    assert len(log.segments) == 10
    deletable = deletable_segments(log, lambda seg, nxt: seg.base_offset <= 5)
    assert [s.base_offset for s in deletable] == [0, 1, 2, 3, 4, 5]
    deletable = deletable_segments(log, lambda seg, nxt: seg.base_offset != 3)
    assert [s.base_offset for s in deletable] == [0, 1, 2], "the walk stops at the first segment that fails"
    assert [s.base_offset for s in deletable_segments(log, lambda s, n: True)] == list(range(9))
    log.append(singleton(ts=clock(), key=b"a", value=b"a"))
    assert [s.base_offset for s in deletable_segments(log, lambda s, n: True)] == list(range(10)), \
        "a non-empty active segment is deletable"


def test_deletable_segments_iteration(tmp_path, clock) -> None:  # UnifiedLogTest.testDeletableSegmentsIteration
    log = open_log(tmp_path, clock, segment_bytes=1024 * 1024)
    for _ in range(9):
        log.append(singleton(ts=clock(), key=b"a", value=b"a"))
        log.roll()
    seen = []

    def predicate(seg, nxt):
        seen.append((seg.base_offset, None if nxt is None else nxt.base_offset))
        return True

    deletable = deletable_segments(log, predicate)
    assert len(log.segments) == 10 and len(deletable) == 9
    assert seen == [(i, i + 1) for i in range(9)], "each segment is offered with the one after it"


# --- log start offset ---------------------------------------------------------------------------

def test_log_deletion_after_delete_records(tmp_path, clock) -> None:  # UnifiedLogTest.testLogDeletionAfterDeleteRecords
    log = segment_log(tmp_path, clock, ts=-1)
    assert len(log.segments) == 3 and log.log_start_offset == 0
    log.increment_log_start_offset(1)
    delete_old_segments(log, clock())
    assert len(log.segments) == 3 and log.log_start_offset == 1
    log.increment_log_start_offset(6)
    delete_old_segments(log, clock())
    assert len(log.segments) == 2 and log.log_start_offset == 6
    log.increment_log_start_offset(15)
    delete_old_segments(log, clock())
    assert len(log.segments) == 1 and log.log_start_offset == 15
    with pytest.raises(OffsetOutOfRangeError):
        log.read(14, 1000)


def test_log_start_offset_rule_alone(tmp_path, clock) -> None:
    # UnifiedLog.deleteLogStartOffsetBreachedSegments: a segment goes when the next one starts at or below the start
    log = segment_log(tmp_path, clock, ts=-1)
    log.increment_log_start_offset(10)
    assert delete_log_start_offset_breached(log) == 2
    assert [s.base_offset for s in log.segments] == [10]
    assert delete_log_start_offset_breached(log) == 0


def test_retention_idempotency(tmp_path, clock) -> None:  # UnifiedLogTest.testRetentionIdempotency
    log = open_log(tmp_path, clock, segment_bytes=2048 * 5, retention_ms=900, file_delete_delay_ms=0)
    log.append(singleton(ts=clock() + 100, key=None, value=b"a"))
    log.roll()
    log.append(singleton(ts=clock(), key=None, value=b"b"))
    log.roll()
    log.append(singleton(ts=clock() + 100, key=None, value=b"c"))
    clock.sleep(901)
    log.increment_log_start_offset(1)
    assert delete_old_segments(log, clock()) == 2, "the start offset rule unblocks the time rule"
    assert delete_old_segments(log, clock()) == 0


@pytest.mark.parametrize("messages", [0, 1, 25])
def test_that_garbage_collecting_segments_doesnt_change_offset(tmp_path, clock, messages) -> None:
    # UnifiedLogTest.testThatGarbageCollectingSegmentsDoesntChangeOffset
    log = open_log(tmp_path, clock, segment_bytes=RECORD_SIZE * 5, retention_ms=1000)
    append_n(log, messages, clock() - 10_000)
    current = log.log_end_offset
    assert current == messages
    delete_old_segments(log, clock())
    assert log.log_end_offset == current, "deleting segments does not change the log end offset"
    assert len(log.segments) == 1, "one segment is left"
    assert delete_old_segments(log, clock()) == 0, "further collection deletes nothing"
    assert log.log_end_offset == current
    assert log.append(singleton(ts=clock())).first_offset == current, "the next append gets the log end offset"


# --- asynchronous deletion ---------------------------------------------------------------------

def test_async_delete(tmp_path, clock) -> None:  # UnifiedLogTest.testAsyncDelete
    delay = 1000
    log = open_log(tmp_path, clock, segment_bytes=RECORD_SIZE * 5, segment_index_bytes=1000,
                   index_interval_bytes=10_000, retention_ms=999, file_delete_delay_ms=delay)
    append_n(log, 100, clock() - 1000)
    segments = list(log.segments)
    old_files = [s.log_path for s in segments] + [s.offset_index.path for s in segments]
    delete_old_segments(log, clock())
    assert len(log.segments) == 1, "only one segment should remain"
    assert all(s.log_path.endswith(".deleted") and s.offset_index.path.endswith(".deleted") for s in segments)
    assert all(os.path.exists(s.log_path) and os.path.exists(s.offset_index.path) for s in segments), \
        "the .deleted files are still there for in-flight reads"
    assert not any(os.path.exists(f) for f in old_files), "the original files are gone"
    clock.sleep(delay - 1)
    assert log.delete_expired_files() == 0
    assert all(os.path.exists(s.log_path) for s in segments)
    clock.sleep(1)
    assert log.delete_expired_files() == len(segments)
    assert temp_files(log.dir) == [], "after file.delete.delay.ms the files are gone"


def test_open_deletes_obsolete_deleted_files(tmp_path, clock) -> None:
    # LogLoaderTest.testOpenDeletesObsoleteFiles: a crash before the delay leaves .deleted files; open removes them
    log = segment_log(tmp_path, clock, ts=10, retention_ms=10_000)
    delete_old_segments(log, clock())
    assert len(temp_files(log.dir)) == 9
    for seg in log.segments:
        seg.close_handles()  # crash: no close, no delayed delete
    reopened = Log(log.dir, log.config, clock=clock, had_clean_shutdown=False, log_start_offset=15)
    assert temp_files(log.dir) == []
    assert reopened.log_start_offset == reopened.log_end_offset == 15
