"""Kafka's ProducerStateManager for one partition: idempotent-producer de-duplication and fencing.

Per producer id the log remembers its epoch and the metadata of its last 5 batches
(Kafka's NUM_BATCHES_TO_RETAIN, the client's max.in.flight limit), so that a retry
of any of them is answered with the original offsets instead of being written twice,
and a gap or a zombie epoch is refused before a byte is written. The state survives
restarts as Kafka's `<offset>.snapshot` files (one per segment base offset, plus one
at the log end on close); at open the latest valid snapshot is loaded and the batches
after it are replayed from their headers.

It also knows the transactions (Kafka's ongoingTxns and unreplicatedTxns): each producer's
open transaction from its first transactional batch to its COMMIT/ABORT marker, and the
finished ones whose marker the high watermark has not passed. The earliest first offset of
either is the first unstable offset; the last stable offset stops there (docs/transactions.md).
"""

from __future__ import annotations

import bisect
import logging
import os
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Iterable, Sequence

from .atomic_file import atomic_write, fsync_dir
from .errors import CorruptRecordError, InvalidProducerEpochError, InvalidRecordError, OutOfOrderSequenceError
from .producer_snapshot import NO_TXN, CorruptSnapshotError, ProducerEntry, encode_snapshot, parse_snapshot
from .records import (
    BATCH_OVERHEAD,
    NO_PRODUCER_EPOCH,
    NO_SEQUENCE,
    NO_TIMESTAMP,
    BatchHeader,
    ControlType,
    decode_records,
    parse_control_key,
    parse_end_txn_marker,
)
from .segment import SNAPSHOT_SUFFIX, LogSegment, offset_from_filename
from .transaction_index import AbortedTxn

logger = logging.getLogger(__name__)

NUM_BATCHES_TO_RETAIN = 5
DEFAULT_PRODUCER_ID_EXPIRATION_MS = 86_400_000  # Kafka's broker setting producer.id.expiration.ms
INT32_MAX = 2**31 - 1
_TMP_SUFFIX = SNAPSHOT_SUFFIX + ".tmp"  # atomic_write's leftover after a crash


def _in_sequence(last_seq: int, next_seq: int) -> bool:
    """Kafka's inSequence: the next sequence follows the last, wrapping from Int32 max to 0."""
    return next_seq == last_seq + 1 or (next_seq == 0 and last_seq == INT32_MAX)


def snapshot_name(offset: int) -> str:
    return f"{offset:020d}{SNAPSHOT_SUFFIX}"


@dataclass(frozen=True, slots=True)
class BatchMetadata:
    """One remembered batch: enough to recognise a retry and to answer it with the original offsets."""

    last_seq: int
    last_offset: int
    offset_delta: int
    timestamp: int

    @property
    def first_seq(self) -> int:
        """Kafka's decrementSequence: sequences wrap past Int32 max to 0."""
        return (self.last_seq - self.offset_delta) % (INT32_MAX + 1)

    @property
    def first_offset(self) -> int:
        return self.last_offset - self.offset_delta


