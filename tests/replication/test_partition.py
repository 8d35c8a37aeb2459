"""The leader's partition state (sidecar/replication/partition.py): Kafka's follower, ISR and high-watermark rules.

Named cases follow Kafka's ReplicaTest / PartitionTest; the state machine checks the safety property the rules
exist for: every offset below the high watermark is on every member of the committed ISR (so any replica a
new election can pick has it), whatever the order of fetches, appends, restarts, proposals and commits.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from shale.sidecar.log.topic_partition import TopicPartition
from shale.sidecar.protocol.error_codes import (
    FENCED_LEADER_EPOCH,
    NONE,
    NOT_ENOUGH_REPLICAS_AFTER_APPEND,
    NOT_LEADER_OR_FOLLOWER,
    UNKNOWN_LEADER_EPOCH,
)
from shale.sidecar.replication.control_store import Versioned
from shale.sidecar.replication.partition import FollowerState, PartitionState, Role
from shale.sidecar.replication.store_records import PartitionRecord

TP = TopicPartition("t", 0)
LAG = 30_000


def record(isr=(0, 1, 2), replicas=(0, 1, 2), leader=0, epoch=3, pepoch=7, recovering=False) -> PartitionRecord:
    return PartitionRecord(replicas=replicas, isr=isr, leader=leader, leader_incarnation="i0", leader_epoch=epoch,
                           partition_epoch=pepoch, recovering=recovering)


LIVE = {0: "i0", 1: "i1", 2: "i2"}


def leader_state(rec: PartitionRecord | None = None, leo: int = 100, now: int = 1_000, live=None) -> PartitionState:
    state = PartitionState(TP, 0)
    state.become_leader(Versioned(rec or record(), "v1"), leo, now, live or LIVE)
    return state


# -- followers (Kafka's ReplicaTest) -------------------------------------------------------------------


def test_a_fetch_at_the_leaders_end_is_caught_up_now():
    f = FollowerState("i1")
    f.fetched(fetch_offset=10, log_start_offset=0, leader_leo=10, now_ms=500)
    assert f.last_caught_up_ms == 500
    assert f.caught_up(leader_leo=20, now_ms=500 + LAG, max_lag_ms=LAG)
    assert not f.caught_up(leader_leo=20, now_ms=501 + LAG, max_lag_ms=LAG)


def test_reaching_the_leaders_end_of_the_previous_fetch_counts_from_that_fetch():
    f = FollowerState("i1")
    f.fetched(5, 0, leader_leo=10, now_ms=100)  # behind: not caught up
    assert f.last_caught_up_ms is None
    f.fetched(10, 0, leader_leo=15, now_ms=300)  # reached what the leader had at the fetch before
    assert f.last_caught_up_ms == 100
    f.fetched(12, 0, leader_leo=20, now_ms=400)  # did not reach 15
    assert f.last_caught_up_ms == 100


def test_a_follower_at_the_leaders_end_is_caught_up_however_long_ago_it_fetched():
    f = FollowerState("i1")
    f.fetched(10, 0, leader_leo=10, now_ms=0)
    assert f.caught_up(leader_leo=10, now_ms=10 * LAG, max_lag_ms=LAG)


# -- becoming leader ----------------------------------------------------------------------------------


def test_a_new_leader_counts_isr_members_caught_up_now_and_others_never():
    state = leader_state(record(isr=(0, 1)), now=5_000)
    assert state.role is Role.LEADER and state.leader_epoch == 3 and state.leader_epoch_start_offset == 100
    assert state.followers[1].last_caught_up_ms == 5_000
    assert state.followers[2].last_caught_up_ms is None
    assert state.followers[1].log_end_offset == -1  # unknown until it fetches in this epoch


def test_the_high_watermark_waits_for_every_isr_member_to_fetch_in_the_new_epoch():
    state = leader_state()
    assert state.high_watermark(100, 1_000, LAG, 1) == -1  # nobody has fetched yet: no rise
    state.follower_fetched(1, 100, 0, 100, 1_001)
    assert state.high_watermark(100, 1_001, LAG, 1) == -1
    state.follower_fetched(2, 90, 0, 100, 1_002)
    assert state.high_watermark(100, 1_002, LAG, 1) == 90


def test_no_high_watermark_while_the_isr_is_under_its_minimum():
    state = leader_state(record(isr=(0,)))
    assert state.high_watermark(100, 1_000, LAG, min_insync_replicas=2) is None
    assert state.high_watermark(100, 1_000, LAG, min_insync_replicas=1) is not None


def test_the_minimum_isr_is_capped_by_the_replication_factor():
    state = leader_state(record(isr=(0,), replicas=(0,)))
    assert state.min_isr(3) == 1 and not state.under_min_isr(3)
    assert state.high_watermark(100, 1_000, LAG, 3) == 100


def test_a_caught_up_follower_outside_the_isr_holds_the_high_watermark_so_it_can_join():
    state = leader_state(record(isr=(0, 1)))
    state.follower_fetched(2, 100, 0, 100, 1_000)  # caught up, eligible, not in the ISR yet
    state.follower_fetched(1, 120, 0, 120, 1_001)
    state.follower_fetched(2, 100, 0, 120, 1_001)
    assert state.high_watermark(120, 1_001, LAG, 1) == 100
    state.live = {0: "i0", 1: "i1"}  # its session ended: no longer waited for
    assert state.high_watermark(120, 1_001, LAG, 1) == 120


# -- ISR changes ---------------------------------------------------------------------------------------


def test_a_lagging_member_is_shrunk_out_after_the_lag_time():
    state = leader_state(now=0)
    state.follower_fetched(1, 100, 0, 100, 0)
    state.follower_fetched(2, 100, 0, 100, 0)
    assert state.isr_change(150, 100, LAG, LAG, shrink_lagging=True) is None  # exactly the lag: still in sync
    state.follower_fetched(1, 150, 0, 150, LAG)
    assert state.isr_change(150, 100, LAG + 1, LAG) is None  # laggards go on the timer only
    new = state.isr_change(150, 100, LAG + 1, LAG, shrink_lagging=True)
    assert new is not None and new.isr == (0, 1)
    assert (new.partition_epoch, new.leader_epoch) == (8, 3)  # an ISR change keeps the leader epoch


def test_a_follower_rejoining_at_a_frozen_high_watermark_stays_until_the_next_timer_round():
    """Under min.insync.replicas the high watermark is frozen: a lagging follower past it is expanded in, and
    must not be shrunk out again at its next fetch (that flapped the ISR at every fetch)."""
    state = leader_state(record(isr=(0,)), leo=100, now=0)  # HW frozen at 100, min.insync 2
    state.follower_fetched(1, 100, 0, 500, LAG)  # past the HW, far behind the leader's 500
    state.update(Versioned(state.isr_change(500, 100, LAG, LAG), "v2"), LIVE)
    assert state.record.isr == (0, 1)
    state.follower_fetched(1, 120, 0, 600, LAG + 1)
    assert state.isr_change(600, 100, 2 * LAG + 1, LAG) is None
    assert state.isr_change(600, 100, 2 * LAG + 1, LAG, shrink_lagging=True).isr == (0,)


def test_a_member_whose_process_changed_is_shrunk_out_at_once():
    state = leader_state(now=0)
    state.update(Versioned(record(), "v1"), {0: "i0", 1: "i1-restarted", 2: "i2"})
    assert state.followers[1].incarnation == "i1-restarted" and state.followers[1].log_end_offset == -1
    state.follower_fetched(1, 90, 0, 100, 1)  # the new process lost a tail the high watermark covered
    shrunk = state.isr_change(100, 100, 1, LAG)
    assert shrunk.isr == (0, 2)
    state.update(Versioned(shrunk, "v2"), {0: "i0", 1: "i1-restarted", 2: "i2"})
    assert not state.followers[1].replaced  # out of the ISR: ordinary rules from here
    state.follower_fetched(1, 100, 0, 300, 2)  # back at the high watermark, behind the leader's end
    rejoined = state.isr_change(300, 100, 2, LAG)
    assert rejoined.isr == (0, 1, 2)
    state.update(Versioned(rejoined, "v3"), {0: "i0", 1: "i1-restarted", 2: "i2"})
    assert state.isr_change(300, 100, 3, LAG) is None  # not shrunk again before the timer says it lags


def test_a_member_that_restarted_before_this_leader_was_elected_is_shrunk_out_at_once():
    """KIP-903: the record names the process each member was in sync as; a new leader that finds another
    process of that node live (a restart while no leader watched) does not count it in sync."""
    rec = record(isr=(0, 1, 2))
    rec = PartitionRecord(rec.replicas, rec.isr, 0, "i0", 3, 7, isr_incarnations=("i0", "i1-before", "i2"))
    state = leader_state(rec, now=0)
    assert not state.eligible(1) and state.eligible(2)
    new = state.isr_change(100, 100, 1, LAG)
    assert (new.isr, new.isr_incarnations) == ((0, 2), ("i0", "i2"))


def test_an_expansion_records_the_newcomers_process():
    state = leader_state(PartitionRecord((0, 1, 2), (0, 1), 0, "i0", 3, 7, isr_incarnations=("i0", "i1")), leo=100)
    state.follower_fetched(1, 100, 0, 100, 1_000)
    state.follower_fetched(2, 100, 0, 100, 1_000)
    new = state.isr_change(100, 100, 1_000, LAG)
    assert (new.isr, new.isr_incarnations) == ((0, 1, 2), ("i0", "i1", "i2"))


def test_a_member_whose_session_ended_is_shrunk_out_at_once():
    state = leader_state(now=0)
    state.update(Versioned(record(), "v1"), {0: "i0", 2: "i2"})
    assert state.isr_change(100, 100, 1, LAG).isr == (0, 2)


def test_a_follower_joins_at_the_high_watermark_and_past_the_epoch_start():
    state = leader_state(record(isr=(0, 1)), leo=100)
    state.follower_fetched(1, 100, 0, 100, 1_000)
    state.follower_fetched(2, 95, 0, 130, 1_000)
    assert state.isr_change(130, 100, 1_000, LAG) is None  # 95 < high watermark 100
    state.follower_fetched(2, 100, 0, 130, 1_001)
    new = state.isr_change(130, 100, 1_001, LAG)
    assert new.isr == (0, 1, 2)

    low_start = leader_state(record(isr=(0, 1)), leo=100)
    low_start.follower_fetched(2, 99, 0, 100, 1_000)  # past the high watermark 90 but before the epoch start
    assert low_start.isr_change(100, 90, 1_000, LAG) is None


def test_an_expansion_ends_an_unclean_leaders_recovery():
    state = leader_state(record(isr=(0,), recovering=True))
    state.follower_fetched(1, 100, 0, 100, 1_000)
    new = state.isr_change(100, 100, 1_000, LAG)
    assert new.isr == (0, 1) and not new.recovering


def test_one_change_at_a_time_and_a_pending_expansion_holds_the_high_watermark():
    state = leader_state(record(isr=(0, 1)), leo=100)
    state.follower_fetched(1, 100, 0, 100, 1_000)
    state.follower_fetched(2, 100, 0, 100, 1_000)
    new = state.isr_change(100, 100, 1_000, LAG)
    state.propose(new, 1_000)
    assert state.isr_change(100, 100, 1_000, LAG) is None
    state.live = {0: "i0", 1: "i1"}  # node 2 no longer eligible, but its pending expansion still counts
    state.follower_fetched(1, 120, 0, 120, 1_001)
    assert state.high_watermark(120, 1_001, LAG, 1) == 100
    assert state.maximal_isr() == {0, 1, 2}


def test_a_view_with_another_version_ends_the_pending_change_and_a_stale_one_is_sent_again():
    state = leader_state(record(isr=(0, 1)))
    state.follower_fetched(2, 100, 0, 100, 1_000)
    pending = state.propose(state.isr_change(100, 100, 1_000, LAG), 1_000)
    assert state.resend_pending(1_000 + LAG // 2 - 1, LAG // 2) is None
    again = state.resend_pending(1_000 + LAG // 2, LAG // 2)
    assert again is not None and again.proposed == pending.proposed and state.pending is again
    state.update(Versioned(pending.proposed, "v2"), LIVE)
    assert state.pending is None and state.record.isr == (0, 1, 2)


def test_followers_do_not_track_followers():
    state = PartitionState(TP, 1)
    state.become_follower(Versioned(record(), "v1"))
    state.update(Versioned(record(), "v2"), LIVE)
    assert state.followers == {} and state.isr_change(100, 100, 0, LAG) is None
    assert not state.follower_fetched(2, 10, 0, 10, 0)
    assert state.high_watermark(100, 0, LAG, 1) is None


# -- acknowledgements and epochs -----------------------------------------------------------------------


def test_produce_outcomes():
    state = leader_state()
    assert state.produce_outcome(101, 3, high_watermark=100, min_insync_replicas=2, may_lead=True) is None
    assert state.produce_outcome(101, 3, 101, 2, True) == NONE
    assert state.produce_outcome(101, 2, 101, 2, True) == NOT_LEADER_OR_FOLLOWER  # appended in another epoch
    assert state.produce_outcome(101, 3, 101, 2, False) == NOT_LEADER_OR_FOLLOWER  # fenced
    state.update(Versioned(record(isr=(0,)), "v2"), LIVE)
    assert state.produce_outcome(101, 3, 101, 2, True) == NOT_ENOUGH_REPLICAS_AFTER_APPEND
    state.become_follower(Versioned(record(leader=1, isr=(1,), epoch=4), "v3"))
    assert state.produce_outcome(101, 3, 101, 1, True) == NOT_LEADER_OR_FOLLOWER


def test_request_epochs():
    state = leader_state()
    assert state.check_epoch(-1) == NONE
    assert state.check_epoch(3) == NONE
    assert state.check_epoch(2) == FENCED_LEADER_EPOCH
    assert state.check_epoch(4) == UNKNOWN_LEADER_EPOCH


# -- the state machine ----------------------------------------------------------------------------------


class LeaderModel(RuleBasedStateMachine):
    """A leader (node 0) with followers 1..3 whose real logs the model keeps; the high watermark as the replica
    manager keeps it (raised to the candidate, never lowered)."""

    def __init__(self) -> None:
        super().__init__()
        self.now = 0
        self.version = 0
        self.incarnations = {0: "i0", 1: "a1", 2: "a2", 3: "a3"}
        self.live = dict(self.incarnations)
        self.leo = 0
        self.logs = {1: 0, 2: 0, 3: 0}  # the followers' real log end offsets
        self.hw = 0
        self.min_isr = 2
        self.state = PartitionState(TP, 0)
        rec = PartitionRecord((0, 1, 2, 3), (0, 1, 2, 3), 0, "i0", 0, 0)
        self.state.become_leader(Versioned(rec, "0"), 0, self.now, self.live)

    @rule(n=st.integers(1, 5), min_isr=st.integers(1, 4))
    def append(self, n, min_isr):
        self.leo += n
        self.min_isr = min_isr
        self.raise_hw()

    @rule(r=st.sampled_from([1, 2, 3]), data=st.data())
    def fetch(self, r, data):
        if r not in self.live:
            return
        self.state.follower_fetched(r, self.logs[r], 0, self.leo, self.now)  # reports its end, then copies
        self.raise_hw()
        self.logs[r] = data.draw(st.integers(self.logs[r], self.leo))

    @rule(ms=st.integers(1, LAG))
    def tick(self, ms):
        self.now += ms

    @rule(r=st.sampled_from([1, 2, 3]), back=st.booleans())
    def session_change(self, r, back):
        if back:
            self.incarnations[r] += "'"
            self.live[r] = self.incarnations[r]
        else:
            self.live.pop(r, None)
        self.state.update(self.state.committed, self.live)
        self.raise_hw()

    @rule(timer=st.booleans())
    def propose(self, timer):
        new = self.state.isr_change(self.leo, self.hw, self.now, LAG, shrink_lagging=timer)
        if new is not None:
            self.state.propose(new, self.now)

    @precondition(lambda self: self.state.pending is not None)
    @rule()
    def commit(self):
        self.version += 1
        self.state.update(Versioned(self.state.pending.proposed, str(self.version)), self.live)
        self.raise_hw()

    def raise_hw(self):
        candidate = self.state.high_watermark(self.leo, self.now, LAG, self.min_isr)
        if candidate is not None:
            self.hw = max(self.hw, min(candidate, self.leo))

    @invariant()
    def committed_data_is_on_every_isr_member(self):
        for r in self.state.record.isr:
            assert (self.leo if r == 0 else self.logs[r]) >= self.hw, (r, self.state.record.isr, self.logs, self.hw)

    @invariant()
    def record_is_well_formed(self):
        rec = self.state.record
        assert 0 in rec.isr and set(rec.isr) <= set(rec.replicas) and rec.leader_epoch == 0


TestLeaderModel = LeaderModel.TestCase
TestLeaderModel.settings = settings(max_examples=300, stateful_step_count=60, deadline=None)


@given(st.lists(st.tuples(st.integers(0, 50), st.integers(0, 100)), max_size=30))
def test_caught_up_time_never_goes_back(fetches):
    f = FollowerState("x")
    last = None
    now = 0
    for offset, leader_leo in fetches:
        now += 1
        f.fetched(offset, 0, max(offset, leader_leo), now)
        if last is not None:
            assert f.last_caught_up_ms is not None and f.last_caught_up_ms >= last
        last = f.last_caught_up_ms
