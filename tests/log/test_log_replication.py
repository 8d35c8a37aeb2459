"""The log engine's part of replication: leader epochs in the log and the high watermark (spec replication §1.3, §2.5).

Kafka's UnifiedLogTest/LogLoaderTest epoch cases (appendAsLeader/appendAsFollower, truncation,
recovery), the high-watermark rules of a replicated log, `replication-offset-checkpoint`, and the
cleaner and retention staying below the high watermark.
"""

from __future__ import annotations

import logging
import os

import pytest
from cleaner_util import keys_in_log, make_cleaner, offsets_in_log, record

from shale.sidecar.log.checkpoint import (
    LEADER_EPOCH_CHECKPOINT,
    REPLICATION_OFFSET_CHECKPOINT,
    EpochEntry,
    parse_epoch_entries,
    read_offsets,
)
from shale.sidecar.log.cleaner_manager import CleanerManager
from shale.sidecar.log.errors import CorruptRecordError, KafkaStorageError, OffsetOutOfRangeError
from shale.sidecar.log.log import Log
from shale.sidecar.log.log_cleaner import CleanerConfig, LogCleaner
from shale.sidecar.log.log_dir import LogDir
from shale.sidecar.log.records import Record, encode_batch
from shale.sidecar.log.retention import delete_retention_ms_breached
from shale.sidecar.log.topic_partition import TopicPartition
from support.fs_util import fill, small_fs
from support.logtest_util import T0, FakeClock, dir_snapshot, drop_unclosed, make_config, segment_batches, simple_batch

E = EpochEntry


def open_log(path, clock=None, *, clean: bool = True, recovery_point: int = 0, **props) -> Log:
    cfg = make_config({"file.delete.delay.ms": 0, **props})
    return Log(str(path), cfg, clock=clock or FakeClock(), had_clean_shutdown=clean, recovery_point=recovery_point)


def follower_batch(base: int, count: int, epoch: int) -> bytes:
    """A batch as a leader wrote it: its offsets assigned and its partition leader epoch stamped."""
    return encode_batch([Record(base + i, T0, None, b"v%d" % (base + i)) for i in range(count)],
                        partition_leader_epoch=epoch)


def epoch_file(log: Log) -> bytes:
    with open(os.path.join(log.dir, LEADER_EPOCH_CHECKPOINT), "rb") as f:
        return f.read()


def stamped_epochs(log: Log) -> list[tuple[int, int]]:
    """(base offset, partition leader epoch) of every batch in the files."""
    return [(b.header.base_offset, b.header.partition_leader_epoch) for seg in log.segments
            for _, b in segment_batches(seg)]


# --- epochs on append ---------------------------------------------------------------------------

def test_a_leader_append_stamps_its_epoch_and_assigns_it_at_the_first_offset(tmp_path) -> None:
    log = open_log(tmp_path / "t-0")
    log.append(simple_batch(b"a") + simple_batch(b"b"), leader_epoch=3)
    log.append(simple_batch(b"c"), leader_epoch=3)
    assert log.leader_epoch_cache.entries == [E(3, 0)]
    log.append(simple_batch(b"d"), leader_epoch=5)
    assert stamped_epochs(log) == [(0, 3), (1, 3), (2, 3), (3, 5)]
    assert log.leader_epoch_cache.entries == [E(3, 0), E(5, 3)]
    assert epoch_file(log) == b"0\n2\n3 0\n5 3\n"
    assert log.latest_epoch == 5
    assert log.end_offset_for_epoch(3) == (3, 3)
    assert log.end_offset_for_epoch(5) == (5, 4), "the latest epoch ends at the log end offset"
    assert log.end_offset_for_epoch(4) == (3, 3)
    assert log.end_offset_for_epoch(6) == (-1, -1)
    assert log.leader_epoch_cache.epoch_for_offset(2) == 3