@dataclass(slots=True)
class ProducerStateEntry:
    """One producer's state: epoch, last batches (oldest first), open transaction, coordinator epoch."""

    producer_id: int
    epoch: int = NO_PRODUCER_EPOCH
    coordinator_epoch: int = -1
    last_timestamp: int = NO_TIMESTAMP
    current_txn_first_offset: int = NO_TXN
    batches: deque[BatchMetadata] = field(default_factory=lambda: deque(maxlen=NUM_BATCHES_TO_RETAIN))

    @property
    def last_seq(self) -> int:
        return self.batches[-1].last_seq if self.batches else NO_SEQUENCE

    def copy(self) -> "ProducerStateEntry":
        return ProducerStateEntry(self.producer_id, self.epoch, self.coordinator_epoch, self.last_timestamp,
                                  self.current_txn_first_offset, deque(self.batches, maxlen=NUM_BATCHES_TO_RETAIN))

    def update_epoch(self, epoch: int) -> None:
        """A new epoch forgets the old epoch's batches: their sequences no longer identify retries."""
        if epoch != self.epoch:
            self.batches.clear()
            self.epoch = epoch

    def find_duplicate(self, epoch: int, first_seq: int, last_seq: int) -> BatchMetadata | None:
        """The remembered batch with exactly this epoch and sequence range (Kafka's findDuplicateBatch)."""
        if epoch != self.epoch:
            return None
        return next((b for b in self.batches if b.first_seq == first_seq and b.last_seq == last_seq), None)

    def to_snapshot(self) -> ProducerEntry:
        last = self.batches[-1] if self.batches else None
        return ProducerEntry(
            producer_id=self.producer_id,
            producer_epoch=self.epoch,
            last_sequence=last.last_seq if last else NO_SEQUENCE,
            last_offset=last.last_offset if last else -1,
            offset_delta=last.offset_delta if last else 0,
            timestamp=self.last_timestamp,
            coordinator_epoch=self.coordinator_epoch,
            current_txn_first_offset=self.current_txn_first_offset,
        )

    @classmethod
    def from_snapshot(cls, e: ProducerEntry) -> "ProducerStateEntry":
        """A snapshot keeps only the last batch; a negative last offset means none (markers only)."""
        entry = cls(e.producer_id, e.producer_epoch, e.coordinator_epoch, e.timestamp, e.current_txn_first_offset)
        if e.last_offset >= 0:
            entry.batches.append(BatchMetadata(e.last_sequence, e.last_offset, e.offset_delta, e.timestamp))
        return entry


@dataclass(frozen=True, slots=True)
class ProducerBatch:
    """What producer state needs of one batch, at its final offsets and timestamp."""

    producer_id: int
    epoch: int
    base_sequence: int
    last_sequence: int
    first_offset: int
    last_offset: int
    max_timestamp: int
    is_transactional: bool
    is_control: bool
    coordinator_epoch: int = -1  # of an end-transaction marker
    is_abort: bool = False  # an ABORT marker (else COMMIT, for a control batch)

    @classmethod
    def of(cls, h: BatchHeader, first_offset: int, max_timestamp: int, batch: bytes | memoryview,
           where: str) -> "ProducerBatch | None":
        """The batch as producer state sees it; None for what does not touch it (no producer, empty or
        non-transaction control batches). Only a control batch's one small record is decoded."""
        if h.producer_id < 0:
            return None
        coordinator_epoch = -1
        control = None
        if h.is_control:
            records = decode_records(h, memoryview(batch)[BATCH_OVERHEAD:], where) if h.records_count else []
            control = parse_control_key(records[0].key) if records else None
            if control not in (ControlType.ABORT, ControlType.COMMIT):
                return None
            coordinator_epoch = parse_end_txn_marker(records[0].value)
        return cls(h.producer_id, h.producer_epoch, h.base_sequence, h.last_sequence, first_offset,
                   first_offset + h.last_offset_delta, max_timestamp, h.is_transactional, h.is_control,
                   coordinator_epoch, control is ControlType.ABORT)


@dataclass(frozen=True, slots=True)
class CompletedTxn:
    """A transaction its marker ended (Kafka's CompletedTxn), with the last stable offset at that point.

    Only a transaction with data completes: a marker of a producer with no open transaction changes
    neither the last stable offset nor the `.txnindex`, as in Kafka.
    """

    producer_id: int
    first_offset: int
    last_offset: int  # the marker's offset
    is_abort: bool
    last_stable_offset: int  # Kafka's lastStableOffset(completedTxn): the earliest other open transaction's first

    def aborted_txn(self) -> AbortedTxn:
        return AbortedTxn(self.producer_id, self.first_offset, self.last_offset, self.last_stable_offset)


@dataclass(frozen=True, slots=True)
class ProducerUpdate:
    """The outcome of checking an append: updated entries to apply after the write, and the retried batches."""

    entries: dict[int, ProducerStateEntry]
    duplicates: list[BatchMetadata]
    completed: list[CompletedTxn] = field(default_factory=list)  # in marker order


