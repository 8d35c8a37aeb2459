"""The cleaner's offset map under hash collisions, and its unit behaviour (spec 7.1, 7.4, 7.5).

Kafka's SkimpyOffsetMap keys each slot on an MD5 digest only, so two keys with one digest share
a slot and the older key's latest value is compacted away. Shale's map stores keys of at most 19
bytes inline (compared exactly) and longer keys as a 19-byte digest that the cleaner verifies by
reading the real key at the winning offset. Here the map gets a deliberately weak hash, so that
thousands of keys share slots and digests, and the compacted log must still hold every key's
latest value. A ten-line Kafka-style digest-only map, run on the same records with the same
hash, does lose keys: the check can fail.
"""

from __future__ import annotations

import hashlib
import random
from collections import Counter

import pytest

from shale.sidecar.log.cleaner import Cleaner, LogToClean
from shale.sidecar.log.log import Log
from shale.sidecar.log.offset_map import INLINE_MAX, SLOT_SIZE, OffsetMap, default_hash
from shale.sidecar.log.records import Record, encode_batch
from support.logtest_util import FakeClock, all_records, make_config

pytestmark = pytest.mark.timeout(120)  # a map that probes forever must fail fast, not at the 600 s default


# -- weak hashes: hash_fn(key) -> 27 bytes, the first 8 pick the slot, the next 19 are a long key's digest --

def md5_one_byte(key: bytes) -> bytes:
    """256 values: the first MD5 byte, repeated (so 256 start slots and 256 digests)."""
    return hashlib.md5(key).digest()[:1] * 27


def sixteen_values(key: bytes) -> bytes:
    """16 values: 16 start slots and 16 digests for any number of keys."""
    return bytes([hashlib.md5(key).digest()[0] & 0x0F]) * 27


def constant(key: bytes) -> bytes:
    """Every key starts in the same slot with the same digest."""
    return bytes(27)


def digest_of(hash_fn, key: bytes) -> bytes:
    return hash_fn(key)[8:27]


def start_slot(hash_fn, key: bytes, slots: int) -> int:
    return int.from_bytes(hash_fn(key)[:8], "big") % slots


# -- OffsetMap unit tests ------------------------------------------------------------------------

def test_put_get_inline_and_digest_keys() -> None:
    m = OffsetMap(24 * 100)
    assert m.get(b"absent").offset == -1
    m.put(b"short", 5)
    m.put(b"x" * 40, 7)
    assert (m.get(b"short").offset, m.get(b"short").verified) == (5, True), "an inline key is compared exactly"
    assert (m.get(b"x" * 40).offset, m.get(b"x" * 40).verified) == (7, False), "a digest match is unverified"
    assert m.get(b"shor").offset == -1 and m.get(b"x" * 41).offset == -1
    assert m.size == 2 and m.latest_offset == 7


def test_update_keeps_the_latest_offset_and_size() -> None:
    m = OffsetMap(24 * 100)
    for off in (3, 9, 12):
        m.put(b"k", off)
    assert m.get(b"k").offset == 12 and m.size == 1 and m.latest_offset == 12
    m.put(b"other", 13)
    m.put(b"k", 20)
    assert (m.get(b"k").offset, m.get(b"other").offset, m.size) == (20, 13, 2)
    m.update_latest_offset(25)  # Kafka's updateLatestOffset: the map covers offsets past its last key
    assert m.latest_offset == 25 and m.get(b"k").offset == 20


def test_inline_keys_are_exact_even_in_one_slot() -> None:
    """With a constant hash every key probes the same slots; NUL padding must not merge keys."""
    m = OffsetMap(24 * 64, hash_fn=constant)
    keys = [b"", b"\x00", b"a", b"a\x00", b"a\x00\x00", b"s" * INLINE_MAX, b"s" * (INLINE_MAX - 1) + b"\x00"]
    for i, k in enumerate(keys):
        m.put(k, 100 + i)
    assert m.size == len(keys)
    for i, k in enumerate(keys):
        assert m.get(k).offset == 100 + i and m.get(k).verified, k
    assert m.get(b"b").offset == -1


