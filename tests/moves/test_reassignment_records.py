"""The reassignment's record transitions (sidecar/replication/reassignment.py), pure: Kafka's
PartitionReassignmentReplicas, PartitionReassignmentRevert and completeReassignmentIfNeeded, checked by
example and as a state machine under random starts, cancels, ISR changes and completions."""

from __future__ import annotations

import json

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from shale.sidecar.replication import reassignment
from shale.sidecar.replication.controller import alter_partition_error
from shale.sidecar.replication.store_records import NO_LEADER, PartitionRecord, RecordError

NODES = range(5)
LIVE = {n: f"inc{n}" for n in NODES}


def record(replicas, isr=None, leader=None) -> PartitionRecord:
    isr = tuple(replicas if isr is None else isr)
    leader = isr[0] if leader is None else leader
    return PartitionRecord(tuple(replicas), isr, leader, LIVE[leader], 3, 7,
                           isr_incarnations=tuple(LIVE[r] for r in isr))


def test_moving_off_a_node_adds_the_target_then_completes_once_every_target_replica_is_in_sync():
    before = record((0,))
    moving = reassignment.start(before, (1, 2), LIVE)
    assert (moving.replicas, moving.adding_replicas, moving.removing_replicas) == ((1, 2, 0), (1, 2), (0,))
    assert (moving.isr, moving.leader, moving.leader_epoch) == ((0,), 0, 3)  # nothing else moves at the start
    assert reassignment.complete(moving, LIVE) is None
    one = moving.changed(isr=(0, 1), isr_incarnations=("inc0", "inc1"))
    assert reassignment.complete(one, LIVE) is None  # node 2 is not in sync yet
    both = one.changed(isr=(0, 1, 2), isr_incarnations=("inc0", "inc1", "inc2"))
    done = reassignment.complete(both, LIVE)
    # The leader is removed: the first target replica in sync as its recorded process leads, in a new epoch.
    assert (done.replicas, done.isr, done.leader, done.leader_incarnation) == ((1, 2), (1, 2), 1, "inc1")
    assert (done.adding_replicas, done.removing_replicas, done.leader_epoch) == ((), (), 4)
    assert reassignment.is_completion(both, done) and alter_partition_error(both, done) is None


def test_a_leader_that_stays_keeps_its_epoch_and_a_lower_replication_factor_completes_at_once():
    done = reassignment.start(record((0, 1, 2)), (0, 2), LIVE)
    assert (done.replicas, done.isr, done.leader, done.leader_epoch, done.reassigning) == ((0, 2), (0, 2), 0, 3, False)


def test_a_restarted_isr_member_is_not_made_leader_by_a_completion():
    moving = reassignment.start(record((0,)), (1, 2), LIVE).changed(
        isr=(0, 1, 2), isr_incarnations=("inc0", "inc1", "inc2"))
    done = reassignment.complete(moving, {**LIVE, 1: "restarted"})
    assert done.leader == 2  # node 1 runs another process than the one that caught up
    nobody = reassignment.complete(moving, {0: "inc0"})
    assert nobody.leader == NO_LEADER and nobody.leader_epoch == moving.leader_epoch + 1  # the electors' turn


def test_cancel_reverts_to_the_original_replicas_and_drops_the_newcomers_from_the_isr():
    moving = reassignment.start(record((0, 1)), (2, 3), LIVE).changed(
        isr=(0, 1, 2), isr_incarnations=("inc0", "inc1", "inc2"))
    back = reassignment.cancel(moving, LIVE)
    assert (back.replicas, back.isr, back.leader, back.reassigning) == ((0, 1), (0, 1), 0, False)
    assert reassignment.cancel(back, LIVE) is None  # NO_REASSIGNMENT_IN_PROGRESS at the API
    # A target naming the replicas from before the move (a reverted manifest) is the same cancellation.
    assert reassignment.start(moving, (1, 0), LIVE) == back


def test_a_new_target_replaces_a_move_in_progress_from_the_current_replicas():
    moving = reassignment.start(record((0,)), (1,), LIVE)
    again = reassignment.start(moving, (2,), LIVE)
    assert (again.replicas, again.adding_replicas, again.removing_replicas) == ((2, 1, 0), (2,), (1, 0))
    assert reassignment.start(again, (2,), LIVE) is None  # already there


