"""The cleaner's per-record loops: the C module against the pure-Python code, and both against the
loop the cleaner had before (`_reference_retained`, the pre-kernel `Cleaner._retained_batch` loop).

- The C module must be built: `make test` compiles it (`pip install -e .`), and a missing module
  fails here instead of quietly testing only the pure-Python path.
- Pass 1: the same map bytes, size, latest offset, records read and "map full" answer.
- Pass 2: the same decisions, counts, key checks and byte-identical re-encoded records; the
  rebuilt batch equals what `encode_batch` of the kept records gave before.
- Odd encodings (non-canonical varints, record attribute bytes, null lengths other than -1,
  non-ASCII header keys, int64 overflows) and corrupt bodies: C never accepts a batch Python
  rejects, and never decides otherwise.
- A whole log (several segments, codecs, long keys, tombstones, unkeyed records, transactions,
  partial passes) cleaned pass after pass by either path leaves byte-identical files.
"""

from __future__ import annotations

import importlib
import os
import random
import shutil
import struct

import crc32c
import pytest
import xxhash
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from shale.sidecar.log import cleaner_kernel
from shale.sidecar.log.cleaner import Cleaner, LogToClean
from shale.sidecar.log.compression import Compression, compress
from shale.sidecar.log.errors import CorruptRecordError
from shale.sidecar.log.log import Log
from shale.sidecar.log.offset_map import SLOT_SIZE, OffsetMap, default_hash
from shale.sidecar.log.records import (
    BatchHeader,
    ControlType,
    Header,
    Record,
    TimestampType,
    decode_records,
    encode_batch,
    encode_control_key,
    encode_end_txn_marker,
)
from support.logtest_util import FakeClock, dir_snapshot, make_config

_c = importlib.import_module("shale.sidecar.log._cleaner_kernel")  # no skip: a missing module fails the run

M64 = (1 << 64) - 1
INT64_MAX = 2**63 - 1

# Inline keys (<= 19 bytes) are compared exactly, longer keys by digest; the edges on both sides.
KEYS = [b"", b"a", b"a\x00", b"k1", b"user-0000123", b"s" * 19, b"t" * 20, b"t" * 20 + b"\x00",
        b"long-key-" + b"z" * 30, b"x" * 200]


# -- batches, encoded as a producer might (canonically or not) -------------------------------------


def _varint(value: int, pad: int = 0, max_bytes: int = 5) -> bytes:
    """Zigzag varint; `pad` extra continuation bytes (a non-canonical encoding a reader must accept)."""
    u = ((value << 1) ^ (value >> 63)) & M64
    out = bytearray()
    while u >= 0x80:
        out.append((u & 0x7F) | 0x80)
        u >>= 7
    extra = min(pad, max_bytes - len(out) - 1)
    if extra > 0:
        out.append(u | 0x80)
        out.extend(b"\x80" * (extra - 1))
        out.append(0)
    else:
        out.append(u)
    return bytes(out)


def _field(b: bytes | None, pad: int, null_len: int) -> bytes:
    return _varint(null_len, pad) if b is None else _varint(len(b), pad) + b


def encode_odd_record(offset_delta: int, ts_delta: int, key, value, headers, *, pad: int = 0, attr: int = 0,
                      null_len: int = -1) -> bytes:
    body = bytes([attr]) + _varint(ts_delta, pad, 10) + _varint(offset_delta, pad) + _field(key, pad, null_len) \
        + _field(value, pad, null_len) + _varint(len(headers), pad)
    for hk, hv in headers:
        body += _field(hk, pad, null_len) + _field(hv, pad, null_len)
    return _varint(len(body), pad) + body


_HEADER = struct.Struct(">qiibIhiqqqhii")


def assemble(records_body: bytes, count: int, *, base_offset: int, attributes: int, last_offset_delta: int,
             base_timestamp: int, max_timestamp: int, producer_id: int = -1, producer_epoch: int = -1,
             base_sequence: int = -1, leader_epoch: int = -1) -> bytes:
    codec = Compression(attributes & 0x07)
    body = compress(codec, records_body) if codec else records_body
    batch = bytearray(_HEADER.pack(base_offset, 49 + len(body), leader_epoch, 2, 0, attributes, last_offset_delta,
                                   base_timestamp, max_timestamp, producer_id, producer_epoch, base_sequence, count))
    batch += body
    struct.pack_into(">I", batch, 17, crc32c.crc32c(bytes(batch[21:])))
    return bytes(batch)


