"""One followed partition: where its fetch stands, and what a leader's answer does to its log.

Kafka's ReplicaFetcherThread.processPartitionData and AbstractFetcherThread's per-partition handling, without
the sockets: `replica_fetcher.py` sends the Fetch and ListOffsets requests and hands each partition's answer
here. The log is changed only here and only in three ways — append the leader's batches as they are, cut
(`truncation.py` decides where), raise the high watermark and the log start to the leader's — so a follower's
log is always a prefix of its leader's log plus, at most, a tail that the next answer cuts.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from shale.sidecar.log.checkpoint import TopicPartition
from shale.sidecar.log.errors import CorruptRecordError
from shale.sidecar.log.log import Log
from shale.sidecar.log.records import BATCH_OVERHEAD, BatchHeader
from shale.sidecar.replication.records import NodeRegistration
from shale.sidecar.replication.truncation import (
    EpochEndOffset,
    fetch_start,
    out_of_range_reset,
    truncation_for,
)

logger = logging.getLogger(__name__)


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

    def ready(self, now: float) -> bool:
        return now >= self.delayed_until

    def describe(self) -> str:
        return f"{self.tp} (leader {self.leader.node_id} epoch {self.leader_epoch}, fetch offset {self.fetch_offset})"


def start_following(tp: TopicPartition, log: Log, leader: NodeRegistration, leader_epoch: int) -> FollowState:
    """A new fetch state (Kafka's InitialFetchState): a log with epochs fetches from its end and lets the
    leader's DivergingEpoch cut it; one without is cut to its high watermark first."""
    with log.lock:
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
    logger.info("%s: leader's log diverges at epoch %d end offset %d (ours: epoch %d end offset %d); truncating "
                "from %d to %d%s", state.describe(), leader.epoch, leader.end_offset, follower.epoch,
                follower.end_offset, log.log_end_offset, cut.offset, "" if cut.completed else ", then asking again")
    log.truncate_to(cut.offset)
    return cut.offset


def apply_reset(state: FollowState, log: Log, leader_end_offset: int, leader_start_offset: int) -> None:
    """After OFFSET_OUT_OF_RANGE: go on where the leader's log start and end say (`out_of_range_reset`)."""
    with log.lock:
        reset = out_of_range_reset(log.log_end_offset, leader_end_offset, leader_start_offset)
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
