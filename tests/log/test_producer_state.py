"""Idempotent-producer de-duplication and fencing in `Log.append`, and the producer state's `.snapshot`
files across rolls, clean and unclean reopens, corruption, retention, compaction and truncation
(Kafka's ProducerStateManagerTest and UnifiedLogTest idempotence cases; spec 2.9, protocol G11)."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections import deque

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from shale.sidecar.log.errors import (
    InvalidProducerEpochError,
    InvalidRecordError,
    OutOfOrderSequenceError,
)
from shale.sidecar.log.log import Log
from shale.sidecar.log.producer_snapshot import ProducerEntry, encode_snapshot, parse_snapshot
from shale.sidecar.log.producer_state import DEFAULT_PRODUCER_ID_EXPIRATION_MS, INT32_MAX, snapshot_name
from shale.sidecar.log.records import ControlType, Record, encode_batch, encode_control_key, encode_end_txn_marker
from shale.sidecar.log.retention import delete_log_start_offset_breached
from support.logtest_util import T0, FakeClock, dir_snapshot, drop_unclosed, make_config

PID = 1000


def batch(seq: int, n: int = 1, *, pid: int = PID, epoch: int = 0, ts: int = T0, txn: bool = False) -> bytes:
    """An idempotent (or transactional) producer's batch of `n` records starting at sequence `seq`."""
    recs = [Record(i, ts, b"k%d" % i, b"v%d" % seq) for i in range(n)]
    return encode_batch(recs, producer_id=pid, producer_epoch=epoch, base_sequence=seq, is_transactional=txn)


def marker(ctype: ControlType, *, pid: int = PID, epoch: int = 0, ts: int = T0, coordinator_epoch: int = 0) -> bytes:
    return encode_batch([Record(0, ts, encode_control_key(ctype), encode_end_txn_marker(coordinator_epoch))],
                        producer_id=pid, producer_epoch=epoch, is_transactional=True, is_control=True)


def plain(value: bytes = b"x", ts: int = T0) -> bytes:
    return encode_batch([Record(0, ts, None, value)])


def open_log(path, clock=None, *, clean: bool = True, **props) -> Log:
    cfg = make_config({"file.delete.delay.ms": 0, **props})
    return Log(str(path), cfg, clock=clock or FakeClock(), had_clean_shutdown=clean)


def snapshots(log: Log) -> list[int]:
    return sorted(int(n[:20]) for n in os.listdir(log.dir) if n.endswith(".snapshot"))


def state(log: Log, pid: int = PID):
    """(epoch, [(first seq, last seq, first offset, last offset)]) the log remembers for `pid`."""
    e = log.producer_state.last_entry(pid)
    return e.epoch, [(b.first_seq, b.last_seq, b.first_offset, b.last_offset) for b in e.batches]


def read_snapshot(log: Log, offset: int) -> list[ProducerEntry]:
    with open(os.path.join(log.dir, snapshot_name(offset)), "rb") as f:
        return parse_snapshot(f.read())


@pytest.fixture
def log(tmp_path, clock):
    lg = open_log(tmp_path / "topic-0", clock)
    yield lg
    lg.close()


# --- append: de-duplication ------------------------------------------------------------------------

def test_retry_of_each_of_the_last_five_batches_writes_nothing(log) -> None:
    # UnifiedLogTest.testDuplicateAppends: a retry is acknowledged with the offsets of the original.
    infos = [log.append(batch(seq, 2)) for seq in range(0, 12, 2)]  # 6 batches, sequences 0..11
    before = dir_snapshot(log.dir)
    for seq, orig in list(zip(range(0, 12, 2), infos))[1:]:
        info = log.append(batch(seq, 2))
        assert info.duplicate and (info.first_offset, info.last_offset) == (orig.first_offset, orig.last_offset)
        assert (info.batches, info.size, info.log_append_time) == (0, 0, -1)
    assert log.log_end_offset == 12 and dir_snapshot(log.dir) == before
    # The sixth-oldest batch is no longer remembered: its retry is out of sequence, like any stale sequence.
    with pytest.raises(OutOfOrderSequenceError) as e:
        log.append(batch(0, 2))
    assert e.value.error_code == 45
    assert "topic-0" in str(e.value) and f"producer {PID}" in str(e.value)
    assert "epoch 0" in str(e.value) and "0 (incoming seq. number), 11 (current end sequence number)" in str(e.value)
    assert dir_snapshot(log.dir) == before