def test_a_single_replica_log_writes_no_epochs(tmp_path) -> None:
    log = open_log(tmp_path / "t-0")
    log.append(simple_batch())  # a producer's batch: partition leader epoch -1, kept as it is
    log.truncate_to(0)
    assert stamped_epochs(log) == []
    log.append(simple_batch())
    log.append(simple_batch(partition_leader_epoch=4))  # whatever a producer put there is no epoch of this log:
    assert stamped_epochs(log) == [(0, -1), (1, -1)]  # stamped -1 (outside the CRC), so no recovery reads it as one
    assert log.latest_epoch is None and log.end_offset_for_epoch(0) == (-1, -1)
    assert not os.path.exists(os.path.join(log.dir, LEADER_EPOCH_CHECKPOINT))
    log.close()
    # An unclean recovery rebuilds the cache from the batches: the records still read as unreplicated ones
    # (which a follower never truncates), not as written in an epoch 4 that never was.
    reopened = open_log(tmp_path / "t-0", clean=False, recovery_point=0)
    assert reopened.latest_epoch is None and reopened.leader_epoch_cache.entries == []
    assert [len(b.records) for seg in reopened.segments for _, b in segment_batches(seg)] == [1, 1]


def test_a_follower_append_assigns_each_batchs_own_epoch(tmp_path) -> None:
    # UnifiedLogTest.testLeaderEpochCacheCreatedAfterMessageFormatUpgrade / appendAsFollower cases
    log = open_log(tmp_path / "t-0")
    log.append(follower_batch(0, 2, 1) + follower_batch(2, 1, 1) + follower_batch(3, 3, 2), assign_offsets=False)
    log.append(follower_batch(6, 1, 4), assign_offsets=False)
    assert log.leader_epoch_cache.entries == [E(1, 0), E(2, 3), E(4, 6)]
    assert stamped_epochs(log) == [(0, 1), (2, 1), (3, 2), (6, 4)], "a follower keeps the leader's bytes"
    assert log.end_offset_for_epoch(1) == (1, 3)
    assert log.end_offset_for_epoch(3) == (2, 6)
    # A batch without an epoch (a single-replica leader's older data) adds none.
    log.append(follower_batch(7, 1, -1), assign_offsets=False)
    assert log.leader_epoch_cache.entries == [E(1, 0), E(2, 3), E(4, 6)]


