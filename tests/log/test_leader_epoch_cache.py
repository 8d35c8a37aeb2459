"""The leader-epoch cache and its `leader-epoch-checkpoint` (spec replication §2.5).

The rule cases are those of Kafka's LeaderEpochFileCacheTest (names kept in comments); a
hypothesis state machine checks the cache against a naive model of Kafka's rules, and that the
file always says what memory says.
"""

from __future__ import annotations

import os
import shutil
import tempfile

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from shale.sidecar.log.checkpoint import (
    LEADER_EPOCH_CHECKPOINT,
    CheckpointError,
    EpochEntry,
    encode_epoch_entries,
    parse_epoch_entries,
)
from shale.sidecar.log.leader_epoch_cache import UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET, LeaderEpochCache

UNDEFINED = (UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET)


def E(epoch: int, start: int) -> EpochEntry:
    return EpochEntry(epoch, start)


@pytest.fixture
def path(tmp_path) -> str:
    return str(tmp_path / LEADER_EPOCH_CHECKPOINT)


@pytest.fixture
def cache(path) -> LeaderEpochCache:
    return LeaderEpochCache(path, "TestTopic-5")


def on_disk(path: str) -> list[EpochEntry]:
    with open(path, "rb") as f:
        return parse_epoch_entries(f.read(), path)


# --- the file format ---------------------------------------------------------------------------

def test_golden_text_as_kafka_writes_it() -> None:
    entries = [E(0, 0), E(2, 1543), E(5, 90211)]
    assert encode_epoch_entries(entries) == b"0\n3\n0 0\n2 1543\n5 90211\n"
    assert encode_epoch_entries([]) == b"0\n0\n"
    assert parse_epoch_entries(b"0\n3\n0 0\n2 1543\n5 90211\n") == entries


def test_any_whitespace_between_fields_and_an_empty_file_as_kafka_creates_it() -> None:
    assert parse_epoch_entries(b"0\n2\n0  1\n1\t2\n") == [E(0, 1), E(1, 2)]  # Kafka's own doc comment has 2 spaces
    assert parse_epoch_entries(b"0\r\n1\r\n3 7\r\n") == [E(3, 7)]
    assert parse_epoch_entries(b"") == []


@pytest.mark.parametrize("data,match", [
    (b"1\n0\n", "unrecognised version 1"),
    (b"x\n0\n", "version"),
    (b"0\n", "count"),
    (b"0\n2\n1 5\n", "expected 2 entries"),
    (b"0\n1\n1 5\n2 6\n", "expected 1 entries"),
    (b"0\n1\n1\n", "malformed line"),
    (b"0\n1\n1 5 6\n", "malformed line"),
    (b"0\n1\n 1 5\n", "malformed line"),  # Java's split on \s+ gives an empty first field
    (b"0\n1\none 5\n", "malformed line"),
    (b"0\n1\n1 5_0\n", "malformed line"),  # Python's int() would take it; Java's parseInt does not
    (b"0\n1\n\n", "malformed line"),
    (b"0\n1\n-1 5\n", "invalid leader epoch entry"),
    (b"0\n1\n1 -5\n", "invalid leader epoch entry"),
    (b"0\n1\n2147483648 5\n", "invalid leader epoch entry"),
    (b"0\n1\n\xff 5\n", "not UTF-8"),
])
def test_corrupt_files_are_refused_naming_the_file(data: bytes, match: str) -> None:
    with pytest.raises(CheckpointError, match=match) as e:
        parse_epoch_entries(data, "/data/t-0/leader-epoch-checkpoint")
    assert "/data/t-0/leader-epoch-checkpoint" in str(e.value)


def test_a_corrupt_file_fails_the_cache_with_its_path(path) -> None:
    with open(path, "wb") as f:
        f.write(b"0\n1\n1 x\n")
    with pytest.raises(CheckpointError, match=path):
        LeaderEpochCache(path, "t-0")


@settings(max_examples=150, deadline=None)
@given(st.lists(st.builds(EpochEntry, st.integers(0, 2**31 - 1), st.integers(0, 2**63 - 1)), max_size=30))
def test_round_trip(entries) -> None:
    data = encode_epoch_entries(entries)
    lines = data.decode().split("\n")
    assert lines[:2] == ["0", str(len(entries))] and lines[-1] == ""
    assert all(" " in line and "  " not in line for line in lines[2:-1]), "one space, as Kafka writes"
    assert parse_epoch_entries(data) == entries


