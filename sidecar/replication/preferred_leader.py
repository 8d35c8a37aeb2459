"""Preferred leader election (Kafka's `auto.leader.rebalance.enable`), as pure rules.

A partition's preferred leader is the first replica of its assignment. After a failover the leadership stays
where the election put it, so a rolling restart ends with every partition led by the nodes restarted first.
Kafka's controller checks every `leader.imbalance.check.interval.seconds` whether a broker's share of the
partitions it prefers but does not lead exceeds `leader.imbalance.per.broker.percentage`, and then elects the
preferred replica of each such partition if it is in the ISR. Here the current leader makes that check for
the partitions it leads, from the store's view, and proposes the handover through the controller as it
proposes an ISR change (a compare-and-set on the record: a new leader epoch, the ISR and replicas unchanged);
`is_handover` is the check every writer's proposal must pass. A stopping leader moves its leaderships away
through the same path (`leader_move_away`, docs/day-2-operations.md section 2). docs/replication.md,
"Preferred leaders".
"""

from __future__ import annotations

from typing import Iterable

from .control_store import StoreView
from .store_records import NO_LEADER, UNKNOWN_INCARNATION, PartitionRecord


def imbalanced(records: Iterable[PartitionRecord], view: StoreView, percentage: int) -> set[int]:
    """The live nodes whose ratio of partitions they prefer but do not lead is above `percentage` % (Kafka's
    `leader.imbalance.per.broker.percentage`, checked per broker)."""
    preferred: dict[int, int] = {}
    not_led: dict[int, int] = {}
    for record in records:
        if not record.replicas:
            continue
        first = record.replicas[0]
        preferred[first] = preferred.get(first, 0) + 1
        if record.leader != first:
            not_led[first] = not_led.get(first, 0) + 1
    return {node for node, count in preferred.items()
            if view.is_live(node) and not_led.get(node, 0) * 100 > percentage * count}


def handover(record: PartitionRecord, view: StoreView) -> PartitionRecord | None:
    """The record that makes the preferred replica lead, or None while it cannot: it leads already, it is out of
    the ISR or not the process it was in sync as (KIP-903), not live, stopping (the current leader is live and
    in sync), or the partition is being reassigned (the move chooses its leader) or recovering from an unclean
    election."""
    if not record.replicas or record.replicas[0] == record.leader:
        return None
    return _moved_to(record, view, record.replicas[0])


def leader_move_away(record: PartitionRecord, view: StoreView, node: int) -> PartitionRecord | None:
    """The record that moves the leadership off the stopping leader `node` to the first other ISR member (in
    the assignment's order, as elections choose) that could take it as `handover` requires; None when `node`
    does not lead or no member can: the partition then keeps its leader, since moving it would take it offline
    (docs/day-2-operations.md, section 2)."""
    if record.leader != node:
        return None
    return next((new for member in record.replicas if member != node
                 if (new := _moved_to(record, view, member)) is not None), None)


def _moved_to(record: PartitionRecord, view: StoreView, member: int) -> PartitionRecord | None:
    """`record` led by `member` one leader epoch later, if it may lead: a live, in-sync member, the process it
    was in sync as, not stopping, of a partition with a leader and neither reassigned nor recovering."""
    if not _movable(record) or member not in record.isr or not view.is_live(member) or view.is_stopping(member):
        return None
    incarnation = view.nodes[member].incarnation
    if record.isr_incarnation(member) not in (UNKNOWN_INCARNATION, incarnation):
        return None
    return record.changed(leader=member, leader_incarnation=incarnation)


def _movable(record: PartitionRecord) -> bool:
    return (record.leader != NO_LEADER and bool(record.replicas) and not record.adding_replicas
            and not record.removing_replicas and not record.recovering)


def is_handover(based_on: PartitionRecord, new: PartitionRecord) -> bool:
    """`new` moves the leadership as `handover` or `leader_move_away` do: to another member of the ISR, one
    leader epoch later, nothing else changed. (Whether that member is live, the process it was in sync as and
    not stopping is the proposer's view; the controller checks what the record alone shows.)"""
    return (_movable(based_on) and new.leader != based_on.leader and new.leader in based_on.isr
            and new.leader_epoch == based_on.leader_epoch + 1 and new.partition_epoch == based_on.partition_epoch + 1
            and (new.replicas, new.isr, new.isr_incarnations, new.adding_replicas, new.removing_replicas,
                 new.recovering) == (based_on.replicas, based_on.isr, based_on.isr_incarnations,
                                     based_on.adding_replicas, based_on.removing_replicas, based_on.recovering))
