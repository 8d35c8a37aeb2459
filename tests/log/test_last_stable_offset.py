"""The last stable offset and the aborted-transaction index of a partition log (Kafka's UnifiedLogTest /
ProducerStateManagerTest cases), checked against a reference model over random interleavings of
transactional and plain appends, commits, aborts, rolls, truncations and crashes."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from cleaner_util import end_marker, make_cleaner, to_clean
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shale.sidecar.log.errors import KafkaStorageError
from shale.sidecar.log.log import Log
from shale.sidecar.log.records import ControlType, Record, encode_batch
from shale.sidecar.log.transaction_index import AbortedTxn, parse_entries
from support.fs_util import PAGE, fill, small_fs
from support.logtest_util import FakeClock, drop_unclosed, make_config

ABORT, COMMIT = ControlType.ABORT, ControlType.COMMIT


def open_log(path, clock=None, *, clean: bool = True, recovery_point: int = 0, **props) -> Log:
    cfg = make_config({"file.delete.delay.ms": 0, **props})
    return Log(str(path), cfg, clock=clock or FakeClock(), had_clean_shutdown=clean, recovery_point=recovery_point)


def txn_data(pid: int, n: int = 1, key: bytes = b"k") -> bytes:
    return encode_batch([Record(i, 0, key, b"v%d" % i) for i in range(n)], producer_id=pid, producer_epoch=0,
                        base_sequence=0, is_transactional=True)


def plain(key: bytes = b"p") -> bytes:
    return encode_batch([Record(0, 0, key, b"x")])


def marker(pid: int, ctype: ControlType) -> bytes:
    return end_marker(pid, 0, ctype, 0)


def txnindex_files(log: Log) -> dict[int, list[AbortedTxn]]:
    """Segment base -> the entries read from its `.txnindex` file (absent files omitted)."""
    out = {}
    for name in sorted(os.listdir(log.dir)):
        if name.endswith(".txnindex"):
            with open(os.path.join(log.dir, name), "rb") as f:
                out[int(name[:20])] = parse_entries(f.read(), name)
    return out


def test_lso_stops_at_the_first_open_transaction_and_moves_on_its_marker(tmp_path) -> None:
    log = open_log(tmp_path)
    log.append(plain())  # 0
    log.append(txn_data(1, 2))  # 1-2
    log.append(plain())  # 3
    log.append(txn_data(2))  # 4
    assert log.last_stable_offset == 1
    log.append(marker(1, COMMIT))  # 5
    assert log.last_stable_offset == 4, "producer 2's transaction is still open"
    log.append(marker(2, ABORT))  # 6
    assert log.last_stable_offset == log.log_end_offset == 7
    # Kafka's lastStableOffset(completedTxn): no other open transaction, so the marker's offset + 1
    assert log.collect_aborted_transactions(0, 7) == [AbortedTxn(2, 4, 6, 7)]
    assert txnindex_files(log) == {0: [AbortedTxn(2, 4, 6, 7)]}
    assert log.collect_aborted_transactions(7, 8) == [], "an abort that ended before the fetch offset is not listed"


def test_an_abort_records_the_earliest_other_open_transaction_as_its_lso(tmp_path) -> None:
    log = open_log(tmp_path)
    log.append(txn_data(1))  # 0
    log.append(txn_data(2))  # 1
    log.append(marker(2, ABORT))  # 2: producer 1 still open from 0
    assert txnindex_files(log) == {0: [AbortedTxn(2, 1, 2, 0)]}
    log.append(marker(1, ABORT))  # 3
    assert txnindex_files(log) == {0: [AbortedTxn(2, 1, 2, 0), AbortedTxn(1, 0, 3, 4)]}


def test_a_marker_without_data_completes_nothing(tmp_path) -> None:
    log = open_log(tmp_path)
    log.append(marker(9, ABORT))
    assert log.last_stable_offset == 1 and txnindex_files(log) == {}


def test_aborts_are_indexed_in_the_segment_of_their_marker_and_searched_across_segments(tmp_path) -> None:
    log = open_log(tmp_path)
    log.append(txn_data(1))  # 0
    log.roll()
    log.append(txn_data(1))  # 1
    log.append(marker(1, ABORT))  # 2
    log.roll()
    log.append(txn_data(2))  # 3
    log.append(marker(2, ABORT))  # 4
    assert txnindex_files(log) == {1: [AbortedTxn(1, 0, 2, 3)], 3: [AbortedTxn(2, 3, 4, 5)]}
    assert log.collect_aborted_transactions(0, 1) == [AbortedTxn(1, 0, 2, 3)]
    assert log.collect_aborted_transactions(0, 5) == [AbortedTxn(1, 0, 2, 3), AbortedTxn(2, 3, 4, 5)]


def test_a_replicated_abort_is_unstable_until_the_high_watermark_passes_its_marker(tmp_path) -> None:
    log = open_log(tmp_path)
    log.replicated = True
    log.append(plain())  # 0
    log.append(txn_data(1))  # 1
    log.append(marker(1, ABORT))  # 2
    log.update_high_watermark(2)
    assert log.last_stable_offset == 1, "the marker is not replicated yet: the transaction is still unstable"
    log.update_high_watermark(3)
    assert log.last_stable_offset == 3
    log.append(txn_data(2))  # 3
    assert log.last_stable_offset == 3, "bounded by the high watermark"


def test_follower_appends_index_as_the_leader_did(tmp_path) -> None:
    leader = open_log(tmp_path / "leader")
    for batch in (txn_data(1), txn_data(2), marker(1, ABORT), plain(), marker(2, ABORT)):
        leader.append(batch)
    follower = open_log(tmp_path / "follower")
    seg = leader.active_segment
    follower.append(seg.read_bytes(0, seg.size), assign_offsets=False)  # one multi-batch append
    assert txnindex_files(follower) == txnindex_files(leader) == \
        {0: [AbortedTxn(1, 0, 2, 1), AbortedTxn(2, 1, 4, 5)]}


def test_truncation_removes_the_entries_of_the_lost_markers(tmp_path) -> None:
    log = open_log(tmp_path)
    log.append(txn_data(1))  # 0
    log.append(marker(1, ABORT))  # 1
    log.roll()
    log.append(txn_data(2))  # 2
    log.append(txn_data(3))  # 3
    log.append(marker(2, ABORT))  # 4
    log.truncate_to(4)
    assert txnindex_files(log) == {0: [AbortedTxn(1, 0, 1, 2)], 2: []}
    assert log.last_stable_offset == 2, "producer 2's transaction is open again"
    log.truncate_to(1)
    assert txnindex_files(log) == {0: []} and log.last_stable_offset == 0


def test_retention_deletes_the_index_with_its_segment(tmp_path) -> None:
    log = open_log(tmp_path)
    log.append(txn_data(1))
    log.append(marker(1, ABORT))
    log.roll()
    log.append(plain())
    log.delete_segments([log.segments[0]], "test")
    log.delete_expired_files()
    assert txnindex_files(log) == {} and log.collect_aborted_transactions(2, 3) == []


def test_unclean_recovery_rebuilds_the_recovered_segments_index_byte_for_byte(tmp_path) -> None:
    log = open_log(tmp_path)
    log.append(txn_data(1))  # 0: open across the roll
    log.roll()  # snapshot at 1 holds producer 1's open transaction
    log.append(txn_data(2))  # 1
    log.append(marker(1, ABORT))  # 2
    log.append(marker(2, ABORT))  # 3
    path = os.path.join(log.dir, "00000000000000000001.txnindex")
    with open(path, "rb") as f:
        written = f.read()
    drop_unclosed(log)
    with open(path, "wb") as f:  # the crash lost the index (or left garbage in it)
        f.write(b"\x00\x07garbage")
    reopened = open_log(tmp_path, clean=False, recovery_point=1)
    with open(path, "rb") as f:
        assert f.read() == written
    assert txnindex_files(reopened)[1] == [AbortedTxn(1, 0, 2, 1), AbortedTxn(2, 1, 3, 4)]


def test_a_clean_reopen_keeps_lso_and_index(tmp_path) -> None:
    log = open_log(tmp_path)
    log.append(txn_data(1))
    log.append(txn_data(2))
    log.append(marker(2, ABORT))
    before = txnindex_files(log)
    log.close()
    reopened = open_log(tmp_path)
    assert reopened.last_stable_offset == 0 and txnindex_files(reopened) == before


def test_recovery_replays_from_a_snapshot_below_the_recovered_segment(tmp_path) -> None:
    """A snapshot written at a clean close lies inside the segment that a later crash recovers: the rebuild must
    start below it, or the aborts between the segment's base and that snapshot lose their entries."""
    log = open_log(tmp_path)
    log.append(txn_data(1))  # 0
    log.append(txn_data(2))  # 1
    log.append(marker(1, ABORT))  # 2
    log.close()  # snapshot at 3
    log = open_log(tmp_path)
    log.append(marker(2, ABORT))  # 3
    log.flush()
    drop_unclosed(log)
    os.unlink(os.path.join(log.dir, "00000000000000000000.txnindex"))
    reopened = open_log(tmp_path, clean=False, recovery_point=3)
    assert txnindex_files(reopened) == {0: [AbortedTxn(1, 0, 2, 1), AbortedTxn(2, 1, 3, 4)]}


