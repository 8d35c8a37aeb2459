"""The operator end to end: Topic resources in kmock's API server → ConfigMap → real `shale serve` pods → status."""

from __future__ import annotations

import json
import time
import urllib.request

import kubernetes

from shale.operator.manifests import PLACEHOLDER_KEY, PLACEHOLDER_TEXT, configmap_key, loaded_digest
from support.cluster_util import (
    CRD_SCHEMA,
    REFRESH_SECONDS,
    STORAGE_NS,
    Cluster,
    OperatorThread,
    crd_errors,
    describe,
    produce,
    unknown_fields,
)
from support.node_util import wait_for


def test_a_topic_is_created_on_the_pods_served_and_reported_ready(cluster: Cluster):
    created = cluster.create_topic("orders", 3, {"cleanup.policy": "compact", "segment.ms": 600000})
    uid = created["metadata"]["uid"]

    manifest = wait_for(lambda: cluster.manifest("orders"), what="the Topic's ConfigMap key")
    nodes = cluster.storage.nodes
    assert manifest["metadata"] == {"name": "orders", "namespace": "default", "uid": uid}
    assert manifest["spec"]["topicName"] == "orders"
    assert manifest["spec"]["config"] == {"cleanup.policy": "compact", "segment.ms": "600000"}
    assert manifest["spec"]["assignment"] == {
        "partitions": [0, 1, 0],  # new partitions to the least loaded pod, ties to the lowest ordinal
        "nodes": {"0": f"127.0.0.1:{nodes[0].port}", "1": f"127.0.0.1:{nodes[1].port}"}}
    # The Topic's key, and the placeholder that lets the pods take the removal of the last key as a deletion.
    assert cluster.configmap_data() == {configmap_key("default", "orders"): cluster.configmap_data()[
        configmap_key("default", "orders")], PLACEHOLDER_KEY: PLACEHOLDER_TEXT}

    cluster.wait_condition("orders", "Ready", "True", "PartitionsServed")
    produce(nodes[1].bootstrap, "orders", {0: 5, 1: 7, 2: 3})  # Metadata sends the client to each pod

    def reported() -> dict | None:
        status = cluster.topic("orders")["status"]
        ends = [p.get("logEndOffset") for p in status["partitions"]]
        return status if ends == [5, 7, 3] else None

    status = wait_for(reported, 20, what="the produced offsets in the Topic's status")
    assert status["observedGeneration"] == cluster.topic("orders")["metadata"]["generation"]
    assert status["topicName"] == "orders"
    assert [(p["partition"], p["pod"]) for p in status["partitions"]] == [(0, "shale-0"), (1, "shale-1"),
                                                                           (2, "shale-0")]
    for p in status["partitions"]:
        assert p["logStartOffset"] == 0 and p["sizeBytes"] > 100 * 3
        assert p["cleaningState"] in ("idle", "in-progress") and "cleaningSince" in p
        assert 0 <= p["dirtyRatio"] <= 1  # a compacted topic reports its dirty ratio
    assert status["diskUsageBytes"] == sum(p["sizeBytes"] for p in status["partitions"])
    # What the status says is what the pods hold: the topic id is the Topic's uid.
    pod0 = cluster.node_status(0)["topics"]["orders"]["partitions"]
    assert [(e["partition"], e["log_end_offset"]) for e in pod0] == [(0, 5), (2, 3)]
    assert cluster.condition("orders", "CleaningStuck")["status"] == "False"

    assert 'shale_topic_ready{namespace="default",topic="orders"} 1.0' in cluster.metrics()
    with urllib.request.urlopen(cluster.operator.settings.liveness_endpoint, timeout=5) as response:
        assert response.status == 200


