"""docs/replication.md's failure table, last rows: every ISR member gone. Without unclean leader election the
partition stays offline (leader -1) until an ISR member returns, and loses nothing; with it, an out-of-sync
replica leads and what only the dead ISR held is lost — Kafka's trade, made explicit by the topic's config."""

from __future__ import annotations

import time

from confluent_kafka import Producer

from shale.sidecar.log.records import decode_batch
from support.fault_util import check_acknowledged
from support.node_util import start_replicated_cluster, topic_manifest

LEADER_NOT_AVAILABLE = 5
TWO_NODES = ("--override", "offsets.topic.replication.factor=2")


def produce(cluster, values: list[bytes]) -> list[tuple[int, int, bytes]]:
    producer = Producer({"bootstrap.servers": cluster.bootstrap, "acks": "all", "message.timeout.ms": 30000})
    acked = []
    for v in values:
        producer.produce("fragile", value=v, on_delivery=lambda err, msg: acked.append(
            (msg.partition(), msg.offset(), msg.value()) if err is None else err))
    assert producer.flush(40) == 0
    assert all(isinstance(a, tuple) for a in acked), acked
    return acked


def values_of(cluster, node: int) -> dict[int, bytes]:
    return {r.offset: r.value for _, raw in cluster.batches(node, "fragile", 0) for r in decode_batch(raw).records}


def lose_the_whole_isr(cluster) -> tuple[int, int, list]:
    """Write to both replicas, then to the leader alone (the follower dead), then kill the leader too."""
    acked = produce(cluster, [b"both-%d" % i for i in range(10)])
    state = cluster.wait_for_isr("fragile", 0)
    leader = state.leader
    follower = next(r for r in state.replicas if r != leader)
    cluster.kill(follower)
    cluster.wait_for_isr("fragile", 0, isr=(leader,))
    acked += produce(cluster, [b"leader-only-%d" % i for i in range(10)])  # min.insync.replicas=1
    cluster.kill(leader)
    return leader, follower, acked


def test_unclean_election_disabled_keeps_the_partition_offline_until_an_isr_member_returns(tmp_path, etcd):
    cluster = start_replicated_cluster(tmp_path, etcd, 2, topic_manifest("fragile", 1, replicas=2), extra=TWO_NODES)
    try:
        leader, follower, acked = lose_the_whole_isr(cluster)
        cluster.restart(follower)
        cluster.wait_for_members()
        time.sleep(3)  # more than a session: time enough for a wrong election to happen
        state = cluster.metadata("fragile")[0]
        assert (state.leader, state.error_code) == (-1, LEADER_NOT_AVAILABLE)
        assert state.isr == (leader,)  # the last replica standing is remembered
        cluster.restart(leader)
        back = cluster.wait_for_leader("fragile", 0)
        assert back.leader == leader
        check_acknowledged(cluster, "fragile", 0, acked)  # nothing lost, the follower caught up
    finally:
        cluster.stop()


def test_unclean_election_enabled_lets_an_out_of_sync_replica_lead_and_loses_what_it_lacked(tmp_path, etcd):
    cluster = start_replicated_cluster(
        tmp_path, etcd, 2, topic_manifest("fragile", 1, replicas=2, config={"unclean.leader.election.enable": True}),
        extra=TWO_NODES)
    try:
        leader, follower, acked = lose_the_whole_isr(cluster)
        cluster.restart(follower)
        state = cluster.wait_for_leader("fragile", 0)
        assert state.leader == follower and state.isr == (follower,)
        after = produce(cluster, [b"after-%d" % i for i in range(5)])
        assert [o for _, o, _ in after] == list(range(10, 15))  # the dead leader's offsets 10..19 are reused
        cluster.restart(leader)
        check_acknowledged(cluster, "fragile", 0, acked[:10] + after)
        kept = values_of(cluster, leader)
        assert [kept[o] for o in range(15)] == [b"both-%d" % i for i in range(10)] + [b"after-%d" % i for i in
                                                                                       range(5)]
        assert not any(v.startswith(b"leader-only") for v in kept.values())  # truncated away, as in Kafka
    finally:
        cluster.stop()
