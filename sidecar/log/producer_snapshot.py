"""Kafka's producer-state snapshot file (`<offset>.snapshot`), as pure encode/parse functions.

Layout (ProducerSnapshot.json, version 1, big-endian): version int16, CRC-32C uint32 over
everything after it, entry count int32, then 46-byte entries. The idempotent-producer
de-duplication of the sidecar restores its state from these files, and `shale dump-log`
prints them as Kafka's tool does.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Iterable

import crc32c

from .errors import LogError

SNAPSHOT_VERSION = 1
_HEAD = struct.Struct(">hIi")  # version, crc, count
_ENTRY = struct.Struct(">qhiqiqiq")
NO_TXN = -1


class CorruptSnapshotError(LogError):
    """A snapshot file with a bad version, CRC or length; Kafka deletes it and tries an older one."""


@dataclass(frozen=True, slots=True)
class ProducerEntry:
    """One producer's state: its last batch's sequence range and offsets, and its open transaction."""

    producer_id: int
    producer_epoch: int
    last_sequence: int
    last_offset: int
    offset_delta: int
    timestamp: int
    coordinator_epoch: int = -1
    current_txn_first_offset: int = NO_TXN

    @property
    def first_sequence(self) -> int:
        """Kafka's decrementSequence: sequences wrap past Int.MAX to 0."""
        return (self.last_sequence - self.offset_delta) % (1 << 31)

    @property
    def first_offset(self) -> int:
        return self.last_offset - self.offset_delta


def encode_snapshot(entries: Iterable[ProducerEntry]) -> bytes:
    body = bytearray(struct.pack(">i", 0))
    count = 0
    for e in entries:
        body += _ENTRY.pack(e.producer_id, e.producer_epoch, e.last_sequence, e.last_offset, e.offset_delta,
                            e.timestamp, e.coordinator_epoch, e.current_txn_first_offset)
        count += 1
    struct.pack_into(">i", body, 0, count)
    return struct.pack(">hI", SNAPSHOT_VERSION, crc32c.crc32c(bytes(body))) + bytes(body)


def parse_snapshot(data: bytes, name: str = "snapshot") -> list[ProducerEntry]:
    """Parse and verify a snapshot; any damage is a CorruptSnapshotError naming the file."""
    if len(data) < _HEAD.size:
        raise CorruptSnapshotError(f"{name}: {len(data)} bytes is shorter than the snapshot header")
    version, crc, count = _HEAD.unpack_from(data)
    if version != SNAPSHOT_VERSION:
        raise CorruptSnapshotError(f"{name}: snapshot contained an unknown file version {version}")
    computed = crc32c.crc32c(data[6:])
    if computed != crc:
        raise CorruptSnapshotError(f"{name}: snapshot is corrupt (CRC is no longer valid). Stored crc: {crc}. "
                                   f"Computed crc: {computed}")
    if count < 0 or len(data) != _HEAD.size + count * _ENTRY.size:
        raise CorruptSnapshotError(f"{name}: {count} entries do not match a file of {len(data)} bytes")
    return [ProducerEntry(*_ENTRY.unpack_from(data, _HEAD.size + i * _ENTRY.size)) for i in range(count)]


def format_entry(e: ProducerEntry) -> str:
    """Kafka's kafka-dump-log line for one snapshot entry."""
    txn = "OptionalLong.empty" if e.current_txn_first_offset < 0 else f"OptionalLong[{e.current_txn_first_offset}]"
    return (f"producerId: {e.producer_id} producerEpoch: {e.producer_epoch} coordinatorEpoch: {e.coordinator_epoch} "
            f"currentTxnFirstOffset: {txn} lastTimestamp: {e.timestamp} firstSequence: {e.first_sequence} "
            f"lastSequence: {e.last_sequence} lastOffset: {e.last_offset} offsetDelta: {e.offset_delta} "
            f"timestamp: {e.timestamp}")
