"""Selection, states and checkpoints of the cleaner: Kafka's LogCleanerManagerTest (spec 7.2, 7.10-7.12, 10.2
items 35-48) and the cleaner threads end to end (LogCleanerIntegrationTest & co., 10.3 items 49-52).

Each test names the Kafka test it mirrors. States are reached through real transitions (grab, pause,
abort), never set by hand. Thread tests run real `LogCleaner` threads with a short back-off against a
fake clock the test moves, and wait on observable state (checkpoints, the last-run time), not on sleeps.
"""

from __future__ import annotations

import os
import threading
import time

import pytest
from cleaner_util import (
    TxnProducer,
    batches,
    key_values,
    latest_per_key,
    make_cleaner,
    read_all,
    record,
    temp_files,
)

from shale.sidecar.log.checkpoint import CLEANER_OFFSET_CHECKPOINT
from shale.sidecar.log.cleaner_manager import (
    CleanableOffsets,
    CleanerManager,
    CleaningState,
    CleaningStateError,
    LogCleaningError,
)
from shale.sidecar.log.compression import Compression
from shale.sidecar.log.errors import CorruptRecordError
from shale.sidecar.log.log_cleaner import CleanerConfig, LogCleaner
from shale.sidecar.log.log_dir import LogDir
from shale.sidecar.log.records import Record, encode_batch
from shale.sidecar.log.topic_partition import TopicPartition
from shale.sidecar.log.txn_scan import scan
from support.logtest_util import T0, FakeClock, dir_snapshot, make_config

LOW_RETENTION = {"cleanup.policy": "compact", "segment.bytes": 2048, "retention.ms": 1,
                 "min.cleanable.dirty.ratio": 0.05}  # Kafka's createLowRetentionLogConfig


class Cluster:
    """A log directory with per-topic configs, its cleaner manager, and a cleaner over it."""

    opened: list["Cluster"] = []  # closed after each test (`close_clusters`)

    def __init__(self, tmp_path, clock, configs: dict[str, dict]) -> None:
        self.configs = dict(configs)
        self.clock = clock
        self.dir = LogDir(str(tmp_path / "data"), lambda topic: make_config(self.configs[topic]), clock=clock)
        self.logs = lambda: dict(self.dir.logs)  # a snapshot: partitions come and go under the threads
        self.manager = CleanerManager(self.dir.path, self.logs, clock)
        Cluster.opened.append(self)

    def log(self, topic: str, partition: int = 0):
        return self.dir.get_or_create(TopicPartition(topic, partition))

    def cleaner(self, **kw):
        return make_cleaner(1000, clock=self.clock,
                            check_aborted=lambda lg: self.manager.check_aborted(lg.topic_partition), **kw)

    def threads(self, **cfg) -> LogCleaner:
        cfg.setdefault("backoff_ms", 10)
        cfg.setdefault("dedupe_buffer_size", 1 << 16)
        return LogCleaner(self.manager, self.logs, CleanerConfig(**cfg), self.clock)


@pytest.fixture(autouse=True)
def close_clusters():
    """Close each test's log directory: its logs, and the `.lock` descriptor it holds."""
    yield
    while Cluster.opened:
        Cluster.opened.pop().dir.close()


def write_records(log, clock, num_batches: int, records_per_batch: int = 1, batches_per_segment: int = 5) -> None:
    """LogCleanerManagerTest.writeRecords: roll every `batches_per_segment` batches."""
    for i in range(num_batches):
        recs = [Record(j, clock(), str(log.log_end_offset + j).encode(), b"v") for j in range(records_per_batch)]
        log.append(encode_batch(recs))
        if (i + 1) % batches_per_segment == 0:
            log.roll()


def filthy_logs(cluster: Cluster, topic: str, partitions: int, start: int = 20, increment: int = 5):
    """LogCleanerManagerTest.setupIncreasinglyFilthyLogs: partition i holds start + i*increment batches."""
    cluster.configs.setdefault(topic, LOW_RETENTION)
    logs = []
    for p in range(partitions):
        log = cluster.log(topic, p)
        write_records(log, cluster.clock, start + p * increment)
        logs.append(log)
    return logs


def wait_until(condition, timeout_s: float = 10.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.005)


def write_dups(log, clock, num_keys: int, num_dups: int, codec: Compression = Compression.NONE,
               start_value: int = 0) -> list[tuple[int, int]]:
    """LogCleanerIntegrationTest.writeDups: num_dups rounds of every key, values counting up."""
    written = []
    value = start_value
    for _ in range(num_dups):
        for key in range(num_keys):
            log.append(encode_batch([Record(0, clock(), str(key).encode(), str(value).encode())], compression=codec))
            written.append((key, value))
            value += 1
    return written


def tp(topic: str, p: int = 0) -> TopicPartition:
    return TopicPartition(topic, p)


@pytest.fixture
def wall_clock() -> FakeClock:
    """A fake clock starting at the real time: retention of empty (cleaned) segments falls back to file mtimes."""
    return FakeClock(int(time.time() * 1000))


# --- 35-37: grabFilthiestCompactedLog ----------------------------------------------------------

