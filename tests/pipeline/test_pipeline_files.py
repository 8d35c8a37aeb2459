"""The read-only data-directory reader against logs the engine wrote: same records as the engine
decodes, nothing in the directory changed, the lock never taken, only the needed segments read."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from shale.pipeline.files import DataDirectory, ScanStats
from shale.pipeline.schema import BatchBuilder
from shale.sidecar.log.compression import Compression
from shale.sidecar.log.errors import CorruptRecordError
from shale.sidecar.log.log_dir import LogDir
from shale.sidecar.log.records import Header, Record, decode_batch, encode_batch
from shale.sidecar.log.topic_partition import TopicPartition
from support.logtest_util import dir_snapshot, make_config

T0 = 1_700_000_000_000
TP = TopicPartition("t", 0)
CODECS = [Compression.NONE, Compression.GZIP, Compression.SNAPPY, Compression.LZ4, Compression.ZSTD]


def fill(log, batches: int, per_batch: int = 5) -> None:
    """Batches of keyed records with growing timestamps, every codec, some headers, tombstones and null keys."""
    offset = log.log_end_offset
    for b in range(batches):
        recs = []
        for i in range(per_batch):
            n = offset + i
            key = None if n % 11 == 0 else b"k%d" % (n % 13)
            value = None if n % 7 == 0 and key is not None else b"value-%d" % n
            headers = (Header("h", b"%d" % n),) if n % 3 == 0 else ()
            recs.append(Record(n, T0 + n * 10, key, value, headers))
        log.append(encode_batch(recs, compression=CODECS[b % len(CODECS)]))
        offset += per_batch


def engine_records(log) -> list[Record]:
    out = []
    for seg in log.segments:
        for b in seg.batches():
            out.extend(decode_batch(seg.read_bytes(b.position, b.size)).records)
    return out


def read(data_dir: str, start: int, end: int, min_ts: int | None = None) -> tuple[list[dict], ScanStats]:
    builder = BatchBuilder("t", 0, True, rows=7)
    stats = ScanStats()
    files = DataDirectory(data_dir).partition("t", 0)
    batches = list(files.read(start, end, min_ts, builder, stats))
    last = builder.take()
    rows = [r for b in batches + ([last] if last else []) for r in b.to_pylist()]
    return rows, stats


def as_rows(records: list[Record]) -> list[tuple]:
    return [(r.offset, r.key, r.value, [(h.key, h.value) for h in r.headers]) for r in records]


def got(rows: list[dict]) -> list[tuple]:
    return [(r["offset"], r["key"], r["value"], [(h["key"], h["value"]) for h in r["headers"]]) for r in rows]


@pytest.fixture
def live(tmp_path):
    """A LogDir that stays open (lock held, active indexes preallocated) with several segments."""
    config = make_config({"segment.bytes": 600, "index.interval.bytes": 100})
    d = LogDir(str(tmp_path / "data"), lambda topic: config)
    log = d.get_or_create(TP)
    fill(log, 40)
    yield d, log
    d.close()


def test_reading_a_live_directory_changes_nothing_and_matches_the_engine(live):
    d, log = live
    assert len(log.segments) > 5
    active = log.active_segment
    assert os.path.getsize(active.offset_index.path) > active.offset_index.size_bytes, "index is preallocated"
    before = dir_snapshot(d.path)
    mtimes = {n: os.stat(os.path.join(d.path, n)).st_mtime_ns for n in before}

    rows, stats = read(d.path, 0, log.log_end_offset)
    assert got(rows) == as_rows(engine_records(log))
    assert stats.segments_read == [s.base_offset for s in log.segments]
    files = DataDirectory(d.path).partition("t", 0)
    assert (files.log_start_offset(), files.log_end_offset()) == (0, log.log_end_offset)
    for ts in (T0 - 5, T0 + 5, T0 + 555, T0 + 1995, T0 + 10**6):
        expected = log.offset_for_timestamp(ts)
        assert files.offset_for_timestamp(ts) == (expected[0] if expected else None)

    assert dir_snapshot(d.path) == before
    assert {n: os.stat(os.path.join(d.path, n)).st_mtime_ns for n in before} == mtimes
    fill(log, 1)  # the engine, which holds the lock, still appends: nothing was taken from it
    assert log.log_end_offset == 205


def test_a_range_opens_only_the_segments_that_hold_it(live):
    d, log = live
    bases = [s.base_offset for s in log.segments]
    start, end = bases[2] + 1, bases[4] + 2
    rows, stats = read(d.path, start, end)
    assert [r["offset"] for r in rows] == [r.offset for r in engine_records(log) if start <= r.offset < end]
    assert stats.segments_read == bases[2:5]
    assert stats.segments_listed == len(bases)
    # the offset index finds the batch holding `start` near the end of the third segment: fewer headers
    # are walked than a scan of the three segments from their starts would walk
    late = bases[3] - 1
    _, from_index = read(d.path, late, bases[3])
    walked_from_start = sum(1 for _ in log.segments[2].batches())
    assert from_index.segments_read == [bases[2]]
    assert 1 <= from_index.batch_headers_read < walked_from_start


def test_a_timestamp_bound_skips_whole_segments_and_batches(live):
    d, log = live
    bases = [s.base_offset for s in log.segments]
    min_ts = T0 + bases[3] * 10 + 25  # inside the fourth segment's first batch or two
    rows, stats = read(d.path, 0, log.log_end_offset, min_ts)
    assert [r["offset"] for r in rows] == [r.offset for r in engine_records(log) if r.timestamp >= min_ts]
    assert stats.segments_skipped_by_time == bases[:3]
    assert stats.segments_read == bases[3:]
    decoded_all = read(d.path, 0, log.log_end_offset)[1].batches_decoded
    assert stats.batches_decoded + stats.batches_skipped_by_time < decoded_all  # the time index skipped some


def test_a_swap_in_progress_reads_as_the_loader_would_finish_it(live):
    """Mid-swap a `.swap` segment stands for the segments it replaces; `.cleaned` and `.deleted` are ignored."""
    d, log = live
    bases = [s.base_offset for s in log.segments]
    replaced = [r for r in engine_records(log) if bases[0] <= r.offset < bases[2]]
    kept = {}
    for r in replaced:
        kept[r.key] = r
    compacted = sorted(kept.values(), key=lambda r: r.offset)
    swap = encode_batch(compacted, last_offset_delta=replaced[-1].offset - compacted[0].offset,
                        base_offset=compacted[0].offset)
    Path(d.path, "t-0", f"{bases[0]:020d}.log.swap").write_bytes(swap)
    Path(d.path, "t-0", f"{bases[2]:020d}.log.cleaned").write_bytes(b"\0" * 64)  # a later pass, unfinished
    Path(d.path, "t-0", f"{bases[5]:020d}.log.deleted").write_bytes(b"\0" * 64)
    rows, _ = read(d.path, 0, log.log_end_offset)
    later = [r for r in engine_records(log) if r.offset >= bases[2]]
    assert got(rows) == as_rows(compacted + later)


def test_a_preallocated_active_segment_ends_at_its_zeros(tmp_path):
    config = make_config({"preallocate": "true", "segment.bytes": 100000})
    d = LogDir(str(tmp_path / "data"), lambda topic: config)
    try:
        log = d.get_or_create(TP)
        fill(log, 2)
        log.roll()  # a rolled-to segment is the one preallocated
        fill(log, 3)
        assert os.path.getsize(log.active_segment.log_path) == 100000
        rows, _ = read(d.path, 0, log.log_end_offset)
        assert got(rows) == as_rows(engine_records(log))
        assert DataDirectory(d.path).partition("t", 0).log_end_offset() == 25
    finally:
        d.close()


def test_a_corrupt_batch_is_an_error_naming_the_partition_and_file(tmp_path):
    config = make_config({"segment.bytes": 600})
    d = LogDir(str(tmp_path / "data"), lambda topic: config)
    log = d.get_or_create(TP)
    fill(log, 10)
    first = log.segments[0].log_path
    d.close()
    data = bytearray(Path(first).read_bytes())
    data[70] ^= 0xFF  # inside the first batch's records: the CRC no longer matches
    Path(first).write_bytes(bytes(data))
    with pytest.raises(CorruptRecordError, match=r"offset 0 is corrupt .*t-0: .*00000000000000000000\.log, position 0"):
        read(str(tmp_path / "data"), 0, 50)
