"""The Kafka admin API on a replicated cluster: topics created, grown, altered and deleted through one node are
topic records in the control store that every node applies (docs/replication.md, "Topics created through the
API"). Real `shale serve` processes on a real etcd, real clients (confluent-kafka's AdminClient, kafka-python's
KafkaAdminClient)."""

from __future__ import annotations

import json

import kubernetes
import pytest
import yaml
from confluent_kafka import KafkaException, Producer
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, NewTopic
from kafka.admin import KafkaAdminClient, NewPartitions
from kafka.admin import NewTopic as PyNewTopic
from kafka.errors import (
    InvalidReplicationAssignmentError,
    InvalidReplicationFactorError,
    PolicyViolationError,
    TopicAlreadyExistsError,
)
from kafka.protocol.admin import DescribeConfigsRequest, DescribeConfigsResponse

from shale.sidecar.replication.store.etcd_store import EtcdStore
from support.clients_util import build, call
from support.fault_util import check_acknowledged
from support.node_util import KubeStoreUrl, start_replicated_cluster, topic_manifest, wait_for

UNKNOWN_TOPIC_OR_PARTITION = 3
RESOURCE_TOPIC = 2


def topic_config(port: int, topic: str, key: str) -> str | None:
    """The value of a topic config as one node itself describes it (None: it does not know the topic)."""
    resp = call(port, build(DescribeConfigsRequest, {"resources": [
        {"resource_type": RESOURCE_TOPIC, "resource_name": topic, "configuration_keys": [key]}],
        "include_synonyms": False}, 1), DescribeConfigsResponse, timeout=5)
    (result,) = resp.results
    if result.error_code == UNKNOWN_TOPIC_OR_PARTITION:
        return None
    assert result.error_code == 0, result
    (entry,) = result.configs
    return entry.value


def store_keys(etcd) -> set[str]:
    """The topic and partition keys the cluster's store holds (the nodes' cluster id is "shale")."""
    store = EtcdStore([etcd.endpoint], "shale")
    try:
        view = store.view()
        return {f"topics/{name}" for name in view.topics} | {f"partitions/{tp.topic}/{tp.partition}"
                                                             for tp in view.partitions}
    finally:
        store.close()


def test_confluent_admin_topic_lifecycle_reaches_every_node(tmp_path, etcd):
    cluster = start_replicated_cluster(tmp_path, etcd, 3)
    try:
        admin0 = AdminClient({"bootstrap.servers": cluster.servers[0].bootstrap})
        futures = admin0.create_topics([NewTopic("orders", 2, 3, config={"min.insync.replicas": "2"})],
                                       request_timeout=30)
        futures["orders"].result(30)
        for p in (0, 1):
            state = cluster.wait_for_isr("orders", p)  # every node's Metadata: one leader, all three in sync
            assert sorted(state.replicas) == [0, 1, 2] and sorted(state.isr) == [0, 1, 2]
        assert cluster.metadata("orders", via=2)[0].replicas == cluster.metadata("orders", via=0)[0].replicas

        # acks=all through another node than the one that created the topic, read back from the replicas.
        producer = Producer({"bootstrap.servers": cluster.servers[1].bootstrap, "acks": "all", "linger.ms": 5})
        acked = []
        for i in range(60):
            producer.produce("orders", value=b"v%d" % i, partition=i % 2,
                             on_delivery=lambda err, msg: acked.append((err, msg.partition(), msg.offset(),
                                                                        msg.value())))
        assert producer.flush(30) == 0
        assert [a for a in acked if a[0] is not None] == []
        for p in (0, 1):
            assert check_acknowledged(cluster, "orders", p, [(q, o, v) for _, q, o, v in acked]) == 30
        for n in range(3):
            assert topic_config(cluster.servers[n].port, "orders", "min.insync.replicas") == "2"

        # A config change through node 2 reaches every node.
        admin2 = AdminClient({"bootstrap.servers": cluster.servers[2].bootstrap})
        resource = ConfigResource("TOPIC", "orders", incremental_configs=[
            ConfigEntry("retention.ms", "123456", incremental_operation=AlterConfigOpType.SET)])
        admin2.incremental_alter_configs([resource])[resource].result(30)
        for n in range(3):
            wait_for(lambda n=n: topic_config(cluster.servers[n].port, "orders", "retention.ms") == "123456",
                     30, what=f"node {n} to apply retention.ms")
            assert topic_config(cluster.servers[n].port, "orders", "min.insync.replicas") == "2"  # kept

        # Creating it again, through any node, is TOPIC_ALREADY_EXISTS.
        admin1 = AdminClient({"bootstrap.servers": cluster.servers[1].bootstrap})
        with pytest.raises(KafkaException) as exc:
            admin1.create_topics([NewTopic("orders", 1, 1)])["orders"].result(30)
        assert exc.value.args[0].name() == "TOPIC_ALREADY_EXISTS"

        # Deleted through node 1: gone from every node's disk and Metadata, and from the store.
        assert {"topics/orders", "partitions/orders/0", "partitions/orders/1"} <= store_keys(etcd)
        admin1.delete_topics(["orders"])["orders"].result(30)
        for n in range(3):
            data = cluster.data_dir(n)
            # Renamed `-delete` (then removed): no partition directory of the topic is served any more.
            wait_for(lambda data=data: not [d for d in data.iterdir() if d.name in ("orders-0", "orders-1")], 60,
                     what=f"node {n}'s orders logs to be deleted")
            assert cluster.metadata("orders", via=n) == {}  # UNKNOWN_TOPIC: no partitions
            assert topic_config(cluster.servers[n].port, "orders", "retention.ms") is None
        wait_for(lambda: not {k for k in store_keys(etcd) if "orders" in k}, 30,
                 what="the topic and partition records of orders to leave the store")
    finally:
        cluster.stop()
    for n in range(3):
        log = cluster.servers[n].log()
        assert "Traceback" not in log, log[-3000:]