# --- Kafka's LeaderEpochFileCacheTest ------------------------------------------------------------

def test_should_add_epoch_and_message_offset_to_cache(cache) -> None:
    cache.assign(2, 10)
    assert cache.latest_epoch == 2
    assert cache.entries == [E(2, 10)]
    assert cache.end_offset_for(2, 11) == (2, 11)


def test_should_return_log_end_offset_if_latest_epoch_requested(cache) -> None:
    cache.assign(2, 11)
    cache.assign(2, 12)
    assert cache.end_offset_for(2, 14) == (2, 14)


def test_should_return_undefined_offset_if_undefined_epoch_requested(cache) -> None:
    cache.assign(2, 11)
    cache.assign(3, 12)
    assert cache.end_offset_for(UNDEFINED_EPOCH, 0) == UNDEFINED


def test_should_not_overwrite_log_end_offset_for_a_leader_epoch_once_it_has_been_assigned(cache) -> None:
    cache.assign(2, 9)
    cache.assign(2, 10)
    assert cache.entries == [E(2, 9)]


def test_should_enforce_monotonically_increasing_start_offsets(cache) -> None:
    cache.assign(2, 9)
    cache.assign(3, 9)
    assert cache.entries == [E(3, 9)]


def test_should_not_overwrite_offset_for_a_leader_epoch_once_it_has_been_assigned(cache) -> None:
    cache.assign(2, 6)
    assert cache.assign(2, 10) is False
    assert cache.entries[0].start_offset == 6


def test_should_return_unsupported_if_no_epoch_recorded(cache) -> None:
    assert cache.end_offset_for(0, 0) == UNDEFINED
    assert cache.end_offset_for(UNDEFINED_EPOCH, 73) == UNDEFINED


def test_should_return_first_epoch_if_requested_epoch_less_than_first_epoch(cache) -> None:
    cache.assign(5, 11)
    cache.assign(6, 12)
    cache.assign(7, 13)
    assert cache.end_offset_for(4, 0) == (4, 11)


def test_should_truncate_if_matching_epoch_but_earlier_starting_offset(cache) -> None:
    cache.assign(5, 11)
    cache.assign(6, 12)
    cache.assign(7, 13)
    cache.assign(7, 12)  # epoch 6 (start 12) and the old epoch 7 entry go
    assert cache.entries == [E(5, 11), E(7, 12)]
    assert cache.end_offset_for(5, 0) == (5, 12)
    assert cache.end_offset_for(6, 0) == (5, 12)


def test_should_get_first_offset_of_subsequent_epoch_when_offset_requested_for_previous_epoch(cache) -> None:
    for epoch, start in [(1, 11), (1, 12), (2, 13), (2, 14), (3, 15), (3, 16)]:
        cache.assign(epoch, start)
    assert cache.end_offset_for(2, 17) == (2, 15)


def test_should_return_next_available_epoch_if_there_is_no_exact_epoch_for_the_one_requested(cache) -> None:
    cache.assign(0, 10)
    cache.assign(2, 13)
    cache.assign(4, 17)
    assert cache.end_offset_for(1, 0) == (0, 13)
    assert cache.end_offset_for(2, 0) == (2, 17)
    assert cache.end_offset_for(3, 0) == (2, 17)


def test_should_not_update_epoch_and_start_offset_if_it_did_not_change(cache) -> None:
    cache.assign(2, 6)
    cache.assign(2, 7)
    assert cache.entries == [E(2, 6)]


def test_should_return_invalid_offset_if_epoch_is_requested_which_is_not_currently_tracked(cache) -> None:
    cache.assign(2, 100)
    assert cache.end_offset_for(3, 100) == UNDEFINED


def test_should_support_epochs_that_do_not_start_from_zero(cache) -> None:
    cache.assign(2, 6)
    assert cache.end_offset_for(2, 7) == (2, 7)
    assert cache.entries == [E(2, 6)]


def test_should_persist_epochs_between_instances(path, cache) -> None:
    cache.assign(2, 6)
    assert LeaderEpochCache(path, "TestTopic-5").entries == [E(2, 6)]
    with open(path, "rb") as f:
        assert f.read() == b"0\n1\n2 6\n"
    assert os.listdir(os.path.dirname(path)) == [LEADER_EPOCH_CHECKPOINT], "no .tmp left behind"


