"""`shale serve --store kubernetes`: the same replicated cluster with the Kubernetes API server as the control
store (Lease objects for sessions, ConfigMaps for partition records), on the real kube-apiserver of
tests/apiserver. Outside a pod the nodes use the kubeconfig `kubectl` would (`$KUBECONFIG`) and its context's
namespace."""

from __future__ import annotations

import json

import kubernetes
import yaml

from support.fault_util import AckedLoad
from support.node_util import KubeStoreUrl, start_replicated_cluster, topic_manifest


def test_a_leader_sigkilled_fails_over_through_leases_and_configmaps(tmp_path, kube_api):
    namespace = "shale-serve-kube"
    core = kubernetes.client.CoreV1Api(kube_api.client())
    core.create_namespace({"metadata": {"name": namespace}})
    kubeconfig = kube_api.write_kubeconfig(tmp_path / "kubeconfig")
    config = yaml.safe_load(kubeconfig.read_text())
    config["contexts"][0]["context"]["namespace"] = namespace
    kubeconfig.write_text(yaml.safe_dump(config))

    cluster = start_replicated_cluster(tmp_path, KubeStoreUrl(kubeconfig), 3, topic_manifest(
        "load", 1, replicas=3, config={"min.insync.replicas": 2}))
    load = AckedLoad("confluent", cluster.bootstrap, "load")
    try:
        load.start().wait_for_acks(50)
        old = cluster.wait_for_leader("load", 0)
        cluster.kill(old.leader)
        cluster.wait_for_leader("load", 0, excluding=(old.leader,), newer_than=old.leader_epoch, timeout=60)
        load.wait_for_acks(len(load.acked) + 50)
        cluster.restart(old.leader)
        load.finish(cluster)
        # The store is the API server, in the kubeconfig context's namespace: a Lease per live node, and the
        # partition's record (kube_store.py says which objects hold what) naming the leader Metadata shows.
        leases = kubernetes.client.CoordinationV1Api(kube_api.client()).list_namespaced_lease(namespace).items
        assert len([lease for lease in leases if lease.metadata.name.startswith("shale-shale-node-")]) == 3
        leader = cluster.wait_for_leader("load", 0)
        records = [json.loads(obj.metadata.annotations["shale.dev/record"])
                   for obj in [*leases, *core.list_namespaced_config_map(namespace).items]
                   if (obj.metadata.annotations or {}).get("shale.dev/topic") == "load"]
        assert [(r["leader"], r["leader_epoch"]) for r in records] == [(leader.leader, leader.leader_epoch)]
    finally:
        load.close()
        cluster.stop()