class ProducerStateManager:
    """Producer id -> state for one partition log, with its `.snapshot` files; the caller holds the log's lock."""

    def __init__(self, directory: str, where: str, *,
                 producer_id_expiration_ms: int = DEFAULT_PRODUCER_ID_EXPIRATION_MS) -> None:
        self.dir = directory
        self.where = where
        self.producer_id_expiration_ms = producer_id_expiration_ms
        self.producers: dict[int, ProducerStateEntry] = {}
        self._ongoing: dict[int, int] = {}  # producer id -> first offset of its open transaction
        # (first offset, marker offset) of finished transactions the high watermark has not passed, in marker order
        self._unreplicated: deque[tuple[int, int]] = deque()
        self._snapshots: list[int] = []  # offsets of the snapshot files, ascending
        self._last_snap_offset = 0  # Kafka's lastSnapOffset: a snapshot is written only past it

    # -- queries ---------------------------------------------------------------------------------

    def last_entry(self, producer_id: int) -> ProducerStateEntry | None:
        return self.producers.get(producer_id)

    def first_unstable_offset(self, high_watermark: int) -> int | None:
        """First offset of the earliest transaction that is open or whose marker is not below `high_watermark`
        (Kafka's firstUnstableOffset after onHighWatermarkUpdated); None when there is none."""
        while self._unreplicated and self._unreplicated[0][1] < high_watermark:
            self._unreplicated.popleft()
        if not self._ongoing and not self._unreplicated:  # no transaction: every fetch of every partition asks
            return None
        return min([*self._ongoing.values(), *(first for first, _ in self._unreplicated)], default=None)

    @property
    def ongoing_transactions(self) -> dict[int, int]:
        """Producer id -> first offset of its open transaction."""
        return dict(self._ongoing)

    # -- append ----------------------------------------------------------------------------------

    def prepare(self, batches: Sequence[ProducerBatch], *, validate: bool) -> ProducerUpdate:
        """Check a set of batches against the state (nothing changes until `apply`).

        `validate` is False for a follower's append, which Kafka replays unchecked (origin
        REPLICATION). A leader checks idempotent batches fully (origin CLIENT): retries of
        the last 5 batches are reported as duplicates, stale epochs and sequence gaps raise.
        Transactional batches and markers get only the epoch check, as Kafka's coordinators'
        appends do: Shale has no transaction coordinator, so clients cannot open transactions
        (InitProducerId refuses transactional ids) and only coordinators write such batches.
        """
        pending: dict[int, ProducerStateEntry] = {}
        duplicates: list[BatchMetadata] = []
        completed: list[CompletedTxn] = []
        ongoing = dict(self._ongoing)  # as each batch leaves it: a marker's last stable offset is taken there
        for b in batches:
            pid = b.producer_id
            current = self.producers.get(pid)
            idempotent = validate and not (b.is_transactional or b.is_control)
            if idempotent and current is not None:
                # Against the state before this append, as Kafka does: a retry of an earlier batch of the same set
                # is a sequence error, not a duplicate.
                dup = current.find_duplicate(b.epoch, b.base_sequence, b.last_sequence)
                if dup is not None:
                    duplicates.append(dup)
                    continue
            entry = pending.get(pid)
            if entry is None:
                entry = pending[pid] = current.copy() if current is not None else ProducerStateEntry(pid)
            if validate and b.epoch < entry.epoch:
                raise InvalidProducerEpochError(
                    f"epoch of producer {pid} at offset {b.first_offset} in {self.where} is {b.epoch} (sequence "
                    f"{b.base_sequence}), which is smaller than the last seen epoch {entry.epoch} (last sequence "
                    f"{entry.last_seq})"
                )
            if idempotent:
                self._check_sequence(entry, b)
            done = self._add(entry, b, ongoing)
            if done is not None:
                completed.append(done)
        return ProducerUpdate(pending, duplicates, completed)

    def _check_sequence(self, entry: ProducerStateEntry, b: ProducerBatch) -> None:
        """Kafka's checkSequence, for a producer that the log may or may not know."""
        at = f"producer {b.producer_id} at offset {b.first_offset} in {self.where}"
        if b.base_sequence < 0:
            # Kafka's LogValidator: an idempotent client batch must carry a sequence.
            raise InvalidRecordError(f"invalid sequence number {b.base_sequence} in a record batch of {at}")
        if b.epoch != entry.epoch:
            if b.base_sequence != 0 and entry.epoch != NO_PRODUCER_EPOCH:
                raise OutOfOrderSequenceError(
                    f"invalid sequence number for new epoch of {at}: {b.epoch} (request epoch), "
                    f"{b.base_sequence} (seq. number), {entry.epoch} (current producer epoch)"
                )
        # A producer the log does not know (new, expired, or its batches deleted by retention) may start at any
        # sequence (KIP-360, Kafka 2.5+); a known one must continue where it left off.
        elif entry.epoch != NO_PRODUCER_EPOCH and not _in_sequence(entry.last_seq, b.base_sequence):
            raise OutOfOrderSequenceError(
                f"out of order sequence number for {at}, epoch {b.epoch}: {b.base_sequence} (incoming seq. number), "
                f"{entry.last_seq} (current end sequence number)"
            )

    @staticmethod
    def _add(entry: ProducerStateEntry, b: ProducerBatch, ongoing: dict[int, int]) -> CompletedTxn | None:
        """Apply one batch to an entry and to `ongoing` (producer id -> open transaction's first offset)."""
        entry.update_epoch(b.epoch)
        entry.last_timestamp = b.max_timestamp
        if b.is_control:  # an end-transaction marker closes the producer's transaction
            first = entry.current_txn_first_offset
            entry.current_txn_first_offset = NO_TXN
            entry.coordinator_epoch = b.coordinator_epoch
            if first == NO_TXN:
                return None
            ongoing.pop(b.producer_id, None)
            # Kafka's lastStableOffset(completedTxn), taken batch by batch (as its recovery does; a follower's
            # multi-batch append then indexes what the leader indexed).
            return CompletedTxn(b.producer_id, first, b.last_offset, b.is_abort,
                                min(ongoing.values(), default=b.last_offset + 1))
        entry.batches.append(BatchMetadata(b.last_sequence, b.last_offset, b.last_offset - b.first_offset,
                                           b.max_timestamp))
        if b.is_transactional and entry.current_txn_first_offset == NO_TXN:
            entry.current_txn_first_offset = b.first_offset
            ongoing[b.producer_id] = b.first_offset
        return None

    def apply(self, update: ProducerUpdate) -> None:
        """Make a checked append's state current, once its bytes are in the log."""
        for entry in update.entries.values():
            self._put(entry)
        self._unreplicated.extend((c.first_offset, c.last_offset) for c in update.completed)

    def _put(self, entry: ProducerStateEntry) -> None:
        self.producers[entry.producer_id] = entry
        if entry.current_txn_first_offset != NO_TXN:
            self._ongoing[entry.producer_id] = entry.current_txn_first_offset
        else:
            self._ongoing.pop(entry.producer_id, None)

    def remove_expired_producers(self, now_ms: int) -> int:
        """Forget producers idle for `producer.id.expiration.ms` with no open transaction; return how many."""
        expired = [pid for pid, e in self.producers.items() if self._is_expired(e, now_ms)]
        for pid in expired:
            del self.producers[pid]
        return len(expired)

    def _is_expired(self, e: ProducerStateEntry, now_ms: int) -> bool:
        return e.current_txn_first_offset == NO_TXN and now_ms - e.last_timestamp >= self.producer_id_expiration_ms

    # -- loading ---------------------------------------------------------------------------------

    def load(self, segments: Sequence[LogSegment], *, log_start_offset: int, log_end_offset: int, now_ms: int,
             had_clean_shutdown: bool) -> None:
        """Build the state at log open (Kafka's removeStraySnapshots + rebuildProducerState).

        Snapshots that match no segment are deleted (except the largest one past the last segment base,
        written at close), then the latest valid one at or below the log end is loaded and the batches after
        it replayed. A clean shutdown without any snapshot means there was no producer state to save (one is
        written whenever there is), so the replay is skipped, as Kafka does on upgrade.
        """
        for name in os.listdir(self.dir):
            if name.endswith(_TMP_SUFFIX):
                os.unlink(os.path.join(self.dir, name))
        self._snapshots = self._list_snapshots()
        self._remove_stray_snapshots({s.base_offset for s in segments})
        if not self._snapshots and had_clean_shutdown:
            self._reset(log_end_offset)
            return
        self.reload(segments, log_start_offset=log_start_offset, log_end_offset=log_end_offset, now_ms=now_ms)

    def replay_transactions(self, segments: Sequence[LogSegment], *, log_start_offset: int, log_end_offset: int,
                            now_ms: int, replay_from: int, on_completed: Callable[[CompletedTxn], None]) -> None:
        """Report every transaction completing in [replay_from, log end), from a scratch state rebuilt from the
        latest snapshot at or below `replay_from` (Kafka recovers a segment with a producer state of its own, built
        to the segment's base): the `.txnindex` of recovered segments is rebuilt from these. This manager's
        state is untouched; a snapshot found corrupt on the way is gone for both."""
        scratch = ProducerStateManager(self.dir, self.where, producer_id_expiration_ms=self.producer_id_expiration_ms)
        scratch._snapshots = list(self._snapshots)
        scratch.reload(segments, log_start_offset=log_start_offset, log_end_offset=log_end_offset, now_ms=now_ms,
                       replay_from=replay_from,
                       on_completed=lambda txn: on_completed(txn) if txn.last_offset >= replay_from else None)
        self._snapshots = scratch._snapshots

    def reload(self, segments: Sequence[LogSegment], *, log_start_offset: int, log_end_offset: int,
               now_ms: int, replay_from: int | None = None,
               on_completed: Callable[[CompletedTxn], None] | None = None) -> None:
        """Rebuild the state of [log start, log end) from the latest usable snapshot (at or below `replay_from`
        when given) and the batches after it."""
        self.delete_snapshots([o for o in self._snapshots if o > log_end_offset or o < log_start_offset])
        self._reset(log_start_offset)
        start = log_start_offset
        while usable := [o for o in self._snapshots if replay_from is None or o <= replay_from]:
            offset = usable[-1]
            path = os.path.join(self.dir, snapshot_name(offset))
            try:
                with open(path, "rb") as f:
                    entries = parse_snapshot(f.read(), path)
            except CorruptSnapshotError as e:
                logger.warning("%s: failed to load producer snapshot: %s; deleting it", self.where, e)
                self.delete_snapshots([offset])
                continue
            for entry in map(ProducerStateEntry.from_snapshot, entries):
                if not self._is_expired(entry, now_ms):
                    self._put(entry)
            start = self._last_snap_offset = offset
            break
        if start < log_end_offset:
            self._replay(segments, max(start, log_start_offset), log_end_offset, on_completed)

    def _replay(self, segments: Sequence[LogSegment], start: int, end: int,
                on_completed: Callable[[CompletedTxn], None] | None) -> None:
        """Apply the batches in [start, end) unchecked, from their headers (Kafka's loadProducersFromRecords)."""
        first = max(0, bisect.bisect_right([s.base_offset for s in segments], start) - 1)
        for seg in segments[first:]:
            if seg.base_offset >= end:
                break
            found = seg.translate_offset(start) if start > seg.base_offset else None
            for bp in seg.batches(found.position if found else 0):
                h = bp.header
                if h.base_offset >= end:
                    break
                if h.producer_id < 0 or h.last_offset < start:
                    continue
                data = seg.read_bytes(bp.position, bp.size) if h.is_control else b""
                try:
                    b = ProducerBatch.of(h, h.base_offset, h.max_timestamp, data, seg.where)
                except CorruptRecordError as e:
                    logger.warning("%s: ignoring an unreadable control batch while loading producer state: %s",
                                   self.where, e)
                    continue
                if b is not None:
                    entry = self.producers.get(b.producer_id) or ProducerStateEntry(b.producer_id)
                    done = self._add(entry, b, self._ongoing)
                    self._put(entry)
                    if done is not None:
                        self._unreplicated.append((done.first_offset, done.last_offset))
                        if on_completed is not None:
                            on_completed(done)

    def _reset(self, offset: int) -> None:
        self.producers.clear()
        self._ongoing.clear()
        self._unreplicated.clear()
        self._last_snap_offset = offset

    def truncate_to(self, segments: Sequence[LogSegment], *, log_start_offset: int, log_end_offset: int,
                    now_ms: int) -> None:
        """Forget what the log lost above its new end (Kafka's truncateAndReload).

        The replay is skipped only when no producer state was ever saved and none is held (a log of plain
        batches: nothing to forget). Producers that expired still count when a snapshot exists: the cut may
        remove the marker of a transaction of theirs, which is then open again.
        """
        if self.producers or self._snapshots:
            self.reload(segments, log_start_offset=log_start_offset, log_end_offset=log_end_offset, now_ms=now_ms)
        else:
            self._last_snap_offset = min(self._last_snap_offset, log_end_offset)
            self._unreplicated = deque(t for t in self._unreplicated if t[1] < log_end_offset)

    def truncate_fully_and_start_at(self, offset: int) -> None:
        """An empty log at `offset`: no producers, no snapshots."""
        self.delete_snapshots(self._snapshots)
        self._reset(offset)

    # -- snapshot files --------------------------------------------------------------------------

    @property
    def snapshot_offsets(self) -> list[int]:
        """Offsets of the snapshot files, ascending: where a rebuild of the state can start."""
        return list(self._snapshots)

    def take_snapshot(self, offset: int) -> None:
        """Write the state as `<offset>.snapshot` (the state of every offset below `offset`).

        As in Kafka, only past the last snapshot. Unlike Kafka, no empty snapshot is written while none
        exists, so a log that never saw a producer id has no snapshot files (see `load`).
        """
        if offset <= self._last_snap_offset or not (self.producers or self._snapshots):
            return
        entries = [e.to_snapshot() for e in self.producers.values()]
        atomic_write(os.path.join(self.dir, snapshot_name(offset)), encode_snapshot(entries))
        self._snapshots = sorted({*self._snapshots, offset})
        self._last_snap_offset = offset

    def delete_snapshots(self, offsets: Iterable[int]) -> None:
        """Delete these snapshot files (durably: a snapshot that came back after a truncation would lie)."""
        doomed = set(offsets) & set(self._snapshots)
        if not doomed:
            return
        for offset in doomed:
            try:
                os.unlink(os.path.join(self.dir, snapshot_name(offset)))
            except FileNotFoundError:
                pass
        self._snapshots = [o for o in self._snapshots if o not in doomed]
        fsync_dir(self.dir)

    def delete_snapshots_below(self, offset: int) -> None:
        self.delete_snapshots([o for o in self._snapshots if o < offset])

    def _list_snapshots(self) -> list[int]:
        return sorted(offset_from_filename(n) for n in os.listdir(self.dir)
                      if n.endswith(SNAPSHOT_SUFFIX) and n[:20].isdigit())

    def _remove_stray_snapshots(self, segment_bases: set[int]) -> None:
        """Kafka's removeStraySnapshots: keep snapshots at segment bases and the largest one past the last base."""
        strays = [o for o in self._snapshots if o not in segment_bases]
        if strays and (not segment_bases or strays[-1] > max(segment_bases)):
            strays.pop()
        self.delete_snapshots(strays)