def test_should_enforce_monotonically_increasing_epochs(cache) -> None:
    cache.assign(1, 5)
    cache.assign(2, 6)
    cache.assign(1, 7)
    assert cache.latest_epoch == 1
    assert cache.end_offset_for(1, 8) == (1, 8)
    assert cache.end_offset_for(2, 8) == UNDEFINED
    assert cache.entries == [E(1, 7)]


def test_should_enforce_offsets_increase_monotonically(cache) -> None:
    cache.assign(2, 6)
    cache.assign(3, 5)
    assert cache.entries == [E(3, 5)]


def test_should_increase_and_track_epochs_as_leaders_change_many_times(cache) -> None:
    cache.assign(0, 0)
    cache.assign(1, 0)
    assert cache.latest_epoch == 1
    assert cache.end_offset_for(1, 0) == (1, 0)
    assert cache.end_offset_for(0, 0) == (0, 0)
    assert cache.end_offset_for(1, 5) == (1, 5)
    assert cache.end_offset_for(0, 5) == (0, 0)
    cache.assign(2, 5)
    assert cache.end_offset_for(2, 10) == (2, 10)
    assert cache.end_offset_for(1, 10) == (1, 5)
    assert cache.end_offset_for(0, 10) == (0, 0)


def test_should_increase_and_track_epochs_as_follower_receives_many_messages(cache) -> None:
    for offset in range(9):
        cache.assign(offset // 3, offset)
        leo = offset + 1
        assert cache.end_offset_for(offset // 3, leo) == (offset // 3, leo)
    assert cache.latest_epoch == 2
    assert cache.end_offset_for(0, 9) == (0, 3)
    assert cache.end_offset_for(1, 9) == (1, 6)


def three_epochs(cache) -> None:
    cache.assign(2, 6)
    cache.assign(3, 8)
    cache.assign(4, 11)


@pytest.mark.parametrize("end,expected", [
    (8, [E(2, 6)]),  # shouldDropEntriesOnEpochBoundaryWhenRemovingLatestEntries
    (9, [E(2, 6), E(3, 8)]),  # shouldDropEntriesBetweenEpochBoundaryWhenRemovingNewest
    (UNDEFINED_EPOCH_OFFSET, [E(2, 6), E(3, 8), E(4, 11)]),  # shouldNotResetEpochHistoryTailIfUndefinedPassed
    (12, [E(2, 6), E(3, 8), E(4, 11)]),
    (0, []),
])
def test_truncate_from_end(cache, path, end, expected) -> None:
    three_epochs(cache)
    cache.truncate_from_end(end)
    assert cache.entries == expected
    assert on_disk(path) == expected


@pytest.mark.parametrize("start,expected", [
    (8, [E(3, 8), E(4, 11)]),  # shouldPreserveResetOffsetOnClearEarliestIfOneExists
    (1, [E(2, 6), E(3, 8), E(4, 11)]),  # shouldNotClearAnythingIfOffsetTooEarly
    (6, [E(2, 6), E(3, 8), E(4, 11)]),  # shouldNotClearAnythingIfOffsetIsFirstOffset
    (11, [E(4, 11)]),  # shouldRetainLatestEpochOnClearAllEarliest
    (9, [E(3, 9), E(4, 11)]),  # shouldUpdateOffsetBetweenEpochBoundariesOnClearEarliest
    (15, [E(4, 15)]),  # shouldRetainLatestEpochOnClearAllEarliestAndUpdateItsOffset
    (UNDEFINED_EPOCH_OFFSET, [E(2, 6), E(3, 8), E(4, 11)]),  # shouldNotResetEpochHistoryHeadIfUndefinedPassed
])
def test_truncate_from_start(cache, path, start, expected) -> None:
    three_epochs(cache)
    cache.truncate_from_start(start)
    assert cache.entries == expected
    assert on_disk(path) == expected


def test_should_update_offset_between_first_two_epoch_boundaries_on_clear_earliest(cache) -> None:
    cache.assign(0, 0)
    cache.assign(1, 7)
    cache.assign(2, 10)
    cache.truncate_from_start(5)
    assert cache.entries == [E(0, 5), E(1, 7), E(2, 10)]


def test_should_clear_all_entries(cache, path) -> None:
    three_epochs(cache)
    cache.clear()
    assert cache.entries == [] and cache.latest_entry is None
    assert on_disk(path) == []


def test_empty_cache(cache, path) -> None:
    assert cache.latest_epoch is None and cache.latest_entry is None
    assert cache.end_offset_for(7, 0) == UNDEFINED
    cache.truncate_from_start(7)
    cache.truncate_from_end(7)
    cache.clear()
    assert cache.entries == []
    assert not os.path.exists(path), "nothing changed, nothing written: a single-replica log has no such file"


def test_should_fetch_epoch_for_given_offset(cache) -> None:
    cache.assign(0, 10)
    cache.assign(1, 20)
    cache.assign(5, 30)
    assert cache.epoch_for_offset(25) == 1
    assert cache.epoch_for_offset(20) == 1
    assert cache.epoch_for_offset(30) == 5
    assert cache.epoch_for_offset(50) == 5
    assert cache.epoch_for_offset(5) is None


def test_should_write_checkpoint_on_truncation(cache, path) -> None:
    three_epochs(cache)
    cache.truncate_from_end(11)
    cache.truncate_from_start(8)
    assert on_disk(path) == [E(3, 8)]


def test_negative_entries_are_refused_and_change_nothing(cache, path) -> None:
    cache.assign(1, 5)
    for epoch, start in [(-1, 6), (2, -1)]:
        with pytest.raises(ValueError, match="invalid partition leader epoch entry"):
            cache.assign(epoch, start)
    assert cache.entries == [E(1, 5)] and on_disk(path) == [E(1, 5)]


def test_latest_entry_and_a_file_read_through_the_assign_rule(path) -> None:
    # Kafka's constructor assigns each entry read: a file whose entries do not rise is normalised.
    with open(path, "wb") as f:
        f.write(b"0\n3\n1 0\n3 10\n2 20\n")
    cache = LeaderEpochCache(path, "t-0")
    assert cache.entries == [E(1, 0), E(2, 20)]
    assert cache.latest_entry == E(2, 20)


def test_a_failed_assign_changes_neither_memory_nor_file(cache, path) -> None:
    cache.assign(1, 0)
    os.mkdir(path + ".tmp")  # the atomic write's temporary file cannot be created
    with pytest.raises(OSError):
        cache.assign(2, 10)
    assert cache.entries == [E(1, 0)] and on_disk(path) == [E(1, 0)]
    assert not cache.dirty
    os.rmdir(path + ".tmp")
    assert cache.assign(2, 10) and on_disk(path) == [E(1, 0), E(2, 10)]


def test_a_failed_truncation_write_leaves_the_cache_dirty_until_written(cache, path) -> None:
    three_epochs(cache)
    os.mkdir(path + ".tmp")
    cache.truncate_from_end(9)
    assert cache.entries == [E(2, 6), E(3, 8)], "memory follows the log at once"
    assert cache.dirty and on_disk(path) == [E(2, 6), E(3, 8), E(4, 11)]
    with pytest.raises(OSError):
        cache.flush()
    with pytest.raises(OSError):
        cache.assign_all([])  # what an append does first with a dirty cache
    os.rmdir(path + ".tmp")
    assert cache.assign_all([]) is False  # written, though nothing new was assigned
    assert not cache.dirty and on_disk(path) == [E(2, 6), E(3, 8)]


# --- the state machine against a naive model ---------------------------------------------------

class NaiveEpochs:
    """Kafka's rules written as plainly as possible over a dict epoch -> start offset."""

    def __init__(self) -> None:
        self.epochs: dict[int, int] = {}

    def latest(self) -> int | None:
        return max(self.epochs) if self.epochs else None

    def assign(self, epoch: int, start: int) -> None:
        latest = self.latest()
        if latest == epoch and start >= self.epochs[latest]:
            return
        while self.epochs:
            last = max(self.epochs)
            if last >= epoch or self.epochs[last] >= start:
                del self.epochs[last]
            else:
                break
        self.epochs[epoch] = start

    def truncate_from_end(self, end: int) -> None:
        if end >= 0:
            self.epochs = {e: s for e, s in self.epochs.items() if s < end}

    def truncate_from_start(self, start: int) -> None:
        dropped = [e for e, s in self.epochs.items() if s <= start]
        if dropped:
            for e in dropped:
                del self.epochs[e]
            self.epochs[max(dropped)] = start

    def end_offset_for(self, epoch: int, leo: int) -> tuple[int, int]:
        if epoch == -1 or not self.epochs:
            return UNDEFINED
        if epoch == self.latest():
            return epoch, leo
        higher = [e for e in self.epochs if e > epoch]
        if not higher:
            return UNDEFINED
        lower = [e for e in self.epochs if e <= epoch]
        return (max(lower) if lower else epoch), self.epochs[min(higher)]

    def epoch_for_offset(self, offset: int) -> int | None:
        found = [e for e, s in self.epochs.items() if s <= offset]
        return max(found) if found else None

    def entries(self) -> list[EpochEntry]:
        return [E(e, self.epochs[e]) for e in sorted(self.epochs)]


epochs_st = st.integers(0, 12)
offsets_st = st.integers(0, 60)


class EpochCacheMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.dir = tempfile.mkdtemp()
        self.path = os.path.join(self.dir, LEADER_EPOCH_CHECKPOINT)
        self.cache = LeaderEpochCache(self.path, "model-0")
        self.model = NaiveEpochs()

    def teardown(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)

    @rule(epoch=epochs_st, start=offsets_st)
    def assign(self, epoch, start) -> None:
        before = self.cache.entries
        changed = self.cache.assign(epoch, start)
        self.model.assign(epoch, start)
        assert changed == (self.cache.entries != before)

    @precondition(lambda self: self.model.epochs)
    @rule(start=offsets_st)
    def assign_latest_epoch(self, start) -> None:  # a leader's next batches: the common case
        epoch = self.model.latest()
        self.cache.assign(epoch, start)
        self.model.assign(epoch, start)

    @precondition(lambda self: self.model.epochs)
    @rule(data=st.data())
    def assign_near_existing(self, data) -> None:  # the boundaries: a known epoch or start, give or take one
        epochs = sorted(self.model.epochs)
        starts = sorted(self.model.epochs.values())
        epoch = max(0, data.draw(st.sampled_from(epochs)) + data.draw(st.integers(-1, 1)))
        start = max(0, data.draw(st.sampled_from(starts)) + data.draw(st.integers(-1, 1)))
        self.cache.assign(epoch, start)
        self.model.assign(epoch, start)

    @precondition(lambda self: self.model.epochs)
    @rule(data=st.data())
    def truncate_at_existing_start(self, data) -> None:
        offset = data.draw(st.sampled_from(sorted(self.model.epochs.values()))) + data.draw(st.integers(-1, 1))
        if data.draw(st.booleans()):
            self.cache.truncate_from_end(offset)
            self.model.truncate_from_end(offset)
        else:
            self.cache.truncate_from_start(offset)
            self.model.truncate_from_start(offset)

    @rule(end=st.integers(-1, 60))
    def truncate_from_end(self, end) -> None:
        self.cache.truncate_from_end(end)
        self.model.truncate_from_end(end)

    @rule(start=st.integers(-1, 60))
    def truncate_from_start(self, start) -> None:
        self.cache.truncate_from_start(start)
        self.model.truncate_from_start(start)

    @rule()
    def clear(self) -> None:
        self.cache.clear()
        self.model.epochs = {}

    @rule()
    def reopen(self) -> None:
        self.cache = LeaderEpochCache(self.path, "model-0")

    @rule(epoch=st.integers(-1, 14), leo=st.integers(0, 70), offset=st.integers(0, 70))
    def queries(self, epoch, leo, offset) -> None:
        assert self.cache.end_offset_for(epoch, leo) == self.model.end_offset_for(epoch, leo)
        assert self.cache.epoch_for_offset(offset) == self.model.epoch_for_offset(offset)

    @invariant()
    def agrees_with_the_model_and_the_file(self) -> None:
        entries = self.cache.entries
        assert entries == self.model.entries()
        assert self.cache.latest_epoch == self.model.latest()
        assert all(a.epoch < b.epoch and a.start_offset < b.start_offset for a, b in zip(entries, entries[1:]))
        if os.path.exists(self.path):
            assert on_disk(self.path) == entries
        else:
            assert entries == []


TestEpochCacheMachine = EpochCacheMachine.TestCase
TestEpochCacheMachine.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