ascii_header_key = st.binary(max_size=6).map(lambda b: bytes(c & 0x7F for c in b))
KEY_ST = st.none() | st.sampled_from(KEYS) | st.binary(max_size=24)
VALUE_ST = st.none() | st.binary(max_size=40)
HEADERS_ST = st.lists(st.tuples(ascii_header_key, st.none() | st.binary(max_size=8)), max_size=2)
ODD_HEADERS_ST = st.lists(st.tuples(ascii_header_key | st.binary(max_size=4), st.none() | st.binary(max_size=8)),
                          max_size=2)
# (offset gap, key, value, headers, timestamp delta, varint padding, attributes byte, length of null)
RECORD_ST = st.tuples(st.integers(1, 4), KEY_ST, VALUE_ST, HEADERS_ST, st.integers(-(10**7), 10**7),
                      st.just(0), st.just(0), st.just(-1))
ODD_RECORD_ST = st.tuples(st.integers(1, 4), KEY_ST, VALUE_ST, ODD_HEADERS_ST, st.integers(-(10**7), 10**7),
                          st.integers(0, 9), st.sampled_from([0, 0, 0, 1, 0x80]), st.sampled_from([-1, -1, -2, -1000]))
EXTREME_RECORD_ST = st.tuples(st.integers(1, 4), KEY_ST, VALUE_ST, HEADERS_ST, st.integers(-(2**62), 2**62),
                              st.integers(0, 9), st.just(0), st.just(-1))
BASE_OFFSET_ST = st.integers(0, 2**40) | st.sampled_from([0, 5, 2**62])
EXTREME_BASE_OFFSET_ST = BASE_OFFSET_ST | st.sampled_from([INT64_MAX - 3, INT64_MAX - 2**35])
BASE_TS_ST = st.integers(0, 2**45)
EXTREME_BASE_TS_ST = BASE_TS_ST | st.sampled_from([INT64_MAX, -(2**63)])
FLAGS_ST = st.tuples(st.sampled_from([0, 0x08]), st.sampled_from([0, 0x10]), st.sampled_from([0, 0x40]),
                     st.integers(0, 2), st.integers(-1, 2**45), st.integers(0, 3))


@st.composite
def odd_batches(draw, *, odd: bool = True, codecs=(0,), control=None, extreme=False):
    """(header, records body as stored: compressed if the codec says so) of one arbitrary batch.

    `odd`: varints padded to their longest, record attribute bytes set, null lengths other than -1
    and non-ASCII header keys, all of which a reader accepts. `extreme`: offsets and timestamps
    near the int64 limits."""
    items = draw(st.lists(EXTREME_RECORD_ST if extreme else ODD_RECORD_ST if odd else RECORD_ST, max_size=16))
    is_control = draw(st.booleans()) if control is None else control
    base_offset = draw(EXTREME_BASE_OFFSET_ST if extreme else BASE_OFFSET_ST)
    base_ts = draw(EXTREME_BASE_TS_ST if extreme else BASE_TS_ST)
    log_append, txn, horizon, extra_delta, max_ts, first = draw(FLAGS_ST)
    recs, delta = [], first
    for gap, key, value, headers, ts_delta, pad, attr, null_len in items:
        recs.append(encode_odd_record(delta, ts_delta, key, value, headers, pad=pad, attr=attr, null_len=null_len))
        delta += gap
    last_delta = delta - items[-1][0] if items else 0
    attributes = draw(st.sampled_from(codecs)) | log_append | txn | (0x20 if is_control else 0) | horizon
    batch = assemble(b"".join(recs), len(items), base_offset=base_offset, attributes=attributes,
                     last_offset_delta=last_delta + extra_delta, base_timestamp=base_ts, max_timestamp=max_ts)
    return BatchHeader.parse(batch), memoryview(batch)[61:]


