"""The Spark data source benchmark (bench/spark_read.py) at a tiny size: a real `shale serve`, the plain
consumers, both Spark reads and the latest-view builds run, their checks against what was produced pass,
and the report comes out and goes into its own section of the performance document.

No wall-clock thresholds: this checks that the benchmark works, not how fast anything is.
"""

from __future__ import annotations

import os

import pytest

from support import bench_module
from support.prose import check_section


@pytest.fixture(scope="module")
def bench():
    yield from bench_module.load("spark_read.py")


def test_whole_run_produces_checked_figures(bench, tmp_path):
    out = tmp_path / "out"
    res = bench.run(3000, partitions=2, out_dir=str(out), latest_steps=2, client_choice=500, say=lambda *a: None)
    assert res.produce.records == 3000 and res.consumer.records == 3000
    assert [t.records for t in res.client_choice] == [500, 500]
    assert [t.name for t in res.spark] == ["Spark, wire (bootstrap.servers)", "Spark, files (path)"]
    assert all(t.records == 3000 and t.seconds > 0 and t.rate > 0 for t in res.spark + [res.consumer])
    assert len(res.latest) == 2 and res.latest[0][0] < res.latest[1][0] == 3000
    assert res.latest[-1][3] == 300  # every key's latest value, once
    assert not os.listdir(out), "the benchmark leaves no data behind"

    text = bench.table(res)
    assert "(baseline)" in text and "Spark, files (path)" in text and "kafka-python" in text
    doc = tmp_path / "performance.md"
    doc.write_text("# Performance\n\n## Log engine (issue: Log engine)\n\nkept\n\n## Later section\n\nalso kept\n")
    section = bench.markdown(res, "nproc 2", "bench/spark_read.py --records 3000")
    check_section(section, bench.SECTION)
    bench.update_section(bench.SECTION, section, str(doc))
    bench.update_section(bench.SECTION, section, str(doc))
    text = doc.read_text()
    assert text.count(bench.SECTION) == 1
    assert "## Log engine (issue: Log engine)\n\nkept" in text and "## Later section\n\nalso kept" in text
    assert "rows/s over the wire" in " ".join(text.split())  # the section's prose is wrapped
