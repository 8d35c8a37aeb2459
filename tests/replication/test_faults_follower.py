"""docs/replication.md's failure table, the followers' and the store's rows: a follower cut off by the network
(tests/support/fault_proxy.py between it and the leader), a follower restarted, the store stopped — with real producers
writing `acks=all` throughout, never restarted, and the invariants of `fault_util.check_acknowledged` after."""

from __future__ import annotations

import re
import time

import pytest
from confluent_kafka import Consumer, TopicPartition

from support.fault_proxy import FREEZE, RESET
from support.fault_util import CLIENTS, AckedLoad
from support.node_util import fetch_session_errors, start_replicated_cluster, topic_manifest, wait_for

TOPIC = topic_manifest("load", 1, replicas=3, config={"min.insync.replicas": 2})
LAG_MAX = ("--override", "replica.lag.time.max.ms=3000")
SHRINKS = re.compile(r"load-0: leader (\d+) proposes isr \[([\d, ]*)\] -> \[([\d, ]*)\]")


def shrinks_of(log: str, replica: int) -> list[str]:
    """The leader's ISR proposals that removed `replica`."""
    return [m.group(0) for m in SHRINKS.finditer(log)
            if str(replica) in m.group(2).split(", ") and str(replica) not in m.group(3).split(", ")]


@pytest.mark.parametrize("cut", [FREEZE, RESET])
@pytest.mark.parametrize("client", CLIENTS)
def test_follower_cut_off_is_shrunk_out_and_rejoins_once_healed(tmp_path, etcd, client, cut):
    cluster = start_replicated_cluster(tmp_path, etcd, 3, TOPIC, extra=LAG_MAX, proxies=True)
    load = AckedLoad(client, cluster.bootstrap, "load")
    try:
        load.start().wait_for_acks(50)
        state = cluster.wait_for_isr("load", 0)
        leader, follower = state.leader, next(r for r in state.replicas if r != state.leader)
        wait_for(lambda: follower in cluster.proxies[leader].replicas_seen(), what=f"node {follower}'s fetches")
        cluster.proxies[leader].cut_replica(follower, cut)
        others = tuple(r for r in state.replicas if r != follower)
        shrunk = cluster.wait_for_isr("load", 0, isr=others)
        assert shrunk.leader == leader and shrunk.leader_epoch == state.leader_epoch  # no election, only the ISR
        # acks=all goes on with two in sync (min.insync.replicas=2), and the cut follower falls behind.
        load.wait_for_acks(len(load.acked) + 100)
        held = max((h.last_offset for h, _ in cluster.batches(follower, "load", 0)), default=-1)
        assert held < max(o for _, o, _ in load.acked)
        cluster.proxies[leader].heal()
        cluster.wait_for_isr("load", 0)  # caught up: expanded again
        load.wait_for_acks(len(load.acked) + 50)
        load.finish(cluster)
        assert cluster.proxies[leader].cut_count >= 1
        # The cut lost the answer to the fetch in flight; the follower started its session over by itself
        # (FetchSessionHandler.failed) instead of being told its epoch was stale.
        assert fetch_session_errors(cluster.servers[leader].http_port) == {"FETCH_SESSION_ID_NOT_FOUND": 0,
                                                                         "INVALID_FETCH_SESSION_EPOCH": 0}
    finally:
        load.close()
        cluster.stop()


def test_follower_restarted_is_shrunk_out_at_once_and_expanded_when_caught_up(tmp_path, etcd):
    cluster = start_replicated_cluster(tmp_path, etcd, 3, TOPIC)
    load = AckedLoad("confluent", cluster.bootstrap, "load")
    try:
        load.start().wait_for_acks(50)
        state = cluster.wait_for_isr("load", 0)
        follower = next(r for r in state.replicas if r != state.leader)
        cluster.restart(follower)  # SIGKILL and start again at once: a new incarnation before the old expires
        load.wait_for_acks(len(load.acked) + 100)
        cluster.wait_for_isr("load", 0)
        load.wait_for_acks(len(load.acked) + 50)
        load.finish(cluster)
        leader_log = cluster.servers[cluster.wait_for_leader("load", 0).leader].log()
        assert shrinks_of(leader_log, follower), f"node {follower} was never shrunk out of the ISR"
    finally:
        load.close()
        cluster.stop()


@pytest.mark.parametrize("client", CLIENTS)
def test_store_stopped_leaders_stop_acknowledging_reads_go_on_and_writes_resume(tmp_path, etcd, client):
    cluster = start_replicated_cluster(tmp_path, etcd, 3, TOPIC)
    load = AckedLoad(client, cluster.bootstrap, "load")
    try:
        load.start().wait_for_acks(100)
        etcd.stop()

        def stalled() -> bool:  # no acknowledgement for a while: every leader has stopped acknowledging
            before = len(load.acked)
            time.sleep(1.0)
            return len(load.acked) == before

        wait_for(stalled, timeout=30, interval=0, what="the leaders to stop acknowledging without the store")
        during = len(load.acked)
        committed = sorted(o for _, o, _ in load.acked)[:50]
        consumer = Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": "unused",
                             "enable.auto.commit": False})
        try:  # committed data stays readable from the fenced leader
            consumer.assign([TopicPartition("load", 0, 0)])
            read = set()
            deadline = time.monotonic() + 30
            while not set(committed) <= read and time.monotonic() < deadline:
                msg = consumer.poll(0.5)
                if msg is not None and msg.error() is None:
                    read.add(msg.offset())
        finally:
            consumer.close()
        assert set(committed) <= read
        assert len(load.acked) == during, "a write was acknowledged while no node could hold a session"
        etcd.start()
        load.wait_for_acks(during + 50, timeout=90)
        load.finish(cluster)
    finally:
        load.close()
        cluster.stop()
