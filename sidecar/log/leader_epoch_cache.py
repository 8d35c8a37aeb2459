"""Kafka's leader-epoch cache (LeaderEpochFileCache): the first offset each leader epoch wrote.

A replica answers "where does epoch E end?" from it (OffsetForLeaderEpoch, a Fetch's
`DivergingEpoch`), so that a follower which rejoins truncates exactly where its log stops agreeing
with the leader's, never below the high watermark. The entries are kept in
`<partition dir>/leader-epoch-checkpoint` (format in `checkpoint.py`).

Entries rise strictly in both epoch and start offset. The rules are pure functions over a tuple of
entries; `LeaderEpochCache` holds the current tuple (readers take it without a lock, writers
replace it whole) and its file. A new entry reaches the file before the batch it describes reaches
the log (Kafka's synchronous flush in `assign`), so the file never misses an epoch the log holds;
truncations are written at once too, and if that write fails the cache is `dirty` and the log
writes it again before its next append.
"""

from __future__ import annotations

import logging
import threading
from typing import Callable, Iterable

from .append_state import EpochCacheAppendState
from .atomic_file import atomic_write
from .checkpoint import EpochEntry, encode_epoch_entries, parse_epoch_entries
from .records import BatchHeader

logger = logging.getLogger(__name__)

UNDEFINED_EPOCH = -1  # Kafka's OffsetsForLeaderEpochResponse.UNDEFINED_EPOCH
UNDEFINED_EPOCH_OFFSET = -1  # ... and UNDEFINED_EPOCH_OFFSET

Entries = tuple[EpochEntry, ...]

__all__ = ["BatchEpochs", "EpochEntry", "LeaderEpochCache", "UNDEFINED_EPOCH", "UNDEFINED_EPOCH_OFFSET", "assigned",
           "recovered", "truncated_from_end", "truncated_from_start"]


def assigned(entries: Entries, epoch: int, start_offset: int) -> Entries | None:
    """Kafka's assign rule; None when nothing changes.

    Negative values are refused. The latest epoch again at or after its start changes nothing (an
    epoch's start is never moved up). Otherwise every tail entry with an epoch >= `epoch` or a start
    >= `start_offset` goes before the new entry is appended, so both columns keep rising.
    """
    if epoch < 0 or start_offset < 0:
        raise ValueError(f"invalid partition leader epoch entry: epoch {epoch}, start offset {start_offset}")
    if entries and entries[-1].epoch == epoch and start_offset >= entries[-1].start_offset:
        return None
    keep = len(entries)
    while keep and (entries[keep - 1].epoch >= epoch or entries[keep - 1].start_offset >= start_offset):
        keep -= 1
    return (*entries[:keep], EpochEntry(epoch, start_offset))


def truncated_from_end(entries: Entries, end_offset: int) -> Entries:
    """Drop the entries starting at or after `end_offset` (a negative offset, Kafka's undefined, drops none)."""
    if end_offset < 0:
        return entries
    keep = len(entries)
    while keep and entries[keep - 1].start_offset >= end_offset:
        keep -= 1
    return entries[:keep]


def truncated_from_start(entries: Entries, start_offset: int) -> Entries:
    """Drop the entries starting at or before `start_offset`; the last dropped epoch is kept, starting there.

    Exclusive, as Kafka's truncateFromStart: an entry starting exactly at `start_offset` stays as it is.
    """
    dropped = 0
    while dropped < len(entries) and entries[dropped].start_offset <= start_offset:
        dropped += 1
    if not dropped:
        return entries
    return (EpochEntry(entries[dropped - 1].epoch, start_offset), *entries[dropped:])


class BatchEpochs:
    """Collects, from batch headers in log order, each set partition leader epoch above all before it.

    That is all `recovered` needs of the batches (Kafka's LogSegment.recover rule), so a walk of
    millions of batches keeps a handful of entries.
    """

    def __init__(self) -> None:
        self.entries: list[EpochEntry] = []

    def __call__(self, header: BatchHeader) -> None:
        epoch = header.partition_leader_epoch
        if epoch >= 0 and (not self.entries or epoch > self.entries[-1].epoch):
            self.entries.append(EpochEntry(epoch, header.base_offset))


def recovered(entries: Entries, from_offset: int, batch_epochs: Iterable[EpochEntry]) -> Entries:
    """The entries rebuilt from the batches at and after `from_offset` (their `BatchEpochs`).

    Entries starting at or after `from_offset` are dropped and each batch epoch above the latest one
    adds an entry at its base offset: the batches, not a checkpoint written before a crash, say which
    epochs the recovered part of the log holds.
    """
    entries = truncated_from_end(entries, from_offset)
    for e in batch_epochs:
        if not entries or e.epoch > entries[-1].epoch:
            entries = (*entries, e)
    return entries