def test_cleaning_part_of_the_log_keeps_the_aborted_entries_kafka_13727(tmp_path, clock) -> None:
    """A full offset map stops the dirty section before an aborted transaction of the same segment (KAFKA-13727's
    partial clean): its data goes, its ABORT marker stays for a later pass, and so does its `.txnindex` entry, so
    a read_committed reader of what is left still learns of the abort."""
    log = open_log(tmp_path, clock, **{"cleanup.policy": "compact"})
    for i in range(4):
        log.append(plain(b"a%d" % i))  # 0-3
    log.append(txn_data(7, key=b"t"))  # 4
    log.append(marker(7, ABORT))  # 5
    log.roll()
    log.append(plain(b"z"))  # 6
    assert txnindex_files(log) == {0: [AbortedTxn(7, 4, 5, 6)]}
    end, _ = make_cleaner(4, clock=clock).clean(to_clean(log, 0))  # 3 keys fit: the map ends before offset 4
    assert end <= 4, "a partial clean"
    kept = {b.header.base_offset: b.header for seg in log.segments for b in seg.batches()}
    assert 4 not in kept and kept[5].is_control, "aborted data removed, its marker kept"
    assert txnindex_files(log) == {0: [AbortedTxn(7, 4, 5, 6)]}, "the cleaned segment keeps the entry"
    assert log.collect_aborted_transactions(0, log.log_end_offset) == [AbortedTxn(7, 4, 5, 6)]


