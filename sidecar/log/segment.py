"""One segment: a `.log` file of batches with its `.index`, `.timeindex` and `.txnindex`, named by the 20-digit base
offset."""

from __future__ import annotations

import functools
import logging
import os
import weakref
from dataclasses import dataclass
from typing import Callable, Iterator

from .append_state import SegmentAppendState
from .errors import CorruptRecordError, InvalidIndexEntryError, TornSegmentError
from .file_records import BatchPosition, iter_batches
from .offset_index import OffsetIndex
from .open_files import SEGMENT_FILES, OpenFile
from .records import BatchHeader, check_batch
from .time_index import TimeIndex
from .transaction_index import TransactionIndex

log = logging.getLogger(__name__)

LOG_SUFFIX = ".log"
INDEX_SUFFIX = ".index"
TIME_INDEX_SUFFIX = ".timeindex"
TXN_INDEX_SUFFIX = ".txnindex"
SNAPSHOT_SUFFIX = ".snapshot"
DELETED_SUFFIX = ".deleted"
CLEANED_SUFFIX = ".cleaned"
SWAP_SUFFIX = ".swap"
INDEX_SUFFIXES = (INDEX_SUFFIX, TIME_INDEX_SUFFIX, TXN_INDEX_SUFFIX)


def filename_prefix(offset: int) -> str:
    """Kafka's file name prefix: the offset as 20 zero-padded decimal digits."""
    return f"{offset:020d}"


def offset_from_filename(name: str) -> int:
    return int(name[: name.index(".")])


def _holding_file(method):
    """Run a LogSegment method with its `.log` descriptor open and pinned (`self._fd` is valid inside)."""

    @functools.wraps(method)
    def held(self, *args, **kwargs):
        SEGMENT_FILES.acquire(self.file)
        try:
            return method(self, *args, **kwargs)
        finally:
            SEGMENT_FILES.release(self.file)

    return held


@dataclass(frozen=True, slots=True)
class LogSlice:
    """A byte range of a segment file: what a fetch sends without decoding (sendfile-ready)."""

    segment: "LogSegment"
    position: int
    size: int

    def read(self) -> bytes:
        return self.segment.read_bytes(self.position, self.size)

    def read_into(self, buf: bytearray) -> memoryview:
        """Read the slice into `buf` (grown if too small) and return a view of what was read.

        A fetch loop that reuses one buffer allocates nothing per fetch: a fresh 1 MiB `bytes`
        costs 256 page faults, a fifth of the copy itself.
        """
        if len(buf) < self.size:
            buf.extend(bytes(self.size - len(buf)))
        view = memoryview(buf)[: self.size]
        return view[: self.segment.read_into(view, self.position)]


