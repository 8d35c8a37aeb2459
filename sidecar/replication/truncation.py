"""Where a follower cuts its log so that it agrees with its leader's: Kafka's AbstractFetcherThread rules, pure.

A follower fetches with `LastFetchedEpoch` (the epoch of its last local batch). When the leader's log does not
agree, it answers a `DivergingEpoch` (E, O) instead of records: E is the leader's largest epoch <= the
follower's, O where that epoch ends in the leader's log. The follower then looks its own end of E up and cuts
by the table below (spec §2.3, `AbstractFetcherThread.getOffsetTruncationState`); a cut that is not final is
refined by the next fetch, which carries the new, older `LastFetchedEpoch`. OFFSET_OUT_OF_RANGE has its own
reset (`out_of_range_reset`, `AbstractFetcherThread.fetchOffsetAndApplyTruncateAndBuild`).

Everything here is a function of numbers: the fetcher (`replica_fetcher.py`) reads them from the log and acts.
"""

from __future__ import annotations

from dataclasses import dataclass

UNDEFINED_EPOCH = -1
UNDEFINED_EPOCH_OFFSET = -1


@dataclass(frozen=True, slots=True)
class EpochEndOffset:
    """A leader epoch and the offset where it ends in some log (Kafka's EpochEndOffset / OffsetAndEpoch)."""

    epoch: int
    end_offset: int

    @property
    def undefined(self) -> bool:
        return self.end_offset == UNDEFINED_EPOCH_OFFSET


UNDEFINED = EpochEndOffset(UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET)


@dataclass(frozen=True, slots=True)
class TruncationState:
    """Cut the log to `offset` and fetch from there; `completed` False means another round may cut further."""

    offset: int
    completed: bool


def truncation_for(leader: EpochEndOffset, follower: EpochEndOffset, log_end_offset: int,
                   fetch_offset: int) -> TruncationState:
    """Kafka's table: `leader` is the leader's answer (DivergingEpoch or OffsetForLeaderEpoch); `follower` is
    this replica's own answer for `leader.epoch` (its largest epoch <= it and that epoch's end, `UNDEFINED` if
    it has none — `LeaderEpochCache.end_offset_for`); `fetch_offset` is the offset the fetch was made at.

    The cut never passes the local log end: a follower only ever removes data, never invents it.
    """
    if leader.undefined:
        # The leader knows no epoch <= ours (its log starts later): the fetch position is all we can trust.
        return TruncationState(fetch_offset, True)
    if leader.epoch == UNDEFINED_EPOCH:
        # An answer without an epoch (OffsetForLeaderEpoch v0): the leader's offset bounds the log.
        return TruncationState(min(leader.end_offset, log_end_offset), True)
    if follower.undefined:
        # We tracked no epoch <= the leader's: the leader's offset is where the logs can still agree.
        return TruncationState(min(leader.end_offset, log_end_offset), True)
    if follower.epoch != leader.epoch:
        # Our largest epoch <= E is older than E: cut to its end and ask again with that epoch.
        return TruncationState(min(follower.end_offset, log_end_offset), False)
    return TruncationState(min(follower.end_offset, leader.end_offset, log_end_offset), True)


@dataclass(frozen=True, slots=True)
class FetchStart:
    """Where a replica that starts following begins: `truncate_to` first when set, then fetch at `offset`."""

    offset: int
    truncate_to: int | None


def fetch_start(latest_epoch: int | None, log_end_offset: int, high_watermark: int) -> FetchStart:
    """Kafka's `ReplicaManager.initialFetchOffset`: with epochs in the log, fetch from its end and let the
    leader's DivergingEpoch say what to cut; a log without any epoch cannot be checked against the leader, so it
    is cut to its high watermark (the part known committed) and fetched from there."""
    if latest_epoch is not None:
        return FetchStart(log_end_offset, None)
    return FetchStart(high_watermark, high_watermark)


@dataclass(frozen=True, slots=True)
class OutOfRangeReset:
    """What a follower does after OFFSET_OUT_OF_RANGE: cut to `truncate_to`, or drop everything and start an
    empty log at `start_at` (at most one of the two), then fetch from `fetch_offset`."""

    fetch_offset: int
    truncate_to: int | None = None
    start_at: int | None = None


def out_of_range_reset(log_end_offset: int, leader_end_offset: int, leader_start_offset: int) -> OutOfRangeReset:
    """Kafka's reset (`fetchOffsetAndApplyTruncateAndBuild`): a leader whose log ends below ours (an unclean
    election made a shorter log the truth) → cut to its end; a leader whose log starts above our end (retention
    removed what we lack) → drop our log and start at the leader's start; otherwise fetch on from our end."""
    if leader_end_offset < log_end_offset:
        return OutOfRangeReset(leader_end_offset, truncate_to=leader_end_offset)
    if leader_start_offset > log_end_offset:
        return OutOfRangeReset(leader_start_offset, start_at=leader_start_offset)
    return OutOfRangeReset(log_end_offset)