def run(fn, *args, **kw):
    """The result, or the error as (type, message): both paths must fail alike."""
    try:
        return fn(*args, **kw)
    except CorruptRecordError as e:
        return (type(e), str(e))


# -- maps ------------------------------------------------------------------------------------------


def kernel_map(slots: int, load_factor: float = 0.9) -> OffsetMap:
    m = OffsetMap(slots * SLOT_SIZE, load_factor)
    assert m.hash_fn is _c.hash27
    return m


def copy_map(m: OffsetMap) -> OffsetMap:
    other = OffsetMap(m.slots * SLOT_SIZE, 1.0, m.hash_fn)
    other.max_entries = m.max_entries
    other.buf[:] = m.buf
    other.base_offset, other.size, other.latest_offset = m.base_offset, m.size, m.latest_offset
    return other


def same_map(a: OffsetMap, b: OffsetMap) -> None:
    assert (a.size, a.latest_offset, a.base_offset) == (b.size, b.latest_offset, b.base_offset)
    assert a.buf == b.buf


def _batch_keys(h: BatchHeader, body) -> list[bytes]:
    try:
        return [r.key for r in decode_records(h, body) if r.key is not None]
    except CorruptRecordError:
        return []


@st.composite
def filled_maps(draw, h: BatchHeader, body=None):
    """A kernel-hash map holding some keys (many of them the batch's) at offsets around the batch's."""
    m = kernel_map(draw(st.sampled_from([2, 3, 8, 64, 4096])), draw(st.sampled_from([0.9, 0.75, 1.0])))
    m.clear(max(0, h.base_offset - draw(st.integers(0, 50))))
    pool = KEYS + (_batch_keys(h, body) if body is not None else [])
    for _ in range(draw(st.integers(0, 12))):
        if m.is_full:
            break
        off = m.base_offset + draw(st.integers(0, 80))
        m.put(draw(st.sampled_from(pool) | st.binary(max_size=24)), off)
    m.latest_offset = m.base_offset + draw(st.integers(-1, 80) | st.just(80))
    return m


# -- the C module is there and runs the cleaner ------------------------------------------------------


def test_c_kernel_is_built_and_used(tmp_path):
    assert cleaner_kernel.c_available(), "the C cleaner kernel is not built (pip install -e . compiles it)"
    assert cleaner_kernel.kernel_hash() is _c.hash27
    m = OffsetMap(1 << 16)
    assert m.hash_fn is _c.hash27 and m.hash_name == "xxh64x4" and cleaner_kernel.uses_c(m)
    assert not cleaner_kernel.uses_c(OffsetMap(1 << 16, hash_fn=default_hash))

    clock = FakeClock()
    log = Log(str(tmp_path / "t-0"), make_config({"cleanup.policy": "compact", "segment.bytes": 4096}), clock=clock)
    for i in range(40):
        log.append(encode_batch([Record(j, clock.now, b"k%d" % ((5 * i + j) % 7), b"v%d" % i) for j in range(5)]))
    log.roll()
    before = cleaner_kernel.counters.snapshot()
    Cleaner(m, clock=clock).clean(LogToClean(log, 0, log.active_segment.base_offset, 0, log.size_in_bytes))
    c, python, fallback = (a - b for a, b in zip(cleaner_kernel.counters.snapshot(), before))
    assert c >= 80 and python == 0 and fallback == 0
    assert sum(len(decode_records(b.header, seg.read_bytes(b.position, b.size)[61:]))
               for seg in log.segments for b in seg.batches()) == 7
    log.close()


@pytest.mark.parametrize("key", [b"", b"a", b"user-0000123", b"s" * 19, b"t" * 20, b"x" * 31, b"y" * 32,
                                 bytes(range(256)) * 3])
def test_hash27_is_xxh64_with_seeds_0_to_3(key):
    expected = b"".join(xxhash.xxh64_intdigest(key, seed).to_bytes(8, "big") for seed in range(4))[:27]
    assert _c.hash27(key) == expected


