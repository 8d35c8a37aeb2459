"""One compaction pass over one log: Kafka's Cleaner (`doClean`), in two passes.

Pass 1 reads the dirty section `[first dirty, first uncleanable)` and records each
key's latest offset in the `OffsetMap` (stopping early when the map is full: a
partial clean). Pass 2 recopies every segment from the log start to the map's
end, group by group (`group_segments_by_size`), into `.cleaned` segments that
replace the originals crash-safely (`Log.replace_segments`). A record survives if
it is its key's latest, or beyond the map, or a tombstone still inside its delete
horizon; aborted transactional data goes at once; markers and tombstones need one
pass to get a horizon and a later one to go.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field
from typing import Callable

from . import cleaner_kernel
from .errors import CorruptRecordError, LogError
from .file_records import BatchPosition
from .offset_map import INLINE_MAX, OffsetMap
from .records import (
    BATCH_OVERHEAD,
    NO_TIMESTAMP,
    BatchHeader,
    ControlType,
    check_batch,
    decode_records,
    encode_batch,
    parse_control_key,
)
from .segment import LogSegment
from .transaction_index import AbortedTxn, TransactionIndex
from .txn_scan import TxnScan, scan

logger = logging.getLogger(__name__)

INT32_MAX = 2**31 - 1
CHUNK_BYTES = 256 * 1024  # Kafka's default per-thread read buffer: retained output is appended per chunk


class CleaningAbortedError(LogError):
    """Cleaning of a partition was aborted (pause, truncation, deletion) while in progress."""


@dataclass
class CleanerStats:
    """Counters of one pass, for Kafka's cleaner log line and the metrics."""

    start_s: float = field(default_factory=time.monotonic)
    map_done_s: float = 0.0
    end_s: float = 0.0
    bytes_read: int = 0
    bytes_written: int = 0
    map_bytes_read: int = 0
    map_messages_read: int = 0
    messages_read: int = 0
    messages_written: int = 0
    invalid_messages: int = 0
    buffer_utilization: float = 0.0

    @property
    def elapsed_s(self) -> float:
        return max(self.end_s - self.start_s, 1e-9)

    @property
    def map_elapsed_s(self) -> float:
        return max(self.map_done_s - self.start_s, 1e-9)

    @property
    def clean_elapsed_s(self) -> float:
        return max(self.end_s - self.map_done_s, 1e-9)

    def summary(self, thread: int, log_name: str, first_dirty: int, end_offset: int) -> str:
        """Kafka's `recordStats` message, figure for figure."""
        mb = 1024.0 * 1024.0
        reduction = 100.0 * (1.0 - self.bytes_written / self.bytes_read) if self.bytes_read else 0.0
        fewer = 100.0 * (1.0 - self.messages_written / self.messages_read) if self.messages_read else 0.0
        lines = [
            f"Log cleaner thread {thread} cleaned log {log_name} (dirty section = [{first_dirty}, {end_offset}])",
            f"{(self.bytes_read) / mb:,.1f} MB of log processed in {self.elapsed_s:,.1f} seconds "
            f"({self.bytes_read / mb / self.elapsed_s:,.1f} MB/sec).",
            f"Indexed {self.map_bytes_read / mb:,.1f} MB in {self.map_elapsed_s:.1f} seconds "
            f"({self.map_bytes_read / mb / self.map_elapsed_s:,.1f} Mb/sec, {100 * self.map_elapsed_s / self.elapsed_s:.1f}% of total time)",
            f"Buffer utilization: {100 * self.buffer_utilization:.1f}%",
            f"Cleaned {self.bytes_read / mb:,.1f} MB in {self.clean_elapsed_s:.1f} seconds "
            f"({self.bytes_read / mb / self.clean_elapsed_s:,.1f} Mb/sec, {100 * self.clean_elapsed_s / self.elapsed_s:.1f}% of total time)",
            f"Start size: {self.bytes_read / mb:,.1f} MB ({self.messages_read:,} messages)",
            f"End size: {self.bytes_written / mb:,.1f} MB ({self.messages_written:,} messages)",
            f"{reduction:.1f}% size reduction ({fewer:.1f}% fewer messages)",
        ]
        return "\n\t".join(lines)


