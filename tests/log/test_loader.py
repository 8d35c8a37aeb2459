"""Opening a partition directory: Kafka's LogLoaderTest scenarios and the crash-during-swap matrix (spec 2.10, 5.2-5.4)."""

from __future__ import annotations

import os
import random

import pytest

from shale.sidecar.log.log import Log
from shale.sidecar.log.records import Record, decode_batch, encode_batch
from shale.sidecar.log.segment import LogSegment
from support.logtest_util import T0, FakeClock, all_records, dir_snapshot, read_batch_at, simple_batch

INT32_MAX = 2**31 - 1


def open_log(path, config, clock=None, **kw) -> Log:
    return Log(str(path), config, clock=clock or FakeClock(), **kw)


def crash(log: Log) -> None:
    """An unclean shutdown: the process dies, nothing is flushed, trimmed or closed."""
    for seg in log.segments:
        seg.close_handles()
    for _t, seg in log._pending_deletes:
        seg.close_handles()


def fill(log: Log, n: int, start_ts: int = T0) -> None:
    for i in range(n):
        log.append(encode_batch([Record(0, start_ts + 10 * i, b"k%d" % (i % 4), b"value-%d" % i)]))


def expected_values(n: int) -> list[bytes]:
    return [b"value-%d" % i for i in range(n)]


def segment_names(directory) -> list[str]:
    return sorted(os.listdir(directory))


@pytest.fixture
def cfg(make_config):
    return make_config({"segment.bytes": 400, "index.interval.bytes": 1, "segment.index.bytes": 4096})


# --- recovery or not --------------------------------------------------------------------------

def test_clean_shutdown_skips_recovery(tmp_path, cfg) -> None:
    d = tmp_path / "t-0"
    log = open_log(d, cfg)
    fill(log, 12)
    leo = log.log_end_offset
    log.close()
    active = log.active_segment.log_path
    torn = encode_batch([Record(leo, T0, b"x", b"y" * 40)])
    with open(active, "ab") as f:
        f.write(torn[:30])  # a torn write the clean shutdown does not know about
    size = os.path.getsize(active)
    again = open_log(d, cfg, recovery_point=0, had_clean_shutdown=True)
    assert again.bytes_truncated_on_load == 0 and os.path.getsize(active) == size, "no recovery ran"
    assert again.log_end_offset == leo and again.recovery_point == leo
    crash(again)
    third = open_log(d, cfg, recovery_point=0, had_clean_shutdown=False)
    assert third.bytes_truncated_on_load == 30 and os.path.getsize(active) == size - 30
    assert third.log_end_offset == leo and third.recovery_point == 0
    assert [r.value for r in all_records(third)] == expected_values(12)


def test_log_recovers_after_a_crash(tmp_path, cfg) -> None:
    d = tmp_path / "t-0"
    log = open_log(d, cfg)
    fill(log, 20)
    rp = log.recovery_point
    assert 0 < rp < log.log_end_offset, "rolls moved the recovery point"
    active = log.active_segment
    assert os.path.getsize(active.offset_index.path) == 4096, "the crash leaves the active index preallocated"
    crash(log)
    again = open_log(d, cfg, recovery_point=rp, had_clean_shutdown=False)
    assert again.log_end_offset == 20 and again.recovery_point == rp
    assert [r.value for r in all_records(again)] == expected_values(20)
    for i in range(20):
        assert read_batch_at(again, i).records[0].offset == i
        assert again.offset_for_timestamp(T0 + 10 * i) == (i, T0 + 10 * i)