def test_kafka_python_admin_assignments_growth_and_kafkas_errors(tmp_path, etcd):
    cluster = start_replicated_cluster(tmp_path, etcd, 3, topic_manifest("declared", 1, replicas=2))
    try:
        admin = KafkaAdminClient(bootstrap_servers=cluster.servers[2].bootstrap, request_timeout_ms=30000)
        try:
            admin.create_topics([PyNewTopic("events", -1, -1, replica_assignments={0: [1, 2], 1: [2, 0]})])
            assert cluster.wait_for_isr("events", 0).replicas == (1, 2)
            assert cluster.wait_for_isr("events", 1).replicas == (2, 0)

            # Grown by two partitions: each gets the topic's two replicas, on distinct live nodes.
            admin.create_partitions({"events": NewPartitions(4)})
            for p in (2, 3):
                state = cluster.wait_for_isr("events", p)
                assert len(state.replicas) == 2 == len(set(state.replicas)) and set(state.replicas) <= {0, 1, 2}
            for n in range(3):
                assert sorted(cluster.metadata("events", via=n)) == [0, 1, 2, 3]

            # Kafka's refusals, checked against the live nodes; nothing is created by them.
            with pytest.raises(InvalidReplicationFactorError, match="only 3 broker"):
                admin.create_topics([PyNewTopic("wide", 1, 4)])
            with pytest.raises(InvalidReplicationAssignmentError, match="broker 7, but no such broker"):
                admin.create_topics([PyNewTopic("odd", -1, -1, replica_assignments={0: [0, 7]})])
            with pytest.raises(InvalidReplicationAssignmentError, match="broker 1 more than once"):
                admin.create_topics([PyNewTopic("odd", -1, -1, replica_assignments={0: [1, 1]})])
            with pytest.raises(InvalidReplicationAssignmentError, match="not consistent with previous partitions"):
                admin.create_topics([PyNewTopic("odd", -1, -1, replica_assignments={0: [0, 1], 1: [2]})])
            with pytest.raises(InvalidReplicationAssignmentError, match="not consistent with previous partitions"):
                admin.create_partitions({"events": NewPartitions(5, [[0]])})
            assert {k for k in store_keys(etcd) if k.startswith("topics/")} == {"topics/events"}

            # A manifest's topic stays the manifest's: no API record is written over it.
            with pytest.raises(TopicAlreadyExistsError):
                admin.create_topics([PyNewTopic("declared", 1, 2)])
            with pytest.raises(PolicyViolationError, match="Topic manifest"):
                admin.create_partitions({"declared": NewPartitions(2)})
            assert "topics/declared" not in store_keys(etcd)
        finally:
            admin.close()

        # A node restarted reads the API's topics from the store again and serves its replicas.
        cluster.restart(0)
        cluster.wait_for_members()
        assert sorted(cluster.metadata("events", via=0)) == [0, 1, 2, 3]
        assert cluster.wait_for_isr("events", 1).replicas == (2, 0)
    finally:
        cluster.stop()


def test_kubernetes_store_holds_api_topics_as_leases(tmp_path, kube_api):
    namespace = "shale-admin-kube"
    kubernetes.client.CoreV1Api(kube_api.client()).create_namespace({"metadata": {"name": namespace}})
    kubeconfig = kube_api.write_kubeconfig(tmp_path / "kubeconfig")
    config = yaml.safe_load(kubeconfig.read_text())
    config["contexts"][0]["context"]["namespace"] = namespace
    kubeconfig.write_text(yaml.safe_dump(config))
    leases = kubernetes.client.CoordinationV1Api(kube_api.client())

    def topic_records() -> list[dict]:
        return [json.loads(lease.metadata.annotations["shale.dev/topic-record"])
                for lease in leases.list_namespaced_lease(namespace).items
                if "shale.dev/topic-record" in (lease.metadata.annotations or {})]

    cluster = start_replicated_cluster(tmp_path, KubeStoreUrl(kubeconfig), 3)
    try:
        admin = AdminClient({"bootstrap.servers": cluster.servers[1].bootstrap})
        admin.create_topics([NewTopic("Kube.Topic_1", 3, 2)])["Kube.Topic_1"].result(30)
        (record,) = topic_records()
        assert record["name"] == "Kube.Topic_1" and record["partitions"] == 3
        for p in range(3):
            state = cluster.wait_for_isr("Kube.Topic_1", p)
            assert list(state.replicas) == record["assignment"][p] and len(set(state.replicas)) == 2
        for n in range(3):
            assert sorted(cluster.metadata("Kube.Topic_1", via=n)) == [0, 1, 2]
        admin.delete_topics(["Kube.Topic_1"])["Kube.Topic_1"].result(30)
        assert topic_records() == []
        for n in range(3):
            wait_for(lambda n=n: cluster.metadata("Kube.Topic_1", via=n) == {}, 30,
                     what=f"node {n} to delete Kube.Topic_1")
    finally:
        cluster.stop()