# -- pass 1 ----------------------------------------------------------------------------------------


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_pass1_c_equals_python(data):
    h, body = data.draw(odd_batches(codecs=(0, 0, 1, 3)))
    m_c = data.draw(filled_maps(h, body))
    m_py = copy_map(m_c)
    start = h.base_offset + data.draw(st.integers(-2, 20))
    next_offset = start + data.draw(st.integers(0, 40))
    before = cleaner_kernel.counters.snapshot()
    got = run(cleaner_kernel.map_records, m_c, h, body, start, next_offset)
    c_ran = cleaner_kernel.counters.c > before[0]
    assert got == run(cleaner_kernel.map_records_py, m_py, h, body, start, next_offset)
    same_map(m_c, m_py)
    if not (h.attributes & 0x07):
        assert c_ran, "a valid uncompressed batch ran in Python"


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_pass1_weak_hash_takes_python_path(data):
    """A custom hash_fn (here one that sends every key to slot 0 with one digest) never reaches C."""
    h, body = data.draw(odd_batches(odd=False))
    weak = lambda key: bytes(27)  # noqa: E731
    m = OffsetMap(64 * SLOT_SIZE, hash_fn=weak)
    m.clear(h.base_offset)
    m_ref = copy_map(m)
    before = cleaner_kernel.counters.snapshot()
    assert cleaner_kernel.map_records(m, h, body, h.base_offset, h.base_offset + 100) == \
        cleaner_kernel.map_records_py(m_ref, h, body, h.base_offset, h.base_offset + 100)
    assert cleaner_kernel.counters.c == before[0]
    same_map(m, m_ref)


def test_pass1_stops_when_full_and_counts_the_record_that_found_it_full():
    recs = [Record(10 + i, 1000 + i, b"k%d" % i, b"v") for i in range(6)]
    h = BatchHeader.parse(encode_batch(recs))
    body = encode_batch(recs)[61:]
    m = kernel_map(3)  # max entries 2
    m.clear(10)
    assert cleaner_kernel.map_records(m, h, body, 10, 100) == (3, True)
    assert (m.size, m.latest_offset) == (2, 11)
    assert m.get(b"k0").offset == 10 and m.get(b"k1").offset == 11 and m.get(b"k2").offset == -1


# -- pass 2 ----------------------------------------------------------------------------------------


class KeyAt:
    """A resolver with a table of the keys at offsets (default: a key chosen by the offset), recording calls.

    Its answer follows the cleaner's contract: the offset itself if the key there is this key,
    else this key's own latest offset from `own` (default -1: the key is not in the range).
    """

    def __init__(self, table: dict[int, bytes | None], own: dict[bytes, int] | None = None) -> None:
        self.table = table
        self.own = own or {}
        self.calls: list[int] = []

    def key(self, offset: int) -> bytes | None:
        return self.table.get(offset, KEYS[offset % len(KEYS)])

    def __call__(self, offset: int, key: bytes) -> int:
        self.calls.append(offset)
        return offset if self.key(offset) == key else self.own.get(key, -1)


def _reference_retained(m: OffsetMap, h: BatchHeader, body, now: int, key_at, *, discard: bool, marker: bool,
                        delete_horizon: int):
    """The cleaner's record loop before the kernel: ("raw" | "none" | rebuilt batch bytes, invalid count)."""
    records = decode_records(h, body)
    invalid = 0

    def retain(r):
        nonlocal invalid
        if r.offset > m.latest_offset:
            return True
        if r.key is None:
            invalid += 1
            return False
        found = m.get(r.key)
        latest = found.offset
        if r.offset < latest and not found.verified:
            latest = key_at(latest, r.key)
        if r.offset < latest:
            return False
        if r.value is not None:
            return True
        return h.delete_horizon_ms is None or now < h.delete_horizon_ms

    kept, tombstones = [], False
    for r in records:
        if discard:
            continue
        if h.is_control or retain(r):
            kept.append(r)
            tombstones = tombstones or (r.value is None and not h.is_control)
    if len(kept) == len(records) and records and not ((tombstones or marker) and h.delete_horizon_ms is None):
        return "raw", invalid
    if not kept:
        return "none", invalid
    needs_horizon = (tombstones or marker) and h.delete_horizon_ms is None
    horizon = delete_horizon if needs_horizon else h.delete_horizon_ms
    return encode_batch(
        kept, base_offset=h.base_offset, compression=h.compression, timestamp_type=h.timestamp_type,
        producer_id=h.producer_id, producer_epoch=h.producer_epoch, base_sequence=h.base_sequence,
        partition_leader_epoch=h.partition_leader_epoch, is_transactional=h.is_transactional,
        is_control=h.is_control, delete_horizon_ms=horizon, last_offset_delta=h.last_offset_delta,
        max_timestamp=h.max_timestamp if h.timestamp_type is TimestampType.LOG_APPEND_TIME else None,
    ), invalid