def test_recover_only_segments_from_the_recovery_point(tmp_path, cfg) -> None:
    d = tmp_path / "t-0"
    log = open_log(d, cfg)
    fill(log, 20)
    bases = [s.base_offset for s in log.segments]
    assert len(bases) >= 3
    first = log.segments[0]
    positions = [b.position for b in first.batches()]
    crash(log)
    # Corrupt the 2nd batch of the first segment (under the CRC) and tear the last segment's tail.
    with open(first.log_path, "r+b") as f:
        f.seek(positions[1] + 40)
        f.write(b"\xde\xad")
    with open(os.path.join(d, f"{bases[-1]:020d}.log"), "ab") as f:
        f.write(b"\x00" * 25)
    first_bytes = open(first.log_path, "rb").read()
    again = open_log(d, cfg, recovery_point=bases[-1], had_clean_shutdown=False)
    assert open(first.log_path, "rb").read() == first_bytes, "segments below the recovery point are not recovered"
    assert again.bytes_truncated_on_load == 25 and again.log_end_offset == 20
    crash(again)
    third = open_log(d, cfg, recovery_point=0, had_clean_shutdown=False)
    assert third.log_end_offset == 1, "truncated at the corrupt batch"
    assert [s.base_offset for s in third.segments] == [0], "every later segment is deleted"
    assert segment_names(d) == ["00000000000000000000.index", "00000000000000000000.log",
                                "00000000000000000000.timeindex"]
    assert [r.value for r in all_records(third)] == expected_values(1)
    fill(third, 3)
    assert third.log_end_offset == 4


@pytest.mark.parametrize("seed", range(6))
def test_corrupt_log_is_truncated_to_the_last_valid_batch(tmp_path, cfg, seed) -> None:
    rng = random.Random(seed)
    d = tmp_path / "t-0"
    log = open_log(d, cfg)
    fill(log, rng.randint(1, 30))
    leo = log.log_end_offset
    path = log.active_segment.log_path
    crash(log)
    real = os.path.getsize(path)
    with open(path, "ab") as f:
        f.write(rng.randbytes(rng.randint(1, 500)))
    again = open_log(d, cfg, recovery_point=0, had_clean_shutdown=False)
    assert again.log_end_offset == leo
    assert os.path.getsize(path) == real
    assert [r.value for r in all_records(again)] == expected_values(leo)


def test_index_rebuild_when_index_files_are_missing(tmp_path, cfg) -> None:
    d = tmp_path / "t-0"
    log = open_log(d, cfg)
    fill(log, 20)
    log.close()
    entries = [(s.offset_index.entries, s.time_index.entries) for s in log.segments]
    for name in os.listdir(d):
        if name.endswith((".index", ".timeindex")):
            os.unlink(d / name)
    again = open_log(d, cfg, recovery_point=20, had_clean_shutdown=True)
    assert [(s.offset_index.entries, s.time_index.entries) for s in again.segments] == entries
    for i in range(20):
        assert read_batch_at(again, i).records[0].offset == i
        assert again.offset_for_timestamp(T0 + 10 * i) == (i, T0 + 10 * i)


def test_missing_time_index_is_recreated_empty(tmp_path, cfg) -> None:
    """sanityCheck(timeIndexNewlyCreated): a recreated time index of a segment that is not recovered is empty."""
    d = tmp_path / "t-0"
    log = open_log(d, cfg)
    fill(log, 20)
    log.close()
    first = f"{0:020d}.timeindex"
    os.unlink(d / first)
    again = open_log(d, cfg, recovery_point=20, had_clean_shutdown=True)
    assert os.path.getsize(d / first) == 0 and again.segments[0].time_index.entries == 0
    for i in range(20):
        assert again.offset_for_timestamp(T0 + 10 * i) == (i, T0 + 10 * i)
    crash(again)  # even without a close, the file must not be left preallocated
    third = open_log(d, cfg, recovery_point=20, had_clean_shutdown=False)
    assert third.segments[0].time_index.entries == 0
    assert [third.offset_for_timestamp(T0 + 10 * i) for i in range(20)] == [(i, T0 + 10 * i) for i in range(20)]