@dataclass(frozen=True)
class LogToClean:
    """A log's cleanable range and the figures the cleaner manager ranks logs by."""

    log: object  # shale.sidecar.log.log.Log
    first_dirty_offset: int
    first_uncleanable_offset: int
    clean_bytes: int
    cleanable_bytes: int
    max_compaction_delay_ms: int = 0

    @property
    def total_bytes(self) -> int:
        return self.clean_bytes + self.cleanable_bytes

    @property
    def cleanable_ratio(self) -> float:
        return self.cleanable_bytes / self.total_bytes if self.total_bytes else 0.0


def segments_in_range(segments: list[LogSegment], start: int, end: int) -> list[LogSegment]:
    """Kafka's `logSegments(from, to)`: from the floor segment of `start`, up to segments with base >= `end`."""
    first = 0
    for i, seg in enumerate(segments):
        if seg.base_offset <= start:
            first = i
    return [s for s in segments[first:] if s.base_offset < end]


def group_segments_by_size(segments: list[LogSegment], max_size: int, max_index_size: int,
                           first_uncleanable_offset: int) -> list[list[LogSegment]]:
    """Kafka's greedy grouping: each group fits one segment's size, its index sizes and an int32 offset span."""
    groups: list[list[LogSegment]] = []
    rest = list(segments)
    while rest:
        group = [rest.pop(0)]
        log_size = group[0].size
        index_size = group[0].offset_index.size_bytes
        time_size = group[0].time_index.size_bytes
        while rest:
            nxt = rest[0]
            last_offset_after = (rest[1].base_offset - 1) if len(rest) > 1 else first_uncleanable_offset - 1
            if (log_size + nxt.size <= max_size
                    and index_size + nxt.offset_index.size_bytes <= max_index_size
                    and time_size + nxt.time_index.size_bytes <= max_index_size
                    and (nxt.size == 0 or last_offset_after - group[0].base_offset <= INT32_MAX)):
                group.append(rest.pop(0))
                log_size += nxt.size
                index_size += nxt.offset_index.size_bytes
                time_size += nxt.time_index.size_bytes
            else:
                break
        groups.append(group)
    return groups


def _appends_for(size: int) -> int:
    """The most chunk appends the retained part of `size` source bytes can take (one more for recompression)."""
    return size // CHUNK_BYTES + 2


@dataclass
class _Destination:
    """The `.cleaned` segment of a group, and whether its index entries are still kept tight.

    Tight entries (a batch due one is appended alone) can outnumber the one-per-append entries of
    chunks. Both indexes are sized for the group (Kafka's grouping sums its segments' index sizes),
    so a batch is appended alone only while they keep room for every entry the group's remaining
    chunk appends could still need; past that (a tiny `segment.index.bytes`), appends are whole chunks
    again, whose entries may be loose but never overfill an index.
    """

    segment: LogSegment
    tight: bool = True

    def room(self) -> int:
        """Entries both indexes can still take (the time index keeps its last slot for the roll)."""
        seg = self.segment
        return min(seg.offset_index.max_entries - seg.offset_index.entries,
                   seg.time_index.max_entries - 1 - seg.time_index.entries)


class _TxnMetadata:
    """Kafka's CleanedTransactionMetadata: which transactional batches and markers a pass may discard."""

    def __init__(self, aborted: list[AbortedTxn]) -> None:
        self._pending = sorted(aborted, key=lambda t: t.first_offset)
        self._ongoing_aborted: dict[int, tuple[AbortedTxn, bool]] = {}  # pid -> txn, a batch of it seen this pass
        self._ongoing_committed: set[int] = set()
        # The `.txnindex` of the segment being written: an abort whose marker stays keeps its entry there.
        self.cleaned_index: TransactionIndex | None = None

    def _consume_up_to(self, offset: int) -> None:
        while self._pending and self._pending[0].first_offset <= offset:
            txn = self._pending.pop(0)
            self._ongoing_aborted.setdefault(txn.producer_id, (txn, False))

    def on_control_batch(self, h: BatchHeader, control: ControlType | None) -> bool:
        """True if the marker may be discarded (its transaction's data is gone)."""
        self._consume_up_to(h.last_offset)
        if control is None:
            return True  # an emptied control batch
        pid = h.producer_id
        if control is ControlType.ABORT:
            txn, seen = self._ongoing_aborted.pop(pid, (None, False))
            if seen and txn is not None and self.cleaned_index is not None:
                self.cleaned_index.append(txn)  # the marker stays for a later pass: so does its entry
            return not seen
        if control is ControlType.COMMIT:
            if pid in self._ongoing_committed:
                self._ongoing_committed.discard(pid)
                return False
            return True
        return False

    def on_data_batch(self, h: BatchHeader) -> bool:
        """True if the batch is data of an aborted transaction."""
        self._consume_up_to(h.last_offset)
        if not h.is_transactional:
            return False
        ongoing = self._ongoing_aborted.get(h.producer_id)
        if ongoing is not None:
            self._ongoing_aborted[h.producer_id] = (ongoing[0], True)
            return True
        self._ongoing_committed.add(h.producer_id)
        return False


