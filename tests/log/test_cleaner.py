"""Compaction: Kafka's LogCleanerTest scenarios (spec 7.3-7.9, 10.1 items 1-34) on real files.

Each test names the Kafka test it mirrors. Kafka's FakeOffsetMap ("these keys are superseded") is
the real OffsetMap filled with a huge offset (`fill_map`); `makeCleaner(capacity)` is a real map of
`capacity` slots at load factor 0.75; `LogToClean(tp, log, firstDirty, uncleanable)` is `to_clean`.
Not applicable here: testDuplicateCheckAfterCleaning (no producer-state de-duplication in Log),
testSegmentWithOffsetOverflow and testCleanCorruptMessageSet (v0/v1 only), the JMX metric tests.
"""

from __future__ import annotations

import io
import os
import random
import struct

import pytest
from cleaner_util import (
    BIG_OFFSET,
    INT_MAX,
    TxnProducer,
    batches,
    clean_group,
    control_types,
    copy_dir,
    end_marker,
    fill_map,
    headers,
    idempotent_record,
    k,
    key_values,
    keys_in_log,
    last_offsets_per_batch,
    last_sequences,
    latest_per_key,
    make_cleaner,
    offsets_in_log,
    raw_header,
    read_all,
    record,
    run_two_pass_clean,
    temp_files,
    to_clean,
    tombstone,
    unkeyed,
)

from shale.sidecar.dump_log import dump_files
from shale.sidecar.log.checkpoint import CLEANER_OFFSET_CHECKPOINT
from shale.sidecar.log.cleaner import (
    CHUNK_BYTES,
    CleanerStats,
    CleaningAbortedError,
    group_segments_by_size,
    segments_in_range,
)
from shale.sidecar.log.cleaner_manager import CleanerManager
from shale.sidecar.log.compression import Compression
from shale.sidecar.log.errors import CorruptRecordError
from shale.sidecar.log.log import Log
from shale.sidecar.log.log_cleaner import CleanerConfig, LogCleaner
from shale.sidecar.log.log_dir import LogDir
from shale.sidecar.log.records import (
    BATCH_OVERHEAD,
    DELETE_HORIZON_BIT,
    BatchHeader,
    ControlType,
    Record,
    check_batch,
    encode_batch,
)
from shale.sidecar.log.throttler import Throttler
from shale.sidecar.log.topic_partition import TopicPartition
from shale.sidecar.log.txn_scan import scan
from support.logtest_util import T0, dir_snapshot, drop_unclosed, make_config

BASE_CONFIG = {"cleanup.policy": "compact", "segment.bytes": 1024, "segment.index.bytes": 1024,
               "delete.retention.ms": 1000}


def open_log(tmp_path, clock, name: str = "test-0", **overrides) -> Log:
    props = dict(BASE_CONFIG)
    props.update({key.replace("_", "."): v for key, v in overrides.items()})
    return Log(str(tmp_path / name), make_config(props), clock=clock)


def fill_segments(log: Log, clock, n: int, key_mod: int | None = None) -> None:
    """Kafka's `while (log.numberOfSegments < n) log.appendAsLeader(record(leo, leo))`."""
    while len(log.segments) < n:
        leo = log.log_end_offset
        log.append(record(leo if key_mod is None else leo % key_mod, leo, clock()))


# --- the seed walkthrough ----------------------------------------------------------------------

def test_seed_walkthrough_latest_product_price(tmp_path, clock) -> None:
    """The seed scenario: compact topic latest-product-price; after a pass each key reads as its latest value."""
    cfg = make_config({"cleanup.policy": "compact", "segment.ms": 100, "min.cleanable.dirty.ratio": 0.01,
                       "delete.retention.ms": 100})
    ld = LogDir(str(tmp_path / "data"), lambda topic: cfg, clock=clock)
    tp = TopicPartition("latest-product-price", 0)
    log = ld.get_or_create(tp)
    prices = [("p3", "10$"), ("p5", "7$"), ("p3", "11$"), ("p6", "25$"), ("p6", "12$"), ("p5", "14$"), ("p5", "17$")]
    for i, (key, value) in enumerate(prices):
        clock.now = T0 + 60 * i
        log.append(encode_batch([Record(0, clock.now, key.encode(), value.encode())]))
    # record time drives the roll: a record more than segment.ms after a segment's first one starts a new segment
    assert [s.base_offset for s in log.segments] == [0, 2, 4, 6]
    manager = CleanerManager(ld.path, lambda: ld.logs, clock)
    cleaner_threads = LogCleaner(manager, lambda: ld.logs, CleanerConfig(dedupe_buffer_size=1 << 16), clock)
    cleaner = make_cleaner(clock=clock, check_aborted=lambda lg: manager.check_aborted(lg.topic_partition))
    assert cleaner_threads.clean_once(cleaner) is True

    seen = [(r.key.decode(), r.value.decode()) for r in read_all(log)]
    assert seen == [("p3", "11$"), ("p6", "12$"), ("p5", "14$"), ("p5", "17$")]
    assert dict(seen) == {"p3": "11$", "p5": "17$", "p6": "12$"}  # each key's latest value
    inactive_keys = [r.key for h, recs in batches(log) for r in recs if h.last_offset < log.active_segment.base_offset]
    assert len(inactive_keys) == len(set(inactive_keys)), "duplicates remain only in the active segment"
    assert [r.key for r in read_all(log) if r.offset >= log.active_segment.base_offset] == [b"p5"]
    assert manager.read_checkpoint() == {tp: 6}
    with open(os.path.join(ld.path, CLEANER_OFFSET_CHECKPOINT), "rb") as f:
        assert f.read() == b"0\n1\nlatest-product-price 0 6\n"
    assert cleaner_threads.clean_once(cleaner) is False, "nothing dirty is left below the active segment"
    ld.close()


# --- 1-3: cleanSegments ------------------------------------------------------------------------

def test_clean_segments(tmp_path, clock) -> None:  # LogCleanerTest.testCleanSegments
    log = open_log(tmp_path, clock)
    fill_segments(log, clock, 4)
    assert keys_in_log(log) == list(range(log.log_end_offset))
    cleaner = make_cleaner(clock=clock)
    deleted = [1, 3, 5, 7, 9]
    fill_map(cleaner, deleted)
    group = log.segments[:3]
    expected_read = sum(s.size for s in group)
    should_remain = [x for x in keys_in_log(log) if x not in deleted]
    stats = clean_group(cleaner, log, group, group[-1].next_offset, clock())
    assert keys_in_log(log) == should_remain
    assert stats.bytes_read == expected_read
    assert len(log.segments) == 2 and log.segments[0].base_offset == 0
    assert temp_files(log.dir) == [name for name in temp_files(log.dir) if name.endswith(".deleted")]


def test_clean_segments_with_concurrent_segment_deletion(tmp_path, clock) -> None:
    # LogCleanerTest.testCleanSegmentsWithConcurrentSegmentDeletion: retention deletes the segments being cleaned
    # after the cleaner took them and before the swap; the swap must not fail nor rename a file twice.
    log = open_log(tmp_path, clock, **{"cleanup.policy": "compact,delete"})
    while len(log.segments) < 3:
        log.append(record(0, log.log_end_offset, clock()))
    first = log.segments[0]
    expected_deleted_name = first.log_path + ".deleted"
    fired = []

    def retention_meanwhile(_n: int) -> None:
        if not fired and any(n.endswith(".cleaned") for n in os.listdir(log.dir)):
            fired.append(True)
            log.increment_log_start_offset(log.active_segment.base_offset)
            from shale.sidecar.log.retention import delete_old_segments

            assert delete_old_segments(log, clock()) == 2

    cleaner = make_cleaner(clock=clock, throttle=retention_meanwhile)
    group = log.segments[:-1]
    cleaner.build_offset_map(log, log.segments, 0, log.active_segment.base_offset, scan(log.segments), CleanerStats())
    clean_group(cleaner, log, group, group[-1].next_offset, clock())
    assert fired
    assert first.log_path == expected_deleted_name, "renamed for async deletion exactly once"
    assert os.path.exists(expected_deleted_name)
    assert not any(n.endswith(".deleted.deleted") for n in os.listdir(log.dir))
    assert len(log.segments) == 2


def test_size_trimmed_for_preallocated_and_compacted_topic(tmp_path, clock) -> None:
    # LogCleanerTest.testSizeTrimmedForPreallocatedAndCompactedTopic
    log = open_log(tmp_path, clock, preallocate="true")
    for key in (0, 1, 0, 1, 0):
        log.append(record(key, key, clock()))
    log.roll()
    assert os.path.getsize(log.active_segment.log_path) == 1024, "the active segment is preallocated"
    make_cleaner(2, clock=clock).clean(to_clean(log, 2))
    first = log.segments[0]
    assert os.path.getsize(first.log_path) == first.size < 1024, "the cleaned segment is trimmed to its real size"
    assert offsets_in_log(log) == [1, 2, 3, 4]