def test_a_retry_must_match_the_whole_sequence_range(log) -> None:
    log.append(batch(0, 3))
    with pytest.raises(OutOfOrderSequenceError):
        log.append(batch(0, 2))  # same first sequence, another last one: not a retry
    assert log.log_end_offset == 3


def test_retry_on_a_log_append_time_topic_returns_the_original_append_time(tmp_path, clock) -> None:
    log = open_log(tmp_path / "t-0", clock, **{"message.timestamp.type": "LogAppendTime"})
    orig = log.append(batch(0))
    clock.sleep(5000)
    again = log.append(batch(0))
    assert again.duplicate and again.log_append_time == orig.log_append_time == T0
    assert (again.first_offset, again.max_timestamp) == (orig.first_offset, orig.max_timestamp)


def test_producers_are_independent(log) -> None:
    # UnifiedLogTest.testMultipleProducerIdsPerMemoryRecord
    log.append(batch(0, pid=1))
    log.append(batch(0, pid=2))
    log.append(batch(1, pid=1))
    assert log.append(batch(0, pid=2)).duplicate
    assert not log.append(batch(1, pid=2)).duplicate
    assert state(log, 1)[1][-1] == (1, 1, 2, 2) and state(log, 2)[1][-1] == (1, 1, 3, 3)


def test_transactional_and_plain_batches_are_not_deduplicated(log) -> None:
    # Kafka's coordinator-origin appends check the epoch only (ProducerStateManagerTest
    # .testSequenceNotValidatedForGroupMetadataReport); plain batches carry no producer id.
    log.append(batch(0, txn=True))
    log.append(marker(ControlType.COMMIT))
    log.append(batch(0, txn=True))
    log.append(plain())
    log.append(plain())
    assert log.log_end_offset == 5


# --- append: fencing and sequence errors -----------------------------------------------------------

def test_sequence_gap_is_refused(log) -> None:  # UnifiedLogTest.testNonSequentialAppend
    log.append(batch(0))
    before = dir_snapshot(log.dir)
    with pytest.raises(OutOfOrderSequenceError, match=r"2 \(incoming seq. number\), 0 \(current end"):
        log.append(batch(2))
    assert dir_snapshot(log.dir) == before and state(log)[1] == [(0, 0, 0, 0)]


def test_stale_epoch_is_fenced_and_a_new_epoch_starts_at_zero(log) -> None:
    # UnifiedLogTest.testOldProducerEpoch, ProducerStateManagerTest.testProducerEpochBump*
    log.append(batch(0, epoch=1))
    log.append(batch(1, epoch=1))
    with pytest.raises(InvalidProducerEpochError) as e:
        log.append(batch(2, epoch=0))
    assert e.value.error_code == 47 and isinstance(e.value, InvalidRecordError)
    assert f"producer {PID}" in str(e.value) and "topic-0" in str(e.value)
    assert "is 0 (sequence 2)" in str(e.value) and "last seen epoch 1 (last sequence 1)" in str(e.value)
    with pytest.raises(OutOfOrderSequenceError, match="new epoch"):
        log.append(batch(2, epoch=2))
    log.append(batch(0, epoch=2))
    assert state(log) == (2, [(0, 0, 2, 2)]), "a new epoch forgets the old epoch's batches"
    with pytest.raises(InvalidProducerEpochError):
        log.append(batch(1, epoch=1))


