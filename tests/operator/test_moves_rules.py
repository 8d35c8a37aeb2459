"""The rules of moves between pods (operator/moves.py): where replicas go, which moves start, what the status says.

Property-based where a rule is a claim over every input: replicas stay on distinct pods that exist, a partition
has min(replication factor, pods) of them, a balanced topic is left alone, and evening out moves exactly the
fewest replicas any even spread needs.
"""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shale.operator.moves import (
    DONE,
    FAILED,
    ONGOING,
    PENDING,
    Progress,
    ScaleAction,
    goal,
    moves_status,
    progress_of,
    reassigning,
    scale_action,
    scale_in_refusal,
    shown_placement,
    step,
)

NOW, LATER = "2026-11-25T03:00:00Z", "2026-11-25T03:05:00Z"


@st.composite
def topics(draw):
    """A topic's placement over pods 0..7 (some perhaps gone), the pods it may use now, and a replication factor."""
    nodes = sorted(draw(st.lists(st.integers(0, 7), min_size=1, max_size=6, unique=True)))
    current = draw(st.lists(st.lists(st.integers(0, 7), min_size=1, max_size=4, unique=True).map(tuple),
                            min_size=1, max_size=12))
    rf = draw(st.integers(1, 5))
    zones = draw(st.dictionaries(st.sampled_from(nodes), st.sampled_from("abc")))
    return current, rf, nodes, zones


def counts_of(assignment, nodes):
    counts = Counter({n: 0 for n in nodes})
    for replicas in assignment:
        counts.update(replicas)
    return counts


@given(topics())
def test_every_partition_gets_distinct_replicas_on_existing_pods_capped_by_the_pods(case):
    current, rf, nodes, zones = case
    result = goal(current, rf, nodes, zones)
    assert len(result) == len(current)
    for replicas in result:
        assert len(set(replicas)) == len(replicas) == min(rf, len(nodes))
        assert set(replicas) <= set(nodes)


@given(topics())
def test_the_spread_is_even_and_a_second_pass_moves_nothing(case):
    current, rf, nodes, zones = case
    result = goal(current, rf, nodes, zones)
    counts = counts_of(result, nodes)
    assert max(counts.values()) - min(counts.values()) <= 1
    assert goal(result, rf, nodes, zones) == result  # settled: nothing moves again


@given(topics())
def test_evening_out_moves_the_fewest_replicas_an_even_spread_needs(case):
    """With the replication factor kept and every pod staying, the replicas that change are exactly the excess of
    the most loaded pods over the best even spread (⌈n/N⌉ for the n mod N fullest pods, ⌊n/N⌋ for the others)."""
    current, _, nodes, zones = case
    current = [tuple(n for n in replicas if n in nodes) or (nodes[0],) for replicas in current]
    width = len(current[0])
    current = [replicas for replicas in current if len(replicas) == width]
    result = goal(current, width, nodes, zones)
    changed = sum(len(set(before) - set(after)) for before, after in zip(current, result))
    counts = sorted(counts_of(current, nodes).values(), reverse=True)
    base, extra = divmod(sum(counts), len(nodes))
    fewest = sum(max(0, c - (base + (1 if i < extra else 0))) for i, c in enumerate(counts))
    assert changed == fewest
    for before, after in zip(current, result):
        kept = [n for n in before if n in after]
        assert [n for n in after if n in before] == kept  # the replicas that stay keep their order


def test_lowering_the_replication_factor_drops_followers_first_and_moves_no_data():
    three = [(0, 1, 2), (1, 2, 0), (2, 0, 1)]
    assert goal(three, 2, [0, 1, 2]) == [(0, 1), (1, 2), (2, 0)]  # leaders kept, two replicas per pod
    # Six partitions on the same three pods: an even cut needs two partitions to drop their leader instead of
    # keeping it and copying a follower elsewhere afterwards.
    cut = goal([(0, 1, 2)] * 6, 2, [0, 1, 2])
    assert all(set(after) < {0, 1, 2} for after in cut)
    assert sorted(counts_of(cut, [0, 1, 2]).values()) == [4, 4, 4]
    assert [after[0] for after in cut].count(0) == 4


def test_raising_adds_on_the_least_loaded_pods_in_new_zones_and_lowering_removes_from_the_most_loaded():
    zones = {0: "a", 1: "a", 2: "b", 3: "c"}
    # Pod 1 is in zone a with the leader: the second replica goes to zone b or c, the least loaded first.
    assert goal([(0,), (1,)], 2, [0, 1, 2, 3], zones) == [(0, 2), (1, 3)]
    # Three replicas each on four pods: 0 and 1 hold two, 2 and 3 one; going to two replicas removes from 0 and 1
    # (the most loaded; ties: the highest ordinal), never the leader (first).
    assert goal([(0, 1, 2), (1, 0, 3)], 2, [0, 1, 2, 3]) == [(0, 2), (1, 3)]


