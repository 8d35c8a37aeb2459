"""The one-record append benchmark (bench/append_one.py) at a tiny size: the three paths run, their logs agree, and
the C functions are back in place afterwards.

No wall-clock thresholds: this checks that the benchmark works, not how fast either path is.
"""

from __future__ import annotations

import os

import pytest

from shale.sidecar.log import log as log_module
from support import bench_module
from support.prose import check_section


@pytest.fixture(scope="module")
def bench():
    yield from bench_module.load("append_one.py")


def test_every_path_appends_the_same_log(bench, tmp_path):
    kernel = (log_module._append_produced, log_module._prepare_produce)
    results = bench.run(50, rounds=3, out_dir=str(tmp_path), say=lambda *a: None)
    assert (log_module._append_produced, log_module._prepare_produce) == kernel, "the C functions are back after the run"
    assert set(results) == set(bench.PRODUCERS)
    for by_path in results.values():
        assert set(by_path) == set(bench.PATHS) and all(len(v) == 3 and min(v) > 0 for v in by_path.values())
    assert not os.listdir(tmp_path), "the benchmark leaves no logs behind"
    assert "| idempotent (" in bench.report(results)
    section = bench.markdown(results, "nproc 2", "bench/append_one.py --test", 1.0, (0.5, 0.6))
    check_section(section, bench.SECTION)
    assert "C append" in section and "Interpretation" in section


def test_a_difference_between_the_paths_fails_the_run(bench, tmp_path, monkeypatch):
    """The baseline must be the same append: a Python path that wrote other bytes is caught, not timed."""
    real = log_module.Log._assign

    def other_epoch(self, data, now, assign_offsets, leader_epoch, log_append, copy):
        return real(self, data, now, assign_offsets, None if leader_epoch is None else leader_epoch + 1, log_append,
                    copy)
    monkeypatch.setattr(log_module.Log, "_assign", other_epoch)
    with pytest.raises(AssertionError, match="idempotent round 1: the logs written by Python differ from the log written by C append"):
        bench.run(20, rounds=1, out_dir=str(tmp_path), say=lambda *a: None)