# --- 5-13: transactions ------------------------------------------------------------------------

def test_multi_pass_segment_cleaning_with_aborted_transactions(tmp_path, clock) -> None:
    # LogCleanerTest.testMultiPassSegmentCleaningWithAbortedTransactions: a 3-key map forces several passes;
    # aborted data never comes back, committed data stays, the markers and the LSO are kept.
    log = open_log(tmp_path, clock, **{"delete.retention.ms": 50_000})
    p1, p2 = TxnProducer(log, 1, clock=clock), TxnProducer(log, 2, clock=clock)
    p1([1, 2])  # 0, 1
    p2([2, 3])  # 2, 3
    p1([3, 4])  # 4, 5
    p1.commit()  # 6
    p2([4, 5])  # 7, 8
    p2.abort()  # 9
    p2([5, 6])  # 10, 11
    p1([6, 7])  # 12, 13
    p2.commit()  # 14
    p1.abort()  # 15
    log.roll()
    lso = log.last_stable_offset
    assert lso == 16
    cleaner = make_cleaner(4, clock=clock)
    dirty, passes = 0, 0
    while dirty < log.active_segment.base_offset:
        dirty = cleaner.clean(to_clean(log, dirty))[0]
        passes += 1
        assert [o for o, _k, _v in key_values(log) if o in (2, 3, 7, 8, 12, 13) and _v is not None] == []
    assert passes >= 2, "a 3-key map cannot take the 6 keys in one pass"
    assert [(o, int(key)) for o, key, _v in key_values(log)] == [(0, 1), (1, 2), (4, 3), (5, 4), (10, 5), (11, 6)]
    assert [o for o, _t in control_types(log)] == [6, 9, 14, 15]
    assert last_sequences(log) == {1: 5, 2: 5}, "producer 1's last (aborted) batch is kept empty"
    assert log.last_stable_offset == lso
    log.close()
    reopened = Log(log.dir, log.config, clock=clock)
    assert reopened.last_stable_offset == lso and scan(reopened.segments).open_txns == {}


def test_basic_transaction_aware_cleaning(tmp_path, clock) -> None:  # LogCleanerTest.testBasicTransactionAwareCleaning
    log = open_log(tmp_path, clock, **{"segment.bytes": 2048})
    p1, p2 = TxnProducer(log, 1, clock=clock), TxnProducer(log, 2, clock=clock)
    p1([1, 2])
    p2([2, 3])
    p1([3, 4])
    p1.abort()
    p2.commit()
    p1([2])
    p1.commit()
    log.roll()
    make_cleaner(clock=clock).clean(to_clean(log))
    assert keys_in_log(log) == [3, 2]
    assert offsets_in_log(log) == [3, 6, 7, 8, 9]
    assert control_types(log) == [(6, "ABORT"), (7, "COMMIT"), (9, "COMMIT")]


def test_aborted_data_removed_when_its_marker_is_past_the_cleaned_range(tmp_path, clock) -> None:
    # LogCleanerTest.testCleanWithTransactionsSpanningSegments: aborted transactions are found beyond the
    # cleanable range (Kafka walks the txn indexes of higher segments), so aborted data below it goes.
    log = open_log(tmp_path, clock)
    p1, p2, p3 = (TxnProducer(log, pid, clock=clock) for pid in (1, 2, 3))
    p1([1, 2])  # 0, 1
    p3([2, 3])  # 2, 3
    p2([3, 4])  # 4, 5
    log.roll()
    p2([5, 6])  # 6, 7
    p3([6, 7])  # 8, 9
    p1([7, 8])  # 10, 11
    p2.abort()  # 12
    p3([8, 9])  # 13, 14
    p3.commit()  # 15
    p1([9, 10])  # 16, 17
    p1.abort()  # 18
    cleaner = make_cleaner(clock=clock)
    dirty = cleaner.clean(to_clean(log, 0, 6))[0]
    assert dirty == 6
    assert keys_in_log(log) == [2, 3, 5, 6, 6, 7, 7, 8, 8, 9, 9, 10], "p1 and p2 data below 6 was aborted"
    log.roll()
    p2([11])
    p1([12])
    log.roll()
    cleaner.clean(to_clean(log, dirty))
    assert keys_in_log(log) == [2, 3, 6, 7, 8, 9, 11, 12], "only p3's committed keys and the new ones remain"


def test_committed_transaction_spanning_segments(tmp_path, clock) -> None:
    # LogCleanerTest.testCommittedTransactionSpanningSegments
    log = open_log(tmp_path, clock, **{"segment.bytes": 128})
    p = TxnProducer(log, 1, clock=clock)
    p([1])
    log.roll()
    p.commit()
    log.roll()
    run_two_pass_clean(make_cleaner(clock=clock), log, clock)
    assert offsets_in_log(log) == [0, 1]
    assert last_offsets_per_batch(log) == [0, 1]


def test_aborted_transaction_spanning_segments(tmp_path, clock) -> None:
    # LogCleanerTest.testAbortedTransactionSpanningSegments
    log = open_log(tmp_path, clock, **{"segment.bytes": 128})
    p = TxnProducer(log, 1, clock=clock)
    p([1])
    log.roll()
    p.abort()
    log.roll()
    cleaner = make_cleaner(clock=clock)
    cleaner.clean(to_clean(log))
    # the batch stays (emptied) as the producer's last; the marker stays as the transaction still has a batch
    assert offsets_in_log(log) == [1]
    assert last_offsets_per_batch(log) == [0, 1]
    clock.now += 10 * log.config.delete_retention_ms
    cleaner.clean(to_clean(log))
    assert offsets_in_log(log) == [1]
    assert last_offsets_per_batch(log) == [0, 1]


def test_commit_marker_removal(tmp_path, clock) -> None:  # LogCleanerTest.testCommitMarkerRemoval
    log = open_log(tmp_path, clock, **{"segment.bytes": 256})
    p = TxnProducer(log, 1, clock=clock)
    cleaner = make_cleaner(clock=clock)
    p([1])
    p([2, 3])
    p.commit()
    p([2])
    p.commit()
    log.roll()
    dirty = cleaner.clean(to_clean(log))[0]
    assert keys_in_log(log) == [1, 3, 2]
    assert offsets_in_log(log) == [0, 2, 3, 4, 5], "the marker stays while its transaction has records"
    p([1, 3])
    p.commit()
    log.roll()
    cleaner.clean(to_clean(log, dirty))
    assert keys_in_log(log) == [2, 1, 3]
    assert offsets_in_log(log) == [3, 4, 5, 6, 7, 8], "the marker at 3 stays: its batches were read in this pass"
    assert next(h for h in headers(log) if h.last_offset == 3).delete_horizon_ms is None
    # (Kafka's FakeOffsetMap keeps its last offset across clear(); a real map needs the dirty range from 0 again)
    cleaner.clean(to_clean(log, 0))
    assert offsets_in_log(log) == [3, 4, 5, 6, 7, 8], "first pass without its data: the marker gets a horizon"
    marker = next(h for h in headers(log) if h.last_offset == 3)
    assert marker.delete_horizon_ms == clock() + log.config.delete_retention_ms
    clock.now = marker.delete_horizon_ms - 1
    cleaner.clean(to_clean(log, 0))
    assert offsets_in_log(log) == [3, 4, 5, 6, 7, 8], "not removed before its horizon"
    clock.now = marker.delete_horizon_ms
    cleaner.clean(to_clean(log, 0))
    assert keys_in_log(log) == [2, 1, 3]
    assert offsets_in_log(log) == [4, 5, 6, 7, 8]


def test_abort_marker_removal(tmp_path, clock) -> None:  # LogCleanerTest.testAbortMarkerRemoval
    log = open_log(tmp_path, clock, **{"segment.bytes": 256})
    p = TxnProducer(log, 1, clock=clock)
    p([1])
    p([2, 3])
    p.abort()
    p([3])
    p.commit()
    log.roll()
    cleaner = make_cleaner(clock=clock)
    dirty = cleaner.clean(to_clean(log))[0]
    assert keys_in_log(log) == [3]
    assert offsets_in_log(log) == [3, 4, 5], "aborted records go at once, the abort marker stays"
    assert dirty == log.active_segment.base_offset
    run_two_pass_clean(cleaner, log, clock)
    assert keys_in_log(log) == [3]
    assert offsets_in_log(log) == [4, 5]


