"""The TLS benchmark (bench/tls.py) at a tiny size: one real `shale serve` with PLAINTEXT, SASL_SSL (SCRAM-SHA-512)
and SSL (mutual TLS) listeners, confluent-kafka producing and consuming every record through each (each value
checked on the way back), and the report with its ratios.

No wall-clock thresholds: this checks that the benchmark works, not how fast TLS is.
"""

from __future__ import annotations

import importlib
import os

import pytest

from support import bench_module
from support.prose import check_section


@pytest.fixture(scope="module")
def bench():
    yield from bench_module.load("tls.py")


def test_every_listener_moves_every_record_and_the_report_has_its_ratios(bench, tmp_path):
    out = tmp_path / "out"
    res = bench.run(2000, rounds=2, out_dir=str(out), say=lambda *a: None)
    for kind in ("produce", "consume"):
        for protocol in bench.PROTOCOLS:
            phases = getattr(res, kind)[protocol]
            assert len(phases) == 2
            for phase in phases:  # consume() raised had any record come back wrong, so these are checked records
                assert phase.records == 2000 and phase.nbytes == 2000 * bench.RECORD_SIZE
                assert phase.seconds > 0 and phase.server_cpu_s >= 0
            assert len(res.client_ms_per_mb[kind, protocol]) == 2
            assert res.ratio(kind, protocol) > 0 and res.cpu_ratio(kind, protocol) > 0
        assert res.ratio(kind, "PLAINTEXT") == 1.0
    assert not os.listdir(out), "the benchmark leaves no data behind"

    text = bench.table(res)
    for protocol in bench.PROTOCOLS:
        assert f"| produce 2,000 × 1 KiB | {protocol} |" in text and f"| consume 2,000 × 1 KiB | {protocol} |" in text
    assert "consume SASL_SSL/PLAINTEXT" in bench.summary(res) and "consume SSL/PLAINTEXT" in bench.summary(res)
    doc = tmp_path / "performance.md"
    doc.write_text("# Performance\n\n## Kafka server (issue: Kafka server)\n\nkept\n")
    section = bench.markdown(res, "nproc 2", "bench/tls.py --test")
    check_section(section, bench.SECTION)
    perf_doc = importlib.import_module("perf_doc")  # importable once the bench (which puts bench/ first) is loaded
    perf_doc.update_section(bench.SECTION, section, str(doc))
    perf_doc.update_section(bench.SECTION, section, str(doc))
    text = doc.read_text()
    assert text.count(bench.SECTION) == 1 and "## Kafka server (issue: Kafka server)\n\nkept" in text
    flat = " ".join(text.split())  # the section's prose is wrapped
    assert "SCRAM-SHA-512" in flat and "load average" in flat
