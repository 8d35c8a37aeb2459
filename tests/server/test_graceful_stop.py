"""`shale serve` as a real process: SIGTERM stops it cleanly, so the next start skips recovery."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.error
import urllib.request

from kafka import KafkaConsumer, KafkaProducer
from kafka import TopicPartition as KTP

from shale.sidecar.log.checkpoint import RECOVERY_POINT_CHECKPOINT, read_offsets
from shale.sidecar.log.log_dir import CLEAN_SHUTDOWN_FILE
from shale.sidecar.log.topic_partition import TopicPartition
from support.node_util import ServeProcess, free_port, topic_manifest, wait_for, write_manifests

RECORDS = {0: [(b"a%d" % i, b"value a%d" % i) for i in range(20)],
           1: [(b"b%d" % i, b"value b%d" % i) for i in range(7)]}


def get_json(port: int, path: str) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def produce(bootstrap: str) -> None:
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks=1, enable_idempotence=False, linger_ms=5)
    try:
        futures = [producer.send("ledger", key=k, value=v, partition=p) for p, recs in RECORDS.items() for k, v in recs]
        assert [f.get(10).offset for f in futures] == [o for recs in RECORDS.values() for o in range(len(recs))]
    finally:
        producer.close()


def consume(bootstrap: str) -> dict[int, list[tuple[bytes, bytes]]]:
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, auto_offset_reset="earliest")
    try:
        tps = [KTP("ledger", p) for p in RECORDS]
        consumer.assign(tps)
        consumer.seek_to_beginning(*tps)
        got: dict[int, list[tuple[bytes, bytes]]] = {p: [] for p in RECORDS}
        deadline = time.monotonic() + 20
        while any(len(got[p]) < len(RECORDS[p]) for p in RECORDS) and time.monotonic() < deadline:
            for tp, records in consumer.poll(timeout_ms=200).items():
                got[tp.partition] += [(r.key, r.value) for r in records]
        return got
    finally:
        consumer.close()


def serve(tmp_path, *extra: str) -> ServeProcess:
    return ServeProcess(tmp_path / "data", tmp_path / "topics", *extra)


def test_sigterm_stops_cleanly_and_the_next_start_skips_recovery(tmp_path):
    write_manifests(tmp_path / "topics" / "t.yaml", topic_manifest("ledger", 2))
    data = tmp_path / "data"
    first = serve(tmp_path, "--override", "log.cleaner.threads=2").start()
    try:
        produce(first.bootstrap)
        status = wait_for(lambda: get_json(first.http_port, "/readyz")[0] == 200 and get_json(first.http_port,
                                                                                              "/status")[1])
        assert status["cleaner"]["threads_live"] == 2  # the --override reached the cleaner
    finally:
        code = first.terminate()
    assert code == 0, first.log()
    assert "stopped cleanly" in first.log()

    # The clean-shutdown marker, and recovery points at the log end: everything was flushed.
    assert json.loads((data / CLEAN_SHUTDOWN_FILE).read_text()) == {"version": 0, "brokerEpoch": -1}
    points = read_offsets(str(data / RECOVERY_POINT_CHECKPOINT))
    assert {tp: o for tp, o in points.items() if tp.topic == "ledger"} == {
        TopicPartition("ledger", p): len(recs) for p, recs in RECORDS.items()}

    logged = len(first.log())
    second = serve(tmp_path).start()
    try:
        wait_for(lambda: get_json(second.http_port, "/readyz")[0] == 200, what="the restarted node to be ready")
        assert "clean shutdown: recovery skipped" in second.log()[logged:]
        assert get_json(second.http_port, "/status")[1]["data_dir"]["had_clean_shutdown"] is True
        assert not (data / CLEAN_SHUTDOWN_FILE).exists()  # consumed at start: a crash from now on is unclean
        assert consume(second.bootstrap) == RECORDS
    finally:
        assert second.terminate() == 0


def test_a_killed_node_recovers_at_the_next_start(tmp_path):
    write_manifests(tmp_path / "topics" / "t.yaml", topic_manifest("ledger", 2))
    first = serve(tmp_path).start()
    try:
        produce(first.bootstrap)
    finally:
        first.kill()
    assert not (tmp_path / "data" / CLEAN_SHUTDOWN_FILE).exists()

    logged = len(first.log())
    second = serve(tmp_path).start()
    try:
        wait_for(lambda: get_json(second.http_port, "/readyz")[0] == 200, what="the restarted node to be ready")
        assert "no clean-shutdown marker: recovered from the recovery points" in second.log()[logged:]
        assert get_json(second.http_port, "/status")[1]["data_dir"]["had_clean_shutdown"] is False
        assert consume(second.bootstrap) == RECORDS  # in the page cache, so recovery finds it all
    finally:
        assert second.terminate() == 0


def test_an_invalid_override_exits_1_with_a_message_naming_the_key(tmp_path):
    write_manifests(tmp_path / "topics" / "t.yaml", topic_manifest("ledger", 1))
    base = [sys.executable, "-m", "shale.sidecar.cli", "serve", "--data-dir", str(tmp_path / "data"),
            "--topics", str(tmp_path / "topics"), "--listen", f"127.0.0.1:{free_port()}",
            "--http", f"127.0.0.1:{free_port()}"]
    for override, message in [
        ("log.cleaner.threads=-1", "Invalid value -1 for configuration log.cleaner.threads: Value must be at least 0"),
        ("log.flush.offset.checkpoint.interval.ms=often",
         "Invalid value often for configuration log.flush.offset.checkpoint.interval.ms"),
        ("log.cleaner.thread=2", "Unknown broker config name: log.cleaner.thread"),
        ("log.cleaner.threads", "Invalid --override 'log.cleaner.threads': expected key=value"),
    ]:
        done = subprocess.run([*base, "--override", override], capture_output=True, text=True, timeout=60)
        assert done.returncode == 1, done.stderr
        assert "cannot start: " + message in done.stderr
        assert "Traceback" not in done.stderr