def test_deleted_batches_with_no_messages_read(tmp_path, clock) -> None:
    # LogCleanerTest.testDeletedBatchesWithNoMessagesRead
    log = open_log(tmp_path, clock, **{"max.message.bytes": 100, "segment.bytes": 1000})
    p = TxnProducer(log, 1, clock=clock)
    p([1])
    p.abort()
    p([2])
    p([2])
    p.commit()
    log.roll()
    cleaner = make_cleaner(clock=clock)
    cleaner.clean(to_clean(log))
    assert keys_in_log(log) == [2]
    assert offsets_in_log(log) == [1, 3, 4]
    run_two_pass_clean(cleaner, log, clock)
    assert keys_in_log(log) == [2]
    assert offsets_in_log(log) == [3, 4]


def test_commit_marker_retention_with_empty_batch(tmp_path, clock) -> None:
    # LogCleanerTest.testCommitMarkerRetentionWithEmptyBatch
    log = open_log(tmp_path, clock, **{"segment.bytes": 256})
    p = TxnProducer(log, 1, clock=clock)
    cleaner = make_cleaner(clock=clock)
    p([2, 3])
    p.commit()
    log.roll()
    log.append(record(2, 2, clock()))
    log.append(record(3, 3, clock()))
    log.roll()
    dirty = cleaner.clean(to_clean(log))[0]
    assert keys_in_log(log) == [2, 3]
    assert offsets_in_log(log) == [2, 3, 4], "the commit marker is retained"
    assert last_offsets_per_batch(log) == [1, 2, 3, 4], "the empty batch is retained"
    cleaner.clean(to_clean(log, 0))
    assert offsets_in_log(log) == [2, 3, 4]
    assert last_offsets_per_batch(log) == [1, 2, 3, 4], "it still holds the producer's last sequence"
    p([1])
    p.commit()
    log.roll()
    cleaner.clean(to_clean(log, dirty))
    assert keys_in_log(log) == [2, 3, 1]
    assert offsets_in_log(log) == [2, 3, 4, 5, 6]
    assert last_offsets_per_batch(log) == [2, 3, 4, 5, 6], "the empty batch is gone"
    run_two_pass_clean(cleaner, log, clock)
    assert keys_in_log(log) == [2, 3, 1]
    assert offsets_in_log(log) == [3, 4, 5, 6], "the commit marker is gone"
    assert last_offsets_per_batch(log) == [3, 4, 5, 6]


def test_abort_marker_retention_with_empty_batch(tmp_path, clock) -> None:
    # LogCleanerTest.testAbortMarkerRetentionWithEmptyBatch
    log = open_log(tmp_path, clock, **{"segment.bytes": 256})
    p = TxnProducer(log, 1, clock=clock)
    cleaner = make_cleaner(clock=clock)
    p([2, 3])
    p.abort()
    log.roll()
    log.append(record(3, 3, clock()))
    log.roll()
    dirty = run_two_pass_clean(cleaner, log, clock)
    assert keys_in_log(log) == [3]
    assert offsets_in_log(log) == [2, 3], "the abort marker stays: its (emptied) batch is still there"
    assert last_offsets_per_batch(log) == [1, 2, 3]
    p([1])
    p.commit()
    log.roll()
    cleaner.clean(to_clean(log, dirty))
    assert offsets_in_log(log) == [2, 3, 4, 5], "the empty batch went; the marker needs a horizon pass"
    assert last_offsets_per_batch(log) == [2, 3, 4, 5]
    run_two_pass_clean(cleaner, log, clock)
    assert keys_in_log(log) == [3, 1]
    assert offsets_in_log(log) == [3, 4, 5]
    assert last_offsets_per_batch(log) == [3, 4, 5]


def test_clean_empty_control_batch(tmp_path, clock) -> None:  # LogCleanerTest.testCleanEmptyControlBatch
    log = open_log(tmp_path, clock, **{"segment.bytes": 256})
    log.append(end_marker(1, 0, ControlType.COMMIT, clock()))
    log.append(record(2, 2, clock()))
    log.append(record(3, 3, clock()))
    log.roll()
    cleaner = make_cleaner(clock=clock)
    # pass 1 sets the marker's horizon, pass 2 empties it, but the empty batch keeps the producer's epoch
    run_two_pass_clean(cleaner, log, clock)
    assert keys_in_log(log) == [2, 3]
    assert offsets_in_log(log) == [1, 2]
    assert last_offsets_per_batch(log) == [0, 1, 2]
    assert headers(log)[0].is_control and headers(log)[0].records_count == 0
    run_two_pass_clean(cleaner, log, clock)  # the empty control batch cleans without error
    assert offsets_in_log(log) == [1, 2]
    assert last_offsets_per_batch(log) == [0, 1, 2]


def test_empty_batch_removal_with_sequence_reuse(tmp_path, clock) -> None:
    # LogCleanerTest.testEmptyBatchRemovalWithSequenceReuse: the group coordinator starts every batch at sequence 0
    log = open_log(tmp_path, clock, **{"segment.bytes": 2048})
    TxnProducer(log, 1, clock=clock)([1])
    log.append(end_marker(1, 0, ControlType.COMMIT, clock()))
    TxnProducer(log, 1, clock=clock)([2])
    log.append(end_marker(1, 0, ControlType.COMMIT, clock()))
    log.append(record(1, 1, clock()))
    log.append(record(2, 1, clock()))
    log.roll()
    cleaner = make_cleaner(clock=clock)
    cleaner.clean(to_clean(log))
    assert offsets_in_log(log) == [1, 3, 4, 5]
    assert last_offsets_per_batch(log) == [1, 2, 3, 4, 5]
    run_two_pass_clean(cleaner, log, clock)
    assert offsets_in_log(log) == [3, 4, 5]
    assert last_offsets_per_batch(log) == [2, 3, 4, 5]


def test_open_transaction_beyond_cleanable_range_is_not_compacted(tmp_path, clock) -> None:
    # LogCleanerManager.calculateCleanableBytes: the segment holding the last stable offset is uncleanable,
    # so the data of an undecided transaction can never shadow (and delete) a committed value.
    log = open_log(tmp_path, clock)
    log.append(record(1, 100, clock()))  # 0: committed value of key 1
    TxnProducer(log, 7, clock=clock)([1])  # 1: an open transaction writes key 1
    log.append(record(2, 200, clock()))  # 2
    log.roll()
    log.append(record(3, 300, clock()))
    assert log.last_stable_offset == 1
    manager = CleanerManager(str(tmp_path), lambda: {TopicPartition("test", 0): log}, clock)
    offsets = manager.cleanable_offsets(TopicPartition("test", 0), log, None, clock())
    assert offsets.first_uncleanable == 1
    ltc = manager.log_to_clean(log, offsets, clock())
    assert ltc.first_uncleanable_offset == 0 and ltc.cleanable_bytes == 0
    make_cleaner(clock=clock).clean(ltc)
    TxnProducer(log, 7, clock=clock).abort()
    assert (0, k(1), k(100)) in key_values(log), "the committed value survives the aborted transaction"


# --- 14-15: sizes and corruption ---------------------------------------------------------------

def test_large_message(tmp_path, clock) -> None:  # LogCleanerTest.testLargeMessage
    large = 300 * 1024  # larger than the cleaner's 256 KiB write chunk
    log = open_log(tmp_path, clock, **{"segment.bytes": 2 * 1024 * 1024, "max.message.bytes": 2 * large,
                                       "segment.index.bytes": 4096})
    while len(log.segments) < 2:
        leo = log.log_end_offset
        log.append(encode_batch([Record(0, clock(), k(leo), bytes(large))]))
    assert large > CHUNK_BYTES
    assert keys_in_log(log) == list(range(log.log_end_offset))
    cleaner = make_cleaner(clock=clock)
    deleted = [1, 3, 5]
    fill_map(cleaner, deleted)
    should_remain = [x for x in keys_in_log(log) if x not in deleted]
    first = log.segments[0]
    clean_group(cleaner, log, [first], first.next_offset, clock())
    assert keys_in_log(log) == should_remain
    assert all(len(r.value) == large for _h, recs in batches(log) for r in recs)


def test_message_larger_than_max_message_size(tmp_path, clock) -> None:
    # LogCleanerTest.testMessageLargerThanMaxMessageSize: batches written under a larger max.message.bytes are
    # still cleaned after the topic's limit was lowered
    log = open_log(tmp_path, clock, **{"segment.bytes": 64 * 1024, "max.message.bytes": 20_000})
    while len(log.segments) < 2:
        leo = log.log_end_offset
        log.append(encode_batch([Record(0, clock(), k(leo), bytes(10_000))]))
    log.config = make_config({**BASE_CONFIG, "segment.bytes": 64 * 1024, "max.message.bytes": 1024})
    cleaner = make_cleaner(clock=clock)
    fill_map(cleaner, [1, 3, 5])
    should_remain = [x for x in keys_in_log(log) if x not in (1, 3, 5)]
    first = log.segments[0]
    clean_group(cleaner, log, [first], first.next_offset, clock())
    assert keys_in_log(log) == should_remain