# -- the model ----------------------------------------------------------------------------------------------

PIDS = (1, 2, 3)
ops = st.lists(st.one_of(
    st.tuples(st.just("txn"), st.sampled_from(PIDS), st.integers(1, 3)),
    st.tuples(st.just("plain"), st.just(0), st.integers(1, 2)),
    st.tuples(st.just("commit"), st.sampled_from(PIDS), st.just(1)),
    st.tuples(st.just("abort"), st.sampled_from(PIDS), st.just(1)),
    st.tuples(st.just("roll"), st.just(0), st.just(0)),
    st.tuples(st.just("truncate"), st.just(0), st.floats(0, 1)),
    st.tuples(st.just("crash"), st.just(0), st.floats(0, 1)),
    st.tuples(st.just("reopen"), st.just(0), st.just(0)),
), min_size=1, max_size=40)


def model(batches: list[tuple[int, int, str, int]]) -> tuple[int | None, list[AbortedTxn]]:
    """(first unstable offset, aborted transactions) of (base offset, pid, kind, count) batches, by Kafka's rules."""
    ongoing: dict[int, int] = {}
    aborted = []
    for base, pid, kind, _count in batches:
        if kind == "txn":
            ongoing.setdefault(pid, base)
        elif kind in ("commit", "abort") and pid in ongoing:
            first = ongoing.pop(pid)
            if kind == "abort":
                aborted.append(AbortedTxn(pid, first, base, min(ongoing.values(), default=base + 1)))
    return min(ongoing.values(), default=None), aborted