def _outcome(h: BatchHeader, r: cleaner_kernel.Retained, marker: bool):
    """What the cleaner makes of a Retained: the reference's ("raw" | "none" | batch bytes)."""
    if r.kept == r.records and r.records and not ((r.tombstones or marker) and h.delete_horizon_ms is None):
        return "raw"
    if not r.kept:
        return "none"
    return cleaner_kernel.rebuild_batch(h, r)


def _pass2_args(data, h):
    now = data.draw(st.integers(0, 2**46))
    return dict(now=now, discard=data.draw(st.booleans()),
                marker=data.draw(st.booleans()) if h.is_control else False,
                delete_horizon=now + data.draw(st.sampled_from([0, 1, 86_400_000])))


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_pass2_c_equals_python_and_the_old_loop(data):
    h, body = data.draw(odd_batches(codecs=(0, 0, 0, 1, 2, 3, 4)))
    m = data.draw(filled_maps(h, body))
    # key_at's answers at the map's offsets: often the batch's own long keys (same key: drop), or others
    table = data.draw(st.dictionaries(st.integers(m.base_offset, m.base_offset + 80),
                                      st.none() | st.sampled_from(KEYS + _batch_keys(h, body)), max_size=40))
    args = _pass2_args(data, h)
    key_c, key_py, key_ref = KeyAt(table), KeyAt(table), KeyAt(table)
    got = run(cleaner_kernel.retain_records, m, h, body, key_at=key_c, **args)
    want = run(cleaner_kernel.retain_records_py, m, h, body, key_at=key_py, **args)
    assert got == want
    assert key_c.calls == key_py.calls
    reference = run(_reference_retained, m, h, body, key_at=key_ref, **args)
    if isinstance(want, cleaner_kernel.Retained):
        assert (_outcome(h, want, args["marker"]), want.invalid) == reference
    else:
        assert reference == want


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_pass2_canonical_batches_run_in_c(data):
    """Producer-encoded batches with ASCII header keys never fall back to Python."""
    h, body = data.draw(odd_batches(odd=False, codecs=(0, 3)))
    m = data.draw(filled_maps(h, body))
    args = _pass2_args(data, h)
    before = cleaner_kernel.counters.snapshot()
    got = cleaner_kernel.retain_records(m, h, body, key_at=KeyAt({}), **args)
    assert cleaner_kernel.counters.snapshot()[1:] == before[1:], "C gave the batch back to Python"
    assert got == cleaner_kernel.retain_records_py(m, h, body, key_at=KeyAt({}), **args)


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_extreme_values_agree(data):
    """Offsets and timestamps at the int64 edges: C gives up rather than wrap where Python would not."""
    h, body = data.draw(odd_batches(extreme=True))
    m = data.draw(filled_maps(h, body))
    m_py = copy_map(m)
    args = _pass2_args(data, h)
    assert run(cleaner_kernel.retain_records, m, h, body, key_at=KeyAt({}), **args) == \
        run(cleaner_kernel.retain_records_py, m, h, body, key_at=KeyAt({}), **args)
    start = h.base_offset
    assert run(cleaner_kernel.map_records, m, h, body, start, start + 50) == \
        run(cleaner_kernel.map_records_py, m_py, h, body, start, start + 50)
    same_map(m, m_py)


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
@example(data=None)
def test_corrupt_bodies_fail_alike(data):
    """Flip, cut or extend the records: both paths raise the same error or give the same result."""
    if data is None:  # hypothesis's explicit example: a record count far above what the body holds
        h = BatchHeader.parse(assemble(b"\x00", 2**31 - 1, base_offset=0, attributes=0, last_offset_delta=0,
                                       base_timestamp=0, max_timestamp=0))
        body = b"\x00"
        m = kernel_map(8)
        for fn in (cleaner_kernel.map_records, cleaner_kernel.map_records_py):
            with pytest.raises(CorruptRecordError):
                fn(m, h, body, 0, 10)
        return
    h, body = data.draw(odd_batches(codecs=(0,)))
    raw = bytearray(body)
    for _ in range(data.draw(st.integers(1, 3))):
        kind = data.draw(st.sampled_from(["flip", "cut", "extend", "count"]))
        if kind == "flip" and raw:
            i = data.draw(st.integers(0, len(raw) - 1))
            raw[i] = data.draw(st.integers(0, 255))
        elif kind == "cut" and raw:
            del raw[data.draw(st.integers(0, len(raw) - 1)):]
        elif kind == "extend":
            raw += data.draw(st.binary(min_size=1, max_size=4))
        elif kind == "count":
            h = BatchHeader.parse(_HEADER.pack(h.base_offset, h.batch_length, h.partition_leader_epoch, 2, h.crc,
                                               h.attributes, h.last_offset_delta, h.base_timestamp, h.max_timestamp,
                                               h.producer_id, h.producer_epoch, h.base_sequence,
                                               h.records_count + data.draw(st.integers(-2, 2))))
    body = bytes(raw)
    m = data.draw(filled_maps(h, body))
    m_py = copy_map(m)
    args = _pass2_args(data, h)
    assert run(cleaner_kernel.retain_records, m, h, body, key_at=KeyAt({}), **args) == \
        run(cleaner_kernel.retain_records_py, m, h, body, key_at=KeyAt({}), **args)
    assert run(cleaner_kernel.map_records, m, h, body, h.base_offset, h.base_offset + 60) == \
        run(cleaner_kernel.map_records_py, m_py, h, body, h.base_offset, h.base_offset + 60)
    same_map(m, m_py)


