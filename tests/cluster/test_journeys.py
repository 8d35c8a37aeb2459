"""What users do with Shale, on the real cluster (kube_cluster.py): `helm install` of the chart with replication
and three storage pods, a Topic applied with kubectl, Kafka clients in pods (librdkafka), and faults made the
way they happen in a cluster (`kubectl delete pod`).

The tests run in file order on one worker and share one release: each journey leaves the release as it
found it (every pod Ready, every replica in sync), and checks that first. Figures (time to Ready, to the
first acknowledgement after a delete) are printed and appended to the session's `journeys.json`.
"""

from __future__ import annotations

import datetime
import json
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any, Iterator

import pytest
from kube_cluster import SMALL_VOLUME_MIB, KubeCluster
from kubernetes.client import CoreV1Api
from monitoring import Monitoring, monitor_targets, rules_for_test, scrape_job
from release import POD_CLIENT, Release

from shale.operator.topic_check import TopicView
from support.chart_util import objects, one, render
from support.node_util import free_port

TOPIC = "journey-prices"
VALUES = {
    # On the cluster's `small` volumes (a tmpfs of 128 MiB each): the alert journey fills one for real.
    "storage": {"replicas": 3, "resources": {"requests": {"cpu": "100m", "memory": "256Mi"}},
                "persistence": {"storageClassName": "small", "size": f"{SMALL_VOLUME_MIB}Mi"},
                "overrides": {"log.cleaner.backoff.ms": 500}},
    # CleaningStuck after 5 s, for the alert journey (the chart's default is an hour).
    "operator": {"statusIntervalSeconds": 3, "cleaningStuckAfterSeconds": 5},
    # The journeys' clients speak PLAINTEXT, as e2e/journey.sh's do.
    "security": {"enabled": False},
}


def record(cluster: KubeCluster, name: str, figures: dict[str, Any]) -> None:
    print(f"{name}: {json.dumps(figures)}")
    with open(cluster.directory / "journeys.json", "a") as out:
        out.write(json.dumps({"journey": name, **figures}) + "\n")


@pytest.fixture(scope="module")
def release(kube_cluster: KubeCluster, tmp_path_factory) -> Iterator[Release]:
    record(kube_cluster, "cluster start (s)", {k: round(v, 1) for k, v in kube_cluster.timings.items()})
    started = time.monotonic()
    shale = Release(kube_cluster, tmp_path_factory.mktemp("release"), values=VALUES).install()
    ready = shale.wait_ready(storage=3)
    record(kube_cluster, "install", {"helm install to every pod Ready (s)": round(time.monotonic() - started, 1),
                                     "wait (s)": round(ready, 1)})
    yield shale
    record(kube_cluster, "resident memory (MiB)", kube_cluster.resident_memory())


def in_sync(release: Release, topic: str, replicas: int = 3) -> dict[str, Any]:
    """Each partition's leader and ISR, once every partition has a leader and `replicas` in its ISR."""
    deadline = time.monotonic() + 120
    while True:
        described = release.client("describe", "--bootstrap", release.bootstrap, "--topic", topic)
        partitions = described.get("partitions", {})  # none while the nodes do not know the topic yet
        if partitions and all(p["leader"] >= 0 and len(p["isr"]) >= replicas for p in partitions.values()):
            return partitions
        if time.monotonic() > deadline:
            raise AssertionError(f"{topic}: replicas not in sync after 120 s: {described}\n{release.diagnose()}")
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
    # The chart's security context, as the kubelet applied it: user 10001, a read-only root, the volume writable.
    pod = f"{release.fullname}-storage-0"
    check = ("import os; root = [m.split()[3].split(',')[0] for m in open('/proc/mounts') if m.split()[1] == '/']; "
             "print(os.getuid(), root[-1], os.access('/var/lib/shale/data', os.W_OK))")
    assert release.kubectl("exec", pod, "--", "python", "-c", check).stdout.split() == ["10001", "ro", "True"]
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


def _pod_http(release: Release, pod: str, path: str) -> dict[str, Any]:
    """POST to a storage pod's HTTP port at its pod IP (the host reaches pods over the bridge)."""
    ip = json.loads(release.kubectl("get", "pod", pod, "-o", "json").stdout)["status"]["podIP"]
    request = urllib.request.Request(f"http://{ip}:8080{path}", method="POST")
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())