def test_grab_filthiest_compacted_log_returns_log_with_dirtiest_ratio(tmp_path, clock) -> None:
    # LogCleanerManagerTest.testGrabFilthiestCompactedLogReturnsLogWithDirtiestRatio: ranges [20,20],[20,25],[20,30]
    c = Cluster(tmp_path, clock, {})
    filthy_logs(c, "wishing-well", 3)
    for p in range(3):
        c.manager.update_checkpoint(tp("wishing-well", p), 20)
    grabbed = c.manager.grab_filthiest_compacted_log()
    assert grabbed[0] == tp("wishing-well", 2) and grabbed[1].log is c.dir.logs[tp("wishing-well", 2)]
    assert (grabbed[1].first_dirty_offset, grabbed[1].first_uncleanable_offset) == (20, 30)
    assert c.manager.state(tp("wishing-well", 2)).state is CleaningState.IN_PROGRESS
    assert c.manager.max_dirty_ratio == pytest.approx(grabbed[1].cleanable_ratio)


def test_grab_filthiest_compacted_log_ignores_uncleanable_partitions(tmp_path, clock) -> None:
    # LogCleanerManagerTest.testGrabFilthiestCompactedLogIgnoresUncleanablePartitions
    c = Cluster(tmp_path, clock, {})
    filthy_logs(c, "wishing-well", 3)
    for p in range(3):
        c.manager.update_checkpoint(tp("wishing-well", p), 20)
    c.manager.mark_uncleanable(tp("wishing-well", 2), "test")
    assert c.manager.grab_filthiest_compacted_log()[0] == tp("wishing-well", 1)


def test_grab_filthiest_compacted_log_ignores_in_progress_partitions(tmp_path, clock) -> None:
    # LogCleanerManagerTest.testGrabFilthiestCompactedLogIgnoresInProgressPartitions
    c = Cluster(tmp_path, clock, {})
    filthy_logs(c, "wishing-well", 3)
    for p in range(3):
        c.manager.update_checkpoint(tp("wishing-well", p), 20)
    assert c.manager.grab_filthiest_compacted_log()[0] == tp("wishing-well", 2)
    assert c.manager.grab_filthiest_compacted_log()[0] == tp("wishing-well", 1)


def test_grab_filthiest_compacted_log_ignores_both(tmp_path, clock) -> None:
    # LogCleanerManagerTest.testGrabFilthiestCompactedLogIgnoresBothInProgressPartitionsAndUncleanablePartitions
    c = Cluster(tmp_path, clock, {})
    filthy_logs(c, "wishing-well", 3)
    for p in range(3):
        c.manager.update_checkpoint(tp("wishing-well", p), 20)
    c.manager.mark_uncleanable(tp("wishing-well", 2), "test")
    assert c.manager.grab_filthiest_compacted_log()[0] == tp("wishing-well", 1)
    assert c.manager.grab_filthiest_compacted_log() is None, "partition 0 has nothing dirty"


def corrupt_first_batch_magic(log) -> None:
    with open(log.segments[0].log_path, "r+b") as f:
        f.seek(16)
        f.write(b"\x07")


def test_grab_filthiest_compacted_log_throws_exception(tmp_path, clock) -> None:
    # LogCleanerManagerTest.testGrabFilthiestCompactedLogThrowsException: an error while computing a log's figures
    # is a LogCleaningException naming that log; the cleaner thread marks it uncleanable and carries on
    c = Cluster(tmp_path, clock, {})
    bad, good = filthy_logs(c, "A", 2, start=20, increment=0)
    corrupt_first_batch_magic(bad)
    with pytest.raises(LogCleaningError) as info:
        c.manager.grab_filthiest_compacted_log()
    assert info.value.tp == tp("A", 0) and isinstance(info.value.__cause__, CorruptRecordError)
    threads = c.threads()
    cleaner = c.cleaner()
    assert threads.clean_once(cleaner) is False
    state = c.manager.state(tp("A", 0))
    assert state.state is CleaningState.UNCLEANABLE and "Failed to calculate log cleaning stats" in state.reason
    assert threads.clean_once(cleaner) is True, "the other partition is still cleaned"
    assert c.manager.read_checkpoint() == {tp("A", 1): 20}


# --- 38-40, 45, 48: cleanable offsets ------------------------------------------------------------

def test_dirty_offset_reset_if_larger_than_end_offset(tmp_path, clock) -> None:
    # LogCleanerManagerTest.testDirtyOffsetResetIfLargerThanEndOffset
    c = Cluster(tmp_path, clock, {})
    filthy_logs(c, "foo", 1)
    c.manager.update_checkpoint(tp("foo"), 200)
    grabbed = c.manager.grab_filthiest_compacted_log()
    assert grabbed[1].first_dirty_offset == 0
    assert c.manager.read_checkpoint() == {tp("foo"): 0}, "the invalid checkpoint is rewritten at once"


def test_dirty_offset_reset_if_smaller_than_start_offset(tmp_path, clock) -> None:
    # LogCleanerManagerTest.testDirtyOffsetResetIfSmallerThanStartOffset
    c = Cluster(tmp_path, clock, {})
    (log,) = filthy_logs(c, "foo", 1)
    log.increment_log_start_offset(10)
    c.manager.update_checkpoint(tp("foo"), 0)
    grabbed = c.manager.grab_filthiest_compacted_log()
    assert grabbed[1].first_dirty_offset == 10


def test_log_start_offset_larger_than_active_segment_base_offset(tmp_path, clock) -> None:
    # LogCleanerManagerTest.testLogStartOffsetLargerThanActiveSegmentBaseOffset (after an unclean leader election)
    c = Cluster(tmp_path, clock, {"foo": LOW_RETENTION})
    log = c.log("foo")
    for _ in range(3):
        log.append(encode_batch([Record(i, clock(), b"k%d" % i, b"v") for i in range(3)]))
    assert len(log.segments) == 1
    log.increment_log_start_offset(2)
    c.manager.update_checkpoint(tp("foo"), 0)
    offsets = c.manager.cleanable_offsets(tp("foo"), log, 0, clock())
    assert (offsets.first_dirty, offsets.first_uncleanable, offsets.force_checkpoint_update) == (2, 2, True)
    ltc = c.manager.log_to_clean(log, offsets, clock())
    assert ltc.cleanable_bytes == 0 and ltc.first_uncleanable_offset == 0
    assert c.manager.grab_filthiest_compacted_log() is None
    assert c.manager.read_checkpoint() == {tp("foo"): 2}