def test_corrupt_index_rebuilt_after_unclean_shutdown(tmp_path, cfg) -> None:
    d = tmp_path / "t-0"
    log = open_log(d, cfg)
    fill(log, 20)
    log.close()
    for name in os.listdir(d):
        if name.endswith((".index", ".timeindex")):
            (d / name).write_bytes(b"  ")
    again = open_log(d, cfg, recovery_point=0, had_clean_shutdown=False)
    assert again.log_end_offset == 20
    for i in range(20):
        assert read_batch_at(again, i).records[0].offset == i
        assert again.offset_for_timestamp(T0 + 10 * i) == (i, T0 + 10 * i)
    for seg in again.segments[:-1]:
        assert seg.offset_index.entries > 0
        assert os.path.getsize(seg.offset_index.path) == 8 * seg.offset_index.entries


def test_recover_with_empty_active_segment(tmp_path, cfg) -> None:
    d = tmp_path / "t-0"
    log = open_log(d, cfg)
    fill(log, 5)
    log.roll()
    assert log.active_segment.size == 0 and log.active_segment.base_offset == 5
    crash(log)
    again = open_log(d, cfg, recovery_point=0, had_clean_shutdown=False)
    assert again.log_end_offset == 5 and [s.base_offset for s in again.segments] == [0, 5]
    fill(again, 1)
    assert again.log_end_offset == 6 and len(again.segments) == 2


def test_log_end_less_than_checkpointed_start_deletes_all(tmp_path, cfg) -> None:
    d = tmp_path / "t-0"
    log = open_log(d, cfg)
    fill(log, 12)
    log.close()
    again = open_log(d, cfg, recovery_point=12, log_start_offset=30, had_clean_shutdown=True)
    assert again.log_start_offset == 30 == again.log_end_offset
    assert [s.base_offset for s in again.segments] == [30]
    assert segment_names(d) == [f"{30:020d}.index", f"{30:020d}.log", f"{30:020d}.timeindex"]
    fill(again, 1)
    assert read_batch_at(again, 30).records[0].value == b"value-0"


def test_log_start_offset_is_at_least_the_first_segment_base(tmp_path, cfg) -> None:
    d = tmp_path / "t-0"
    log = open_log(d, cfg)
    fill(log, 12)
    log.close()
    assert open_log(d, cfg, log_start_offset=3).log_start_offset == 3
    os.unlink(d / f"{0:020d}.log")
    again = open_log(d, cfg, log_start_offset=0)
    assert again.log_start_offset == again.segments[0].base_offset > 0


def test_over_compacted_log_recovery(tmp_path, make_config) -> None:
    cfg = make_config({"segment.bytes": 1000, "index.interval.bytes": 1, "max.message.bytes": 64 * 1024})
    d = tmp_path / "t-0"
    log = open_log(d, cfg)
    log.append(encode_batch([Record(0, T0, b"k1", b"v1")]), assign_offsets=False)
    assert log.active_segment.base_offset == 0
    for off in (INT32_MAX + 2, INT32_MAX + 3, INT32_MAX + 4):
        log.append(encode_batch([Record(off, T0, b"k", b"v%d" % off)]), assign_offsets=False)
        assert log.active_segment.base_offset == INT32_MAX + 2
    log.close()
    indexes = sorted(n for n in os.listdir(d) if n.endswith(".index"))
    assert indexes == [f"{0:020d}.index", f"{INT32_MAX + 2:020d}.index"]
    again = open_log(d, cfg, recovery_point=0, had_clean_shutdown=False)
    assert [s.base_offset for s in again.segments] == [0, INT32_MAX + 2]
    assert again.log_end_offset == INT32_MAX + 5
    assert read_batch_at(again, 1).records[0].offset == INT32_MAX + 2
    assert read_batch_at(again, INT32_MAX + 4).records[0].value == b"v%d" % (INT32_MAX + 4)


# --- leftover files ---------------------------------------------------------------------------