def test_stale_marker_epoch_is_fenced(log) -> None:  # ProducerStateManagerTest.testOldEpochForControlRecord
    log.append(batch(0, epoch=3, txn=True))
    with pytest.raises(InvalidProducerEpochError):
        log.append(marker(ControlType.COMMIT, epoch=2))
    log.append(marker(ControlType.COMMIT, epoch=4))  # a marker bumps the epoch (testControlRecordBumpsProducerEpoch)
    entry = log.producer_state.last_entry(PID)
    assert (entry.epoch, list(entry.batches), entry.current_txn_first_offset) == (4, [], -1)


def test_an_unknown_producer_may_start_at_any_sequence(log) -> None:
    # KIP-360 (Kafka 2.5+): the log may have lost the producer to retention or expiration.
    log.append(batch(42))
    log.append(batch(43))
    with pytest.raises(OutOfOrderSequenceError):
        log.append(batch(45))


def test_sequences_wrap_at_int32_max(log) -> None:
    # ProducerStateManagerTest.testProducerSequenceWrapAround / WithWrapAroundBatchRecord / InvalidWrapAround
    log.append(batch(INT32_MAX - 1, 3))  # sequences MAX-1, MAX, 0
    assert state(log)[1] == [(INT32_MAX - 1, 0, 0, 2)]
    assert log.append(batch(INT32_MAX - 1, 3)).duplicate
    log.append(batch(1))
    with pytest.raises(OutOfOrderSequenceError):
        log.append(batch(INT32_MAX))
    other = PID + 1
    log.append(batch(INT32_MAX, pid=other))
    log.append(batch(0, pid=other))
    assert state(log, other)[1][-1][:2] == (0, 0)


def test_idempotent_batch_needs_a_sequence(log) -> None:
    with pytest.raises(InvalidRecordError, match="invalid sequence number -1") as e:
        log.append(batch(-1))
    assert not hasattr(e.value, "error_code"), "the broker answers INVALID_RECORD"


def test_every_batch_of_a_set_is_checked_before_a_byte_is_written(log) -> None:
    # UnifiedLogTest.testMultipleProducersWithDuplicatesInSingleAppend, with Kafka's all-or-nothing append
    log.append(batch(0))
    before = dir_snapshot(log.dir)
    with pytest.raises(OutOfOrderSequenceError):
        log.append(batch(1) + batch(3))
    assert dir_snapshot(log.dir) == before and state(log)[1] == [(0, 0, 0, 0)]
    with pytest.raises(OutOfOrderSequenceError):
        log.append(batch(1) + batch(1))  # a retry inside the set is a sequence error, not a duplicate
    info = log.append(batch(1) + batch(2, 2))
    assert (info.first_offset, info.last_offset, info.batches) == (1, 3, 2)
    again = log.append(batch(1) + batch(2, 2))
    assert again.duplicate and (again.first_offset, again.last_offset) == (1, 3)
    with pytest.raises(InvalidRecordError, match="mixes 1 retried batch"):
        log.append(batch(2, 2) + batch(4))
    assert log.log_end_offset == 4


def test_follower_appends_are_not_checked(log) -> None:
    # ProducerStateManagerTest.testAcceptAppendWithSequenceGapsOnReplica / testNoValidationOnFirstEntryWhenLoadingLog
    log.append(encode_batch([Record(0, T0, None, b"a")], producer_id=PID, producer_epoch=5, base_sequence=7),
               assign_offsets=False)
    log.append(encode_batch([Record(1, T0, None, b"b")], producer_id=PID, producer_epoch=2, base_sequence=20),
               assign_offsets=False)
    assert state(log) == (2, [(20, 20, 1, 1)])
    log.append(encode_batch([Record(2, T0, None, b"b")], producer_id=PID, producer_epoch=2, base_sequence=20),
               assign_offsets=False)
    assert log.log_end_offset == 3, "no de-duplication on a follower"


# --- transactions and the last stable offset -------------------------------------------------------

