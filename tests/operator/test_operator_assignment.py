"""Replica placement: existing replicas never move; a new partition's replicas go to distinct pods (and zones),
its preferred leader to the pod leading the fewest partitions, the others to the least loaded pods."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shale.operator.assignment import assign, load_of

node_ids = st.lists(st.integers(0, 6), min_size=1, max_size=5, unique=True).map(sorted)


@st.composite
def cases(draw):
    nodes = draw(node_ids)
    partitions = draw(st.integers(1, 24))
    rf = draw(st.integers(1, 4))
    # Previous placements may name nodes that are gone (a StatefulSet scaled down): they must stay too.
    previous = draw(st.lists(st.one_of(st.none(), st.lists(st.integers(0, 8), min_size=1, max_size=3, unique=True)
                                       .map(tuple)), max_size=partitions))
    load = draw(st.dictionaries(st.sampled_from(nodes), st.integers(0, 30)))
    zones = draw(st.dictionaries(st.sampled_from(nodes), st.sampled_from(["a", "b", "c"])))
    return partitions, rf, previous, nodes, load, zones


@given(cases())
def test_placements_are_kept_and_new_replicas_are_distinct_and_balanced(case):
    partitions, rf, previous, nodes, load, zones = case
    result = assign(partitions, rf, previous, nodes, load, zones=zones)
    assert len(result) == partitions
    for p, replicas in enumerate(previous):
        if replicas is not None:
            assert result[p] == replicas  # never moved
    new = [p for p in range(partitions) if p >= len(previous) or previous[p] is None]
    for p in new:
        assert len(result[p]) == min(rf, len(nodes))  # capped by the pods
        assert len(set(result[p])) == len(result[p]) and set(result[p]) <= set(nodes)
        # Zones: a replica shares a zone with an earlier one only when no unused zone had a free pod.
        for i, node in enumerate(result[p][1:], start=1):
            used = {zones.get(n) for n in result[p][:i]} - {None}
            if zones.get(node) in used:
                free = [n for n in nodes if n not in result[p][:i]]
                assert all(zones.get(n) in used for n in free)
    assert assign(partitions, rf, previous, nodes, load, zones=zones) == result  # deterministic


@given(node_ids, st.integers(1, 24), st.integers(1, 4))
def test_a_new_topic_on_empty_pods_spreads_replicas_and_leaders_evenly(nodes, partitions, rf):
    result = assign(partitions, rf, [], nodes, {})
    replicas = Counter(n for r in result for n in r)
    leaders = Counter(r[0] for r in result)
    assert max(replicas[n] for n in nodes) - min(replicas[n] for n in nodes) <= 1
    assert max(leaders[n] for n in nodes) - min(leaders[n] for n in nodes) <= 1


@given(cases(), st.integers(1, 10))
def test_adding_partitions_keeps_what_an_earlier_assignment_placed(case, more):
    partitions, rf, previous, nodes, load, zones = case
    first = assign(partitions, rf, previous, nodes, load, zones=zones)
    second = assign(partitions + more, rf, first, nodes, load, zones=zones)
    assert second[:partitions] == first


def test_one_replica_each_alternates_from_the_lowest_ordinal():
    assert assign(3, 1, [], [0, 1], {}) == [(0,), (1,), (0,)]
    assert assign(1, 1, [], [0, 1], {0: 2, 1: 1}) == [(1,)]
    assert assign(4, 1, [(0,), (1,)], [0, 1, 2], {}) == [(0,), (1,), (2,), (0,)]


def test_three_replicas_on_three_pods_rotate_the_preferred_leader():
    assert assign(3, 3, [], [0, 1, 2], {}) == [(0, 1, 2), (1, 0, 2), (2, 0, 1)]
    assert [r[0] for r in assign(6, 3, [], [0, 1, 2], {})] == [0, 1, 2, 0, 1, 2]


def test_replicas_are_capped_by_the_pods():
    assert assign(2, 3, [], [0, 1], {}) == [(0, 1), (1, 0)]


def test_replicas_go_to_zones_not_used_yet_before_a_less_loaded_pod():
    zones = {0: "a", 1: "a", 2: "b", 3: "c"}
    assert assign(1, 3, [], [0, 1, 2, 3], {2: 5, 3: 5}, zones=zones) == [(0, 2, 3)]
    assert assign(1, 2, [], [0, 1, 2, 3], {2: 5, 3: 5}) == [(0, 1)]  # no zones: the least loaded


def test_partitions_are_never_removed():
    with pytest.raises(ValueError, match="never removed"):
        assign(1, 1, [(0,), (1,)], [0, 1], {})


def test_new_partitions_need_a_node():
    with pytest.raises(ValueError, match="no storage node"):
        assign(2, 1, [(0,)], [], {})
    assert assign(1, 3, [(3,)], [], {}) == [(3,)]  # nothing new to place


def test_load_counts_replicas_and_preferred_leaders_per_node():
    replicas, leaders = load_of([[(0, 1), (1, 0), (0,)], [(1,)], []])
    assert replicas == Counter({0: 3, 1: 3})
    assert leaders == Counter({0: 2, 1: 2})
