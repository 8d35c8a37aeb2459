"""Which storage pod holds each partition: stable for existing partitions, balanced for new ones.

A partition's log lives on one pod's volume and Shale does not move data between pods, so a placement,
once made, is kept for the life of the topic — even when the StatefulSet has since been scaled below
that pod (the topic then reports the partition as not served instead of losing its data silently).
New partitions (a new topic, or more partitions) go one at a time to the pod holding the fewest
partitions over all topics, ties to the lowest ordinal, so the same inputs always give the same answer.
"""

from __future__ import annotations

from collections import Counter
from typing import Iterable, Mapping, Sequence


def assign(partitions: int, previous: Sequence[int | None], nodes: Sequence[int],
           load: Mapping[int, int]) -> list[int]:
    """The node of each of `partitions` partitions.

    previous[p]: where partition p lives already (None or missing: nowhere yet); kept as it is.
    nodes: the node ids new partitions may go to. load: partitions each node holds for other topics.
    """
    if any(node is not None for node in previous[partitions:]):
        raise ValueError(f"cannot place {partitions} partitions: partitions {partitions}.. are placed already "
                         "(partitions are never removed)")
    placed = list(previous[:partitions]) + [None] * max(0, partitions - len(previous))
    counts = Counter({node: load.get(node, 0) for node in nodes})
    counts.update(node for node in placed if node is not None and node in counts)
    if any(node is None for node in placed) and not nodes:
        raise ValueError("no storage node to place new partitions on")
    result: list[int] = []
    for node in placed:
        if node is None:
            node = min(nodes, key=lambda n: (counts[n], n))
            counts[node] += 1
        result.append(node)
    return result


def load_of(assignments: Iterable[Sequence[int]]) -> Counter:
    """Partitions per node over the given topics' assignments (the other topics in the ConfigMap)."""
    counts: Counter = Counter()
    for owners in assignments:
        counts.update(owners)
    return counts
