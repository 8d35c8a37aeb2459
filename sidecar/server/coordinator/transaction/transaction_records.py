"""Sans-I/O codec for the records of `__transaction_state`, in Apache Kafka's own byte layout.

Kafka's transaction coordinator keeps one compacted record per transactional id; the layouts are
`TransactionLogKey.json` / `TransactionLogValue.json` in `transaction-coordinator/src/main/resources/common/
message/`. The same bytes keep the topic readable by Kafka's tooling (`kafka-dump-log
--transaction-log-decoder`) and loadable by a Kafka broker, as `group/offset_records.py` does for
`__consumer_offsets`.

* key   = int16 0 (the coordinator record type) + TransactionLogKey{transactional_id: string}.
* value = int16 version + TransactionLogValue: producer_id int64, producer_epoch int16, timeout int32,
          status int8, partitions nullable [topic string, [partition int32]], last update int64, start int64.
          Version 1 is flexible (compact strings/arrays, tagged fields 0 previous producer id, 1 next producer
          id, 2 client transaction version; KIP-890). A null value is a tombstone (a removed id).

Kafka writes version 0 (transaction.version 1); version 1 is written here only to keep KIP-890 fields read
from a Kafka-written record. An Empty id is written with null partitions (as Kafka). Decoding refuses
truncated input, unknown versions and unknown states, and, like Kafka's readers, ignores trailing bytes.
"""

from __future__ import annotations

import struct

from ....log.message_reader import MessageReader
from ....log.varint import encode_uvarint
from .transaction_state import NO_PRODUCER_ID, TxnMetadata, TxnState

TRANSACTION_STATE_TOPIC = "__transaction_state"

KEY_VERSION = 0  # CoordinatorRecordType.TRANSACTION_LOG
MAX_VALUE_VERSION = 1

_I8, _I16, _I32, _I64 = struct.Struct(">b"), struct.Struct(">h"), struct.Struct(">i"), struct.Struct(">q")
_TAG_PREVIOUS_PRODUCER_ID, _TAG_NEXT_PRODUCER_ID, _TAG_CLIENT_TRANSACTION_VERSION = 0, 1, 2


class TransactionRecordError(ValueError):
    """Bytes that are not a valid `__transaction_state` key or value."""


def _string(s: str, flexible: bool) -> bytes:
    raw = s.encode("utf-8")
    if len(raw) > 0x7FFF:
        raise TransactionRecordError(f"string of {len(raw)} bytes: Kafka strings hold at most 32767 ({s[:40]!r}...)")
    return (encode_uvarint(len(raw) + 1) if flexible else _I16.pack(len(raw))) + raw


def _array_length(n: int, flexible: bool) -> bytes:
    return encode_uvarint(n + 1) if flexible else _I32.pack(n)


# -- key --------------------------------------------------------------------------------------------------------


def encode_key(transactional_id: str) -> bytes:
    return _I16.pack(KEY_VERSION) + _string(transactional_id, False)


def decode_key(data: bytes | memoryview) -> str | None:
    """The transactional id, or None for a record of another coordinator type (skipped on load, as Kafka)."""
    r = MessageReader(data, "__transaction_state key", TransactionRecordError)
    if r.int16() != KEY_VERSION:
        return None
    return r.string(False, "TransactionalId")


# -- value ------------------------------------------------------------------------------------------------------


def _has_tagged_fields(meta: TxnMetadata) -> bool:
    return (meta.previous_producer_id != NO_PRODUCER_ID or meta.next_producer_id != NO_PRODUCER_ID
            or meta.client_transaction_version != 0)


