"""The roll's pure rule (operator/roll.py): which pod goes next, or why none may, and the PDB's budget.

One test per failure case of docs/day-2-operations.md section 3, then properties over any cluster: no
eviction takes a partition below its min ISR, none happens beside a troubled pod except rule 2's, and the
roll is Done exactly when no pod is outdated.
"""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from shale.operator.roll import (
    Done,
    Evict,
    RollPartition,
    RollPod,
    Wait,
    next_step,
    pdb_max_unavailable,
    roll_inputs,
)
from shale.operator.status import NodeReport
from shale.operator.storage import Storage, StoragePod


def storage(revisions: list[str | None], update_revision: str, replicas: int = 3) -> Storage:
    kube = {o: StoragePod(f"shale-{o}", o, "10.0.0.1", revision=r, ready=True) for o, r in enumerate(revisions)}
    return Storage("ns", "shale", "shale-headless", replicas, kube, update_revision=update_revision, on_delete=True)


def pods(*specs: dict, n: int = 3) -> list[RollPod]:
    """n healthy pods, outdated unless a spec says otherwise; specs override fields by ordinal."""
    out = []
    for ordinal in range(n):
        fields = {"outdated": True, **(specs[ordinal] if ordinal < len(specs) else {})}
        out.append(RollPod(ordinal, f"shale-{ordinal}", **fields))
    return out


def full(partitions: int = 3, min_isr: int = 2) -> list[RollPartition]:
    return [RollPartition("t", p, (0, 1, 2), (0, 1, 2), min_isr) for p in range(partitions)]


def test_nothing_outdated_is_done() -> None:
    assert next_step(pods({"outdated": False}, {"outdated": False}, {"outdated": False}), full()) == Done()


def test_fewest_leaderships_first_then_highest_ordinal() -> None:
    step = next_step(pods({"leads": 1}, {"leads": 0}, {"leads": 1}), full())
    assert isinstance(step, Evict) and step.pod == "shale-1"
    step = next_step(pods({"leads": 1}, {"leads": 1}, {"leads": 1}), full())
    assert isinstance(step, Evict) and step.pod == "shale-2"


def test_new_pod_never_ready_waits() -> None:
    """Bad image or crash loop: the pod just rolled (on the new revision) is not Ready; nothing else goes."""
    step = next_step(pods({}, {}, {"outdated": False, "ready": False, "caught_up": False}), full())
    assert isinstance(step, Wait) and "shale-2 is not Ready" in step.reason


def test_new_pod_not_back_in_isr_waits() -> None:
    isr = [RollPartition("t", 0, (0, 1, 2), (0, 1), 2)]
    step = next_step(pods({}, {}, {"outdated": False, "caught_up": False}), isr)
    assert isinstance(step, Wait) and "shale-2 is not back in every ISR" in step.reason


def test_missing_pod_waits() -> None:
    step = next_step(pods({}, {}, {"present": False, "outdated": False}), full())
    assert isinstance(step, Wait) and "shale-2 is missing" in step.reason


def test_fixed_template_replaces_the_unready_pod_first() -> None:
    """A new revision after a bad one: the crash-looping pod is outdated and not Ready, so it goes first."""
    isr = [RollPartition("t", p, (0, 1, 2), (0, 1), 2) for p in range(3)]
    step = next_step(pods({"leads": 0}, {"leads": 0}, {"ready": False, "caught_up": False, "leads": 0}), isr)
    assert step == Evict("shale-2", step.reason) and "not Ready" in step.reason


def test_operator_restart_recomputes_the_same_step() -> None:
    """Stateless: the same cluster gives the same step, whoever asks and how often."""
    cluster = (pods({"outdated": False}, {}, {}), full())
    assert next_step(*cluster) == next_step(*cluster) == Evict("shale-2", next_step(*cluster).reason)


def test_second_change_mid_roll_makes_rolled_pods_outdated_again() -> None:
    reports = {o: NodeReport(o, f"shale-{o}", document={"topics": {}}) for o in range(3)}
    rolled, _ = roll_inputs(storage(["rev-a", "rev-a", "rev-b"], "rev-c"), reports)
    assert all(p.outdated for p in rolled)


def test_partition_already_at_min_isr_waits_naming_it() -> None:
    """A pod down for another reason left partition 1 at min.insync.replicas: no pod in its ISR is safe."""
    partitions = [RollPartition("t", 0, (0, 1, 2), (0, 1, 2), 2), RollPartition("t", 1, (0, 1, 2), (0, 1), 2)]
    step = next_step(pods({}, {}, {}), partitions)
    assert step == Evict("shale-2", step.reason)  # not in partition 1's ISR: safe
    step = next_step(pods({}, {}, {"outdated": False}), partitions)
    assert isinstance(step, Wait) and "t-1: ISR [0, 1]" in step.reason
    assert pdb_max_unavailable(partitions) == 0


