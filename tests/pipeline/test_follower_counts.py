"""The example pipeline against a real `shale serve`: the stream job's counts in the compacted topic, and
the restore job rebuilding them from the latest view (over the wire and from the files, before and
after the cleaner compacted the topic), equal the counts computed from the events; and its `demo`
command as a reader runs it: readable output, nothing left behind, also after Ctrl-C."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time

import pytest
from spark_util import consume_all, set_cleaning, start_serve, wait_for_clean

from shale.pipeline.follower_counts import (
    COUNTS_TOPIC,
    count_stream,
    expected_counts,
    generate_events,
    produce_events,
    restore_counts,
    topic_manifests,
)
from support.node_util import wait_for


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    work = tmp_path_factory.mktemp("followers")
    node = start_serve(work, topic_manifests(demo=True), "--override", "log.cleaner.backoff.ms=100")
    yield node
    node.terminate()


def run_to_end(query) -> None:
    try:
        assert query.awaitTermination(180), "the AvailableNow run did not finish in 180 s"
    finally:
        query.stop()
    assert query.exception() is None


def test_generated_events_are_consistent():
    events = generate_events(5000, 30, seed=3)
    following: set = set()
    for e in events:
        edge = (e.follower, e.followee)
        assert e.follower != e.followee
        assert (edge in following) == (e.op == "unfollow"), "an unfollow only undoes a follow"
        following.symmetric_difference_update({edge})
    counts = expected_counts(events)
    assert counts == {u: n for u in {b for _, b in following}
                      if (n := sum(1 for _, b in following if b == u))}


def test_stream_then_restore_equals_the_model(spark, node, tmp_path):
    events = generate_events(3000, 60, seed=1)
    checkpoint = str(tmp_path / "checkpoint")
    set_cleaning(node, COUNTS_TOPIC, 3, "pause")  # first the restore from an uncompacted topic
    produce_events(node.bootstrap, events[:2000])
    run_to_end(count_stream(spark, node.bootstrap, checkpoint, every=None, max_offsets_per_trigger=700))
    produce_events(node.bootstrap, events[2000:])
    run_to_end(count_stream(spark, node.bootstrap, checkpoint, every=None))
    model = expected_counts(events)
    assert any(n > 1 for n in model.values())

    written = consume_all(node.bootstrap, COUNTS_TOPIC)
    users = {r.key for r in written}
    assert len(written) > len(users), "several triggers wrote counts of the same users"

    def restored(source: dict) -> dict:
        return {r.user: r.followers for r in restore_counts(spark, source).collect()}

    assert restored({"bootstrap.servers": node.bootstrap}) == model
    assert restored({"path": node.data_dir}) == model

    resumed = int(time.time() * 1000)
    set_cleaning(node, COUNTS_TOPIC, 3, "resume")
    wait_for_clean(node, COUNTS_TOPIC, resumed)
    assert len(consume_all(node.bootstrap, COUNTS_TOPIC)) < len(written), "compaction dropped old counts"
    assert restored({"bootstrap.servers": node.bootstrap}) == model
    assert restored({"path": node.data_dir}) == model


# The one line of a run that nothing can silence: the JVM prints it when Spark's launcher adds the incubator
# module Spark uses (`--add-modules=jdk.incubator.vector`), before any logging exists.
JVM_INCUBATOR_LINE = "WARNING: Using incubator modules: jdk.incubator.vector"


def _demo_env(tmp) -> dict:
    """The demo's environment: temporary files (ours: TMPDIR; Spark's: SPARK_LOCAL_DIRS) in a directory of
    the test, so that anything left behind is seen; stdout unbuffered, so that lines come as printed."""
    tmp.mkdir()
    return {**os.environ, "TMPDIR": str(tmp), "SPARK_LOCAL_DIRS": str(tmp), "PYTHONUNBUFFERED": "1"}


def _nothing_left(tmp) -> None:
    assert not list(tmp.glob("shale-follower-counts-*")), "the demo's temporary directory is removed before it exits"
    # Spark's own directories go in the JVM's shutdown hook, which may finish just after the driver exits.
    wait_for(lambda: not any(tmp.iterdir()), 30, what=f"Spark's temporary files in {tmp} to go")


def test_demo_prints_its_results_alone_and_leaves_nothing_behind(tmp_path):
    tmp = tmp_path / "tmp"
    run = subprocess.run([sys.executable, "-m", "shale.pipeline.follower_counts", "demo", "--events", "2000",
                          "--users", "40"], env=_demo_env(tmp), capture_output=True, text=True, timeout=400)
    assert run.returncode == 0, run.stdout + run.stderr
    patterns = [r"shale serve on 127\.0\.0\.1:\d+ \(data in .*/shale-follower-counts-[^/]+/data\); "
                r"producing 1000 events",
                r"stream run 1 done; producing 1000 more events \(the stream would run every few minutes\)",
                r"stream run 2 done; restoring the counts from the latest view of follower-counts",
                r"top users by followers: (u\d+=\d+, ){9}u\d+=\d+",
                r"restored \d+ users over the wire; equal to the counts computed from the events: True",
                r"shale serve killed; restored \d+ users from its data directory alone; equal: True"]
    lines = run.stdout.splitlines()
    assert len(lines) == len(patterns) and all(re.fullmatch(p, line) for p, line in zip(patterns, lines)), run.stdout
    # Spark says nothing between the results: no WARN lines, no progress bars, no startup banner.
    assert [line for line in run.stderr.splitlines() if line != JVM_INCUBATOR_LINE] == [], run.stderr
    _nothing_left(tmp)


def test_demo_interrupted_by_ctrl_c_stops_everything_and_leaves_nothing_behind(tmp_path):
    tmp = tmp_path / "tmp"
    # Its own process group, signalled as a terminal's Ctrl-C is: the demo and Spark's JVM (shale serve, in a
    # session of its own, is the demo's to stop).
    demo = subprocess.Popen([sys.executable, "-m", "shale.pipeline.follower_counts", "demo"], env=_demo_env(tmp),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        first = demo.stdout.readline()  # printed once the server listens and the SparkSession exists
        port = int(re.match(r"shale serve on 127\.0\.0\.1:(\d+) ", first).group(1))
        # In the middle of the first stream run: a call into the JVM is what Ctrl-C interrupts.
        wait_for(lambda: list(tmp.glob("shale-follower-counts-*/checkpoint/offsets/*")), 120,
                 what="the stream run to start")
        os.killpg(demo.pid, signal.SIGINT)
        out, err = demo.communicate(timeout=120)
    finally:
        if demo.poll() is None:
            os.killpg(demo.pid, signal.SIGKILL)
            demo.wait()
    assert demo.returncode == 130, first + out + err
    # It ends with one word and no traceback of ours or py4j's. The JVM gets the terminal's SIGINT too and
    # stops on its own meanwhile; what its threads say while interrupted varies from run to run (the known
    # lines are filtered by pipeline/log4j2.properties), so only Python's side is held to silence here.
    lines = [line for line in err.splitlines() if line != JVM_INCUBATOR_LINE]
    assert lines[-1:] == ["interrupted"], err
    assert not [line for line in lines if line.startswith(("Traceback", "py4j.", "ERROR:py4j"))], err
    with pytest.raises(ConnectionRefusedError):  # the server it started is gone
        socket.create_connection(("127.0.0.1", port), timeout=5).close()
    _nothing_left(tmp)


def test_the_wheel_ships_the_spark_log_configuration(wheel_venv):
    """Without the file, an installed Shale's local sessions would log as Spark's noisy defaults do."""
    run = wheel_venv.run("python", "-c", "from shale.pipeline.session import LOG4J2_CONFIG as c;"
                         "print(c.is_file(), c.parent.name, 'logger.nativecode.level = error' in c.read_text())")
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["True", "pipeline", "True"]