def test_long_key_digest_match_asks_for_the_real_key():
    """Long keys are matched by digest: C asks key_at, and keeps the record unless the key is the same."""
    long_key = b"long-key-" + b"z" * 30
    recs = [Record(5, 100, long_key, b"old"), Record(6, 101, b"short", b"old")]
    batch = encode_batch(recs)
    h = BatchHeader.parse(batch)
    m = kernel_map(64)
    m.clear(0)
    m.put(long_key, 9)
    m.put(b"short", 10)
    # Same key at 9: superseded. Another key at 9, this key's own latest elsewhere: later (7) drops it,
    # absent (-1) or this very record (5) keeps it.
    for answer, own, kept in ((long_key, {}, 0), (b"another key, same digest", {}, 1),
                              (b"another key, same digest", {long_key: 7}, 0),
                              (b"another key, same digest", {long_key: 5}, 1)):
        key_at = KeyAt({9: answer}, own)
        got = cleaner_kernel.retain_records(m, h, batch[61:], 0, key_at, delete_horizon=0)
        assert key_at.calls == [9] and got.kept == kept
        assert got == cleaner_kernel.retain_records_py(m, h, batch[61:], 0, KeyAt({9: answer}, own), delete_horizon=0)


# -- whole logs ------------------------------------------------------------------------------------