def _control_type(seg: LogSegment, b: BatchPosition, raw: bytes) -> ControlType | None:
    records = decode_records(b.header, memoryview(raw)[BATCH_OVERHEAD:], seg.where)
    return parse_control_key(records[0].key) if records else None


KeyReader = Callable[[int], bytes | None]


class Cleaner:
    """Runs compaction passes with one offset map (one per cleaner thread, as in Kafka)."""

    def __init__(self, offset_map: OffsetMap, *, clock: Callable[[], int],
                 check_aborted: Callable[[object], None] = lambda log: None,
                 throttle: Callable[[int], None] = lambda n: None,
                 producer_expiration_ms: int = 86_400_000) -> None:
        self.map = offset_map
        self.clock = clock
        self.check_aborted = check_aborted
        self.throttle = throttle
        self.producer_expiration_ms = producer_expiration_ms

    # -- the pass --------------------------------------------------------------------------------

    def clean(self, cleanable: LogToClean) -> tuple[int, CleanerStats]:
        """Clean `[log start, end offset)`; return the end offset (the next first dirty offset) and stats."""
        log = cleanable.log
        stats = CleanerStats()
        now = self.clock()
        with log.lock:
            segments = list(log.segments)
        txns = scan(segments)
        logger.info("Building offset map for %s...", log.name)
        self.build_offset_map(log, segments, cleanable.first_dirty_offset, cleanable.first_uncleanable_offset,
                              txns, stats)
        end_offset = self.map.latest_offset + 1
        stats.map_done_s = time.monotonic()
        stats.buffer_utilization = self.map.utilization
        delete_horizon = now + log.config.delete_retention_ms
        logger.info("Cleaning log %s (cleaning prior to %d, discarding tombstones prior to upper bound deletion horizon %d)...",
                    log.name, end_offset, delete_horizon)
        producers = txns.last_batches_of_active_producers(now, self.producer_expiration_ms)
        txn_meta = _TxnMetadata(txns.aborted)
        for group in group_segments_by_size(segments_in_range(segments, 0, end_offset), log.config.segment_bytes,
                                            log.config.segment_index_bytes, cleanable.first_uncleanable_offset):
            self.clean_segments(log, group, now, stats, txn_meta, producers, cleanable.first_uncleanable_offset)
        stats.end_s = time.monotonic()
        return end_offset, stats

    # -- pass 1 ----------------------------------------------------------------------------------

    def build_offset_map(self, log, segments: list[LogSegment], start: int, end: int, txns: TxnScan,
                         stats: CleanerStats) -> None:
        """Fill the map from the dirty section; stop when it is full (a partial clean)."""
        self.map.clear(start)
        dirty = segments_in_range(segments, start, end)
        txn_meta = _TxnMetadata(txns.aborted)
        for i, seg in enumerate(dirty):
            self.check_aborted(log)
            next_base = dirty[i + 1].base_offset if i + 1 < len(dirty) else end
            if self._map_segment(seg, start, min(next_base, end), txn_meta, stats):
                logger.debug("Offset map for %s is full, cleaning a partial section", log.name)
                return

    def _map_segment(self, seg: LogSegment, start: int, next_offset: int, txn_meta: _TxnMetadata,
                     stats: CleanerStats) -> bool:
        position = seg.offset_index.lookup(start)[1]
        for b in seg.batches(position):
            h = b.header
            if h.base_offset >= next_offset:
                break
            raw = seg.read_bytes(b.position, b.size)
            self.throttle(b.size)
            stats.map_bytes_read += b.size
            if h.is_control:
                txn_meta.on_control_batch(h, _control_type(seg, b, raw) if h.records_count else None)
            elif not txn_meta.on_data_batch(h):
                read, full = cleaner_kernel.map_records(self.map, h, memoryview(raw)[BATCH_OVERHEAD:], start,
                                                        next_offset, seg.where)
                stats.map_messages_read += read
                if full:
                    return True
            if h.last_offset >= start:
                self.map.update_latest_offset(min(h.last_offset, next_offset - 1))
        self.map.update_latest_offset(next_offset - 1)
        return False

    # -- pass 2 ----------------------------------------------------------------------------------

    def clean_segments(self, log, group: list[LogSegment], now: int, stats: CleanerStats, txn_meta: _TxnMetadata,
                       producers: dict[int, int], upper_bound: int) -> None:
        """Recopy a group into one `.cleaned` segment and swap it in for the group."""
        cleaned = log.create_cleaned_segment(group[0].base_offset)
        txn_meta.cleaned_index = cleaned.txn_index
        try:
            key_at = _KeyReader(log, self.map.base_offset, self.map.latest_offset)
            dest = _Destination(cleaned)
            for i, seg in enumerate(group):
                self.check_aborted(log)
                later = sum(_appends_for(s.size) for s in group[i + 1:])
                self._clean_into(log, seg, dest, later, now, stats, txn_meta, producers, upper_bound, key_at)
            cleaned.on_become_inactive()
            cleaned.flush()
            mtime = os.stat(group[-1].log_path).st_mtime
            os.utime(cleaned.log_path, (mtime, mtime))
            logger.info("Swapping in cleaned segment %s for segment(s) %s in log %s", cleaned.base_offset,
                        [s.base_offset for s in group], log.name)
            log.replace_segments([cleaned], group)
        except BaseException:
            cleaned.delete_files()
            raise

    def _clean_into(self, log, seg: LogSegment, dest: "_Destination", later_appends: int, now: int,
                    stats: CleanerStats, txn_meta: _TxnMetadata, producers: dict[int, int], upper_bound: int,
                    key_at: "_KeyReader") -> None:
        """Recopy `seg`'s retained batches into `dest`, in appends of up to a chunk.

        An append gets at most one index entry, mapping its *last* offset to its *first* batch's position:
        for a chunk of many batches that entry is loose, which Kafka's DumpLogSegments reports as a
        mismatch (Kafka's own cleaner wrote such entries until KAFKA-806 made LogSegment.append index
        batch by batch). So a batch that is due an index entry starts an append of its own: every entry
        then maps a batch's last offset to that batch's position, as often as `index.interval.bytes` says
        — while the indexes have room for it (`_Destination`); `later_appends` bounds the appends that
        the group's later segments may need.
        """
        out: list[bytes] = []
        out_size = 0
        max_ts, max_ts_offset, max_offset = NO_TIMESTAMP, -1, -1
        target = dest.segment

        def flush() -> None:
            nonlocal out, out_size, max_ts, max_ts_offset
            if out:
                target.append(max_offset, max_ts, max_ts_offset, b"".join(out))
                self.throttle(out_size)
                out, out_size, max_ts, max_ts_offset = [], 0, NO_TIMESTAMP, -1

        delete_horizon = now + log.config.delete_retention_ms
        read_to = 0
        for b in seg.batches():
            h = b.header
            read_to = b.end
            raw = seg.read_bytes(b.position, b.size)
            self.throttle(b.size)
            stats.bytes_read += b.size
            check_batch(raw, f"{log.name}, segment {seg.base_offset}, position {b.position}")
            kept = self._retained_batch(h, raw, seg, b, now, delete_horizon, stats, txn_meta, producers,
                                        upper_bound, key_at)
            if kept is None:
                continue
            stats.bytes_written += len(kept)
            kh = BatchHeader.parse(kept)
            stats.messages_written += kh.records_count
            index_due = target.bytes_since_last_index_entry + out_size > target.index_interval_bytes
            if index_due and dest.tight:
                dest.tight = dest.room() > later_appends + _appends_for(seg.size - b.end)
            index_due = index_due and dest.tight
            if index_due:
                flush()  # the pending batches end before this one; their append is due no entry
            out.append(kept)
            out_size += len(kept)
            if kh.max_timestamp > max_ts:
                max_ts, max_ts_offset = kh.max_timestamp, kh.last_offset
            max_offset = kh.last_offset
            if index_due or out_size >= CHUNK_BYTES:
                flush()
        flush()
        if read_to != seg.size:
            # The header walk stops quietly at a batch that runs past the end (recovery's truncation point);
            # here that is corruption, as Kafka's growBuffersOrFail says, never the end of the data to keep.
            raise CorruptRecordError(
                f"Log segment may be corrupt: the batches of {seg.log_path} end at byte {read_to} of {seg.size} "
                f"({log.name})"
            )

    def _retained_batch(self, h: BatchHeader, raw: bytes, seg: LogSegment, b: BatchPosition, now: int,
                        delete_horizon: int, stats: CleanerStats, txn_meta: _TxnMetadata,
                        producers: dict[int, int], upper_bound: int, key_at: "_KeyReader") -> bytes | None:
        """The bytes to keep of one batch (the original, a rebuilt one, or an empty header), or None."""
        body = memoryview(raw)[BATCH_OVERHEAD:]
        if h.is_control:
            records = decode_records(h, body, seg.where)
            control = parse_control_key(records[0].key) if records else None
            can_discard = txn_meta.on_control_batch(h, control)
            discard_records = can_discard and h.delete_horizon_ms is not None and h.delete_horizon_ms <= now
        else:
            can_discard = txn_meta.on_data_batch(h)
            discard_records = can_discard
        is_last_of_producer = h.producer_id >= 0 and producers.get(h.producer_id) == h.last_offset
        retain_empty = is_last_of_producer or h.next_offset == upper_bound
        marker_for_empty_txn = can_discard and h.is_control
        kept = cleaner_kernel.retain_records(self.map, h, body, now, key_at, seg.where, discard=discard_records,
                                             marker=marker_for_empty_txn, delete_horizon=delete_horizon)
        stats.messages_read += kept.records
        stats.invalid_messages += kept.invalid
        if discard_records and not retain_empty:
            return None
        if kept.kept == kept.records and kept.records and not ((kept.tombstones or marker_for_empty_txn)
                                                               and h.delete_horizon_ms is None):
            return raw  # untouched: byte-exact copy
        if not kept.kept:
            if not retain_empty:
                return None
            return encode_batch([], base_offset=h.base_offset, timestamp_type=h.timestamp_type,
                                producer_id=h.producer_id, producer_epoch=h.producer_epoch,
                                base_sequence=h.base_sequence, partition_leader_epoch=h.partition_leader_epoch,
                                is_transactional=h.is_transactional, is_control=h.is_control,
                                last_offset_delta=h.last_offset_delta, max_timestamp=h.max_timestamp)
        # Kafka's shouldRetainRecord (cleaner_kernel.retain_records_py), with the exact key check that makes
        # hash collisions harmless, has chosen the records and re-encoded them on the horizon, if any.
        return cleaner_kernel.rebuild_batch(h, kept)