def test_last_stable_offset_follows_open_transactions_across_reopens(tmp_path, clock) -> None:
    # ProducerStateManagerTest.testRecoverFromSnapshotUnfinishedTransaction
    log = open_log(tmp_path / "t-0", clock)
    log.append(plain())
    log.append(batch(0, pid=1, txn=True))  # 1: producer 1 opens a transaction
    log.append(batch(0, pid=2, txn=True))  # 2
    log.append(batch(1, pid=1, txn=True))
    assert log.last_stable_offset == 1
    log.append(marker(ControlType.COMMIT, pid=1))
    assert log.last_stable_offset == 2
    log.close()
    clean = open_log(tmp_path / "t-0", clock)
    assert clean.last_stable_offset == 2
    assert {e.producer_id: e.current_txn_first_offset for e in read_snapshot(clean, 5)} == {1: -1, 2: 2}
    clean.append(marker(ControlType.ABORT, pid=2))
    assert clean.last_stable_offset == 6
    crashed = shutil.copytree(clean.dir, tmp_path / "copy" / "t-0")  # what a SIGKILL leaves: no new snapshot
    assert open_log(crashed, clock, clean=False).last_stable_offset == 6, "the replayed marker closed it"
    clean.close()


def test_expired_producers_are_forgotten_but_open_transactions_are_not(tmp_path, clock) -> None:
    # ProducerStateManagerTest.testPidExpirationTimeout / testRemoveExpiredPidsOnReload
    log = open_log(tmp_path / "t-0", clock)
    log.append(batch(0, pid=1, ts=clock()))
    log.append(batch(0, pid=2, ts=clock(), txn=True))
    clock.sleep(DEFAULT_PRODUCER_ID_EXPIRATION_MS - 1)
    assert log.remove_expired_producers(clock()) == 0
    log.append(batch(1, pid=3, ts=clock()))
    log.close()
    clock.sleep(1)
    log = open_log(tmp_path / "t-0", clock)
    assert set(log.producer_state.producers) == {2, 3}, "expired entries are dropped when the snapshot loads"
    log.append(batch(7, pid=1, ts=clock()))  # unknown again: any sequence
    clock.sleep(DEFAULT_PRODUCER_ID_EXPIRATION_MS)
    assert log.remove_expired_producers(clock()) == 2
    assert set(log.producer_state.producers) == {2}
    log.close()


def test_expiration_time_is_a_log_parameter(tmp_path, clock) -> None:
    log = Log(str(tmp_path / "t-0"), make_config(), clock=clock, producer_id_expiration_ms=1000)
    log.append(batch(0, ts=clock()))
    clock.sleep(1000)
    assert log.remove_expired_producers(clock()) == 1


# --- snapshots: when they are written and what they hold -------------------------------------------

def test_snapshot_at_every_roll_and_at_close_in_kafkas_format(tmp_path, clock) -> None:
    # UnifiedLogTest.testProducerSnapshotAfterSegmentRollOnAppend, ProducerStateManagerTest.testTakeSnapshot
    log = open_log(tmp_path / "t-0", clock)
    log.append(batch(0, 2, ts=T0 + 5))
    log.roll()
    assert snapshots(log) == [2]
    assert read_snapshot(log, 2) == [ProducerEntry(PID, 0, 1, 1, 1, T0 + 5)]
    log.append(batch(2, 3, ts=T0 + 9))
    log.roll()
    log.append(plain())
    log.close()
    assert snapshots(log) == [2, 5, 6]
    assert read_snapshot(log, 6) == [ProducerEntry(PID, 0, 4, 4, 2, T0 + 9)]
    log = open_log(tmp_path / "t-0", clock)
    log.close()
    # ProducerStateManagerTest.testSkipSnapshotIfOffsetUnchanged
    assert snapshots(log) == [2, 5, 6], "no new snapshot where the state did not move"


def test_no_snapshot_files_for_a_log_without_producers(tmp_path, clock) -> None:
    log = open_log(tmp_path / "t-0", clock)
    log.append(plain())
    log.roll()
    log.append(plain())
    log.close()
    assert snapshots(log) == []
    again = open_log(tmp_path / "t-0", clock, clean=False)
    again.append(batch(0))
    again.roll()
    assert snapshots(again) == [3], "the first producer starts the snapshots"
    again.close()


