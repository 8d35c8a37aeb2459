"""The election rule: from one partition record and the live nodes, the record every replica would write next.

Pure and deterministic (docs/replication.md, "Election"): every live replica runs it on the same view and
gets the same answer, so concurrent electors are harmless — the store's compare-and-set lets one write land
and the others see their own result in the next view. Kafka's controller does this in
`PartitionChangeBuilder.electLeader`; here the "controller" is whichever replica writes first.
"""

from __future__ import annotations

import zlib
from typing import Mapping

from shale.sidecar.replication.control_store import StoreView, Versioned
from shale.sidecar.replication.records import NO_LEADER, NodeRegistration, PartitionRecord


class NotEnoughLiveNodes(ValueError):
    """Fewer live nodes than the replication factor: Kafka refuses such a topic (INVALID_REPLICATION_FACTOR);
    here the partition record is not created until enough nodes are live."""


def decide(current: Versioned | None, replicas: tuple[int, ...], view: StoreView,
           unclean: bool) -> PartitionRecord | None:
    """The record to write for a partition, or None when electors leave it as it is.

    `replicas` (the assignment) is used only to create a missing record; once a record exists its own replicas
    rule (reassignment is not supported). `unclean` is the topic's `unclean.leader.election.enable`.
    """
    if current is None:
        return _create(replicas, view)
    record = current.record
    if record.leader != NO_LEADER and view.is_live(record.leader, record.leader_incarnation):
        return None  # a valid leader: ISR changes are its own business (AlterPartition)
    deposed = record.leader if record.leader != NO_LEADER else None
    live_isr = [r for r in record.replicas if r in record.isr and view.is_live(r)]
    # The deposed leader's node is live only under a new incarnation: a restarted process that may have lost
    # what it had not flushed. Kafka fences a re-registered broker out of every ISR unless it is the last
    # member; so does this rule — it leads, and stays in the ISR, only when no other member is live.
    others = [r for r in live_isr if r != deposed]
    candidates = others or live_isr
    if candidates:
        leader = candidates[0]
        return record.changed(leader=leader, leader_incarnation=view.nodes[leader].incarnation,
                              isr=tuple(candidates))
    if unclean:
        live = [r for r in record.replicas if view.is_live(r)]
        if live:  # KIP-704: an unclean leader is alone in the ISR and recovering until it says otherwise
            leader = live[0]
            return record.changed(leader=leader, leader_incarnation=view.nodes[leader].incarnation,
                                  isr=(leader,), recovering=True)
    if record.leader == NO_LEADER:
        return None  # already offline: nothing new to say until a member returns
    # Offline. The epoch still rises so that the old leader's requests are fenced; the ISR is kept so that
    # its members can lead again when they return ("last replica standing").
    return record.changed(leader=NO_LEADER, leader_incarnation="")


def _create(replicas: tuple[int, ...], view: StoreView) -> PartitionRecord | None:
    """A new partition: every replica is empty, so every live one is in sync and the first of them leads."""
    live = tuple(r for r in replicas if view.is_live(r))
    if not live:
        return None  # no one could lead or hold data yet; a live replica creates it later
    return PartitionRecord(replicas=replicas, isr=live, leader=live[0],
                           leader_incarnation=view.nodes[live[0]].incarnation)


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