def test_stuck_cleaning_alert_fires_at_the_webhook_and_resolves(release: Release, tmp_path: Path):
    """Prometheus scrapes the storage pods the chart's ServiceMonitor selects (through the API server's
    Endpoints, as prometheus-operator would translate it) and evaluates the chart's PrometheusRule; a partition's cleaning
    paused through the documented HTTP call past a shortened threshold makes ShaleCleaningPausedTooLong arrive
    at Alertmanager's webhook, and a resolved notification follow the resume. The operator's CleaningStuck
    condition agrees both ways. Then a log dir filled for real: a topic's records past half of every storage
    pod's volume make ShaleDiskAlmostFull (of the storage family) fire for each pod, and deleting the topic
    resolves it."""
    in_sync(release, TOPIC)
    values = {**VALUES, "metrics": {"serviceMonitor": {"enabled": True}, "prometheusRule": {
        "enabled": True, "thresholds": {"cleaningPausedSeconds": 5, "diskFreeRatio": 0.5}}}}
    rendered = objects(render(values, namespace=release.namespace, release=release.name))
    monitor = next(o for o in rendered if o["kind"] == "ServiceMonitor" and
                   o["metadata"]["labels"]["app.kubernetes.io/component"] == "storage")
    client = release.cluster.client()
    targets = monitor_targets(monitor, *(client.sanitize_for_serialization(items) for items in (
        CoreV1Api(client).list_namespaced_service(release.namespace).items,
        CoreV1Api(client).list_namespaced_endpoints(release.namespace).items)))
    assert [t["labels"]["pod"] for t in targets] == [f"{release.fullname}-storage-{i}" for i in range(3)]
    (tmp_path / "targets.json").write_text(json.dumps(targets))
    monitoring = Monitoring(tmp_path / "monitoring", [scrape_job(monitor, tmp_path / "targets.json")],
                            rules_for_test(one(rendered, "PrometheusRule")["spec"]),
                            ports=(free_port(), free_port(), free_port())).start()
    try:
        monitoring.wait_for_targets(3)
        pod = f"{release.fullname}-storage-1"
        paused_at = time.monotonic()
        assert _pod_http(release, pod, f"/partitions/{TOPIC}/0/pause?owner=journey")["pause_count"] == 1
        firing = monitoring.webhook.wait_for(
            lambda n: n.status == "firing" and n.labels.get("alertname") == "ShaleCleaningPausedTooLong"
            and (n.labels["pod"], n.labels["topic"], n.labels["partition"]) == (pod, TOPIC, "0"),
            "ShaleCleaningPausedTooLong firing")
        assert firing.labels["namespace"] == release.namespace and firing.labels["severity"] == "warning"
        assert f"{TOPIC}-0 on {pod}" in firing.annotations["summary"]
        stuck = _wait_condition(release, "CleaningStuck", "True")
        assert f"partition 0 on pod {pod}: cleaning paused" in stuck["message"]

        resumed_at = time.monotonic()
        _pod_http(release, pod, f"/partitions/{TOPIC}/0/resume?owner=journey")
        monitoring.webhook.wait_for(
            lambda n: n.status == "resolved" and n.labels.get("alertname") == "ShaleCleaningPausedTooLong"
            and n.labels["pod"] == pod and n.received > resumed_at, "ShaleCleaningPausedTooLong resolved")
        resolved = time.monotonic()
        _wait_condition(release, "CleaningStuck", "False")

        disk = _fill_and_free(release, monitoring)
    except AssertionError as failure:
        raise AssertionError(f"{failure}\n--- prometheus ---\n{monitoring.log('prometheus')}\n"
                             f"--- alertmanager ---\n{monitoring.log('alertmanager')}") from None
    finally:
        monitoring.stop()
    record(release.cluster, "alerts", {"pause to firing at the webhook (s)": round(firing.received - paused_at, 1),
                                       "resume to resolved at the webhook (s)": round(resolved - resumed_at, 1),
                                       **disk})