@given(ops)
@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_lso_and_aborted_index_follow_the_model(tmp_path_factory, steps) -> None:
    d = tmp_path_factory.mktemp("model")
    clock = FakeClock()
    log = open_log(d, clock)
    batches: list[tuple[int, int, str, int]] = []
    for kind, pid, arg in steps:
        leo = log.log_end_offset
        if kind == "txn":
            log.append(txn_data(pid, arg))
            batches.append((leo, pid, kind, arg))
        elif kind == "plain":
            log.append(encode_batch([Record(i, 0, b"p", b"x") for i in range(arg)]))
            batches.append((leo, pid, kind, arg))
        elif kind in ("commit", "abort"):
            log.append(marker(pid, ABORT if kind == "abort" else COMMIT))
            batches.append((leo, pid, kind, 1))
        elif kind == "roll":
            log.roll()
        elif kind == "truncate":  # at a batch boundary, as a follower truncates
            keep = int(arg * len(batches))
            offset = batches[keep][0] if keep < len(batches) else leo
            log.truncate_to(offset)
            del batches[keep:]
        elif kind == "crash":  # SIGKILL with the page cache kept; the checkpoint said some earlier offset
            log.flush()
            drop_unclosed(log)
            log = open_log(d, clock, clean=False, recovery_point=int(arg * leo))
        else:
            log.close()
            log = open_log(d, clock)
        unstable, aborted = model(batches)
        end = batches[-1][0] + batches[-1][3] if batches else log.log_end_offset
        assert log.log_end_offset == end
        assert log.last_stable_offset == (end if unstable is None else min(end, unstable))
        assert [e for entries in txnindex_files(log).values() for e in entries] == aborted
        assert log.collect_aborted_transactions(0, end + 1) == aborted
    log.close()


def test_a_kafka_written_transactional_segment_recovers_to_kafkas_index(tmp_path) -> None:
    """A segment a Kafka broker wrote (tests/fixtures/kafka/SOURCES.md A4): an ABORT with no data (no entry), a
    transaction of producer 0 aborted by its coordinator with a bumped epoch, one of producer 1 committed."""
    fixture = Path(__file__).parents[1] / "fixtures" / "kafka" / "ableasdale_transaction-topic-0_segment.hex"
    d = tmp_path / "transaction-topic-0"
    d.mkdir()
    (d / "00000000000000000000.log").write_bytes(bytes.fromhex(fixture.read_text()))
    log = open_log(d, clean=False)
    assert log.log_end_offset == log.last_stable_offset == 13
    assert txnindex_files(log) == {0: [AbortedTxn(0, 1, 6, 7)]}
    assert log.collect_aborted_transactions(0, 13) == [AbortedTxn(0, 1, 6, 7)]
    assert log.collect_aborted_transactions(7, 13) == []


def test_a_corrupt_index_found_at_a_clean_start_is_rebuilt(tmp_path) -> None:
    """Kafka's sanity check at load: an entry of an unknown version (or out of order) makes the segment's index
    rebuilt from the batches, even after a clean shutdown."""
    log = open_log(tmp_path)
    log.append(txn_data(1))  # 0
    log.append(marker(1, ABORT))  # 1
    log.roll()
    log.append(txn_data(2))  # 2
    log.append(marker(2, ABORT))  # 3
    log.roll()
    log.close()
    written = txnindex_files(log)
    bad = os.path.join(log.dir, "00000000000000000002.txnindex")
    with open(bad, "r+b") as f:
        f.write(b"\x00\x05")  # version 5
    reopened = open_log(tmp_path)
    assert txnindex_files(reopened) == written == {0: [AbortedTxn(1, 0, 1, 2)], 2: [AbortedTxn(2, 2, 3, 4)]}