def test_isr_changes_during_a_move_may_not_touch_it():
    moving = reassignment.start(record((0,)), (1,), LIVE)
    assert alter_partition_error(moving, moving.changed(isr=(0, 1))) is None
    assert "reassignment" in alter_partition_error(moving, moving.changed(adding_replicas=()))
    # A completion before node 1 is in sync is refused.
    early = moving.changed(isr=(0,), adding_replicas=(), removing_replicas=(), replicas=(1, 0))
    assert not reassignment.is_completion(moving, early) and alter_partition_error(moving, early) is not None


@pytest.mark.parametrize("target, message", [((), "empty"), ((1, 1), "twice"), ((1, 9), "[9]")])
def test_targets_kafka_refuses(target, message):
    with pytest.raises(reassignment.InvalidTarget, match=message.replace("[", r"\[").replace("]", r"\]")):
        reassignment.check_target(target, LIVE)


def test_the_record_keeps_the_move_in_its_json_and_older_records_read_as_none():
    moving = reassignment.start(record((0,)), (1, 2), LIVE)
    assert PartitionRecord.from_json(moving.to_json(), "k") == moving
    plain = record((0, 1))
    assert "adding_replicas" not in json.loads(plain.to_json())  # a record without a move is as before
    assert PartitionRecord.from_json(plain.to_json(), "k") == plain
    with pytest.raises(RecordError, match="disjoint"):
        PartitionRecord((0, 1), (0,), 0, "inc0", adding_replicas=(1,), removing_replicas=(1,))
    with pytest.raises(RecordError, match="disjoint"):
        PartitionRecord((0,), (0,), 0, "inc0", adding_replicas=(3,))


targets = st.lists(st.sampled_from(list(NODES)), min_size=1, max_size=4, unique=True).map(tuple)


class Moves(RuleBasedStateMachine):
    """Random moves, cancels, ISR expansions and shrinks on one record: every record is valid, epochs only rise,
    a move's target is always `replicas - removing`, and a cancellation restores the replicas from before."""

    @initialize(replicas=targets)
    def begin(self, replicas):
        self.record = record(replicas)
        self.before_move = None  # the replicas when the current move (if any) began, from a settled record

    def _set(self, new: PartitionRecord | None) -> None:
        if new is None:
            return
        assert new.partition_epoch > self.record.partition_epoch
        assert new.leader_epoch >= self.record.leader_epoch
        if new.reassigning and (self.record.reassigning or new.replicas != self.record.replicas):
            # a move begun from a settled record remembers where it began; a replaced move does not
            self.before_move = None if self.record.reassigning else self.record.replicas
        self.record = new

    @rule(goal=targets)
    def move(self, goal):
        settled = not self.record.reassigning
        before = self.record
        self._set(reassignment.start(self.record, goal, LIVE))
        if self.record.reassigning:
            assert self.record.target_replicas == goal
        elif self.record is not before:  # completed at once, or a cancellation back to where it began
            assert set(self.record.replicas) == set(goal)
        assert settled or before.reassigning

    @precondition(lambda self: self.record.reassigning)
    @rule()
    def cancel(self):
        started_from = self.before_move
        self._set(reassignment.cancel(self.record, LIVE))
        assert not self.record.reassigning
        if started_from is not None:  # the same replicas; their order is Kafka's revert's (target order first)
            assert set(self.record.replicas) == set(started_from)

    @rule(data=st.data())
    def expand(self, data):
        out = [r for r in self.record.replicas if r not in self.record.isr]
        if out:
            r = data.draw(st.sampled_from(out))
            isr = tuple(x for x in self.record.replicas if x in self.record.isr or x == r)
            self._set(self.record.changed(isr=isr, isr_incarnations=tuple(LIVE[x] for x in isr)))

    @rule(data=st.data())
    def shrink(self, data):
        others = [r for r in self.record.isr if r != self.record.leader]
        if others:
            r = data.draw(st.sampled_from(others))
            self._set(self.record.changed(isr=tuple(x for x in self.record.isr if x != r)))

    @rule()
    def complete(self):
        before = self.record
        done = reassignment.complete(before, LIVE)
        if done is not None:
            assert reassignment.is_completion(before, done) and alter_partition_error(before, done) is None
            assert done.replicas == before.target_replicas and set(done.isr) <= set(done.replicas)
        self._set(done)

    @invariant()
    def valid(self):
        r = self.record
        assert r.target_replicas and set(r.target_replicas) | set(r.removing_replicas) == set(r.replicas)
        assert r.leader == NO_LEADER or r.leader in r.isr
        assert PartitionRecord.from_json(r.to_json(), "k") == r


Moves.TestCase.settings = settings(max_examples=150, stateful_step_count=25, deadline=None)
TestMoves = Moves.TestCase