def test_clean_reopen_remembers_the_last_batch_of_each_producer(tmp_path, clock) -> None:
    # A snapshot entry holds one batch, as in Kafka: after a restart only the last batch is de-duplicated.
    log = open_log(tmp_path / "t-0", clock)
    for seq in range(4):
        log.append(batch(seq))
    log.close()
    log = open_log(tmp_path / "t-0", clock)
    assert state(log) == (0, [(3, 3, 3, 3)])
    assert log.append(batch(3)).duplicate
    with pytest.raises(OutOfOrderSequenceError):
        log.append(batch(2))
    assert not log.append(batch(4)).duplicate
    log.close()


def test_unclean_reopen_replays_the_batches_after_the_last_snapshot(tmp_path, clock) -> None:
    log = open_log(tmp_path / "t-0", clock)
    for seq in range(3):
        log.append(batch(seq))
    log.roll()  # snapshot at 3
    for seq in range(3, 9):
        log.append(batch(seq))
    # A SIGKILL: no close. The recovery point is lost too (the checkpoint says 0).
    crashed = open_log(tmp_path / "t-0", clock, clean=False)
    assert state(crashed)[1] == [(s, s, s, s) for s in range(4, 9)]
    for seq in range(4, 9):
        assert crashed.append(batch(seq)).duplicate
    with pytest.raises(OutOfOrderSequenceError):
        crashed.append(batch(3))
    crashed.close()


def test_unclean_reopen_forgets_batches_lost_in_recovery(tmp_path, clock) -> None:
    # UnifiedLogTest/LogLoaderTest.testProducerSnapshotsRecoveryAfterUncleanShutdown: snapshots past the
    # recovered log end are deleted, so a batch the crash lost is appended again, not taken for a retry.
    d = tmp_path / "t-0"
    log = open_log(d, clock)
    for seq in range(3):
        log.append(batch(seq))
    log.roll()
    log.append(batch(3))
    log.append(batch(4))
    log.close()
    assert snapshots(log) == [3, 5]
    seg = os.path.join(d, f"{3:020d}.log")
    os.truncate(seg, os.path.getsize(seg) - 5)  # the last batch is torn
    crashed = Log(str(d), make_config(), clock=clock, had_clean_shutdown=False, recovery_point=3)
    assert crashed.log_end_offset == 4 and snapshots(crashed) == [3]
    assert state(crashed)[1][-1] == (3, 3, 3, 3)
    info = crashed.append(batch(4))
    assert not info.duplicate and info.first_offset == 4
    crashed.close()


def test_corrupt_snapshot_falls_back_to_an_older_one(tmp_path, clock, caplog) -> None:
    # ProducerStateManagerTest.testLoadFromCorruptSnapshotFile / testLoadFromEmptySnapshotFile
    d = tmp_path / "t-0"
    log = open_log(d, clock)
    log.append(batch(0))
    log.roll()
    log.append(batch(1))
    log.append(batch(2))
    log.close()
    path = os.path.join(d, snapshot_name(3))
    raw = bytearray(open(path, "rb").read())
    raw[-1] ^= 0xFF
    open(path, "wb").write(bytes(raw))
    again = open_log(d, clock)
    assert "CRC is no longer valid" in caplog.text and snapshots(again) == [1]
    assert state(again)[1] == [(0, 0, 0, 0), (1, 1, 1, 1), (2, 2, 2, 2)], "the snapshot at 1, then a replay"
    again.close()
    for offset in snapshots(again):
        open(os.path.join(d, snapshot_name(offset)), "wb").close()  # empty files
    third = open_log(d, clock)
    assert snapshots(third) == [] and state(third)[1][-1] == (2, 2, 2, 2), "rebuilt from the log alone"
    third.close()