def corrupt_log(tmp_path, clock) -> Log:
    log = open_log(tmp_path, clock)
    fill_segments(log, clock, 3, key_mod=5)
    return log


def test_corrupt_message_size_larger_than_bytes_available(tmp_path, clock) -> None:
    # LogCleanerTest.testCorruptMessageSizeLargerThanBytesAvailable: a batch size past the end of the segment is
    # corruption (CorruptRecordException), not the end of the segment: nothing after it may be dropped.
    log = corrupt_log(tmp_path, clock)
    seg = log.segments[0]
    target = list(seg.batches())[3]
    with open(seg.log_path, "r+b") as f:
        f.seek(target.position + 8)
        f.write(struct.pack(">i", 1 << 30))
    before = dir_snapshot(log.dir)
    with pytest.raises(CorruptRecordError, match="corrupt"):
        make_cleaner(clock=clock).clean(to_clean(log))
    assert dir_snapshot(log.dir) == before, "the log is untouched and no .cleaned file is left"


def test_message_larger_than_max_message_size_with_corrupt_header(tmp_path, clock) -> None:
    # LogCleanerTest.testMessageLargerThanMaxMessageSizeWithCorruptHeader: a bad magic byte is corruption
    log = corrupt_log(tmp_path, clock)
    seg = log.segments[0]
    with open(seg.log_path, "r+b") as f:
        f.seek(16)
        f.write(b"\xff")
    before = dir_snapshot(log.dir)
    with pytest.raises(CorruptRecordError):
        make_cleaner(clock=clock).clean(to_clean(log))
    assert dir_snapshot(log.dir) == before


def test_corrupt_trailing_bytes_in_inactive_segment(tmp_path, clock) -> None:
    # Kafka's growBuffersOrFail: garbage at the end of a segment ("jogeajgoea") is never silently dropped
    log = corrupt_log(tmp_path, clock)
    seg = log.segments[1]
    with open(seg.log_path, "r+b") as f:
        f.seek(0)
        f.write(b"jogeajgoea")
    before = dir_snapshot(log.dir)
    with pytest.raises(CorruptRecordError, match="corrupt"):
        make_cleaner(clock=clock).clean(to_clean(log))
    after = dir_snapshot(log.dir)
    # the group before it was cleaned and swapped in (groups are independent); the corrupt segment and
    # everything after it are exactly as they were, and no .cleaned file is left
    assert {n: v for n, v in after.items() if not n.startswith(f"{0:020d}.")} == \
        {n: v for n, v in before.items() if not n.startswith(f"{0:020d}.")}
    assert [n for n in temp_files(log.dir) if not n.endswith(".deleted")] == []


# --- 16-26: records ----------------------------------------------------------------------------

def test_cleaning_with_deletes(tmp_path, clock) -> None:  # LogCleanerTest.testCleaningWithDeletes
    log = open_log(tmp_path, clock)
    fill_segments(log, clock, 2)
    leo = log.log_end_offset
    for key in range(0, leo, 2):
        log.append(tombstone(key, clock()))
    fill_segments(log, clock, 4)
    make_cleaner(clock=clock).clean(to_clean(log))
    keys = set(keys_in_log(log))
    assert not any(key in keys for key in range(0, leo, 2)), "none of the deleted keys should still exist"
    assert all(key in keys for key in range(1, leo, 2))


def test_log_cleaner_stats(tmp_path, clock) -> None:  # LogCleanerTest.testLogCleanerStats
    log = open_log(tmp_path, clock)
    for key in (0, 1, 0, 1, 0):
        log.append(record(key, key, clock()))
    log.roll()
    initial_size = log.size_in_bytes
    end_offset, stats = make_cleaner(4, clock=clock).clean(to_clean(log, 2))
    assert end_offset == 5
    assert stats.messages_read == 5
    assert stats.bytes_read == initial_size
    assert stats.messages_written == 2
    assert stats.bytes_written == log.size_in_bytes
    assert stats.invalid_messages == 0
    assert stats.end_s >= stats.start_s


def test_log_cleaner_retains_producer_last_sequence(tmp_path, clock) -> None:
    # LogCleanerTest.testLogCleanerRetainsProducerLastSequence
    log = open_log(tmp_path, clock)
    log.append(record(0, 0, clock()))
    log.append(idempotent_record(0, 1, clock(), pid=1, epoch=0, seq=0))
    log.append(idempotent_record(0, 2, clock(), pid=2, epoch=0, seq=0))
    log.append(idempotent_record(0, 3, clock(), pid=3, epoch=0, seq=0))
    log.append(idempotent_record(1, 1, clock(), pid=2, epoch=0, seq=1))
    log.roll()
    originals = {h.last_offset: h for h in headers(log)}
    make_cleaner(10, clock=clock).clean(to_clean(log))
    assert last_offsets_per_batch(log) == [1, 3, 4]
    assert last_sequences(log) == {1: 0, 2: 1, 3: 0}
    assert keys_in_log(log) == [0, 1]
    assert offsets_in_log(log) == [3, 4]
    # producer 1's last batch kept empty: the bare 61-byte header Kafka's writeEmptyHeader writes
    seg = log.segments[0]
    empty = next(b for b in seg.batches() if b.header.last_offset == 1)
    h, orig = empty.header, originals[1]
    assert empty.size == BATCH_OVERHEAD == 61 and h.records_count == 0
    assert (h.base_offset, h.last_offset_delta, h.producer_id, h.producer_epoch, h.base_sequence) == (
        orig.base_offset, orig.last_offset_delta, orig.producer_id, orig.producer_epoch, orig.base_sequence)
    assert h.base_timestamp == -1 and h.max_timestamp == orig.max_timestamp
    assert not h.attributes & DELETE_HORIZON_BIT and h.compression is Compression.NONE
    check_batch(seg.read_bytes(empty.position, empty.size))


def test_log_cleaner_retains_last_sequence_even_if_transaction_aborted(tmp_path, clock) -> None:
    # LogCleanerTest.testLogCleanerRetainsLastSequenceEvenIfTransactionAborted
    log = open_log(tmp_path, clock)
    p = TxnProducer(log, 1, clock=clock)
    cleaner = make_cleaner(10, clock=clock)
    p([1])
    p([2, 3])
    p.abort()
    log.roll()
    cleaner.clean(to_clean(log))
    assert last_offsets_per_batch(log) == [2, 3]
    assert last_sequences(log) == {1: 2}
    assert keys_in_log(log) == []
    assert offsets_in_log(log) == [3]
    empty = next(iter(log.segments[0].batches()))
    assert (empty.size, empty.header.base_offset, empty.header.last_offset_delta, empty.header.base_sequence,
            empty.header.is_transactional) == (61, 1, 1, 1, True), "emptied, with its offset span and sequence"
    p([1, 5])
    p.commit()
    log.roll()
    cleaner.clean(to_clean(log))
    assert last_offsets_per_batch(log) == [3, 5, 6]
    assert last_sequences(log) == {1: 4}
    assert keys_in_log(log) == [1, 5]
    assert offsets_in_log(log) == [3, 4, 5, 6]


def test_cleaning_with_keys_conflicting_with_txn_marker_keys(tmp_path, clock) -> None:
    # LogCleanerTest.testCleaningWithKeysConflictingWithTxnMarkerKeys
    from shale.sidecar.log.records import encode_control_key

    log = open_log(tmp_path, clock)
    p1 = TxnProducer(log, 1, clock=clock)
    p1([1])
    p1.commit()
    log.append(encode_batch([Record(0, clock(), encode_control_key(ControlType.COMMIT), b"foo")], producer_id=2,
                            producer_epoch=0, base_sequence=0, is_transactional=True))
    log.append(end_marker(2, 0, ControlType.COMMIT, clock()))
    log.roll()
    assert offsets_in_log(log) == [0, 1, 2, 3]
    make_cleaner(10, clock=clock).clean(to_clean(log))
    assert last_offsets_per_batch(log) == [0, 1, 2, 3]
    assert offsets_in_log(log) == [0, 1, 2, 3]


