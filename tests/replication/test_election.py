"""The election rule (`election.decide`) and replica placement (`election.choose_replicas`), pure.

Named cases follow docs/replication.md's "Election" rules one by one; the state machine drives a model
cluster (replica logs, acknowledgements by the committed ISR, followers truncating to the leader, ISR changes
by the leader, SIGKILLs and restarts, electors deciding from current and stale views and writing by CAS) and
checks after every step what Kafka's controller guarantees: one leader per epoch, epochs never go back, the
ISR within the replicas and holding the leader, and every acknowledged record still at its offset on every
ISR member.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field, replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from shale.sidecar.log.topic_partition import TopicPartition
from shale.sidecar.replication.control_store import StoreView, Versioned
from shale.sidecar.replication.election import NotEnoughLiveNodes, choose_replicas, decide, round_robin
from shale.sidecar.replication.store_records import NO_LEADER, NodeRegistration, PartitionRecord

TP = TopicPartition("orders", 0)


def reg(node_id: int, incarnation: str = "") -> NodeRegistration:
    return NodeRegistration(node_id, incarnation or f"n{node_id}", "127.0.0.1", 9000 + node_id)


def view_of(*nodes: NodeRegistration, record: PartitionRecord | None = None, version: str = "7") -> StoreView:
    partitions = {} if record is None else {TP: Versioned(record, version)}
    return StoreView(version, {n.node_id: n for n in nodes}, partitions)


def decide_on(record: PartitionRecord | None, *nodes: NodeRegistration, replicas=(1, 2, 3), unclean=False):
    view = view_of(*nodes, record=record)
    return decide(view.partitions.get(TP), replicas, view, unclean)


LEADING = PartitionRecord(replicas=(1, 2, 3), isr=(1, 2, 3), leader=1, leader_incarnation="n1",
                          leader_epoch=4, partition_epoch=9)


# -- the rules, one by one -----------------------------------------------------------------------------------

def test_no_record_first_live_replica_leads_and_every_live_replica_is_in_sync():
    new = decide_on(None, reg(2), reg(3), replicas=(1, 2, 3))
    assert new == PartitionRecord(replicas=(1, 2, 3), isr=(2, 3), leader=2, leader_incarnation="n2",
                                  leader_epoch=0, partition_epoch=0, isr_incarnations=("n2", "n3"))


def test_no_record_a_live_replica_holding_unreplicated_data_leads_alone():
    """Data written before replication (a single-node cluster that gained replicas): its holder leads and the
    empty replicas are out of sync until they copied it — an empty leader would make the holder truncate."""
    holder = NodeRegistration(3, "n3", "127.0.0.1", 9003, unreplicated=(TP, TopicPartition("other", 0)))
    view = view_of(reg(1), reg(2), holder)
    new = decide(None, (1, 2, 3), view, False, tp=TP)
    assert (new.leader, new.leader_incarnation, new.isr, new.isr_incarnations) == (3, "n3", (3,), ("n3",))
    elsewhere = decide(None, (1, 2, 3), view, False, tp=TopicPartition("orders", 1))
    assert (elsewhere.leader, elsewhere.isr) == (1, (1, 2, 3))


def test_no_record_and_no_live_replica_writes_nothing():
    assert decide_on(None, reg(4), replicas=(1, 2, 3)) is None


def test_valid_leader_is_left_alone_even_with_dead_isr_members():
    assert decide_on(LEADING, reg(1)) is None  # the ISR is the leader's to shrink


def test_leader_gone_next_isr_replica_in_replica_order_leads_with_epoch_plus_one():
    new = decide_on(LEADING, reg(3), reg(2))
    assert (new.leader, new.leader_incarnation, new.isr) == (2, "n2", (2, 3))
    assert (new.leader_epoch, new.partition_epoch) == (5, 10)
    assert new.replicas == LEADING.replicas and not new.recovering


def test_leader_gone_replica_outside_the_isr_is_not_a_candidate():
    record = PartitionRecord((1, 2, 3), (1, 3), 1, "n1", 4, 9)
    new = decide_on(record, reg(2), reg(3))
    assert (new.leader, new.isr) == (3, (3,))


def test_deposed_leader_restarted_goes_last_and_leaves_the_isr_when_others_are_live():
    """A restarted leader may have lost what it had not flushed: Kafka fences a re-registered broker out of
    the ISR unless it is the last member."""
    new = decide_on(LEADING, reg(1, "again"), reg(3))
    assert (new.leader, new.leader_incarnation, new.isr, new.leader_epoch) == (3, "n3", (3,), 5)


def test_deposed_leader_restarted_waits_for_the_other_members_then_leads_as_the_last_one_standing():
    """The other members are dead, not restarted: one of them may come back with what the restarted leader
    lost, so the partition goes offline and the restarted leader leaves the ISR; once every remaining member
    is back (under a new process, as any returning node is), the first leads (Kafka's last replica standing)."""
    record = replace(LEADING, isr_incarnations=("n1", "n2", "n3"))
    offline = decide_on(record, reg(1, "again"))
    assert (offline.leader, offline.isr, offline.leader_epoch) == (NO_LEADER, (2, 3), 5)
    new = decide_on(offline, reg(1, "again"), reg(2, "back"), reg(3, "back"))
    assert (new.leader, new.leader_incarnation, new.isr, new.isr_incarnations, new.leader_epoch) == (
        2, "back", (2,), ("back",), 6)


def test_isr_member_restarted_while_no_leader_watched_is_not_in_sync():
    """KIP-903: the ISR names each member's process; a member that restarted may have lost what it had not
    flushed, so a member still running the process it was in sync as leads instead, without it."""
    record = LEADING.changed(isr=(1, 2, 3), isr_incarnations=("n1", "n2", "n3"))
    new = decide_on(record, reg(2, "restarted"), reg(3))
    assert (new.leader, new.isr, new.isr_incarnations) == (3, (3,), ("n3",))


def test_restarted_member_is_not_elected_while_a_member_with_the_data_may_return():
    """The gap of issue 15: leader 1 dead (its log intact), follower 2 restarted having lost its unflushed
    tail. The old rule elected 2 and every acknowledged record it lost was gone; now the partition waits."""
    record = PartitionRecord((1, 2, 3), (1, 2), 1, "n1", 4, 9, isr_incarnations=("n1", "n2"))
    offline = decide_on(record, reg(2, "restarted"), reg(3))
    assert (offline.leader, offline.isr, offline.isr_incarnations) == (NO_LEADER, (1,), ("n1",))
    assert decide_on(offline, reg(2, "restarted"), reg(3)) is None  # nothing new until 1 returns
    back = decide_on(offline, reg(1, "back"), reg(2, "restarted"), reg(3))
    assert (back.leader, back.leader_incarnation, back.isr) == (1, "back", (1,))


def test_every_member_restarted_the_first_leads_and_the_deposed_leader_goes_last():
    record = PartitionRecord((1, 2, 3), (1, 2), 1, "n1", 4, 9, isr_incarnations=("n1", "n2"))
    new = decide_on(record, reg(1, "x"), reg(2, "y"))
    assert (new.leader, new.leader_incarnation, new.isr) == (2, "y", (2,))


def test_a_record_without_isr_incarnations_trusts_its_members_but_not_the_deposed_leader():
    """An older record (JSON without `isr_incarnations`): members are taken as in sync, as before; the deposed
    leader's own process is in the record, so its restart is still seen."""
    assert LEADING.isr_incarnations == ("", "", "")
    new = decide_on(LEADING, reg(1, "again"), reg(2, "restarted"))
    assert (new.leader, new.isr, new.isr_incarnations) == (2, (2,), ("restarted",))


def test_no_candidate_goes_offline_with_a_new_epoch_and_keeps_the_isr():
    record = PartitionRecord((1, 2, 3), (1, 2), 1, "n1", 4, 9)
    new = decide_on(record, reg(3))  # 3 is live but out of sync
    assert (new.leader, new.leader_incarnation, new.isr, new.leader_epoch, new.partition_epoch) == (
        NO_LEADER, "", (1, 2), 5, 10)
    assert decide_on(new, reg(3)) is None  # already offline: no epoch churn while nothing changes


def test_offline_partition_is_led_by_the_first_isr_member_to_return():
    offline = PartitionRecord((1, 2, 3), (1, 2), NO_LEADER, "", 5, 10)  # members' processes not recorded
    new = decide_on(offline, reg(3), reg(2, "back"))
    assert (new.leader, new.leader_incarnation, new.isr, new.leader_epoch) == (2, "back", (2,), 6)
    last = PartitionRecord((1, 2, 3), (2,), NO_LEADER, "", 5, 10, isr_incarnations=("n2",))
    new = decide_on(last, reg(3), reg(2, "back"))  # the last member standing leads whatever its process
    assert (new.leader, new.leader_incarnation, new.isr, new.isr_incarnations) == (2, "back", (2,), ("back",))


def test_unclean_election_picks_the_first_live_replica_alone_in_the_isr_and_recovering():
    record = PartitionRecord((1, 2, 3), (1,), 1, "n1", 4, 9)
    new = decide_on(record, reg(3), reg(2), unclean=True)
    assert (new.leader, new.isr, new.recovering, new.leader_epoch) == (2, (2,), True, 5)
    offline = PartitionRecord((1, 2, 3), (1,), NO_LEADER, "", 5, 10)
    assert decide_on(offline, reg(3), unclean=True).leader == 3  # turning it on later elects at once
    assert decide_on(offline, reg(3), unclean=False) is None


def test_unclean_election_still_prefers_a_live_isr_member():
    new = decide_on(LEADING, reg(3), reg(2, "x"), unclean=True)
    assert (new.leader, new.isr, new.recovering) == (2, (2, 3), False)


def test_an_existing_record_keeps_its_replicas_whatever_the_assignment_says():
    new = decide_on(LEADING, reg(2), reg(5), replicas=(5, 6, 7))
    assert new.replicas == (1, 2, 3) and new.leader == 2


# -- replica placement --------------------------------------------------------------------------------------

def test_round_robin_matches_kafkas_assignment_of_ten_partitions_on_five_brokers():
    """Kafka's AdminTest.testReplicaAssignment vector: brokers 0-4, RF 3, start index and shift 0."""
    expected = [(0, 1, 2), (1, 2, 3), (2, 3, 4), (3, 4, 0), (4, 0, 1),
                (0, 2, 3), (1, 3, 4), (2, 4, 0), (3, 0, 1), (4, 1, 2)]
    assert [round_robin([0, 1, 2, 3, 4], 3, p, 0, 0) for p in range(10)] == expected


def test_choose_replicas_refuses_more_replicas_than_live_nodes_and_names_the_partition():
    with pytest.raises(NotEnoughLiveNodes, match=r"__consumer_offsets-7: replication factor 3 .* 2 live nodes"):
        choose_replicas({1: reg(1), 2: reg(2)}, 3, 7, "__consumer_offsets")
    with pytest.raises(ValueError, match="at least 1"):
        choose_replicas({1: reg(1)}, 0, 0, "t")


@given(ids=st.sets(st.integers(0, 50), min_size=1, max_size=9), data=st.data())
def test_choose_replicas_is_distinct_live_and_the_same_on_every_node(ids, data):
    live = {i: reg(i) for i in ids}
    rf = data.draw(st.integers(1, len(ids)))
    topic = data.draw(st.text(min_size=1, max_size=20))
    n = len(ids)
    firsts = Counter()
    for p in range(n):
        chosen = choose_replicas(live, rf, p, topic)
        assert len(chosen) == rf and len(set(chosen)) == rf and set(chosen) <= ids
        # another node sees the same live set in another order: it must choose the same replicas
        assert choose_replicas(dict(reversed(list(live.items()))), rf, p, topic) == chosen
        firsts[chosen[0]] += 1
    assert set(firsts.values()) == {1}  # n consecutive partitions: each node leads exactly one


# -- the model ----------------------------------------------------------------------------------------------

Entry = tuple[int, int]  # (leader epoch it was written in, unique id)


@dataclass
class Node:
    alive: bool = True
    generation: int = 0
    log: list[Entry] = field(default_factory=list)
    flushed: int = 0  # the prefix of `log` on disk for sure: a machine crash keeps at least this much

    @property
    def incarnation(self) -> str:
        return f"g{self.generation}"


@dataclass
class Leadership:
    """The leader's memory for one leader epoch: its followers' fetched log ends (per follower process, as
    `partition.FollowerState` is reset when a follower's incarnation changes) and its high watermark."""

    epoch_start: int
    follower_leo: dict[tuple[int, str], int] = field(default_factory=dict)
    hw: int = 0


def common_prefix(a: list[Entry], b: list[Entry]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def decide_as_before_isr_incarnations(current, replicas, view, unclean, **kw):
    """The rule before KIP-903's ISR incarnations: the same code on records that do not name the members'
    processes, which is how the old rule saw every record (only the deposed leader's restart was visible)."""
    if current is not None:
        current = Versioned(replace(current.record, isr_incarnations=()), current.version)
    return decide(current, replicas, view, unclean, **kw)


class ElectionMachine(RuleBasedStateMachine):
    """Every write is a CAS against the model store; electors may decide from an old view. Nodes are killed
    (their logs stay) and restarted, a restart sometimes after a machine crash that lost the unflushed tail."""

    rule_under_test = staticmethod(decide)

    @initialize(n=st.integers(2, 5), data=st.data())
    def setup(self, n: int, data) -> None:
        self.nodes = {i: Node() for i in range(n)}
        rf = data.draw(st.integers(1, n), label="rf")
        self.assignment = tuple(data.draw(st.permutations(range(n)), label="order")[:rf])
        self.unclean = data.draw(st.booleans(), label="unclean")
        self.record: PartitionRecord | None = None
        self.version = 0
        self.history: list[PartitionRecord] = []
        self.views: list[StoreView] = []
        self.leaderships: dict[tuple[int, int], Leadership] = {}
        self.acked: dict[int, Entry] = {}
        self.ack_epochs: dict[int, set[int]] = {}  # leader epoch -> nodes that acknowledged in it
        self.next_uid = 0

    # the store
    def view(self) -> StoreView:
        live = {i: NodeRegistration(i, n.incarnation, "h", 1) for i, n in self.nodes.items() if n.alive}
        parts = {} if self.record is None else {TP: Versioned(self.record, str(self.version))}
        view = StoreView(str(self.version), live, parts)
        self.views.append(view)
        return view

    def cas(self, expected: str | None, new: PartitionRecord) -> bool:
        current = None if self.record is None else str(self.version)
        if current != expected:
            return False
        old = self.record
        if old is not None and new.leader not in (NO_LEADER, *old.isr):
            assert self.unclean, "a leader from outside the ISR without unclean.leader.election.enable"
            assert new.isr == (new.leader,) and new.recovering
            self.acked.clear()  # Kafka's unclean election loses what the new leader lacks: check from here on
        elif old is not None and new.leader != NO_LEADER and (new.leader, new.leader_incarnation) != (
                old.leader, old.leader_incarnation) and self.every_member_restarted(old):
            # Kafka's last replica standing: every member is back under a new process; what the chosen one
            # lost (all of them may have) is lost, as documented. Nothing else may lose an acknowledged record.
            self.acked = {o: e for o, e in self.acked.items() if self.nodes[new.leader].log[o:o + 1] == [e]}
        elif old is not None and new.leader != NO_LEADER and (new.leader, new.leader_incarnation) != (
                old.leader, old.leader_incarnation) and not self.same_process(old, new.leader):
            # An ISR member by id but restarted since (it may have lost its tail) while another member is away:
            # only an unclean election may pick it, and loses what it lacks, as any unclean election does.
            assert self.unclean, "a restarted ISR member elected without unclean.leader.election.enable"
            assert new.isr == (new.leader,) and new.recovering
            self.acked.clear()
        self.record, self.version = new, self.version + 1
        self.history.append(new)
        return True

    def every_member_restarted(self, record: PartitionRecord) -> bool:
        return all(self.nodes[r].alive and not self.same_process(record, r) for r in record.isr)

    def same_process(self, record: PartitionRecord, member: int) -> bool:
        recorded = record.isr_incarnation(member) or (record.leader_incarnation if member == record.leader else "")
        return recorded in ("", self.nodes[member].incarnation)

    def valid_leader(self) -> int | None:
        r = self.record
        if r is None or r.leader == NO_LEADER:
            return None
        node = self.nodes[r.leader]
        return r.leader if node.alive and node.incarnation == r.leader_incarnation else None

    def leadership(self) -> Leadership:
        key = (self.record.leader, self.record.leader_epoch)
        if key not in self.leaderships:  # make leader: the epoch starts at the log end
            self.leaderships[key] = Leadership(len(self.nodes[self.record.leader].log))
        return self.leaderships[key]

    # faults
    @rule(data=st.data())
    def kill(self, data) -> None:
        alive = [i for i, n in self.nodes.items() if n.alive]
        if alive:
            self.nodes[data.draw(st.sampled_from(alive))].alive = False  # SIGKILL: the page cache keeps the log

    @rule(data=st.data(), crashed=st.booleans())
    def restart(self, data, crashed: bool) -> None:
        """A new process (alive or not before). After a machine crash the log keeps its flushed prefix and
        perhaps some of the rest: Kafka does not fsync acknowledged writes, it counts on the other replicas."""
        node = self.nodes[data.draw(st.sampled_from(sorted(self.nodes)))]
        node.alive, node.generation = True, node.generation + 1
        if crashed:
            node.log = node.log[:data.draw(st.integers(node.flushed, len(node.log)), label="survives")]

    @rule(data=st.data())
    def flush(self, data) -> None:
        node = self.nodes[data.draw(st.sampled_from(sorted(self.nodes)))]
        node.flushed = len(node.log)

    # electors
    @rule(data=st.data(), stale=st.booleans())
    def elect(self, data, stale: bool) -> None:
        view = data.draw(st.sampled_from(self.views)) if stale and self.views else self.view()
        current = view.partitions.get(TP)
        new = self.rule_under_test(current, self.assignment, view, self.unclean, tp=TP)
        if new is not None:
            self.cas(None if current is None else current.version, new)

    # the leader
    @precondition(lambda self: self.valid_leader() is not None)
    @rule()
    def append(self) -> None:
        leader = self.valid_leader()
        self.leadership()
        self.nodes[leader].log.append((self.record.leader_epoch, self.next_uid))
        self.next_uid += 1

    @precondition(lambda self: self.valid_leader() is not None)
    @rule(data=st.data())
    def replicate(self, data) -> None:
        """A follower fetches: truncates to where it agrees with the leader, copies some of the rest."""
        leader = self.valid_leader()
        followers = [r for r in self.record.replicas if r != leader and self.nodes[r].alive]
        if not followers:
            return
        f = data.draw(st.sampled_from(followers))
        source, mine = self.nodes[leader].log, self.nodes[f].log
        keep = common_prefix(source, mine)
        upto = data.draw(st.integers(keep, len(source)))
        self.nodes[f].log = source[:upto]
        self.nodes[f].flushed = min(self.nodes[f].flushed, keep)
        self.leadership().follower_leo[(f, self.nodes[f].incarnation)] = upto
        self.advance_hw()

    @precondition(lambda self: self.valid_leader() is not None)
    @rule()
    def advance_hw(self) -> None:
        """Kafka's HW: the minimum log end over the ISR, each member counted by what its current process
        fetched (a restarted member has fetched nothing yet in this leader epoch)."""
        leader, lead = self.valid_leader(), self.leadership()
        log = self.nodes[leader].log
        ends = [len(log)] + [lead.follower_leo.get((r, self.nodes[r].incarnation), -1)
                             for r in self.record.isr if r != leader]
        hw = min(ends)
        if hw > lead.hw:
            lead.hw = hw
            for offset in range(hw):
                self.acked.setdefault(offset, log[offset])
            self.ack_epochs.setdefault(self.record.leader_epoch, set()).add(leader)

    @precondition(lambda self: self.valid_leader() is not None)
    @rule(data=st.data())
    def shrink_isr(self, data) -> None:
        leader = self.valid_leader()
        others = [r for r in self.record.isr if r != leader]
        if others:
            out = data.draw(st.sampled_from(others))
            self.cas(str(self.version), self.record.changed(isr=tuple(r for r in self.record.isr if r != out)))

    @precondition(lambda self: self.valid_leader() is not None and not self.record.recovering)
    @rule(data=st.data())
    def expand_isr(self, data) -> None:
        """Kafka's rule: the follower's fetched log end is at least the HW and the epoch's start offset; the
        new member is recorded as the process whose fetches counted (KIP-903)."""
        leader, lead = self.valid_leader(), self.leadership()
        eligible = [(r, inc) for (r, inc), leo in lead.follower_leo.items()
                    if r not in self.record.isr and self.nodes[r].alive and self.nodes[r].incarnation == inc
                    and leo >= lead.hw and leo >= lead.epoch_start
                    and self.nodes[r].log[:leo] == self.nodes[leader].log[:leo]]
        if eligible:
            joiner, inc = data.draw(st.sampled_from(eligible))
            isr = tuple(r for r in self.record.replicas if r in self.record.isr or r == joiner)
            incarnations = tuple(inc if r == joiner else self.record.isr_incarnation(r) for r in isr)
            self.cas(str(self.version), self.record.changed(isr=isr, isr_incarnations=incarnations))

    @precondition(lambda self: self.valid_leader() is not None and self.record.recovering)
    @rule()
    def recovered(self) -> None:
        self.cas(str(self.version), self.record.changed(recovering=False))

    # what must always hold
    @invariant()
    def records_are_well_formed_and_epochs_never_go_back(self) -> None:
        for before, after in zip(self.history, self.history[1:]):
            assert after.partition_epoch == before.partition_epoch + 1
            assert after.leader_epoch >= before.leader_epoch
            if (after.leader, after.leader_incarnation) != (before.leader, before.leader_incarnation):
                assert after.leader_epoch == before.leader_epoch + 1
            assert after.replicas == before.replicas
        for r in self.history:
            assert set(r.isr) <= set(r.replicas)
            assert r.leader == NO_LEADER or r.leader in r.isr

    @invariant()
    def one_leader_per_epoch(self) -> None:
        by_epoch: dict[int, set[tuple[int, str]]] = {}
        for r in self.history:
            by_epoch.setdefault(r.leader_epoch, set()).add((r.leader, r.leader_incarnation))
        assert all(len(leaders) == 1 for leaders in by_epoch.values()), by_epoch
        assert all(len(nodes) == 1 for nodes in self.ack_epochs.values()), self.ack_epochs

    @invariant()
    def acknowledged_records_survive_on_the_leader_and_every_isr_member_still_the_same_process(self) -> None:
        """Every acknowledged record is at its offset on the valid leader, and on every ISR member whose
        process is the one it was in sync as (dead or alive: a killed node's disk keeps its log). A member
        that restarted since is out of sync whatever the record says, and may lack them."""
        if self.record is None:
            return
        holders = [r for r in self.record.isr if self.same_process(self.record, r)]
        if self.valid_leader() is not None:
            holders.append(self.valid_leader())
        for member in holders:
            log = self.nodes[member].log
            for offset, entry in self.acked.items():
                assert offset < len(log) and log[offset] == entry, (member, offset, entry, log)

    @invariant()
    def an_election_leads_when_an_in_sync_member_or_every_member_is_back(self) -> None:
        """Availability: deciding on the current view leaves no partition without a leader while an ISR member
        runs the process it was in sync as, or every member is back (last replica standing), or — with
        unclean election — any replica is live."""
        if self.record is None:
            return
        view = StoreView(str(self.version), {i: NodeRegistration(i, n.incarnation, "h", 1)
                                              for i, n in self.nodes.items() if n.alive},
                         {TP: Versioned(self.record, str(self.version))})
        after = self.rule_under_test(view.partitions[TP], self.assignment, view, self.unclean, tp=TP) or self.record
        should = (any(self.nodes[r].alive and self.same_process(self.record, r) for r in self.record.isr)
                  or (self.record.isr and self.every_member_restarted(self.record))
                  or (self.unclean and any(view.is_live(r) for r in self.record.replicas)))
        if should:
            assert after.leader != NO_LEADER and view.is_live(after.leader, after.leader_incarnation)


TestElectionMachine = ElectionMachine.TestCase
TestElectionMachine.settings = settings(max_examples=300, stateful_step_count=60, deadline=None)


class Script:
    """Draws for the machine's rules, given in order: to replay one scenario step by step."""

    def __init__(self, *values) -> None:
        self.values = list(values)

    def draw(self, strategy, label=None):
        return self.values.pop(0)


class BeforeIsrIncarnations(ElectionMachine):
    rule_under_test = staticmethod(decide_as_before_isr_incarnations)


@pytest.mark.parametrize("machine, loses", [(ElectionMachine, False), (BeforeIsrIncarnations, True)])
def test_a_follower_restarted_after_a_crash_while_no_leader_watched(machine, loses):
    """Issue 15's gap, replayed in the model: leader 0 and follower 1 hold an acknowledged record; 0 is
    killed (its log intact); 1 restarts after a machine crash that lost its unflushed log, before anyone saw
    0 die. The rule without ISR incarnations elects 1 and the acknowledged record is gone; this one waits for
    0, elects it when it is back, and 1 copies the record again."""
    m = machine()
    m.setup(2, Script(2, [0, 1], False))  # two replicas, node 0 first, clean elections only
    m.elect(Script(), stale=False)
    m.append()
    m.replicate(Script(1, 1))  # follower 1 fetches offset 0; the high watermark passes it: acknowledged
    assert m.acked == {0: (0, 0)}
    m.kill(Script(0))
    m.restart(Script(1, 0), crashed=True)  # nothing of node 1's log was flushed
    if loses:  # the old rule elects 1, which lacks the acknowledged record: the model refuses that election
        with pytest.raises(AssertionError, match="restarted ISR member elected without unclean"):
            m.elect(Script(), stale=False)
        assert m.nodes[1].log == [] and m.acked == {0: (0, 0)}
        return
    m.elect(Script(), stale=False)
    assert (m.record.leader, m.record.isr) == (NO_LEADER, (0,))
    m.acknowledged_records_survive_on_the_leader_and_every_isr_member_still_the_same_process()
    m.an_election_leads_when_an_in_sync_member_or_every_member_is_back()
    m.restart(Script(0), crashed=False)
    m.elect(Script(), stale=False)
    assert m.valid_leader() == 0
    m.replicate(Script(1, 1))
    m.acknowledged_records_survive_on_the_leader_and_every_isr_member_still_the_same_process()
    assert m.nodes[1].log == [(0, 0)]
