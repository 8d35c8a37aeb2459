"""Reading a Shale (or Kafka) data directory's segment files without a server, strictly read-only.

`shale.sidecar.log.LogDir` takes the directory's `.lock`, deletes the clean-shutdown marker and
may recover (truncate) segments — right for the one process that owns the directory, wrong for a
Spark task reading a backup, a copied volume, or the live directory of a running `shale serve`.
So this module opens files `O_RDONLY`, maps indexes with `writable=False`, and reuses only the
engine's sans-I/O parts: batch header walk (`iter_batches`), index search, batch decode with its
CRC-32C check.

What the loader would do is reproduced in memory instead of on disk: `.deleted` and `.cleaned`
files are ignored, and a `.swap` segment (a compaction the cleaner was swapping in) stands for the
segments it replaces. A listing that changes while segments are opened (the cleaner or retention
renamed something) is taken again.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field
from typing import Callable, Iterator

from shale.sidecar.log.checkpoint import LOG_START_OFFSET_CHECKPOINT, CheckpointError, read_offsets
from shale.sidecar.log.errors import CorruptRecordError
from shale.sidecar.log.file_records import BatchPosition, iter_batches
from shale.sidecar.log.index import MmapIndex
from shale.sidecar.log.offset_index import OffsetIndex
from shale.sidecar.log.records import BATCH_OVERHEAD, RecordColumns, check_batch, decode_batch, decode_columns
from shale.sidecar.log.segment import CLEANED_SUFFIX, LOG_SUFFIX, SWAP_SUFFIX, filename_prefix
from shale.sidecar.log.time_index import TimeIndex
from shale.sidecar.log.topic_partition import TopicPartition

log = logging.getLogger(__name__)

DELETE_DIR_SUFFIX = "-delete"
_LISTING_ATTEMPTS = 20
_TAIL_RETRIES = 20  # a batch at the log end being written while we read it: re-read it for up to ~1 s


@dataclass
class ScanStats:
    """What one read touched: the proof that pruning happened (tests read it from the scan report)."""

    segments_listed: int = 0
    segments_read: list[int] = field(default_factory=list)  # base offsets whose .log was scanned for records
    segments_skipped_by_time: list[int] = field(default_factory=list)
    batch_headers_read: int = 0  # headers walked: the offset and time indexes keep this below a scan from the start
    batches_decoded: int = 0
    batches_skipped_by_time: int = 0
    records: int = 0


def _valid_prefix(index: MmapIndex, is_empty_slot: Callable[[int], bool]) -> None:
    """Limit a read-only index to its written entries.

    The active segment's index files are preallocated with zeros while a server runs (they are
    trimmed at roll and close), and a read-only map counts every slot. Written entries come first,
    so the first all-zero slot is found by bisection.
    """
    lo, hi = 0, index.entries
    while lo < hi:
        mid = (lo + hi) >> 1
        if is_empty_slot(mid):
            hi = mid
        else:
            lo = mid + 1
    index.entries = lo


class ReadOnlySegment:
    """One segment's `.log`, `.index` and `.timeindex`, opened for reading only."""

    def __init__(self, directory: str, base_offset: int, suffix: str, where: str) -> None:
        self.base_offset = base_offset
        self.log_path = os.path.join(directory, filename_prefix(base_offset) + LOG_SUFFIX + suffix)
        self.where = f"{where}: {self.log_path}"
        self._fd = os.open(self.log_path, os.O_RDONLY)
        try:
            self.size = os.fstat(self._fd).st_size
            prefix = os.path.join(directory, filename_prefix(base_offset))
            self.offset_index = OffsetIndex(prefix + ".index" + suffix, base_offset, 0, writable=False)
            self.time_index = TimeIndex(prefix + ".timeindex" + suffix, base_offset, 0, writable=False)
        except BaseException:
            os.close(self._fd)
            raise
        _valid_prefix(self.offset_index, lambda slot: self.offset_index.entry(slot)[1] == 0)
        _valid_prefix(self.time_index, lambda slot: self.time_index.entry(slot) == (0, base_offset))

    def batches(self, position: int = 0) -> Iterator[BatchPosition]:
        """Batch headers from `position` on; stops at a partial batch or preallocated zeros at the end."""
        walk = iter_batches(self._fd, position, self.size, self.where)
        while True:
            try:
                b = next(walk)
            except StopIteration:
                return
            except CorruptRecordError:
                if self._zeros_from(position):
                    return  # file.preallocate: the rest of the active segment is zeros
                raise
            position = b.end
            yield b

    def _zeros_from(self, position: int) -> bool:
        return not any(os.pread(self._fd, 4096, position))

    def read_batch(self, b: BatchPosition) -> bytes:
        return os.pread(self._fd, b.size, b.position)

    def position_of(self, offset: int) -> int:
        """A byte position at or before the batch that holds `offset` (the offset index's hint)."""
        return self.offset_index.lookup(offset)[1] if offset > self.base_offset else 0

    def position_for_timestamp(self, timestamp: int) -> int:
        """A byte position before which every batch's largest timestamp is below `timestamp` (Kafka's lookup)."""
        _, offset = self.time_index.lookup(timestamp)
        return self.position_of(offset)

    def max_timestamp(self) -> int:
        """The largest record timestamp: the time index's last entry, then the batches after it (as Kafka loads it)."""
        ts, offset = self.time_index.last_entry
        for b in self.batches(self.position_of(offset)):
            ts = max(ts, b.header.max_timestamp)
        return ts

    def next_offset(self) -> int:
        """The offset after the last batch (the base offset when empty)."""
        last = None
        for last in self.batches(self.position_of(self.offset_index.last_offset)):
            pass
        return last.header.next_offset if last else self.base_offset

    def close(self) -> None:
        for index in (self.offset_index, self.time_index):
            if index.mm is not None:
                index.mm.close()
                index.mm = None
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