def test_unreadable_status_counts_as_not_caught_up() -> None:
    reports = {0: NodeReport(0, "shale-0", document={"topics": {}}),
               1: NodeReport(1, "shale-1", error="GET ...: timeout"), 2: NodeReport(2, "shale-2", document={})}
    rolled, _ = roll_inputs(storage(["rev-a"] * 3, "rev-b"), reports)
    assert [p.caught_up for p in rolled] == [True, False, True]
    step = next_step(rolled, [])
    assert isinstance(step, Wait) and "shale-1" in step.reason


def test_single_replica_partitions_do_not_hold_the_roll_or_the_pdb() -> None:
    """One pod, one replica: no roll keeps it writable, so waiting would hold an upgrade forever."""
    lone = [RollPartition("t", 0, (0,), (0,), 1)]
    assert next_step(pods({}, n=1), lone) == Evict("shale-0", next_step(pods({}, n=1), lone).reason)
    assert pdb_max_unavailable(lone) == 1


def test_pdb_budget_is_one_only_when_every_isr_can_lose_a_member() -> None:
    assert pdb_max_unavailable(full()) == 1
    assert pdb_max_unavailable(full(min_isr=3)) == 1  # replicas ≤ min ISR: spared
    assert pdb_max_unavailable([RollPartition("t", 0, (0, 1, 2), (0, 1), 2)]) == 0
    assert pdb_max_unavailable([]) == 1


def _status(partitions: dict[int, list[dict]]) -> dict[int, NodeReport]:
    return {o: NodeReport(o, f"shale-{o}", document={"topics": {"t": {"partitions": entries}}})
            for o, entries in partitions.items()}


def test_inputs_take_the_leaders_record_and_count_leaderships() -> None:
    leader = {"partition": 0, "served": True, "replica": {"role": "leader", "leader_epoch": 4, "replicas": [0, 1, 2],
                                                          "isr": [0, 1], "min_isr": 2}}
    stale = {"partition": 0, "served": True, "replica": {"role": "follower", "leader_epoch": 3,
                                                         "replicas": [0, 1, 2], "isr": [0, 1, 2], "min_isr": 2}}
    old_node = {"partition": 1, "served": True, "replica": {"role": "leader", "leader_epoch": 1,
                                                            "replicas": [0, 1, 2], "isr": [0, 1, 2]}}
    rolled, partitions = roll_inputs(storage(["rev-a"] * 2, "rev-a"), _status({0: [leader], 1: [old_node], 2: [stale]}))
    assert partitions == [RollPartition("t", 0, (0, 1, 2), (0, 1), 2), RollPartition("t", 1, (0, 1, 2), (0, 1, 2), 2)]
    assert [(p.present, p.leads) for p in rolled] == [(True, 1), (True, 1), (False, 0)]
    assert [p.caught_up for p in rolled[:2]] == [True, True]


# Properties over any small cluster.
pod_states = st.builds(RollPod, ordinal=st.just(0), name=st.just(""), present=st.booleans(), outdated=st.booleans(),
                       ready=st.booleans(), caught_up=st.booleans(), leads=st.integers(0, 3))


@st.composite
def clusters(draw: st.DrawFn) -> tuple[list[RollPod], list[RollPartition]]:
    n = draw(st.integers(1, 5))
    states = draw(st.lists(pod_states, min_size=n, max_size=n))
    rolled = [RollPod(o, f"shale-{o}", s.present, s.outdated, s.ready, s.caught_up, s.leads)
              for o, s in enumerate(states)]
    partitions = []
    for p in range(draw(st.integers(0, 6))):
        replicas = tuple(draw(st.permutations(range(n)))[:draw(st.integers(1, n))])
        isr = tuple(o for o in replicas if draw(st.booleans())) or replicas[:1]
        partitions.append(RollPartition("t", p, replicas, isr, draw(st.integers(1, len(replicas)))))
    return rolled, partitions


@given(clusters())
def test_never_evicts_below_min_isr(cluster: tuple[list[RollPod], list[RollPartition]]) -> None:
    rolled, partitions = cluster
    step = next_step(rolled, partitions)
    if isinstance(step, Evict):
        ordinal = next(p.ordinal for p in rolled if p.name == step.pod)
        for p in partitions:
            if ordinal in p.isr and len(p.replicas) > p.min_isr:
                assert len(p.isr) - 1 >= p.min_isr


@given(clusters())
def test_never_evicts_beside_a_troubled_pod_but_rule_2s(cluster: tuple[list[RollPod], list[RollPartition]]) -> None:
    rolled, partitions = cluster
    step = next_step(rolled, partitions)
    if isinstance(step, Evict):
        evicted = next(p for p in rolled if p.name == step.pod)
        assert evicted.present and evicted.outdated
        troubled = [p for p in rolled if not (p.present and p.ready and p.caught_up)]
        assert all(p.present and p.outdated and not p.ready for p in troubled)  # rule 2's exception only
        assert not troubled or evicted in troubled  # ... and one of them goes first


@given(clusters())
def test_done_iff_nothing_outdated(cluster: tuple[list[RollPod], list[RollPartition]]) -> None:
    rolled, partitions = cluster
    assert (next_step(rolled, partitions) == Done()) == (not any(p.present and p.outdated for p in rolled))
