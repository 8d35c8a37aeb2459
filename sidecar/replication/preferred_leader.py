"""Preferred leader election (Kafka's `auto.leader.rebalance.enable`), as pure rules.

A partition's preferred leader is the first replica of its assignment. After a failover the leadership stays
where the election put it, so a rolling restart ends with every partition led by the nodes restarted first.
Kafka's controller checks every `leader.imbalance.check.interval.seconds` whether a broker's share of the
partitions it prefers but does not lead exceeds `leader.imbalance.per.broker.percentage`, and then elects the
preferred replica of each such partition if it is in the ISR. Here the current leader makes that check for
the partitions it leads, from the store's view, and proposes the handover through the controller as it
proposes an ISR change (a compare-and-set on the record: a new leader epoch, the ISR and replicas unchanged);
`is_handover` is the check every writer's proposal must pass. docs/replication.md, "Preferred leaders".
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
    the ISR or not the process it was in sync as (KIP-903), not live, or the partition is being reassigned (the
    move chooses its leader) or recovering from an unclean election."""
    if record.leader == NO_LEADER or not record.replicas or record.adding_replicas or record.removing_replicas \
            or record.recovering:
        return None
    preferred = record.replicas[0]
    if preferred == record.leader or preferred not in record.isr or not view.is_live(preferred):
        return None
    incarnation = view.nodes[preferred].incarnation
    if record.isr_incarnation(preferred) not in (UNKNOWN_INCARNATION, incarnation):
        return None
    return record.changed(leader=preferred, leader_incarnation=incarnation)


def is_handover(based_on: PartitionRecord, new: PartitionRecord) -> bool:
    """`new` is exactly `handover(based_on, …)`: the leadership moved to the preferred replica, in the ISR, one
    leader epoch later, nothing else changed."""
    if not based_on.replicas or based_on.leader == NO_LEADER or based_on.adding_replicas \
            or based_on.removing_replicas or based_on.recovering:
        return False
    preferred = based_on.replicas[0]
    return (preferred != based_on.leader and preferred in based_on.isr and new.leader == preferred
            and new.leader_epoch == based_on.leader_epoch + 1 and new.partition_epoch == based_on.partition_epoch + 1
            and (new.replicas, new.isr, new.isr_incarnations, new.adding_replicas, new.removing_replicas,
                 new.recovering) == (based_on.replicas, based_on.isr, based_on.isr_incarnations,
                                     based_on.adding_replicas, based_on.removing_replicas, based_on.recovering))