def test_a_follower_append_from_a_reused_buffer_makes_the_leaders_log_byte_for_byte(tmp_path) -> None:
    """A follower appends a fetched chunk straight from the buffer it was read into (no copy) and the buffer is
    then reused for the next chunk, as the replica fetcher does: the follower's directory (segments, indexes,
    epochs, producer snapshot) must still be the leader's, and a corrupt chunk must be refused, not written."""
    props = {"index.interval.bytes": 1, "segment.bytes": 600}  # an index entry per append, several segments
    leader, follower = open_log(tmp_path / "l-0", **props), open_log(tmp_path / "f-0", **props)
    buf = bytearray(1 << 16)  # one buffer for every chunk, as ResponseFrames keeps one per connection
    appends = [
        [encode_batch([Record(0, T0 + i, b"k", b"a" * 90)], producer_id=7, producer_epoch=0, base_sequence=i)]
        for i in range(6)
    ] + [[simple_batch(b"b" * 200), simple_batch(b"c" * 10, ts=T0 + 50)],
         [encode_batch([Record(i, T0, None, b"t%d" % i) for i in range(3)], producer_id=9, producer_epoch=2,
                       base_sequence=0, is_transactional=True)]]
    for epoch, batches in enumerate(appends):
        before = follower.log_end_offset
        leader.append(b"".join(batches), leader_epoch=epoch // 3)
        chunk = leader.read(before, 1 << 20).read_into(buf)
        corrupt = bytearray(chunk)
        corrupt[-1] ^= 0x01  # inside the last batch's records: only its CRC-32C tells
        untouched = dir_snapshot(follower.dir)
        with pytest.raises(CorruptRecordError, match="f-0"):
            follower.append(memoryview(corrupt), assign_offsets=False)
        assert dir_snapshot(follower.dir) == untouched and follower.log_end_offset == before
        follower.append(chunk, assign_offsets=False)
        buf[:] = b"\xee" * len(buf)  # the next answer overwrites the buffer: what was appended must not change
        assert follower.log_end_offset == leader.log_end_offset
    assert follower.leader_epoch_cache.entries == leader.leader_epoch_cache.entries == [E(0, 0), E(1, 3), E(2, 6)]
    assert follower.producer_state.last_entry(7).last_seq == 5
    assert follower.producer_state.first_unstable_offset(follower.log_end_offset) == leader.log_end_offset - 3
    assert len(leader.segments) > 2
    leader.close()
    follower.close()
    assert dir_snapshot(follower.dir) == dir_snapshot(leader.dir)


def test_a_duplicate_append_assigns_nothing(tmp_path) -> None:
    log = open_log(tmp_path / "t-0")
    batch = encode_batch([Record(0, T0, None, b"x")], producer_id=7, producer_epoch=0, base_sequence=0)
    log.append(batch, leader_epoch=1)
    info = log.append(batch, leader_epoch=2)  # the producer's retry reaches a new leader
    assert info.duplicate
    assert log.leader_epoch_cache.entries == [E(1, 0)]


def test_a_refused_epoch_checkpoint_write_refuses_the_append_and_changes_nothing(tmp_path) -> None:
    log = open_log(tmp_path / "t-0")
    log.append(simple_batch(), leader_epoch=1)
    os.mkdir(os.path.join(log.dir, LEADER_EPOCH_CHECKPOINT + ".tmp"))
    with pytest.raises(KafkaStorageError, match="leader epoch checkpoint") as e:
        log.append(simple_batch(), leader_epoch=2)
    assert "t-0" in str(e.value) and "offset 1" in str(e.value)
    assert log.log_end_offset == 1 and stamped_epochs(log) == [(0, 1)]
    assert log.leader_epoch_cache.entries == [E(1, 0)] and epoch_file(log) == b"0\n1\n1 0\n"
    log.append(simple_batch(), leader_epoch=1)  # no new entry, no write: the epoch it has goes on
    os.rmdir(os.path.join(log.dir, LEADER_EPOCH_CHECKPOINT + ".tmp"))
    log.append(simple_batch(), leader_epoch=2)
    assert log.leader_epoch_cache.entries == [E(1, 0), E(2, 2)] and log.storage_failure is None


def test_an_append_refused_by_a_full_disk_leaves_no_epoch_behind(tmp_path) -> None:
    clock = FakeClock()
    with small_fs(tmp_path, "tmpfs", 512) as mnt:
        filler = fill(mnt)
        filler.release(16 * 4096)
        log = open_log(mnt / "t-0", clock, **{"segment.bytes": 8192})
        epoch = 0
        refused = 0
        while refused < 3:
            before, end = log.leader_epoch_cache.entries, log.log_end_offset
            epoch += 1
            try:
                log.append(simple_batch(b"x" * 1000), leader_epoch=epoch)
            except KafkaStorageError:
                refused += 1
                assert log.log_end_offset == end
                assert log.leader_epoch_cache.entries == before, "no entry for bytes that are not in the log"
            else:
                assert log.leader_epoch_cache.latest_entry == E(epoch, end)
        filler.release()
        log.append(simple_batch(), leader_epoch=epoch + 1)
        entries = log.leader_epoch_cache.entries
        assert entries[-1] == E(epoch + 1, log.log_end_offset - 1)
        assert [b for b, _ in stamped_epochs(log)] == [e.start_offset for e in entries], "one epoch per batch here"
        drop_unclosed(log)
        reopened = open_log(mnt / "t-0", clock, clean=False)
        assert reopened.leader_epoch_cache.entries == entries
        drop_unclosed(reopened)


# --- truncation and the log start offset ------------------------------------------------------

def test_truncation_drops_the_epochs_past_the_new_end(tmp_path) -> None:
    log = open_log(tmp_path / "t-0")
    for epoch, n in [(1, 3), (2, 3), (4, 3)]:
        for _ in range(n):
            log.append(simple_batch(), leader_epoch=epoch)
    assert log.leader_epoch_cache.entries == [E(1, 0), E(2, 3), E(4, 6)]
    log.truncate_to(7)
    assert log.leader_epoch_cache.entries == [E(1, 0), E(2, 3), E(4, 6)]
    log.truncate_to(6)
    assert log.leader_epoch_cache.entries == [E(1, 0), E(2, 3)]
    assert epoch_file(log) == b"0\n2\n1 0\n2 3\n"
    # An epoch begun as leader (Partition.makeLeader assigns it at the log end) with no data: truncating
    # at or past the end removes it too (UnifiedLog.truncateTo's first branch).
    with log.lock:
        log.leader_epoch_cache.assign(7, log.log_end_offset)
    log.truncate_to(log.log_end_offset + 5)
    assert log.leader_epoch_cache.entries == [E(1, 0), E(2, 3)]
    log.truncate_fully_and_start_at(40)
    assert log.leader_epoch_cache.entries == [] and epoch_file(log) == b"0\n0\n"
    log.append(simple_batch(), leader_epoch=9)
    assert log.leader_epoch_cache.entries == [E(9, 40)]


def test_raising_the_log_start_moves_the_first_epoch_to_it(tmp_path) -> None:
    clock = FakeClock()
    log = open_log(tmp_path / "t-0", clock, **{"segment.bytes": len(simple_batch()) * 3, "retention.ms": 1000})
    for i in range(12):
        log.append(simple_batch(ts=T0 + (1500 if i >= 9 else 0)), leader_epoch=i // 4)
    assert log.leader_epoch_cache.entries == [E(0, 0), E(1, 4), E(2, 8)]
    log.increment_log_start_offset(2)
    assert log.leader_epoch_cache.entries == [E(0, 2), E(1, 4), E(2, 8)]
    clock.now = T0 + 2000  # the first three segments are past retention.ms, the last is not
    assert delete_retention_ms_breached(log, clock()) > 0
    assert log.log_start_offset == 9
    assert log.leader_epoch_cache.entries == [E(2, 9)]
    assert epoch_file(log) == b"0\n1\n2 9\n"


# --- loading ------------------------------------------------------------------------------------

def test_reopen_after_a_crash_drops_entries_past_the_recovered_end(tmp_path) -> None:
    """The checkpoint is written before the data: a crash that loses unflushed data leaves it ahead of the log."""
    log = open_log(tmp_path / "t-0")
    for epoch in (1, 1, 2):
        log.append(simple_batch(), leader_epoch=epoch)
    log.flush()
    log.append(simple_batch(), leader_epoch=3)
    log.append(simple_batch(), leader_epoch=3)
    assert epoch_file(log) == b"0\n3\n1 0\n2 2\n3 3\n"
    seg = log.active_segment
    lost_from = [p for p, b in segment_batches(seg) if b.header.base_offset == 3][0]
    drop_unclosed(log)
    os.truncate(seg.log_path, lost_from)  # what the page cache had not written is gone
    reopened = open_log(tmp_path / "t-0", clean=False, recovery_point=3)
    assert reopened.log_end_offset == 3
    assert reopened.leader_epoch_cache.entries == [E(1, 0), E(2, 2)]
    assert epoch_file(reopened) == b"0\n2\n1 0\n2 2\n", "the file is made to agree at once"
    assert reopened.end_offset_for_epoch(3) == (-1, -1)


def test_unclean_recovery_reads_the_epochs_again_from_the_batches(tmp_path) -> None:
    # LogLoaderTest.testLeaderEpochCacheRecoveredAfterUncleanShutdown (its appendAsFollower batches)
    log = open_log(tmp_path / "t-0")
    for base, epoch in [(0, 1), (1, 2), (2, 2), (3, 3)]:
        log.append(follower_batch(base, 1, epoch), assign_offsets=False)
    assert log.leader_epoch_cache.entries == [E(1, 0), E(2, 1), E(3, 3)]
    log.leader_epoch_cache.truncate_from_end(1)  # deliberately lose entries from the file
    assert log.leader_epoch_cache.entries == [E(1, 0)]
    log.close()
    reopened = open_log(tmp_path / "t-0", clean=False, recovery_point=0)
    assert reopened.leader_epoch_cache.entries == [E(1, 0), E(2, 1), E(3, 3)]
    assert epoch_file(reopened) == b"0\n3\n1 0\n2 1\n3 3\n"


def test_unclean_recovery_rereads_epochs_only_from_the_recovery_points_segment_on(tmp_path) -> None:
    log = open_log(tmp_path / "t-0", **{"segment.bytes": len(follower_batch(0, 1, 0)) * 2})
    for base, epoch in [(0, 0), (1, 0), (2, 1), (3, 2), (4, 3)]:
        log.append(follower_batch(base, 1, epoch), assign_offsets=False)
    assert [s.base_offset for s in log.segments] == [0, 2, 4]
    drop_unclosed(log)
    with open(os.path.join(log.dir, LEADER_EPOCH_CHECKPOINT), "wb") as f:
        f.write(b"0\n1\n0 1\n")  # below the recovery point the file is trusted, as Kafka does (0 1, not 0 0)
    reopened = open_log(tmp_path / "t-0", clean=False, recovery_point=3)
    assert reopened.leader_epoch_cache.entries == [E(0, 1), E(1, 2), E(2, 3), E(3, 4)]


def test_recovery_trusts_the_batches_over_a_stale_higher_epoch_in_the_file(tmp_path) -> None:
    """A file entry for an epoch the recovered batches do not hold is replaced, not kept (epoch 3 < 5)."""
    log = open_log(tmp_path / "t-0")
    log.append(follower_batch(0, 2, 1) + follower_batch(2, 2, 3), assign_offsets=False)
    log.close()
    with open(os.path.join(log.dir, LEADER_EPOCH_CHECKPOINT), "wb") as f:
        f.write(b"0\n2\n1 0\n5 2\n")
    reopened = open_log(tmp_path / "t-0", clean=False, recovery_point=0)
    assert reopened.leader_epoch_cache.entries == [E(1, 0), E(3, 2)]


def test_a_clean_start_trusts_the_file_and_clamps_it_to_the_log(tmp_path) -> None:
    log = open_log(tmp_path / "t-0", **{"segment.bytes": len(simple_batch()) * 2})
    for epoch in (1, 1, 2, 2, 3):
        log.append(simple_batch(), leader_epoch=epoch)
    log.increment_log_start_offset(1)
    log.close()
    with open(os.path.join(log.dir, LEADER_EPOCH_CHECKPOINT), "wb") as f:
        f.write(b"0\n4\n0 0\n1 0\n2 2\n3 4\n")  # the log start move was not written; the file has an older epoch
    reopened = Log(log.dir, log.config, clock=FakeClock(), log_start_offset=1)
    assert reopened.leader_epoch_cache.entries == [E(1, 1), E(2, 2), E(3, 4)]


def test_an_unreadable_epoch_file_is_rebuilt_from_the_batches(tmp_path, caplog) -> None:
    log = open_log(tmp_path / "t-0")
    for base, epoch in [(0, 0), (2, 0), (3, 5), (5, 7)]:
        log.append(follower_batch(base, 2 if base != 2 else 1, epoch), assign_offsets=False)
    log.close()
    path = os.path.join(log.dir, LEADER_EPOCH_CHECKPOINT)
    with open(path, "wb") as f:
        f.write(b"0\n2\n0 0\n5 garbage\n")
    with caplog.at_level(logging.ERROR, logger="shale.sidecar.log.log"):
        reopened = open_log(tmp_path / "t-0")
    assert [r for r in caplog.records if r.levelno == logging.ERROR and path in r.getMessage()
            and "t-0" in r.getMessage()], "an ERROR names the partition and the file"
    assert reopened.leader_epoch_cache.entries == [E(0, 0), E(5, 3), E(7, 5)]
    with open(path, "rb") as f:
        assert parse_epoch_entries(f.read()) == [E(0, 0), E(5, 3), E(7, 5)]
    assert stamped_epochs(reopened) == [(0, 0), (2, 0), (3, 5), (5, 7)], "the log itself is untouched"


def test_an_unreadable_epoch_file_of_a_log_without_epochs_is_replaced(tmp_path) -> None:
    log = open_log(tmp_path / "t-0")
    log.append(simple_batch())
    log.close()
    path = os.path.join(log.dir, LEADER_EPOCH_CHECKPOINT)
    with open(path, "wb") as f:
        f.write(b"7\n")
    assert open_log(tmp_path / "t-0").leader_epoch_cache.entries == []
    with open(path, "rb") as f:
        assert f.read() == b"0\n0\n", "not rebuilt again at every start"


# --- the high watermark -------------------------------------------------------------------------

def test_a_single_replica_high_watermark_is_the_log_end(tmp_path) -> None:
    log = open_log(tmp_path / "t-0")
    log.append(simple_batch() + simple_batch())
    assert not log.replicated
    assert log.high_watermark == log.log_end_offset == 2
    assert log.update_high_watermark(1) is False and log.high_watermark == 2
    assert log.checkpointed_high_watermark is None


def test_a_replicated_high_watermark_moves_only_when_told_and_never_back(tmp_path) -> None:
    log = open_log(tmp_path / "t-0")
    log.replicated = True
    assert log.high_watermark == 0, "Kafka's missing checkpoint entry (0), clamped to the log start"
    for _ in range(5):
        log.append(simple_batch(), leader_epoch=0)
    assert log.high_watermark == 0 and log.log_end_offset == 5, "appends do not commit"
    assert log.last_stable_offset == 0
    assert log.update_high_watermark(3) is True and log.high_watermark == 3
    assert log.update_high_watermark(2) is False and log.high_watermark == 3, "never back"
    assert log.update_high_watermark(3) is False
    assert log.update_high_watermark(99) is True and log.high_watermark == 5, "clamped to the log end"
    assert log.checkpointed_high_watermark == 5
    log.truncate_to(4)
    assert log.high_watermark == 4, "only a truncation below it lowers it"
    log.truncate_to(10)
    assert log.high_watermark == 4
    log.truncate_fully_and_start_at(20)
    assert log.high_watermark == 20


def test_the_log_start_offset_may_not_pass_the_high_watermark(tmp_path) -> None:
    log = open_log(tmp_path / "t-0")
    log.replicated = True
    for _ in range(6):
        log.append(simple_batch(), leader_epoch=0)
    log.update_high_watermark(3)
    with pytest.raises(OffsetOutOfRangeError, match="high watermark 3"):
        log.increment_log_start_offset(4)
    log.increment_log_start_offset(3)
    assert log.log_start_offset == 3 and log.high_watermark == 3
    log.set_high_watermark_on_load(1)
    assert log.high_watermark == 3, "clamped to the log start"
    log.set_high_watermark_on_load(100)
    assert log.high_watermark == 6, "clamped to the log end"


def test_a_loaded_high_watermark_waits_for_the_log_to_become_replicated(tmp_path) -> None:
    log = open_log(tmp_path / "t-0")
    for _ in range(6):
        log.append(simple_batch(), leader_epoch=0)
    log.set_high_watermark_on_load(4)
    assert log.high_watermark == 6 and log.checkpointed_high_watermark == 4
    log.replicated = True
    assert log.high_watermark == 4
    log.replicated = False
    assert log.high_watermark == 6 and log.checkpointed_high_watermark is None


def test_retention_never_deletes_at_or_above_a_replicated_high_watermark(tmp_path) -> None:
    clock = FakeClock()
    log = open_log(tmp_path / "t-0", clock, **{"segment.bytes": len(simple_batch()) * 3, "retention.ms": 1000})
    log.replicated = True
    for _ in range(12):
        log.append(simple_batch(ts=clock()), leader_epoch=0)
    log.update_high_watermark(7)
    clock.sleep(5000)
    delete_retention_ms_breached(log, clock())
    assert log.log_start_offset == 6, "the segment holding the high watermark stays"
    assert [s.base_offset for s in log.segments] == [6, 9]


def test_the_cleaner_never_cleans_at_or_above_a_replicated_high_watermark(tmp_path) -> None:
    clock = FakeClock()
    cfg = make_config({"cleanup.policy": "compact", "segment.bytes": 300, "min.cleanable.dirty.ratio": 0.01,
                       "file.delete.delay.ms": 0})
    ld = LogDir(str(tmp_path / "data"), lambda topic: cfg, clock=clock)
    log = ld.get_or_create(TopicPartition("compacted", 0))
    log.replicated = True
    while len(log.segments) < 6:
        log.append(record(log.log_end_offset % 3, log.log_end_offset, clock()), leader_epoch=0)
    bases = [s.base_offset for s in log.segments]
    hw = bases[3] + 1  # inside the fourth segment
    log.update_high_watermark(hw)
    before = offsets_in_log(log)
    manager = CleanerManager(ld.path, lambda: ld.logs, clock)
    threads = LogCleaner(manager, lambda: ld.logs, CleanerConfig(dedupe_buffer_size=1 << 16), clock)
    cleaner = make_cleaner(clock=clock, check_aborted=lambda lg: manager.check_aborted(lg.topic_partition))
    assert threads.clean_once(cleaner) is True
    after = offsets_in_log(log)
    assert [o for o in after if o >= bases[3]] == [o for o in before if o >= bases[3]], \
        "nothing from the segment holding the high watermark on is cleaned"
    assert len([o for o in after if o < bases[3]]) < len([o for o in before if o < bases[3]])
    assert set(keys_in_log(log)) == {0, 1, 2}
    assert manager.read_checkpoint()[TopicPartition("compacted", 0)] <= hw
    ld.close()


# --- replication-offset-checkpoint --------------------------------------------------------------

def test_high_watermarks_are_checkpointed_and_loaded(tmp_path) -> None:
    cfg = make_config({})
    ld = LogDir(str(tmp_path / "data"), lambda topic: cfg, clock=FakeClock())
    replicated = ld.get_or_create(TopicPartition("r", 0))
    single = ld.get_or_create(TopicPartition("s", 0))
    path = os.path.join(ld.path, REPLICATION_OFFSET_CHECKPOINT)
    ld.checkpoint()
    assert not os.path.exists(path), "a directory of single-replica logs has no replication-offset-checkpoint"
    replicated.replicated = True
    for _ in range(5):
        replicated.append(simple_batch(), leader_epoch=0)
        single.append(simple_batch())
    replicated.update_high_watermark(3)
    ld.checkpoint()
    with open(path, "rb") as f:
        assert f.read() == b"0\n1\nr 0 3\n"
    replicated.update_high_watermark(4)
    assert ld.close() is True
    assert read_offsets(path) == {TopicPartition("r", 0): 4}, "written at a clean shutdown too"

    ld = LogDir(str(tmp_path / "data"), lambda topic: cfg, clock=FakeClock())
    log = ld.logs[TopicPartition("r", 0)]
    assert log.checkpointed_high_watermark == 4
    ld.checkpoint()  # before the replica layer marks it replicated: the loaded value is kept, not dropped
    assert read_offsets(path) == {TopicPartition("r", 0): 4}
    log.replicated = True
    assert log.high_watermark == 4 and log.log_end_offset == 5
    assert ld.logs[TopicPartition("s", 0)].high_watermark == 5
    ld.close()


def test_a_checkpointed_high_watermark_is_clamped_to_the_recovered_log(tmp_path) -> None:
    cfg = make_config({})
    ld = LogDir(str(tmp_path / "data"), lambda topic: cfg, clock=FakeClock())
    log = ld.get_or_create(TopicPartition("r", 0))
    log.replicated = True
    for _ in range(5):
        log.append(simple_batch(), leader_epoch=2)
    log.update_high_watermark(5)
    ld.checkpoint()
    log.truncate_to(2)  # e.g. the unflushed tail lost in a crash
    drop_unclosed(log)
    os.close(ld._lock_fd)
    ld = LogDir(str(tmp_path / "data"), lambda topic: cfg, clock=FakeClock())
    log = ld.logs[TopicPartition("r", 0)]
    log.replicated = True
    assert log.log_end_offset == 2 and log.high_watermark == 2
    assert log.leader_epoch_cache.entries == [E(2, 0)]
    ld.close()
