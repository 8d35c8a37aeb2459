"""The Kafka server benchmark (bench/broker.py) at a tiny size: both real servers start, the confluent-kafka
workload moves every record through each and reads it back checked, and the report comes out.

No wall-clock thresholds: this checks that the benchmark works, not how fast either server is.
"""

from __future__ import annotations

import os

import pytest

from support import bench_module
from support.prose import check_section


@pytest.fixture(scope="module")
def bench():
    yield from bench_module.load("broker.py")


def test_whole_run_produces_figures(bench, tmp_path):
    out = tmp_path / "out"
    cpus = os.sched_getaffinity(0)
    res = bench.run(3000, rounds=2, latency_records=30, out_dir=str(out), say=lambda *a: None)
    assert os.sched_getaffinity(0) == cpus, "phase 5 gives the client its CPUs back after pinning it"
    assert set(res.systems) == {bench.SHALE, bench.TANSU}
    for system in res.systems.values():
        assert system.version
        for phase in system.produce + system.consume:
            assert phase.records == 3000 and phase.nbytes == 3000 * bench.RECORD_SIZE
            assert phase.seconds > 0 and phase.mb_per_s > 0 and phase.server_cpu_s >= 0
        assert len(system.produce) == len(system.consume) == 2
        assert len(system.latency_s) == 30 and min(system.latency_s) > 0 and system.latency_cpu_us >= 0
        assert len(system.wakeup_s) == 10 and min(system.wakeup_s) > 0
    for where in bench.PLACEMENTS:  # phase 5: each server and both floors, client and server apart and on one core
        assert res.floor_cpu_us[where] > 0 and all(s.raw_cpu_us[where] > 0 for s in res.systems.values())
        assert res.loop_floor_cpu_us[where] > 0
    assert len(res.paired("produce")) == len(res.paired("consume")) == 2
    assert res.ratio("produce") > 0 and res.ratio("consume") > 0
    assert not os.listdir(out), "the benchmark leaves no data behind"

    text = bench.table(res)
    assert "produce 3,000 × 1 KiB" in text and "consume 3,000 × 1 KiB" in text and "p99 ms" in text
    assert "server CPU µs per record" in text and "Fetch wake-up" in text and "floor_server.c" in text
    assert "asyncio floor (`bench/floor_server.py`)" in text
    assert f"client and server {bench.ONE_CORE}" in text and "Where the client runs" in bench.interpretation(res)
    assert "Shale/Tansu" in bench.summary(res)
    assert "of Tansu" in bench.interpretation(res)
    doc = tmp_path / "performance.md"
    doc.write_text("# Performance\n\n## Log engine (issue: Log engine)\n\nkept\n\n## Later section\n\nalso kept\n")
    section = bench.markdown(res, "nproc 2", "bench/broker.py --test")
    check_section(section, bench.SECTION)
    bench.update_doc(section, str(doc))
    bench.update_doc(section, str(doc))
    text = doc.read_text()
    assert text.count(bench.SECTION) == 1
    assert "## Log engine (issue: Log engine)\n\nkept" in text and "## Later section\n\nalso kept" in text
    assert "Interpretation" in text and "acks=all" in text


def test_consume_checks_every_record(bench, tmp_path):
    """A consumer that expects other values than were produced fails: the throughput figures count checked records."""
    values = bench.make_values()
    server = bench.start_tansu(str(tmp_path), ["checked"], 1)
    try:
        bench.wait_for_topics(server, ["checked"], 1)
        assert bench.produce(server, "checked", 200, values).records == 200
        assert bench.consume(server, "checked", 200, values).nbytes == 200 * bench.RECORD_SIZE
        with pytest.raises(AssertionError, match="checked-0 offset 0"):
            bench.consume(server, "checked", 200, values[1:] + values[:1])
    finally:
        server.stop()


def test_profile_summary_keeps_the_busy_main_thread(bench):
    raw = "\n".join([
        "thread (1): MainThread;_run_once (asyncio/base_events.py:1922);select (selectors.py:468) 50",
        "thread (1): MainThread;_run_once (asyncio/base_events.py:1922);append (/x/sidecar/log/log.py:200) 30",
        "thread (1): MainThread;_run_once (asyncio/base_events.py:1922);_dispatch (/x/sidecar/server/broker.py:9);"
        "encode_response (/x/sidecar/protocol/codec.py:300) 10",
        "thread (2): watchdog;run (threading.py:975) 40",
    ])
    samples, own, under = bench.summarize_profile(raw.replace("select (", "EpollSelector.select ("))
    assert samples == 40  # idle epoll waits and other threads left out
    assert own[0] == ("append (log/log.py)", 30) and own[1] == ("encode_response (protocol/codec.py)", 10)
    assert dict(under)["_run_once (asyncio/base_events.py)"] == 40
