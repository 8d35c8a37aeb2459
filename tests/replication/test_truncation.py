"""Kafka's follower truncation rules (sidecar/replication/truncation.py): the table row by row, the cases of
Kafka's AbstractFetcherThreadTest replayed on epoch logs, and a property over random cluster histories."""

from __future__ import annotations

from epoch_log_model import (
    OUT_OF_RANGE,
    Diverging,
    EpochLog,
    catch_up,
    common_prefix,
    follower_round,
    leader_answer,
)
from hypothesis import given, settings
from hypothesis import strategies as st

from shale.sidecar.replication.truncation import (
    UNDEFINED,
    EpochEndOffset,
    FetchStart,
    OutOfRangeReset,
    TruncationState,
    fetch_start,
    out_of_range_reset,
    truncation_for,
)


def log_of(*epochs: int) -> EpochLog:
    log = EpochLog()
    log.append(list(epochs))
    return log


# -- the table (spec §2.3), one row each ---------------------------------------------------------------------


def test_leader_without_an_answer_keeps_the_fetch_offset():
    assert truncation_for(UNDEFINED, EpochEndOffset(3, 10), 12, 7) == TruncationState(7, True)


def test_answer_without_an_epoch_cuts_to_the_leaders_offset_within_our_log():
    assert truncation_for(EpochEndOffset(-1, 5), UNDEFINED, 12, 12) == TruncationState(5, True)
    assert truncation_for(EpochEndOffset(-1, 50), UNDEFINED, 12, 12) == TruncationState(12, True)


def test_same_epoch_known_to_both_cuts_at_the_smaller_end():
    assert truncation_for(EpochEndOffset(4, 9), EpochEndOffset(4, 11), 15, 15) == TruncationState(9, True)
    assert truncation_for(EpochEndOffset(4, 11), EpochEndOffset(4, 9), 15, 15) == TruncationState(9, True)
    assert truncation_for(EpochEndOffset(4, 20), EpochEndOffset(4, 18), 15, 15) == TruncationState(15, True)


def test_epoch_unknown_to_the_follower_cuts_to_its_older_epoch_and_asks_again():
    assert truncation_for(EpochEndOffset(4, 9), EpochEndOffset(2, 6), 15, 15) == TruncationState(6, False)
    assert truncation_for(EpochEndOffset(4, 9), EpochEndOffset(2, 30), 15, 15) == TruncationState(15, False)


def test_follower_without_an_older_epoch_cuts_to_the_leaders_offset():
    assert truncation_for(EpochEndOffset(1, 3), UNDEFINED, 15, 15) == TruncationState(3, True)
    assert truncation_for(EpochEndOffset(1, 30), UNDEFINED, 15, 15) == TruncationState(15, True)


def test_fetch_start_uses_the_log_end_with_epochs_and_the_high_watermark_without():
    assert fetch_start(3, log_end_offset=20, high_watermark=12) == FetchStart(20, None)
    assert fetch_start(None, log_end_offset=20, high_watermark=12) == FetchStart(12, 12)


def test_out_of_range_resets():
    # A shorter leader (unclean election): cut to its end.
    assert out_of_range_reset(10, leader_end_offset=6, leader_start_offset=0) == OutOfRangeReset(6, truncate_to=6)
    # Retention on the leader passed our end: start over at its start.
    assert out_of_range_reset(3, leader_end_offset=50, leader_start_offset=20) == OutOfRangeReset(20, start_at=20)
    # Neither: fetch on from our end (the leader grew while we asked).
    assert out_of_range_reset(30, leader_end_offset=50, leader_start_offset=20) == OutOfRangeReset(30)


# -- Kafka's AbstractFetcherThreadTest cases, on epoch logs ---------------------------------------------------


def test_simple_fetch_of_an_empty_follower():
    leader, follower = log_of(0, 0), EpochLog()
    assert catch_up(follower, leader, max_records=2) == ["appended", "idle"]
    assert follower.epochs == [0, 0] and follower.cache == [(0, 0)]


def test_truncation_when_every_epoch_differs():
    """testTruncation: follower epochs 0,2,4 and leader 1,3,5 at offsets 0,1,2 share nothing."""
    follower, leader = log_of(0, 2, 4), log_of(1, 3, 5)
    steps = catch_up(follower, leader)
    assert follower.epochs == leader.epochs and follower.cache == leader.cache
    assert steps.count("truncated") >= 1


def test_diverging_epochs_cut_to_the_last_common_epoch():
    """testDivergingEpochs: follower 0,2,4 and leader 0,2,5: the follower keeps offsets 0-1 and fetches 2."""
    follower, leader = log_of(0, 2, 4), log_of(0, 2, 5)
    answer = leader_answer(leader, follower.end, follower.latest_epoch, 1)
    assert answer == Diverging(2, 2)
    assert follower_round(follower, leader) == "truncated"
    assert follower.epochs == [0, 2] and follower.latest_epoch == 2
    catch_up(follower, leader)
    assert follower.epochs == [0, 2, 5] and follower.latest_epoch == 5


def test_truncate_on_fetch_cuts_once_and_keeps_the_common_prefix():
    """testTruncateOnFetchDoesNotProcessPartitionData: 0,0,2,4,4,4 against 0,0,2,5,5 cuts to 3, once."""
    follower, leader = log_of(0, 0, 2, 4, 4, 4), log_of(0, 0, 2, 5, 5)
    steps = catch_up(follower, leader)
    assert steps.count("truncated") == 1 and steps[0] == "truncated"
    assert follower.epochs == [0, 0, 2, 5, 5]


