"""The operator on a real kube-apiserver, logged in as the chart's service account with exactly the chart's
Roles, driving two real `shale serve` pods: the journeys tests/operator runs on kmock, where the real
server's defaulting, pruning, status subresource, resourceVersion conflicts, RBAC and watches apply.
After each journey the audit log must hold no request of the operator's that the server refused.
"""

from __future__ import annotations

import time

import pytest

from shale.operator.configmap import TopicsConfigMap
from shale.operator.manifests import PLACEHOLDER_KEY, configmap_key
from support.apiserver_util import Release
from support.chart_util import one
from support.cluster_util import REFRESH_SECONDS, Cluster, produce
from support.kube_apiserver import ApiServer
from support.node_util import wait_for


def operator_user(release: Release) -> str:
    return f"system:serviceaccount:{release.namespace}:{release.service_account}"


@pytest.fixture(autouse=True)
def nothing_refused(apiserver: ApiServer, release: Release):
    """After the test (the operator stopped): no request of the operator's was refused (401, 403, 422)."""
    yield
    user = operator_user(release)
    responses = apiserver.responses(user)
    assert responses, f"no request of {user} in the audit log"
    refused = sorted({(e["verb"], e["requestURI"].split("?")[0], e["responseStatus"]["code"]) for e in responses
                      if e["responseStatus"]["code"] in (401, 403, 422)})
    assert refused == [], f"the server refused the operator: {refused}"


def test_create_then_config_change_reaches_ready_at_the_new_generation(cluster: Cluster, release: Release):
    sts = one(release.objects, "StatefulSet")["metadata"]["name"]
    created = cluster.create_topic("orders", 3, {"cleanup.policy": "compact"})
    cond = cluster.wait_condition("orders", "Ready", "True", "PartitionsServed", timeout=40)
    assert cond["observedGeneration"] == created["metadata"]["generation"] == 1
    topic = cluster.topic("orders")
    assert topic["metadata"]["finalizers"] == ["shale.dev/topic-operator"]
    manifest = cluster.manifest("orders")
    assert manifest["metadata"]["uid"] == created["metadata"]["uid"]
    assert manifest["spec"]["assignment"]["partitions"] == [0, 1, 0]

    produce(cluster.storage.nodes[0].bootstrap, "orders", {0: 4, 1: 2, 2: 1})
    status = wait_for(lambda: (s := cluster.topic("orders")["status"]) and
                      [p.get("logEndOffset") for p in s.get("partitions", ())] == [4, 2, 1] and s,
                      30, what="the produced offsets in the status")
    assert [p["pod"] for p in status["partitions"]] == [f"{sts}-0", f"{sts}-1", f"{sts}-0"]
    assert status["diskUsageBytes"] == sum(p["sizeBytes"] for p in status["partitions"]) > 0

    cluster.patch_topic("orders", {"spec": {"config": {"retention.ms": "60000"}}})
    assert cluster.topic("orders")["metadata"]["generation"] == 2
    wait_for(lambda: cluster.condition("orders", "Ready").get("observedGeneration") == 2, 40,
             what="Ready at generation 2")
    assert cluster.condition("orders", "Ready")["status"] == "True"
    assert cluster.manifest("orders")["spec"]["config"] == {"cleanup.policy": "compact", "retention.ms": "60000"}
    assert cluster.node_status(0)["topics"]["orders"]["partitions"][0]["log_end_offset"] == 4  # nothing lost