def test_a_config_change_reaches_the_pods_live(cluster: Cluster):
    cluster.create_topic("prices", 2, {"retention.ms": "600000"})
    cluster.wait_condition("prices", "Ready", "True")
    bootstrap = cluster.storage.nodes[0].bootstrap
    assert wait_for(lambda: describe(bootstrap, "prices")["retention.ms"] == "600000", what="retention.ms")
    generation = cluster.topic("prices")["metadata"]["generation"]

    cluster.patch_topic("prices", {"spec": {"config": {"retention.ms": 1234567, "max.message.bytes": "2000000"}}})
    wait_for(lambda: cluster.manifest("prices")["spec"]["config"] == {"retention.ms": "1234567",
                                                                     "max.message.bytes": "2000000"},
             what="the new config in the manifest")
    for node in cluster.storage.nodes:  # every pod applied it, without a restart
        wait_for(lambda: describe(node.bootstrap, "prices")["retention.ms"] == "1234567", what="live retention.ms")
        assert describe(node.bootstrap, "prices")["max.message.bytes"] == "2000000"
    wait_for(lambda: cluster.topic("prices")["status"]["observedGeneration"] == generation + 1,
             what="observedGeneration to follow the spec")
    # On a loaded machine the change handler may give up waiting for the pods first (Ready False, SpecNotLoaded);
    # a refresh then finds the new spec loaded.
    ready = cluster.wait_condition("prices", "Ready", "True")
    assert ready["observedGeneration"] == generation + 1


def test_ready_waits_until_every_pod_has_loaded_the_new_spec(cluster: Cluster):
    """Served partitions are not enough: Ready turns True only once the pods report the manifest just written."""
    cluster.create_topic("rates", 1, {"retention.ms": "600000"})  # one partition: one pod owns it, one does not
    cluster.wait_condition("rates", "Ready", "True")
    old = loaded_digest(cluster.configmap_data()[configmap_key("default", "rates")])
    assert [cluster.node_status(n)["topics"]["rates"]["spec_digest"] for n in (0, 1)] == [old, old]
    assert f"spec {old} loaded by every pod" in cluster.condition("rates", "Ready")["message"]

    with cluster.projection.held():  # the kubelet has not synced the pods' volume yet
        cluster.patch_topic("rates", {"spec": {"config": {"retention.ms": "1234567"}}})
        generation = cluster.topic("rates")["metadata"]["generation"]
        new = wait_for(lambda: (d := loaded_digest(cluster.configmap_data()[configmap_key("default", "rates")]))
                       != old and d, what="the new manifest in the ConfigMap")
        # The change handler gives up waiting after ready_wait_seconds (10 s) and reports what it saw.
        cond = cluster.wait_condition("rates", "Ready", "False", "SpecNotLoaded", timeout=40)
        assert cond["observedGeneration"] == generation
        assert cond["message"] == (f"the current spec ({new}) is not loaded yet: pod shale-0 has spec {old}; "
                                   f"pod shale-1 has spec {old}")
        time.sleep(3 * REFRESH_SECONDS)  # refreshes do not make it Ready while the pods run the old spec
        assert cluster.condition("rates", "Ready")["reason"] == "SpecNotLoaded"
        assert describe(cluster.storage.nodes[0].bootstrap, "rates")["retention.ms"] == "600000"
        assert 'shale_topic_ready{namespace="default",topic="rates"} 0.0' in cluster.metrics()

    cond = cluster.wait_condition("rates", "Ready", "True", "PartitionsServed")
    assert f"spec {new} loaded by every pod" in cond["message"]
    assert [cluster.node_status(n)["topics"]["rates"]["spec_digest"] for n in (0, 1)] == [new, new]
    for node in cluster.storage.nodes:
        assert describe(node.bootstrap, "rates")["retention.ms"] == "1234567"


