"""What users do with Shale, on the real cluster (kube_cluster.py): `helm install` of the chart with replication
and three storage pods, a Topic applied with kubectl, Kafka clients in pods (librdkafka), and faults made the
way they happen in a cluster (`kubectl delete pod`).

The tests run in file order on one worker and share one release: each journey leaves the release as it
found it (every pod Ready, every replica in sync), and checks that first. Figures (time to Ready, to the
first acknowledgement after a delete) are printed and appended to the session's `journeys.json`.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from kube_cluster import KubeCluster
from release import POD_CLIENT, Release

TOPIC = "journey-prices"
VALUES = {
    "storage": {"replicas": 3, "resources": {"requests": {"cpu": "100m", "memory": "256Mi"}},
                "overrides": {"log.cleaner.backoff.ms": 500}},
    "operator": {"statusIntervalSeconds": 3},
    # The journeys' clients speak PLAINTEXT, as e2e/journey.sh's do.
    "security": {"enabled": False},
}


def record(cluster: KubeCluster, name: str, figures: dict[str, Any]) -> None:
    print(f"{name}: {json.dumps(figures)}")
    with open(cluster.directory / "journeys.json", "a") as out:
        out.write(json.dumps({"journey": name, **figures}) + "\n")


@pytest.fixture(scope="module")
def release(kube_cluster: KubeCluster, tmp_path_factory) -> Release:
    started = time.monotonic()
    shale = Release(kube_cluster, tmp_path_factory.mktemp("release"), values=VALUES).install()
    ready = shale.wait_ready(storage=3)
    record(kube_cluster, "install", {"helm install to every pod Ready (s)": round(time.monotonic() - started, 1),
                                     "wait (s)": round(ready, 1)})
    return shale


def in_sync(release: Release, topic: str, replicas: int = 3) -> dict[str, Any]:
    """Each partition's leader and ISR, once every partition has all `replicas` in its ISR."""
    deadline = time.monotonic() + 120
    while True:
        partitions = release.client("describe", "--bootstrap", release.bootstrap, "--topic", topic)
        if all(p["leader"] >= 0 and len(p["isr"]) == replicas for p in partitions.values()):
            return partitions
        if time.monotonic() > deadline:
            raise AssertionError(f"{topic}: replicas not in sync after 120 s: {partitions}\n{release.diagnose()}")
        time.sleep(2)


def test_install_topic_produce_consume_lag(release: Release):
    """install -> Topic (RF 3, min.insync 2, compact) Ready -> produce through the Service -> consume from a
    pod's DNS name -> the group's lag by Kafka's admin APIs -> the Topic's status with the end offsets."""
    release.apply({"apiVersion": "shale.dev/v1alpha1", "kind": "Topic", "metadata": {"name": TOPIC},
                   "spec": {"partitions": 3, "replicas": 3,
                            "config": {"cleanup.policy": "compact", "min.insync.replicas": 2}}})
    started = time.monotonic()
    release.wait_topic(TOPIC)
    topic_ready = time.monotonic() - started
    partitions = in_sync(release, TOPIC)
    assert sorted(partitions) == ["0", "1", "2"]
    assert all(sorted(p["replicas"]) == [0, 1, 2] for p in partitions.values()), partitions

    produced = release.client("produce", "--bootstrap", release.bootstrap, "--topic", TOPIC,
                              "--keys", "10", "--updates", "10")
    assert produced["errors"] == [] and produced["unflushed"] == 0
    assert len(produced["acked"]) == 100

    consumed = release.client("consume", "--bootstrap", release.pod_address(1), "--topic", TOPIC,
                              "--group", "journey", "--commit", "6")
    assert consumed["complete"]
    by_position = {(p, o): (k, v) for k, v, p, o in consumed["records"]}
    assert {(p, o): (k, v) for k, v, p, o in produced["acked"]} == by_position  # every record, byte for byte

    lag = release.client("lag", "--bootstrap", release.pod_address(2), "--topic", TOPIC, "--group", "journey")
    ends = {int(p): end for p, end in consumed["ends"].items()}
    assert {int(p): (v["committed"], v["end"], v["lag"]) for p, v in lag["partitions"].items()} == \
        {p: (6, end, end - 6) for p, end in ends.items()}
    assert lag["total"] == 100 - 18

    view = release.wait_topic(TOPIC, min_end_offsets=100)
    assert view.end_offsets == 100
    assert view.condition("CleaningStuck").get("status") == "False"
    record(release.cluster, "topic", {"apply to Ready (s)": round(topic_ready, 1)})
    print(release.kubectl("get", "pods,topics", "-o", "wide").stdout)