class LogSegment(SegmentAppendState):
    """A segment's three files and the in-memory counters Kafka keeps for them (those the C append reads and writes
    declared in append_state.py).

    The `.log` descriptor is opened when used and may be closed by the process's LRU of open segment files
    (`open_files`) while the segment is idle; the methods that use it hold it (`_holding_file`).
    """

    def __init__(
        self,
        directory: str,
        base_offset: int,
        *,
        index_interval_bytes: int,
        max_index_size: int,
        now_ms: Callable[[], int],
        roll_jitter_ms: int = 0,
        preallocate_bytes: int = 0,
        suffix: str = "",
        where: str = "",
    ) -> None:
        self.dir = directory
        self.base_offset = base_offset
        self.index_interval_bytes = index_interval_bytes
        self.max_index_size = max_index_size
        self.roll_jitter_ms = roll_jitter_ms
        self.where = where or directory
        self._now_ms = now_ms
        self.suffix = suffix
        log_path = self._path(LOG_SUFFIX)
        existed = os.path.exists(log_path)
        self.file = OpenFile(log_path, create=True)
        # A raw descriptor, unlike the index maps, is not released when its object is collected: a segment
        # dropped without close() (a Log abandoned after an error) must not keep it open for the process's life.
        self._release_fd = weakref.finalize(self, SEGMENT_FILES.close, self.file)
        SEGMENT_FILES.acquire(self.file)
        try:
            if existed:
                self.size = os.fstat(self._fd).st_size
            else:
                self.size = 0
                if preallocate_bytes:
                    os.ftruncate(self._fd, preallocate_bytes)
            self._preallocated = bool(preallocate_bytes) and not existed
            self.offset_index = OffsetIndex(self._path(INDEX_SUFFIX), base_offset, max_index_size)
            self.time_index = TimeIndex(self._path(TIME_INDEX_SUFFIX), base_offset, max_index_size)
            self.txn_index = TransactionIndex(self._path(TXN_INDEX_SUFFIX), base_offset)
        except BaseException:
            self._release_fd()
            raise
        finally:
            SEGMENT_FILES.release(self.file)
        self.bytes_since_last_index_entry = 0
        self.created_ms = now_ms()
        self.max_ts = None  # (max timestamp so far, offset of its batch)
        self.rolling_ts = None  # first batch's max timestamp, for time-based rolls

    # -- files -----------------------------------------------------------------------------------

    def _path(self, file_suffix: str) -> str:
        return os.path.join(self.dir, filename_prefix(self.base_offset) + file_suffix + self.suffix)

    @property
    def log_path(self) -> str:
        return self._path(LOG_SUFFIX)

    @property
    def _fd(self) -> int:
        """The `.log` descriptor: only a method that holds it (`_holding_file`) may use the number."""
        return self.file.fd

    def fileno(self) -> int:
        """The `.log` descriptor, opened if needed. The LRU may close it once other segments are used, so a
        single-threaded tool may use it for a while; a server takes `dup_fd()` instead."""
        with SEGMENT_FILES.use(self.file) as fd:
            return fd

    @_holding_file
    def dup_fd(self) -> int:
        """A descriptor of the `.log` file of the caller's own (for sendfile after the log's lock is let go)."""
        return os.dup(self._fd)

    @_holding_file
    def read_bytes(self, position: int, size: int) -> bytes:
        return os.pread(self._fd, size, position)

    @_holding_file
    def read_into(self, view: memoryview, position: int) -> int:
        return os.preadv(self._fd, [view], position)

    def batches(self, start: int = 0, end: int | None = None) -> Iterator[BatchPosition]:
        return self._walk(start, self.size if end is None else end)

    def _walk(self, start: int, end: int) -> Iterator[BatchPosition]:
        """The batches in [start, end), holding the descriptor until the walk ends or is dropped."""
        SEGMENT_FILES.acquire(self.file)
        try:
            yield from iter_batches(self._fd, start, end, self.log_path)
        finally:
            SEGMENT_FILES.release(self.file)

    # -- append ----------------------------------------------------------------------------------

    def append(self, largest_offset: int, largest_timestamp: int, offset_of_max_timestamp: int,
               data: bytes | bytearray | memoryview) -> None:
        """Append one set of batches and index it by Kafka's `index.interval.bytes` rule.

        The offset index entry maps the set's last offset to the set's start
        position, and is written only once earlier appends passed the interval.
        """
        if not data:
            return
        # Held as `_holding_file` would, without its wrapper's call: every produced batch comes through here.
        fd = SEGMENT_FILES.acquire(self.file)
        try:
            self._append(fd, largest_offset, largest_timestamp, offset_of_max_timestamp, data)
        finally:
            SEGMENT_FILES.release(self.file)

    def _append(self, fd: int, largest_offset: int, largest_timestamp: int, offset_of_max_timestamp: int,
                data: bytes | bytearray | memoryview) -> None:
        position = self.size
        if position == 0:
            self.rolling_ts = largest_timestamp
        if not self.offset_index.can_append_offset(largest_offset):
            raise InvalidIndexEntryError(
                f"offset {largest_offset} does not fit segment {self.log_path} with base {self.base_offset}"
            )
        index_due = self.bytes_since_last_index_entry > self.index_interval_bytes
        if index_due:  # a full disk fails here, before a byte of the log is written
            self.offset_index.reserve()
            self.time_index.reserve()
        prior = (self.max_ts, self.offset_index.entries, self.time_index.entries)
        try:
            written = os.pwrite(fd, data, position)
            if written < len(data):  # a short write (the disk filled mid-way) is retried, so the real errno surfaces
                view = memoryview(data)[written:]
                while view:
                    view = view[os.pwrite(fd, view, position + len(data) - len(view)):]
            max_ts, _ = self.max_timestamp_and_offset
            if largest_timestamp > max_ts:
                self.max_ts = (largest_timestamp, offset_of_max_timestamp)
            if index_due:
                self.offset_index.append(largest_offset, position)
                self.time_index.maybe_append(*self.max_timestamp_and_offset)
        except BaseException as e:
            self.max_ts, self.offset_index.entries, self.time_index.entries = prior
            self._discard_from(position)
            if isinstance(e, OSError) and e.filename is None:  # pwrite's error names no file
                raise OSError(e.errno, f"{e.strerror} (writing {len(data)} bytes at position {position})",
                              self.log_path) from None
            raise
        self.size = position + len(data)
        if index_due:
            self.bytes_since_last_index_entry = 0
        self.bytes_since_last_index_entry += len(data)

    def _discard_from(self, position: int) -> None:
        """Cut what a failed append wrote at `position` (none of it may stay at the end of the segment).

        A preallocated segment gets its length back as a hole. If the cut itself fails the segment ends
        in bytes the log never acknowledged: `TornSegmentError` tells the log to stop appending to it.
        """
        try:
            length = os.fstat(self._fd).st_size
            os.ftruncate(self._fd, position)
            if self._preallocated and length > position:
                os.ftruncate(self._fd, length)
        except OSError as e:
            raise TornSegmentError(
                f"{self.where}: cannot cut the bytes of a failed append at position {position} of {self.log_path}: {e}"
            ) from e

    # -- timestamps ------------------------------------------------------------------------------

    @property
    def max_timestamp_and_offset(self) -> tuple[int, int]:
        """Largest timestamp in the segment and the last offset of its batch, read from the time index once."""
        if self.max_ts is None:
            self.max_ts = self._load_largest_timestamp()
        return self.max_ts

    def _load_largest_timestamp(self) -> tuple[int, int]:
        ts, off = self.time_index.last_entry
        position = self.offset_index.lookup(off)[1]
        for b in self.batches(position):
            if b.header.max_timestamp > ts:
                ts, off = b.header.max_timestamp, b.header.last_offset
        return ts, off

    @property
    def largest_timestamp(self) -> int:
        """Max record timestamp, or the `.log` file's mtime when there is none (retention relies on this)."""
        ts = self.max_timestamp_and_offset[0]
        return ts if ts >= 0 else int(os.stat(self.log_path).st_mtime * 1000)

    def _rolling_based_timestamp(self) -> int:
        if self.rolling_ts is None:
            first = next(iter(self.batches()), None)
            self.rolling_ts = first.header.max_timestamp if first else -1
        return self.rolling_ts

    @property
    def first_batch_timestamp(self) -> int:
        """Max timestamp of the first batch (Long.MAX when empty): how old the segment's oldest data is."""
        first = next(iter(self.batches()), None)
        return first.header.max_timestamp if first else 2**63 - 1

    def should_roll(self, *, max_segment_bytes: int, max_segment_ms: int, messages_size: int,
                    max_timestamp: int, max_offset: int, now_ms: int) -> bool:
        """Kafka's roll rule: size, time since the first record (record time), full indexes, offset overflow.

        Asked before every append, so the cheap tests go first and an empty segment skips the time rule.
        """
        size = self.size
        if size > max_segment_bytes - messages_size:
            return True
        if size > 0:
            rolling_ts = self.rolling_ts if self.rolling_ts is not None else self._rolling_based_timestamp()
            waited = max_timestamp - rolling_ts if rolling_ts >= 0 else now_ms - self.created_ms
            if waited > max_segment_ms - self.roll_jitter_ms:
                return True
        return (self.offset_index.is_full or self.time_index.is_full
                or not self.offset_index.can_append_offset(max_offset))

    # -- lookups ---------------------------------------------------------------------------------

    def translate_offset(self, offset: int, start_position: int = 0) -> BatchPosition | None:
        """The first batch whose last offset is >= `offset`, starting from the index's hint."""
        position = max(start_position, self.offset_index.lookup(offset)[1])
        for b in self.batches(position):
            if b.header.last_offset >= offset:
                return b
        return None

    def read(self, start_offset: int, max_size: int, max_position: int | None = None,
             min_one_message: bool = False) -> LogSlice | None:
        """The bytes to send for a fetch at `start_offset`; None past the end of this segment."""
        found = self.translate_offset(start_offset)
        if found is None:
            return None
        limit = self.size if max_position is None else max_position
        size = max(max_size, found.size) if min_one_message else max_size
        return LogSlice(self, found.position, max(0, min(limit - found.position, size)))

    def find_offset_by_timestamp(self, timestamp: int, starting_offset: int) -> tuple[int, int] | None:
        """(offset, timestamp) of the first record with timestamp >= `timestamp` and offset >= `starting_offset`."""
        from .records import decode_batch  # records are decoded only for the one batch that holds the answer

        _, indexed_offset = self.time_index.lookup(timestamp)
        position = self.offset_index.lookup(max(indexed_offset, starting_offset))[1]
        for b in self.batches(position):
            if b.header.max_timestamp >= timestamp:
                batch = decode_batch(self.read_bytes(b.position, b.size), self.where)
                for r in batch.records:
                    if r.timestamp >= timestamp and r.offset >= starting_offset:
                        return r.offset, r.timestamp
        return None

    @property
    def next_offset(self) -> int:
        """The offset after the last batch (the base offset when empty)."""
        last = None
        for last in self.batches(self.offset_index.lookup(self.offset_index.last_offset)[1]):
            pass
        return last.header.next_offset if last else self.base_offset

    # -- recovery and truncation -----------------------------------------------------------------

    @_holding_file
    def recover(self, on_batch: Callable[[BatchHeader], None] | None = None) -> int:
        """Rebuild both indexes from the log, truncating at the first invalid batch; return bytes truncated.

        `on_batch` sees each valid batch's header (the log's leader epochs are read again from them).
        """
        self.offset_index.reset(self.max_index_size)
        self.time_index.reset(self.max_index_size)
        valid_bytes = 0
        last_index_entry = 0
        max_ts = (-1, self.base_offset)
        indexing = True  # until the disk has no block for another index page
        try:
            for b in self.batches():
                check_batch(self.read_bytes(b.position, b.size), f"{self.where}, position {b.position}")
                if not self.offset_index.can_append_offset(b.header.last_offset):
                    raise CorruptRecordError(f"offset {b.header.last_offset} overflows segment base {self.base_offset}")
                if on_batch is not None:
                    on_batch(b.header)
                if b.header.max_timestamp > max_ts[0]:
                    max_ts = (b.header.max_timestamp, b.header.last_offset)
                if indexing and valid_bytes - last_index_entry > self.index_interval_bytes:
                    # Recovery indexes every batch, appends every append: a segment of multi-batch appends
                    # can need more entries than the index holds. Entries are sparse hints, so stop adding
                    # them rather than fail to load the log (the time index keeps its last slot); the same
                    # when a full disk has no block for the next page of entries.
                    try:
                        if not self.offset_index.is_full:
                            self.offset_index.append(b.header.last_offset, valid_bytes)
                        if not self.time_index.is_full:
                            self.time_index.maybe_append(*max_ts)
                    except OSError as e:
                        log.warning("%s: indexing %s only up to byte %d: %s", self.where, self.log_path, valid_bytes, e)
                        indexing = False
                    last_index_entry = valid_bytes
                valid_bytes += b.size
        except CorruptRecordError as e:
            log.warning("Found invalid messages in log segment %s at byte offset %d: %s", self.where, valid_bytes, e)
        truncated = self.size - valid_bytes
        if truncated > 0:
            os.ftruncate(self._fd, valid_bytes)
            self.size = valid_bytes
        self.max_ts = max_ts
        self.rolling_ts = None
        self.offset_index.trim_to_valid_size()
        try:
            self.time_index.maybe_append(*max_ts, skip_full_check=True)
        except OSError as e:  # a hint: the largest timestamp is re-read from the batches after the last entry
            log.warning("%s: no final time index entry in %s: %s", self.where, self.time_index.path, e)
        self.time_index.trim_to_valid_size()
        return truncated

    @_holding_file
    def truncate_to(self, offset: int) -> int:
        """Drop every batch at or after the one holding `offset`; return bytes removed."""
        found = self.translate_offset(offset)
        self.offset_index.truncate_to(offset)
        self.time_index.truncate_to(offset)
        self.txn_index.truncate_to(offset)
        self.offset_index.resize(self.max_index_size)
        self.time_index.resize(self.max_index_size)
        removed = 0
        if found is not None:
            removed = self.size - found.position
            os.ftruncate(self._fd, found.position)
            self.size = found.position
        if self.size == 0:
            self.created_ms = self._now_ms()
            self.rolling_ts = None
        self.bytes_since_last_index_entry = 0
        self.max_ts = None
        return removed

    def resize_indexes(self, size: int) -> None:
        self.offset_index.resize(size)
        self.time_index.resize(size)

    # -- lifecycle -------------------------------------------------------------------------------

    @_holding_file
    def on_become_inactive(self) -> None:
        """On roll: the final time-index entry, then trim indexes and any preallocated log space."""
        self.time_index.maybe_append(*self.max_timestamp_and_offset, skip_full_check=True)
        self.offset_index.trim_to_valid_size()
        self.time_index.trim_to_valid_size()
        os.ftruncate(self._fd, self.size)

    @_holding_file
    def flush(self) -> None:
        os.fsync(self._fd)
        self.offset_index.flush()
        self.time_index.flush()
        self.txn_index.flush()

    def close(self) -> None:
        """Write the final time-index entry, trim all three files and release them."""
        if self.file.closed:
            return
        if self.max_timestamp_and_offset[0] >= 0 and self.time_index.writable:
            try:
                self.time_index.maybe_append(*self.max_timestamp_and_offset, skip_full_check=True)
            except OSError as e:  # Kafka swallows it too: the entry is a hint; the largest timestamp is re-read
                log.warning("%s: no final time index entry in %s: %s", self.where, self.time_index.path, e)
        self.offset_index.close()
        self.time_index.close()
        with SEGMENT_FILES.use(self.file) as fd:
            os.ftruncate(fd, self.size)
        self._release_fd()

    def close_handles(self) -> None:
        """Release descriptors and maps without touching the files (after a rename to `.deleted`)."""
        self._release_fd()
        for idx in (self.offset_index, self.time_index):
            if idx.mm is not None:
                idx.mm.close()
                idx.mm = None

    def change_suffix(self, old: str, new: str) -> None:
        """Rename all the segment's files from `old` to `new` suffix (`""`, `.deleted`, `.cleaned`, `.swap`)."""
        for file_suffix, index in ((LOG_SUFFIX, None), (INDEX_SUFFIX, self.offset_index),
                                   (TIME_INDEX_SUFFIX, self.time_index), (TXN_INDEX_SUFFIX, self.txn_index)):
            src = os.path.join(self.dir, filename_prefix(self.base_offset) + file_suffix + old)
            dst = os.path.join(self.dir, filename_prefix(self.base_offset) + file_suffix + new)
            if index is not None:
                index.rename(dst)
            elif os.path.exists(src):
                SEGMENT_FILES.rename(self.file, dst)  # renamed and renamed in the LRU at once: reopens find it
        self.suffix = new

    def delete_files(self) -> None:
        self.close_handles()
        for file_suffix in (LOG_SUFFIX, *INDEX_SUFFIXES):
            path = self._path(file_suffix)
            if os.path.exists(path):
                os.unlink(path)

    def __repr__(self) -> str:
        return f"LogSegment(base={self.base_offset}, size={self.size}, dir={self.dir!r})"