def test_more_partitions_are_added_without_moving_the_existing_ones(cluster: Cluster):
    cluster.create_topic("wide", 3)  # nodes [0, 1, 0]: pod 0 holds 2 partitions, pod 1 one
    wait_for(lambda: cluster.manifest("wide"), what="wide's manifest")
    cluster.create_topic("narrow", 1)
    cluster.wait_condition("narrow", "Ready", "True")
    assert cluster.manifest("narrow")["spec"]["assignment"]["partitions"] == [1]  # the least loaded pod
    cluster.wait_condition("wide", "Ready", "True")
    produce(cluster.storage.nodes[0].bootstrap, "wide", {0: 4, 1: 4, 2: 4})

    cluster.patch_topic("wide", {"spec": {"partitions": 6}})
    # Load before: pod 0 has 2, pod 1 has 2 (wide's one + narrow's). New ones balance them.
    wait_for(lambda: cluster.manifest("wide")["spec"]["assignment"]["partitions"] == [0, 1, 0, 0, 1, 0],
             what="the new partitions' assignment")
    # Ready for the new generation: the old one's Ready=True stands until the operator has handled the patch.
    generation = cluster.topic("wide")["metadata"]["generation"]
    wait_for(lambda: (c := cluster.condition("wide", "Ready")).get("status") == "True"
             and c.get("observedGeneration") == generation, 20, what=f"Ready=True for generation {generation}")
    status = wait_for(lambda: (s := cluster.topic("wide")["status"]) and len(s["partitions"]) == 6
                      and all("logEndOffset" in p for p in s["partitions"]) and s, 20,
                      what="six partitions with their offsets in the status")
    assert [p["pod"] for p in status["partitions"]] == ["shale-0", "shale-1", "shale-0", "shale-0", "shale-1",
                                                        "shale-0"]
    # The old partitions kept their data (nothing moved); the new ones start empty.
    assert [p["logEndOffset"] for p in status["partitions"]] == [4, 4, 4, 0, 0, 0]


def test_invalid_config_is_reported_by_key_and_nothing_is_written(cluster: Cluster):
    cluster.create_topic("bad", 1, {"cleanup.policy": "compact", "retention.ms": "soon"})
    cond = cluster.wait_condition("bad", "Ready", "False", "InvalidConfig")
    assert "spec.config.retention.ms" in cond["message"] and "soon" in cond["message"]
    cluster.create_topic("unknown", 1, {"retention.msec": "1000"})
    cond = cluster.wait_condition("unknown", "Ready", "False", "InvalidConfig")
    assert "retention.msec" in cond["message"]
    assert cluster.configmap_data() == {}
    # `kubectl describe topic unknown` shows it as a Warning Event too, once (not on every refresh).
    events = wait_for(lambda: cluster.events("unknown"), what="a Warning Event on the Topic")
    time.sleep(3 * REFRESH_SECONDS)
    assert cluster.events("unknown") == events == [("Warning", "InvalidConfig", cond["message"])]
    assert 'shale_topic_ready{namespace="default",topic="bad"} 0.0' in cluster.metrics()

    # A valid Topic that turns invalid keeps its last good manifest on the pods.
    cluster.create_topic("good", 1, {"retention.ms": "60000"})
    cluster.wait_condition("good", "Ready", "True")
    before = cluster.configmap_data()
    cluster.patch_topic("good", {"spec": {"config": {"min.cleanable.dirty.ratio": "2.5"}}})
    cond = cluster.wait_condition("good", "Ready", "False", "InvalidConfig")
    assert "min.cleanable.dirty.ratio" in cond["message"]
    time.sleep(3 * REFRESH_SECONDS)  # a few status refreshes
    assert cluster.configmap_data() == before

    # Fixing the spec applies it.
    cluster.patch_topic("good", {"spec": {"config": {"min.cleanable.dirty.ratio": "0.3"}}})
    cluster.wait_condition("good", "Ready", "True")
    assert cluster.manifest("good")["spec"]["config"] == {"retention.ms": "60000", "min.cleanable.dirty.ratio": "0.3"}


def test_decreasing_partitions_is_not_supported(cluster: Cluster):
    cluster.create_topic("shrink", 3)
    cluster.wait_condition("shrink", "Ready", "True")
    before = cluster.configmap_data()
    cluster.patch_topic("shrink", {"spec": {"partitions": 2}})
    cond = cluster.wait_condition("shrink", "Ready", "False", "NotSupported")
    assert "cannot be decreased from 3 to 2" in cond["message"]
    assert cond["observedGeneration"] == cluster.topic("shrink")["metadata"]["generation"]
    time.sleep(3 * REFRESH_SECONDS)
    assert cluster.configmap_data() == before
    assert len(cluster.node_status(0)["topics"]["shrink"]["partitions"]) == 2  # partitions 0 and 2 still there


