"""A 3-node cluster (real etcd) with a listener per purpose: CLIENT (SASL_SSL, SCRAM-SHA-512) for applications,
REPLICATION (PLAINTEXT, bound to 127.0.0.2) between the nodes, INTERNAL (PLAINTEXT) for the test harness.

Every node registers all its listeners, so Metadata, FindCoordinator, DescribeCluster and Produce's leader hints
answer each request with the other nodes' addresses on the listener it came through. A client given one node's
CLIENT port only produces to and consumes from partitions led by the others and joins a group coordinated
elsewhere: had any answer named a REPLICATION address, librdkafka would speak TLS to a plaintext port and fail.
A node without the CLIENT listener is left out of the answers on it (Kafka's LISTENER_NOT_FOUND). Refused
logins and refused authorization checks are counted on /metrics.
"""

from __future__ import annotations

import socket
import time
from pathlib import Path

from confluent_kafka import Consumer, Producer, TopicPartition

from shale.sidecar.log.records import Record, encode_batch
from shale.sidecar.protocol.error_codes import (
    COORDINATOR_NOT_AVAILABLE,
    LEADER_NOT_AVAILABLE,
    LISTENER_NOT_FOUND,
    NOT_LEADER_OR_FOLLOWER,
    SASL_AUTHENTICATION_FAILED,
    TOPIC_AUTHORIZATION_FAILED,
)
from support.http_util import sample, scrape
from support.node_util import ServeProcess, free_port, start_replicated_cluster, topic_manifest, wait_for
from support.tls_util import RawClient, client_context, make_pki, seed_user, tls_overrides

PASSWORDS = {"alice": "alice-Secret-4711", "mallory": "mallory-Secret-0815"}
PRODUCE, METADATA, FIND_COORDINATOR, DESCRIBE_CLUSTER = 0, 3, 10, 60


def listeners(pki, client: bool = True):
    """Each node's arguments: CLIENT (SASL_SSL, unless `client` is False for that node), REPLICATION on 127.0.0.2
    (inter-broker), INTERNAL on the harness's port; alice and the nodes' PLAINTEXT principal are super users."""
    def node_args(server: ServeProcess) -> list[str]:
        server.client_port, server.replication_port = free_port(), free_port()
        has_client = client(server.node_id) if callable(client) else client
        named = [f"INTERNAL://127.0.0.1:{server.port}", f"REPLICATION://127.0.0.2:{server.replication_port}"]
        if has_client:
            named.append(f"CLIENT://127.0.0.1:{server.client_port}")
        return ["--override", "listeners=" + ",".join(named),
                "--override", "listener.security.protocol.map=INTERNAL:PLAINTEXT,REPLICATION:PLAINTEXT,CLIENT:SASL_SSL",
                "--override", "inter.broker.listener.name=REPLICATION",
                *tls_overrides(pki, "CLIENT"),
                "--override", "authorizer.class.name=shale",
                "--override", "super.users=User:ANONYMOUS;User:alice"]
    return node_args


def seeded(tmp_path: Path, n_nodes: int) -> None:
    for n in range(n_nodes):
        for user, password in PASSWORDS.items():
            seed_user(tmp_path / f"data{n}", user, password)


def alice(pki, port: int) -> RawClient:
    conn = RawClient(port, client_context(pki), timeout=30)
    assert conn.scram("alice", PASSWORDS["alice"]).error_code == 0
    return conn


def client_config(server: ServeProcess, pki) -> dict:
    """confluent-kafka over SASL_SSL as alice, bootstrapped from this one node's CLIENT port only."""
    return {"bootstrap.servers": f"127.0.0.1:{server.client_port}", "security.protocol": "SASL_SSL",
            "sasl.mechanisms": "SCRAM-SHA-512", "sasl.username": "alice", "sasl.password": PASSWORDS["alice"],
            "ssl.ca.location": pki.ca}


def coordinated_elsewhere(conn: RawClient, than: int) -> tuple[str, int, int]:
    """A group id whose coordinator is another node than `than`: (group, node id, port) as FindCoordinator says."""
    for i in range(100):
        group = f"group-{i}"
        found = conn.request(FIND_COORDINATOR, 3, {"key": group, "key_type": 0})
        assert found.error_code == 0, found
        if found.node_id != than:
            assert found.host == "127.0.0.1"
            return group, found.node_id, found.port
    raise AssertionError(f"every group is coordinated by node {than}")