def encode_value(meta: TxnMetadata) -> bytes | None:
    """The record value of `meta`: None (a tombstone) for Dead; version 0 unless KIP-890 fields are set."""
    if meta.state == TxnState.DEAD:
        return None
    version = 1 if _has_tagged_fields(meta) else 0
    flexible = version == 1
    parts = [_I16.pack(version), _I64.pack(meta.producer_id), _I16.pack(meta.producer_epoch),
             _I32.pack(meta.timeout_ms), _I8.pack(int(meta.state))]
    if meta.state == TxnState.EMPTY:
        parts.append(b"\x00" if flexible else _I32.pack(-1))  # null, as Kafka writes an Empty id
    else:
        by_topic: dict[str, list[int]] = {}
        for topic, partition in sorted(meta.partitions):
            by_topic.setdefault(topic, []).append(partition)
        parts.append(_array_length(len(by_topic), flexible))
        for topic, partitions in by_topic.items():
            parts.append(_string(topic, flexible))
            parts.append(_array_length(len(partitions), flexible))
            parts.extend(_I32.pack(p) for p in partitions)
            if flexible:
                parts.append(b"\x00")
    parts += [_I64.pack(meta.last_update_timestamp_ms), _I64.pack(meta.start_timestamp_ms)]
    if flexible:
        tags = [(tag, body) for tag, body, default in (
            (_TAG_PREVIOUS_PRODUCER_ID, _I64.pack(meta.previous_producer_id), meta.previous_producer_id == -1),
            (_TAG_NEXT_PRODUCER_ID, _I64.pack(meta.next_producer_id), meta.next_producer_id == -1),
            (_TAG_CLIENT_TRANSACTION_VERSION, _I16.pack(meta.client_transaction_version),
             meta.client_transaction_version == 0)) if not default]
        parts.append(encode_uvarint(len(tags)))
        for tag, body in tags:
            parts += [encode_uvarint(tag), encode_uvarint(len(body)), body]
    return b"".join(parts)


def decode_value(transactional_id: str, data: bytes | memoryview | None) -> TxnMetadata | None:
    """The metadata stored for `transactional_id`, or None for a tombstone.

    As Kafka's readTxnRecordValue, the partitions of an Empty id are ignored and the last producer epoch
    (memory only) starts unknown.
    """
    if data is None:
        return None
    what = f"__transaction_state value of transactional id {transactional_id!r}"
    r = MessageReader(data, what, TransactionRecordError)
    version = r.int16()
    if not 0 <= version <= MAX_VALUE_VERSION:
        raise TransactionRecordError(f"{what}: unknown value version {version}")
    flexible = version == 1
    producer_id, epoch, timeout_ms, status = r.int64(), r.int16(), r.int32(), r.int8()
    try:
        state = TxnState(status)
    except ValueError:
        raise TransactionRecordError(f"{what}: unknown transaction status {status}") from None
    partitions: set[tuple[str, int]] = set()
    for _ in range(max(r.array_length(flexible, "TransactionPartitions", nullable=True), 0)):
        topic = r.string(flexible, "Topic")
        partitions.update((topic, r.int32()) for _ in range(r.array_length(flexible, "PartitionIds")))
        if flexible:
            r.skip_tagged_fields()
    last_update, start = r.int64(), r.int64()
    tagged = {_TAG_PREVIOUS_PRODUCER_ID: NO_PRODUCER_ID, _TAG_NEXT_PRODUCER_ID: NO_PRODUCER_ID,
              _TAG_CLIENT_TRANSACTION_VERSION: 0}
    if flexible:
        for _ in range(r.uvarint()):
            tag, size = r.uvarint(), r.uvarint()
            field = MessageReader(r.raw(size), f"{what}, tagged field {tag}", TransactionRecordError)
            if tag in (_TAG_PREVIOUS_PRODUCER_ID, _TAG_NEXT_PRODUCER_ID):
                tagged[tag] = field.int64()
            elif tag == _TAG_CLIENT_TRANSACTION_VERSION:
                tagged[tag] = field.int16()
    if state == TxnState.EMPTY:
        partitions.clear()
    return TxnMetadata(transactional_id, producer_id, epoch, timeout_ms, state, frozenset(partitions), start,
                       last_update, previous_producer_id=tagged[_TAG_PREVIOUS_PRODUCER_ID],
                       next_producer_id=tagged[_TAG_NEXT_PRODUCER_ID],
                       client_transaction_version=tagged[_TAG_CLIENT_TRANSACTION_VERSION])