def test_long_keys_with_one_digest_share_an_entry_unverified() -> None:
    """What the cleaner must guard against: two long keys with one digest are one map entry."""
    m = OffsetMap(24 * 64, hash_fn=constant)
    a, b = b"A" * (INLINE_MAX + 1), b"B" * 30
    m.put(a, 1)
    m.put(b, 2)
    assert m.size == 1
    assert (m.get(a).offset, m.get(a).verified) == (2, False)
    assert m.get(b"C" * INLINE_MAX).offset == -1, "an inline key never matches a digest"


def test_probing_wraps_around_the_end() -> None:
    last = lambda key: (7).to_bytes(8, "big") + hashlib.md5(key).digest()[:19]  # noqa: E731 - start at slot 7 of 8
    m = OffsetMap(24 * 8, load_factor=1.0, hash_fn=last)
    keys = [b"k%d" % i for i in range(8)]
    for i, k in enumerate(keys):
        m.put(k, i)
    assert [m.get(k).offset for k in keys] == list(range(8))
    assert m.utilization == 1.0


def test_memory_is_24_bytes_per_slot_and_max_entries() -> None:
    for memory in (48, 49, 71, 72, 24 * 11, 1000, 24 * 1000 + 23, 1 << 20):
        m = OffsetMap(memory)
        assert m.slots == memory // SLOT_SIZE
        assert m.memory_bytes == 24 * m.slots
        assert m.max_entries == int(m.slots * 0.9)
    for lf in (0.5, 0.75, 1.0):
        m = OffsetMap(24 * 1001, load_factor=lf)
        assert m.max_entries == int(1001 * lf)
    with pytest.raises(ValueError):
        OffsetMap(24)  # 1 slot * 0.9 <= 1: "too small to fit even a single message"
    with pytest.raises(ValueError):
        OffsetMap(47)


def test_kafka_default_buffer_sizes_and_bytes_per_key() -> None:
    """128 MiB, 1 thread: 5,592,405 slots and 5,033,164 keys per pass (spec 7.1), <= 27 bytes per key."""
    m = OffsetMap(128 * 1024 * 1024)
    assert (m.slots, m.max_entries) == (5_592_405, 5_033_164)
    for memory in (m.memory_bytes, 24 * 10, 24 * 1000, 24 * 99_999, 1 << 20, 16 << 20):
        mm = m if memory == m.memory_bytes else OffsetMap(memory)
        assert mm.memory_bytes / mm.max_entries <= 27.0, memory
    del m


def test_full_map_and_utilization() -> None:
    m = OffsetMap(24 * 10)
    assert (m.slots, m.max_entries) == (10, 9)
    for i in range(9):
        assert not m.is_full
        m.put(b"k%d" % i, i)
        assert m.utilization == (i + 1) / 10
    assert m.is_full and m.size == 9
    m.put(b"k3", 30)  # a known key still updates (the cleaner stops before this, as Kafka does)
    assert m.size == 9 and m.get(b"k3").offset == 30
    m.put(b"k9", 9)  # the last free slot
    assert m.size == 10 and m.utilization == 1.0
    with pytest.raises(OverflowError):
        m.put(b"one too many", 11)
    assert [m.get(b"k%d" % i).offset for i in range(10)] == [0, 1, 2, 30, 4, 5, 6, 7, 8, 9]


@pytest.mark.timeout(60)
def test_lookups_in_a_completely_full_map_end() -> None:
    """Load factor 1.0 lets every slot fill; a lookup of an absent key must stop after one lap."""
    m = OffsetMap(24 * 4, load_factor=1.0, hash_fn=constant)
    for i in range(4):
        m.put(b"k%d" % i, i)
    assert m.is_full and m.utilization == 1.0
    assert m.get(b"absent").offset == -1 and m.get(b"L" * 30).offset == -1
    with pytest.raises(OverflowError):
        m.put(b"absent", 9)
    assert [m.get(b"k%d" % i).offset for i in range(4)] == [0, 1, 2, 3]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("hash_fn", [None, default_hash], ids=["default-map", "blake2b-pure-python"])
