"""The cleaner's two per-record loops, in pure Python and, when it is built, in C.

`map_records` is pass 1 for one data batch (put each keyed record of the dirty range into the
offset map); `retain_records` is pass 2 (which records of a batch survive, and their bytes
re-encoded for a rebuilt batch). `Cleaner` calls only these two; the rest of a pass stays in
cleaner.py.

The C module `_cleaner_kernel` (sidecar/log/_cleaner_kernel.c, compiled by `pip install -e .`)
runs a batch when the map was made with its hash (`OffsetMap`'s default when the module is
built, see offset_map.py): the C loop computes slot positions and digests itself, so it can only
drive a map whose `hash_fn` *is* `_cleaner_kernel.hash27`. Any other map (a custom `hash_fn`,
such as the weak hashes tests use, or BLAKE2b when the module is missing) takes the pure-Python
path. The C code gives up on a batch (returns None, before changing anything) whenever Python
could behave differently — a corrupt record, an integer beyond int64, a non-ASCII header key —
and the pure-Python path then handles that batch, errors included.

Both paths give the same results: the same map bytes, the same decisions and byte-identical
re-encoded records (tests/log/test_cleaner_kernel.py).
"""

from __future__ import annotations

import struct
from typing import Callable, NamedTuple

from .compression import Compression, compress, decompress
from .offset_map import OffsetMap
from .records import (
    BATCH_OVERHEAD,
    COMPRESSION_MASK,
    CONTROL_BIT,
    DELETE_HORIZON_BIT,
    LOG_OVERHEAD,
    MAGIC,
    TIMESTAMP_TYPE_BIT,
    TRANSACTIONAL_BIT,
    BatchHeader,
    TimestampType,
    compute_crc,
    decode_records,
    encode_record,
)

try:
    from . import _cleaner_kernel as _c
except ImportError:  # not compiled: the pure-Python loops run
    _c = None

# (offset the map gave, key) -> that key's own latest offset in the map's range, or -1: asked only
# when a long key matched by digest, so that two keys with one digest never decide for each other.
KeyReader = Callable[[int, bytes], int]


class Counters:
    """Batches each path has run since start-up (read by the benchmark and the tests)."""

    def __init__(self) -> None:
        self.c = 0  # batches the C loops did
        self.python = 0  # batches the pure-Python loops did (other maps, or C gave up)
        self.fallback = 0  # of those, batches C gave up on

    def snapshot(self) -> tuple[int, int, int]:
        return self.c, self.python, self.fallback


counters = Counters()

_HEADER = struct.Struct(">qiibIhiqqqhii")  # records.py's v2 batch header
_KEPT_ATTRIBUTES = TIMESTAMP_TYPE_BIT | TRANSACTIONAL_BIT | CONTROL_BIT


def c_available() -> bool:
    """True if the C module is built and importable."""
    return _c is not None


def kernel_hash():
    """The C path's map hash (`OffsetMap` hash_fn), or None when the module is not built."""
    return None if _c is None else _c.hash27


def uses_c(offset_map: OffsetMap) -> bool:
    """Whether batches against this map run in C."""
    return _c is not None and offset_map.hash_fn is _c.hash27


def _records_data(h: BatchHeader, body: bytes | memoryview) -> bytes | memoryview:
    """The uncompressed records, as decode_records gets them (and failing as it fails)."""
    return decompress(h.compression, body) if h.attributes & COMPRESSION_MASK else body


# -- pass 1 ----------------------------------------------------------------------------------------


def map_records(offset_map: OffsetMap, h: BatchHeader, body: bytes | memoryview, start: int, next_offset: int,
                where: str = "") -> tuple[int, bool]:
    """Put each keyed record with offset in [start, next_offset) into the map, in order.

    Returns (records read, map full): the pass stops at the first record the map cannot take
    (it is full, or the offset is beyond its range), which is counted as read.
    `body` is the batch after its 61-byte header, compressed or not.
    """
    if _c is not None and offset_map.hash_fn is _c.hash27:
        done = _c.map_batch(offset_map.buf, offset_map.slots, offset_map.max_entries, offset_map.size,
                            _records_data(h, body), h.records_count, offset_map.base_offset, h.base_offset,
                            start, next_offset)
        if done is not None:
            counters.c += 1
            read, full, offset_map.size, last_put = done
            if last_put is not None:
                offset_map.latest_offset = last_put
            return read, full
        counters.fallback += 1
    counters.python += 1
    return map_records_py(offset_map, h, body, start, next_offset, where)


def map_records_py(offset_map: OffsetMap, h: BatchHeader, body: bytes | memoryview, start: int, next_offset: int,
                   where: str = "") -> tuple[int, bool]:
    """`map_records` in pure Python (Kafka's buildOffsetMapForSegment record loop)."""
    read = 0
    for r in decode_records(h, body, where):
        read += 1
        if r.key is None or r.offset < start or r.offset >= next_offset:
            continue
        if offset_map.is_full or not offset_map.can_hold(r.offset):
            return read, True
        offset_map.put(r.key, r.offset)
    return read, False


# -- pass 2 ----------------------------------------------------------------------------------------