class LeaderEpochCache(EpochCacheAppendState):
    """One partition's leader epochs, in memory and in its `leader-epoch-checkpoint`.

    `entries` None reads the file (missing: empty; unparseable: `CheckpointError` naming it), each
    entry going through the assign rule as in Kafka's constructor. Callers other than `Log.append`
    that assign (a new leader's `assign(E, LEO)`) hold the log's lock, so that the log end offset
    they read is still the end when the entry is made.
    """

    def __init__(self, path: str, where: str, entries: Iterable[EpochEntry] | None = None) -> None:
        self.path = path
        self.where = where
        self._lock = threading.Lock()
        self.dirty = False  # the file differs from memory: a write failed and must succeed before the next append
        if entries is None:
            entries = self._read()
        current: Entries = ()
        for e in entries:
            current = assigned(current, e.epoch, e.start_offset) or current
        self._entries = current

    def _read(self) -> list[EpochEntry]:
        try:
            with open(self.path, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            return []
        return parse_epoch_entries(data, self.path)

    # -- reads ------------------------------------------------------------------------------------

    @property
    def entries(self) -> list[EpochEntry]:
        return list(self._entries)

    @property
    def latest_entry(self) -> EpochEntry | None:
        entries = self._entries
        return entries[-1] if entries else None

    @property
    def latest_epoch(self) -> int | None:
        entries = self._entries
        return entries[-1].epoch if entries else None

    def end_offset_for(self, epoch: int, log_end_offset: int) -> tuple[int, int]:
        """Kafka's endOffsetFor: (the largest epoch <= `epoch`, where it ends); (-1, -1) when undefined.

        The latest epoch ends at the log end. An epoch below every known one answers itself and the
        first known start (the data before it is gone; the follower truncates to there). An epoch
        above every known one is undefined.
        """
        entries = self._entries
        if epoch == UNDEFINED_EPOCH or not entries:
            return UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET
        if entries[-1].epoch == epoch:
            return epoch, log_end_offset
        higher = next((i for i, e in enumerate(entries) if e.epoch > epoch), None)
        if higher is None:
            return UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET
        if higher == 0:
            return epoch, entries[0].start_offset
        return entries[higher - 1].epoch, entries[higher].start_offset

    def epoch_for_offset(self, offset: int) -> int | None:
        """The epoch that wrote `offset`: that of the last entry starting at or before it; None before the first."""
        found = None
        for e in self._entries:
            if e.start_offset > offset:
                break
            found = e.epoch
        return found

    # -- changes ----------------------------------------------------------------------------------

    def assign(self, epoch: int, start_offset: int) -> bool:
        """Record that `epoch` starts at `start_offset` (Kafka's rule, `assigned`); True if the entries changed.

        The file is written before memory changes: if the write fails (OSError), nothing changed.
        """
        return self.assign_all([EpochEntry(epoch, start_offset)])

    def assign_all(self, new: Iterable[EpochEntry]) -> bool:
        """`assign` each entry in turn, with one write of the file; a dirty file is written even without a change."""
        with self._lock:
            entries = self._entries
            for e in new:
                entries = assigned(entries, e.epoch, e.start_offset) or entries
            changed = entries != self._entries
            if not changed and not self.dirty:
                return False
            if changed:
                removed = [e for e in self._entries if e not in entries]
                if len(removed) > 1 or (removed and removed[0].start_offset != entries[-1].start_offset):
                    logger.warning("%s: new leader epoch entry %s truncated the conflicting entries %s in %s",
                                   self.where, entries[-1], removed, self.path)
            atomic_write(self.path, encode_epoch_entries(entries))
            self._entries = entries
            self.dirty = False
            return changed

    def truncate_from_end(self, end_offset: int) -> None:
        """Drop the entries starting at or after `end_offset` (the log was truncated there)."""
        self._replace(lambda entries: truncated_from_end(entries, end_offset), f"truncation to {end_offset}")

    def truncate_from_start(self, start_offset: int) -> None:
        """The log now starts at `start_offset`: earlier entries go, the epoch holding it starts there."""
        self._replace(lambda entries: truncated_from_start(entries, start_offset),
                      f"log start offset {start_offset}")

    def clear(self) -> None:
        """Forget every epoch (the log was emptied)."""
        self._replace(lambda entries: (), "clear")

    def replace(self, entries: Entries, reason: str) -> None:
        """Set the entries (already in rule order), e.g. rebuilt when the log is loaded."""
        self._replace(lambda _: tuple(entries), reason)

    def flush(self) -> None:
        """Write the file if an earlier write failed; OSError if it fails again."""
        with self._lock:
            if self.dirty:
                atomic_write(self.path, encode_epoch_entries(self._entries))
                self.dirty = False

    def _replace(self, change: Callable[[Entries], Entries], reason: str) -> None:
        """Change memory at once and write the file; a failed write leaves the cache dirty (Kafka flushes these later)."""
        with self._lock:
            entries = change(self._entries)
            if entries == self._entries and not self.dirty:
                return
            self._entries = entries
            try:
                atomic_write(self.path, encode_epoch_entries(entries))
                self.dirty = False
            except OSError as e:
                self.dirty = True
                logger.warning("%s: cannot write %s after %s (%s); it is written again before the next append",
                               self.where, self.path, reason, e)

    def __repr__(self) -> str:
        return f"LeaderEpochCache({self.where}, {[(e.epoch, e.start_offset) for e in self._entries]})"
