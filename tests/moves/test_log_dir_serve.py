"""Log-dir moves in real `shale serve` processes: SIGKILL in the middle of a copy and a restart, and a move
wedged on purpose (throttled to 1 byte/s) whose series, scraped from the node, make the chart's
stuck-cleaning alert fire under promtool (docs/moves.md, section 3)."""

from __future__ import annotations

import json
import os
import urllib.request
from pathlib import Path

import yaml
from kafka.admin import KafkaAdminClient
from test_log_dir_moves import COMPACTED, produce_duplicates

from support.chart_util import FULL_VALUES, run_promtool, write_rules
from support.clients_util import raw_batches
from support.node_util import ServeProcess, scrape_metrics, topic_manifest, wait_for, write_manifests

QUICK = ("--override", "log.cleaner.backoff.ms=100", "--override", "offsets.topic.num.partitions=2")


def serve(tmp_path: Path, *extra: str) -> ServeProcess:
    topics = tmp_path / "topics"
    if not topics.exists():
        write_manifests(topics / "orders.yaml", topic_manifest("orders", 1, COMPACTED))
    return ServeProcess(tmp_path / "a", topics, "--data-dir", str(tmp_path / "b"), *QUICK, *extra)


def http(node: ServeProcess, path: str, method: str = "GET") -> dict:
    request = urllib.request.Request(f"http://127.0.0.1:{node.http_port}{path}", method=method)
    with urllib.request.urlopen(request, timeout=10) as r:
        return json.loads(r.read())


def orders_0(node: ServeProcess) -> dict:
    return http(node, "/status")["topics"]["orders"]["partitions"][0]


def alter(node: ServeProcess, target: Path) -> None:
    admin = KafkaAdminClient(bootstrap_servers=node.bootstrap)
    try:
        assert [e.__name__ for e in admin.alter_replica_log_dirs({("orders", 0, 0): str(target)}).values()] == [
            "NoError"]
    finally:
        admin.close()


def start_held_move(node: ServeProcess, tmp_path: Path) -> tuple[Path, Path, dict]:
    """1.5 MB of duplicates held uncompacted by a pause of the test's own, a move started to the other dir;
    once it copies, the test's pause is released: the move's is the only one left."""
    http(node, "/partitions/orders/0/pause?owner=setup", "POST")
    produce_duplicates(node.bootstrap)
    source = Path(orders_0(node)["log_dir"])
    target = tmp_path / ("b" if source == tmp_path / "a" else "a")
    alter(node, target)
    p = wait_for(lambda: (p := orders_0(node))["move"] and p["move"]["state"] == "copying"
                 and p["move"]["bytes_copied"] > 0 and p, what="the move to copy")
    assert http(node, "/partitions/orders/0/resume?owner=setup", "POST")["pause_owners"] == [f"move:{p['move']['id']}"]
    return source, target, p["move"]


def test_sigkill_mid_copy_then_restart_completes_the_move(tmp_path):
    with serve(tmp_path, "--override", "replica.alter.log.dirs.io.max.bytes.per.second=100000") as node:
        source, target, move = start_held_move(node, tmp_path)
        before = [raw for raw, _ in raw_batches(source, "orders", 0)]
        node.kill()
    futures = [n for n in os.listdir(target) if n.endswith("-future")]
    assert futures == [f"orders-0.{move['id']}-future"]
    assert json.loads((source / "cleaner-pauses.json").read_text())["pauses"] == {"orders-0": [f"move:{move['id']}"]}

    # Restarted (unthrottled, cleaner off so that nothing rewrites the bytes): the move resumes and completes.
    with serve(tmp_path, "--override", "log.cleaner.enable=false") as node:
        p = wait_for(lambda: (p := orders_0(node))["move"] and p["move"]["state"] == "done" and p, timeout=60,
                     what="the resumed move")
        assert p["move"]["id"] == move["id"] and p["log_dir"] == str(target)
        assert p["cleaning"]["pause_count"] == 0
        assert [raw for raw, _ in raw_batches(target, "orders", 0)] == before
        assert not (source / "orders-0").exists() and not [n for n in os.listdir(target) if n.endswith("-future")]
        assert json.loads((source / "cleaner-pauses.json").read_text())["pauses"] == {}

    # And again with the cleaner: nothing holds the partition, new duplicates are compacted away.
    with serve(tmp_path) as node:
        assert orders_0(node)["cleaning"]["pause_owners"] == []
        produce_duplicates(node.bootstrap)
        wait_for(lambda: orders_0(node)["size_bytes"] < 600_000, timeout=60, what="the log to shrink")