def test_deleting_a_topic_removes_its_key_and_the_topic_on_the_pods(cluster: Cluster):
    cluster.create_topic("doomed", 2)
    cluster.create_topic("kept", 1)
    cluster.wait_condition("doomed", "Ready", "True")
    cluster.wait_condition("kept", "Ready", "True")
    assert cluster.topic("doomed")["metadata"]["finalizers"] == ["shale.dev/topic-operator"]

    cluster.delete_topic("doomed")
    wait_for(lambda: cluster.topic("doomed") is None, what="the Topic to be gone (finalizer removed)")
    assert set(cluster.configmap_data()) == {configmap_key("default", "kept"), PLACEHOLDER_KEY}
    for n in (0, 1):  # the pods delete the topic Kafka's way
        wait_for(lambda: "doomed" not in cluster.node_status(n)["topics"], what=f"topic deleted on pod {n}")
    assert "doomed" not in cluster.metrics()

    # With the storage gone (StatefulSet, pods, ConfigMap: an uninstall that ran first), deleting a Topic still
    # completes: its finalizer is removed instead of leaving it (and its namespace) Terminating forever.
    kubernetes.client.AppsV1Api(cluster.api).delete_namespaced_stateful_set("shale", STORAGE_NS)
    for pod in ("shale-0", "shale-1"):
        cluster.core.delete_namespaced_pod(pod, STORAGE_NS)
    cluster.core.delete_namespaced_config_map("shale-topics", STORAGE_NS)
    cluster.wait_condition("kept", "Ready", "False", "StorageNotReady")  # the refresh sees it gone
    cluster.delete_topic("kept")
    wait_for(lambda: cluster.topic("kept") is None, what="the Topic to be gone without its storage")
    assert cluster.configmap_data() == {}  # and nothing was written back


def test_paused_and_unmanaged_topics_are_left_alone(cluster: Cluster):
    cluster.create_topic("frozen", 1, {"retention.ms": "60000"})
    cluster.wait_condition("frozen", "Ready", "True")
    cluster.patch_topic("frozen", {"metadata": {"annotations": {"shale.dev/paused-reconciliation": "true"}}})
    cluster.wait_condition("frozen", "ReconciliationPaused", "True")
    before = cluster.configmap_data()
    cluster.patch_topic("frozen", {"spec": {"partitions": 2, "config": {"retention.ms": "120000"}}})
    time.sleep(3 * REFRESH_SECONDS)
    assert cluster.configmap_data() == before  # nothing applied while paused

    # Deleting a paused Topic applies nothing either: its key, and so the topic on the pods, stays.
    cluster.create_topic("iced", 1)
    cluster.wait_condition("iced", "Ready", "True")
    cluster.patch_topic("iced", {"metadata": {"annotations": {"shale.dev/paused-reconciliation": "true"}}})
    cluster.wait_condition("iced", "ReconciliationPaused", "True")
    cluster.delete_topic("iced")
    wait_for(lambda: cluster.topic("iced") is None, what="the paused Topic to be gone")
    assert cluster.manifest("iced")["metadata"]["name"] == "iced"
    assert "iced" in cluster.node_status(0)["topics"]

    cluster.patch_topic("frozen", {"metadata": {"annotations": {"shale.dev/paused-reconciliation": None}}})
    wait_for(lambda: cluster.manifest("frozen")["spec"]["partitions"] == 2, what="the change applied on resume")
    assert cluster.manifest("frozen")["spec"]["config"] == {"retention.ms": "120000"}
    wait_for(lambda: cluster.condition("frozen", "ReconciliationPaused") == {}, what="the paused condition dropped")

    # Unmanaged: deleting the Topic keeps the topic and its data on the pods.
    cluster.patch_topic("frozen", {"metadata": {"annotations": {"shale.dev/managed": "false"}}})
    cluster.wait_condition("frozen", "Unmanaged", "True")
    cluster.delete_topic("frozen")
    wait_for(lambda: cluster.topic("frozen") is None, what="the unmanaged Topic to be gone")
    assert cluster.manifest("frozen")["spec"]["partitions"] == 2
    assert "frozen" in cluster.node_status(0)["topics"]


