"""A leader's session ended early (docs/replication.md, "Ending a dead leader's session"), with real
`shale serve` processes on etcd and real producers writing `acks=all` with `min.insync.replicas=2`.

Sessions here last 120 s and every wait is shorter: a partition that moves at all moved because a peer ended
its leader's session. The first test is the mechanism (a SIGKILLed leader's followers find nobody listening at
its address); the second is its safety argument, with a leader that is alive when its session is ended (what a
mistaken peer would do): the election among the ISR is clean, the old leader finds out at its next renewal, and
either way every acknowledged record is at its offset and no epoch had two leaders (`AckedLoad.finish`).
"""

from __future__ import annotations

import pytest

from shale.sidecar.replication.store.etcd_store import EtcdStore
from support.fault_util import CLIENTS, AckedLoad
from support.node_util import start_replicated_cluster, topic_manifest, wait_for

TOPIC = topic_manifest("load", 1, replicas=3, config={"min.insync.replicas": 2})
LONG_SESSIONS = ("--override", "broker.session.timeout.ms=120000", "--override", "broker.heartbeat.interval.ms=2000")
WAIT_S = 60.0  # half a session


@pytest.mark.parametrize("client", CLIENTS)
def test_a_sigkilled_leader_fails_over_before_its_session_could_expire(tmp_path, etcd, client):
    cluster = start_replicated_cluster(tmp_path, etcd, 3, TOPIC, extra=LONG_SESSIONS)
    load = AckedLoad(client, cluster.bootstrap, "load")
    try:
        load.start().wait_for_acks(50)
        for _ in range(2):
            old = cluster.wait_for_isr("load", 0, timeout=WAIT_S)
            cluster.kill(old.leader)
            cluster.wait_for_leader("load", 0, excluding=(old.leader,), newer_than=old.leader_epoch, timeout=WAIT_S)
            load.wait_for_acks(len(load.acked) + 50, timeout=WAIT_S)  # the same client writes on
            logs = "".join(cluster.servers[n].log() for n in cluster.servers if n != old.leader)
            assert f"leader node {old.leader} (incarnation" in logs and "ended its session" in logs
            cluster.restart(old.leader)
        load.finish(cluster)
    finally:
        load.close()
        cluster.stop()


@pytest.mark.parametrize("client", CLIENTS)
def test_a_live_leader_whose_session_is_ended_loses_nothing_acknowledged(tmp_path, etcd, client):
    cluster = start_replicated_cluster(tmp_path, etcd, 3, TOPIC, extra=LONG_SESSIONS)
    load = AckedLoad(client, cluster.bootstrap, "load")
    peer = EtcdStore([etcd.endpoint], "shale")
    try:
        load.start().wait_for_acks(50)
        for _ in range(2):
            old = cluster.wait_for_isr("load", 0, timeout=WAIT_S)
            registration = peer.view().nodes[old.leader]
            assert peer.end_session(registration)  # the leader is alive and acknowledging meanwhile
            cluster.wait_for_leader("load", 0, excluding=(old.leader,), newer_than=old.leader_epoch, timeout=WAIT_S)
            wait_for(lambda: "fenced, incarnation " + registration.incarnation in cluster.servers[old.leader].log(),
                     WAIT_S, what=f"node {old.leader} to find its session ended")
            load.wait_for_acks(len(load.acked) + 50, timeout=WAIT_S)
        load.finish(cluster)
    finally:
        peer.close()
        load.close()
        cluster.stop()