def test_cleaning_with_a_completely_full_map(tmp_path, hash_fn) -> None:
    """log.cleaner.io.buffer.load.factor=1.0: the map fills every slot, and the clean section's keys are
    looked up in it (they are absent) — the pass must finish, keeping them."""
    clock = FakeClock()
    cfg = make_config({"cleanup.policy": "compact", "min.cleanable.dirty.ratio": 0.0})
    log = Log(str(tmp_path / "full-0"), cfg, clock=clock)
    written: dict[int, tuple[bytes, bytes | None]] = {}
    write(log, clock, written, [(b"clean-%d" % i, b"c") for i in range(3)])  # offsets 0-2: the clean section
    # offsets 3-14: k0 k0 k1 k1 k2 k2 k3 k3 k0 k0 k1 k1
    write(log, clock, written, [(b"k%d" % (i // 2 % 4), b"v%d" % i) for i in range(12)])
    log.roll()
    offset_map = OffsetMap(24 * 4, load_factor=1.0, hash_fn=hash_fn)
    end = clean(log, offset_map, clock, 3)
    assert offset_map.size == offset_map.slots == 4
    # Kafka checks `map.size < maxDesiredMapSize` before every put, of a known key too: the pass stops
    # at the second k3 (offset 10), once the first filled the map.
    assert end == 10
    kept = log_view(log)
    assert sorted(kept) == [0, 1, 2, 4, 6, 8, 9, 10, 11, 12, 13, 14], "clean section kept, [3, 10) compacted"


def test_clear_and_base_offset() -> None:
    m = OffsetMap(24 * 10)
    m.put(b"a", 3)
    m.put(b"b" * 30, 4)
    m.clear(1000)
    assert (m.size, m.latest_offset, m.utilization) == (0, -1, 0.0)
    assert m.get(b"a").offset == -1 and m.get(b"b" * 30).offset == -1
    assert bytes(m.buf) == bytes(m.memory_bytes)
    assert not m.can_hold(999) and m.can_hold(1000)
    assert m.can_hold(1000 + 2**32 - 2) and not m.can_hold(1000 + 2**32 - 1)
    m.put(b"a", 1000 + 2**32 - 2)
    m.put(b"c", 1000)
    assert m.get(b"a").offset == 1000 + 2**32 - 2 and m.get(b"c").offset == 1000


# -- the cleaner under a weak hash ---------------------------------------------------------------

SHORT_KEYS = [b"s%018d" % i for i in range(1500)]  # 19 bytes: the longest inline key
LONG_KEYS = [b"L%019d" % i for i in range(750)] + [b"long-key-%06d-" % i + b"p" * (4 + i % 40) for i in range(750)]
assert all(len(k) == INLINE_MAX for k in SHORT_KEYS) and all(len(k) > INLINE_MAX for k in LONG_KEYS)


def build_log(path: str, clock: FakeClock, seed: int = 7):
    """A compacted log of ~3000 keys (half inline, half digest), written ~2.5 times each, 15% tombstones."""
    cfg = make_config({"cleanup.policy": "compact", "segment.bytes": 48 * 1024, "delete.retention.ms": 1000,
                       "min.cleanable.dirty.ratio": 0.0, "file.delete.delay.ms": 0})
    log = Log(path, cfg, clock=clock)
    rng = random.Random(seed)
    written: dict[int, tuple[bytes, bytes | None]] = {}
    keys = SHORT_KEYS + LONG_KEYS
    for round_ in range(4):
        todo = [k for k in keys if round_ == 0 or rng.random() < 0.5]
        rng.shuffle(todo)
        items = [(k, None if round_ and rng.random() < 0.15 else b"v%d-%d" % (round_, rng.randrange(10**6)))
                 for k in todo]
        write(log, clock, written, items)
    log.roll()
    return log, written


def write(log, clock, written, items) -> None:
    for i in range(0, len(items), 50):
        chunk = items[i : i + 50]
        clock.sleep(1)
        info = log.append(encode_batch([Record(j, clock.now, k, v) for j, (k, v) in enumerate(chunk)]))
        for j, (k, v) in enumerate(chunk):
            written[info.first_offset + j] = (k, v)


def latest_by_key(written) -> dict[bytes, int]:
    latest = {}
    for o in sorted(written):
        latest[written[o][0]] = o
    return latest


def lost_keys(kept: dict[int, tuple[bytes, bytes | None]], written) -> list[bytes]:
    """Keys whose latest value is not in `kept` (offset -> (key, value)) at its offset (tombstones may go)."""
    lost = []
    for k, o in latest_by_key(written).items():
        if written[o][1] is not None and kept.get(o) != written[o]:
            lost.append(k)
    return lost


def log_view(log) -> dict[int, tuple[bytes, bytes | None]]:
    return {r.offset: (r.key, r.value) for r in all_records(log)}


def clean(log, offset_map: OffsetMap, clock, first_dirty: int) -> int:
    upper = log.active_segment.base_offset
    clean_bytes = sum(s.size for s in log.segments if s.base_offset < first_dirty)
    ltc = LogToClean(log, first_dirty, upper, clean_bytes, log.size_in_bytes - clean_bytes)
    end, _stats = Cleaner(offset_map, clock=clock).clean(ltc)
    return end


@pytest.mark.parametrize("hash_fn", [md5_one_byte, sixteen_values], ids=["md5-first-byte", "16-values"])
def test_weak_hash_loses_no_key(tmp_path, hash_fn) -> None:
    clock = FakeClock()
    log, written = build_log(str(tmp_path / "weak-0"), clock)
    latest = latest_by_key(written)
    long_set = set(LONG_KEYS)
    slots = 1 << 16
    offset_map = OffsetMap(SLOT_SIZE * slots, hash_fn=hash_fn)

    # The collisions this hash causes: keys whose first slot another key already starts at, and long
    # keys whose digest another long key has (the map cannot tell those apart).
    starts = Counter(start_slot(hash_fn, k, slots) for k in latest)
    slot_collisions = sum(n - 1 for n in starts.values())
    digests = Counter(digest_of(hash_fn, k) for k in LONG_KEYS)
    digest_collisions = sum(n - 1 for n in digests.values())

    end = clean(log, offset_map, clock, 0)
    assert end == log.active_segment.base_offset == max(written) + 1, "one pass took the whole dirty section"
    kept = log_view(log)
    assert lost_keys(kept, written) == [], "a key's latest value was lost to a collision"
    for o, rec in kept.items():
        assert written[o] == rec
    for k, o in latest.items():
        assert kept.get(o) == written[o], "in the first pass every latest record survives, tombstones too"

    # Collisions that occurred in the map: long keys for which it answered with another key's offset.
    merged = [k for k in LONG_KEYS if offset_map.get(k).offset != latest[k]]
    assert all(not offset_map.get(k).verified for k in LONG_KEYS)
    assert all(offset_map.get(k).offset == latest[k] and offset_map.get(k).verified for k in SHORT_KEYS), \
        "inline keys are exact however badly they collide"
    assert slot_collisions >= 1000 and digest_collisions >= 1000 and len(merged) >= 1000, \
        (slot_collisions, digest_collisions, len(merged))

    # No compaction is lost to the collisions either: once a digest is seen to be shared, the cleaner
    # learns each long key's own latest offset (one walk of the range), so every key, inline or long,
    # keeps exactly its latest record — what Kafka's rule keeps with a perfect hash.
    by_key = Counter(k for k, _v in written.values())
    kept_long = sum(1 for k, _v in kept.values() if k in long_set)
    kept_short = sum(1 for k, _v in kept.values() if k not in long_set)
    assert kept_short == len(SHORT_KEYS), "no compaction is lost on inline keys"
    assert kept_long == len(LONG_KEYS), "no compaction is lost on long keys"
    long_records = sum(by_key[k] for k in LONG_KEYS)
    assert long_records > len(LONG_KEYS), "the workload has superseded long-key records to drop"
    print(f"\n[{hash_fn.__name__}] keys: {len(SHORT_KEYS)} inline + {len(LONG_KEYS)} digest, {len(written)} records; "
          f"start-slot collisions {slot_collisions}, digest collisions {digest_collisions}, long keys answered with "
          f"another key's offset {len(merged)}; long-key records kept {kept_long} of {long_records} (Kafka's rule "
          f"with a perfect hash keeps {len(LONG_KEYS)}): no compaction lost")

    # Later passes: more writes, then tombstones past their horizon go; still no live key is lost.
    for _ in range(2):
        clock.sleep(1500)
        rng = random.Random(end)
        write(log, clock, written, [(k, b"late-%d" % end) for k in rng.sample(SHORT_KEYS + LONG_KEYS, 200)])
        log.roll()
        end = clean(log, OffsetMap(SLOT_SIZE * slots, hash_fn=hash_fn), clock, end)
        kept = log_view(log)
        assert lost_keys(kept, written) == []
        assert all(written[o] == rec for o, rec in kept.items())
    latest = latest_by_key(written)
    deleted = [o for o in latest.values() if written[o][1] is None]
    assert deleted and any(o not in kept for o in deleted), "some tombstones past their horizon were removed"


def kafka_style_clean(written, hash_fn) -> dict[int, tuple[bytes, bytes | None]]:
    """Kafka's SkimpyOffsetMap + shouldRetainRecord, digest only (one pass, tombstones still retained)."""
    latest_by_digest: dict[bytes, int] = {}
    for o in sorted(written):
        latest_by_digest[hash_fn(written[o][0])[8:27]] = o
    return {o: rec for o, rec in written.items() if o >= latest_by_digest[hash_fn(rec[0])[8:27]]}


@pytest.mark.parametrize("hash_fn", [md5_one_byte, sixteen_values], ids=["md5-first-byte", "16-values"])
def test_a_kafka_style_digest_map_would_lose_keys(tmp_path, hash_fn) -> None:
    """The same records, the same hash, Kafka's digest-only map: the checker above reports lost keys."""
    clock = FakeClock()
    log, written = build_log(str(tmp_path / "weak-0"), clock)
    lost = lost_keys(kafka_style_clean(written, hash_fn), written)
    assert len(lost) >= 100, len(lost)
    assert any(len(k) <= INLINE_MAX for k in lost) and any(len(k) > INLINE_MAX for k in lost)
    # With a strong digest the reference loses nothing (so the loss above is the collisions').
    assert lost_keys(kafka_style_clean(written, default_hash), written) == []
    # And Shale, on that very log and hash, loses none of them.
    clean(log, OffsetMap(SLOT_SIZE * (1 << 16), hash_fn=hash_fn), clock, 0)
    assert lost_keys(log_view(log), written) == []


def test_weak_hash_never_resurrects_a_deleted_key(tmp_path) -> None:
    """A consumer of the compacted log must see each key's latest value, or nothing if it was deleted.

    Two long keys share a digest. `a` is written, then deleted; `b` (same digest) is written last,
    so the map entry of the digest is `b`'s. The cleaner cannot prove that `a`'s old value is
    superseded (the winner's key is `b`), so it keeps it — and keeps `a`'s tombstone, which then
    gets a delete horizon. In a later pass `a` is not in the map at all, the tombstone is past its
    horizon and goes: `a`'s old value is visible again. Kafka's rule relies on every older record of
    a key being gone by the time its tombstone's horizon passes.
    """
    clock = FakeClock()
    cfg = make_config({"cleanup.policy": "compact", "delete.retention.ms": 100, "min.cleanable.dirty.ratio": 0.0})
    log = Log(str(tmp_path / "resurrect-0"), cfg, clock=clock)
    a = LONG_KEYS[0]
    b = next(k for k in LONG_KEYS[1:] if digest_of(md5_one_byte, k) == digest_of(md5_one_byte, a))
    c = next(k for k in LONG_KEYS[1:] if digest_of(md5_one_byte, k) != digest_of(md5_one_byte, a))
    written: dict[int, tuple[bytes, bytes | None]] = {}
    write(log, clock, written, [(a, b"old value of a")])
    write(log, clock, written, [(a, None)])
    write(log, clock, written, [(b, b"b")])
    log.roll()
    end = clean(log, OffsetMap(SLOT_SIZE * 64, hash_fn=md5_one_byte), clock, 0)
    for _ in range(3):
        clock.sleep(1000)
        write(log, clock, written, [(c, b"c%d" % end)])
        log.roll()
        end = clean(log, OffsetMap(SLOT_SIZE * 64, hash_fn=md5_one_byte), clock, end)
    view: dict[bytes, bytes | None] = {}
    for r in all_records(log):
        view[r.key] = r.value
    truth = {written[o][0]: written[o][1] for o in sorted(written)}
    assert view.get(a) is None, f"deleted key resurrected with {view.get(a)!r}"
    assert {k: v for k, v in view.items() if v is not None} == {k: v for k, v in truth.items() if v is not None}