def test_partial_segment_clean(tmp_path, clock) -> None:  # LogCleanerTest.testPartialSegmentClean
    log = open_log(tmp_path, clock)
    for key in (0, 1, 0, 1, 0):
        log.append(record(key, key, clock()))
    log.roll()
    cleaner = make_cleaner(2, clock=clock)  # load factor 0.75: one key per pass
    assert cleaner.clean(to_clean(log, 2))[0] == 3
    assert keys_in_log(log) == [1, 0, 1, 0]
    assert offsets_in_log(log) == [1, 2, 3, 4]
    assert cleaner.clean(to_clean(log, 3))[0] == 4
    assert keys_in_log(log) == [0, 1, 0]
    assert offsets_in_log(log) == [2, 3, 4]
    cleaner.clean(to_clean(log, 4))
    assert keys_in_log(log) == [1, 0]
    assert offsets_in_log(log) == [3, 4]


def test_cleaning_with_uncleanable_section(tmp_path, clock) -> None:  # LogCleanerTest.testCleaningWithUncleanableSection
    log = open_log(tmp_path, clock)
    n, cleanable_segments, total_segments = 10, 2, 7
    while len(log.segments) <= cleanable_segments:
        log.append(record(log.log_end_offset % n, log.log_end_offset, clock()))
    first_uncleanable = log.log_end_offset + 1  # past the base of the third segment
    while len(log.segments) < total_segments - 1:
        log.append(record(log.log_end_offset % n, log.log_end_offset, clock()))

    def distinct_values_by_segment():
        return [len({r.value for b in seg.batches() for r in batches_of(seg, b)}) for seg in log.segments]

    def batches_of(seg, b):
        from shale.sidecar.log.records import decode_batch

        return decode_batch(seg.read_bytes(b.position, b.size)).records

    before = distinct_values_by_segment()
    assert all(x > n for x in before[:-1]), "each segment must hold duplicates for the test to mean anything"
    make_cleaner(clock=clock).clean(to_clean(log, 0, first_uncleanable))
    after = distinct_values_by_segment()
    assert all(a < b for b, a in zip(before[:cleanable_segments], after[:cleanable_segments]))
    assert before[cleanable_segments:] == after[cleanable_segments:], "the segment holding the uncleanable offset is untouched"


def test_log_to_clean(tmp_path, clock) -> None:  # LogCleanerTest.testLogToClean
    log = open_log(tmp_path, clock, **{"segment.bytes": 100})
    for _ in range(6):
        log.append(encode_batch([Record(0, clock(), b"1", bytes(25))]))
    assert len(log.segments) == 6
    ltc = to_clean(log, log.active_segment.base_offset, log.active_segment.base_offset)
    assert ltc.total_bytes == log.size_in_bytes - log.active_segment.size


def test_log_to_clean_with_uncleanable_section(tmp_path, clock) -> None:
    # LogCleanerTest.testLogToCleanWithUncleanableSection
    log = open_log(tmp_path, clock, **{"segment.bytes": 100})
    for _ in range(6):
        log.append(encode_batch([Record(0, clock(), b"1", bytes(25))]))
    segs = log.segments
    ltc = to_clean(log, segs[2].base_offset, segs[4].base_offset)
    clean_size = segs[0].size + segs[1].size
    cleanable_size = segs[2].size + segs[3].size
    assert ltc.clean_bytes == clean_size
    assert ltc.cleanable_bytes == cleanable_size
    assert ltc.total_bytes == clean_size + cleanable_size
    assert ltc.cleanable_ratio == pytest.approx(cleanable_size / (clean_size + cleanable_size))


def test_cleaning_with_unkeyed_messages(tmp_path, clock) -> None:  # LogCleanerTest.testCleaningWithUnkeyedMessages
    log = open_log(tmp_path, clock, **{"cleanup.policy": "delete"})  # unkeyed records need a non-compacted topic
    while len(log.segments) < 2:
        log.append(unkeyed(log.log_end_offset, clock()))
    invalid = sum(1 for _h, recs in batches(log) for r in recs if r.key is None)
    size_with_unkeyed = log.size_in_bytes
    while len(log.segments) < 3:
        log.append(record(log.log_end_offset, log.log_end_offset, clock()))
    expected_size = log.size_in_bytes - size_with_unkeyed
    _end, stats = make_cleaner(clock=clock).clean(to_clean(log))
    assert sum(1 for _h, recs in batches(log) for r in recs if r.key is None) == 0
    assert log.size_in_bytes == expected_size
    assert stats.invalid_messages == invalid


def test_clean_segments_with_abort(tmp_path, clock) -> None:  # LogCleanerTest.testCleanSegmentsWithAbort
    log = open_log(tmp_path, clock)
    tp = TopicPartition("test", 0)
    fill_segments(log, clock, 4)
    manager = CleanerManager(str(tmp_path), lambda: {tp: log}, clock)
    cfg = make_config({"cleanup.policy": "compact", "min.cleanable.dirty.ratio": 0.0})
    log.config = cfg
    assert manager.grab_filthiest_compacted_log()[0] == tp
    manager.abort_in_progress()  # what pause() does to a running pass, without waiting for it
    cleaner = make_cleaner(clock=clock, check_aborted=lambda lg: manager.check_aborted(lg.topic_partition))
    fill_map(cleaner, keys_in_log(log))
    before = dir_snapshot(log.dir)
    with pytest.raises(CleaningAbortedError):
        clean_group(cleaner, log, log.segments[:3], log.segments[2].next_offset, clock())
    assert temp_files(log.dir) == []
    assert dir_snapshot(log.dir) == before
    manager.done_cleaning(tp, None)
    assert manager.state(tp).state.value == "paused" and manager.state(tp).pause_count == 1


def test_clean_segments_retaining_last_empty_batch(tmp_path, clock) -> None:
    # LogCleanerTest.testCleanSegmentsRetainingLastEmptyBatch
    log = open_log(tmp_path, clock)
    fill_segments(log, clock, 4)
    found = keys_in_log(log)
    assert found == list(range(log.log_end_offset))
    cleaner = make_cleaner(clock=clock)
    fill_map(cleaner, found)  # every key is superseded
    group = log.segments[:3]
    upper = group[-1].next_offset
    expected_read = sum(s.size for s in group)
    stats = clean_group(cleaner, log, group, upper, clock())
    assert stats.bytes_read == expected_read
    cleaned = log.segments[0]
    assert [key for key in keys_in_log(log) if key < upper] == []
    remaining = list(cleaned.batches())
    assert len(remaining) == 1 and cleaned.size == 61
    assert remaining[0].header.last_offset == upper - 1 and remaining[0].header.records_count == 0


# --- 27-28: grouping and the offset map --------------------------------------------------------

def test_segment_grouping(tmp_path, clock) -> None:  # LogCleanerTest.testSegmentGrouping
    log = open_log(tmp_path, clock, **{"segment.bytes": 300, "index.interval.bytes": 1})
    while len(log.segments) < 10:
        log.append(encode_batch([Record(0, clock(), b"hello", b"hello")]))
    segs = log.segments

    def check_order(groups):
        flat = [s.base_offset for g in groups for s in g]
        assert flat == [s.base_offset for s in segs]

    groups = group_segments_by_size(segs, INT_MAX, INT_MAX, log.log_end_offset)
    assert len(groups) == 1 and len(groups[0]) == len(segs)
    check_order(groups)
    groups = group_segments_by_size(segs, 1, INT_MAX, log.log_end_offset)
    assert len(groups) == len(segs) and all(len(g) == 1 for g in groups)
    check_order(groups)
    groups = group_segments_by_size(segs, INT_MAX, 1, log.log_end_offset)
    assert len(groups) == len(segs) and all(len(g) == 1 for g in groups)
    check_order(groups)
    group_size = 3
    log_size = sum(s.size for s in segs[:group_size]) + 1
    groups = group_segments_by_size(segs, log_size, INT_MAX, log.log_end_offset)
    check_order(groups)
    assert all(len(g) == group_size for g in groups[:-1])
    index_size = sum(s.offset_index.size_bytes for s in segs[:group_size]) + 1
    groups = group_segments_by_size(segs, INT_MAX, index_size, log.log_end_offset)
    check_order(groups)
    assert all(len(g) == group_size for g in groups[:-1])
    time_size = sum(s.time_index.size_bytes for s in segs[:group_size]) + 1
    assert segs[0].time_index.size_bytes > 0
    groups = group_segments_by_size(segs, INT_MAX, time_size, log.log_end_offset)
    check_order(groups)
    assert all(len(g) <= group_size for g in groups)


def sparse_log(tmp_path, clock) -> Log:
    """LogCleanerTest's sparse-offset log: 3 segments, each spanning Int.MaxValue+1 offsets, plus an active one."""
    log = open_log(tmp_path, clock)
    for i in range(3):
        log.append(encode_batch([Record(0, clock(), b"key", b"val")]))
        log.append(encode_batch([Record((i + 1) * (INT_MAX + 1) - 1, clock(), b"key", b"val")]), assign_offsets=False)
        assert len(log.segments) == i + 1
    log.append(encode_batch([Record(0, clock(), b"key", b"val")]))
    assert len(log.segments) == 4
    return log