def test_a_partition_paused_too_long_sets_cleaning_stuck(cluster: Cluster):
    cluster.create_topic("latest", 2, {"cleanup.policy": "compact"})
    cluster.wait_condition("latest", "Ready", "True")
    owner = cluster.manifest("latest")["spec"]["assignment"]["partitions"][1]
    produce(cluster.storage.nodes[owner].bootstrap, "latest", {1: 10})

    paused = cluster.node_post(owner, "/partitions/latest/1/pause")
    assert paused["state"] == "paused"
    try:
        cond = cluster.wait_condition("latest", "CleaningStuck", "True", "CleaningPaused", timeout=30)
        assert f"partition 1 on pod shale-{owner}: cleaning paused" in cond["message"]
        assert "pause count 1" in cond["message"]
        partition = cluster.topic("latest")["status"]["partitions"][1]
        assert partition["cleaningState"] == "paused"
        assert cluster.condition("latest", "Ready")["status"] == "True"  # still served
    finally:
        cluster.node_post(owner, "/partitions/latest/1/resume")
    cluster.wait_condition("latest", "CleaningStuck", "False", "CleaningProgressing")


def test_kopf_keeps_its_state_in_annotations_so_the_strict_status_schema_prunes_nothing(cluster: Cluster):
    """The Topic as the operator and kopf leave it passes the CRD's schema with nothing to prune, also mid-retry."""
    cluster.create_topic("orders", 2, {"cleanup.policy": "compact"})
    cluster.wait_condition("orders", "Ready", "True")
    produce(cluster.storage.nodes[0].bootstrap, "orders", {0: 3, 1: 3})
    served = wait_for(lambda: (t := cluster.topic("orders")) and len(t["status"].get("partitions", [])) == 2
                      and all("logEndOffset" in p for p in t["status"]["partitions"]) and t, what="the full status")
    assert crd_errors(served) == [] and unknown_fields(served, CRD_SCHEMA) == []
    assert set(served["status"]) == {"observedGeneration", "topicName", "appliedSpec", "conditions", "partitions",
                                     "diskUsageBytes"}
    assert served["status"]["appliedSpec"] == {"topicName": "orders", "partitions": 2,
                                               "config": {"cleanup.policy": "compact"}}

    # A handler that fails (RBAC refuses the ConfigMap write) leaves kopf's retry state on the Topic.
    cluster.apiserver.refuse("UPDATE", "configmaps")
    cluster.create_topic("refused", 1)
    retrying = wait_for(lambda: (t := cluster.topic("refused")) and "shale.dev/apply-create" in
                        (t["metadata"].get("annotations") or {}) and t, what="kopf's retry state in an annotation")
    progress = json.loads(retrying["metadata"]["annotations"]["shale.dev/apply-create"])
    assert progress["retries"] == 1 and progress["success"] is False and progress["delayed"]
    assert "kopf" not in (retrying.get("status") or {})  # kopf's default would keep it in status.kopf.progress
    assert crd_errors(retrying) == [] and unknown_fields(retrying, CRD_SCHEMA) == []
    assert cluster.manifest("refused") is None


def test_an_operator_started_before_discovery_lists_topics_waits_and_then_serves_them(cluster_parts, storage_nodes):
    # A kube-apiserver just restarted answers before it publishes the custom groups; kopf scans discovery once,
    # so an operator started then would never serve Topics (seen on the real cluster: tests/cluster).
    parts = cluster_parts
    hidden = {key: parts.apiserver.server.resources.pop(key)
              for key in ("shale.dev/v1alpha1/topics", "shale.dev/v1alpha1/users")}
    operator = OperatorThread(parts.settings)
    operator.thread.start()
    try:
        wait_for(lambda: sum(r.url.path == "/apis/shale.dev/v1alpha1" for r in parts.apiserver.requests()) >= 2,
                 what="the operator to look for its resources twice")
        assert not operator.ready_flag.is_set() and operator.error is None

        parts.apiserver.server.resources.update(hidden)
        wait_for(operator.ready_flag.is_set, 30, what="the operator to start once discovery lists Topics")
        cluster = Cluster(parts.api, storage_nodes, operator, parts.projection, parts.apiserver, parts.kubeconfig)
        cluster.create_topic("late", 1)
        cluster.wait_condition("late", "Ready", "True")
    finally:
        operator.stop()
