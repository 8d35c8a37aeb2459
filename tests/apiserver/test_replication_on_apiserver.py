"""Replication on a real kube-apiserver: the chart's release with `storage.replication.enabled`, three real
`shale serve --store kubernetes` processes logged in (through $KUBECONFIG, as kubectl) with a token of the
chart's storage service account — so every Lease call passes the real authorizer under the chart's storage
Role, or fails as it would in a cluster — and the operator placing each Topic's replicas on distinct pods.

The journey of issue 15: a Topic with `replicas: 3` becomes Ready with three replicas per partition and one
leader each; confluent-kafka produces with acks=all; the leader's process is SIGKILLed mid-stream; the same
producer carries on; every acknowledged record is read back at its acknowledged offset; the Topic's status
names the new leader.
"""

from __future__ import annotations

import itertools
import re
from typing import Iterator

import kubernetes
import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition

from support.apiserver_util import Release, install_release, operated
from support.chart_util import one
from support.cluster_util import Cluster, StorageNodes
from support.kube_apiserver import ApiServer
from support.node_util import TEST_OVERRIDES, KubeStoreUrl, ReplicatedCluster, ServeProcess, wait_for

_namespaces = itertools.count(1)
TOPIC, PARTITIONS, RECORDS = "orders", 2, 400


def user(namespace: str, account: str) -> str:
    return f"system:serviceaccount:{namespace}:{account}"


@pytest.fixture
def replicated(apiserver: ApiServer, tmp_path_factory, monkeypatch) -> Iterator[tuple[Cluster, ReplicatedCluster,
                                                                                         Release]]:
    """The release (three storage pods, replication on), the three store-backed nodes, the operator."""
    release = install_release(apiserver.client(), f"repl{next(_namespaces)}", {"storage": {"replicas": 3,
                                                                                         "replication": {"enabled": True}}})
    line = one(release.objects, "StatefulSet")["spec"]["template"]["spec"]["containers"][0]["args"][0]
    store_args = re.search(r"--store (kubernetes) --cluster-id (\S+)", line)
    assert store_args, f"the chart's storage command has no --store kubernetes: {line}"
    base = tmp_path_factory.mktemp("replicated")
    token = apiserver.service_account_token(release.namespace, release.storage_service_account)
    # The namespace comes from the kubeconfig's context, as kubectl takes it (no token file outside a pod).
    store = KubeStoreUrl(apiserver.write_kubeconfig(base / "storage-kubeconfig", token, namespace=release.namespace))
    nodes = ReplicatedCluster(base, store)
    nodes.topics_dir.mkdir()
    for n in range(3):
        nodes.servers[n] = ServeProcess(base / f"data{n}", nodes.topics_dir, "--store", store_args[1], "--cluster-id",
                                        store_args[2], *TEST_OVERRIDES, node_id=n,
                                        env={"KUBECONFIG": str(store.kubeconfig)})
    try:
        for server in nodes.servers.values():
            server.start()
        nodes.wait_for_members()
        with operated(apiserver, release, StorageNodes(nodes.topics_dir, list(nodes.servers.values())), base,
                      monkeypatch) as cluster:
            yield cluster, nodes, release
    finally:
        nodes.stop()
    # Neither the operator nor a node was refused anything by the real authorizer (409s are CAS misses).
    for account in (release.service_account, release.storage_service_account):
        responses = apiserver.responses(user(release.namespace, account))
        assert responses, f"no request of {account} in the audit log"
        refused = sorted({(e["verb"], e["requestURI"].split("?")[0], e["responseStatus"]["code"]) for e in responses
                          if e["responseStatus"]["code"] in (401, 403, 422)})
        assert refused == [], f"the server refused {account}: {refused}"


def leaders_in_status(cluster: Cluster, topic: str) -> dict[int, list[str]] | None:
    """partition → the pods whose replica the Topic's status shows leading, once Ready with every replica listed."""
    status = (cluster.topic(topic) or {}).get("status") or {}
    if cluster.condition(topic, "Ready").get("status") != "True":
        return None
    out: dict[int, list[str]] = {}
    for entry in status.get("partitions", ()):
        out.setdefault(entry["partition"], [])
        if entry.get("role") == "leader":
            out[entry["partition"]].append(entry["pod"])
    return out