def test_dirty_offset_larger_than_active_segment_base_offset(tmp_path, clock) -> None:
    # LogCleanerManagerTest.testDirtyOffsetLargerThanActiveSegmentBaseOffset
    c = Cluster(tmp_path, clock, {"foo": LOW_RETENTION})
    log = c.log("foo")
    for _ in range(3):
        log.append(encode_batch([Record(i, clock(), b"k%d" % i, b"v") for i in range(3)]))
    c.manager.update_checkpoint(tp("foo"), 3)
    offsets = c.manager.cleanable_offsets(tp("foo"), log, 3, clock())
    assert (offsets.first_dirty, offsets.first_uncleanable) == (3, 3)
    assert c.manager.log_to_clean(log, offsets, clock()).cleanable_bytes == 0
    assert c.manager.grab_filthiest_compacted_log() is None
    assert c.manager.read_checkpoint() == {tp("foo"): 3}


def eight_segments(tmp_path, clock, **props):
    cfg = {"cleanup.policy": "compact", "segment.bytes": 1024, **props}
    c = Cluster(tmp_path, clock, {"log": cfg})
    log = c.log("log")
    while len(log.segments) < 8:
        log.append(record(log.log_end_offset, log.log_end_offset, clock()))
    return c, log


def test_cleanable_offsets_for_none(tmp_path, clock) -> None:  # LogCleanerManagerTest.testCleanableOffsetsForNone
    c, log = eight_segments(tmp_path, clock)
    offsets = c.manager.cleanable_offsets(tp("log"), log, 0, clock())
    assert offsets.first_dirty == 0
    assert log.last_stable_offset == log.high_watermark, "no transaction is in progress"
    assert offsets.first_uncleanable == min(log.last_stable_offset, log.active_segment.base_offset)


def test_cleanable_offsets_active_segment(tmp_path, clock) -> None:
    # LogCleanerManagerTest.testCleanableOffsetsActiveSegment
    c, log = eight_segments(tmp_path, clock)
    offsets = c.manager.cleanable_offsets(tp("log"), log, 0, clock())
    assert offsets.first_dirty == 0
    assert offsets.first_uncleanable == log.active_segment.base_offset


def test_cleanable_offsets_for_time(tmp_path, clock) -> None:  # LogCleanerManagerTest.testCleanableOffsetsForTime
    lag = 60 * 60 * 1000
    c = Cluster(tmp_path, clock, {"log": {"cleanup.policy": "compact", "segment.bytes": 1024,
                                          "min.compaction.lag.ms": lag}})
    log = c.log("log")
    t0 = clock()
    while len(log.segments) < 4:
        log.append(record(log.log_end_offset, log.log_end_offset, t0))
    active_at_t0 = log.active_segment
    clock.sleep(lag + 1)
    while len(log.segments) < 8:
        log.append(record(log.log_end_offset, log.log_end_offset, clock()))
    offsets = c.manager.cleanable_offsets(tp("log"), log, 0, clock())
    assert offsets.first_dirty == 0
    assert offsets.first_uncleanable == active_at_t0.base_offset, "the second block is within the lag"


def test_cleanable_offsets_for_short_time(tmp_path, clock) -> None:
    # LogCleanerManagerTest.testCleanableOffsetsForShortTime
    lag = 60 * 60 * 1000
    c = Cluster(tmp_path, clock, {"log": {"cleanup.policy": "compact", "segment.bytes": 1024,
                                          "min.compaction.lag.ms": lag}})
    log = c.log("log")
    t0 = clock()
    while len(log.segments) < 8:
        log.append(record(log.log_end_offset, log.log_end_offset, t0))
    assert c.manager.cleanable_offsets(tp("log"), log, 0, clock()).first_uncleanable == 0, "all within the lag"
    clock.sleep(lag + 1)
    offsets = c.manager.cleanable_offsets(tp("log"), log, 0, clock())
    assert offsets.first_uncleanable == log.active_segment.base_offset


def test_cleanable_offsets_needs_checkpoint_reset(tmp_path, clock) -> None:
    # LogCleanerManagerTest.testCleanableOffsetsNeedsCheckpointReset
    c = Cluster(tmp_path, clock, {})
    (log,) = filthy_logs(c, "foo", 1)
    log.increment_log_start_offset(10)
    assert not c.manager.cleanable_offsets(tp("foo"), log, 15, clock()).force_checkpoint_update
    log.increment_log_start_offset(20)
    assert c.manager.cleanable_offsets(tp("foo"), log, 15, clock()).force_checkpoint_update, "below the log start"
    assert c.manager.cleanable_offsets(tp("foo"), log, 25, clock()).force_checkpoint_update, "above the log end"


