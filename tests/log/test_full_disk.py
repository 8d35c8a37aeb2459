"""A full disk on the log engine's write paths: an OSError and an unchanged log, never SIGBUS or torn bytes.

Everything runs on small real filesystems (tests/support/fs_util.py) that the tests fill up.
"""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import textwrap

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from shale.sidecar.log.errors import KafkaStorageError
from shale.sidecar.log.log import Log
from shale.sidecar.log.log_dir import CLEAN_SHUTDOWN_FILE, LogDir
from shale.sidecar.log.offset_index import OffsetIndex
from shale.sidecar.log.records import Record, encode_batch
from shale.sidecar.log.time_index import TimeIndex
from shale.sidecar.log.topic_partition import TopicPartition
from support.fs_util import PAGE, fill, small_fs
from support.logtest_util import (
    T0,
    all_records,
    drop_unclosed,
    make_config,
    read_batch_at,
    segment_batches,
    simple_batch,
)

PID = 4242


def blocks_bytes(path) -> int:
    return os.stat(path).st_blocks * 512


@pytest.fixture
def tmpfs(tmp_path):
    with small_fs(tmp_path, "tmpfs", 512) as mnt:
        yield mnt


# -- the index files ---------------------------------------------------------------------------------


@pytest.mark.parametrize("cls, per_page", [(OffsetIndex, PAGE // 8), (TimeIndex, PAGE // 12)])
def test_an_index_allocates_the_page_of_an_entry_before_writing_it(tmpfs, cls, per_page):
    idx = cls(str(tmpfs / f"{0:020d}.idx"), 0, 1 << 20)
    assert os.path.getsize(idx.path) == idx.max_entries * idx.entry_size > 0  # preallocated,
    assert blocks_bytes(idx.path) == 0  # and sparse
    add = idx.append if cls is OffsetIndex else idx.maybe_append
    add(1, 1)
    assert blocks_bytes(idx.path) == PAGE
    for i in range(2, per_page + 1):
        add(i, i)
    assert idx.entries == per_page and blocks_bytes(idx.path) == PAGE  # a page at a time, not the whole file
    add(per_page + 1, per_page + 1)
    assert blocks_bytes(idx.path) == 2 * PAGE
    idx.trim_to_valid_size()  # a shrink gives the blocks back and the next growth reserves again
    idx.resize(1 << 20)
    add(per_page + 2, per_page + 2)
    assert blocks_bytes(idx.path) == 2 * PAGE
    idx.close()


def test_a_time_index_grown_by_one_entry_reserves_it(tmpfs):
    idx = TimeIndex(str(tmpfs / "t.timeindex"), 0, 12 * (PAGE // 4 + 1))
    for i in range(idx.max_entries - 1):  # up to the slot kept for roll/close: 3 whole pages
        idx.maybe_append(T0 + i, i)
    idx.trim_to_valid_size()
    assert os.path.getsize(idx.path) == 3 * PAGE
    filler = fill(tmpfs)
    with pytest.raises(OSError) as raised:  # the grown slot lies on a new page: refused, not written
        idx.maybe_append(T0 + 10_000, 10_000, skip_full_check=True)
    assert raised.value.errno == errno.ENOSPC and raised.value.filename == idx.path
    entries = idx.entries
    filler.release()
    idx.maybe_append(T0 + 10_000, 10_000, skip_full_check=True)
    assert idx.entries == entries + 1 and idx.last_entry == (T0 + 10_000, 10_000)
    idx.close()


PROBE = textwrap.dedent("""
    import errno, os, sys
    from support.fs_util import fill
    from pathlib import Path
    from shale.sidecar.log.offset_index import OffsetIndex
    from shale.sidecar.log.time_index import TimeIndex
    mnt = Path(sys.argv[1])
    offsets = OffsetIndex(str(mnt / "0.index"), 0, 1 << 20)
    times = TimeIndex(str(mnt / "0.timeindex"), 0, 1 << 20)
    fill(mnt)
    for i in range(1, 5000):  # several pages of entries, on a filesystem with no free block
        try:
            offsets.append(i, i)
        except OSError as e:
            assert e.errno == errno.ENOSPC, e
            break
    else:
        raise AssertionError("a full filesystem took every index entry")
    try:
        times.maybe_append(1, 1)
    except OSError as e:
        assert e.errno == errno.ENOSPC, e
    else:
        raise AssertionError("a full filesystem took a time index entry")
    print("refused", offsets.entries)
""")


@pytest.mark.parametrize("kind", ["tmpfs", "ext4"])
def test_index_entries_on_a_full_filesystem_are_refused_with_enospc_not_sigbus(tmp_path, kind):
    """Before the reservation, writing the entry through the map killed the process with SIGBUS (-7)."""
    tests = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (tests, os.environ.get("PYTHONPATH"))))}
    with small_fs(tmp_path, kind, 8192 if kind == "ext4" else 512) as mnt:
        done = subprocess.run([sys.executable, "-c", PROBE, str(mnt)], env=env,
                              capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"probe died with {done.returncode}: {done.stderr}"
    assert done.stdout.startswith("refused 0"), done.stdout  # nothing of the first page was written


# -- the log -------------------------------------------------------------------------------------------


def pbatch(seq: int, size: int = 100) -> bytes:
    """An idempotent producer's one-record batch: the producer state must follow the log exactly."""
    return encode_batch([Record(0, T0 + seq, b"key-%06d" % seq, bytes([seq % 251]) * size)],
                        producer_id=PID, producer_epoch=0, base_sequence=seq)


CONFIG = {"segment.bytes": 3 * PAGE, "index.interval.bytes": 0, "segment.index.bytes": 4 * PAGE}


def open_log(directory, clock, *, clean: bool, recovery_point: int = 0) -> Log:
    return Log(str(directory), make_config(CONFIG), clock=clock, had_clean_shutdown=clean,
               recovery_point=recovery_point)


def stored(log: Log) -> list[tuple[int, bytes]]:
    """(base offset, value) of every batch in the files, in order."""
    return [(b.header.base_offset, b.records[0].value) for seg in log.segments for _, b in segment_batches(seg)]


def append_until_refused(log: Log, seq: int, acked: list[tuple[int, bytes]]) -> tuple[int, KafkaStorageError]:
    while True:
        data = pbatch(seq)
        end = log.log_end_offset
        try:
            info = log.append(data)
        except KafkaStorageError as e:
            assert log.log_end_offset == end  # nothing assigned
            return seq, e
        assert not info.duplicate and info.first_offset == end
        acked.append((info.first_offset, bytes([seq % 251]) * 100))
        seq += 1


def assert_files_end_at_the_log_end(log: Log) -> None:
    for seg in log.segments:
        assert os.path.getsize(seg.log_path) == seg.size, f"bytes past the last batch in {seg.log_path}"


def test_appends_on_a_full_disk_leave_the_log_and_producer_state_as_they_were(tmp_path, clock):
    with small_fs(tmp_path, "tmpfs", 512) as mnt:
        filler = fill(mnt)
        filler.release(24 * PAGE)  # the log gets 24 pages: several segments, then a full disk
        log = open_log(mnt / "t-0", clock, clean=True)
        acked: list[tuple[int, bytes]] = []
        seq, refused = append_until_refused(log, 0, acked)
        assert len(log.segments) > 2
        assert log.storage_failure is not None and log.storage_failure.errno == errno.ENOSPC
        reason = str(refused)
        assert "t-0" in reason and f"offset {log.log_end_offset}" in reason and str(mnt) in reason
        assert "ENOSPC" in reason
        # Retried on the full disk many times: still nothing torn, nothing assigned, no sequence taken.
        for _ in range(20):
            with pytest.raises(KafkaStorageError):
                log.append(pbatch(seq))
        assert log.storage_failure.failures == 21
        assert stored(log) == acked
        assert_files_end_at_the_log_end(log)

        filler.release()
        # The refused batch, retried, is a new append (not a duplicate) at the next offset.
        info = log.append(pbatch(seq))
        assert not info.duplicate and info.first_offset == acked[-1][0] + 1
        assert log.storage_failure is None
        acked.append((info.first_offset, bytes([seq % 251]) * 100))
        assert stored(log) == acked
        drop_unclosed(log)


def test_a_write_cut_short_by_a_full_disk_is_removed_from_the_segment(tmp_path, clock):
    """tmpfs writes what fits in the last page and returns a short count: those bytes must not stay."""
    with small_fs(tmp_path, "tmpfs", 512) as mnt:
        log = open_log(mnt / "t-0", clock, clean=True)
        acked = [(log.append(pbatch(seq)).first_offset, bytes([seq % 251]) * 100) for seq in range(10)]
        size = log.active_segment.size
        assert size % PAGE > 0
        filler = fill(mnt)
        with pytest.raises(KafkaStorageError, match=f"position {size}"):
            log.append(pbatch(10, size=PAGE))  # starts in the last page, needs the next one
        assert os.path.getsize(log.active_segment.log_path) == size
        filler.release()
        acked.append((log.append(pbatch(10)).first_offset, bytes([10]) * 100))
        assert log.close()
        reopened = open_log(mnt / "t-0", clock, clean=True)
        assert stored(reopened) == acked
        reopened.close()


def test_a_roll_that_fails_for_the_producer_snapshot_leaves_a_consistent_log(tmp_path, clock):
    """A roll on a full disk: the new segment opens (no blocks needed), its producer snapshot cannot be written."""
    with small_fs(tmp_path, "tmpfs", 512) as mnt:
        log = open_log(mnt / "t-0", clock, clean=True)
        acked: list[tuple[int, bytes]] = []
        seq = 0
        while log.active_segment.size + 2 * len(pbatch(0)) <= 3 * PAGE:  # the next-but-one append rolls
            acked.append((log.append(pbatch(seq)).first_offset, bytes([seq % 251]) * 100))
            seq += 1
        acked.append((log.append(pbatch(seq)).first_offset, bytes([seq % 251]) * 100))
        seq += 1
        segments = len(log.segments)
        filler = fill(mnt)
        with pytest.raises(KafkaStorageError):
            log.append(pbatch(seq))
        assert stored(log) == acked and log.log_end_offset == acked[-1][0] + 1
        assert_files_end_at_the_log_end(log)
        assert not [n for n in os.listdir(mnt / "t-0") if n.endswith(".tmp")]  # a failed snapshot leaves no .tmp
        filler.release()
        acked.append((log.append(pbatch(seq)).first_offset, bytes([seq % 251]) * 100))
        assert len(log.segments) == segments + 1 and stored(log) == acked
        assert log.close()

        reopened = open_log(mnt / "t-0", clock, clean=True)
        assert stored(reopened) == acked
        assert reopened.append(pbatch(seq)).duplicate  # the producer state came back with the log
        reopened.close()


@pytest.mark.parametrize("clean", [True, False])
def test_a_log_closed_on_a_full_disk_reopens_with_every_acknowledged_batch(tmp_path, clock, clean):
    with small_fs(tmp_path, "tmpfs", 256) as mnt:
        log = open_log(mnt / "t-0", clock, clean=True)
        acked: list[tuple[int, bytes]] = []
        seq, _ = append_until_refused(log, 0, acked)
        if clean:
            assert log.close()  # flushed and trimmed; an older producer snapshot covers the rest
        else:
            drop_unclosed(log)
        reopened = open_log(mnt / "t-0", clock, clean=clean)
        assert stored(reopened) == acked and reopened.log_end_offset == acked[-1][0] + 1
        assert reopened.append(pbatch(seq - 1)).duplicate
        assert_files_end_at_the_log_end(reopened)
        drop_unclosed(reopened)


def test_recovery_on_a_full_disk_loads_the_log_with_fewer_index_entries(tmp_path, clock):
    """Recovery indexes every batch, the appends indexed every append (here two batches each): rebuilding the
    indexes needs pages the appends never took. On a full disk the log still loads, with sparser indexes."""
    config = {"segment.bytes": 64 * 1024, "index.interval.bytes": 0}
    with small_fs(tmp_path, "tmpfs", 1024) as mnt:
        log = Log(str(mnt / "t-0"), make_config(config), clock=clock)
        values = []
        while len(log.segments) < 3:
            pair = [b"%06d" % len(values), b"%06d" % (len(values) + 1)]
            log.append(simple_batch(pair[0], ts=T0) + simple_batch(pair[1], ts=T0))
            values += pair
        entries = log.segments[0].offset_index.entries
        drop_unclosed(log)  # a crash: the next start recovers every segment (recovery point 0)
        filler = fill(mnt)
        reopened = Log(str(mnt / "t-0"), make_config(config), clock=clock, had_clean_shutdown=False)
        first = reopened.segments[0].offset_index
        assert entries < first.entries < 2 * entries  # more than before, fewer than a full rebuild
        assert [r.value for r in all_records(reopened)] == values
        for offset in range(0, len(values), 97):  # lookups through the sparser index still land exactly
            assert read_batch_at(reopened, offset).records[0].value == values[offset]
        drop_unclosed(reopened)
        filler.release()


# -- any sequence of appends, full disks, freed space and restarts ----------------------------------------

OPS = st.lists(st.one_of(
    st.tuples(st.just("append"), st.integers(1, 1500)),
    st.tuples(st.just("append"), st.integers(1, 6000)),  # across a page: a partial write on a full disk
    st.tuples(st.just("fill"), st.integers(0, 4)),  # fill the disk, leaving this many pages free
    st.tuples(st.just("free"), st.none()),
    st.tuples(st.just("restart"), st.booleans()),  # clean close, or a crash
    st.tuples(st.just("retry"), st.none()),  # the producer resends its last acknowledged batch
), max_size=40)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=OPS, free_pages=st.integers(0, 12))
def test_any_mix_of_full_disks_and_restarts_keeps_exactly_the_acknowledged_batches(tmp_path_factory, ops,
                                                                                     free_pages):
    config = make_config({"segment.bytes": 2 * PAGE, "index.interval.bytes": 0, "segment.index.bytes": 2 * PAGE})
    where = tmp_path_factory.mktemp("fs")
    with small_fs(where, "tmpfs", 256) as mnt:
        clock = lambda: T0  # noqa: E731 - record time drives nothing here
        log = Log(str(mnt / "t-0"), config, clock=clock)
        filler = fill(mnt)  # a disk with a few pages left, until a "free"
        filler.release(free_pages * PAGE)
        acked: list[tuple[int, bytes]] = []
        seq = 0
        try:
            for op, arg in ops:
                if op == "append":
                    value = bytes([seq % 251]) * arg
                    data = encode_batch([Record(0, T0, b"k", value)], producer_id=PID, producer_epoch=0,
                                        base_sequence=seq)
                    try:
                        info = log.append(data)
                    except KafkaStorageError:
                        assert log.storage_failure is not None
                        event("an append refused")
                    else:
                        assert not info.duplicate and info.first_offset == len(acked)
                        acked.append((info.first_offset, value))
                        seq += 1
                elif op == "fill" and filler is None:
                    filler = fill(mnt)
                    filler.release(arg * PAGE)
                elif op == "free" and filler is not None:
                    filler.release()
                    os.unlink(filler.path)
                    filler = None
                elif op == "restart":
                    recovery_point = log.recovery_point
                    clean = arg and log.close()
                    event(f"restart (clean: {clean}, disk full: {filler is not None})")
                    if not clean:
                        drop_unclosed(log)
                    log = Log(str(mnt / "t-0"), config, clock=clock, had_clean_shutdown=clean,
                              recovery_point=recovery_point)
                elif op == "retry" and acked:
                    data = encode_batch([Record(0, T0, b"k", acked[-1][1])], producer_id=PID, producer_epoch=0,
                                        base_sequence=seq - 1)
                    info = log.append(data)  # answered from the producer state: nothing to write
                    assert info.duplicate and info.first_offset == acked[-1][0]
                assert stored(log) == acked and log.log_end_offset == len(acked)
                assert_files_end_at_the_log_end(log)
        finally:
            drop_unclosed(log)


# -- the clean-shutdown marker ----------------------------------------------------------------------------


def test_a_log_dir_closed_on_a_full_disk_writes_an_empty_marker_only_when_it_is_honest(tmp_path, clock):
    """Two partitions on a full disk: one has rolled (an older producer snapshot covers it), one has not.

    The second one's producers live only in memory and its snapshot at the log end does not fit, so a clean
    start would forget them: no marker, the close says unclean, and the next start recovers them from the log.
    Without that partition the marker is written, empty, since no block is left for its JSON.
    """
    def batches(log_dir, tp, count):
        log = log_dir.get_or_create(tp)
        return [log.append(pbatch(seq)).first_offset for seq in range(count)]

    with small_fs(tmp_path, "tmpfs", 512) as mnt:
        rolled, single = TopicPartition("t", 0), TopicPartition("t", 1)
        log_dir = LogDir(str(mnt / "data"), lambda topic: make_config(CONFIG), clock=clock)
        batches(log_dir, rolled, 150)  # several segments of 3 pages
        batches(log_dir, single, 5)
        assert len(log_dir.logs[rolled].segments) > 1 and len(log_dir.logs[single].segments) == 1
        fill(mnt)
        assert log_dir.close() is False
        assert not (mnt / "data" / CLEAN_SHUTDOWN_FILE).exists()

        log_dir = LogDir(str(mnt / "data"), lambda topic: make_config(CONFIG), clock=clock)
        assert not log_dir.had_clean_shutdown
        assert log_dir.logs[single].append(pbatch(4)).duplicate  # recovered from the log
        assert log_dir.logs[rolled].append(pbatch(149)).duplicate
        log_dir.delete(single)  # its checkpoint fails on the full disk: the files go first, then it is retried
        assert not [name for name in os.listdir(mnt / "data") if name.startswith("t-1")]
        fill(mnt, "filler-2")  # full again
        assert log_dir.close() is True
        assert (mnt / "data" / CLEAN_SHUTDOWN_FILE).stat().st_size == 0  # Kafka's pre-3.7 empty marker

        log_dir = LogDir(str(mnt / "data"), lambda topic: make_config(CONFIG), clock=clock)
        assert log_dir.had_clean_shutdown and log_dir.logs[rolled].append(pbatch(149)).duplicate
        assert log_dir.close() is True