def _series(name: str, labels: dict[str, str]) -> str:
    target = {"job": "shale-storage", "namespace": "kafka", "instance": "10.1.0.5:8080", "pod": "shale-storage-0"}
    return name + "{" + ", ".join(f'{k}="{v}"' for k, v in {**target, **labels}.items()) + "}"


def test_wedged_move_fires_the_stuck_cleaning_alert(tmp_path):
    with serve(tmp_path, "--override", "replica.alter.log.dirs.io.max.bytes.per.second=1") as node:
        source, target, move = start_held_move(node, tmp_path)
        metrics = scrape_metrics(node.http_port)
        orders = {"topic": "orders", "partition": "0"}
        paused = metrics[("shale_cleaning_state", frozenset({**orders, "state": "paused"}.items()))]
        seconds = metrics[("shale_cleaning_state_seconds", frozenset(orders.items()))]
        assert paused == 1.0
        assert metrics[("shale_cleaning_pause_count", frozenset(orders.items()))] == 1.0
        assert metrics[("shale_cleaning_pauses", frozenset({"kind": "move"}.items()))] == 1.0
        assert metrics[("shale_log_dir_future_replicas", frozenset({"log_dir": str(target)}.items()))] == 1.0
        assert metrics[("shale_log_dir_move_bytes_total", frozenset())] > 0

        # The chart's rule over these series, as Prometheus would scrape them from now on.
        write_rules(tmp_path, FULL_VALUES)
        start = int(seconds)
        at_minute = 40
        value = start + 60 * at_minute
        (tmp_path / "wedged.yaml").write_text(yaml.safe_dump({
            "rule_files": ["rules.yaml"], "evaluation_interval": "1m",
            "tests": [{"interval": "1m", "input_series": [
                {"series": _series("shale_cleaning_state_seconds", orders), "values": f"{start}+60x60"},
                {"series": _series("shale_cleaning_state", {**orders, "state": "paused"}), "values": f"{int(paused)}x60"},
            ], "alert_rule_test": [
                {"eval_time": "20m", "alertname": "ShaleCleaningPausedTooLong", "exp_alerts": []},
                {"eval_time": f"{at_minute}m", "alertname": "ShaleCleaningPausedTooLong", "exp_alerts": [{
                    "exp_labels": {"job": "shale-storage", "namespace": "kafka", "instance": "10.1.0.5:8080",
                                   "pod": "shale-storage-0", **orders, "severity": "warning"},
                    "exp_annotations": {
                        "summary": f"Cleaning of orders-0 on shale-storage-0 has been paused for "
                                   f"{value // 60}m {value % 60}s",
                        "description": _description()}}]},
            ]}]}, sort_keys=False))
        result = run_promtool("test", "rules", "wedged.yaml", cwd=tmp_path)
        assert result.returncode == 0, result.stdout + result.stderr

        # The way out: the move cancelled (back to its current dir), the pause goes, the log shrinks again.
        alter(node, source)
        wait_for(lambda: orders_0(node)["move"]["state"] == "cancelled", what="the cancel")
        metrics = scrape_metrics(node.http_port)
        assert metrics[("shale_cleaning_state", frozenset({**orders, "state": "paused"}.items()))] == 0.0
        assert metrics[("shale_log_dir_future_replicas", frozenset({"log_dir": str(target)}.items()))] == 0.0
        wait_for(lambda: orders_0(node)["size_bytes"] < 600_000, timeout=60, what="the log to shrink")


def _description() -> str:
    """The rule's description rendered for shale-storage-0's orders-0, taken from the chart's own unit test."""
    unit = yaml.safe_load((Path(__file__).resolve().parents[1] / "k8s" / "alerts" /
                           "ShaleCleaningPausedTooLong.yaml").read_text())
    text = unit["tests"][0]["alert_rule_test"][2]["exp_alerts"][0]["exp_annotations"]["description"]
    return (text.replace("demo-shale-storage-0", "shale-storage-0").replace("prices/0", "orders/0"))