def _fill_and_free(release: Release, monitoring: Monitoring) -> dict[str, Any]:
    """ShaleDiskAlmostFull fired for every storage pod by a topic filling 5/8 of each one's volume, then resolved by
    the topic's deletion; the figures."""
    fill, pods = "journey-fill", {f"{release.fullname}-storage-{i}" for i in range(3)}
    release.apply({"apiVersion": "shale.dev/v1alpha1", "kind": "Topic", "metadata": {"name": fill},
                   "spec": {"partitions": 1, "replicas": 3, "config": {
                       "cleanup.policy": "delete", "segment.bytes": 8 << 20, "file.delete.delay.ms": 1000}}})
    release.wait_topic(fill)
    started = time.monotonic()
    filled = release.client("fill", "--bootstrap", release.bootstrap, "--topic", fill,
                            "--mib", str(SMALL_VOLUME_MIB * 5 // 8), "--record-kib", "256")
    assert filled["errors"] == [] and filled["acked_bytes"] == SMALL_VOLUME_MIB * 5 // 8 << 20, filled

    def disk_alerts(status: str, since: float) -> set[str]:
        return {n.labels["pod"] for n in monitoring.webhook.notifications if n.status == status
                and n.labels.get("alertname") == "ShaleDiskAlmostFull" and n.received > since}

    monitoring.webhook.wait_for(lambda n: disk_alerts("firing", started) == pods, "ShaleDiskAlmostFull for every pod")
    fired = time.monotonic()
    firing = [n for n in monitoring.webhook.notifications if n.labels.get("alertname") == "ShaleDiskAlmostFull"]
    assert all(n.labels["severity"] == "critical" for n in firing)
    deleted = time.monotonic()
    release.kubectl("delete", "topic", fill)
    monitoring.webhook.wait_for(lambda n: disk_alerts("resolved", deleted) == pods, "ShaleDiskAlmostFull resolved")
    return {"fill (MiB)": filled["acked_bytes"] >> 20, "fill start to disk alert for every pod (s)": round(fired - started, 1),
            "topic deleted to resolved (s)": round(time.monotonic() - deleted, 1)}


def _wait_condition(release: Release, kind: str, status: str, timeout: float = 60) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        found = TopicView.of(release.topic(TOPIC)).condition(kind)
        if found.get("status") == status:
            return dict(found)
        assert time.monotonic() < deadline, f"Topic {TOPIC}: {kind} is not {status} after {timeout:.0f}s: {found}"
        time.sleep(1)


def test_operator_deleted_mid_reconcile_and_apiserver_restarted(release: Release):
    """A new Topic applied, the operator's pod deleted before it can finish, kube-apiserver SIGKILLed and
    started again: the new operator converges (the Topic Ready, every replica in sync, the first Topic
    untouched) and the topic's manifest is written into the topics ConfigMap exactly once."""
    in_sync(release, TOPIC)
    name, api = "journey-second", release.cluster.apiserver
    operator = release.pods("operator")[0]["metadata"]["name"]
    account = f"system:serviceaccount:{release.namespace}:{release.fullname}-operator"
    applied = datetime.datetime.now(datetime.timezone.utc)
    release.apply({"apiVersion": "shale.dev/v1alpha1", "kind": "Topic", "metadata": {"name": name},
                   "spec": {"partitions": 2, "replicas": 3, "config": {"cleanup.policy": "compact"}}})
    release.kubectl("delete", "pod", operator, "--wait=false")
    # The API server dies while the replacement starts and reconciles. (Killed before the ReplicaSet controller
    # has created the replacement, it backs that sync off exponentially: ~3 min of v1.20's controller-manager
    # waiting, measured here, which is Kubernetes' behaviour, not the operator's.)
    deadline = time.monotonic() + 60
    while not [p for p in release.pods("operator") if p["metadata"]["name"] != operator]:
        assert time.monotonic() < deadline, release.diagnose()
        time.sleep(0.2)
    api.kill_apiserver()
    api.start_apiserver()
    started = time.monotonic()
    release.wait_ready(storage=3)
    release.wait_topic(name, timeout=240)
    converged = time.monotonic() - started
    partitions = in_sync(release, name)
    assert sorted(partitions) == ["0", "1"]
    release.wait_topic(TOPIC)
    writes = [e for e in api.responses(account)
              if e["verb"] in ("create", "patch", "update") and e["objectRef"].get("resource") == "configmaps"
              and e["objectRef"].get("name") == f"{release.fullname}-topics"
              and e["responseStatus"]["code"] < 300 and _at(e) > applied]
    assert len(writes) == 1, [(e["verb"], e["stageTimestamp"], e["user"]["username"]) for e in writes]
    record(release.cluster, "operator deleted and API server restarted",
           {"API server back to the Topic Ready (s)": round(converged, 1)})


def _at(event: dict[str, Any]) -> datetime.datetime:
    return datetime.datetime.fromisoformat(event["stageTimestamp"].replace("Z", "+00:00"))


def _stored(release: Release) -> dict[tuple[int, int], tuple[str, str]]:
    """Every record of the topic now, by (partition, offset)."""
    consumed = release.client("consume", "--bootstrap", release.bootstrap, "--topic", TOPIC)
    assert consumed["complete"], consumed["ends"]
    return {(p, o): (k, v) for k, v, p, o in consumed["records"]}


def _pods_by_node(release: Release) -> dict[str, dict[str, int]]:
    """Each node's storage pods and client pod, with their containers' restarts: {node: {pod: restarts}}."""
    pods = release.pods("storage") + [json.loads(release.kubectl("get", "pod", release.client_pod(), "-o", "json").stdout)]
    found: dict[str, dict[str, int]] = {}
    for pod in pods:
        found.setdefault(pod["spec"]["nodeName"], {})[pod["metadata"]["name"]] = sum(
            c["restartCount"] for c in pod["status"].get("containerStatuses", ()))
    return found


def test_node_restart_with_every_process_killed(release: Release):
    """The node of the first storage pod: its kubelet, containerd, kube-proxy, shims and every container SIGKILLed
    at once, then started again: its pods come back on their volumes, the other nodes' pods are untouched, every
    acknowledged record is there, every replica in sync."""
    in_sync(release, TOPIC)
    produced = release.client("produce", "--bootstrap", release.bootstrap, "--topic", TOPIC,
                              "--keys", "10", "--updates", "5")
    assert produced["errors"] == [] and len(produced["acked"]) == 50
    before = _stored(release)
    restarts = _pods_by_node(release)
    first = release.pods("storage")[0]
    node = next(n for n in release.cluster.nodes if n.name == first["spec"]["nodeName"])

    started = time.monotonic()
    release.cluster.restart_node(node)
    node_ready = time.monotonic() - started
    # The pods' statuses say Running until the kubelet has looked again: wait until it restarted each one.
    deadline = time.monotonic() + 240
    while True:
        after_pods = _pods_by_node(release)
        if after_pods.keys() == restarts.keys() and all(after_pods[node.name][n] > c
                                                        for n, c in restarts[node.name].items()):
            break
        assert time.monotonic() < deadline, f"{node.name}'s containers not restarted: {restarts} -> {after_pods}"
        time.sleep(1)
    assert {n: p for n, p in after_pods.items() if n != node.name} == \
        {n: p for n, p in restarts.items() if n != node.name}, "a container of another node restarted"
    release.wait_ready(storage=3, timeout=300)
    pods_ready = time.monotonic() - started
    in_sync(release, TOPIC)

    after = _stored(release)
    lost = {position: record for position, record in before.items() if after.get(position) != record}
    assert not lost, f"{len(lost)} records lost or changed, first {list(lost.items())[:5]}"
    record(release.cluster, "node restart", {"node": node.name, "its pods": sorted(restarts[node.name]),
                                             "kill to node Ready (s)": round(node_ready, 1),
                                             "kill to every pod Ready (s)": round(pods_ready, 1),
                                             "records checked": len(before)})


def test_uninstall_keeps_the_data_and_a_reinstall_serves_it(release: Release):
    """`helm uninstall` leaves the PersistentVolumeClaims (and the Topics) in place, as docs/kubernetes.md says;
    `helm install` of the same release again serves the same records at the same offsets, every replica in sync."""
    in_sync(release, TOPIC)
    before = _stored(release)
    release.helm("uninstall", release.name, "--wait", "--timeout", "180s", timeout=240)
    deadline = time.monotonic() + 180
    while release.pods("storage") or release.pods("operator"):
        assert time.monotonic() < deadline, release.diagnose()
        time.sleep(1)
    claims = json.loads(release.kubectl("get", "pvc", "-l", f"app.kubernetes.io/instance={release.name}",
                                        "-o", "json").stdout)["items"]
    assert sorted(c["metadata"]["name"] for c in claims) == [f"data-{release.fullname}-storage-{i}" for i in range(3)]
    assert all(c["status"]["phase"] == "Bound" for c in claims)
    assert release.topic(TOPIC)["metadata"]["name"] == TOPIC  # a Topic is not part of the release

    started = time.monotonic()
    release.install()
    release.wait_ready(storage=3)
    # The Topic's Ready=True is the old operator's until the new one refreshes it: the nodes' own Metadata says
    # when they serve the topic again, every replica back in its ISR.
    in_sync(release, TOPIC)
    settled = time.monotonic() - started
    after = _stored(release)
    assert after == before
    record(release.cluster, "uninstall and install", {"install to every replica in sync (s)": round(settled, 1),
                                                      "records": len(after)})