class PartitionFiles:
    """One `<topic>-<partition>` directory, seen as the loader would load it, without changing it."""

    def __init__(self, data_dir: str, tp: TopicPartition) -> None:
        self.data_dir = data_dir
        self.tp = tp
        self.dir = os.path.join(data_dir, str(tp))
        self.where = str(tp)

    # -- the segment list ------------------------------------------------------------------------

    def _names(self) -> frozenset[str]:
        return frozenset(n for n in os.listdir(self.dir)
                         if n.endswith((LOG_SUFFIX, LOG_SUFFIX + SWAP_SUFFIX, LOG_SUFFIX + CLEANED_SUFFIX)))

    def _layout(self, names: frozenset[str]) -> tuple[list[int], dict[int, str]]:
        """Base offsets in order and the suffix to open each with; swaps stand for what they replace."""
        plain = sorted(int(n[:20]) for n in names if n.endswith(LOG_SUFFIX))
        cleaned = [int(n[:20]) for n in names if n.endswith(CLEANED_SUFFIX)]
        swaps = sorted(int(n[:20]) for n in names if n.endswith(SWAP_SUFFIX))
        if cleaned:  # a swap at or after a .cleaned file belongs to a split that never finished (KAFKA-6264)
            swaps = [b for b in swaps if b < min(cleaned)]
        suffixes = {b: "" for b in plain}
        for base in swaps:
            seg = ReadOnlySegment(self.dir, base, SWAP_SUFFIX, self.where)
            try:
                end = seg.next_offset()
            finally:
                seg.close()
            for b in [b for b in suffixes if base <= b < end]:
                del suffixes[b]
            suffixes[base] = SWAP_SUFFIX
        return sorted(suffixes), suffixes

    def open_segments(self, choose: Callable[[list[int]], list[int]]) -> list[ReadOnlySegment]:
        """Open the segments `choose` picks from the base offsets, from one consistent listing.

        The listing is taken again if, while the segments were opened, a chosen segment's file or
        any `.swap` file came or went (a compaction swapping in, retention deleting); a roll only
        adds a segment after the chosen ones and does not count.
        """
        for attempt in range(_LISTING_ATTEMPTS):
            names = self._names()
            opened: list[ReadOnlySegment] = []
            try:
                bases, suffixes = self._layout(names)
                chosen = choose(bases)
                for base in chosen:
                    opened.append(ReadOnlySegment(self.dir, base, suffixes[base], self.where))
                watched = {filename_prefix(b) for b in chosen}

                def relevant(listing: frozenset[str]) -> frozenset[str]:
                    return frozenset(n for n in listing if n[:20] in watched or not n.endswith(LOG_SUFFIX))

                if relevant(self._names()) == relevant(names):
                    return opened
            except FileNotFoundError:
                pass  # renamed between listing and opening
            for seg in opened:
                seg.close()
            time.sleep(0.01 * (attempt + 1))
        raise RuntimeError(f"{self.where}: the segment files in {self.dir} kept changing while being opened")

    def _log_start_checkpoint(self) -> int:
        try:
            return read_offsets(os.path.join(self.data_dir, LOG_START_OFFSET_CHECKPOINT)).get(self.tp, 0)
        except (CheckpointError, OSError, UnicodeDecodeError) as e:
            log.warning("%s: ignoring unreadable %s: %s", self.where, LOG_START_OFFSET_CHECKPOINT, e)
            return 0

    # -- offsets ---------------------------------------------------------------------------------

    def log_start_offset(self) -> int:
        segs = self.open_segments(lambda bases: bases[:1])
        try:
            first = segs[0].base_offset if segs else 0
        finally:
            _close(segs)
        return max(first, self._log_start_checkpoint())

    def log_end_offset(self) -> int:
        segs = self.open_segments(lambda bases: bases[-1:])
        try:
            return segs[0].next_offset() if segs else self._log_start_checkpoint()
        finally:
            _close(segs)

    def offset_for_timestamp(self, timestamp: int) -> int | None:
        """Kafka's ListOffsets by time: the first offset whose record timestamp is >= `timestamp`, or None."""
        start = self.log_start_offset()
        segs = self.open_segments(lambda bases: bases)
        try:
            for seg in segs:
                if seg.max_timestamp() < timestamp:
                    continue
                for b in seg.batches(seg.position_for_timestamp(timestamp)):
                    if b.header.max_timestamp < timestamp or b.header.last_offset < start or b.header.is_control:
                        continue
                    for r in decode_batch(seg.read_batch(b), f"{seg.where}, position {b.position}").records:
                        if r.timestamp >= timestamp and r.offset >= start:
                            return r.offset
            return None
        finally:
            _close(segs)

    # -- reading ---------------------------------------------------------------------------------

    def read(self, start: int, end: int, min_timestamp: int | None, builder, stats: ScanStats) -> Iterator:
        """Add every data record with start <= offset < end (and timestamp >= min_timestamp) to
        `builder`, yielding its record batches as they fill. Control batches are skipped; only the
        segments that hold the range are opened, and with a timestamp bound only those whose largest
        timestamp reaches it are scanned (batches below it are skipped by their headers).
        """
        def choose(bases: list[int]) -> list[int]:
            stats.segments_listed = len(bases)
            first = max((i for i, b in enumerate(bases) if b <= start), default=0)
            return [b for i, b in enumerate(bases) if i >= first and b < end]

        add = builder.add
        segs = self.open_segments(choose)
        try:
            for i, seg in enumerate(segs):
                last = i == len(segs) - 1
                if min_timestamp is not None and seg.max_timestamp() < min_timestamp:
                    stats.segments_skipped_by_time.append(seg.base_offset)
                    continue
                stats.segments_read.append(seg.base_offset)
                position = seg.position_of(start)
                if min_timestamp is not None:
                    position = max(position, seg.position_for_timestamp(min_timestamp))
                for b in seg.batches(position):
                    stats.batch_headers_read += 1
                    h = b.header
                    if h.base_offset >= end:
                        break
                    if h.last_offset < start or h.is_control:
                        continue
                    if min_timestamp is not None and h.max_timestamp < min_timestamp:
                        stats.batches_skipped_by_time += 1
                        continue
                    cols = self._decode(seg, b, last)
                    stats.batches_decoded += 1
                    ts_type = int(h.timestamp_type)
                    if start <= h.base_offset and h.last_offset < end and min_timestamp is None:
                        builder.extend(cols, ts_type)  # the whole batch: columns appended, no loop per record
                        stats.records += len(cols.offsets)
                        continue
                    for i, offset in enumerate(cols.offsets):
                        if start <= offset < end and (min_timestamp is None or cols.timestamps[i] >= min_timestamp):
                            add(cols.keys[i], cols.values[i], offset, cols.timestamps[i], ts_type, cols.headers[i])
                            stats.records += 1
                    if builder.full:
                        yield builder.take()
        finally:
            _close(segs)

    @staticmethod
    def _decode(seg: ReadOnlySegment, b: BatchPosition, last_segment: bool) -> RecordColumns:
        where = f"{seg.where}, position {b.position}"
        for attempt in range(_TAIL_RETRIES if last_segment else 1):
            try:
                batch = seg.read_batch(b)
                header = check_batch(batch, where)  # the CRC, as every reader of a batch checks it
                return decode_columns(header, memoryview(batch)[BATCH_OVERHEAD:], where)
            except CorruptRecordError:
                if not last_segment or attempt == _TAIL_RETRIES - 1:
                    raise
                time.sleep(0.05)  # the server may still be writing this batch at the end of the log


class DataDirectory:
    """A data directory's partitions, read-only."""

    def __init__(self, path: str) -> None:
        self.path = os.path.abspath(path)
        if not os.path.isdir(self.path):
            raise FileNotFoundError(f"data directory {self.path} does not exist")

    def topic_partitions(self) -> list[TopicPartition]:
        out = []
        for name in os.listdir(self.path):
            if name.endswith(DELETE_DIR_SUFFIX) or not os.path.isdir(os.path.join(self.path, name)):
                continue
            try:
                out.append(TopicPartition.parse_dir_name(name))
            except ValueError:
                continue
        return sorted(out)

    def partition(self, topic: str, partition: int) -> PartitionFiles:
        tp = TopicPartition(topic, partition)
        files = PartitionFiles(self.path, tp)
        if not os.path.isdir(files.dir):
            raise FileNotFoundError(f"{tp}: no partition directory {files.dir} in data directory {self.path}")
        return files


def _close(segs: list[ReadOnlySegment]) -> None:
    for seg in segs:
        seg.close()
