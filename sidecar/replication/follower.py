"""One followed partition: where its fetch stands, and what a leader's answer does to its log.

Kafka's ReplicaFetcherThread.processPartitionData and AbstractFetcherThread's per-partition handling, without
the sockets: `replica_fetcher.py` sends the Fetch and ListOffsets requests and hands each partition's answer
here. The log is changed only here and only in three ways — append the leader's batches as they are, cut
(`truncation.py` decides where), raise the high watermark and the log start to the leader's — so a follower's
log is always a prefix of its leader's log plus, at most, a tail that the next answer cuts.

One exception guards data from before replication: records without a leader epoch (written by a single node
before it had a store) cannot be compared with a leader's history, so they are never cut. A follower holding
them checks first that the leader has unreplicated records up to the same offset (the same history, copied);
otherwise, and whenever a cut would reach them, it refuses to follow and keeps them (`UnreplicatedRecordsKept`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from ..log.errors import CorruptRecordError, LogError
from ..log.log import Log
from ..log.records import BATCH_OVERHEAD, BatchHeader
from ..log.topic_partition import TopicPartition
from .store_records import NodeRegistration
from .truncation import (
    EpochEndOffset,
    fetch_start,
    out_of_range_reset,
    truncation_for,
)

logger = logging.getLogger(__name__)


class UnreplicatedRecordsKept(LogError):
    """Following the leader would cut (or contradict) records written before replication: the replica keeps
    them and stops following until an operator decides (docs/replication.md, "Failures")."""


def unreplicated_end(log: Log) -> int:
    """Where the log's records without a leader epoch end: the first epoch's start, or the log end if it has
    none. Records in [log start, this) were written before replication (or copied from such a log)."""
    entries = log.leader_epoch_cache.entries
    return entries[0].start_offset if entries else log.log_end_offset


def holds_unreplicated(log: Log) -> bool:
    """The log holds records without a leader epoch (`NodeRegistration.unreplicated` lists such partitions)."""
    with log.lock:
        return unreplicated_end(log) > log.log_start_offset


@dataclass(slots=True)
class FollowState:
    """Whom a partition fetches from, in which leader epoch, from which offset; replaced whole on a new leader
    or epoch, so an answer to a fetch made under the old state is recognised as stale and dropped."""

    tp: TopicPartition
    leader: NodeRegistration
    leader_epoch: int
    fetch_offset: int
    last_fetched_epoch: int | None
    needs_reset: bool = False  # after OFFSET_OUT_OF_RANGE: the leader's log start and end decide where to go on
    delayed_until: float = 0.0  # loop time before which the partition is not fetched (replica.fetch.backoff.ms)
    lag: int | None = None  # leader's high watermark minus our log end, at the last answer
    error: str | None = None  # the last error, until a fetch succeeds (for /status)
    verify_below: int | None = None  # our unreplicated records end here: the first answer must show the leader's do
    refused: str | None = None  # why this replica will not follow this leader (never fetched again)

    def ready(self, now: float) -> bool:
        return self.refused is None and now >= self.delayed_until

    def describe(self) -> str:
        return f"{self.tp} (leader {self.leader.node_id} epoch {self.leader_epoch}, fetch offset {self.fetch_offset})"


def start_following(tp: TopicPartition, log: Log, leader: NodeRegistration, leader_epoch: int) -> FollowState:
    """A new fetch state (Kafka's InitialFetchState): a log with epochs fetches from its end and lets the
    leader's DivergingEpoch cut it; one without is cut to its high watermark first — unless its records have
    no epoch at all (written before replication): then nothing is cut, and the first fetch asks for the offset
    just below their end, whose batch at the leader must be unreplicated too (`_check_unreplicated`)."""
    with log.lock:
        kept = unreplicated_end(log)
        if log.latest_epoch is None and kept > log.log_start_offset:
            logger.info("%s: records %d-%d have no leader epoch (written before replication); checking that node "
                        "%d in epoch %d holds the same unreplicated records before following it", tp,
                        log.log_start_offset, kept - 1, leader.node_id, leader_epoch)
            return FollowState(tp, leader, leader_epoch, kept - 1, None, verify_below=kept)
        start = fetch_start(log.latest_epoch, log.log_end_offset, log.high_watermark)
        if start.truncate_to is not None and start.truncate_to < log.log_end_offset:
            logger.warning("%s: no leader epoch in the log; truncating from %d to the high watermark %d before "
                           "following node %d in epoch %d", tp, log.log_end_offset, start.truncate_to,
                           leader.node_id, leader_epoch)
            log.truncate_to(start.truncate_to)
        return FollowState(tp, leader, leader_epoch, log.log_end_offset, log.latest_epoch)


def whole_batches(records: bytes | memoryview, where: str) -> list[tuple[int, BatchHeader]]:
    """(position, header) of each complete batch at the start of a fetched record set. A leader cuts its
    answer at `partition_max_bytes`, so the last batch may be partial; it is fetched again whole next time."""
    view = memoryview(records)
    out: list[tuple[int, BatchHeader]] = []
    pos = 0
    while len(view) - pos >= BATCH_OVERHEAD:
        header = BatchHeader.parse(view, pos)
        if header.size < BATCH_OVERHEAD:
            raise CorruptRecordError(f"fetched batch at byte {pos} declares {header.size} bytes, less than a batch "
                                     f"header ({where})")
        if pos + header.size > len(view):
            break
        out.append((pos, header))
        pos += header.size
    return out


@dataclass(frozen=True, slots=True)
class Applied:
    """What one answer did: bytes and batches appended, or where the log was cut to (None: no cut)."""

    appended_bytes: int = 0
    appended_batches: int = 0
    truncated_to: int | None = None


def apply_fetched(state: FollowState, log: Log, data: Any, max_append_bytes: int) -> Applied:
    """Apply one partition of a Fetch answer with error NONE (`data`: the response's partition entry).

    Records are appended unchanged (`assign_offsets=False`: the log takes each batch's offsets and epoch from
    its header), in pieces of at most `max_append_bytes` and never more than `segment.bytes`, so that no piece
    is refused as larger than a segment. Then the high watermark follows the leader's (never past our end) and
    so does the log start; a DivergingEpoch cuts the log by Kafka's table. The state moves to the log's new end
    and epoch even when a piece is refused (a corrupt batch, a full disk): the pieces before it stay appended.
    """
    appended = batches = 0
    truncated: int | None = None
    with log.lock:
        try:
            if state.verify_below is not None:
                _check_unreplicated(state, log, data.records)
            if data.records:
                appended, batches = _append(state, log, data.records, max_append_bytes)
            diverging = data.diverging_epoch
            if diverging is not None and diverging.epoch >= 0:
                truncated = _truncate_diverging(state, log, EpochEndOffset(diverging.epoch, diverging.end_offset))
            if data.high_watermark >= 0:
                log.update_high_watermark(min(data.high_watermark, log.log_end_offset))
                state.lag = max(0, data.high_watermark - log.log_end_offset)
            if log.log_start_offset < data.log_start_offset <= log.high_watermark:
                log.increment_log_start_offset(data.log_start_offset)
            state.error = None
        finally:
            state.fetch_offset = log.log_end_offset
            state.last_fetched_epoch = log.latest_epoch
    return Applied(appended, batches, truncated)


def _append(state: FollowState, log: Log, records: bytes | memoryview, max_append_bytes: int) -> tuple[int, int]:
    view = memoryview(records)
    batches = whole_batches(view, state.describe())
    # Batches wholly below our end are already here (a leader reads from the batch holding the offset).
    while batches and batches[0][1].last_offset < log.log_end_offset:
        batches.pop(0)
    if not batches:
        return 0, 0
    first = batches[0][1]
    if first.base_offset < log.log_end_offset:
        # Our end falls inside one of the leader's batches: our tail was written by another leader in other
        # batches, so it is not the leader's; cut to where the leader's batch starts and take it whole.
        _check_cut(state, log, first.base_offset, f"the leader's batch {first.base_offset}-{first.last_offset} "
                   f"spans our log end {log.log_end_offset}")
        logger.warning("%s: log end %d is inside the leader's batch %d-%d; truncating to %d", state.describe(),
                       log.log_end_offset, first.base_offset, first.last_offset, first.base_offset)
        log.truncate_to(first.base_offset)
    limit = min(max_append_bytes, log.config.segment_bytes)
    total = 0
    start = end = batches[0][0]
    for pos, header in batches:
        if end > start and end + header.size - start > limit:
            log.append(view[start:end], assign_offsets=False)
            start = end
        end = pos + header.size
        total += header.size
    log.append(view[start:end], assign_offsets=False)
    return total, len(batches)


def _truncate_diverging(state: FollowState, log: Log, leader: EpochEndOffset) -> int:
    follower = EpochEndOffset(*log.end_offset_for_epoch(leader.epoch))
    cut = truncation_for(leader, follower, log.log_end_offset, state.fetch_offset)
    _check_cut(state, log, cut.offset, f"the leader's log diverges at epoch {leader.epoch} end offset "
               f"{leader.end_offset}")
    logger.info("%s: leader's log diverges at epoch %d end offset %d (ours: epoch %d end offset %d); truncating "
                "from %d to %d%s", state.describe(), leader.epoch, leader.end_offset, follower.epoch,
                follower.end_offset, log.log_end_offset, cut.offset, "" if cut.completed else ", then asking again")
    log.truncate_to(cut.offset)
    return cut.offset


def apply_reset(state: FollowState, log: Log, leader_end_offset: int, leader_start_offset: int) -> None:
    """After OFFSET_OUT_OF_RANGE: go on where the leader's log start and end say (`out_of_range_reset`)."""
    with log.lock:
        reset = out_of_range_reset(log.log_end_offset, leader_end_offset, leader_start_offset)
        if reset.truncate_to is not None or reset.start_at is not None:
            _check_cut(state, log, log.log_start_offset if reset.truncate_to is None else reset.truncate_to,
                       f"the leader's log is {leader_start_offset}-{leader_end_offset}")
        logger.warning("%s: out of range on the leader (its log %d-%d, ours ends at %d); %s", state.describe(),
                       leader_start_offset, leader_end_offset, log.log_end_offset,
                       f"truncating to {reset.truncate_to}" if reset.truncate_to is not None else
                       f"starting an empty log at {reset.start_at}" if reset.start_at is not None else
                       "fetching on from our end")
        if reset.truncate_to is not None:
            log.truncate_to(reset.truncate_to)
        if reset.start_at is not None:
            log.truncate_fully_and_start_at(reset.start_at)
        state.fetch_offset = log.log_end_offset
        state.last_fetched_epoch = log.latest_epoch
        state.needs_reset = False
        state.lag = max(0, leader_end_offset - log.log_end_offset)


def _check_unreplicated(state: FollowState, log: Log, records: bytes | memoryview | None) -> None:
    """The first answer to a replica holding unreplicated records below `verify_below`: the leader's batch
    holding the offset just below must be our last such batch, byte for byte (same offsets, same CRC) — the
    same history, of which this replica holds a copy or the origin. Anything else means the leader's records at
    those offsets are other records, and following it would cut or contradict ours. (Header epochs prove
    nothing here: a single node kept whatever partition leader epoch its producers wrote.)"""
    below = state.verify_below
    assert below is not None
    theirs = BatchHeader.parse(memoryview(records)) if records and len(records) >= BATCH_OVERHEAD else None
    slice_ = log.read(below - 1, BATCH_OVERHEAD)
    ours = BatchHeader.parse(slice_.read()) if slice_ is not None else None
    if theirs is None:
        why = f"the leader has no record at offset {below - 1}"
    elif ours is None or (theirs.base_offset, theirs.last_offset, theirs.crc) != (
            ours.base_offset, ours.last_offset, ours.crc):
        why = (f"the leader's batch {theirs.base_offset}-{theirs.last_offset} (crc {theirs.crc:#010x}) is not ours "
               f"{ours.base_offset}-{ours.last_offset} (crc {ours.crc:#010x})" if ours else "no local batch")
    else:
        state.verify_below = None
        logger.info("%s: the leader holds the same records up to offset %d; following it", state.describe(), below)
        return
    raise UnreplicatedRecordsKept(_kept(state, log, why))


def _check_cut(state: FollowState, log: Log, offset: int, why: str) -> None:
    """Refuse a cut that would remove records without a leader epoch (see the module's docstring)."""
    end = unreplicated_end(log)
    if offset < end and end > log.log_start_offset:
        raise UnreplicatedRecordsKept(_kept(state, log, f"{why}: following would truncate to offset {offset}"))


def _kept(state: FollowState, log: Log, why: str) -> str:
    return (f"{state.tp}: keeps its records {log.log_start_offset}-{unreplicated_end(log) - 1} written before "
            f"replication (no leader epoch; log end {log.log_end_offset}) and will not follow node "
            f"{state.leader.node_id} in leader epoch {state.leader_epoch}: {why}. It waits for an operator: to keep "
            f"these records, stop the other replicas, remove their copies of {state.tp} and its record in the store "
            f"(this node is then named leader); to take the leader's, move this partition's directory away")