def test_undecided_transactional_data_not_cleanable(tmp_path, clock) -> None:
    # LogCleanerManagerTest.testUndecidedTransactionalDataNotCleanable
    lag = 60 * 60 * 1000
    c = Cluster(tmp_path, clock, {"log": {"cleanup.policy": "compact", "segment.bytes": 1024,
                                          "min.compaction.lag.ms": lag}})
    log = c.log("log")
    p = TxnProducer(log, 15, clock=clock)
    p([1, 2])
    p([3])
    log.roll()
    clock.sleep(lag + 1)
    offsets = c.manager.cleanable_offsets(tp("log"), log, 0, clock())
    assert (offsets.first_dirty, offsets.first_uncleanable) == (0, 0), "undecided data is never cleanable"
    p.abort()
    log.roll()
    offsets = c.manager.cleanable_offsets(tp("log"), log, 0, clock())
    assert (offsets.first_dirty, offsets.first_uncleanable) == (0, 3), "the first segment, right away"
    clock.sleep(lag + 1)
    assert c.manager.cleanable_offsets(tp("log"), log, 0, clock()).first_uncleanable == 4, "the marker after the lag"


def test_checkpoint_updated_for_invalid_offset_no_cleaning(tmp_path, clock) -> None:
    # LogCleanerManagerTest.testCheckpointUpdatedForInvalidOffsetNoCleaning
    c = Cluster(tmp_path, clock, {})
    (log,) = filthy_logs(c, "foo", 1)
    log.increment_log_start_offset(20)
    c.manager.update_checkpoint(tp("foo"), 15)
    assert c.manager.grab_filthiest_compacted_log() is None, "the log should not be selected"
    assert c.manager.read_checkpoint() == {tp("foo"): 20}, "but its checkpoint is updated"


def test_checkpoint_updated_for_invalid_offset_not_selected(tmp_path, clock) -> None:
    # LogCleanerManagerTest.testCheckpointUpdatedForInvalidOffsetNotSelected
    c = Cluster(tmp_path, clock, {})
    log0, _log1 = filthy_logs(c, "foo", 2)
    log0.increment_log_start_offset(15)
    c.manager.update_checkpoint(tp("foo", 0), 10)
    c.manager.update_checkpoint(tp("foo", 1), 5)
    assert c.manager.grab_filthiest_compacted_log()[0] == tp("foo", 1)
    assert c.manager.read_checkpoint()[tp("foo", 0)] == 15


def test_log_to_clean_uses_the_segment_holding_the_uncleanable_offset(tmp_path, clock) -> None:
    # LogCleanerManager.calculateCleanableBytes: nonActiveLogSegmentsFrom(uncleanable).head is the floor segment
    c, log = eight_segments(tmp_path, clock)
    segs = log.segments
    mid = segs[3].base_offset + 2
    ltc = c.manager.log_to_clean(log, CleanableOffsets(segs[1].base_offset, mid, False), clock())
    assert ltc.first_uncleanable_offset == segs[3].base_offset
    assert ltc.clean_bytes == segs[0].size
    assert ltc.cleanable_bytes == segs[1].size + segs[2].size
    ltc = c.manager.log_to_clean(log, CleanableOffsets(0, log.log_end_offset, False), clock())
    assert ltc.first_uncleanable_offset == log.active_segment.base_offset


def test_dirty_ratio_must_be_strictly_greater_than_the_minimum(tmp_path, clock) -> None:
    # LogCleanerManager.grabFilthiestCompactedLog: cleanableRatio > min.cleanable.dirty.ratio (strict)
    c = Cluster(tmp_path, clock, {"half": {**LOW_RETENTION, "min.cleanable.dirty.ratio": 0.5}})
    log = c.log("half")
    for i in range(20):
        log.append(record(f"k{i:02d}", f"{i:02d}", clock()))  # equal-sized batches
        if i % 5 == 4:
            log.roll()
    c.manager.update_checkpoint(tp("half"), 10)
    ratio = c.manager.log_to_clean(log, c.manager.cleanable_offsets(tp("half"), log, 10, clock()), clock())
    assert ratio.cleanable_ratio == pytest.approx(0.5)
    assert c.manager.grab_filthiest_compacted_log() is None
    c.manager.update_checkpoint(tp("half"), 5)
    assert c.manager.grab_filthiest_compacted_log()[0] == tp("half")


def test_max_compaction_delay(tmp_path, clock) -> None:
    # LogCleanerManager.maxCompactionDelay (the max-compaction-delay-secs gauge): the first batch of the oldest
    # dirty non-active segment, past max.compaction.lag.ms; nothing dirty below the active segment means 0
    c = Cluster(tmp_path, clock, {"log": {"cleanup.policy": "compact", "max.compaction.lag.ms": 1000,
                                          "min.cleanable.dirty.ratio": 1.0}})
    log = c.log("log")
    t0 = clock()
    for i in range(3):
        log.append(record(i, i, t0))
    log.roll()
    log.append(record(9, 9, t0))
    clock.sleep(5000)
    grabbed = c.manager.grab_filthiest_compacted_log()
    assert grabbed is not None, "past the max lag a log is cleaned whatever its dirty ratio"
    assert grabbed[1].max_compaction_delay_ms == c.manager.max_compaction_delay_ms == 5000 - 1000
    c.manager.done_cleaning(tp("log"), log.active_segment.base_offset)
    clock.sleep(5000)
    assert c.manager.grab_filthiest_compacted_log() is None
    assert c.manager.max_compaction_delay_ms == 0, "clean up to the active segment: no delay"


# --- 41-42: retention of compacted logs ----------------------------------------------------------

