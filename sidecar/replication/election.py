"""The election rule: from one partition record and the live nodes, the record every replica would write next.

Pure and deterministic (docs/replication.md, "Election"): every live replica runs it on the same view and
gets the same answer, so concurrent electors are harmless — the store's compare-and-set lets one write land
and the others see their own result in the next view. Kafka's controller does this in
`PartitionChangeBuilder.electLeader`; here the "controller" is whichever replica writes first.
"""

from __future__ import annotations

import zlib
from typing import Mapping

from ..log.topic_partition import TopicPartition
from .control_store import StoreView, Versioned
from .store_records import NO_LEADER, UNKNOWN_INCARNATION, NodeRegistration, PartitionRecord


class NotEnoughLiveNodes(ValueError):
    """Fewer live nodes than the replication factor: Kafka refuses such a topic (INVALID_REPLICATION_FACTOR);
    here the partition record is not created until enough nodes are live."""


def decide(current: Versioned[PartitionRecord] | None, replicas: tuple[int, ...], view: StoreView, unclean: bool, *,
           tp: TopicPartition | None = None) -> PartitionRecord | None:
    """The record to write for a partition, or None when electors leave it as it is.

    `replicas` (the assignment) is used only to create a missing record; once a record exists its own replicas
    rule (a changed assignment moves them through reassignment.py). `unclean` is the topic's `unclean.leader.election.enable`. `tp` lets
    creation find a live replica holding data from before replication (`NodeRegistration.unreplicated`).
    """
    if current is None:
        return _create(tp, replicas, view)
    record = current.record
    if record.leader != NO_LEADER and view.is_live(record.leader, record.leader_incarnation):
        return None  # a valid leader: ISR changes are its own business (AlterPartition)
    live_isr = [r for r in record.replicas if r in record.isr and view.is_live(r)]
    # KIP-903: a member whose node runs another process than the one it was in sync as may have lost what it
    # had not flushed; it is no longer in sync, whatever the ISR says. The deposed leader's node, if live, is
    # always such a restarted process (a live leader would still be valid).
    in_sync = [r for r in live_isr if _same_process(record, view, r)]
    if in_sync:
        leader = in_sync[0]
        return record.changed(leader=leader, leader_incarnation=view.nodes[leader].incarnation,
                              isr=tuple(in_sync), isr_incarnations=_incarnations(view, in_sync))
    restarted = [r for r in live_isr if r != record.leader] + [r for r in live_isr if r == record.leader]
    waiting_for = [r for r in record.isr if r not in restarted]  # members not live: they may return intact
    if restarted and not waiting_for:
        # Kafka's "last replica standing": every member is back under a new process and none is known better
        # than another, so the first leads (the deposed leader last: it was the one writing when it died) and
        # the others rejoin by catching up. What all of them lost is lost, as in Kafka without KIP-966.
        leader = restarted[0]
        return record.changed(leader=leader, leader_incarnation=view.nodes[leader].incarnation,
                              isr=(leader,), isr_incarnations=_incarnations(view, [leader]))
    if unclean:
        live = [r for r in record.replicas if view.is_live(r)]
        if live:  # KIP-704: an unclean leader is alone in the ISR and recovering until it says otherwise
            leader = live[0]
            return record.changed(leader=leader, leader_incarnation=view.nodes[leader].incarnation,
                                  isr=(leader,), isr_incarnations=_incarnations(view, [leader]), recovering=True)
    # Offline. The epoch rises so that the old leader's requests are fenced; the restarted members leave the
    # ISR (as Kafka's controller removes a fenced broker unless it is the last member) and the others stay, so
    # that one of them leads when it returns ("last replica standing").
    isr = tuple(r for r in record.isr if r in waiting_for)
    if record.leader == NO_LEADER and isr == record.isr:
        return None  # already offline: nothing new to say until a member returns
    if record.leader == NO_LEADER:
        return record.changed(isr=isr)
    return record.changed(leader=NO_LEADER, leader_incarnation="", isr=isr)


def _same_process(record: PartitionRecord, view: StoreView, member: int) -> bool:
    """The live `member` is the process it was in sync as (an unrecorded incarnation is taken on trust, except
    the deposed leader's: its own incarnation is in the record)."""
    recorded = record.isr_incarnation(member)
    if recorded == UNKNOWN_INCARNATION and member == record.leader:
        recorded = record.leader_incarnation
    return recorded == UNKNOWN_INCARNATION or view.is_live(member, recorded)


def _incarnations(view: StoreView, members: list[int] | tuple[int, ...]) -> tuple[str, ...]:
    return tuple(view.nodes[r].incarnation for r in members)


def _create(tp: TopicPartition | None, replicas: tuple[int, ...], view: StoreView) -> PartitionRecord | None:
    """A new partition record. A live replica whose log holds records from before replication leads alone: the
    others are empty, so not in sync, and must copy from it (an empty leader would make the holder truncate).
    Otherwise every replica is taken as empty: every live one is in sync and the first leads. (A holder that
    is not live yet finds an empty leader when it comes: the follower side keeps its records and refuses to
    follow — `follower.py` — until an operator decides.)"""
    live = tuple(r for r in replicas if view.is_live(r))
    holders = [r for r in live if tp is not None and tp in view.nodes[r].unreplicated]
    if holders:
        leader = holders[0]
        return PartitionRecord(replicas=replicas, isr=(leader,), leader=leader,
                               leader_incarnation=view.nodes[leader].incarnation,
                               isr_incarnations=_incarnations(view, [leader]))
    if not live:
        return None  # no one could lead or hold data yet; a live replica creates it later
    return PartitionRecord(replicas=replicas, isr=live, leader=live[0],
                           leader_incarnation=view.nodes[live[0]].incarnation,
                           isr_incarnations=_incarnations(view, live))


def choose_replicas(live: Mapping[int, NodeRegistration], rf: int, partition: int, topic: str) -> tuple[int, ...]:
    """Kafka's rack-unaware round robin (`assignReplicasToBrokersRackUnaware`) over the live node ids.

    Kafka draws the start index and the second replica's shift at random once per CreateTopics; here both come
    from a CRC-32 of the topic name, so that every node computes the same replicas for the same live set
    without talking to the others, and different topics still start on different nodes.
    """
    if rf < 1:
        raise ValueError(f"{topic}-{partition}: replication factor must be at least 1, got {rf}")
    brokers = sorted(live)
    n = len(brokers)
    if rf > n:
        raise NotEnoughLiveNodes(f"{topic}-{partition}: replication factor {rf} is larger than the "
                                 f"{n} live node{'' if n == 1 else 's'} {brokers}")
    seed = zlib.crc32(topic.encode())
    return round_robin(brokers, rf, partition, seed % n, (seed // n) % n)


def round_robin(brokers: list[int], rf: int, partition: int, start_index: int, start_shift: int) -> tuple[int, ...]:
    """Kafka's assignment of one partition: the first replica walks the sorted brokers from `start_index`; the
    others follow at a gap that grows by one each time the partition ids wrap around the brokers."""
    n = len(brokers)
    first = (partition + start_index) % n
    shift = start_shift + partition // n
    return (brokers[first], *(brokers[(first + 1 + (shift + j) % (n - 1)) % n] for j in range(rf - 1)))
