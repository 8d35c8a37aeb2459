"""Preferred leader election (sidecar/replication/preferred_leader.py): the pure rules, the controller's check
of a handover proposal, and a real three-node cluster whose preferred leader, SIGKILLed and restarted, gets its
leadership back under `acks=all` load with nothing acknowledged lost."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given
from hypothesis import strategies as st
from store_util import node

from shale.sidecar.log.topic_partition import TopicPartition
from shale.sidecar.replication.control_store import StoreView
from shale.sidecar.replication.controller import alter_partition_error
from shale.sidecar.replication.preferred_leader import handover, imbalanced, is_handover
from shale.sidecar.replication.store_records import NO_LEADER, PartitionRecord
from support.fault_util import AckedLoad, check_acknowledged
from support.node_util import start_replicated_cluster, topic_manifest, wait_for

LIVE = StoreView("1", {n: node(n, f"i{n}") for n in (1, 2, 3)})
MOVED = PartitionRecord(replicas=(1, 2, 3), isr=(2, 3, 1), leader=2, leader_incarnation="i2", leader_epoch=4,
                        partition_epoch=9, isr_incarnations=("i2", "i3", "i1"))


def test_the_preferred_replica_back_in_the_isr_is_handed_the_leadership():
    new = handover(MOVED, LIVE)
    assert (new.leader, new.leader_incarnation, new.leader_epoch, new.partition_epoch) == (1, "i1", 5, 10)
    assert (new.replicas, new.isr, new.isr_incarnations) == (MOVED.replicas, MOVED.isr, MOVED.isr_incarnations)
    assert is_handover(MOVED, new) and alter_partition_error(MOVED, new) is None


def test_no_handover_while_the_preferred_replica_cannot_lead():
    assert handover(replace(MOVED, leader=1, leader_incarnation="i1"), LIVE) is None  # it leads already
    assert handover(replace(MOVED, isr=(2, 3), isr_incarnations=("i2", "i3")), LIVE) is None  # out of the ISR
    assert handover(MOVED, StoreView("1", {n: node(n, f"i{n}") for n in (2, 3)})) is None  # not live
    restarted = StoreView("1", {**LIVE.nodes, 1: node(1, "i1-again")})
    assert handover(MOVED, restarted) is None  # KIP-903: another process than the one in sync
    assert handover(replace(MOVED, adding_replicas=(3,)), LIVE) is None  # a reassignment chooses its leader
    assert handover(replace(MOVED, recovering=True), LIVE) is None
    assert handover(replace(MOVED, leader=NO_LEADER, leader_incarnation=""), LIVE) is None  # offline: elections


def test_the_controller_refuses_anything_but_the_exact_handover():
    new = handover(MOVED, LIVE)
    for wrong in (replace(new, leader=3, leader_incarnation="i3"),
                  replace(new, isr=(2, 1), isr_incarnations=("i2", "i1")),
                  replace(new, leader_epoch=new.leader_epoch + 1), replace(new, replicas=(1, 3, 2))):
        assert not is_handover(MOVED, wrong) and alter_partition_error(MOVED, wrong) is not None


@given(st.permutations([1, 2, 3]), st.lists(st.sampled_from([1, 2, 3]), min_size=1, max_size=3, unique=True),
       st.integers(0, 3), st.sets(st.sampled_from([1, 2, 3])))
def test_every_handover_passes_the_controllers_check(replicas, isr, leader_index, live):
    leader = isr[leader_index] if leader_index < len(isr) else NO_LEADER
    record = PartitionRecord(replicas=tuple(replicas), isr=tuple(isr), leader=leader,
                             leader_incarnation="" if leader == NO_LEADER else f"i{leader}", leader_epoch=2,
                             partition_epoch=3)
    view = StoreView("1", {n: node(n, f"i{n}") for n in live})
    new = handover(record, view)
    if new is not None:
        assert is_handover(record, new) and new.leader == replicas[0] in view.nodes
    else:
        assert leader in (NO_LEADER, replicas[0]) or replicas[0] not in isr or replicas[0] not in live


def test_a_node_is_imbalanced_above_its_share_of_preferred_partitions_it_does_not_lead():
    led_by_2 = [PartitionRecord(replicas=(1, 2), isr=(1, 2), leader=2)] * 2
    led_by_1 = [PartitionRecord(replicas=(1, 2), isr=(1, 2), leader=1)] * 18
    assert imbalanced(led_by_1 + led_by_2, LIVE, 10) == set()  # 2 of 20: 10 %, not above
    assert imbalanced(led_by_1[:17] + led_by_2, LIVE, 10) == {1}  # 2 of 19
    assert imbalanced(led_by_2, StoreView("1", {2: node(2, "i2")}), 10) == set()  # node 1 is not live


def test_a_restarted_preferred_leader_gets_its_leadership_back_and_nothing_acknowledged_is_lost(tmp_path, etcd):
    cluster = start_replicated_cluster(tmp_path, etcd, 3, topic_manifest(
        "pref", 1, {"min.insync.replicas": 2}, assignment={"partitions": [[0, 1, 2]]}),
        extra=("--override", "leader.imbalance.check.interval.seconds=1"))
    tp = TopicPartition("pref", 0)
    load = AckedLoad("confluent", cluster.bootstrap, "pref")
    try:
        assert cluster.wait_for_leader("pref", 0).leader == 0
        load.start().wait_for_acks(50)
        cluster.kill(0)
        moved = cluster.wait_for_leader("pref", 0, excluding=(0,))
        load.wait_for_acks(len(load.acked) + 50)
        cluster.restart(0)
        back = wait_for(lambda: (m := cluster.metadata("pref")[0]).leader == 0 and set(m.isr) == {0, 1, 2} and m,
                        60, interval=0.2, what="node 0 to lead its preferred partition again")
        assert back.leader_epoch > moved.leader_epoch
        load.wait_for_acks(len(load.acked) + 50)  # acknowledged by the preferred leader
        acked = load.stop()
        assert load.failed == [], load.failed[:3]
        check_acknowledged(cluster, tp.topic, tp.partition, acked)
    finally:
        load.close()
        cluster.stop()