def test_logs_with_segments_to_delete(tmp_path, clock) -> None:
    # LogCleanerManagerTest.testLogsWithSegmentsToDeleteShouldNotConsiderCleanupPolicyDeleteLogs /
    # ...ShouldConsiderCleanupPolicyCompactDeleteLogs / ...CompactLogs / ...NotConsiderUncleanablePartitions
    c = Cluster(tmp_path, clock, {"d": {"cleanup.policy": "delete"}, "cd": {"cleanup.policy": "compact,delete"},
                                  "c": {"cleanup.policy": "compact"}, "u": {"cleanup.policy": "compact"}})
    for topic in ("d", "cd", "c", "u"):
        c.log(topic).append(record(1, 1, clock()))
    c.manager.mark_uncleanable(tp("u"), "test")
    deletable = c.manager.deletable_logs()
    assert sorted(t.topic for t, _log in deletable) == ["c", "cd"]
    assert all(c.manager.state(t).state is CleaningState.IN_PROGRESS for t, _ in deletable)
    assert c.manager.deletable_logs() == [], "in progress: not offered twice"
    c.manager.done_deleting([t for t, _ in deletable])
    assert all(c.manager.state(t).state is CleaningState.IDLE for t, _ in deletable)


def test_logs_under_cleanup_ineligible_for_compaction(tmp_path, clock) -> None:
    # LogCleanerManagerTest.testLogsUnderCleanupIneligibleForCompaction
    c = Cluster(tmp_path, clock, {"log": {"cleanup.policy": "delete", "segment.bytes": 5 * 80}})
    log = c.log("log")
    log.append(record(1, 1, clock()))
    log.roll()
    log.append(record(1, 1, clock()))
    assert c.manager.pause(tp("log")) == 1  # the retention thread works on it
    log.config = make_config({"cleanup.policy": "compact", "min.cleanable.dirty.ratio": 0})
    assert c.manager.grab_filthiest_compacted_log() is None, "paused: not available for compaction"
    assert c.manager.resume(tp("log")) == 0
    grabbed = c.manager.grab_filthiest_compacted_log()
    assert grabbed[0] == tp("log")
    log.config = make_config({"cleanup.policy": "delete"})
    assert c.manager.deletable_logs() == []
    with pytest.raises(CleaningStateError):
        c.manager.resume(tp("log"))  # in progress, not paused
    c.manager.done_deleting([tp("log")])
    assert c.manager.state(tp("log")).state is CleaningState.IDLE
    assert c.manager.pause(tp("log")) == 1


# --- 43: checkpoint maintenance ---------------------------------------------------------------

def test_update_checkpoints(tmp_path, clock) -> None:
    # LogCleanerManagerTest.testUpdateCheckpointsShouldAddOffsetToPartition / ...ShouldRemovePartitionData,
    # testMaybeTruncateCheckpointShouldTruncateData; the bytes are Kafka's checkpoint format
    c = Cluster(tmp_path, clock, {"A": LOW_RETENTION, "B": LOW_RETENTION})
    c.log("A", 0)
    c.log("B", 1)
    path = os.path.join(c.dir.path, CLEANER_OFFSET_CHECKPOINT)
    c.manager.update_checkpoint(tp("A", 0), 5)
    c.manager.update_checkpoint(tp("B", 1), 7)
    with open(path, "rb") as f:
        assert f.read() == b"0\n2\nA 0 5\nB 1 7\n"
    c.manager.maybe_truncate_checkpoint(tp("A", 0), 9)
    assert c.manager.read_checkpoint()[tp("A", 0)] == 5, "only lowered, never raised"
    c.manager.maybe_truncate_checkpoint(tp("A", 0), 3)
    assert c.manager.read_checkpoint()[tp("A", 0)] == 3
    c.manager.update_checkpoint(tp("B", 1), None)
    with open(path, "rb") as f:
        assert f.read() == b"0\n1\nA 0 3\n"
    c.manager.update_checkpoint(tp("Gone", 0), 1)
    assert c.manager.read_checkpoint() == {tp("A", 0): 3}, "only partitions of this directory are kept"
    c.dir.delete(tp("A", 0))
    c.manager.forget(tp("A", 0))
    assert c.manager.read_checkpoint() == {}


def test_corrupt_checkpoint_is_read_as_empty(tmp_path, clock) -> None:
    # CheckpointFile: a malformed cleaner-offset-checkpoint means "clean from the log start", not a crash
    c = Cluster(tmp_path, clock, {})
    filthy_logs(c, "foo", 1)
    with open(os.path.join(c.dir.path, CLEANER_OFFSET_CHECKPOINT), "wb") as f:
        f.write(b"0\n5\nfoo 0 x\n")
    assert c.manager.read_checkpoint() == {}
    assert c.manager.grab_filthiest_compacted_log()[1].first_dirty_offset == 0


# --- 44, 47, 48: states -------------------------------------------------------------------------

def test_concurrent_log_cleanup_and_log_truncation(tmp_path, clock) -> None:
    # LogCleanerManagerTest.testConcurrentLogCleanupAndLogTruncation: pauses are counted
    c = Cluster(tmp_path, clock, {"log": LOW_RETENTION})
    c.log("log").append(record(1, 1, clock()))
    t = tp("log")
    assert c.manager.pause(t) == 1  # retention starts
    assert c.manager.pause(t) == 2  # truncation after an unclean leader election
    assert c.manager.resume(t) == 1
    assert c.manager.state(t).state is CleaningState.PAUSED, "still paused by the retention"
    assert c.manager.resume(t) == 0
    assert c.manager.state(t).state is CleaningState.IDLE
    with pytest.raises(CleaningStateError):
        c.manager.resume(t)


def test_concurrent_log_cleanup_and_topic_deletion(tmp_path, clock) -> None:
    # LogCleanerManagerTest.testConcurrentLogCleanupAndTopicDeletion: abortCleaning = abortAndPause + resume
    c = Cluster(tmp_path, clock, {"log": LOW_RETENTION})
    c.log("log").append(record(1, 1, clock()))
    t = tp("log")
    c.manager.pause(t)
    c.manager.pause(t)
    c.manager.resume(t)
    assert c.manager.state(t).pause_count == 1
    c.manager.resume(t)
    assert c.manager.state(t).state is CleaningState.IDLE


