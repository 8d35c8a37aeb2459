"""Moving a partition's replicas between nodes (KIP-455): the record transitions, as pure functions.

A reassignment lives in the partition record (docs/moves.md, "Reassignment between nodes"): `replicas` is the
target followed by the replicas being removed, `adding_replicas` the target's newcomers, `removing_replicas`
the replicas that go. Newcomers follow the leader as any replica does and join the ISR by Kafka's rules; once
every target replica is in the ISR the leader completes the move (its compare-and-set on the record, as an
ISR change): replicas = target, ISR ∩ target, and a new leader if the old one is removed. Cancelling reverts
to the replicas before the move. These are Kafka's `PartitionReassignmentReplicas`,
`PartitionReassignmentRevert` and `PartitionChangeBuilder.completeReassignmentIfNeeded`.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping

from .store_records import NO_LEADER, UNKNOWN_INCARNATION, PartitionRecord


class InvalidTarget(ValueError):
    """A target replica list Kafka refuses (INVALID_REPLICA_ASSIGNMENT); the message says why."""


def check_target(target: tuple[int, ...], live: Iterable[int]) -> None:
    """Kafka's checks of a manual assignment: not empty, distinct, every node registered (here: live)."""
    if not target:
        raise InvalidTarget("the target replica list is empty")
    if len(set(target)) != len(target):
        raise InvalidTarget(f"the target replica list {list(target)} names a node twice")
    unknown = sorted(set(target) - set(live))
    if unknown:
        raise InvalidTarget(f"the target replica list {list(target)} names node(s) {unknown} with no live session")


def start(record: PartitionRecord, target: tuple[int, ...], live: Mapping[int, str]) -> PartitionRecord | None:
    """The record with a move to `target` begun (None: nothing to change). A move already in progress is
    replaced, from the current replicas (Kafka's rule: the newcomers of the old move are removed if the new
    target leaves them out); a target of the replicas before it cancels it (the path of a reverted manifest or
    topic record). Completed at once when every target replica is in the ISR already (a smaller
    replication factor, a reordering)."""
    if record.reassigning and set(target) == set(record.original_replicas):
        return cancel(record, live)  # back to where it began: Kafka's cancellation (a reordering follows later)
    current = record.replicas
    removing = tuple(r for r in current if r not in target)
    # Newcomers are counted against the replicas before any move, so that the same target asked again changes
    # nothing (Kafka counts them against the current replicas, and forgets them then).
    adding = tuple(r for r in target if r not in record.original_replicas)
    new = (target + removing, adding, removing)
    if new == (record.replicas, record.adding_replicas, record.removing_replicas):
        return None
    begun = record.changed(replicas=new[0], adding_replicas=adding, removing_replicas=removing)
    return _completed(begun, live) or begun


def cancel(record: PartitionRecord, live: Mapping[int, str]) -> PartitionRecord | None:
    """The record with its move reverted to the replicas before it (None: no move in progress). The newcomers
    leave the ISR; if the leader was one of them, the first original ISR member still running the process it
    was in sync as leads, else none does and the electors decide."""
    if not record.reassigning:
        return None
    replicas = record.original_replicas
    isr = tuple(r for r in record.isr if r in replicas)
    return _with_leader(record, replicas, isr, live)


def complete(record: PartitionRecord, live: Mapping[int, str]) -> PartitionRecord | None:
    """The completed move, once every target replica is in the ISR (None: not yet, or no move)."""
    return _completed(record, live) if record.reassigning else None


def is_completion(before: PartitionRecord, after: PartitionRecord) -> bool:
    """`after` is a legal completion of `before`'s move, whoever computed it (the controller's check of a
    leader's proposal: only the leader's choice of a new leader is free, within the ISR)."""
    if not before.reassigning or after.reassigning or after.partition_epoch != before.partition_epoch + 1:
        return False
    target = before.target_replicas
    if after.replicas != target or not set(target) <= set(before.isr):
        return False
    if after.isr != tuple(r for r in before.isr if r in target):
        return False
    if before.leader in target:
        return (after.leader, after.leader_incarnation, after.leader_epoch) == (
            before.leader, before.leader_incarnation, before.leader_epoch)
    return after.leader_epoch == before.leader_epoch + 1 and (after.leader == NO_LEADER or after.leader in after.isr)


def _completed(record: PartitionRecord, live: Mapping[int, str]) -> PartitionRecord | None:
    target = record.target_replicas
    if not set(target) <= set(record.isr):
        return None
    return _with_leader(record, target, tuple(r for r in record.isr if r in target), live)


def _with_leader(record: PartitionRecord, replicas: tuple[int, ...], isr: tuple[int, ...],
                 live: Mapping[int, str]) -> PartitionRecord:
    """The record on `replicas` and `isr` with no move; the leader kept if it stays, else moved to the first ISR
    member (in replica order) known to run the process it was in sync as, else none (the electors' turn)."""
    fields: dict[str, Any] = dict(replicas=replicas, isr=isr, adding_replicas=(), removing_replicas=())
    if record.leader != NO_LEADER and record.leader not in isr:
        known = dict(zip(record.isr, record.isr_incarnations))
        leader = next((r for r in replicas if r in isr and known.get(r, UNKNOWN_INCARNATION) != UNKNOWN_INCARNATION
                       and live.get(r) == known[r]), NO_LEADER)
        fields.update(leader=leader, leader_incarnation=known[leader] if leader != NO_LEADER else "")
    return record.changed(**fields)


def describe(record: PartitionRecord) -> dict[str, list[int]]:
    """The move in progress as `/status` and ListPartitionReassignments show it."""
    return {"replicas": list(record.replicas), "adding": list(record.adding_replicas),
            "removing": list(record.removing_replicas), "target": list(record.target_replicas)}
