"""The state backup benchmark (bench/state_backup.py) at a tiny size: Shale, Redis and PostgreSQL are started for
real, take the same updates through their real clients, compact, and each restores a state equal to the model.

No wall-clock thresholds: this checks that the benchmark works and that its check of the restored state has
teeth, not how fast any store is. redis-server and PostgreSQL are installed with apt-get if missing.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

from support import bench_module
from support.prose import check_section

KEYS, UPDATES = 2000, 20_000


@pytest.fixture(scope="module")
def bench():
    yield from bench_module.load("state_backup.py")


@pytest.fixture(scope="module")
def workload(bench):
    return bench.Workload.generate(KEYS, UPDATES, seed=7)


@pytest.fixture(scope="module")
def results(bench, tmp_path_factory):
    out = tmp_path_factory.mktemp("state-backup-out")
    res = bench.run(KEYS, UPDATES, out_dir=str(out), say=lambda *a: None)
    assert not os.listdir(out), "the benchmark leaves no data behind"
    return res


def test_every_store_restores_the_model(bench, results):
    assert list(results.systems) == list(bench.SYSTEMS)
    for s in results.systems.values():
        assert s.check is not None and s.check.equal, (s.name, s.check)
        assert s.check.keys_restored == KEYS and s.check.wrong == 0
        assert s.records == UPDATES and s.payload_bytes == results.payload_bytes
        assert s.restore_records >= KEYS
        assert s.write_s > 0 and s.restore_s > 0 and s.records_per_s > 0
        assert s.peak_memory_bytes > 0 and s.memory_how
        assert s.version and s.client and s.settings
        # ten updates per key: compaction (cleaner, BGREWRITEAOF, VACUUM FULL) must have dropped old values
        assert 0 < s.disk_after_compaction < s.disk_after_write, (s.name, s.disk_after_write,
                                                                   s.disk_after_compaction)


def test_report_and_plot(bench, results, tmp_path):
    text = bench.table(results)
    for name in bench.SYSTEMS:
        assert name in text
    assert "restore: seconds" in text and "server peak memory" in text
    assert len(bench.goals(results)) == 4
    doc = tmp_path / "performance.md"
    doc.write_text("# Performance\n\n## Log engine (issue: Log engine)\n\nkept\n\n## Later section\n\nalso kept\n")
    section = bench.markdown(results, "nproc 2", "bench/state_backup.py --test")
    check_section(section, bench.SECTION)
    bench.update_section(bench.SECTION, section, str(doc))
    bench.update_section(bench.SECTION, section, str(doc))
    body = doc.read_text()
    assert body.count(bench.SECTION) == 1
    assert "## Log engine (issue: Log engine)\n\nkept" in body and "## Later section\n\nalso kept" in body
    assert "state_backup.png" in body and "Interpretation" in body
    png = tmp_path / "plot.png"
    bench.plot(results, str(png))
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_state_check_catches_a_wrong_restore(bench, workload):
    latest = workload.latest_update()
    good = {}
    for k, name in enumerate(workload.names):
        o, n = int(workload.offsets[latest[k]]), int(workload.lengths[latest[k]])
        good[name] = workload.corpus[o:o + n]
    assert bench.check_state(workload, good).equal

    stale = dict(good)
    hot = workload.names[int(workload.key_ids[-1])]  # written by the very last update, and earlier too
    earlier = int(np.nonzero(workload.key_ids[:-1] == workload.key_ids[-1])[0][-1])
    o, n = int(workload.offsets[earlier]), int(workload.lengths[earlier])
    stale[hot] = workload.corpus[o:o + n]
    check = bench.check_state(workload, stale)
    assert not check.equal and check.wrong == 1 and hot.decode() in check.examples[0]

    missing = dict(good)
    del missing[workload.names[0]]
    assert bench.check_state(workload, missing).wrong == 1

    extra = dict(good)
    extra[b"key-not-in-the-model"] = b"x"
    assert not bench.check_state(workload, extra).equal


def test_workload_is_seeded_and_skewed(bench, workload):
    again = bench.Workload.generate(KEYS, UPDATES, seed=7)
    assert np.array_equal(again.key_ids, workload.key_ids) and again.corpus == workload.corpus
    assert np.array_equal(again.offsets, workload.offsets) and np.array_equal(again.lengths, workload.lengths)
    assert sorted(workload.key_ids[:KEYS].tolist()) == list(range(KEYS))  # every key written once first
    assert workload.lengths.min() >= bench.MIN_VALUE and workload.lengths.max() <= bench.MAX_VALUE
    top1, _ = workload.skew()
    assert top1 > 0.3  # Zipf: the hottest 1 % of keys take far more than 1 % of the updates
    # latest_update agrees with a plain walk over the updates
    last = {}
    for i, k in enumerate(workload.key_ids.tolist()):
        last[k] = i
    assert workload.latest_update().tolist() == [last[k] for k in range(KEYS)]
    keys, values = next(workload.batches(5))
    assert keys[0] == workload.names[int(workload.key_ids[0])]
    assert values[0] == workload.corpus[int(workload.offsets[0]):int(workload.offsets[0]) + int(workload.lengths[0])]
