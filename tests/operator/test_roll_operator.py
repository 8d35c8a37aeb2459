"""The operator's roll against kmock with two real `shale serve` pods (no control store, so no ISR holds it).

The test plays the StatefulSet controller's part under `OnDelete`: it moves `status.updateRevision` and
recreates each evicted pod at the new revision. The operator evicts one pod at a time through the Eviction
API, waits while a pod is missing or not Ready, reports a roll stuck, replaces a crash-looping pod first once
the template is fixed, and owns a PDB whose budget it sets. The rule itself is tests/operator/test_roll_rules.py.
"""

from __future__ import annotations

import kubernetes

from support.cluster_util import STORAGE_NS, Cluster, storage_objects
from support.node_util import wait_for

REVISION = "controller-revision-hash"


def roll_to(cluster: Cluster, revision: str) -> None:
    """A new pod template: the StatefulSet's updateRevision moves, and the operator owns the roll (OnDelete)."""
    kubernetes.client.AppsV1Api(cluster.api).patch_namespaced_stateful_set("shale", STORAGE_NS, {
        "spec": {"updateStrategy": {"type": "OnDelete"}}, "status": {"replicas": 2, "updateRevision": revision}})


def set_pod(cluster: Cluster, ordinal: int, revision: str, ready: bool = True) -> None:
    """The pod at `revision` (created again if evicted, as the StatefulSet controller does) and its Ready."""
    core = kubernetes.client.CoreV1Api(cluster.api)
    patch = {"metadata": {"labels": {REVISION: revision}},
             "status": {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}}
    if f"shale-{ordinal}" not in {p.metadata.name for p in core.list_namespaced_pod(STORAGE_NS).items}:
        _, pods = storage_objects(cluster.storage.nodes)
        core.create_namespaced_pod(STORAGE_NS, pods[ordinal])
    core.patch_namespaced_pod(f"shale-{ordinal}", STORAGE_NS, patch)


def evicted(cluster: Cluster) -> list[str]:
    assert cluster.apiserver.server is not None
    return list(cluster.apiserver.server.evicted)


def metric(cluster: Cluster, name: str) -> float:
    return float(next(x for x in cluster.metrics().splitlines() if x.startswith(name + " ")).split()[1])


def statefulset_events(cluster: Cluster) -> list[tuple[str, str, str]]:
    items = cluster.core.list_namespaced_event(STORAGE_NS).items
    return [(e.type, e.reason, e.message) for e in items if e.involved_object.kind == "StatefulSet"]


def test_the_roll_evicts_one_pod_at_a_time_and_owns_the_pdb(cluster: Cluster):
    policy = kubernetes.client.PolicyV1Api(cluster.api)
    for ordinal in (0, 1):
        set_pod(cluster, ordinal, "rev-a")
    roll_to(cluster, "rev-a")  # OnDelete, nothing outdated: the PDB only
    pdb = wait_for(lambda: next(iter(policy.list_namespaced_pod_disruption_budget(STORAGE_NS).items), None), 20,
                   what="the operator's PDB")
    sts = kubernetes.client.AppsV1Api(cluster.api).read_namespaced_stateful_set("shale", STORAGE_NS)
    assert pdb.spec.max_unavailable == 1 and pdb.metadata.labels["app.kubernetes.io/managed-by"] == "shale-operator"
    assert [(o.kind, o.uid) for o in pdb.metadata.owner_references] == [("StatefulSet", sts.metadata.uid)]
    assert evicted(cluster) == []

    roll_to(cluster, "rev-b")
    wait_for(lambda: evicted(cluster) == ["shale-1"], 20, what="the highest ordinal evicted first")
    wait_for(lambda: metric(cluster, "shale_operator_roll_outdated_pods") == 1, 20, what="one pod left to roll")
    assert evicted(cluster) == ["shale-1"]  # shale-1 is missing: the roll waits for it
    set_pod(cluster, 1, "rev-b", ready=False)
    wait_for(lambda: metric(cluster, "shale_operator_roll_outdated_pods") == 1, 20, what="the new pod seen")
    assert evicted(cluster) == ["shale-1"]  # not Ready yet: still waiting
    set_pod(cluster, 1, "rev-b")
    wait_for(lambda: evicted(cluster) == ["shale-1", "shale-0"], 20, what="the next pod evicted once shale-1 is Ready")
    set_pod(cluster, 0, "rev-b")
    wait_for(lambda: metric(cluster, "shale_operator_roll_outdated_pods") == 0, 20, what="the roll done")
    assert metric(cluster, "shale_operator_roll_evictions_total") == 2
    reasons = [reason for _, reason, _ in wait_for(
        lambda: (lambda e: e if len(e) >= 2 else None)(statefulset_events(cluster)), 20, what="the Events")]
    assert reasons == ["RollEvicted", "RollEvicted"]


def test_a_stuck_roll_is_reported_and_a_fixed_template_replaces_the_unready_pod_first(cluster: Cluster):
    set_pod(cluster, 0, "rev-a")
    set_pod(cluster, 1, "rev-b", ready=False)  # the last roll's pod crash-loops on the bad revision
    roll_to(cluster, "rev-b")
    wait_for(lambda: metric(cluster, "shale_operator_roll_stuck") == 1, 20, what="the roll reported stuck")
    (warning,) = wait_for(lambda: [e for e in statefulset_events(cluster) if e[1] == "RollStuck"], 20,
                          what="the RollStuck Event")
    assert warning[0] == "Warning" and "pod shale-1 is not Ready" in warning[2]
    assert evicted(cluster) == []

    roll_to(cluster, "rev-c")  # the template fixed
    wait_for(lambda: evicted(cluster) == ["shale-1"], 20, what="the unready outdated pod replaced first")
    wait_for(lambda: metric(cluster, "shale_operator_roll_stuck") == 0, 20, what="no longer stuck")


def test_a_refused_eviction_waits(cluster: Cluster):
    cluster.apiserver.refuse("CREATE", "pods/eviction", 429)  # the PDB allows no disruption now (a drain took a pod)
    for ordinal in (0, 1):
        set_pod(cluster, ordinal, "rev-a")
    roll_to(cluster, "rev-b")
    wait_for(lambda: metric(cluster, "shale_operator_roll_stuck") == 1, 20, what="the refused roll reported stuck")
    assert evicted(cluster) == []
    cluster.apiserver.allow("CREATE", "pods/eviction")
    wait_for(lambda: evicted(cluster) == ["shale-1"], 20, what="the eviction once the budget allows it")