def test_orphan_index_files_are_deleted(tmp_path, make_config) -> None:
    d = tmp_path / "t-0"
    d.mkdir()
    for name in (f"{0:020d}.index", f"{0:020d}.timeindex", f"{5:020d}.index", f"{5:020d}.timeindex",
                 f"{5:020d}.txnindex"):
        (d / name).write_bytes(b"")
    set_size = len(simple_batch(ts=T0))
    cfg = make_config({"segment.bytes": 10 * set_size, "index.interval.bytes": 1})
    log = open_log(d, cfg)
    assert os.path.getsize(d / f"{0:020d}.index") > 0, "replaced by a fresh, preallocated index"
    assert os.path.getsize(d / f"{0:020d}.timeindex") > 0
    assert not any(n.startswith(f"{5:020d}") for n in os.listdir(d))
    for _ in range(10):
        log.append(simple_batch(ts=T0))
    assert log.log_end_offset == 10


def test_deleted_files_are_removed_at_open(tmp_path, cfg) -> None:
    d = tmp_path / "t-0"
    log = open_log(d, cfg)
    fill(log, 12)
    log.close()
    for name in (f"{100:020d}.log.deleted", f"{100:020d}.index.deleted", f"{100:020d}.timeindex.deleted",
                 f"{0:020d}.snapshot.deleted"):
        (d / name).write_bytes(b"junk")
    (d / "leader-epoch-checkpoint").write_bytes(b"0\n0\n")
    again = open_log(d, cfg)
    assert not [n for n in os.listdir(d) if n.endswith(".deleted")]
    assert (d / "leader-epoch-checkpoint").read_bytes() == b"0\n0\n", "other files are left alone"
    assert [r.value for r in all_records(again)] == expected_values(12)


# --- the crash-during-swap matrix (LogCleanerTest.testRecoveryAfterCrash, spec 2.10) -------------

def build_for_swap(tmp_path, cfg):
    """A closed log of 3 segments [0,4) [4,8) [8,12), and a cleaned copy of the first two at base 0."""
    d = tmp_path / "t-0"
    log = open_log(d, cfg)
    for i in range(12):
        log.append(encode_batch([Record(0, T0 + i, b"k%d" % (i % 4), b"v%d" % i)]))
        if i in (3, 7):
            log.roll()
    assert [s.base_offset for s in log.segments] == [0, 4, 8]
    second = log.segments[1]
    kept = [second.read_bytes(b.position, b.size) for b in second.batches()]
    log.close()
    # The cleaner keeps the latest record per key of [0, 8): offsets 4..7, copied as they are.
    cleaned = LogSegment(str(d), 0, index_interval_bytes=1, max_index_size=4096, now_ms=FakeClock(),
                         suffix=".cleaned")
    for data in kept:
        h = decode_batch(data).header
        cleaned.append(h.last_offset, h.max_timestamp, h.last_offset, data)
    cleaned.on_become_inactive()
    cleaned.close()
    return d


def rename_suffix(d, base: int, old: str, new: str) -> None:
    for ext in (".log", ".index", ".timeindex"):
        src = d / f"{base:020d}{ext}{old}"
        if src.exists():
            os.replace(src, d / f"{base:020d}{ext}{new}")


ORIGINAL = [(o, b"v%d" % o) for o in range(12)]
SWAPPED = [(o, b"v%d" % o) for o in range(4, 12)]


def stage_cleaned(d):  # 1. the cleaner wrote .cleaned; nothing else happened
    pass


def stage_swap(d):  # 2. .cleaned renamed to .swap
    rename_suffix(d, 0, ".cleaned", ".swap")


def stage_swap_old_partly_deleted(d):  # 3a. the second old segment already renamed to .deleted
    stage_swap(d)
    rename_suffix(d, 4, "", ".deleted")


def stage_swap_old_deleted(d):  # 3b. both old segments renamed to .deleted
    stage_swap(d)
    rename_suffix(d, 0, "", ".deleted")
    rename_suffix(d, 4, "", ".deleted")


def stage_swap_partly_renamed(d):  # 4a. the .swap suffix removed from the log only
    stage_swap_old_deleted(d)
    os.replace(d / f"{0:020d}.log.swap", d / f"{0:020d}.log")