def test_clients_on_sasl_ssl_reach_every_node_by_its_client_listener(tmp_path, etcd):
    pki = make_pki(tmp_path / "pki")
    seeded(tmp_path, 3)
    cluster = start_replicated_cluster(tmp_path, etcd, 3, topic_manifest("orders", 3, replicas=3),
                                       node_args=listeners(pki))
    try:
        servers = cluster.servers
        client_ports = {n: s.client_port for n, s in servers.items()}
        leaders = {p: state.leader for p, state in cluster.metadata("orders").items()}
        assert set(leaders.values()) - {0}, f"every partition is led by node 0: {leaders}"
        # Metadata on node 0's CLIENT listener names every node by its CLIENT address; on INTERNAL, by INTERNAL.
        conn = alice(pki, client_ports[0])
        answer = conn.request(METADATA, 12, {"topics": [{"name": "orders", "topic_id": None}],
                                             "allow_auto_topic_creation": False,
                                             "include_topic_authorized_operations": False})
        assert {b.node_id: (b.host, b.port) for b in answer.brokers} == {
            n: ("127.0.0.1", port) for n, port in client_ports.items()}
        assert {p.partition_index: (p.error_code, p.leader_id) for p in answer.topics[0].partitions} == {
            p: (0, leader) for p, leader in leaders.items()}
        internal = RawClient(servers[1].port).request(METADATA, 12, {"topics": None, "allow_auto_topic_creation": False,
                                                                      "include_topic_authorized_operations": False})
        assert {b.node_id: b.port for b in internal.brokers} == {n: s.port for n, s in servers.items()}
        described = conn.request(DESCRIBE_CLUSTER, 0, {"include_cluster_authorized_operations": False})
        assert {b.broker_id: (b.host, b.port) for b in described.brokers} == {
            n: ("127.0.0.1", port) for n, port in client_ports.items()}
        group, coordinator, port = wait_for(lambda: _coordinator(conn), 60, what="a coordinator on another node")
        assert port == client_ports[coordinator]
        (found,) = conn.request(FIND_COORDINATOR, 4, {"key_type": 0, "coordinator_keys": [group]}).coordinators
        assert (found.error_code, found.node_id, found.port) == (0, coordinator, client_ports[coordinator])
        # KIP-951: a produce to node 0 for another node's partition names that leader's CLIENT address.
        elsewhere = next(p for p, leader in leaders.items() if leader != 0)
        batch = encode_batch([Record(0, int(time.time() * 1000), None, b"misdirected")])
        refused = conn.request(PRODUCE, 10, {"transactional_id": None, "acks": 1, "timeout_ms": 30000, "topic_data": [
            {"name": "orders", "partition_data": [{"index": elsewhere, "records": batch}]}]})
        assert refused.responses[0].partition_responses[0].error_code == NOT_LEADER_OR_FOLLOWER
        assert [(e.node_id, e.host, e.port) for e in refused.node_endpoints] == [
            (leaders[elsewhere], "127.0.0.1", client_ports[leaders[elsewhere]])]
        conn.close()

        producer = Producer({**client_config(servers[0], pki), "acks": "all"})
        for i in range(30):
            producer.produce("orders", value=f"r{i}".encode(), partition=i % 3)
        assert producer.flush(60) == 0
        assert [cluster.high_watermark("orders", p) for p in range(3)] == [10, 10, 10]

        consumer = Consumer({**client_config(servers[0], pki), "group.id": group, "auto.offset.reset": "earliest",
                             "enable.auto.commit": False})
        try:
            consumer.subscribe(["orders"])
            got: list[bytes] = []

            def read_all() -> bool:
                msg = consumer.poll(1.0)
                if msg is not None and msg.error() is None:
                    got.append(msg.value())
                return len(got) == 30
            wait_for(read_all, 90, interval=0, what="the 30 records through the group")
            assert sorted(got) == sorted(f"r{i}".encode() for i in range(30))
            consumer.commit(asynchronous=False)  # to the coordinator on the other node, over its CLIENT listener
            committed = consumer.committed([TopicPartition("orders", p) for p in range(3)], timeout=30)
            assert [tp.offset for tp in committed] == [10, 10, 10]
        finally:
            consumer.close()
    finally:
        cluster.stop()


def _coordinator(conn: RawClient):
    try:
        return coordinated_elsewhere(conn, than=0)
    except AssertionError:  # __consumer_offsets' leaders are still being elected
        return None


