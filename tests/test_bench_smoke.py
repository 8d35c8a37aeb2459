"""The log-engine benchmark (bench/log_engine.py) at a tiny size: its figures come out and reads return what was written.

No wall-clock thresholds: this only checks that the benchmark works, not how fast the engine is.
"""

from __future__ import annotations

import os

import pytest

from support import bench_module
from support.prose import check_section

MiB = 1 << 20


@pytest.fixture(scope="module")
def bench():
    yield from bench_module.load("log_engine.py")


def test_read_back_equals_written(bench, tmp_path):
    batches = bench.build_batches(3 * MiB, record_size=1024, per_batch=100)
    assert len(batches) > 10
    elapsed, log = bench.time_shale_append(str(tmp_path / "log-0"), batches)
    try:
        assert elapsed > 0
        chunks = []
        received, offsets = bench.fetch_pread(log, 64 * 1024, on_data=lambda data, whole: chunks.append(bytes(data[:whole])))
        assert b"".join(chunks) == b"".join(batches)
        assert received == sum(map(len, batches))
        assert bench.verify_log(log, batches, 64 * 1024) == received
        with open(tmp_path / "sent", "wb") as f:
            sent = bench.fetch_sendfile(log, offsets, f.fileno(), 64 * 1024)
        assert sent == os.path.getsize(tmp_path / "sent") >= received
    finally:
        log.close()


def test_whole_run_produces_figures(bench, tmp_path):
    res = bench.run(4 * MiB, rounds=2, read_reps=1, checkpoints=(10, 20), lookups=50, out_dir=str(tmp_path / "out"),
                    cold=False, say=lambda *a: None)
    assert len(res.append_s) == len(res.dd_write_s) == 2
    assert all(t > 0 for t in res.append_s + res.dd_write_s)
    assert res.read_bytes == res.total_bytes > 3 * MiB
    for key in ("hot pread", "hot sendfile", "hot dd"):
        assert res.read[key] and all(t > 0 for t in res.read[key])
    assert [p.segments for p in res.lookups] == [10, 20]
    assert all(p.read_us > 0 and p.ts_us > 0 and p.pread_us > 0 for p in res.lookups)
    assert not os.listdir(tmp_path / "out"), "the benchmark leaves no data behind"

    table = bench.tables(res)
    assert "append 4 MiB" in table and "ratio 20/10" in table
    doc = tmp_path / "performance.md"
    doc.write_text("# Performance\n\n## Other section\n\nkept\n")
    section = bench.markdown(res, bench.machine_facts(str(tmp_path)), "bench/log_engine.py --test")
    check_section(section, bench.SECTION)
    bench.update_doc(section, str(doc))
    bench.update_doc(section, str(doc))
    text = doc.read_text()
    assert text.count(bench.SECTION) == 1 and "## Other section\n\nkept" in text
    assert "nproc" in text and "kernel" in text and "Interpretation" in text