def test_a_replicated_topic_survives_its_leaders_sigkill_under_acks_all(replicated):
    cluster, nodes, release = replicated
    sts = one(release.objects, "StatefulSet")["metadata"]["name"]
    cluster.create_topic(TOPIC, PARTITIONS, {"min.insync.replicas": "2"}, replicas=3)
    cluster.wait_condition(TOPIC, "Ready", "True", "PartitionsServed", timeout=90)

    # Three replicas per partition, on distinct pods, and one leader each in the status.
    assignment = cluster.manifest(TOPIC)["spec"]["assignment"]["partitions"]
    assert len(assignment) == PARTITIONS and all(sorted(replicas) == [0, 1, 2] for replicas in assignment)
    leaders = wait_for(lambda: (found := leaders_in_status(cluster, TOPIC)) and
                       all(len(pods) == 1 for pods in found.values()) and len(found) == PARTITIONS and found,
                       60, interval=0.5, what="one leader per partition in the Topic's status")
    status = cluster.topic(TOPIC)["status"]
    assert len(status["partitions"]) == PARTITIONS * 3
    old = nodes.wait_for_isr(TOPIC, 0)
    assert leaders[0] == [f"{sts}-{old.leader}"]

    # acks=all from one producer that is never restarted; the leader of partition 0 dies half-way.
    acked: dict[bytes, int] = {}
    failed: list[str] = []

    def delivered(err: KafkaError | None, msg) -> None:
        if err is not None:
            failed.append(f"{msg.value()!r}: {err}")
        else:
            acked[msg.value()] = msg.offset()

    producer = Producer({"bootstrap.servers": nodes.bootstrap, "acks": "all", "enable.idempotence": True,
                         "linger.ms": 2, "message.timeout.ms": 60000})
    for i in range(RECORDS):
        producer.produce(TOPIC, value=b"r%05d" % i, partition=0, on_delivery=delivered)
        producer.poll(0.005)
        if i == RECORDS // 2:
            assert producer.flush(30) == 0 and failed == [], failed  # half acknowledged by the first leader
            nodes.kill(old.leader)
    assert producer.flush(90) == 0, "records still unacknowledged 90 s after the leader's SIGKILL"
    assert failed == [], f"deliveries failed across the failover: {failed[:5]}"
    assert len(acked) == RECORDS
    del producer  # librdkafka's threads end with it

    new = nodes.wait_for_leader(TOPIC, 0, excluding=(old.leader,), newer_than=old.leader_epoch)
    # Every acknowledged record at its acknowledged offset, read from the new leader up to its high watermark.
    consumer = Consumer({"bootstrap.servers": nodes.bootstrap, "group.id": "check", "enable.auto.commit": False,
                         "auto.offset.reset": "earliest"})
    consumer.assign([TopicPartition(TOPIC, 0, 0)])
    read: dict[int, bytes] = {}
    end = max(acked.values()) + 1

    def drained() -> bool:
        for msg in consumer.consume(500, 1.0):
            assert msg.error() is None, msg.error()
            read[msg.offset()] = msg.value()
        return len([o for o in read if o < end]) >= len(set(acked.values()))
    try:
        wait_for(drained, 60, interval=0, what="every acknowledged offset read back")
    finally:
        consumer.close()
    wrong = {v: (o, read.get(o)) for v, o in acked.items() if read.get(o) != v}
    assert wrong == {}, f"acknowledged records not at their offsets: {list(wrong.items())[:5]}"

    # The Topic's status follows: the new leader's pod leads, the killed pod's replica is not served.
    def new_leader_shown() -> dict | None:
        entries = [e for e in (cluster.topic(TOPIC).get("status") or {}).get("partitions", ()) if e["partition"] == 0]
        leading = [e["pod"] for e in entries if e.get("role") == "leader"]
        dead = [e for e in entries if e["pod"] == f"{sts}-{old.leader}"]
        return entries if leading == [f"{sts}-{new.leader}"] and dead and "role" not in dead[0] else None

    wait_for(new_leader_shown, 60, interval=0.5, what=f"{sts}-{new.leader} shown leading partition 0")
    ready = cluster.condition(TOPIC, "Ready")
    assert ready["status"] == "False" and f"0 (pod {sts}-{old.leader}: GET " in ready["message"]  # a replica is down

    # The records are Leases, the storage pods' only objects; the operator's ConfigMap was never theirs to write.
    leases = kubernetes.client.CoordinationV1Api(cluster.api).list_namespaced_lease(release.namespace).items
    records = [lease for lease in leases if (lease.metadata.annotations or {}).get("shale.dev/topic") == TOPIC]
    assert len(records) == PARTITIONS
    leading = [lease for lease in records if lease.metadata.annotations["shale.dev/partition"] == "0"]
    assert leading[0].spec.holder_identity  # kubectl get leases shows the new leader's incarnation
