"""A replicated 3-node cluster (real etcd) whose inter-broker listener is SASL_SSL: the followers' fetchers
connect over TLS and authenticate with SCRAM-SHA-512 as the node user, and the replicas hold the same bytes.
A node whose inter-broker password is wrong is refused by the leaders and replicates nothing."""

from __future__ import annotations

from confluent_kafka import Producer

from support.node_util import ServeProcess, free_port, start_replicated_cluster, topic_manifest, wait_for
from support.tls_util import make_pki, seed_user, tls_overrides

NODE_PASSWORD = "node-Secret-0815"
ALICE_PASSWORD = "alice-Secret-4711"


def replication_listener(pki, password_file) -> callable:
    def node_args(server: ServeProcess) -> list[str]:
        server.replication_port = free_port()
        return ["--override", f"listeners=PLAINTEXT://127.0.0.1:{server.port},"
                              f"REPLICATION://127.0.0.1:{server.replication_port}",
                "--override", "listener.security.protocol.map=PLAINTEXT:PLAINTEXT,REPLICATION:SASL_SSL",
                "--override", "inter.broker.listener.name=REPLICATION",
                "--override", "sasl.mechanism.inter.broker.protocol=SCRAM-SHA-512",
                "--override", "listener.name.replication.scram-sha-512.sasl.jaas.config=org.apache.kafka.common."
                              'security.scram.ScramLoginModule required username="node" '
                              f'passwordFile="{password_file}";',
                *tls_overrides(pki, "REPLICATION")]
    return node_args


def test_replication_over_a_sasl_ssl_inter_broker_listener(tmp_path, etcd):
    pki = make_pki(tmp_path / "pki")
    password_file = tmp_path / "node.password"
    password_file.write_text(NODE_PASSWORD + "\n")
    for n in range(3):
        seed_user(tmp_path / f"data{n}", "node", NODE_PASSWORD)
        seed_user(tmp_path / f"data{n}", "alice", ALICE_PASSWORD)
    cluster = start_replicated_cluster(tmp_path, etcd, 3, topic_manifest("orders", 1, replicas=3),
                                       node_args=replication_listener(pki, password_file))
    try:
        cluster.wait_for_isr("orders", 0, (0, 1, 2))
        # Clients use the listener every node is registered with: SASL_SSL, as user alice.
        bootstrap = ",".join(f"127.0.0.1:{s.replication_port}" for s in cluster.servers.values())
        producer = Producer({"bootstrap.servers": bootstrap, "security.protocol": "SASL_SSL",
                             "sasl.mechanisms": "SCRAM-SHA-512", "sasl.username": "alice",
                             "sasl.password": ALICE_PASSWORD, "ssl.ca.location": pki.ca, "acks": "all"})
        for i in range(20):
            producer.produce("orders", value=f"r{i}".encode())
        assert producer.flush(60) == 0
        assert cluster.high_watermark("orders", 0) == 20
        cluster.wait_identical_below("orders", 0, 20, (0, 1, 2))
        leader = cluster.wait_for_leader("orders", 0).leader
        log = cluster.servers[leader].log()
        followers = [n for n in range(3) if n != leader]
        assert log.count("listener REPLICATION: client 'shale-inter-broker-node'") >= len(followers)
        assert "authenticated as User:node with SCRAM-SHA-512" in log
        for server in cluster.servers.values():
            assert NODE_PASSWORD not in server.log() and ALICE_PASSWORD not in server.log()
    finally:
        cluster.stop()


def test_a_node_with_a_wrong_inter_broker_password_replicates_nothing(tmp_path, etcd):
    """Node 1's inter-broker password is wrong: node 0 refuses its fetches (logged on both sides, no password
    in either log), so node 1 drops out of the ISR of every partition node 0 leads, and stays out."""
    pki = make_pki(tmp_path / "pki")
    good, bad = tmp_path / "node.password", tmp_path / "wrong.password"
    good.write_text(NODE_PASSWORD)
    bad.write_text("not-the-node-password")
    for n in range(2):
        seed_user(tmp_path / f"data{n}", "node", NODE_PASSWORD)
    good_args, bad_args = replication_listener(pki, good), replication_listener(pki, bad)
    cluster = start_replicated_cluster(tmp_path, etcd, 2, topic_manifest("orders", 4, replicas=2),
                                       extra=("--override", "offsets.topic.replication.factor=2",
                                              "--override", "replica.lag.time.max.ms=2000"),
                                       node_args=lambda s: good_args(s) if s.node_id == 0 else bad_args(s))
    try:
        refused = "SaslAuthenticate as 'node' with SCRAM-SHA-512: SASL_AUTHENTICATION_FAILED"
        wait_for(lambda: refused in cluster.servers[1].log(), 60, what="node 1's refused authentication")
        assert "authentication of client 'shale-inter-broker-node'" in cluster.servers[0].log()
        wait_for(lambda: all(p.isr == (1, 0) or p.isr == (0, 1) for p in cluster.metadata("orders").values()
                             if p.leader == 1), 60, what="node 0 in the ISR of node 1's partitions")
        # created with both replicas in sync, node 1 falls out once it has not fetched for replica.lag.time.max.ms
        wait_for(lambda: all(p.isr == (0,) for p in cluster.metadata("orders").values() if p.leader == 0), 60,
                 what="node 1 out of the ISR of node 0's partitions")
        for server in cluster.servers.values():
            assert "not-the-node-password" not in server.log() and NODE_PASSWORD not in server.log()
    finally:
        cluster.stop()