def test_stray_snapshots_are_removed_at_open(tmp_path, clock) -> None:
    # ProducerStateManagerTest.testRemoveStraySnapshotsKeepCleanShutdownSnapshot
    d = tmp_path / "t-0"
    log = open_log(d, clock)
    log.append(batch(0))
    log.roll()
    log.append(batch(1))
    log.close()
    assert snapshots(log) == [1, 2]
    empty = encode_snapshot([])
    for offset in (0, 7):
        open(os.path.join(d, snapshot_name(offset)), "wb").write(empty)
    open(os.path.join(d, snapshot_name(4) + ".tmp"), "wb").write(b"half")
    again = open_log(d, clock)
    # 0 and 1 are segment bases; 2 is a stray below the largest stray (7), which is kept as the clean-shutdown
    # snapshot but lies past the log end, so it goes too and the state comes from 1 plus a replay.
    assert snapshots(again) == [0, 1]
    assert not [n for n in os.listdir(d) if n.endswith(".tmp")]
    assert state(again)[1] == [(0, 0, 0, 0), (1, 1, 1, 1)]
    again.close()


# --- snapshots follow the segments -----------------------------------------------------------------

def test_retention_deletes_the_snapshots_of_deleted_segments(tmp_path, clock) -> None:
    # UnifiedLogTest.testRetentionDeletesProducerStateSnapshots / testLogStartOffsetMovementDeletesSnapshots
    log = open_log(tmp_path / "t-0", clock)
    for seq in range(4):
        log.append(batch(seq))
        log.roll()
    assert snapshots(log) == [1, 2, 3, 4]
    log.increment_log_start_offset(2)
    assert delete_log_start_offset_breached(log) == 2
    assert snapshots(log) == [2, 3, 4] and [s.base_offset for s in log.segments] == [2, 3, 4]
    assert state(log)[1][0] == (0, 0, 0, 0), "producer state outlives the segments (Kafka keeps it until expiry)"
    log.delete_segments(list(log.segments), "test")  # the active segment is empty: kept
    assert snapshots(log) == [4]
    log.close()


def test_compaction_deletes_the_snapshots_of_merged_segments(tmp_path, clock) -> None:
    # UnifiedLogTest.testCompactionDeletesProducerStateSnapshots
    from cleaner_util import make_cleaner, to_clean

    log = open_log(tmp_path / "t-0", clock, **{"cleanup.policy": "compact"})
    for seq in range(4):
        log.append(encode_batch([Record(0, T0, b"k", b"v%d" % seq)], producer_id=PID, producer_epoch=0,
                                base_sequence=seq))
        log.roll()
    assert snapshots(log) == [1, 2, 3, 4]
    make_cleaner(clock=clock).clean(to_clean(log))
    bases = [s.base_offset for s in log.segments]
    assert bases == [0, 4] and snapshots(log) == [4]
    assert log.append(encode_batch([Record(0, T0, b"k", b"v3")], producer_id=PID, producer_epoch=0,
                                   base_sequence=3)).duplicate
    log.close()


def test_truncate_to_forgets_the_state_above(tmp_path, clock) -> None:
    # UnifiedLogTest.testProducerIdMapTruncateTo,
    # ProducerStateManagerTest.testTruncateAndReloadRemovesOutOfRangeSnapshots
    log = open_log(tmp_path / "t-0", clock)
    for seq in range(3):
        log.append(batch(seq))
        log.roll()
    log.append(batch(3))
    log.append(batch(4))
    assert snapshots(log) == [1, 2, 3]
    log.truncate_to(2)
    assert snapshots(log) == [1, 2] and state(log)[1][-1] == (1, 1, 1, 1)
    info = log.append(batch(2))
    assert not info.duplicate and info.first_offset == 2
    log.truncate_to(1)
    assert state(log)[1] == [(0, 0, 0, 0)] and snapshots(log) == [1]
    log.truncate_to(0)
    assert log.producer_state.last_entry(PID) is None
    log.close()


def test_truncate_fully_and_start_at_drops_state_and_snapshots(tmp_path, clock) -> None:
    # UnifiedLogTest.testProducerIdMapTruncateFullyAndStartAt
    log = open_log(tmp_path / "t-0", clock)
    log.append(batch(0))
    log.roll()
    log.append(batch(1))
    log.truncate_fully_and_start_at(29)
    assert snapshots(log) == [] and log.producer_state.producers == {}
    log.append(batch(5))  # unknown producer again
    log.close()
    assert snapshots(log) == [30]


