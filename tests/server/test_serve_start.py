"""How `shale serve` starts, as a newcomer meets it: a taken port is one line and changes nothing on disk, and
the startup log says what happened to the data directory (new, recovered, clean) in plain English."""

from __future__ import annotations

import re
import signal
import socket
import subprocess

import pytest

from shale.sidecar.plural import plural
from support.node_util import ServeProcess, free_port, wait_for


def _run(node: ServeProcess) -> subprocess.CompletedProcess:
    return subprocess.run(node.args, capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("taken", ["listen", "http"])
def test_a_taken_port_exits_1_with_one_line_naming_it_and_creates_nothing(tmp_path, taken):
    (tmp_path / "topics").mkdir()
    with socket.socket() as holder:  # a real socket of this test holds the port, as another server would
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        node = ServeProcess(tmp_path / "data", tmp_path / "topics",
                            **({"port": port} if taken == "listen" else {"http_port": port}))
        done = _run(node)
    assert done.returncode == 1, done.stderr
    what = "the Kafka listener" if taken == "listen" else "the HTTP endpoints"
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].endswith(f"ERROR shale.sidecar.server.serve: cannot start: {what} 127.0.0.1:{port} "
                             f"(--{taken}): Address already in use")
    assert not (tmp_path / "data").exists(), "nothing may be created before the ports are known to be free"


def test_the_same_port_for_kafka_and_http_is_refused_before_anything_is_created(tmp_path):
    (tmp_path / "topics").mkdir()
    port = free_port()
    done = _run(ServeProcess(tmp_path / "data", tmp_path / "topics", port=port, http_port=port))
    assert done.returncode == 1, done.stderr
    assert f"cannot start: the HTTP endpoints 127.0.0.1:{port} (--http): Address already in use" in done.stderr
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "data").exists()


def _started(node: ServeProcess, logged: int) -> str:
    """Start `node` and return its log from byte `logged` on, once it says it serves."""
    node.start()
    wait_for(lambda: " serving " in node.log()[logged:], what="the node to serve")
    return node.log()[logged:]


def test_the_startup_log_says_new_recovered_or_clean_with_correct_plurals(tmp_path):
    (tmp_path / "topics").mkdir()  # no manifests: the node serves __consumer_offsets alone, as one partition
    args = ("--override", "offsets.topic.num.partitions=1")
    data = str((tmp_path / "data").resolve())

    first = ServeProcess(tmp_path / "data", tmp_path / "topics", *args)
    fresh = _started(first, 0)
    assert f"new data directory {data}: no logs to load" in fresh
    assert "recover" not in fresh, "a new directory is not a recovery"
    assert "topic __consumer_offsets created: 1 partition (1 here)" in fresh
    assert "group coordinator loaded 0 groups (0 records) from __consumer_offsets" in fresh
    assert "maintenance started: 1 cleaner thread," in fresh
    assert f"node 0 serving 1 topic from {data}" in fresh
    first.kill()  # SIGKILL: no clean-shutdown marker

    logged = len(first.log())
    second = ServeProcess(tmp_path / "data", tmp_path / "topics", *args)
    recovered = _started(second, logged)
    assert f"loaded 1 log from {data} (no clean-shutdown marker: recovered from the recovery points)" in recovered
    assert "new data directory" not in recovered
    assert second.terminate() == 0

    logged = len(second.log())
    third = ServeProcess(tmp_path / "data", tmp_path / "topics", *args)
    clean = _started(third, logged)
    assert f"loaded 1 log from {data} (clean shutdown: recovery skipped)" in clean
    assert third.terminate() == 0

    # Nowhere a count of one with a plural noun, nor a "(s)".
    log = third.log()
    assert not re.search(r"(?<![\d.])1 (partitions|topics|logs|groups|records|cleaner threads|members|bytes)\b", log)
    assert "(s)" not in log


def test_plural_counts():
    assert [plural(n, "log") for n in (0, 1, 2)] == ["0 logs", "1 log", "2 logs"]
    assert plural(1, "entry", "entries") == "1 entry" and plural(3, "entry", "entries") == "3 entries"


def test_a_fatal_signal_leaves_every_threads_python_stack_in_the_log(tmp_path):
    """A crash in a C extension (SIGSEGV, SIGABRT) must say where each thread was, not just end the process."""
    (tmp_path / "topics").mkdir()
    node = ServeProcess(tmp_path / "data", tmp_path / "topics", "--override", "offsets.topic.num.partitions=1")
    node.start()
    node.proc.send_signal(signal.SIGSEGV)
    assert node.proc.wait(30) == -signal.SIGSEGV
    log = node.log()
    assert "Fatal Python error: Segmentation fault" in log, log[-2000:]
    assert "Current thread" in log and "serve_forever" in log, log[-2000:]