def _build_log(path: str, clock: FakeClock, seed: int) -> Log:
    """Several segments of mixed batches, appended as a follower would (unkeyed records get in too)."""
    rng = random.Random(seed)
    cfg = make_config({"cleanup.policy": "compact", "segment.bytes": 6000, "delete.retention.ms": 1000,
                       "index.interval.bytes": 500})
    log = Log(path, cfg, clock=clock)
    keys = [b"k%d" % i for i in range(12)] + [b"long-key-%d-" % i + b"z" * 25 for i in range(4)] + [b"", b"a\x00"]
    offset, pid = 0, 1000
    for _ in range(rng.randint(60, 90)):
        kind = rng.random()
        if kind < 0.1:  # an aborted or committed transaction of one producer
            pid += 1
            recs = [Record(offset + i, clock.now, rng.choice(keys), b"txn") for i in range(rng.randint(1, 4))]
            log.append(encode_batch(recs, producer_id=pid, producer_epoch=0, base_sequence=0, is_transactional=True),
                       assign_offsets=False)
            offset += len(recs)
            ctype = rng.choice([ControlType.ABORT, ControlType.COMMIT])
            marker = Record(offset, clock.now, encode_control_key(ctype), encode_end_txn_marker(0))
            log.append(encode_batch([marker], producer_id=pid, producer_epoch=0, is_transactional=True,
                                    is_control=True), assign_offsets=False)
            offset += 1
        else:
            n = rng.randint(1, 12)
            recs = []
            for _ in range(n):
                key = None if rng.random() < 0.03 else rng.choice(keys)
                value = None if rng.random() < 0.15 else bytes(rng.randrange(256) for _ in range(rng.randint(0, 30)))
                headers = ()
                if rng.random() < 0.1:
                    headers = (Header("h", b"x"), Header("idx", None))
                recs.append(Record(offset, clock.now + rng.randint(-5, 5), key, value, headers))
                offset += rng.randint(1, 2)  # follower appends may leave gaps (compacted upstream)
            codec = rng.choice([Compression.NONE] * 4 + [Compression.GZIP, Compression.LZ4, Compression.ZSTD,
                                                         Compression.SNAPPY])
            log.append(encode_batch(recs, compression=codec), assign_offsets=False)
            offset = recs[-1].offset + 1
        clock.sleep(rng.randint(0, 50))
    log.roll()
    return log


@pytest.mark.parametrize("seed, map_slots", [(1, 4096), (2, 4096), (3, 9), (4, 6)])
def test_whole_log_cleaned_byte_identically(tmp_path, monkeypatch, seed, map_slots):
    """Clean copies of one log pass after pass with C and with pure Python: the files stay identical."""
    clock_c, clock_py = FakeClock(), FakeClock()
    log_c = _build_log(str(tmp_path / "c" / "t-0"), clock_c, seed)
    log_c.close()
    shutil.copytree(tmp_path / "c", tmp_path / "py")
    log_c = Log(str(tmp_path / "c" / "t-0"), log_c.config, clock=clock_c)
    log_py = Log(str(tmp_path / "py" / "t-0"), log_c.config, clock=clock_py)
    clock_py.now = clock_c.now
    map_c = OffsetMap(map_slots * SLOT_SIZE)
    map_py = OffsetMap(map_slots * SLOT_SIZE, hash_fn=default_hash)
    assert cleaner_kernel.uses_c(map_c) and not cleaner_kernel.uses_c(map_py)
    dirty_c = dirty_py = 0
    for step in range(6):
        before = cleaner_kernel.counters.snapshot()
        end_c, stats_c = Cleaner(map_c, clock=clock_c).clean(
            LogToClean(log_c, dirty_c, log_c.active_segment.base_offset, 0, 1))
        c, python, _ = (a - b for a, b in zip(cleaner_kernel.counters.snapshot(), before))
        assert c > 0 and python == 0
        with monkeypatch.context() as mp:
            mp.setattr(cleaner_kernel, "_c", None)
            end_py, stats_py = Cleaner(map_py, clock=clock_py).clean(
                LogToClean(log_py, dirty_py, log_py.active_segment.base_offset, 0, 1))
        assert end_c == end_py
        for name in ("bytes_read", "bytes_written", "map_messages_read", "messages_read", "messages_written",
                     "invalid_messages"):
            assert getattr(stats_c, name) == getattr(stats_py, name), name
        log_c.delete_expired_files()
        log_py.delete_expired_files()
        assert dir_snapshot(str(tmp_path / "c")) == dir_snapshot(str(tmp_path / "py")), f"pass {step}"
        dirty_c = dirty_py = end_c if end_c < log_c.active_segment.base_offset else 0
        clock_c.sleep(700)
        clock_py.sleep(700)
    assert stats_c.messages_read > 0
    log_c.close()
    log_py.close()
    assert sorted(os.listdir(tmp_path / "c" / "t-0")) == sorted(os.listdir(tmp_path / "py" / "t-0"))
