"""Failover with `shale serve --store kubernetes` on the real kube-apiserver (kube_apiserver.py), under `acks=all`
load from a real client that is never restarted, `min.insync.replicas=2`, three replicas (docs/replication.md).

- Leaders SIGKILLed again and again with 120 s sessions: every failover happens long before the dead leader's
  Lease could expire, because an in-sync follower refused by it deletes that Lease ("Ending a dead leader's
  session") — the API shows it gone while its duration still runs. Each time: a new leader in a newer epoch,
  and the killed node, restarted, back in the ISR.
- A leader SIGSTOPped past its session and woken: replaced in a newer epoch, it fences itself on waking.
- The API server SIGKILLed for a few seconds (less than a session): leaders keep acknowledging on their own
  session deadline meanwhile; once the server is back the cluster carries on.
After each run `AckedLoad.finish`: every acknowledged record at its offset, replicas byte-identical below the
high watermark, no epoch led by two nodes.
"""

from __future__ import annotations

import itertools
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import kubernetes
import yaml

from support.fault_util import AckedLoad
from support.kube_apiserver import ApiServer
from support.node_util import KubeStoreUrl, ReplicatedCluster, start_replicated_cluster, topic_manifest, wait_for

TOPIC = topic_manifest("load", 1, replicas=3, config={"min.insync.replicas": 2})
SESSION_S = 120
LONG_SESSIONS = ("--override", f"broker.session.timeout.ms={SESSION_S * 1000}",
                 "--override", "broker.heartbeat.interval.ms=2000")
SHORT_SESSIONS = ("--override", "broker.session.timeout.ms=8000", "--override", "broker.heartbeat.interval.ms=1000")
WAIT_S = 60.0  # half a long session
KILLS = 5
_namespaces = itertools.count(1)


def kube_cluster(apiserver: ApiServer, tmp_path: Path, extra: tuple[str, ...]) -> tuple[ReplicatedCluster, str]:
    """Three nodes on the API server, in a namespace of their own named by their kubeconfig's context."""
    namespace = f"failover{next(_namespaces)}"
    kubernetes.client.CoreV1Api(apiserver.client()).create_namespace({"metadata": {"name": namespace}})
    kubeconfig = apiserver.write_kubeconfig(tmp_path / "kubeconfig")
    config = yaml.safe_load(kubeconfig.read_text())
    config["contexts"][0]["context"]["namespace"] = namespace
    kubeconfig.write_text(yaml.safe_dump(config))
    return start_replicated_cluster(tmp_path, KubeStoreUrl(kubeconfig), 3, TOPIC, extra=extra), namespace


def session_lease(leases: kubernetes.client.CoordinationV1Api, namespace: str, node_id: int):
    """Node `node_id`'s session Lease, or None once deleted."""
    try:
        return leases.read_namespaced_lease(f"shale-shale-node-{node_id}", namespace)
    except kubernetes.client.ApiException as exc:
        if exc.status == 404:
            return None
        raise


def test_leaders_sigkilled_again_and_again_fail_over_before_their_lease_expires(apiserver, tmp_path):
    cluster, namespace = kube_cluster(apiserver, tmp_path, LONG_SESSIONS)
    leases = kubernetes.client.CoordinationV1Api(apiserver.client())
    load = AckedLoad("confluent", cluster.bootstrap, "load")
    epochs = []
    try:
        load.start().wait_for_acks(50)
        for _ in range(KILLS):
            old = cluster.wait_for_isr("load", 0, timeout=WAIT_S)
            epochs.append(old.leader_epoch)
            lease = session_lease(leases, namespace, old.leader)
            assert lease is not None and lease.spec.lease_duration_seconds == SESSION_S
            incarnation = lease.spec.holder_identity
            cluster.kill(old.leader)  # after its last renewal: the Lease would live until `expires`
            expires = lease.spec.renew_time + timedelta(seconds=lease.spec.lease_duration_seconds)
            new = cluster.wait_for_leader("load", 0, excluding=(old.leader,), newer_than=old.leader_epoch,
                                          timeout=WAIT_S)
            # Ended early: deleted by a follower, well inside the 120 s it would otherwise have lived.
            wait_for(lambda: session_lease(leases, namespace, old.leader) is None, WAIT_S,
                     what=f"node {old.leader}'s Lease (incarnation {incarnation}) deleted")
            assert datetime.now(timezone.utc) < expires, f"node {old.leader}'s Lease outlived its duration"
            logs = "".join(cluster.servers[n].log() for n in cluster.servers if n != old.leader)
            assert f"ended the session of node {old.leader} incarnation {incarnation}" in logs
            load.wait_for_acks(len(load.acked) + 50, timeout=WAIT_S)  # the same client writes on
            cluster.restart(old.leader)
            back = cluster.wait_for_isr("load", 0, timeout=WAIT_S)  # the restarted node rejoins the ISR
            assert old.leader in back.isr and back.leader_epoch >= new.leader_epoch
            assert session_lease(leases, namespace, old.leader).spec.holder_identity != incarnation
        epochs.append(cluster.wait_for_leader("load", 0).leader_epoch)
        assert epochs == sorted(set(epochs)), f"every failover in a newer epoch: {epochs}"
        load.finish(cluster)
    finally:
        load.close()
        cluster.stop()


def test_a_paused_leader_is_fenced_and_an_api_server_outage_is_ridden_out(apiserver, tmp_path):
    cluster, namespace = kube_cluster(apiserver, tmp_path, SHORT_SESSIONS)
    load = AckedLoad("kafka-python", cluster.bootstrap, "load")
    try:
        load.start().wait_for_acks(50)

        # SIGSTOP past the session: the others elect once its Lease is stale; woken, it fences itself.
        old = cluster.wait_for_isr("load", 0, timeout=WAIT_S)
        cluster.servers[old.leader].pause()
        cluster.wait_for_leader("load", 0, excluding=(old.leader,), newer_than=old.leader_epoch, timeout=WAIT_S)
        cluster.servers[old.leader].resume()
        wait_for(lambda: f"node {old.leader}: fenced, incarnation " in cluster.servers[old.leader].log(), WAIT_S,
                 what=f"node {old.leader} to find its session gone on waking")
        cluster.wait_for_isr("load", 0, timeout=WAIT_S)
        load.wait_for_acks(len(load.acked) + 50, timeout=WAIT_S)

        # The API server down for less than a session: the leader keeps acknowledging on its own deadline.
        leader = cluster.wait_for_isr("load", 0, timeout=WAIT_S)
        apiserver.kill_apiserver()
        try:
            down_at = time.monotonic()
            time.sleep(3)
            acked_while_down = [t for t in list(load.ack_times) if t > down_at]
            assert acked_while_down, "no acknowledgement while the API server was down, within the session"
        finally:
            apiserver.start_apiserver()  # waits for /readyz
        load.wait_for_acks(len(load.acked) + 50, timeout=WAIT_S)
        after = cluster.wait_for_isr("load", 0, timeout=WAIT_S)
        assert after.leader_epoch >= leader.leader_epoch
        load.finish(cluster)
    finally:
        load.close()
        cluster.stop()