def test_leader_change_with_divergent_tails_several_epochs_deep():
    """The follower led epochs 3 and 4 alone; the new leader knows only epoch 2 after the common part."""
    follower, leader = log_of(0, 1, 1, 3, 3, 4, 4), log_of(0, 1, 1, 2, 2, 2)
    leader.assign(5, leader.end)  # the leader's current epoch, assigned at its end before any append
    catch_up(follower, leader)
    assert follower.epochs == leader.epochs
    assert follower.cache == [(0, 0), (1, 1), (2, 3)]  # epoch 5 has no record yet: only the leader has it
    assert leader.cache == [(0, 0), (1, 1), (2, 3), (5, 6)]


def test_follower_ahead_in_the_same_epoch_cuts_to_the_leaders_end():
    follower, leader = log_of(0, 0, 1, 1, 1), log_of(0, 0, 1)
    leader.assign(2, leader.end)
    assert follower_round(follower, leader) == "truncated"
    assert follower.epochs == [0, 0, 1]


def test_unclean_election_makes_a_shorter_log_the_truth():
    """The old leader (epochs 0-3) comes back after an out-of-sync replica with epoch 0 only was elected
    uncleanly in epoch 4: its epoch-1..3 records are lost, as in Kafka."""
    follower, leader = log_of(0, 0, 1, 2, 3), log_of(0)
    leader.assign(4, leader.end)
    leader.append([4, 4])
    catch_up(follower, leader)
    assert follower.epochs == [0, 4, 4]


def test_follower_fetch_out_of_range_high():
    """testFollowerFetchOutOfRangeHigh: the leader's log was emptied under the follower; it cuts to 0."""
    follower, leader = log_of(0, 2, 4), EpochLog()
    leader.assign(4, 0)
    assert leader_answer(leader, follower.end, None, 1) == OUT_OF_RANGE
    assert follower_round(follower, leader) in ("truncated", "reset")
    catch_up(follower, leader)
    assert follower.end == 0


def test_follower_fetch_out_of_range_low():
    """testFollowerFetchOutOfRangeLow: the leader's log starts at 2, above the follower's end (1)."""
    follower = log_of(0)
    leader = EpochLog()
    leader.start_at(2)
    leader.append([4])
    steps = catch_up(follower, leader)
    assert "reset" in steps
    assert follower.start == 2 and follower.epochs[2:] == [4]


# -- any history: the follower ends with the leader's log, and never cuts what it shares ----------------------

ACTIONS = st.lists(
    st.one_of(
        st.tuples(st.just("elect"), st.integers(0, 2)),
        st.tuples(st.just("append"), st.integers(1, 4)),
        st.tuples(st.just("fetch"), st.integers(0, 2), st.integers(1, 3)),
    ),
    max_size=40,
)


@settings(max_examples=300, deadline=None)
@given(ACTIONS)
def test_followers_converge_to_any_leader_without_cutting_what_they_share(actions):
    """Elections (clean or not), appends and partial fetches in any order; at every fetch the cut stays at or
    above the part the follower shares with its leader, and at the end every follower holds the leader's log."""
    replicas = [EpochLog() for _ in range(3)]
    leader_id, epoch = 0, 0
    replicas[0].assign(0, 0)
    for action in actions:
        if action[0] == "elect":
            leader_id, epoch = action[1], epoch + 1
            replicas[leader_id].assign(epoch, replicas[leader_id].end)
        elif action[0] == "append":
            replicas[leader_id].append([epoch] * action[1])
        elif action[1] != leader_id:
            follower, leader = replicas[action[1]], replicas[leader_id]
            for _ in range(action[2]):
                shared = common_prefix(follower, leader)
                follower_round(follower, leader, max_records=2)
                assert follower.end >= shared, (follower, leader)
    leader = replicas[leader_id]
    for i, follower in enumerate(replicas):
        if i == leader_id:
            continue
        shared = common_prefix(follower, leader)
        for _ in range(200):
            if follower_round(follower, leader, max_records=3) == "idle":
                break
            assert follower.end >= shared
        assert follower.epochs == leader.epochs
        assert written_epochs(follower) == written_epochs(leader)


def written_epochs(log: EpochLog) -> list[tuple[int, int]]:
    """The cache entries of epochs that wrote records (an epoch assigned at the end may have none yet)."""
    return [(e, s) for e, s in log.cache if s < log.end]


def test_an_epoch_assigned_at_the_end_without_records_is_dropped_by_a_cut_at_the_end():
    """A replica elected in epoch 2 that appended nothing before losing leadership holds (2, 0) with an empty
    log; the new leader (epoch 3, records of epoch 1) answers Diverging(1, 1) and the cut to 0 must remove
    the entry, or the follower would ask with epoch 2 forever (Kafka's truncateTo does the same)."""
    follower = EpochLog()
    follower.assign(2, 0)
    leader = log_of(1)
    leader.assign(3, 1)
    assert leader_answer(leader, 0, 2, 1) == Diverging(1, 1)
    assert catch_up(follower, leader) == ["truncated", "appended", "idle"]
    assert follower.epochs == [1]
