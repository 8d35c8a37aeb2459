"""The compaction benchmark (bench/compaction.py) at a tiny size: its figures come out and the cleaned
log equals the model (each key's latest record, in order), for the C path and the pure-Python path.

No wall-clock thresholds: this checks that the benchmark works, not how fast the cleaner is.
"""

from __future__ import annotations

import os

import pytest

from support import bench_module
from support.prose import check_section


@pytest.fixture(scope="module")
def bench():
    yield from bench_module.load("compaction.py")


def test_built_log_and_model(bench, tmp_path):
    built = bench.build_log(str(tmp_path / "t-0"), 2000, 150, per_batch=70, segment_bytes=60_000)
    assert built.records == 2000 and built.batches == 29 and built.log_bytes > 2000 * 100
    assert 0 < built.distinct_keys <= 150
    assert sorted(o for o in built.last_offset if o >= 0)[-1] == 1999
    # Not cleaned yet: every key has more than its latest record in the log.
    with pytest.raises(AssertionError):
        bench.verify_cleaned(built.directory, built)


@pytest.mark.parametrize("kernel", ["c", "python"])
def test_one_pass_in_process_equals_the_model(bench, tmp_path, kernel):
    built = bench.build_log(str(tmp_path / "t-0"), 3000, 200, per_batch=50, segment_bytes=40_000)
    result = bench.clean_pass(built.directory, bench.map_memory_for(200), kernel)
    assert result.kernel == kernel and result.hash_name == ("xxh64x4" if kernel == "c" else "blake2b")
    assert result.records_read == result.map_records == 3000
    assert result.records_written == result.map_entries == built.distinct_keys
    assert result.map_bytes_per_key <= 27 and result.size_after < result.size_before
    if kernel == "c":
        assert result.c_batches == 2 * built.batches and result.python_batches == 0
    else:
        assert result.c_batches == 0 and result.python_batches == 2 * built.batches
    assert bench.verify_cleaned(built.directory, built) == built.distinct_keys


def test_whole_run_produces_figures(bench, tmp_path):
    out = tmp_path / "out"
    res = bench.run(full_records=4000, full_keys=400, small_records=1500, small_keys=150, out_dir=str(out),
                    profile=True, repeats=2, segment_bytes=100_000, say=lambda *a: None)
    assert [(c.name, c.result.kernel, c.built.records, len(c.runs)) for c in res.cases] == [
        ("C kernel", "c", 4000, 2), ("C kernel", "c", 1500, 2), ("pure Python", "python", 1500, 1)]
    for c in res.cases:
        r = c.result
        assert c.verified == c.built.distinct_keys == r.records_written  # the cleaned log equals the model
        assert r.records_read == c.built.records and r.bytes_read == r.size_before
        assert r.map_s > 0 and r.clean_s > 0 and r.cpu_s > 0 and r.records_per_s > 0 and r.mb_per_s > 0
        assert 0 < r.map_bytes_per_key <= 27 and 0 < r.reduction < 1
        assert r.rss_peak_kib >= r.rss_start_kib > 0
        assert r.profile and r.profile_split and sum(r.profile_split.values()) > 0
        assert r.fallback_batches == 0
    assert not os.listdir(out), "the benchmark leaves no data behind"

    text = bench.table(res)
    assert text.count("\n") == 1 + len(res.cases) and "pure Python" in text
    assert any("goal" in g for g in bench.goals(res))
    assert "Where the time goes" in bench.interpretation(res)
    doc = tmp_path / "performance.md"
    doc.write_text("# Performance\n\n## Log engine (issue: Log engine)\n\nkept\n\n## Later section\n\nalso kept\n")
    section = bench.markdown(res, {"nproc": "2", "kernel": "Linux"}, "bench/compaction.py --test")
    check_section(section, bench.SECTION)
    bench.update_doc(section, str(doc))
    bench.update_doc(section, str(doc))
    text = doc.read_text()
    assert text.count(bench.SECTION) == 1
    assert "## Log engine (issue: Log engine)\n\nkept" in text and "## Later section\n\nalso kept" in text
    assert "Records/s" in text and "Interpretation" in text


def test_worker_process_reports_its_own_pass(bench, tmp_path):
    built = bench.build_log(str(tmp_path / "t-0"), 1000, 100, per_batch=40)
    result = bench.clean_pass_in_subprocess(built.directory, bench.map_memory_for(100), "c")
    assert result.records_read == 1000 and result.c_batches > 0 and result.rss_peak_kib > 0
    assert bench.verify_cleaned(built.directory, built) == built.distinct_keys