class Retained(NamedTuple):
    """What survives of one batch."""

    records: int  # records in the batch
    kept: int  # records that survive
    invalid: int  # records dropped for having no key
    tombstones: bool  # a kept record is a tombstone
    horizon: int | None  # the batch's delete horizon after cleaning (set now, kept, or none)
    base_timestamp: int | None  # of the rebuilt batch (None: no rebuild)
    max_timestamp: int | None  # of the rebuilt batch
    body: bytes | None  # kept records re-encoded; None if none is kept, or all are and no horizon is set


def retain_records(offset_map: OffsetMap, h: BatchHeader, body: bytes | memoryview, now: int, key_at: KeyReader,
                   where: str = "", *, discard: bool = False, marker: bool = False,
                   delete_horizon: int) -> Retained:
    """Kafka's shouldRetainRecord over one batch, and the kept records re-encoded for `rebuild_batch`.

    `discard`: the batch's records all go (aborted data, an expired marker). `marker`: a
    removable transaction marker, which needs a delete horizon like a tombstone.
    `delete_horizon`: now + delete.retention.ms, set on a batch that keeps a tombstone (or a
    marker) and has no horizon yet. `key_at(offset, key)` gives the key's own latest offset when
    only a digest matched (long keys), so that two keys with one digest are never confused.
    """
    if _c is not None and offset_map.hash_fn is _c.hash27:
        done = _c.retain_batch(offset_map.buf, offset_map.slots, offset_map.base_offset, offset_map.latest_offset,
                               _records_data(h, body), h.records_count, h.base_offset, h.base_timestamp,
                               h.max_timestamp, h.attributes, now, key_at, discard, marker, delete_horizon)
        if done is not None:
            counters.c += 1
            return Retained._make(done)
        counters.fallback += 1
    counters.python += 1
    return retain_records_py(offset_map, h, body, now, key_at, where, discard=discard, marker=marker,
                             delete_horizon=delete_horizon)


def retain_records_py(offset_map: OffsetMap, h: BatchHeader, body: bytes | memoryview, now: int, key_at: KeyReader,
                      where: str = "", *, discard: bool = False, marker: bool = False,
                      delete_horizon: int) -> Retained:
    """`retain_records` in pure Python."""
    records = decode_records(h, body, where)
    kept = []
    invalid = 0
    tombstones = False
    if not discard:
        latest = offset_map.latest_offset
        for r in records:
            if not h.is_control and r.offset <= latest:  # beyond the map's range, or a marker: kept
                if r.key is None:
                    invalid += 1  # only possible if the topic was not compacted when written
                    continue
                found = offset_map.get(r.key)
                latest_of_key = found.offset
                if r.offset < latest_of_key and not found.verified:
                    latest_of_key = key_at(latest_of_key, r.key)  # only a digest matched: the key's own latest
                if r.offset < latest_of_key:
                    continue  # a later record of this very key exists
                if r.value is None and not (h.delete_horizon_ms is None or now < h.delete_horizon_ms):
                    continue  # a tombstone past its delete horizon
            kept.append(r)
            tombstones = tombstones or (r.value is None and not h.is_control)
    needs_horizon = (tombstones or marker) and h.delete_horizon_ms is None
    horizon = delete_horizon if needs_horizon else h.delete_horizon_ms
    if not kept or (len(kept) == len(records) and not needs_horizon):
        return Retained(len(records), len(kept), invalid, tombstones, horizon, None, None, None)
    base_timestamp = horizon if horizon is not None else kept[0].timestamp
    if h.timestamp_type is TimestampType.LOG_APPEND_TIME:
        max_timestamp = h.max_timestamp
    else:
        max_timestamp = max(r.timestamp for r in kept)
    encoded = b"".join(encode_record(r.offset - h.base_offset, r.timestamp - base_timestamp, r.key, r.value,
                                     r.headers) for r in kept)
    return Retained(len(records), len(kept), invalid, tombstones, horizon, base_timestamp, max_timestamp, encoded)


def rebuild_batch(h: BatchHeader, kept: Retained) -> bytes:
    """The batch of the kept records: what `encode_batch(kept records, ...)` builds for the cleaner.

    Same base offset, last offset delta, producer fields, leader epoch, flags and codec (at its
    default level); base timestamp = the horizon or the first kept record's; the horizon bit if
    there is a horizon.
    """
    body = kept.body
    compression = Compression.from_attributes(h.attributes) if h.attributes & COMPRESSION_MASK else Compression.NONE
    if compression:
        body = compress(compression, body, None)
    attributes = (int(compression) | (h.attributes & _KEPT_ATTRIBUTES)
                  | (DELETE_HORIZON_BIT if kept.horizon is not None else 0))
    batch = bytearray(_HEADER.pack(
        h.base_offset, BATCH_OVERHEAD - LOG_OVERHEAD + len(body), h.partition_leader_epoch, MAGIC, 0, attributes,
        h.last_offset_delta, kept.base_timestamp, kept.max_timestamp, h.producer_id, h.producer_epoch,
        h.base_sequence, kept.kept,
    ))
    batch += body
    struct.pack_into(">I", batch, 17, compute_crc(batch))
    return bytes(batch)
