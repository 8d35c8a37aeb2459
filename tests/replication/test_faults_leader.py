"""docs/replication.md's failure table, the leader's rows: a leader SIGKILLed, or paused past its session,
while real producers write with `acks=all` and `min.insync.replicas=2`. The producers are never restarted;
afterwards every acknowledged record is at its acknowledged offset, the replicas are byte-identical below the
high watermark, and no leader epoch had two leaders."""

from __future__ import annotations

import time

import pytest

from support.fault_util import CLIENTS, AckedLoad
from support.node_util import start_replicated_cluster, topic_manifest

TOPIC = topic_manifest("load", 1, replicas=3, config={"min.insync.replicas": 2})
KILLS = 3


@pytest.mark.parametrize("client", CLIENTS)
def test_leader_sigkill_under_acks_all_load_loses_no_acknowledged_record(tmp_path, etcd, client):
    cluster = start_replicated_cluster(tmp_path, etcd, 3, TOPIC)
    load = AckedLoad(client, cluster.bootstrap, "load")
    try:
        load.start().wait_for_acks(50)
        epochs = []
        for _ in range(KILLS):
            old = cluster.wait_for_leader("load", 0)
            cluster.kill(old.leader)
            acked_before_failover = len(load.acked)
            new = cluster.wait_for_leader("load", 0, excluding=(old.leader,), newer_than=old.leader_epoch)
            epochs.append((old.leader, old.leader_epoch, new.leader, new.leader_epoch))
            load.wait_for_acks(acked_before_failover + 50)  # the same client writes on to the new leader
            cluster.restart(old.leader)
        acked, hw = load.finish(cluster)
        assert hw >= len(acked)
        assert len({e[3] for e in epochs}) == KILLS  # each kill moved the partition to a new epoch
    finally:
        load.close()
        cluster.stop()


@pytest.mark.parametrize("client", CLIENTS)
def test_leader_paused_past_its_session_becomes_a_follower_and_loses_nothing_acknowledged(tmp_path, etcd, client):
    cluster = start_replicated_cluster(tmp_path, etcd, 3, TOPIC)
    load = AckedLoad(client, cluster.bootstrap, "load")
    try:
        load.start().wait_for_acks(50)
        old = cluster.wait_for_leader("load", 0)
        cluster.servers[old.leader].pause()
        new = cluster.wait_for_leader("load", 0, excluding=(old.leader,), newer_than=old.leader_epoch)
        load.wait_for_acks(len(load.acked) + 50)
        time.sleep(1)  # well past its session: the paused leader must find out by itself when it wakes
        cluster.servers[old.leader].resume()
        state = cluster.wait_for_isr("load", 0)  # back as a follower, caught up
        assert state.leader != old.leader or state.leader_epoch > new.leader_epoch
        load.wait_for_acks(len(load.acked) + 50)
        load.finish(cluster)
        woke = cluster.servers[old.leader].log()
        assert "fenced" in woke, "the paused leader never noticed that its session was gone"
    finally:
        load.close()
        cluster.stop()


def test_leader_sigkill_of_the_group_coordinator_keeps_the_committed_offsets(tmp_path, etcd):
    from confluent_kafka import Consumer, Producer, TopicPartition
    from kafka.protocol.metadata.find_coordinator import FindCoordinatorRequest, FindCoordinatorResponse

    from shale.sidecar.server.coordinator.group.offset_records import partition_for
    from support.clients_util import build, call

    cluster = start_replicated_cluster(tmp_path, etcd, 3, topic_manifest("events", 1, replicas=3),
                                       extra=("--override", "group.initial.rebalance.delay.ms=0"))
    try:
        producer = Producer({"bootstrap.servers": cluster.bootstrap, "acks": "all"})
        for i in range(20):
            producer.produce("events", value=b"e%d" % i)
        assert producer.flush(30) == 0

        def consumer() -> Consumer:
            c = Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": "readers",
                          "auto.offset.reset": "earliest", "enable.auto.commit": False})
            c.subscribe(["events"])
            return c

        first = consumer()
        try:
            seen = []
            deadline = time.monotonic() + 30
            while len(seen) < 10 and time.monotonic() < deadline:
                msg = first.poll(0.5)
                if msg is not None and msg.error() is None:
                    seen.append(msg.offset())
            assert seen[:10] == list(range(10))
            first.commit(offsets=[TopicPartition("events", 0, 10)], asynchronous=False)
        finally:
            first.close()
        group_partition = partition_for("readers", 5)  # offsets.topic.num.partitions=5 in the test clusters
        coordinator = call(cluster.servers[0].port, build(FindCoordinatorRequest, {"key": "readers", "key_type": 0},
                                                          version=1), FindCoordinatorResponse).node_id
        old = cluster.wait_for_leader("__consumer_offsets", group_partition)
        assert coordinator == old.leader  # the coordinator is its offsets partition's leader
        cluster.kill(coordinator)
        new = cluster.wait_for_leader("__consumer_offsets", group_partition, excluding=(coordinator,),
                                      newer_than=old.leader_epoch)
        second = consumer()
        try:
            deadline = time.monotonic() + 30
            msg = None
            while time.monotonic() < deadline:
                msg = second.poll(0.5)
                if msg is not None and msg.error() is None:
                    break
            assert msg is not None and msg.error() is None and msg.offset() == 10  # resumed at the commit
            assert second.committed([TopicPartition("events", 0)], timeout=10)[0].offset == 10
        finally:
            second.close()
        answer = call(cluster.servers[new.leader].port, build(FindCoordinatorRequest, {"key": "readers",
                                                                                        "key_type": 0}, version=1),
                      FindCoordinatorResponse)
        assert answer.node_id == new.leader
    finally:
        cluster.stop()
