"""Only an explicit act deletes a topic (issue 12, item 1), on a real `shale serve` holding acknowledged data.

Every broken, truncated, vanished or unreadable manifest is refused or held: the data directory stays
byte-identical (`file_state`: every file under it, holes and all — only the checkpoint files, which the
scheduler rewrites on its own clock, and the process's `.lock` are left out), the refusal is logged at
ERROR with the file, shown in `/status` and counted in `/metrics`, and after a restart every
acknowledged record reads back. The reference state is taken after one clean restart, so the index
trimming and producer snapshots a clean stop writes are already in it: a restart must not change a byte.

The node runs without CAP_DAC_OVERRIDE/CAP_DAC_READ_SEARCH (setpriv), so that `chmod 000` makes a
directory unreadable to it although the tests run as root.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
import yaml
from confluent_kafka import Consumer, Producer
from confluent_kafka import TopicPartition as CTP
from prometheus_client.parser import text_string_to_metric_families
from test_live_reload import topic_error

from support.clients_util import file_state
from support.node_util import ServeProcess, free_port, topic_manifest, wait_for, write_manifests

# One __consumer_offsets partition keeps restarts quick; checkpoints and retention stay at Kafka's pace.
OVERRIDES = ("--override", "offsets.topic.num.partitions=1")
PATIENCE = 60  # seconds a wait may take on a loaded machine (the watch's own look is every 2 s)
DROP_DAC = ["setpriv", "--bounding-set", "-dac_override,-dac_read_search", "--inh-caps", "-all", "--"]

ORDERS = [topic_manifest("orders", 3, {"cleanup.policy": "compact", "retention.ms": -1, "segment.bytes": 4096}),
          topic_manifest("orders-dlq", 1, {"retention.ms": 604800000})]
AUDIT = [topic_manifest("audit", 2, {"retention.ms": -1})]
BILLING = [topic_manifest("billing", 1)]
PARTITIONS = {"orders": 3, "orders-dlq": 1, "audit": 2, "billing": 1}


def layout(topics: Path) -> dict[Path, list[dict]]:
    return {topics / "orders.yaml": ORDERS, topics / "audit.yaml": AUDIT, topics / "team" / "billing.yaml": BILLING}


def write_all(topics: Path) -> None:
    for path, docs in layout(topics).items():
        write_manifests(path, *docs)


def produce_acked(bootstrap: str, per_partition: int = 40,
                  topics: dict[str, int] = PARTITIONS) -> dict[tuple[str, int], list[bytes]]:
    """Keyed records to every partition, each acknowledged by the node (acks=all) before this returns."""
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True,
                         "linger.ms": 5})
    sent: dict[tuple[str, int], list[bytes]] = {}
    failures: list = []
    for topic, partitions in topics.items():
        for p in range(partitions):
            values = [b"%s-%d-%d-%s" % (topic.encode(), p, i, b"x" * (i % 50)) for i in range(per_partition)]
            for i, value in enumerate(values):
                producer.produce(topic, key=b"k%d" % (i % 7), value=value, partition=p,
                                 on_delivery=lambda err, msg: err and failures.append(err))
            sent[(topic, p)] = values
    assert producer.flush(30) == 0 and failures == []
    return sent


def get(port: int, path: str) -> bytes:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as resp:
        return resp.read()


def status(server: ServeProcess) -> dict:
    return yaml.safe_load(get(server.http_port, "/status"))  # JSON is YAML


def metric(server: ServeProcess, name: str, **labels) -> float:
    for family in text_string_to_metric_families(get(server.http_port, "/metrics").decode()):
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return s.value
    raise AssertionError(f"no sample {name} {labels}")


def digests(server: ServeProcess) -> dict[str, str | None]:
    return {name: t["spec_digest"] for name, t in status(server)["topics"].items()}


class Node:
    """One `shale serve` over `tmp/data` and `tmp/topics`, restartable on the same ports."""

    def __init__(self, tmp: Path, *extra: str) -> None:
        self.tmp, self.data, self.topics = tmp, tmp / "data", tmp / "topics"
        self.extra = extra
        self.server: ServeProcess | None = None
        self.port, self.http_port = free_port(), free_port()

    def start(self) -> ServeProcess:
        self.server = ServeProcess(self.data, self.topics, *OVERRIDES, *self.extra, port=self.port,
                                   http_port=self.http_port)
        self.server.args = [*DROP_DAC, *self.server.args]
        self.server.start()
        wait_for(timeout=PATIENCE, predicate=lambda: status(self.server)["ready"], what="the node to serve")
        return self.server

    def restart(self) -> ServeProcess:
        assert self.server.terminate() == 0, self.server.log()
        return self.start()

    def stop(self) -> None:
        if self.server is not None and self.server.proc.poll() is None:
            assert self.server.terminate() == 0, self.server.log()

    def read_back(self, sent: dict[tuple[str, int], list[bytes]]) -> None:
        """Every acknowledged record, in order, through one consumer assigned to all the partitions."""
        consumer = Consumer({"bootstrap.servers": self.server.bootstrap, "group.id": "unused",
                             "enable.auto.commit": False})
        got: dict[tuple[str, int], list[bytes]] = {tp: [] for tp in sent}
        try:
            consumer.assign([CTP(topic, p, 0) for topic, p in sent])

            def complete() -> bool:
                for msg in consumer.consume(500, 0.2):
                    assert msg.error() is None, msg.error()
                    got[(msg.topic(), msg.partition())].append(msg.value())
                return all(len(got[tp]) >= len(values) for tp, values in sent.items())

            wait_for(complete, PATIENCE, what="every acknowledged record")
        finally:
            consumer.close()
        assert got == sent


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    """A node holding acknowledged records in 7 partitions of 4 topics from 3 manifest files."""
    tmp = tmp_path_factory.mktemp("safety")
    n = Node(tmp)
    write_all(n.topics)
    server = n.start()
    n.sent = produce_acked(server.bootstrap)
    n.restart()
    n.reference = file_state(n.data)
    n.digests = digests(n.server)
    assert set(PARTITIONS) <= set(n.digests) and len(n.reference.files) > 20
    yield n
    n.stop()


def assert_untouched(n: Node) -> None:
    """Every topic at its last good spec, every data file byte-identical, restarted, every record read back."""
    assert {t: d for t, d in digests(n.server).items() if t in PARTITIONS} == \
        {t: d for t, d in n.digests.items() if t in PARTITIONS}
    assert n.reference.diff(file_state(n.data)) == []
    assert all(topic_error(n.server.bootstrap, t) is None for t in PARTITIONS)  # still served


def restore_and_restart(n: Node) -> None:
    """Put the manifests back as one directory rename (a half-copied directory would be an edit)."""
    staged = n.topics.with_name("topics.new")
    write_all(staged)
    shutil.rmtree(n.topics, ignore_errors=True)
    staged.rename(n.topics)
    wait_for(timeout=PATIENCE, predicate=lambda: status(n.server)["errors"]["manifests"] == {} and status(n.server)["manifests"]["held"] == {}
             and status(n.server)["manifests"]["missing"] is None, what="the restored manifests to apply")
    n.restart()
    assert n.reference.diff(file_state(n.data)) == []
    assert digests(n.server) == n.digests and status(n.server)["manifests"]["refusals"] == 0
    n.read_back(n.sent)


def error_lines(server: ServeProcess, *fragments: str) -> list[str]:
    return [line for line in server.log().splitlines() if " ERROR " in line and all(f in line for f in fragments)]


BREAKAGES = {
    "kind_typo": (lambda p: p.write_text(p.read_text().replace("kind: Topic", "kind: Topics")),
                  "kind must be Topic, got 'Topics'"),
    "api_version": (lambda p: p.write_text(p.read_text().replace("shale.dev/v1alpha1", "shale.dev/v2")),
                    "apiVersion must be shale.dev/v1alpha1, got 'shale.dev/v2'"),
    "emptied": (lambda p: p.write_bytes(b""), "the file is empty"),
    "comments_only": (lambda p: p.write_text("# moved elsewhere\n"), "the file is empty"),
    "not_yaml": (lambda p: p.write_text(p.read_text().replace("name: orders\n", "name: [orders\n", 1)),
                 "not readable as YAML"),
    "truncated_in_half": (lambda p: p.write_bytes(p.read_bytes()[:len(p.read_bytes()) // 2]), "truncated: the file"),
    "truncated_between_documents": (lambda p: p.write_bytes(p.read_bytes().split(b"---")[0]), "truncated: the file"),
    "invalid_config": (lambda p: p.write_text(p.read_text().replace("compact", "compacted")),
                       "Invalid value compacted for configuration cleanup.policy"),
    "not_a_topic": (lambda p: p.write_text("- orders\n- orders-dlq\n"), "document 1 is a YAML list, not a Topic"),
}


@pytest.mark.parametrize("breakage", BREAKAGES)
def test_a_broken_manifest_is_refused_and_the_data_dir_stays_byte_identical(node, breakage):
    change, reason = BREAKAGES[breakage]
    path = node.topics / "orders.yaml"
    refusals = metric(node.server, "shale_manifest_refusals_total")
    change(path)
    wait_for(timeout=PATIENCE, predicate=lambda: any(k.startswith(str(path)) for k in status(node.server)["errors"]["manifests"]),
             what="the refusal in /status")
    messages = status(node.server)["errors"]["manifests"]
    assert any(reason in m and m.startswith(f"{path}: ") for m in messages.values()), messages
    assert error_lines(node.server, "refused manifest", str(path), reason)
    assert metric(node.server, "shale_manifest_refusals_total") > refusals
    assert metric(node.server, "shale_manifest_errors") >= 1 and metric(node.server, "shale_manifests_missing") == 0
    assert not [line for line in node.server.log().splitlines() if "deleted" in line]
    assert_untouched(node)
    restore_and_restart(node)


def chmod_000(path: Path) -> None:
    path.chmod(0)


MASS = {
    # every file removed, the directory left (an emptied ConfigMap, an unmounted optional volume)
    "every_file_removed": (lambda d: [p.unlink() for p in d.rglob("*.yaml")], "no manifest file left under"),
    "directory_removed": (lambda d: shutil.rmtree(d), "does not exist"),
    # swapped out: renamed away and an empty one put in its place (a wrong volume, a botched rollout)
    "directory_swapped": (lambda d: (d.rename(d.with_name("topics.old")), d.mkdir()), "no manifest file left under"),
    "directory_swapped_for_another_teams": (
        lambda d: (d.rename(d.with_name("topics.old")), d.mkdir(), (d / "theirs.yaml").write_text("# theirs\n")),
        "none of the 3 manifest files read before is left under"),
    "directory_unreadable": (chmod_000, "cannot list"),
    "subdirectory_unreadable": (lambda d: chmod_000(d / "team"), "cannot list"),
}


@pytest.mark.parametrize("case", MASS)
def test_manifests_vanishing_at_once_delete_nothing_and_say_so(node, case):
    change, reason = MASS[case]
    try:
        change(node.topics)
        wait_for(timeout=PATIENCE, predicate=lambda: status(node.server)["manifests"]["missing"], what="the manifests to be reported missing")
        doc = status(node.server)["manifests"]
        assert reason in doc["missing"], doc
        assert error_lines(node.server, "manifests missing", reason, "deleting nothing")
        assert metric(node.server, "shale_manifests_missing") == 1
        held = {"billing"} if case == "subdirectory_unreadable" else set(PARTITIONS)
        assert set(doc["held"]) == held and {h["reason"] for h in doc["held"].values()} == {"manifests-missing"}
        assert metric(node.server, "shale_topics_held", reason="manifests-missing") == len(held)
        assert not [line for line in node.server.log().splitlines() if "deleted" in line]
        assert_untouched(node)
    finally:
        for d in (node.topics, node.topics / "team"):
            if d.is_dir():
                d.chmod(0o755)
        shutil.rmtree(node.topics.with_name("topics.old"), ignore_errors=True)
    restore_and_restart(node)


def test_an_unmounted_topics_volume_deletes_nothing(node):
    """The manifests on their own filesystem (a ConfigMap volume is a tmpfs), then unmounted: the empty
    directory beneath shows, with no inotify event for its files. The watch notices the directory changed."""
    staged = node.topics.with_name("topics.staged")
    shutil.copytree(node.topics, staged)
    for path in layout(node.topics):
        path.unlink()  # beneath the volume the directory is empty
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "shale-topics", str(node.topics)], check=True)
    try:
        shutil.copytree(staged, node.topics, dirs_exist_ok=True)
        wait_for(timeout=PATIENCE, predicate=lambda: status(node.server)["manifests"]["held"] == {}
                 and status(node.server)["manifests"]["missing"] is None, what="the mounted manifests to be read")
        assert digests(node.server) == node.digests
        subprocess.run(["umount", str(node.topics)], check=True)
        wait_for(timeout=PATIENCE, predicate=lambda: status(node.server)["manifests"]["missing"], what="the unmount to be noticed")
        assert set(status(node.server)["manifests"]["held"]) == set(PARTITIONS)
        assert metric(node.server, "shale_manifests_missing") == 1
        assert not [line for line in node.server.log().splitlines() if "deleted" in line]
        assert_untouched(node)
    finally:
        subprocess.run(["umount", str(node.topics)], capture_output=True)  # if the test failed before
        shutil.rmtree(staged)
    restore_and_restart(node)


def test_a_restart_with_no_manifests_keeps_the_logs_and_says_so(node):
    node.server.terminate()
    shutil.rmtree(node.topics)
    node.topics.mkdir()
    node.start()
    doc = status(node.server)
    assert "no manifest file under" in doc["manifests"]["missing"] and "orders" in doc["manifests"]["missing"]
    assert metric(node.server, "shale_manifests_missing") == 1
    assert error_lines(node.server, "manifests missing", "no manifest file under")
    partitions = {name: t["partitions"] for name, t in doc["topics"].items() if name in PARTITIONS}
    assert {name: len(ps) for name, ps in partitions.items()} == PARTITIONS  # every log kept, unserved
    assert all(p["served"] is False for ps in partitions.values() for p in ps)
    assert node.reference.diff(file_state(node.data)) == []
    restore_and_restart(node)


def test_with_delete_topic_enable_false_a_removed_manifest_keeps_its_topic(tmp_path):
    n = Node(tmp_path, "--override", "delete.topic.enable=false")
    write_all(n.topics)
    server = n.start()
    try:
        sent = produce_acked(server.bootstrap, per_partition=10)
        n.restart()
        reference, before = file_state(n.data), digests(n.server)
        (n.topics / "orders.yaml").unlink()
        wait_for(timeout=PATIENCE, predicate=lambda: status(n.server)["manifests"]["held"], what="the removal to be held")
        held = status(n.server)["manifests"]["held"]
        assert {name: h["reason"] for name, h in held.items()} == {"orders": "deletion-disabled",
                                                                   "orders-dlq": "deletion-disabled"}
        assert held["orders"]["message"] == (f"topic orders: its manifest was removed from {n.topics / 'orders.yaml'}, "
                                             "but delete.topic.enable is false: the topic and its data are kept")
        assert [line for line in n.server.log().splitlines() if " WARNING " in line and held["orders"]["message"] in line]
        assert metric(n.server, "shale_topics_held", reason="deletion-disabled") == 2
        assert metric(n.server, "shale_manifests_missing") == 0
        assert digests(n.server) == before and reference.diff(file_state(n.data)) == []
        n.read_back({k: v for k, v in sent.items() if k[0] == "orders"})  # still served
        # After a restart nothing declares them: strays, kept on disk; the manifest back serves them again.
        n.restart()
        assert status(n.server)["topics"]["orders"]["spec_digest"] is None
        assert reference.diff(file_state(n.data)) == []
        write_manifests(n.topics / "orders.yaml", *ORDERS)
        wait_for(timeout=PATIENCE, predicate=lambda: topic_error(n.server.bootstrap, "orders") is None, what="orders to be served again")
        n.read_back(sent)
    finally:
        n.stop()


def test_a_kubelet_configmap_update_never_looks_like_a_deletion(tmp_path):
    """kubelet's AtomicWriter: files in `..<timestamp>/`, `..data` → it, `<key>` → `..data/<key>`; an update
    writes a new timestamp directory and renames a new `..data` link over the old one."""
    n = Node(tmp_path)
    topics = n.topics
    topics.mkdir()
    generation = [0]

    def publish(keys: dict[str, list[dict]]) -> None:
        generation[0] += 1
        stamp = topics / f"..2026_11_24_21_00_00.{generation[0]:04d}"
        stamp.mkdir()
        for key, docs in keys.items():
            (stamp / key).write_text(yaml.safe_dump_all(docs))
        (topics / "..data_tmp").symlink_to(stamp.name)
        os.replace(topics / "..data_tmp", topics / "..data")
        for key in keys:
            if not (topics / key).is_symlink():
                (topics / key).symlink_to(f"..data/{key}")
        for link in topics.iterdir():
            if link.is_symlink() and not link.name.startswith("..") and link.name not in keys:
                link.unlink()
        for old in topics.glob("..2026_*"):
            if old != stamp:
                shutil.rmtree(old)

    keys = {"team_orders.yaml": ORDERS, "team_audit.yaml": AUDIT}
    publish(keys)
    server = n.start()
    try:
        sent = produce_acked(server.bootstrap, per_partition=10,
                             topics={t: n for t, n in PARTITIONS.items() if t != "billing"})
        reference = file_state(n.data)
        for retention in range(1, 16):  # fifteen updates in a row, each changing audit's config
            keys["team_audit.yaml"] = [topic_manifest("audit", 2, {"retention.ms": -1, "segment.ms": 3600000 + retention})]
            publish(keys)
        wait_for(timeout=PATIENCE, predicate=lambda: "3600015" in server.log(), what="the last update to apply")
        assert not [line for line in server.log().splitlines() if "deleted" in line or " ERROR " in line]
        assert reference.diff(file_state(n.data)) == []
        # A key removed from the ConfigMap is the explicit act: its topics go, the others stay.
        del keys["team_orders.yaml"]
        publish(keys)
        wait_for(timeout=PATIENCE, predicate=lambda: not (n.data / "orders-0").exists(), what="orders to be deleted")
        assert topic_error(server.bootstrap, "audit") is None
        # The ConfigMap emptied (or the volume unmounted): held, nothing deleted.
        publish({})
        wait_for(timeout=PATIENCE, predicate=lambda: status(server)["manifests"]["missing"], what="the empty ConfigMap to be reported")
        assert set(status(server)["manifests"]["held"]) == {"audit"} and (n.data / "audit-1").is_dir()
        n.read_back({k: v for k, v in sent.items() if k[0] == "audit"})
    finally:
        n.stop()


def test_a_topics_path_that_does_not_exist_is_one_line_and_creates_nothing(tmp_path):
    data = tmp_path / "data"
    result = subprocess.run([sys.executable, "-m", "shale.sidecar.cli", "serve", "--data-dir", str(data),
                             "--topics", str(tmp_path / "topcis"), "--listen", "127.0.0.1:0", "--http", "127.0.0.1:0"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 1
    lines = (result.stdout + result.stderr).strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in lines[0], lines
    assert lines[0].endswith(f"cannot start: --topics {tmp_path / 'topcis'}: no such file or directory "
                             "(create it, even empty, or fix the path)")
    assert not data.exists()