def test_paused_state_records_when_it_was_entered(tmp_path, clock) -> None:
    # spec 7.10 / KAFKA-9087 lesson: a paused partition is visible with its count and since-time
    c = Cluster(tmp_path, clock, {"log": LOW_RETENTION})
    c.log("log")
    clock.sleep(1234)
    c.manager.pause(tp("log"))
    clock.sleep(10)
    c.manager.pause(tp("log"))
    state = c.manager.states()[tp("log")]
    assert (state.state, state.pause_count, state.since_ms) == (CleaningState.PAUSED, 2, T0 + 1234)


def test_done_cleaning(tmp_path, clock) -> None:  # LogCleanerManagerTest.testDoneCleaning
    c, log = eight_segments(tmp_path, clock, **{"min.cleanable.dirty.ratio": 0.0})
    t = tp("log")
    with pytest.raises(CleaningStateError):
        c.manager.done_cleaning(t, 1)
    c.manager.pause(t)
    with pytest.raises(CleaningStateError):
        c.manager.done_cleaning(t, 1)
    c.manager.resume(t)
    assert c.manager.grab_filthiest_compacted_log()[0] == t
    c.manager.done_cleaning(t, 1)
    assert c.manager.state(t).state is CleaningState.IDLE
    assert c.manager.read_checkpoint() == {t: 1}
    assert c.manager.grab_filthiest_compacted_log()[0] == t
    c.manager.abort_in_progress()
    assert c.manager.state(t).state is CleaningState.ABORTED
    c.manager.done_cleaning(t, 5)
    assert (c.manager.state(t).state, c.manager.state(t).pause_count) == (CleaningState.PAUSED, 1)
    assert c.manager.read_checkpoint() == {t: 1}, "an aborted pass does not move the checkpoint"


def test_done_deleting(tmp_path, clock) -> None:  # LogCleanerManagerTest.testDoneDeleting
    c = Cluster(tmp_path, clock, {"log": {**LOW_RETENTION, "cleanup.policy": "compact,delete"}})
    c.log("log").append(record(1, 1, clock()))
    t = tp("log")
    assert [x for x, _ in c.manager.deletable_logs()] == [t]
    c.manager.done_deleting([t])
    assert c.manager.state(t).state is CleaningState.IDLE
    assert [x for x, _ in c.manager.deletable_logs()] == [t]
    c.manager.abort_in_progress()
    c.manager.done_deleting([t])
    assert (c.manager.state(t).state, c.manager.state(t).pause_count) == (CleaningState.PAUSED, 1)


def test_pause_aborts_a_running_pass_and_waits_for_it(tmp_path, clock) -> None:
    # LogCleanerManager.abortAndPauseCleaning: in progress -> aborted, wait until the thread notices; the pass
    # leaves no .cleaned file, no checkpoint, and the partition ends Paused(1) with the caller's pause counted
    c = Cluster(tmp_path, clock, {"log": {"cleanup.policy": "compact", "segment.bytes": 512,
                                          "min.cleanable.dirty.ratio": 0.0}})
    log = c.log("log")
    write_dups(log, clock, 10, 4)
    log.roll()
    before = dir_snapshot(log.dir)
    gate, entered = threading.Event(), threading.Event()

    def throttle(_n: int) -> None:
        if not entered.is_set():
            entered.set()
            assert gate.wait(10)

    threads = c.threads()
    worker = threading.Thread(target=threads.clean_once, args=(c.cleaner(throttle=throttle),))
    worker.start()
    assert entered.wait(10)
    assert c.manager.state(tp("log")).state is CleaningState.IN_PROGRESS
    result = []
    pauser = threading.Thread(target=lambda: result.append(c.manager.pause(tp("log"))))
    pauser.start()
    wait_until(lambda: c.manager.state(tp("log")).state is CleaningState.ABORTED, what="the abort request")
    assert pauser.is_alive(), "pause waits for the running pass"
    gate.set()
    worker.join(10)
    pauser.join(10)
    assert result == [1]
    assert (c.manager.state(tp("log")).state, c.manager.state(tp("log")).pause_count) == (CleaningState.PAUSED, 1)
    assert c.manager.read_checkpoint() == {}
    assert dir_snapshot(log.dir) == before and temp_files(log.dir) == []
    assert c.manager.resume(tp("log")) == 0


# --- paused and uncleanable partitions get neither cleaning nor retention -----------------------

@pytest.mark.parametrize("how", ["paused", "uncleanable"])
def test_paused_or_uncleanable_logs_get_neither_cleaning_nor_retention(tmp_path, wall_clock, how) -> None:
    clock = wall_clock
    # spec 6 / 7.11, KAFKA-15082 & KAFKA-16114: the cleaner thread runs compacted-topic retention, and skips
    # partitions that are paused or uncleanable for both
    cfg = {"cleanup.policy": "compact,delete", "segment.bytes": 512, "retention.ms": 60_000,
           "min.cleanable.dirty.ratio": 0.0}
    c = Cluster(tmp_path, clock, {"log": cfg})
    log = c.log("log")
    write_dups(log, clock, 10, 4)
    clock.sleep(120_000)  # every segment is past retention.ms
    before = dir_snapshot(log.dir)
    t = tp("log")
    if how == "paused":
        c.manager.pause(t)
    else:
        c.manager.mark_uncleanable(t, "test")
    threads, cleaner = c.threads(), c.cleaner()
    assert threads.clean_once(cleaner) is False
    assert dir_snapshot(log.dir) == before, "neither cleaned nor trimmed by retention"
    assert c.manager.read_checkpoint() == {}
    if how == "paused":
        c.manager.resume(t)
        assert threads.clean_once(cleaner) is True
        assert len(log.segments) == 1 and log.log_start_offset == log.log_end_offset, "cleaned, then all expired"


