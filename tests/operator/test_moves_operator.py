"""The operator's side of scale-ins against kmock with two real `shale serve` pods (no control store).

Without replication no replica can move, so these are the refusals and the holds: a `spec.replicas` lowered
below a pod that holds a partition is put back and recorded as the scale-in target, the Topic says why it
cannot be drained (condition and Warning Event), and the target is applied as soon as the pods going hold
nothing. The moves themselves run against store-backed pods in tests/apiserver/test_moves_on_apiserver.py.
"""

from __future__ import annotations

import kubernetes

from support.cluster_util import STORAGE_NS, Cluster
from support.node_util import wait_for

ANNOTATION = "shale.dev/scale-in-to"


def statefulset(cluster: Cluster) -> tuple[int, str | None]:
    sts = kubernetes.client.AppsV1Api(cluster.api).read_namespaced_stateful_set("shale", STORAGE_NS)
    return sts.spec.replicas, (sts.metadata.annotations or {}).get(ANNOTATION)


def scale_in_target(cluster: Cluster) -> float:
    line = next(x for x in cluster.metrics().splitlines() if x.startswith("shale_operator_scale_in_target "))
    return float(line.split()[1])


def test_a_scale_in_that_would_lose_an_unreplicated_partition_is_put_back_and_refused(cluster: Cluster):
    cluster.create_topic("orders", 2)
    cluster.wait_condition("orders", "Ready", "True")
    assert cluster.manifest("orders")["spec"]["assignment"]["partitions"] == [0, 1]
    reassigning = cluster.wait_condition("orders", "Reassigning", "False", "NoMoves")
    assert reassigning["message"] == "no partition is moving between pods"

    apps = kubernetes.client.AppsV1Api(cluster.api)
    apps.patch_namespaced_stateful_set("shale", STORAGE_NS, {"spec": {"replicas": 1}})  # kubectl scale --replicas 1
    wait_for(lambda: statefulset(cluster) == (2, "1"), 20, what="the scale-in put back and recorded")
    blocked = cluster.wait_condition("orders", "ScaleInBlocked", "True", "ScaleInRefused")
    assert ("cannot be scaled in to 1: partition 1: its only copies are on leaving pod(s) [1] and the topic is not "
            "replicated") in blocked["message"]
    assert ("Warning", "ScaleInRefused", blocked["message"]) in cluster.events("orders")
    assert scale_in_target(cluster) == 1
    # Held, not applied: the partition keeps its pod and stays served there.
    assert cluster.manifest("orders")["spec"]["assignment"]["partitions"] == [0, 1]
    assert cluster.condition("orders", "Ready")["status"] == "True"
    wait_for(lambda: statefulset(cluster) == (2, "1"), 5, what="the hold to stay")

    # Cancelled by removing the annotation: the condition goes, the gauge says no scale-in waits.
    apps.patch_namespaced_stateful_set("shale", STORAGE_NS, {"metadata": {"annotations": {ANNOTATION: None}}})
    wait_for(lambda: cluster.condition("orders", "ScaleInBlocked") == {}, 20, what="ScaleInBlocked removed")
    assert statefulset(cluster) == (2, None)


def test_a_scale_in_whose_leaving_pods_hold_nothing_is_applied(cluster: Cluster):
    cluster.create_topic("single", 1)
    cluster.wait_condition("single", "Ready", "True")
    assert cluster.manifest("single")["spec"]["assignment"]["partitions"] == [0]
    apps = kubernetes.client.AppsV1Api(cluster.api)
    apps.patch_namespaced_stateful_set("shale", STORAGE_NS, {"metadata": {"annotations": {ANNOTATION: "1"}}})
    wait_for(lambda: statefulset(cluster) == (1, None), 20, what="the StatefulSet scaled to 1 by the operator")
    assert scale_in_target(cluster) == -1
    assert cluster.condition("single", "ScaleInBlocked") == {}
    # A new partition now goes to pod 0 only.
    cluster.patch_topic("single", {"spec": {"partitions": 2}})
    wait_for(lambda: cluster.manifest("single")["spec"]["assignment"]["partitions"] == [0, 0], 20,
             what="partition 1 placed on the one pod left")
