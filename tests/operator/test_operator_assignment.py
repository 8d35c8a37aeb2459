"""Partition placement: existing partitions never move, new ones go to the least loaded node."""

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
    # Previous placements may name nodes that are gone (a StatefulSet scaled down): they must stay too.
    previous = draw(st.lists(st.one_of(st.none(), st.integers(0, 8)), max_size=partitions))
    load = draw(st.dictionaries(st.sampled_from(nodes), st.integers(0, 30)))
    return partitions, previous, nodes, load


@given(cases())
def test_placements_are_kept_and_new_partitions_balance_the_load(case):
    partitions, previous, nodes, load = case
    result = assign(partitions, previous, nodes, load)
    assert len(result) == partitions
    for p, node in enumerate(previous):
        if node is not None:
            assert result[p] == node  # never moved
    new = [p for p in range(partitions) if p >= len(previous) or previous[p] is None]
    assert all(result[p] in nodes for p in new)
    # Greedy balance: no new partition could go to another node and leave the load more even.
    final = Counter({n: load.get(n, 0) for n in nodes})
    final.update(n for n in result if n in final)
    took = {result[p] for p in new}
    if took:
        assert max(final[n] - 1 for n in took) <= min(final[n] for n in nodes)
    assert assign(partitions, previous, nodes, load) == result  # deterministic


@given(cases(), st.integers(1, 10))
def test_scaling_up_keeps_what_an_earlier_assignment_placed(case, more):
    partitions, previous, nodes, load = case
    first = assign(partitions, previous, nodes, load)
    second = assign(partitions + more, first, nodes, load)
    assert second[:partitions] == first


def test_new_topic_on_empty_nodes_alternates_from_the_lowest_ordinal():
    assert assign(3, [], [0, 1], {}) == [0, 1, 0]
    assert assign(1, [], [0, 1], {0: 2, 1: 1}) == [1]
    assert assign(4, [0, 1], [0, 1, 2], {}) == [0, 1, 2, 0]


def test_partitions_are_never_removed():
    with pytest.raises(ValueError, match="never removed"):
        assign(1, [0, 1], [0, 1], {})


def test_new_partitions_need_a_node():
    with pytest.raises(ValueError, match="no storage node"):
        assign(2, [0], [], {})
    assert assign(1, [3], [], {}) == [3]  # nothing new to place


def test_load_counts_partitions_per_node():
    assert load_of([[0, 1, 0], [1], []]) == Counter({0: 2, 1: 2})