def test_segment_grouping_with_sparse_offsets(tmp_path, clock) -> None:
    # LogCleanerTest.testSegmentGroupingWithSparseOffsets: relative offsets must fit an int32 in the cleaned segment
    log = sparse_log(tmp_path, clock)
    groups = group_segments_by_size(log.segments, INT_MAX, INT_MAX, log.log_end_offset - 1)
    # all segments are non-empty and each spans Int.MaxValue+1 offsets: none can join the one before it
    # (the last one joins its neighbour because its span ends at firstUncleanableOffset - 1)
    assert [len(g) for g in groups] == [1, 1, 2]
    groups = group_segments_by_size(log.segments[:2], INT_MAX, INT_MAX, log.segments[2].base_offset)
    assert [len(g) for g in groups] == [1, 1]


def test_segment_grouping_with_sparse_offsets_and_empty_segments(tmp_path, clock) -> None:
    # LogCleanerTest.testSegmentGroupingWithSparseOffsetsAndEmptySegments
    log = sparse_log(tmp_path, clock)
    first_uncleanable = log.log_end_offset - 1
    groups = group_segments_by_size(log.segments, INT_MAX, INT_MAX, first_uncleanable)
    assert [len(g) for g in groups] == [1, 1, 2]
    cleaner = make_cleaner(clock=clock)
    dirty = 0
    while dirty < first_uncleanable:  # the map's offsets are relative to 32 bits: spans this wide take several passes
        dirty = cleaner.clean(to_clean(log, dirty, first_uncleanable))[0]
    assert len(log.segments) == 4
    assert log.segments[0].size == 0 and log.segments[1].size == 0
    groups = group_segments_by_size(log.segments, INT_MAX, INT_MAX, first_uncleanable)
    assert len(groups) == 2, "the two empty segments group together"
    assert [s.base_offset for s in groups[0]] == [0, INT_MAX + 1]
    cleaner.clean(to_clean(log, 0, first_uncleanable))
    assert len(log.segments) == 3, "and merge into one"
    assert [r.offset for r in read_all(log)] == [3 * (INT_MAX + 1) - 1, 3 * (INT_MAX + 1)]


