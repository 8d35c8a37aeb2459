"""A replica's log reduced to what truncation depends on: the leader epoch of each offset, and its epoch cache.

One record per offset; a record is identified by (offset, epoch), since one leader writes an epoch and never
rewrites an offset in it. The epoch cache follows Kafka's LeaderEpochFileCache rules (assign, end_offset_for,
truncate_from_end), written naively here as the test oracle. `leader_answer` is Kafka's leader-side check of a
follower fetch (Partition.fetchRecords: DivergingEpoch / OFFSET_OUT_OF_RANGE / records), and `follower_round`
drives one follower fetch through `shale.sidecar.replication.truncation`, the code under test.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from shale.sidecar.replication.truncation import (
    UNDEFINED,
    EpochEndOffset,
    out_of_range_reset,
    truncation_for,
)


@dataclass
class EpochLog:
    epochs: list[int] = field(default_factory=list)  # epochs[o] = leader epoch of the record at offset o
    cache: list[tuple[int, int]] = field(default_factory=list)  # (epoch, start offset), Kafka's order
    start: int = 0  # log start offset (records below it are gone; `epochs` keeps placeholders)

    @property
    def end(self) -> int:
        return len(self.epochs)

    @property
    def latest_epoch(self) -> int | None:
        return self.cache[-1][0] if self.cache else None

    def assign(self, epoch: int, start: int) -> None:
        if self.cache and self.cache[-1][0] == epoch and start >= self.cache[-1][1]:
            return
        self.cache = [(e, s) for e, s in self.cache if e < epoch and s < start]
        self.cache.append((epoch, start))

    def append(self, epochs: list[int]) -> None:
        for epoch in epochs:
            self.assign(epoch, len(self.epochs))
            self.epochs.append(epoch)

    def truncate_to(self, offset: int) -> None:
        """Kafka's UnifiedLog.truncateTo: the cache is cut even when no record is, since an epoch this replica
        assigned as leader at its end, with nothing appended in it, conflicts with the new leader's log."""
        offset = min(offset, self.end)
        del self.epochs[offset:]
        self.cache = [(e, s) for e, s in self.cache if s < offset]

    def start_at(self, offset: int) -> None:
        self.epochs = [-1] * offset
        self.cache = []
        self.start = offset

    def end_offset_for(self, epoch: int) -> EpochEndOffset:
        if epoch < 0 or not self.cache:
            return UNDEFINED
        if epoch == self.cache[-1][0]:
            return EpochEndOffset(epoch, self.end)
        higher = [(e, s) for e, s in self.cache if e > epoch]
        if not higher:
            return UNDEFINED
        floor = [(e, s) for e, s in self.cache if e <= epoch]
        return EpochEndOffset(floor[-1][0] if floor else epoch, higher[0][1])


@dataclass(frozen=True)
class Diverging:
    epoch: int
    end_offset: int


@dataclass(frozen=True)
class Records:
    epochs: list[int]
    high_watermark: int


OUT_OF_RANGE = "OFFSET_OUT_OF_RANGE"


def leader_answer(leader: EpochLog, fetch_offset: int, last_fetched_epoch: int | None, max_records: int,
                  high_watermark: int = 0) -> Diverging | Records | str:
    """Kafka's leader: validate the follower's position by its last fetched epoch, else read from it."""
    if last_fetched_epoch is not None:
        answer = leader.end_offset_for(last_fetched_epoch)
        if answer.undefined or answer.epoch < 0 or fetch_offset < leader.start:
            return OUT_OF_RANGE
        if answer.epoch < last_fetched_epoch or answer.end_offset < fetch_offset:
            return Diverging(answer.epoch, answer.end_offset)
    if not leader.start <= fetch_offset <= leader.end:
        return OUT_OF_RANGE
    return Records(leader.epochs[fetch_offset : fetch_offset + max_records], high_watermark)


def common_prefix(a: EpochLog, b: EpochLog) -> int:
    n = 0
    for x, y in zip(a.epochs, b.epochs):
        if x != y:
            break
        n += 1
    return n


def follower_round(follower: EpochLog, leader: EpochLog, max_records: int = 1) -> str:
    """One fetch of `follower` from `leader`, applied as the fetcher applies it; returns what happened."""
    answer = leader_answer(leader, follower.end, follower.latest_epoch, max_records)
    if isinstance(answer, Diverging):
        cut = truncation_for(EpochEndOffset(answer.epoch, answer.end_offset),
                             follower.end_offset_for(answer.epoch), follower.end, follower.end)
        follower.truncate_to(cut.offset)
        return "truncated"
    if answer == OUT_OF_RANGE:
        reset = out_of_range_reset(follower.end, leader.end, leader.start)
        if reset.truncate_to is not None:
            follower.truncate_to(reset.truncate_to)
        if reset.start_at is not None:
            follower.start_at(reset.start_at)
        return "reset"
    follower.append(answer.epochs)
    return "appended" if answer.epochs else "idle"


def catch_up(follower: EpochLog, leader: EpochLog, max_records: int = 1, rounds: int = 200) -> list[str]:
    """Fetch until the follower has the leader's whole log and nothing else; the steps taken."""
    steps = []
    for _ in range(rounds):
        step = follower_round(follower, leader, max_records)
        steps.append(step)
        if step == "idle":
            return steps
    raise AssertionError(f"no convergence in {rounds} rounds: follower {follower}, leader {leader}")