class _KeyReader:
    """A long key's own latest offset in the map's range, for when only its digest matched.

    The record at the map's offset usually holds this very key (memoised, since one winner
    answers for many records). If not, two keys share a digest: one walk of the range then
    records the latest offset of every long key in it — memory spent only once a collision
    has actually happened, which with the default hash is practically never.
    """

    def __init__(self, log, start: int, end: int) -> None:
        self.log = log
        self.start, self.end = start, end  # the map's offset range, inclusive
        self._memo: dict[int, bytes | None] = {}
        self._exact: dict[bytes, int] | None = None

    def __call__(self, offset: int, key: bytes) -> int:
        if offset not in self._memo:
            if len(self._memo) > 65536:
                self._memo.clear()
            self._memo[offset] = self._read(offset)
        if self._memo[offset] == key:
            return offset
        if self._exact is None:
            self._exact = self._latest_of_long_keys()
        return self._exact.get(key, -1)

    def _segments(self) -> list[LogSegment]:
        with self.log.lock:
            return segments_in_range(list(self.log.segments), self.start, self.end + 1)

    def _latest_of_long_keys(self) -> dict[bytes, int]:
        latest: dict[bytes, int] = {}
        for seg in self._segments():
            for b in seg.batches(seg.offset_index.lookup(self.start)[1]):
                if b.header.is_control or b.header.last_offset < self.start:
                    continue
                if b.header.base_offset > self.end:
                    return latest
                raw = seg.read_bytes(b.position, b.size)
                for r in decode_records(b.header, memoryview(raw)[BATCH_OVERHEAD:], seg.where):
                    if r.key is not None and len(r.key) > INLINE_MAX and self.start <= r.offset <= self.end:
                        latest[r.key] = r.offset
        return latest

    def _read(self, offset: int) -> bytes | None:
        with self.log.lock:
            seg = self.log.segments[self.log._floor_segment(offset)]
        found = seg.translate_offset(offset)
        if found is None:
            return None
        raw = seg.read_bytes(found.position, found.size)
        for r in decode_records(found.header, memoryview(raw)[BATCH_OVERHEAD:], seg.where):
            if r.offset == offset:
                return r.key
        return None