# --- a model of Kafka's rules -----------------------------------------------------------------------

SEQ_STARTS = [0, 5, INT32_MAX - 1]


class ProducerModel(RuleBasedStateMachine):
    """The log against a model of Kafka's rules: per producer an epoch and its last 5 batches; snapshots that
    keep one batch per producer, written at rolls and close past the last one; stray snapshots dropped at open;
    a reload (open, truncation) from the latest snapshot at or below the log end plus a replay after it."""

    def __init__(self) -> None:
        super().__init__()
        self.tmp = tempfile.mkdtemp(prefix="shale-producers-")
        self.dir = os.path.join(self.tmp, "model-0")
        self.clock = FakeClock()
        self.log: Log | None = None

    @initialize(segment_bytes=st.sampled_from([300, 600, 1 << 20]))
    def setup(self, segment_bytes) -> None:
        self.cfg = make_config({"segment.bytes": segment_bytes, "file.delete.delay.ms": 0})
        self.log = Log(self.dir, self.cfg, clock=self.clock)
        self.batches: list[tuple[int, int, int, int, int, int]] = []  # (pid, epoch, first seq, last seq, first, last)
        self.mem: dict[int, tuple[int, deque]] = {}
        self.snaps: dict[int, dict[int, tuple[int, deque]]] = {}  # offset -> the state its snapshot holds
        self.last_snap = 0
        self.leo = 0

    def teardown(self) -> None:
        if self.log is not None:
            self.log.close()
        shutil.rmtree(self.tmp, ignore_errors=True)

    # -- the model ---------------------------------------------------------------------------------

    @staticmethod
    def _trimmed(mem) -> dict:
        return {pid: (epoch, deque(list(bs)[-1:], maxlen=5)) for pid, (epoch, bs) in mem.items()}

    def _take(self, offset: int, state: dict) -> None:
        if offset > self.last_snap and (state or self.snaps):
            self.snaps[offset] = self._trimmed(state)
            self.last_snap = offset

    def _remove_strays(self, bases: list[int]) -> None:
        strays = sorted(o for o in self.snaps if o not in bases)
        if strays and strays[-1] > max(bases):
            strays.pop()
        for o in strays:
            del self.snaps[o]

    def _reload(self) -> None:
        self.snaps = {o: s for o, s in self.snaps.items() if o <= self.leo}
        start = max(self.snaps, default=0)
        self.last_snap = start
        self.mem = {pid: (e, deque(bs, maxlen=5)) for pid, (e, bs) in self.snaps.get(start, {}).items()}
        for pid, epoch, fs, ls, first, last in self.batches:
            if first >= start:
                self._remember(pid, epoch, fs, ls, first, last)

    def _remember(self, pid, epoch, fs, ls, first, last) -> None:
        old_epoch, bs = self.mem.get(pid, (epoch, deque(maxlen=5)))
        if old_epoch != epoch:
            bs = deque(maxlen=5)
        bs.append((fs, ls, first, last))
        self.mem[pid] = (epoch, bs)

    def _expect(self, pid: int, epoch: int, fs: int, ls: int):
        if pid not in self.mem:
            return "ok"
        cur_epoch, bs = self.mem[pid]
        if epoch == cur_epoch:
            for b in bs:
                if b[:2] == (fs, ls):
                    return ("dup", b[2], b[3])
        if epoch < cur_epoch:
            return InvalidProducerEpochError
        if epoch != cur_epoch:
            return "ok" if fs == 0 else OutOfOrderSequenceError
        last = bs[-1][1] if bs else -1
        return "ok" if fs == last + 1 or (fs == 0 and last == INT32_MAX) else OutOfOrderSequenceError

    # -- rules -------------------------------------------------------------------------------------

    @rule(pid=st.sampled_from([1, 2, 3]), n=st.integers(1, 3), data=st.data())
    def append(self, pid, n, data) -> None:
        cur = self.mem.get(pid)
        epoch = data.draw(st.sampled_from([0, 1, 2]) if cur is None else
                          st.sampled_from([cur[0], cur[0], cur[0], cur[0] + 1, max(cur[0] - 1, 0)]), label="epoch")
        own = [b for b in self.batches if b[0] == pid and b[1] == epoch]
        choices = [st.sampled_from(SEQ_STARTS)]
        if cur is not None and cur[1]:
            nxt = (cur[1][-1][1] + 1) % (INT32_MAX + 1)
            choices += [st.just(nxt)] * 3 + [st.just((nxt + 1) % (INT32_MAX + 1))]
        if own:
            retry = data.draw(st.sampled_from(own), label="retry")
            choices.append(st.just(retry[2]))
            if data.draw(st.booleans(), label="exact retry"):
                n = (retry[3] - retry[2]) % (INT32_MAX + 1) + 1
        fs = data.draw(st.one_of(choices), label="first seq")
        ls = (fs + n - 1) % (INT32_MAX + 1)
        want = self._expect(pid, epoch, fs, ls)
        if isinstance(want, type):
            with pytest.raises(want):
                self.log.append(batch(fs, n, pid=pid, epoch=epoch))
            return
        active, before = self.log.active_segment.base_offset, self._trimmed(self.mem)
        info = self.log.append(batch(fs, n, pid=pid, epoch=epoch))
        if want != "ok":
            assert info.duplicate and (info.first_offset, info.last_offset) == want[1:]
            return
        assert not info.duplicate and info.first_offset == self.leo
        if self.log.active_segment.base_offset != active:  # the append rolled: a snapshot of the state before it
            assert self.log.active_segment.base_offset == self.leo
            self._take(self.leo, before)
        self.batches.append((pid, epoch, fs, ls, self.leo, self.leo + n - 1))
        self._remember(pid, epoch, fs, ls, self.leo, self.leo + n - 1)
        self.leo += n

    @rule()
    def roll(self) -> None:
        self.log.roll()
        self._take(self.leo, self.mem)

    @rule()
    def reopen_clean(self) -> None:
        self.log.close()
        self._take(self.leo, self.mem)
        self._remove_strays([s.base_offset for s in self.log.segments])
        self.log = Log(self.dir, self.cfg, clock=self.clock)
        if self.snaps:
            self._reload()
        else:
            self.mem, self.last_snap = {}, self.leo

    @rule()
    def reopen_unclean(self) -> None:
        # The old Log is dropped unclosed: what a SIGKILL leaves (every write reached the page cache).
        drop_unclosed(self.log)
        self._remove_strays([s.base_offset for s in self.log.segments])
        self.log = Log(self.dir, self.cfg, clock=self.clock, had_clean_shutdown=False, recovery_point=0)
        self._reload()

    @precondition(lambda self: self.log is not None and self.batches)
    @rule(data=st.data())
    def truncate(self, data) -> None:
        keep = data.draw(st.integers(0, len(self.batches) - 1), label="keep batches")
        offset = self.batches[keep][4]
        self.log.truncate_to(offset)
        self.batches = self.batches[:keep]
        self.leo = offset
        if self.mem:
            self._reload()
        else:
            self.snaps = {o: s for o, s in self.snaps.items() if o <= offset}
            self.last_snap = min(self.last_snap, offset)

    @invariant()
    def same_state(self) -> None:
        if self.log is None:
            return
        got = {pid: (e.epoch, [(b.first_seq, b.last_seq, b.first_offset, b.last_offset) for b in e.batches])
               for pid, e in self.log.producer_state.producers.items()}
        assert got == {pid: (e, list(bs)) for pid, (e, bs) in self.mem.items()}
        assert self.log.log_end_offset == self.leo
        assert snapshots(self.log) == sorted(self.snaps)


TestProducerModel = ProducerModel.TestCase
TestProducerModel.settings = settings(max_examples=60, stateful_step_count=40, deadline=None,
                                      suppress_health_check=[HealthCheck.too_slow])