replicated_ops = st.lists(st.one_of(
    st.tuples(st.just("txn"), st.sampled_from(PIDS)),
    st.tuples(st.just("plain"), st.just(0)),
    st.tuples(st.just("commit"), st.sampled_from(PIDS)),
    st.tuples(st.just("abort"), st.sampled_from(PIDS)),
    st.tuples(st.just("hw"), st.floats(0, 1)),
    st.tuples(st.just("truncate"), st.floats(0, 1)),
), min_size=1, max_size=40)


@given(replicated_ops)
@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_replicated_lso_follows_the_model(tmp_path_factory, steps) -> None:
    """Kafka's rule on a replicated log: a finished transaction stays unstable until the high watermark passes its
    marker; the LSO never passes the high watermark; a truncation (a follower's) reopens what it cuts."""
    log = open_log(tmp_path_factory.mktemp("replicated"))
    log.replicated = True
    batches: list[tuple[int, int, str, int]] = []
    for kind, arg in steps:
        leo = log.log_end_offset
        if kind == "hw":
            log.update_high_watermark(log.high_watermark + round(arg * (leo - log.high_watermark)))
        elif kind == "truncate":
            keep = max(int(arg * len(batches)), next((i for i, b in enumerate(batches) if b[0] >= log.high_watermark),
                                                     len(batches)))  # a follower never truncates below its HW
            log.truncate_to(batches[keep][0] if keep < len(batches) else leo)
            del batches[keep:]
        else:
            log.append({"txn": lambda: txn_data(arg), "plain": plain, "commit": lambda: marker(arg, COMMIT),
                        "abort": lambda: marker(arg, ABORT)}[kind]())
            batches.append((leo, arg if kind != "plain" else 0, kind, 1))
        hw = log.high_watermark
        ongoing: dict[int, int] = {}
        unstable = []
        for base, pid, k, _ in batches:
            if k == "txn":
                ongoing.setdefault(pid, base)
            elif k in ("commit", "abort") and pid in ongoing:
                first = ongoing.pop(pid)
                if base >= hw:
                    unstable.append(first)
        assert log.last_stable_offset == min([hw, *ongoing.values(), *unstable])


@pytest.mark.parametrize("room", [0, PAGE])
def test_an_abort_refused_by_a_full_disk_leaves_no_entry_and_the_transaction_open(tmp_path, room) -> None:
    """With no room, the index write fails; with one page, the index takes it and the segment's next page fails:
    either way the entry is taken back, the transaction stays open, and the retry indexes it once."""
    with small_fs(tmp_path, "tmpfs", 512) as mnt:
        log = open_log(mnt / "t-0")
        log.append(txn_data(1))  # 0
        while PAGE - log.active_segment.size % PAGE >= len(marker(1, ABORT)):  # the marker will need a new page
            log.append(plain())
        filler = fill(mnt)
        filler.release(room)
        end = log.log_end_offset
        with pytest.raises(KafkaStorageError, match=r"append at offset \d+ to t-0 .*ENOSPC.*00000000000000000000\."):
            log.append(marker(1, ABORT))  # the file named: the .txnindex or the .log
        assert log.log_end_offset == end and log.last_stable_offset == 0
        assert log.active_segment.txn_index.entries == []
        assert [e for entries in txnindex_files(log).values() for e in entries] == []
        filler.release()
        log.append(marker(1, ABORT))
        assert txnindex_files(log) == {0: [AbortedTxn(1, 0, end, end + 1)]} and log.last_stable_offset == end + 1
        drop_unclosed(log)