def _leader_pod(release: Release, partitions: dict[str, Any], partition: str) -> str:
    return f"{release.fullname}-storage-{partitions[partition]['leader']}"


def _volume_files(release: Release, pod: str) -> dict[str, bytes]:
    """The first segment of each partition directory on the pod's PersistentVolume, read on the host."""
    claim = json.loads(release.kubectl("get", "pvc", f"data-{pod}", "-o", "json").stdout)
    volume = json.loads(release.cluster.kubectl("get", "pv", claim["spec"]["volumeName"], "-o", "json").stdout)
    data = Path(volume["spec"]["local"]["path"]) / "data"
    return {str(f.relative_to(data)): f.read_bytes() for f in data.glob(f"{TOPIC}-*/00000000000000000000.log")}


def test_leader_pod_deleted_under_idempotent_acks_all_load(release: Release):
    """`kubectl delete pod` of partition 0's leader while an idempotent acks=all producer writes: every
    acknowledged record is read back byte for byte, the pod returns on its volume's data and into every ISR."""
    partitions = in_sync(release, TOPIC)
    victim = _leader_pod(release, partitions, "0")
    before = _volume_files(release, victim)
    assert before, f"no segment files of {TOPIC} on {victim}'s volume"
    uid = json.loads(release.kubectl("get", "pod", victim, "-o", "json").stdout)["metadata"]["uid"]

    pod = release.client_pod()
    with open(POD_CLIENT) as script:
        load = subprocess.Popen(
            [*release.cluster.kubectl_argv(), "-n", release.namespace, "exec", "-i", pod, "--", "python", "-", "load",
             "--bootstrap", release.bootstrap, "--topic", TOPIC, "--seconds", "40"],
            stdin=script, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(8)
    release.kubectl("delete", "pod", victim, "--wait=false")
    out, err = load.communicate(timeout=180)
    assert load.returncode == 0, err[-3000:]
    result = json.loads(out)
    acked = result["acked"]
    assert acked, "the load acknowledged nothing"
    assert not [e for e in result["errors"] if e[2] is False], result["errors"]  # no fatal producer error

    # The pod comes back (a new pod object, the same claim and volume) and into every partition's ISR.
    release.wait_ready(storage=3, timeout=240)
    new_uid = json.loads(release.kubectl("get", "pod", victim, "-o", "json").stdout)["metadata"]["uid"]
    assert new_uid != uid
    after = in_sync(release, TOPIC)
    after_files = _volume_files(release, victim)
    for name, content in before.items():  # the volume kept what the old pod wrote
        assert after_files[name][:len(content)] == content, name

    consumed = release.client("consume", "--bootstrap", release.bootstrap, "--topic", TOPIC)
    assert consumed["complete"]
    stored = {(p, o): (k, v) for k, v, p, o in consumed["records"]}
    lost = [a for a in acked if stored.get((a[3], a[4])) != (a[1], a[2])]
    assert not lost, f"{len(lost)} acknowledged records lost or changed, first {lost[:5]}"
    record(release.cluster, "leader pod deleted", {
        "records acknowledged": len(acked), "retriable errors": len(result["errors"]),
        # One record in flight, keys over every partition: the longest wait is the time from the delete to the
        # first acknowledgement of a record of the partitions the pod led.
        "longest wait between acknowledgements (s)": round(result["longest_gap"], 3),
        "leaders after": {p: v["leader"] for p, v in after.items()}})
