"""The API server SIGKILLed mid-reconcile, and etcd restarted: the operator's watches resume (kopf reconnects
to the same address), nothing is applied twice or lost, and the status converges.

Usually within seconds. Once in about a dozen runs on a loaded machine, nothing reached the operator for
over 60 s after etcd's restart, with nothing logged: a watch left open but silent. The operator now has
the API server end every watch after 60 s (`settings.watching.server_timeout`, operator/handlers.py), so
such a watch is listed again within a minute; the waits after a restart allow for that and a reconcile.
"""

from __future__ import annotations

from support.apiserver_util import Release
from support.cluster_util import Cluster
from support.kube_apiserver import ApiServer
from support.node_util import wait_for

AFTER_RESTART = 120  # seconds: a silent watch ends within 60 s (server_timeout), then the reconcile


def configmap_writes(apiserver: ApiServer, release: Release, configmap: str) -> int:
    """The operator's successful writes of the topics ConfigMap, from the audit log."""
    user = f"system:serviceaccount:{release.namespace}:{release.service_account}"
    return sum(1 for e in apiserver.responses(user) if e["verb"] in ("patch", "create", "update")
               and (e["objectRef"] or {}).get("name") == configmap and e["responseStatus"]["code"] < 300)


def test_the_api_server_killed_mid_reconcile_then_restarted(cluster: Cluster, release: Release):
    apiserver: ApiServer = cluster.apiserver
    cluster.create_topic("before", 1)
    cluster.wait_condition("before", "Ready", "True", timeout=40)
    writes = configmap_writes(apiserver, release, cluster.configmap)

    cluster.create_topic("during", 2)  # the operator is handling it when the server dies
    apiserver.kill_apiserver()
    apiserver.start_apiserver()  # same port, certificates, keys and etcd data
    cluster.wait_condition("during", "Ready", "True", timeout=AFTER_RESTART)
    # A change made after the restart arrives through the resumed watch.
    cluster.patch_topic("before", {"spec": {"partitions": 3}})
    wait_for(lambda: cluster.condition("before", "Ready").get("observedGeneration") == 2
             and cluster.condition("before", "Ready")["status"] == "True", AFTER_RESTART,
             what="'before' Ready at generation 2")
    assert cluster.manifest("during")["spec"]["partitions"] == 2
    assert cluster.manifest("before")["spec"]["partitions"] == 3
    assert [p["partition"] for p in cluster.topic("during")["status"]["partitions"]] == [0, 1]
    # One write for "during" (its key), one for "before"'s growth: nothing applied twice.
    assert configmap_writes(apiserver, release, cluster.configmap) == writes + 2


def test_etcd_restarted_under_the_running_operator(cluster: Cluster, release: Release):
    apiserver: ApiServer = cluster.apiserver
    cluster.create_topic("steady", 1)
    cluster.wait_condition("steady", "Ready", "True", timeout=40)
    apiserver.restart_etcd()
    apiserver.wait_ready()
    cluster.create_topic("after", 2)
    cluster.wait_condition("after", "Ready", "True", timeout=AFTER_RESTART)
    cluster.patch_topic("steady", {"spec": {"config": {"retention.ms": "60000"}}})
    wait_for(lambda: cluster.condition("steady", "Ready").get("observedGeneration") == 2
             and cluster.condition("steady", "Ready")["status"] == "True", AFTER_RESTART,
             what="'steady' Ready at generation 2")
    assert cluster.manifest("steady")["spec"]["config"] == {"retention.ms": "60000"}
    assert set(cluster.node_status(1)["topics"]) >= {"after"}