# --- 49-52: the cleaner threads ---------------------------------------------------------------

def jogeajgoea(log) -> None:
    """LogCleanerIntegrationTest.breakPartitionLog: overwrite the last segment's file with text."""
    with open(log.active_segment.log_path, "w") as f:
        f.write("jogeajgoea")


def test_marks_partitions_as_offline_and_populates_uncleanable_metrics(tmp_path, clock) -> None:
    # LogCleanerIntegrationTest.testMarksPartitionsAsOfflineAndPopulatesUncleanableMetrics
    cfg = {"cleanup.policy": "compact", "segment.bytes": 2048, "min.cleanable.dirty.ratio": 0.0}
    c = Cluster(tmp_path, clock, {"log": cfg})
    logs = [c.log("log", p) for p in range(3)]
    for log in logs[:2]:
        write_dups(log, clock, 20, 3)
        jogeajgoea(log)
        write_dups(log, clock, 20, 3)
    write_dups(logs[2], clock, 20, 3)
    threads = c.threads()
    threads.start()
    try:
        wait_until(lambda: len(c.manager.uncleanable()) == 2, what="two uncleanable partitions")
        wait_until(lambda: tp("log", 2) in c.manager.read_checkpoint(), what="the healthy partition cleaned")
    finally:
        threads.shutdown()
    assert threads.dead_threads == 0
    uncleanable = c.manager.uncleanable()
    assert set(uncleanable) == {tp("log", 0), tp("log", 1)}
    assert all("CorruptRecordError" in s.reason for s in uncleanable.values())
    expected = sum(sum(s.size for s in log.segments[:-1]) for log in logs[:2])
    assert c.manager.uncleanable_bytes() == expected > 0
    c.dir.delete(tp("log", 0))
    c.manager.forget(tp("log", 0))
    assert set(c.manager.uncleanable()) == {tp("log", 1)}
    assert c.manager.uncleanable_bytes() == sum(s.size for s in logs[1].segments[:-1])


