"""Helpers of the retention and compaction tests: Kafka's LogCleanerTest/LogTestUtils vocabulary.

`record(k, v)`, `tombstone(k)`, `TxnProducer`, `end_marker(...)` build batches as Kafka's tests do;
`keys_in_log`, `offsets_in_log`, `last_offsets_per_batch`, `last_sequences` read a log back from its
files; `make_cleaner(capacity)` mirrors `makeCleaner(capacity)` (a map of `capacity` slots at load
factor 0.75); `to_clean(log, first_dirty, uncleanable)` mirrors `LogToClean(tp, log, firstDirty,
uncleanableOffset)`, which computes the first uncleanable *segment* as Kafka does.
"""

from __future__ import annotations

import os
import shutil

from shale.sidecar.log.cleaner import Cleaner, CleanerStats, LogToClean, _TxnMetadata
from shale.sidecar.log.cleaner_manager import CleanableOffsets, CleanerManager
from shale.sidecar.log.log import Log
from shale.sidecar.log.offset_map import OffsetMap
from shale.sidecar.log.records import (
    BATCH_OVERHEAD,
    BatchHeader,
    ControlType,
    Record,
    decode_batch,
    encode_batch,
    end_txn_marker_batch,
)
from shale.sidecar.log.txn_scan import scan

INT_MAX = 2**31 - 1
BIG_OFFSET = 2**32 - 2  # the largest offset a map cleared at 0 holds: Kafka's FakeOffsetMap "Long.MaxValue"


def k(i: int | str) -> bytes:
    return str(i).encode()


def record(key: int | str, value: int | str | None, ts: int, **kw) -> bytes:
    """Kafka's `record(key, value)`: one keyed record in its own batch."""
    return encode_batch([Record(0, ts, k(key), None if value is None else k(value))], **kw)


def tombstone(key: int | str, ts: int, **kw) -> bytes:
    return record(key, None, ts, **kw)


def unkeyed(value: int | str, ts: int) -> bytes:
    return encode_batch([Record(0, ts, None, k(value))])


def end_marker(pid: int, epoch: int, ctype: ControlType, ts: int, coordinator_epoch: int = 0) -> bytes:
    """Kafka's `commitMarker`/`abortMarker`: a transactional control batch with one end-transaction record."""
    return end_txn_marker_batch(pid, epoch, ctype, ts, coordinator_epoch)


class TxnProducer:
    """Kafka's `appendTransactionalAsLeader`: each call appends one transactional batch of keys (value = key)."""

    def __init__(self, log: Log, pid: int, epoch: int = 0, *, clock=None) -> None:
        self.log, self.pid, self.epoch, self.clock = log, pid, epoch, clock
        self.seq = 0

    def __call__(self, keys: list[int]) -> None:
        ts = self.clock() if self.clock else 0
        recs = [Record(i, ts, k(x), k(x)) for i, x in enumerate(keys)]
        self.log.append(encode_batch(recs, producer_id=self.pid, producer_epoch=self.epoch, base_sequence=self.seq,
                                     is_transactional=True))
        self.seq += len(keys)

    def commit(self) -> None:
        self.log.append(end_marker(self.pid, self.epoch, ControlType.COMMIT, self.clock() if self.clock else 0))

    def abort(self) -> None:
        self.log.append(end_marker(self.pid, self.epoch, ControlType.ABORT, self.clock() if self.clock else 0))


def idempotent_record(key: int, value: int, ts: int, pid: int, epoch: int, seq: int) -> bytes:
    return record(key, value, ts, producer_id=pid, producer_epoch=epoch, base_sequence=seq)


# --- reading a log back ----------------------------------------------------------------------------

def headers(log: Log) -> list[BatchHeader]:
    return [b.header for seg in log.segments for b in seg.batches()]


def batches(log: Log):
    """(header, records) of every batch in every segment, decoded from the files (CRC checked)."""
    out = []
    for seg in log.segments:
        for b in seg.batches():
            batch = decode_batch(seg.read_bytes(b.position, b.size), seg.where)
            out.append((batch.header, list(batch.records)))
    return out


def keys_in_log(log: Log) -> list[int]:
    """LogTestUtils.keysInLog: keys of data records that have a value."""
    return [int(r.key) for h, recs in batches(log) if not h.is_control for r in recs
            if r.key is not None and r.value is not None]


def offsets_in_log(log: Log) -> list[int]:
    """LogCleanerTest.offsetsInLog: offsets of all records, control records included."""
    return [r.offset for _h, recs in batches(log) for r in recs]