def test_segment_grouping_following_load_of_zero_index(tmp_path, clock) -> None:
    # LogCleanerTest.testSegmentGroupingFollowingLoadOfZeroIndex: empty indexes do not hide an offset span
    log = open_log(tmp_path, clock, **{"segment.bytes": 400, "index.interval.bytes": 400})
    log.append(encode_batch([Record(0, clock(), b"hello", b"hello")]), assign_offsets=False)
    log.append(encode_batch([Record(1, clock(), b"hello", b"hello")]), assign_offsets=False)
    log.roll(INT_MAX // 2)
    log.append(encode_batch([Record(INT_MAX // 2, clock(), b"hello", b"hello")]), assign_offsets=False)
    log.append(encode_batch([Record(INT_MAX + 1, clock(), b"hello", b"hello")]), assign_offsets=False)
    assert all(s.offset_index.entries == 0 for s in log.segments)
    assert log.log_end_offset - 1 - log.log_start_offset > INT_MAX
    groups = group_segments_by_size(log.segments, INT_MAX, INT_MAX, log.log_end_offset)
    assert [len(g) for g in groups] == [1, 1], "offsets 0..Int.MaxValue+1 cannot share one segment"
    groups = group_segments_by_size(log.segments, INT_MAX, INT_MAX, INT_MAX)
    assert [len(g) for g in groups] == [2], "up to Int.MaxValue they can"


def test_build_offset_map(tmp_path, clock) -> None:  # LogCleanerTest.testBuildOffsetMap
    log = open_log(tmp_path, clock)
    for i in range(500):
        log.append(record(i, i, clock()))
    cleaner = make_cleaner(1000, clock=clock)
    segs = log.segments
    assert len(segs) > 3

    def check_range(start: int, end: int) -> None:
        stats = CleanerStats()
        cleaner.build_offset_map(log, log.segments, start, end, scan(log.segments), stats)
        assert cleaner.map.latest_offset + 1 == end
        assert cleaner.map.size == end - start
        for i in range(start, end):
            assert cleaner.map.get(k(i)).offset == i
        assert cleaner.map.get(k(start - 1)).offset == -1
        assert cleaner.map.get(k(end)).offset == -1
        assert stats.map_messages_read == end - start

    check_range(0, segs[1].base_offset)
    check_range(segs[1].base_offset, segs[3].base_offset)
    check_range(segs[3].base_offset, log.log_end_offset)


def test_build_partial_offset_map(tmp_path, clock) -> None:  # LogCleanerTest.testBuildPartialOffsetMap
    log = open_log(tmp_path, clock)
    for i in range(5):
        log.append(record(i, i, clock()))
    log.roll()
    cleaner = make_cleaner(3, clock=clock)  # two keys fit
    cleaner.build_offset_map(log, log.segments, 2, INT_MAX, scan(log.segments), CleanerStats())
    m = cleaner.map
    assert m.size == 2
    assert m.get(k(0)).offset == -1
    assert m.get(k(2)).offset == 2
    assert m.get(k(3)).offset == 3
    assert m.get(k(4)).offset == -1
    assert m.latest_offset == 3


def test_build_offset_map_fake_large(tmp_path, clock) -> None:  # LogCleanerTest.testBuildOffsetMapFakeLarge
    log = open_log(tmp_path, clock, **{"segment.bytes": 120, "segment.index.bytes": 120})
    offset_end = 7206178
    for key, offset in ((0, 0), (1, offset_end)):
        log.append(encode_batch([Record(offset, clock(), k(key), k(key))]), assign_offsets=False)
    cleaner = make_cleaner(1000, clock=clock)
    cleaner.build_offset_map(log, log.segments, 0, offset_end + 1, scan(log.segments), CleanerStats())
    assert cleaner.map.latest_offset == offset_end
    assert cleaner.map.size == 2
    assert cleaner.map.get(k(0)).offset == 0
    assert cleaner.map.get(k(1)).offset == offset_end


def test_long_keys_with_colliding_digests_are_never_merged(tmp_path, clock) -> None:
    # OffsetMap: keys longer than 19 bytes are stored as digests; a digest match is checked against the real key
    # before anything is dropped (Kafka's SkimpyOffsetMap would merge the keys and lose one).
    from shale.sidecar.log.cleaner import Cleaner
    from shale.sidecar.log.offset_map import OffsetMap

    log = open_log(tmp_path, clock)
    a, b = b"a" * 30, b"b" * 30
    log.append(encode_batch([Record(0, clock(), a, b"a1")]))
    log.append(encode_batch([Record(0, clock(), b, b"b1")]))
    log.append(encode_batch([Record(0, clock(), a, b"a2")]))
    log.append(encode_batch([Record(0, clock(), b"short", b"s")]))
    log.roll()
    colliding = lambda key: bytes(27)  # every key has the same digest  # noqa: E731
    cleaner = Cleaner(OffsetMap(24 * 100, 0.75, hash_fn=colliding), clock=clock)
    cleaner.clean(to_clean(log))
    assert latest_per_key(key_values(log)) == {a: b"a2", b: b"b1", b"short": b"s"}


# --- 30: crash during the swap -----------------------------------------------------------------

def crash_log(tmp_path, clock, name: str) -> Log:
    """Duplicated keys over 4 segments (rolled by hand, so the whole dirty section is one group)."""
    log = open_log(tmp_path, clock, name, **{"segment.bytes": 1 << 20, "segment.index.bytes": 4096,
                                             "index.interval.bytes": 100})
    for i in range(40):
        log.append(record(i % 7, i, clock()) if i % 11 else tombstone(i % 7, clock()))
        if i % 10 == 9:
            log.roll()
    log.append(record(99, 99, clock()))
    return log


def recovered_rows(directory: str, config, clock) -> tuple[Log, list]:
    log = Log(directory, config, clock=clock, had_clean_shutdown=False)
    rows = [(r.offset, r.key, r.value) for r in read_all(log)]
    assert rows == key_values(log), "reads through the indexes agree with the files"
    return log, rows


def test_recovery_after_crash(tmp_path, clock, monkeypatch) -> None:
    # LogCleanerTest.testRecoveryAfterCrash: a crash before each rename of replaceSegments (.cleaned -> .swap,
    # old -> .deleted, .swap -> final), recovered by the loader, gives the pre-pass or the post-pass log.
    log = crash_log(tmp_path, clock, "orig-0")
    log.close()
    config = log.config

    def fresh(name: str) -> str:
        return copy_dir(log.dir, str(tmp_path / name))

    pre_log, pre = recovered_rows(fresh("pre-0"), config, clock)
    done = Log(fresh("done-0"), config, clock=clock)
    make_cleaner(clock=clock).clean(to_clean(done))
    done.close()
    _post_log, post = recovered_rows(done.dir, config, clock)
    assert post != pre and set(post) < set(pre)
    assert latest_per_key(post) == latest_per_key(pre)

    real_replace = os.replace
    outcomes = []
    stage = 1
    while True:
        work = Log(fresh(f"work{stage}-0"), config, clock=clock)
        crash_dir = str(tmp_path / f"crash{stage}-0")
        calls = [0]

        def crashing_replace(src, dst, *, _stage=stage, _calls=calls, _work=work, _crash=crash_dir):
            _calls[0] += 1
            if _calls[0] == _stage:
                copy_dir(_work.dir, _crash)  # the directory as a crash right now would leave it
                raise OSError("simulated crash")
            return real_replace(src, dst)

        monkeypatch.setattr(os, "replace", crashing_replace)
        try:
            make_cleaner(clock=clock).clean(to_clean(work))
            crashed = False
        except OSError:
            crashed = True
        finally:
            monkeypatch.setattr(os, "replace", real_replace)
        drop_unclosed(work)
        if not crashed:
            break
        if stage == 1:
            assert sorted(n for n in os.listdir(crash_dir) if n.endswith(".cleaned")) == [
                f"{0:020d}.index.cleaned", f"{0:020d}.log.cleaned", f"{0:020d}.timeindex.cleaned"]
        recovered, rows = recovered_rows(crash_dir, config, clock)
        assert rows in (pre, post), f"crash before rename {stage}: a mix of the pre- and post-pass logs"
        assert temp_files(crash_dir) == [], "the loader settles every temporary file"
        assert recovered.log_end_offset == pre_log.log_end_offset
        outcomes.append("pre" if rows == pre else "post")
        # cleaning again from the recovered state converges on the post-pass log
        make_cleaner(clock=clock).clean(to_clean(recovered))
        assert [(r.offset, r.key, r.value) for r in read_all(recovered)] == post
        recovered.close()
        stage += 1
    n_old = 4
    assert stage - 1 == 3 + 3 * n_old + 3, "every rename of replaceSegments was a crash point"
    # .cleaned -> .swap of log/index/timeindex: before the third rename completes the swap is incomplete
    assert outcomes == ["pre"] * 3 + ["post"] * (3 * n_old + 3)


def test_recovery_after_crash_in_a_multi_group_pass_loses_nothing(tmp_path, clock, monkeypatch) -> None:
    # LogCleanerTest.testRecoveryAfterCrash with several groups: groups swapped before the crash stay cleaned,
    # the others stay as they were; every key keeps its latest value and no record appears twice.
    log = open_log(tmp_path, clock, "orig-0", **{"segment.bytes": 400, "index.interval.bytes": 50})
    for i in range(60):
        log.append(record(i % 9, i, clock()))
    log.close()
    config = log.config
    pre_log = Log(copy_dir(log.dir, str(tmp_path / "pre-0")), config, clock=clock)
    pre = key_values(pre_log)
    real_replace = os.replace
    crashes = 0
    for stage in range(1, 200, 3):
        work = Log(copy_dir(log.dir, str(tmp_path / f"w{stage}-0")), config, clock=clock)
        crash_dir = str(tmp_path / f"c{stage}-0")
        calls = [0]

        def crashing_replace(src, dst, *, _stage=stage, _calls=calls, _work=work, _crash=crash_dir):
            _calls[0] += 1
            if _calls[0] == _stage:
                copy_dir(_work.dir, _crash)
                raise OSError("simulated crash")
            return real_replace(src, dst)

        monkeypatch.setattr(os, "replace", crashing_replace)
        try:
            make_cleaner(clock=clock).clean(to_clean(work))
        except OSError:
            pass
        finally:
            monkeypatch.setattr(os, "replace", real_replace)
        drop_unclosed(work)
        if not os.path.exists(crash_dir):
            break
        recovered, rows = recovered_rows(crash_dir, config, clock)
        recovered.close()
        crashes += 1
        assert set(rows) <= set(pre)
        assert len(rows) == len(set(rows))
        assert latest_per_key(rows) == latest_per_key(pre)
        assert temp_files(crash_dir) == []
    assert crashes > 5, "the pass swaps several groups"


# --- 32-34 -------------------------------------------------------------------------------------

def test_clean_tombstone(tmp_path, clock) -> None:  # LogCleanerTest.testCleanTombstone
    log = open_log(tmp_path, clock, **{"delete.retention.ms": 86_400_000})
    retention = log.config.delete_retention_ms
    cleaner = make_cleaner(10, clock=clock)
    log.append(encode_batch([Record(0, clock() + retention + 10_000, b"0", b"0")]))
    log.roll()
    cleaner.clean(to_clean(log, 0))
    log.append(encode_batch([Record(0, clock() - retention - 10_000, b"0", None)]))  # a tombstone from the past
    log.roll()
    cleaner.clean(to_clean(log, 1))
    assert next(iter(log.segments[0].batches())).header.last_offset == 1, "the tombstone is retained"
    log.append(encode_batch([Record(0, clock(), b"1", b"1")]))
    log.roll()
    cleaner.clean(to_clean(log, 2))
    first = next(iter(log.segments[0].batches())).header
    assert first.last_offset == 1, "the horizon counts from the cleaner's clock, not the record timestamp"
    assert first.delete_horizon_ms == clock() + retention


def test_tombstone_horizon_set_on_disk_then_removed_in_a_later_pass(tmp_path, clock) -> None:
    # spec 7.5 / LogCleanerTest.runTwoPassClean: pass 1 keeps the tombstone and writes bit 6 + the horizon into
    # baseTimestamp; a pass before the horizon keeps it; the first pass at/after the horizon removes it.
    log = open_log(tmp_path, clock)
    retention = log.config.delete_retention_ms
    log.append(record(1, 1, clock()))
    log.append(record(2, 2, clock()))
    log.append(tombstone(1, clock() - 5_000))
    log.append(record(3, 3, clock()))
    log.roll()
    cleaner = make_cleaner(clock=clock)
    pass1 = clock()
    cleaner.clean(to_clean(log))
    assert [(o, key, v) for o, key, v in key_values(log)] == [(1, b"2", b"2"), (2, b"1", None), (3, b"3", b"3")]
    seg = log.segments[0]
    pos = next(b.position for b in seg.batches() if b.header.last_offset == 2)
    raw = raw_header(seg, pos)
    attributes = struct.unpack_from(">h", raw, 21)[0]
    base_timestamp = struct.unpack_from(">q", raw, 27)[0]
    assert attributes & 0x40, "bit 6: the delete horizon is set"
    assert base_timestamp == pass1 + retention
    check_batch(seg.read_bytes(pos, next(b.size for b in seg.batches() if b.position == pos)))
    others = [h for h in headers(log) if h.last_offset != 2]
    assert all(h.delete_horizon_ms is None for h in others), "batches without tombstones get no horizon"

    clock.now = pass1 + retention - 1
    cleaner.clean(to_clean(log))
    assert (2, b"1", None) in key_values(log)
    assert next(h for h in headers(log) if h.last_offset == 2).delete_horizon_ms == pass1 + retention, \
        "the horizon is set once, not pushed back"
    clock.now = pass1 + retention
    cleaner.clean(to_clean(log))
    assert key_values(log) == [(1, b"2", b"2"), (3, b"3", b"3")]


@pytest.mark.parametrize("codec", list(Compression), ids=lambda c: c.name)
def test_compression_survives_cleaning(tmp_path, clock, codec) -> None:
    # LogCleanerParameterizedIntegrationTest.cleanerTest(codec): a rebuilt batch keeps its codec, an untouched
    # batch is copied byte for byte
    log = open_log(tmp_path, clock)

    def batch(keys, base):
        return encode_batch([Record(base + i, clock(), x, x + b"-v" * 20) for i, x in enumerate(keys)],
                            compression=codec)

    log.append(batch([b"a", b"b", b"c", b"a"], 0))
    log.append(batch([b"b", b"d", b"e", b"f"], 4))
    log.append(batch([b"a", b"g"], 8))
    log.roll()
    before = {b.header.last_offset: log.segments[0].read_bytes(b.position, b.size) for b in log.segments[0].batches()}
    make_cleaner(clock=clock).clean(to_clean(log))
    seg = log.segments[0]
    after = {b.header.last_offset: seg.read_bytes(b.position, b.size) for b in seg.batches()}
    assert [h.compression for h in headers(log)] == [codec, codec, codec]
    assert [(o, key) for o, key, _v in key_values(log)] == [(2, b"c"), (4, b"b"), (5, b"d"), (6, b"e"), (7, b"f"),
                                                           (8, b"a"), (9, b"g")]
    assert after[7] == before[7] and after[9] == before[9], "batches that keep all records are copied unchanged"
    rebuilt = check_batch(after[3])
    assert (rebuilt.base_offset, rebuilt.last_offset_delta, rebuilt.records_count) == (0, 3, 1)


def test_cleaning_beyond_missing_offsets(tmp_path, clock) -> None:  # LogCleanerTest.testCleaningBeyondMissingOffsets
    cleaner = make_cleaner(clock=clock)
    big = {"segment.bytes": 1024 * 1024}
    log = open_log(tmp_path, clock, "a-0", **big)
    for i in range(10):
        log.append(encode_batch([Record(i, clock(), k(i), k(i))]), assign_offsets=False)
    log.roll(11)
    log.append(encode_batch([Record(11, clock(), k(1015), k(1015))]), assign_offsets=False)
    assert cleaner.clean(to_clean(log))[0] == log.active_segment.base_offset == 11, "cleaning passes the gap"

    log = open_log(tmp_path, clock, "b-0", **big)
    for i in range(10):
        log.append(encode_batch([Record(i, clock(), k(i), k(i))]), assign_offsets=False)
    log.roll(15)
    for i in range(15, 25):
        log.append(encode_batch([Record(i, clock(), k(i), k(i))]), assign_offsets=False)
    log.roll(30)
    log.append(encode_batch([Record(30, clock(), k(1015), k(1015))]), assign_offsets=False)
    assert cleaner.clean(to_clean(log))[0] == log.active_segment.base_offset == 30, "and gaps in several segments"


def test_cleaner_stats_summary_lines() -> None:
    # LogCleaner.CleanerThread.recordStats: Kafka's log line, figure for figure
    stats = CleanerStats(start_s=0.0, map_done_s=1.0, end_s=4.0, bytes_read=4 * 1024 * 1024,
                         bytes_written=1024 * 1024, map_bytes_read=2 * 1024 * 1024, messages_read=1000,
                         messages_written=250, buffer_utilization=0.5)
    lines = stats.summary(0, "t-0", 10, 20).split("\n\t")
    assert lines == [
        "Log cleaner thread 0 cleaned log t-0 (dirty section = [10, 20])",
        "4.0 MB of log processed in 4.0 seconds (1.0 MB/sec).",
        "Indexed 2.0 MB in 1.0 seconds (2.0 Mb/sec, 25.0% of total time)",
        "Buffer utilization: 50.0%",
        "Cleaned 4.0 MB in 3.0 seconds (1.3 Mb/sec, 75.0% of total time)",
        "Start size: 4.0 MB (1,000 messages)",
        "End size: 1.0 MB (250 messages)",
        "75.0% size reduction (75.0% fewer messages)",
    ]


def test_throttler_limits_the_cleaner_io_rate() -> None:
    # LogCleanerTest.testReconfigureLogCleanerIoMaxBytesPerSecond / Kafka's Throttler: sleep to the target rate
    now = [0.0]
    slept = []

    def sleep(s: float) -> None:
        slept.append(s)
        now[0] += s

    throttler = Throttler(1000.0, monotonic=lambda: now[0], sleep=sleep)
    throttler(500)
    now[0] = 0.2
    throttler(500)
    assert slept == [], "no check inside the 300 ms period"
    now[0] = 0.5
    throttler(1000)  # 2000 bytes in 0.5 s at 1000 B/s: sleep until 2 s have passed
    assert slept == [pytest.approx(1.5)]
    unlimited = Throttler(float("inf"), monotonic=lambda: now[0], sleep=sleep)
    unlimited(10**9)
    now[0] += 10
    unlimited(10**9)
    assert len(slept) == 1 and unlimited.total_bytes == 2 * 10**9


def test_a_caller_arriving_while_another_sleeps_off_the_excess_waits_too() -> None:
    """Kafka's throttler sleeps under its lock, so callers queue: a second thread (another cleaner thread, the
    next log-dir move) reporting bytes during the first one's sleep must not pass unthrottled."""
    now, slept = [0.0], []
    throttler = Throttler(1000.0, monotonic=lambda: now[0], sleep=slept.append, check_interval_s=0)
    now[0] = 0.5
    throttler(2000)  # 2000 bytes in 0.5 s: this caller sleeps 1.5 s, the period restarts at 2.0
    assert slept == [pytest.approx(1.5)]
    now[0] = 1.0  # half-way through that sleep, another caller reports
    throttler(100)
    assert slept == [pytest.approx(1.5), pytest.approx(1.0)]
    now[0] = 2.1  # after it, the next period holds those 100 bytes: 200 in 0.1 s, sleep to 0.2 s
    throttler(100)
    assert slept[2] == pytest.approx(0.1)


def test_segments_in_range_uses_the_floor_segment(tmp_path, clock) -> None:
    # LogSegments.values(from, to): from the segment holding `from`, up to segments with base >= `to`
    log = open_log(tmp_path, clock, **{"segment.bytes": 200})
    fill_segments(log, clock, 5)
    segs = log.segments
    assert segments_in_range(segs, segs[1].base_offset + 1, segs[3].base_offset) == segs[1:3]
    assert segments_in_range(segs, -1, segs[2].base_offset) == segs[:2]
    assert segments_in_range(segs, segs[2].base_offset, segs[2].base_offset) == []


def test_offset_map_is_cleared_between_passes_and_reports_utilization(tmp_path, clock) -> None:
    # LogCleanerTest / OffsetMapTest: a pass starts from an empty map; utilization = entries / slots
    log = open_log(tmp_path, clock)
    for i in range(8):
        log.append(record(i % 4, i, clock()))
    log.roll()
    cleaner = make_cleaner(8, clock=clock)
    _end, stats = cleaner.clean(to_clean(log))
    assert stats.buffer_utilization == pytest.approx(4 / 8)
    assert cleaner.map.size == 4
    cleaner.clean(to_clean(log, 6))
    assert cleaner.map.size == 2 and cleaner.map.get(k(0)).offset == -1
    assert BIG_OFFSET == 2**32 - 2


def _tight(seg) -> list[tuple[int, int]]:
    """Every `.index` entry of a segment with the last offset of the batch that starts at its position."""
    out = []
    for slot in range(seg.offset_index.entries):
        offset, position = seg.offset_index.entry(slot)
        out.append((offset, BatchHeader.parse(raw_header(seg, position)).last_offset))
    return out


@pytest.mark.parametrize("per_batch", [1, 10])
def test_cleaned_segments_pass_kafkas_index_checks(tmp_path, clock, per_batch) -> None:
    """A cleaned segment's indexes agree with its log by Kafka's DumpLogSegments rules (`shale dump-log
    --verify-index-only` exits 0 and reports nothing), and the index is as dense as `index.interval.bytes` says.

    The cleaner appends its output in chunks of up to CHUNK_BYTES; one index entry per chunk mapped the
    chunk's last offset to its first batch (Kafka's own cleaner before KAFKA-806): a "Mismatch" per chunk.
    """
    log = open_log(tmp_path, clock, **{"segment.bytes": 10_000_000, "segment.index.bytes": 10_485_760,
                                       "index.interval.bytes": 4096})
    keys, pick = 8000, random.Random(7).randrange
    for i in range(0, 5 * keys, per_batch):
        # Keys at random, so that batches of many records keep some of them (rebuilt batches); timestamps
        # vary inside a batch and the largest is often dropped: a rebuilt batch must index its own.
        recs = [Record(j, clock() + (j * 7919) % 1000, k(pick(keys) if per_batch > 1 else j % keys), b"value-%d" % j)
                for j in range(i, i + per_batch)]
        log.append(encode_batch(recs))
        clock.now += 1
    log.roll()
    cleaner = make_cleaner(2 * keys, clock=clock)
    cleaner.clean(to_clean(log))
    cleaned = log.segments[0]
    assert cleaned.size > CHUNK_BYTES  # more than one chunk
    entries = _tight(cleaned)
    assert entries and all(offset == last for offset, last in entries)
    positions = [cleaned.offset_index.entry(s)[1] for s in range(cleaned.offset_index.entries)]
    biggest = max(b.size for b in cleaned.batches())
    assert max(b - a for a, b in zip([0, *positions], positions)) <= 4096 + 2 * biggest
    log.close()
    files = sorted(str(p) for p in (tmp_path / "test-0").iterdir() if p.suffix in (".index", ".timeindex"))
    out, err = io.StringIO(), io.StringIO()
    assert dump_files(files, verify_index_only=True, out=out, err=err) == 0
    assert err.getvalue() == ""