def stage_done(d):  # 4b. everything renamed; the .deleted files not yet gone
    stage_swap_old_deleted(d)
    rename_suffix(d, 0, ".swap", "")


def stage_done_and_deleted(d):  # 5. the replace finished completely
    stage_done(d)
    for n in os.listdir(d):
        if n.endswith(".deleted"):
            os.unlink(d / n)


def stage_incomplete_split(d):  # a .swap at/after a .cleaned offset belongs to an unfinished split
    rename_suffix(d, 0, ".cleaned", ".swap")
    for ext in (".log", ".index", ".timeindex"):
        os.replace(d / f"{0:020d}{ext}.swap", d / f"{4:020d}{ext}.swap")
    for ext in (".log", ".index", ".timeindex"):
        (d / f"{0:020d}{ext}.cleaned").write_bytes(b"")


@pytest.mark.parametrize("stage,expected", [
    (stage_cleaned, ORIGINAL),
    (stage_swap, SWAPPED),
    (stage_swap_old_partly_deleted, SWAPPED),
    (stage_swap_old_deleted, SWAPPED),
    (stage_swap_partly_renamed, SWAPPED),
    (stage_done, SWAPPED),
    (stage_done_and_deleted, SWAPPED),
    (stage_incomplete_split, ORIGINAL),
], ids=lambda v: v.__name__ if callable(v) else None)
@pytest.mark.parametrize("clean", [True, False], ids=["clean", "unclean"])
def test_crash_during_swap(tmp_path, cfg, stage, expected, clean) -> None:
    d = build_for_swap(tmp_path, cfg)
    stage(d)
    log = open_log(d, cfg, recovery_point=0 if not clean else 12, had_clean_shutdown=clean)
    names = os.listdir(d)
    assert not [n for n in names if n.endswith((".swap", ".cleaned", ".deleted"))], names
    assert [(r.offset, r.value) for r in all_records(log)] == expected
    assert log.log_end_offset == 12
    if expected is SWAPPED:
        assert [s.base_offset for s in log.segments] == [0, 8]
        assert not any(n.startswith(f"{4:020d}") for n in names), "the replaced segment is gone"
        assert read_batch_at(log, 0).records[0].offset == 4
    else:
        assert [s.base_offset for s in log.segments] == [0, 4, 8]
    for o, v in expected:
        assert read_batch_at(log, o).records[0].value == v
    # The directory is a consistent log: it reopens to the same thing and takes appends.
    log.append(encode_batch([Record(0, T0 + 50, b"k", b"v12")]))
    log.close()
    before = {n: b for n, b in dir_snapshot(d).items() if n.endswith(".log")}
    again = open_log(d, cfg, recovery_point=0, had_clean_shutdown=False)
    assert [(r.offset, r.value) for r in all_records(again)] == expected + [(12, b"v12")]
    again.close()
    assert {n: b for n, b in dir_snapshot(d).items() if n.endswith(".log")} == before


def test_crash_with_multi_batch_appends_and_a_small_index_still_loads(tmp_path, make_config) -> None:
    cfg = make_config({"segment.bytes": 2000, "index.interval.bytes": 0, "segment.index.bytes": 60})
    d = tmp_path / "t-0"
    log = open_log(d, cfg)
    offset = 0
    for _ in range(4):  # follower fetches: several batches per append
        data = b"".join(encode_batch([Record(offset + i, T0 + offset + i, b"k", b"v")]) for i in range(5))
        log.append(data, assign_offsets=False)
        offset += 5
    crash(log)
    again = open_log(d, cfg, recovery_point=0, had_clean_shutdown=False)
    assert again.log_end_offset == 20
    assert [r.offset for r in all_records(again)] == list(range(20))
    assert [again.offset_for_timestamp(T0 + o) for o in range(20)] == [(o, T0 + o) for o in range(20)]
