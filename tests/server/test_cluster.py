"""Several `shale serve` processes form one cluster through the assignment in the Topic manifests."""

from __future__ import annotations

import time

from confluent_kafka import Consumer, Producer, TopicPartition
from kafka.protocol.metadata.find_coordinator import FindCoordinatorRequest, FindCoordinatorResponse

from support.clients_util import build, call
from support.node_util import start_cluster


def test_metadata_sends_each_client_to_the_node_that_owns_each_partition(tmp_path):
    servers = start_cluster(tmp_path, "spread", [0, 1, 1, 0])
    try:
        producer = Producer({"bootstrap.servers": servers[0].bootstrap, "acks": "all", "linger.ms": 5})
        # librdkafka's all-topics Metadata (v13, with three bytes after the body) is answered.
        assert "spread" in producer.list_topics(timeout=10).topics
        delivered = []
        for i in range(40):
            producer.produce("spread", key=b"k%d" % i, value=b"v%d" % i, partition=i % 4,
                             on_delivery=lambda err, msg: delivered.append((err, msg.partition(), msg.offset())))
        assert producer.flush(20) == 0
        assert [e for e, _, _ in delivered if e is not None] == []
        assert sorted((p, o) for _, p, o in delivered) == [(p, o) for p in range(4) for o in range(10)]

        # Each node holds exactly the partitions assigned to it.
        held = {n: sorted(d.name for d in (tmp_path / f"data{n}").iterdir() if d.name.startswith("spread-"))
                for n in (0, 1)}
        assert held == {0: ["spread-0", "spread-3"], 1: ["spread-1", "spread-2"]}

        # A consumer bootstrapped from node 1 reads every partition, wherever it lives.
        consumer = Consumer({"bootstrap.servers": servers[1].bootstrap, "group.id": "unused",
                             "enable.auto.commit": False})
        try:
            consumer.assign([TopicPartition("spread", p, 0) for p in range(4)])
            got = set()
            deadline = time.monotonic() + 20
            while len(got) < 40 and time.monotonic() < deadline:
                msg = consumer.poll(0.5)
                if msg is not None and msg.error() is None:
                    got.add((msg.partition(), msg.offset(), msg.key(), msg.value()))
        finally:
            consumer.close()
        assert got == {(i % 4, i // 4, b"k%d" % i, b"v%d" % i) for i in range(40)}
    finally:
        for s in servers:
            assert s.terminate() == 0


def test_a_group_spread_over_two_nodes_has_one_coordinator(tmp_path):
    """Members bootstrapped from different nodes find the same coordinator and split the partitions."""
    servers = start_cluster(tmp_path, "shared", [0, 1, 0, 1], "--override", "group.initial.rebalance.delay.ms=100")
    consumers = []
    try:
        # Every node names node 0 (the lowest id) as the group's coordinator.
        for s in servers:
            req = build(FindCoordinatorRequest, {"key": "spread-group", "key_type": 0}, version=1)
            resp = call(s.port, req, FindCoordinatorResponse)
            assert (resp.error_code, resp.node_id, resp.port) == (0, 0, servers[0].port)
        for s in servers:
            c = Consumer({"bootstrap.servers": s.bootstrap, "group.id": "spread-group",
                          "auto.offset.reset": "earliest", "session.timeout.ms": 6000,
                          "heartbeat.interval.ms": 500})
            c.subscribe(["shared"])
            consumers.append(c)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            for c in consumers:
                c.poll(0.2)
            owned = [sorted(tp.partition for tp in c.assignment()) for c in consumers]
            if sorted(p for ps in owned for p in ps) == [0, 1, 2, 3] and all(len(ps) == 2 for ps in owned):
                break
        assert sorted(p for ps in owned for p in ps) == [0, 1, 2, 3] and all(len(ps) == 2 for ps in owned), owned
    finally:
        for c in consumers:
            c.close()
        for s in servers:
            assert s.terminate() == 0