def test_refused_logins_and_authorization_checks_are_counted(tmp_path, etcd):
    """A wrong password, plaintext on the TLS port, and mallory (no ACL) asking for a topic: each counted on
    /metrics by listener, mechanism and reason, or by API and resource type."""
    pki = make_pki(tmp_path / "pki")
    seeded(tmp_path, 1)
    cluster = start_replicated_cluster(tmp_path, etcd, 1, topic_manifest("orders", 1), node_args=listeners(pki))
    try:
        server = cluster.servers[0]
        wrong = RawClient(server.client_port, client_context(pki))
        assert wrong.scram("alice", "not-alices-password").error_code == SASL_AUTHENTICATION_FAILED
        assert wrong.closed()
        plain = socket.create_connection(("127.0.0.1", server.client_port), timeout=10)
        plain.sendall(bytes(64))  # not a TLS ClientHello
        assert plain.recv(1) == b""
        plain.close()
        mallory = RawClient(server.client_port, client_context(pki))
        assert mallory.scram("mallory", PASSWORDS["mallory"]).error_code == 0
        answer = mallory.request(METADATA, 12, {"topics": [{"name": "orders", "topic_id": None}],
                                                "allow_auto_topic_creation": False,
                                                "include_topic_authorized_operations": False})
        assert answer.topics[0].error_code == TOPIC_AUTHORIZATION_FAILED
        mallory.close()

        def counted() -> bool:
            metrics = scrape(server.http_port)
            return (metrics.get(("shale_failed_authentications_total", frozenset(
                        {"listener": "CLIENT", "mechanism": "SCRAM-SHA-512", "reason": "credentials"}.items()))) == 1
                    and metrics.get(("shale_failed_authentications_total", frozenset(
                        {"listener": "CLIENT", "mechanism": "none", "reason": "tls"}.items()))) == 1)
        wait_for(counted, 30, what="the refused logins on /metrics")  # the TLS refusal is counted as it closes
        metrics = scrape(server.http_port)
        assert sample(metrics, "shale_authorization_refusals_total", api="Metadata", resource_type="TOPIC") == 1
        assert not [k for k in metrics if k[0] == "shale_failed_authentications_total"
                    and ("listener", "CLIENT") not in k[1]]
        log = server.log()
        assert not any(password in log for password in PASSWORDS.values())
    finally:
        cluster.stop()


def test_a_node_without_the_requests_listener_is_left_out(tmp_path, etcd):
    """Node 1 has no CLIENT listener: on CLIENT, Metadata leaves it out of the brokers and answers its partitions
    LISTENER_NOT_FOUND with no leader (v6+; LEADER_NOT_AVAILABLE before), DescribeCluster leaves it out, and a
    group it coordinates is COORDINATOR_NOT_AVAILABLE there, as Kafka answers. INTERNAL still names every node."""
    pki = make_pki(tmp_path / "pki")
    seeded(tmp_path, 2)
    cluster = start_replicated_cluster(tmp_path, etcd, 2, topic_manifest("orders", 2, replicas=2),
                                       extra=("--override", "offsets.topic.replication.factor=2"),
                                       node_args=listeners(pki, client=lambda n: n == 0))
    try:
        leaders = {p: state.leader for p, state in cluster.metadata("orders").items()}
        assert set(leaders.values()) == {0, 1}, leaders
        conn = alice(pki, cluster.servers[0].client_port)
        for version, lacking in ((12, LISTENER_NOT_FOUND), (5, LEADER_NOT_AVAILABLE)):
            answer = conn.request(METADATA, version, {"topics": [{"name": "orders", "topic_id": None}],
                                                      "allow_auto_topic_creation": False,
                                                      "include_topic_authorized_operations": False})
            assert [(b.node_id, b.port) for b in answer.brokers] == [(0, cluster.servers[0].client_port)]
            assert {p.partition_index: (p.error_code, p.leader_id) for p in answer.topics[0].partitions} == {
                p: (0, 0) if leader == 0 else (lacking, -1) for p, leader in leaders.items()}
        described = conn.request(DESCRIBE_CLUSTER, 0, {"include_cluster_authorized_operations": False})
        assert [b.broker_id for b in described.brokers] == [0]

        def refused_group():
            for i in range(100):
                found = conn.request(FIND_COORDINATOR, 3, {"key": f"group-{i}", "key_type": 0})
                if found.error_code == COORDINATOR_NOT_AVAILABLE and "has no listener CLIENT" in (found.error_message or ""):
                    return found  # COORDINATOR_NOT_AVAILABLE: node 1 coordinates it
            return None
        found = wait_for(refused_group, 60, what="a group coordinated by node 1")
        assert (found.node_id, found.port) == (-1, -1)
        conn.close()
        internal = RawClient(cluster.servers[0].port).request(METADATA, 12, {
            "topics": None, "allow_auto_topic_creation": False, "include_topic_authorized_operations": False})
        assert {b.node_id for b in internal.brokers} == {0, 1}
    finally:
        cluster.stop()