def last_offsets_per_batch(log: Log) -> list[int]:
    return [h.last_offset for h in headers(log)]


def last_sequences(log: Log) -> dict[int, int]:
    """LogCleanerTest.lastSequencesInLog: producer id -> last sequence of its last data batch."""
    out: dict[int, int] = {}
    for h in headers(log):
        if h.producer_id >= 0 and not h.is_control:
            out[h.producer_id] = h.last_sequence
    return out


def key_values(log: Log) -> list[tuple[int, bytes, bytes | None]]:
    """(offset, key, value) of every data record."""
    return [(r.offset, r.key, r.value) for h, recs in batches(log) if not h.is_control for r in recs]


def latest_per_key(rows) -> dict[bytes, bytes | None]:
    out: dict[bytes, bytes | None] = {}
    for _off, key, value in sorted(rows, key=lambda r: r[0]):
        out[key] = value
    return out


def temp_files(directory: str) -> list[str]:
    return sorted(n for n in os.listdir(directory) if n.endswith((".cleaned", ".swap", ".deleted")))


# --- the cleaner ---------------------------------------------------------------------------------

def make_cleaner(capacity: int = 10_000, *, clock, load_factor: float = 0.75, **kw) -> Cleaner:
    """Kafka's makeCleaner(capacity): a map of `capacity` slots, at most capacity*0.75 keys per pass."""
    return Cleaner(OffsetMap(24 * capacity, load_factor), clock=clock, **kw)


def to_clean(log: Log, first_dirty: int = 0, uncleanable: int | None = None) -> LogToClean:
    """Kafka's `LogToClean(tp, log, firstDirty, uncleanableOffset)`: the first uncleanable segment is derived."""
    if uncleanable is None:
        uncleanable = log.active_segment.base_offset
    manager = CleanerManager(os.path.dirname(log.dir), lambda: {}, log.clock)
    return manager.log_to_clean(log, CleanableOffsets(first_dirty, uncleanable, False), log.clock())


def fill_map(cleaner: Cleaner, keys, offset: int = BIG_OFFSET) -> None:
    """Kafka's FakeOffsetMap with `keys` mapped to a huge offset: those keys are superseded everywhere."""
    cleaner.map.clear(0)
    for key in keys:
        cleaner.map.put(k(key), offset)


def clean_group(cleaner: Cleaner, log: Log, group, upper_bound: int, now: int) -> CleanerStats:
    """Kafka's `cleaner.cleanSegments(log, group, map, now, stats, new CleanedTransactionMetadata, -1, upper)`."""
    stats = CleanerStats()
    txns = scan(log.segments)
    producers = txns.last_batches_of_active_producers(now, cleaner.producer_expiration_ms)
    cleaner.clean_segments(log, list(group), now, stats, _TxnMetadata(txns.aborted), producers, upper_bound)
    return stats


def run_two_pass_clean(cleaner: Cleaner, log: Log, clock, first_dirty: int = 0) -> int:
    """LogCleanerTest.runTwoPassClean: a pass now, then one just past the delete horizon it set."""
    cleaner.clean(to_clean(log, first_dirty))
    clock.now += log.config.delete_retention_ms + 1
    return cleaner.clean(to_clean(log, first_dirty))[0]


def copy_dir(src: str, dst: str) -> str:
    shutil.copytree(src, dst)
    return dst


def raw_header(seg, position: int = 0) -> bytes:
    return seg.read_bytes(position, BATCH_OVERHEAD)


def control_types(log: Log) -> list[tuple[int, str]]:
    """(offset, COMMIT/ABORT/EMPTY) of every control batch."""
    from shale.sidecar.log.records import parse_control_key

    out = []
    for h, recs in batches(log):
        if h.is_control:
            out.append((h.last_offset, parse_control_key(recs[0].key).name if recs else "EMPTY"))
    return out



def read_all(log: Log) -> list[Record]:
    """Every record a consumer sees reading from the log start through `Log.read` (control records excluded)."""
    out: list[Record] = []
    offset = log.log_start_offset
    while offset < log.log_end_offset:
        sl = log.read(offset, 1 << 20)
        if sl is None:
            break
        data = sl.read()
        pos = 0
        last = offset - 1
        while pos + 12 <= len(data):
            size = 12 + int.from_bytes(data[pos + 8 : pos + 12], "big")
            if pos + size > len(data):
                break
            batch = decode_batch(data[pos : pos + size])
            last = batch.header.last_offset
            if not batch.header.is_control:
                out.extend(r for r in batch.records if r.offset >= offset)
            pos += size
        offset = last + 1
    return out