def test_invalid_config_and_a_partition_decrease_are_refused_with_warning_events(cluster: Cluster):
    # Each value passes the server's OpenAPI validation (test_apiserver_crd.py: what it refuses itself);
    # the pair does not, which only the operator can tell.
    cluster.create_topic("bad", 1, {"min.compaction.lag.ms": "600000", "max.compaction.lag.ms": "1000"})
    cond = cluster.wait_condition("bad", "Ready", "False", "InvalidConfig", timeout=40)
    assert "min.compaction.lag.ms (600000) > max.compaction.lag.ms (1000)" in cond["message"]
    events = wait_for(lambda: cluster.events("bad"), what="the InvalidConfig Event")  # created under the chart's RBAC
    assert events == [("Warning", "InvalidConfig", cond["message"])]
    assert cluster.manifest("bad") is None

    # 1.20 has no CEL, so the CRD's "never decrease" rule is not there: the operator is the guard.
    cluster.create_topic("shrink", 3)
    cluster.wait_condition("shrink", "Ready", "True", timeout=40)
    before = cluster.configmap_data()
    cluster.patch_topic("shrink", {"spec": {"partitions": 2}})
    cond = cluster.wait_condition("shrink", "Ready", "False", "NotSupported", timeout=40)
    assert "cannot be decreased from 3 to 2" in cond["message"] and cond["observedGeneration"] == 2
    time.sleep(3 * REFRESH_SECONDS)
    assert cluster.configmap_data() == before
    assert ("Warning", "NotSupported", cond["message"]) in cluster.events("shrink")


def test_pause_annotation_then_deletion_through_the_finalizer(cluster: Cluster):
    cluster.create_topic("frozen", 1)
    cluster.create_topic("doomed", 2)
    cluster.wait_condition("frozen", "Ready", "True", timeout=40)
    cluster.wait_condition("doomed", "Ready", "True", timeout=40)
    cluster.patch_topic("frozen", {"metadata": {"annotations": {"shale.dev/paused-reconciliation": "true"}}})
    cluster.wait_condition("frozen", "ReconciliationPaused", "True")
    before = cluster.manifest("frozen")
    cluster.patch_topic("frozen", {"spec": {"partitions": 2}})
    time.sleep(3 * REFRESH_SECONDS)
    assert cluster.manifest("frozen") == before  # nothing applied while paused
    cluster.patch_topic("frozen", {"metadata": {"annotations": {"shale.dev/paused-reconciliation": None}}})
    wait_for(lambda: cluster.manifest("frozen")["spec"]["partitions"] == 2, 30, what="the change applied on resume")

    # Deletion: the server keeps the Topic (deletionTimestamp set) until the operator removes its finalizer.
    cluster.delete_topic("doomed")
    wait_for(lambda: cluster.topic("doomed") is None, 30, what="the finalizer removed and the Topic gone")
    assert set(cluster.configmap_data()) == {configmap_key(cluster.namespace, "frozen"), PLACEHOLDER_KEY}
    for n in (0, 1):
        wait_for(lambda: "doomed" not in cluster.node_status(n)["topics"], 30, what=f"the topic deleted on pod {n}")


def test_a_concurrent_configmap_writer_gets_a_real_409_and_the_change_is_recomputed(cluster: Cluster,
                                                                                    release: Release):
    """The operator's read-modify-write, as its service account, against a writer who gets in between."""
    token = cluster.apiserver.service_account_token(release.namespace, release.service_account)
    configmap = TopicsConfigMap(cluster.apiserver.client(token), cluster.storage_namespace, cluster.configmap)
    seen = []

    def compute(current):
        seen.append(dict(current.data))
        if len(seen) == 1:  # an administrator writes between the read and the patch
            cluster.core.patch_namespaced_config_map(cluster.configmap, cluster.storage_namespace,
                                                     {"data": {"other.yaml": "x"}})
        return {"mine.yaml": "y"}

    written = configmap.update(compute)
    assert len(seen) == 2 and "other.yaml" not in seen[0] and seen[1]["other.yaml"] == "x"
    assert written.data["other.yaml"] == "x" and written.data["mine.yaml"] == "y"
    conflicts = [e for e in cluster.apiserver.responses(operator_user(release))
                 if e["responseStatus"]["code"] == 409 and e["objectRef"].get("name") == cluster.configmap]
    assert len(conflicts) == 1  # the server's own precondition failure, then one successful retry