def test_scale_out_moves_followers_onto_the_new_pods_and_scale_in_drains_the_leaving_ones():
    three = [(0, 1, 2), (1, 2, 0), (2, 0, 1)]
    spread = goal(three, 3, [0, 1, 2, 3, 4])
    assert spread == [(0, 3, 4), (1, 2, 3), (2, 0, 1)]
    assert sorted(counts_of(spread, range(5)).values()) == [1, 2, 2, 2, 2]
    assert [replicas[0] for replicas in spread] == [0, 1, 2]  # the leaders stay
    assert sum(len(set(a) - set(b)) for a, b in zip(three, spread)) == 3
    back = goal(spread, 3, [0, 1, 2])
    assert all(sorted(replicas) == [0, 1, 2] for replicas in back)
    assert [replicas[0] for replicas in back] == [0, 1, 2]


@given(st.lists(st.tuples(st.lists(st.integers(0, 4), min_size=1, max_size=3, unique=True).map(tuple),
                          st.lists(st.integers(0, 4), min_size=1, max_size=3, unique=True).map(tuple),
                          st.booleans()), min_size=1, max_size=10),
       st.integers(0, 4), st.integers(1, 4))
def test_a_step_moves_only_settled_partitions_and_at_most_the_cap(rows, new, cap):
    written = [w for w, _, _ in rows] + [None] * new
    target = [t for _, t, _ in rows] + [(0,)] * new
    settled = [s for _, _, s in rows] + [False] * new
    out = step(written, target, settled, cap)
    for p, (w, t, s) in enumerate(rows):
        assert out[p] in (w, t)
        if not s:
            assert out[p] == w  # one move per partition at a time
    assert out[len(rows):] == [(0,)] * new  # new partitions have nothing to move: placed at once
    in_flight = sum(1 for p, (w, _, s) in enumerate(rows) if out[p] != w or not s)
    assert in_flight <= max(cap, sum(1 for _, _, s in rows if not s))
    waiting = [p for p, (w, t, s) in enumerate(rows) if s and w != t and out[p] == w]
    if waiting:  # something waits only because the cap is reached
        assert in_flight >= cap


def test_a_pod_gone_with_replicas_on_its_volume_is_brought_back_to_be_drained():
    action = scale_action(3, None, {0, 1, 2, 7})  # scaled in while the operator was down: pod 7 holds replicas
    assert (action.replicas, action.scale_in_to) == (8, 3)


def test_progress_is_read_from_the_leaders_record():
    entries = [{"partition": 0, "replica": {"role": "follower", "replicas": [0, 1], "isr": [0], "leader": 0}},
               {"partition": 0, "replica": {"role": "leader", "replicas": [0, 1, 3], "adding_replicas": [3],
                                            "removing_replicas": [1], "isr": [0, 1], "leader": 0}},
               {"partition": 0, "served": False, "replica": {"role": "leader", "replicas": [9]}}]
    record = progress_of(entries)
    assert record == Progress((0, 1, 3), (3,), (1,), (0, 1), 0)
    assert not record.settled_at((0, 3))
    assert Progress((3, 0), isr=(0, 3), leader=3).settled_at((0, 3))
    assert progress_of([{"partition": 0, "replica": None}]) is None


def test_a_move_goes_pending_ongoing_done_with_its_bytes():
    sizes = {(0, 0): 1000, (0, 1): 1000, (0, 3): 0}
    # Waiting for its turn: everything still to copy.
    pending = moves_status([], [(0, 1)], [(0, 1)], [(0, 3)], {0: Progress((0, 1), leader=0)}, sizes, {}, NOW)
    assert pending == [{"partition": 0, "fromReplicas": [0, 1], "targetReplicas": [0, 3], "state": PENDING,
                        "bytesCopied": 0, "bytesRemaining": 1000}]
    assert reassigning(pending).status and reassigning(pending).reason == "MovesInProgress"
    # Written: ongoing from now, bytes against the leader's log.
    sizes[(0, 3)] = 400
    ongoing = moves_status(pending, [(0, 1)], [(0, 3)], [(0, 3)],
                           {0: Progress((0, 3, 1), (3,), (1,), (0, 1), 0)}, sizes, {}, NOW)
    assert ongoing == [{"partition": 0, "fromReplicas": [0, 1], "targetReplicas": [0, 3], "startedAt": NOW,
                        "state": ONGOING, "bytesCopied": 400, "bytesRemaining": 600}]
    assert "600 bytes to copy" in reassigning(ongoing).message
    # Still running at the next refresh: its start is kept.
    again = moves_status(ongoing, [(0, 3)], [(0, 3)], [(0, 3)], {0: Progress((0, 3, 1), (3,), (1,), (0, 1), 0)},
                         sizes, {}, LATER)
    assert again[0]["startedAt"] == NOW and again[0]["state"] == ONGOING
    # The record holds the target only: done, and stays shown.
    sizes[(0, 3)] = 1000
    done = moves_status(again, [(0, 3)], [(0, 3)], [(0, 3)], {0: Progress((0, 3), isr=(0, 3), leader=0)}, sizes,
                        {}, LATER)
    assert done[0]["state"] == DONE and done[0]["finishedAt"] == LATER and done[0]["bytesRemaining"] == 0
    assert done[0]["bytesCopied"] == 1000
    cond = reassigning(done)
    assert (cond.status, cond.reason) == (False, "NoMoves")
    assert moves_status(done, [(0, 3)], [(0, 3)], [(0, 3)], {0: Progress((0, 3), leader=0)}, sizes, {}, LATER) == done


