"""The log-dir move benchmark (bench/moves.py) at a tiny size: one real `shale serve` with two log dirs, a
partition preloaded with confluent-kafka, `dd` of its segments, an unthrottled AlterReplicaLogDirs followed in
`/status` until done, a throttled move with one-record produces to the moving partition, then the same produces
during a throttled reassignment on etcd and three nodes, and the report with its ratios.

No wall-clock thresholds: this checks that the benchmark works, not how fast a move is.
"""

from __future__ import annotations

import os

import pytest

from support import bench_module
from support.prose import check_section


@pytest.fixture(scope="module")
def bench():
    yield from bench_module.load("moves.py")


def test_moves_and_dd_copy_the_partition_and_the_report_has_its_ratios(bench, tmp_path):
    out = tmp_path / "out"
    res = bench.run(4, latency_records=50, move_s=2.0, rounds=2, out_dir=str(out), say=lambda *a: None)
    # 4 MiB of 1 KiB records in batches: the segments hold them and their batch headers
    assert res.segment_bytes > 4 * 2**20
    assert len(res.dd_s) == 3 and len(res.move_s) == 2 and all(s > 0 for s in res.dd_s + res.move_s)
    # each move copied every segment (run() checked the moved segments' size) and the indexes beside them
    assert all(b > res.segment_bytes for b in res.move_bytes_copied)
    assert res.copy_ratio > 0 and res.move_cpu_ms_per_mb > 0
    assert 0 < res.throttle_bps < res.move_bytes_copied[0]  # the throttled move lasted about 2 s, not less
    assert len(res.idle) == 3 * 50 and len(res.during) % bench.ROUND == 0 and res.during
    assert res.p99_ratio > 0
    assert len(res.reassign_idle) == 3 * 50 and len(res.reassign_during) % bench.ROUND == 0
    assert res.reassign_during
    assert res.reassign_throttle_bps > 0 and res.reassign_p99_ratio > 0
    assert len(res.throttled_move_s) == len(res.reassign_s) == 2 and all(res.throttled_move_s + res.reassign_s)
    assert res.load[0] > 0 and res.wall_s > 0
    assert not os.listdir(out), "the benchmark leaves no data behind"

    text = bench.table(res)
    assert "| unthrottled move (" in text and "`dd` of " in text and f"{res.copy_ratio:.2f}" in text
    assert "| produce p99, ms, during 2 log-dir moves throttled to " in text and f"{res.p99_ratio:.2f}" in text
    assert "| produce p99, ms, during 2 reassignments (RF 2) throttled to " in text
    assert f"reassignment p99 during/idle {res.reassign_p99_ratio:.2f}" in bench.summary(res)
    assert f"move/dd {res.copy_ratio:.2f}" in bench.summary(res)
    doc = tmp_path / "performance.md"
    doc.write_text("# Performance\n\n## Kafka server (issue: Kafka server)\n\nkept\n")
    section = bench.markdown(res, "nproc 2", "bench/moves.py --test")
    check_section(section, bench.SECTION)
    bench.update_section(bench.SECTION, section, str(doc))
    bench.update_section(bench.SECTION, section, str(doc))
    text = doc.read_text()
    assert text.count(bench.SECTION) == 1 and "## Kafka server (issue: Kafka server)\n\nkept" in text
    flat = " ".join(text.split())  # the section's prose is wrapped
    assert "AlterReplicaLogDirs" in flat and "load average" in flat and "conv=fsync" in flat
