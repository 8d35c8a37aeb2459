"""The replication benchmark (bench/replication.py) at a tiny size: a real etcd and three real `shale serve`
nodes start, every phase runs against them, three leaders are SIGKILLed under one-record-at-a-time `acks=all`
writes, and no acknowledged record is lost.

No wall-clock thresholds: this checks that the benchmark works and that the cluster keeps what it
acknowledged, not how fast it is.
"""

from __future__ import annotations

import os

import pytest

from support import bench_module
from support.prose import check_section

RECORDS, LATENCY, KILLS, MEM_PARTITIONS = 2000, 20, 3, 3


@pytest.fixture(scope="module")
def bench():
    yield from bench_module.load("replication.py")


@pytest.fixture(scope="module")
def result(bench, tmp_path_factory):
    out = tmp_path_factory.mktemp("out")
    res = bench.run(RECORDS, rounds=2, latency_records=LATENCY, kills=KILLS, mem_partitions=MEM_PARTITIONS,
                    out_dir=str(out), say=lambda *a: None)
    assert not os.listdir(out), "the benchmark leaves no data behind"
    return res


def test_no_acknowledged_record_is_lost_across_leader_kills(bench, result):
    (failover,) = result.failovers
    loss = failover.loss
    assert failover.session_ms == bench.DEFAULT_SESSION_MS and len(failover.kills) == KILLS
    assert loss.lost == [], f"acknowledged records lost: {loss.lost[:5]}"
    assert loss.duplicates == 0, "the idempotent producer's retries left duplicates"
    assert loss.invariants.startswith("ok"), loss.invariants
    assert loss.acknowledged > 20 and loss.high_watermark >= loss.acknowledged
    for kill in failover.kills:  # each kill moved the partition to another node in a newer epoch
        assert kill.new_leader != kill.node and kill.new_epoch > kill.epoch
        assert kill.failover_s > 0 and kill.elected_s > 0 and kill.rejoin_s > 0
    assert result.lost == 0


def test_every_phase_has_figures(bench, result):
    leader_cpu_s = 0.0
    for case in (bench.RF1, bench.RF3):
        phases = result.phases(case)
        assert len(phases) == 2
        for t in phases:
            assert t.phase.records == RECORDS and t.phase.mb_per_s > 0
            assert set(t.node_cpu_s) == {0, 1, 2} and t.leader == 0
            assert t.ms_per_mb(t.leader) >= 0 and t.follower_ms_per_mb >= 0
            leader_cpu_s += t.node_cpu_s[t.leader]
    # CPU time comes in clock ticks (10 ms): one tiny phase may read 0, four of them together cannot.
    assert leader_cpu_s > 0
    assert result.ratio > 0 and len(result.paired()) == 2
    assert set(result.latency) == {case for case, _, _ in bench.LATENCY_CASES}
    assert all(len(xs) == LATENCY and min(xs) > 0 for xs in result.latency.values())
    assert result.memory.partitions == MEM_PARTITIONS and set(result.memory.after_mib) == {0, 1, 2}
    assert all(v > 0 for v in result.memory.before_mib.values())


def test_report_and_doc_section(bench, result, tmp_path):
    text = bench.table(result)
    assert f"RF 3, acks=all, min.insync 2, {RECORDS:,} records" in text and "each follower CPU ms/MB" in text
    assert "| kills | 3 |" in text and "acknowledged records / lost" in text and "per replica, KiB" in text
    assert "broker.session.timeout.ms=2000" in text
    assert "failover p99" in bench.summary(result) and "0 lost of" in bench.summary(result)
    doc = tmp_path / "performance.md"
    doc.write_text("# Performance\n\n## Kafka server (issue: Kafka server)\n\nkept\n\n## Later section\n\nalso kept\n")
    section = bench.markdown(result, "nproc 2", "bench/replication.py --test")
    check_section(section, bench.SECTION)
    bench.update_doc(section, str(doc))
    bench.update_doc(section, str(doc))
    text = doc.read_text()
    assert text.count(bench.SECTION) == 1
    assert "## Kafka server (issue: Kafka server)\n\nkept" in text and "## Later section\n\nalso kept" in text
    assert "Interpretation" in text and "min.insync.replicas=2" in text


def test_a_full_run_keeps_the_sections_hand_written_paragraph(bench, tmp_path):
    doc = tmp_path / "performance.md"
    earlier = "Earlier figures, by hand:\n`make chaos` 100 faults, 0 lost."
    doc.write_text(f"# Performance\n\n{bench.SECTION}\n\nMeasured before.\n\n{earlier}\n\nWhat is measured: old.\n\n"
                   "## Later section\n\nalso kept\n")
    for _ in range(2):  # kept once, not doubled
        bench.update_doc(f"{bench.SECTION}\n\nMeasured now.\n\nWhat is measured: new.\n", str(doc))
    text = doc.read_text()
    assert f"Measured now.\n\n{earlier}\n\nWhat is measured: new." in text and text.count("Earlier figures") == 1
    assert "Measured before" not in text and "## Later section\n\nalso kept" in text



def test_a_throughput_only_run_measures_the_throughput_phases_alone(bench, tmp_path):
    """`--throughput-only`, for comparing CPU per MB before and after a change: no memory, latency or failover
    phase runs, and the summary gives each case's CPU per MB and the ratio."""
    res = bench.run(RECORDS, rounds=1, latency_records=LATENCY, kills=KILLS, mem_partitions=MEM_PARTITIONS,
                    out_dir=str(tmp_path), throughput_only=True, say=lambda *a: None)
    assert res.memory is None and res.latency == {} and res.failovers == [] and not os.listdir(tmp_path)
    assert [t.case for t in res.throughput] == [bench.RF1, bench.RF3]
    text = bench.throughput_summary(res)
    assert f"{bench.RF3}: " in text and "each follower" in text and "ratio RF 3 acks=all / RF 1 acks=1: " in text
