"""The transactions benchmark (bench/transactions.py) at a tiny size: one real `shale serve`, confluent-kafka producing
idempotently and in transactions of two sizes (each phase's partition end and last stable offset checked: every
record plus one COMMIT marker per transaction, nothing left open), and the report.

No wall-clock thresholds: this checks that the benchmark works, not how fast transactions are.
"""

from __future__ import annotations

import importlib
import os

import pytest

from support import bench_module
from support.prose import check_section


@pytest.fixture(scope="module")
def bench():
    yield from bench_module.load("transactions.py")


def test_every_mode_writes_every_record_and_the_report_has_its_ratios(bench, tmp_path):
    out = tmp_path / "out"
    res = bench.run(300, rounds=2, sizes=(7, 100), out_dir=str(out), say=lambda *a: None)
    assert res.modes == ["idempotent", "transactional, 7 records per transaction",
                         "transactional, 100 records per transaction"]
    for mode in res.modes:
        assert len(res.phases[mode]) == 2
        for phase in res.phases[mode]:  # run() raised had a partition not ended where its records and markers end
            assert phase.records == 300 and phase.nbytes == 300 * bench.RECORD_SIZE
            assert phase.seconds > 0 and phase.server_cpu_s >= 0
        assert res.ratio(mode) > 0
    assert res.ratio("idempotent") == 1.0
    assert not os.listdir(out), "the benchmark leaves no data behind"

    text = bench.table(res)
    assert "| transactional, 7 records per transaction |" in text and "| idempotent |" in text
    doc = tmp_path / "performance.md"
    doc.write_text("# Performance\n\n## Kafka server (issue: Kafka server)\n\nkept\n")
    section = bench.markdown(res, "nproc 2", "bench/transactions.py --test")
    check_section(section, bench.SECTION)
    perf_doc = importlib.import_module("perf_doc")  # importable once the bench (which puts bench/ first) is loaded
    perf_doc.update_section(bench.SECTION, section, str(doc))
    perf_doc.update_section(bench.SECTION, section, str(doc))
    text = doc.read_text()
    assert text.count(bench.SECTION) == 1 and "## Kafka server (issue: Kafka server)\n\nkept" in text
    flat = " ".join(text.split())  # the section's prose is wrapped
    assert "load average" in flat and "7 per transaction" in flat and "server CPU per transaction" in flat
