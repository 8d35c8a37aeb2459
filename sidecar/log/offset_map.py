"""The cleaner's key → latest-offset map: Kafka's 24 bytes per slot, without Kafka's silent key loss.

Kafka's SkimpyOffsetMap keys slots on an MD5 digest, so two keys with one digest
share a slot and the older key's latest value is deleted. Here a slot keeps the key
itself when it fits (≤ 19 bytes, most keys: ids, names, numbers), so such keys are
compared exactly and can never be confused. A longer key is kept as a 19-byte
digest; the map then reports a match as *unverified* and the cleaner compares the
real key stored at the winning offset before it drops anything (`Cleaner`). A weak
or colliding hash therefore costs compaction, never data.

Slot layout (24 bytes, big-endian): offset delta + 1 (uint32, 0 = empty slot),
tag (0–19: inline key length, 0x80: digest), 19 key or digest bytes.

The hash (`hash_fn`, recorded on the map) picks the first slot and makes the digest. By
default it is the compiled cleaner kernel's `hash27` (four XXH64, see _cleaner_kernel.c), which
lets the C loops fill and read the map (cleaner_kernel.py); without the compiled module it is
BLAKE2b. A map with any other `hash_fn` is only ever used by the pure-Python code.
"""

from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass
from typing import Callable

SLOT_SIZE = 24
INLINE_MAX = 19
DIGEST_TAG = 0x80
MAX_DELTA = 2**32 - 2  # offsets of one pass must fit a uint32 delta from the pass base

_HEAD = struct.Struct(">IB")
_ZEROS = bytes(1 << 20)
_ZEROS_VIEW = memoryview(_ZEROS)

HashFn = Callable[[bytes], bytes]  # key -> at least 27 bytes: 8 for the slot position, 19 of digest


def default_hash(key: bytes) -> bytes:
    """BLAKE2b, 27 bytes: 8 pick the slot, 19 are the digest of a long key."""
    return hashlib.blake2b(key, digest_size=27).digest()


try:  # the C cleaner loops compute this hash themselves; a map made with it can use them
    from ._cleaner_kernel import hash27 as kernel_hash
except ImportError:
    kernel_hash = None


@dataclass(frozen=True, slots=True)
class Lookup:
    """What the map knows of a key: its latest offset, and whether that was matched by digest only."""

    offset: int  # -1: not in the map
    verified: bool


MISSING = Lookup(-1, True)


class OffsetMap:
    """Open addressing with linear probing over one preallocated bytearray."""

    def __init__(self, memory: int, load_factor: float = 0.9, hash_fn: HashFn | None = None) -> None:
        self.slots = memory // SLOT_SIZE
        if self.slots * load_factor <= 1:
            raise ValueError(f"offset map of {memory} bytes is too small to fit even a single message")
        self.max_entries = int(self.slots * load_factor)
        if hash_fn is None:
            hash_fn = kernel_hash or default_hash
        self.hash_fn = hash_fn  # the hash the map is filled with: only kernel_hash lets the C loops use it
        self.buf = bytearray(self.slots * SLOT_SIZE)
        self.base_offset = 0
        self.size = 0
        self.latest_offset = -1

    @property
    def hash_name(self) -> str:
        if self.hash_fn is kernel_hash:
            return "xxh64x4"
        if self.hash_fn is default_hash:
            return "blake2b"
        return getattr(self.hash_fn, "__name__", "custom")

    @property
    def memory_bytes(self) -> int:
        return len(self.buf)

    @property
    def utilization(self) -> float:
        return self.size / self.slots

    @property
    def is_full(self) -> bool:
        return self.size >= self.max_entries

    def clear(self, base_offset: int) -> None:
        """Empty the map for a pass whose offsets start at `base_offset`.

        Zeroed in place a chunk at a time, so that no second map-sized buffer raises the cleaner's peak memory.
        """
        buf = self.buf
        for pos in range(0, len(buf), len(_ZEROS)):
            end = min(pos + len(_ZEROS), len(buf))
            buf[pos:end] = _ZEROS_VIEW[: end - pos]
        self.base_offset = base_offset
        self.size = 0
        self.latest_offset = -1

    def can_hold(self, offset: int) -> bool:
        return 0 <= offset - self.base_offset <= MAX_DELTA

    def _stored_key(self, key: bytes) -> tuple[int, bytes, int]:
        """(tag, 19 stored bytes, first probe slot) for a key."""
        h = self.hash_fn(key)
        start = int.from_bytes(h[:8], "big") % self.slots
        if len(key) <= INLINE_MAX:
            return len(key), key.ljust(INLINE_MAX, b"\0"), start
        return DIGEST_TAG, h[8 : 8 + INLINE_MAX], start

    def _find(self, tag: int, stored: bytes, start: int) -> tuple[int, int]:
        """(slot, stored delta+1 or 0 if empty) of the key's slot or the empty slot where it would go.

        (-1, 0) when the key is absent and every slot is taken (load factor 1.0): probing stops after
        one lap, as Kafka's get does, instead of circling forever.
        """
        buf = self.buf
        slot = start
        for _ in range(self.slots):
            pos = slot * SLOT_SIZE
            delta1, slot_tag = _HEAD.unpack_from(buf, pos)
            if delta1 == 0 or (slot_tag == tag and buf[pos + 5 : pos + SLOT_SIZE] == stored):
                return slot, delta1
            slot += 1
            if slot == self.slots:
                slot = 0
        return -1, 0

    def put(self, key: bytes, offset: int) -> None:
        """Record `offset` as the key's latest; the caller stops the pass when `is_full`."""
        tag, stored, start = self._stored_key(key)
        slot, delta1 = self._find(tag, stored, start)
        pos = slot * SLOT_SIZE
        if delta1 == 0:
            if slot < 0 or self.size >= self.slots:
                raise OverflowError("offset map has no free slot")
            self.buf[pos + 5 : pos + SLOT_SIZE] = stored
            self.size += 1
        _HEAD.pack_into(self.buf, pos, offset - self.base_offset + 1, tag)
        self.latest_offset = offset

    def get(self, key: bytes) -> Lookup:
        """The key's latest offset; `verified=False` means only a digest matched (the key may differ)."""
        tag, stored, start = self._stored_key(key)
        _, delta1 = self._find(tag, stored, start)
        if delta1 == 0:
            return MISSING
        return Lookup(self.base_offset + delta1 - 1, tag != DIGEST_TAG)

    def update_latest_offset(self, offset: int) -> None:
        """Kafka's updateLatestOffset: the map covers the dirty range up to here even without a key at it."""
        self.latest_offset = offset
