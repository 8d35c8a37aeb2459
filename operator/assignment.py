"""Which storage pods hold each partition's replicas: stable for existing partitions, spread for new ones.

A replica's log lives on its pod's volume and the operator does not move replicas (a move is a
reassignment), so a placement, once made, is kept for the life of the topic — even when the
StatefulSet has since been scaled below one of its pods (the topic then reports that replica as not
served instead of losing data silently). A new partition gets `replication_factor` distinct pods
(capped by the pods there are): its first replica, Kafka's preferred leader, on the pod leading the
fewest partitions, the others on the pods holding the fewest replicas — in zones the partition does
not use yet first, when the pods' nodes carry zone labels — ties to the lowest ordinal, so the same
inputs always give the same answer.
"""

from __future__ import annotations

from collections import Counter
from typing import Iterable, Mapping, Sequence

Replicas = tuple[int, ...]


def assign(partitions: int, replication_factor: int, previous: Sequence[Replicas | None], nodes: Sequence[int],
           load: Mapping[int, int], leaders: Mapping[int, int] | None = None,
           zones: Mapping[int, str] | None = None) -> list[Replicas]:
    """The replicas of each of `partitions` partitions, the preferred leader first.

    previous[p]: partition p's replicas already (None or missing: nowhere yet); kept as they are.
    nodes: the node ids new replicas may go to. load / leaders: replicas / preferred leaderships each node
    holds for other topics. zones: node → zone of the pod's node, for the nodes whose zone is known.
    """
    if any(replicas is not None for replicas in previous[partitions:]):
        raise ValueError(f"cannot place {partitions} partitions: partitions {partitions}.. are placed already "
                         "(partitions are never removed)")
    if replication_factor < 1:
        raise ValueError(f"the replication factor must be at least 1, got {replication_factor}")
    placed = list(previous[:partitions]) + [None] * max(0, partitions - len(previous))
    if any(replicas is None for replicas in placed) and not nodes:
        raise ValueError("no storage node to place new partitions on")
    zones = zones or {}
    counts = Counter({node: load.get(node, 0) for node in nodes})
    leads = Counter({node: (leaders or {}).get(node, 0) for node in nodes})
    for replicas in placed:
        if replicas is not None:
            counts.update(node for node in replicas if node in counts)
            if replicas and replicas[0] in leads:
                leads[replicas[0]] += 1
    width = min(replication_factor, len(nodes))
    result: list[Replicas] = []
    for replicas in placed:
        if replicas is None:
            first = min(nodes, key=lambda n: (leads[n], counts[n], n))
            chosen = [first]
            while len(chosen) < width:
                used = {zones.get(n) for n in chosen} - {None}
                chosen.append(min((n for n in nodes if n not in chosen),
                                  key=lambda n: (zones.get(n) in used, counts[n], n)))
            replicas = tuple(chosen)
            counts.update(replicas)
            leads[first] += 1
        result.append(replicas)
    return result


def load_of(assignments: Iterable[Sequence[Replicas]]) -> tuple[Counter, Counter]:
    """Replicas and preferred leaderships per node over the given topics' assignments (the other topics)."""
    replicas: Counter = Counter()
    leaders: Counter = Counter()
    for topic in assignments:
        for partition in topic:
            replicas.update(partition)
            if partition:
                leaders[partition[0]] += 1
    return replicas, leaders