def test_a_move_the_pods_refuse_is_failed_with_the_reason():
    why = {0: "pod shale-7 does not exist"}
    failed = moves_status([], [(0, 1)], [(0, 7)], [(0, 7)], {0: Progress((0, 1), leader=0)}, {}, why, NOW)
    assert failed[0]["state"] == FAILED and failed[0]["message"] == "pod shale-7 does not exist"
    cond = reassigning(failed)
    assert (cond.status, cond.reason) == (True, "MoveFailed") and "shale-7" in cond.message


def test_scale_in_is_refused_when_it_would_drop_the_last_in_sync_copy():
    progress = {0: Progress((3, 0), isr=(3,), leader=3), 1: Progress((0, 1), isr=(0, 1), leader=0)}
    refused = scale_in_refusal([(3, 0), (0, 1)], {3, 4}, True, progress, down={3})
    assert refused == ["partition 0: its in-sync replicas [3] are all on leaving pods that are down; draining them "
                       "would drop the last in-sync copy"]
    assert scale_in_refusal([(3, 0), (0, 1)], {3, 4}, True, progress, down=set()) == []  # copied from pod 3
    unreplicated = scale_in_refusal([(3,), (0,)], {3, 4}, False, {}, down=set())
    assert len(unreplicated) == 1 and "not replicated" in unreplicated[0]


@pytest.mark.parametrize("spec, target, held, action", [
    (5, None, {0, 1, 2, 3, 4}, None),  # nothing to do
    (3, None, {0, 1, 2, 3, 4}, ScaleAction(replicas=5, scale_in_to=3)),  # lowered under held pods: put back
    (3, None, {0, 1, 2, 3}, ScaleAction(replicas=4, scale_in_to=3)),  # pod 4 holds nothing: it may go now
    (5, 3, {0, 1, 2, 3}, None),  # draining
    (5, 3, {0, 1, 2}, ScaleAction(replicas=3, clear_scale_in=True)),  # drained: scaled in
    (3, 3, {0, 1, 2}, ScaleAction(clear_scale_in=True)),  # done (or scaled by hand): the target goes
    (6, 7, {0, 1}, ScaleAction(clear_scale_in=True)),  # a target above the size means nothing
    (2, None, set(), None),
])
def test_the_statefulset_is_scaled_in_only_once_its_leaving_pods_are_drained(spec, target, held, action):
    got = scale_action(spec, target, held)
    if action is None:
        assert got is None
    else:
        assert (got.replicas, got.scale_in_to, got.clear_scale_in) == (action.replicas, action.scale_in_to,
                                                                       action.clear_scale_in)
        assert got.message


def test_a_move_whose_status_patch_was_lost_is_shown_from_where_the_status_last_had_it():
    """The write of [0, 4] for partition 0 happened in a reconcile whose status patch the API server dropped: the
    next reconcile sees no change against the manifest (before == written), but the status still shows the
    replicas on pods 0, 3 and 4 and the previous move done to [0, 4, 3]: the move is shown, and ends done."""
    previous = [{"partition": 0, "fromReplicas": [0, 2, 1], "targetReplicas": [0, 4, 3], "startedAt": NOW,
                 "state": DONE, "finishedAt": NOW, "bytesCopied": 10, "bytesRemaining": 0}]
    partitions = [{"partition": 0, "pod": f"shale-{n}"} for n in (0, 4, 3)] + [{"partition": 1, "pod": "shale-1"}]
    shown = shown_placement(partitions, "shale")
    assert shown == {0: frozenset({0, 3, 4}), 1: frozenset({1})}
    sizes = {(0, 0): 100, (0, 4): 100}
    moved = moves_status(previous, [(0, 4), (1,)], [(0, 4), (1,)], [(0, 4), (1,)],
                         {0: Progress((0, 4), isr=(0, 4), leader=0), 1: Progress((1,), isr=(1,), leader=1)}, sizes,
                         {}, LATER, shown)
    assert [(m["partition"], m["fromReplicas"], m["targetReplicas"], m["state"]) for m in moved] == [
        (0, [0, 3, 4], [0, 4], DONE)]
    # Once shown, the status's placement is the manifest's: the move stays as it is.
    shown_now = shown_placement([{"partition": 0, "pod": "shale-0"}, {"partition": 0, "pod": "shale-4"}], "shale")
    assert moves_status(moved, [(0, 4), (1,)], [(0, 4), (1,)], [(0, 4), (1,)],
                        {0: Progress((0, 4), isr=(0, 4), leader=0)}, sizes, {}, LATER, shown_now) == moved