def test_max_log_compaction_lag(tmp_path, clock) -> None:  # LogCleanerIntegrationTest.testMaxLogCompactionLag
    hour = 60 * 60 * 1000
    min_lag, max_lag = hour, 6 * hour
    cfg = {"cleanup.policy": "compact", "segment.bytes": 512, "min.compaction.lag.ms": min_lag,
           "max.compaction.lag.ms": max_lag, "min.cleanable.dirty.ratio": 1.0}
    c = Cluster(tmp_path, clock, {"log": cfg})
    log = c.log("log")
    write_dups(log, clock, 100, 3)
    start_size = log.size_in_bytes
    active_at_t0 = log.active_segment.base_offset
    threads = c.threads()
    threads.start()
    try:
        clock.sleep(max_lag // 2)
        looked_at = clock()
        threads.wake()
        wait_until(lambda: c.manager.last_run_ms >= looked_at, what="a cleaner loop after the clock moved")
        threads.wake()
        wait_until(lambda: c.manager.last_run_ms >= looked_at and
                   c.manager.state(tp("log")).state is CleaningState.IDLE, what="an idle loop")
        assert log.size_in_bytes == start_size, "no cleaning until the max compaction lag has passed"
        assert c.manager.read_checkpoint() == {}

        clock.sleep(max_lag // 2 + 1)
        threads.wake()
        wait_until(lambda: c.manager.read_checkpoint().get(tp("log"), -1) >= active_at_t0, what="the first block")
        assert log.size_in_bytes < start_size
        t1 = clock()
        block2 = write_dups(log, clock, 100, 1, start_value=0)
        log.roll()
        active_at_t1 = log.active_segment.base_offset
        clock.sleep(max_lag + 1)
        threads.wake()
        wait_until(lambda: c.manager.read_checkpoint().get(tp("log"), -1) >= active_at_t1, what="the second block")
    finally:
        threads.shutdown()
    assert clock() > t1 + max_lag
    assert latest_per_key(key_values(log)) == {str(key).encode(): str(v).encode() for key, v in block2}
    assert threads.dead_threads == 0


def test_is_thread_failed(tmp_path, clock) -> None:  # LogCleanerIntegrationTest.testIsThreadFailed
    c = Cluster(tmp_path, clock, {"log": LOW_RETENTION})
    c.log("log")
    broken = threading.Event()

    def logs():
        if broken.is_set():
            raise RuntimeError("the log directory went away")
        return dict(c.dir.logs)

    manager = CleanerManager(c.dir.path, logs, clock)
    threads = LogCleaner(manager, logs, CleanerConfig(threads=2, backoff_ms=10, dedupe_buffer_size=1 << 16), clock)
    threads.start()
    try:
        wait_until(lambda: threads.live_threads == 2, what="threads started")
        assert threads.dead_threads == 0
        broken.set()
        threads.wake()
        wait_until(lambda: threads.dead_threads == 2, what="dead threads counted")
        # A thread is counted dead in its except clause, a moment before it has returned.
        wait_until(lambda: threads.live_threads == 0, what="dead threads ended")
        assert all("the log directory went away" in s.error for s in threads.status)
    finally:
        threads.shutdown()


@pytest.mark.parametrize("threads_count", [1, 2])
def test_cleaner_end_to_end_every_codec(tmp_path, clock, threads_count) -> None:
    # LogCleanerParameterizedIntegrationTest.cleanerTest(codec) for every codec at once, one partition each
    cfg = {"cleanup.policy": "compact", "segment.bytes": 2048, "min.cleanable.dirty.ratio": 0.0}
    c = Cluster(tmp_path, clock, {"log": cfg})
    written = {}
    for p, codec in enumerate(Compression):
        log = c.log("log", p)
        written[p] = write_dups(log, clock, 30, 3, codec=codec)
    ends = {p: c.dir.logs[tp("log", p)].active_segment.base_offset for p in written}
    threads = c.threads(threads=threads_count)
    threads.start()
    try:
        wait_until(lambda: all(c.manager.read_checkpoint().get(tp("log", p), -1) >= ends[p] for p in written),
                   what="every partition cleaned")
    finally:
        threads.shutdown()
    for p, codec in enumerate(Compression):
        log = c.dir.logs[tp("log", p)]
        rows = [(r.key, r.value) for r in read_all(log)]
        assert dict(rows) == {str(key).encode(): str(v).encode() for key, v in written[p]}
        inactive = [r.key for h, recs in batches(log) for r in recs if h.last_offset < log.active_segment.base_offset]
        assert len(inactive) == len(set(inactive)), "no duplicate key below the active segment"
        assert {h.compression for h, _ in batches(log)} == {codec}
    assert threads.dead_threads == 0


def test_cleans_combined_compact_and_delete_topic(tmp_path, wall_clock) -> None:
    # LogCleanerParameterizedIntegrationTest.testCleansCombinedCompactAndDeleteTopic
    clock = wall_clock
    retention = 100_000
    cfg = {"cleanup.policy": "compact,delete", "retention.ms": retention, "segment.bytes": 2048,
           "min.cleanable.dirty.ratio": 0.0}
    c = Cluster(tmp_path, clock, {"log": cfg})
    log = c.log("log")
    messages = write_dups(log, clock, 100, 3)
    first_end = log.active_segment.base_offset
    threads = c.threads()
    threads.start()
    try:
        wait_until(lambda: c.manager.read_checkpoint().get(tp("log"), -1) >= first_end, what="compaction")
        assert dict((r.key, r.value) for r in read_all(log)) == {str(key).encode(): str(v).encode() for key, v in messages}
        end = log.log_end_offset
        clock.sleep(2 * retention)
        threads.wake()
        wait_until(lambda: log.log_start_offset == end, what="deletion of old segments")
        assert len(log.segments) == 1
        wait_until(lambda: c.manager.state(tp("log")).state is CleaningState.IDLE, what="retention done")
        messages = write_dups(log, clock, 20, 3)  # the cleaner works after the deletion too
        second_end = log.active_segment.base_offset
        threads.wake()
        wait_until(lambda: c.manager.read_checkpoint().get(tp("log"), -1) >= second_end, what="compaction again")
    finally:
        threads.shutdown()
    assert dict((r.key, r.value) for r in read_all(log)) == {str(key).encode(): str(v).encode() for key, v in messages}
    assert threads.dead_threads == 0


def test_min_compaction_lag_is_honoured(tmp_path, clock) -> None:  # LogCleanerLagIntegrationTest.cleanerTest
    lag = 60_000
    cfg = {"cleanup.policy": "compact", "segment.bytes": 1024, "min.compaction.lag.ms": lag,
           "min.cleanable.dirty.ratio": 0.0}
    c = Cluster(tmp_path, clock, {"log": cfg})
    log = c.log("log")
    write_dups(log, clock, 20, 3)
    start_size = log.size_in_bytes
    threads = c.threads()
    threads.start()
    try:
        clock.sleep(lag // 2)
        looked_at = clock()
        threads.wake()
        wait_until(lambda: c.manager.last_run_ms >= looked_at, what="a cleaner loop")
        threads.wake()
        wait_until(lambda: c.manager.state(tp("log")).state is CleaningState.IDLE, what="an idle loop")
        assert log.size_in_bytes == start_size and c.manager.read_checkpoint() == {}, "younger than the lag"
        clock.sleep(lag)
        end = log.active_segment.base_offset
        threads.wake()
        wait_until(lambda: c.manager.read_checkpoint().get(tp("log"), -1) >= end, what="cleaning after the lag")
    finally:
        threads.shutdown()
    assert log.size_in_bytes < start_size
    assert scan(log.segments).open_txns == {}


def test_uncleanable_partition_can_be_paused_and_resumed(tmp_path, clock) -> None:
    """Kafka keeps uncleanable partitions in a set apart from the pause states: truncation and deletion
    pause and resume them like any other, and they stay uncleanable (and skipped) throughout."""
    c = Cluster(tmp_path, clock, {"wishing-well": {"cleanup.policy": "compact"}})
    c.log("wishing-well")
    t = tp("wishing-well", 0)
    c.manager.mark_uncleanable(t, "corrupt batch at offset 7")
    assert c.manager.state(t).state is CleaningState.UNCLEANABLE
    assert c.manager.pause(t) == 1
    paused = c.manager.state(t)
    assert paused.state is CleaningState.PAUSED and paused.reason == "corrupt batch at offset 7"
    assert c.manager.resume(t) == 0
    back = c.manager.state(t)
    assert back.state is CleaningState.UNCLEANABLE and back.reason == "corrupt batch at offset 7"
    assert t in c.manager.uncleanable()
    with pytest.raises(CleaningStateError):
        c.manager.resume(t)
