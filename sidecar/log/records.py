"""Kafka record batches, magic v2: pure functions from bytes to values and back.

The batch header is parsed on its own (`BatchHeader.parse`) so that the hot paths —
append, recovery, fetch — never decode records; records are decoded only when
someone needs keys and values (the cleaner, dump-log, tests).
"""

from __future__ import annotations

import enum
import struct
from dataclasses import dataclass, field, fields
from typing import Iterable, Sequence, cast

import crc32c

from .compression import Compression, compress, decompress
from .errors import CorruptRecordError, InvalidRecordError, InvalidTimestampError
from .varint import decode_varint, decode_varlong, encode_varint

try:  # the C walks of check_records (the append's kernel) and decode_columns (the columns'); pure Python otherwise
    from ._append_kernel import records_check as _records_check
    from ._columns_kernel import records_columns as _records_columns
except ImportError:  # pragma: no cover - a checkout without the compiled extension
    _records_check = _records_columns = None

MAGIC = 2
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
LOG_OVERHEAD = 12  # baseOffset int64 + batchLength int32
BATCH_OVERHEAD = 61  # the whole v2 header, through recordsCount
HEADER_SIZE_UP_TO_MAGIC = 17  # a reader needs this many bytes to see the magic
MIN_ENTRY_SIZE = 14  # Kafka's RECORD_OVERHEAD_V0: a smaller batchLength is corrupt

NO_TIMESTAMP = -1
NO_PRODUCER_ID = -1
NO_PRODUCER_EPOCH = -1
NO_SEQUENCE = -1
NO_PARTITION_LEADER_EPOCH = -1

CRC_START = 21  # the CRC covers [21, end): attributes through the last record byte
_HEADER = struct.Struct(">qiibIhiqqqhii")
_BASE_OFFSET = struct.Struct(">q")
_INT16 = struct.Struct(">h")
_INT32 = struct.Struct(">i")

COMPRESSION_MASK = 0x07
TIMESTAMP_TYPE_BIT = 0x08
TRANSACTIONAL_BIT = 0x10
CONTROL_BIT = 0x20
DELETE_HORIZON_BIT = 0x40


class TimestampType(enum.IntEnum):
    CREATE_TIME = 0
    LOG_APPEND_TIME = 1

    @property
    def kafka_name(self) -> str:
        return "CreateTime" if self is TimestampType.CREATE_TIME else "LogAppendTime"


class ControlType(enum.IntEnum):
    """The type in a control record's key; Kafka reads anything else as UNKNOWN."""

    UNKNOWN = -1
    ABORT = 0
    COMMIT = 1
    LEADER_CHANGE = 2
    SNAPSHOT_HEADER = 3
    SNAPSHOT_FOOTER = 4
    KRAFT_VERSION = 5
    KRAFT_VOTERS = 6


@dataclass(slots=True, unsafe_hash=True)
class BatchHeader:
    """The fixed 61 bytes at the start of every v2 batch.

    Not frozen, though nothing changes one: a frozen dataclass's `__init__` sets each of the 13 fields
    through `object.__setattr__` (~1.2 µs a header against ~0.3), and every produced batch, fetch, lookup
    and recovery parses headers. Hashable as the frozen class was.
    """

    base_offset: int
    batch_length: int
    partition_leader_epoch: int
    magic: int
    crc: int
    attributes: int
    last_offset_delta: int
    base_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    records_count: int

    @classmethod
    def parse(cls, buf: bytes | memoryview, pos: int = 0) -> "BatchHeader":
        """Parse the header at `pos`; the caller has checked that 61 bytes are there."""
        return cls(*_HEADER.unpack_from(buf, pos))

    @property
    def size(self) -> int:
        """Bytes of the whole batch, header included."""
        return LOG_OVERHEAD + self.batch_length

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.last_offset_delta

    @property
    def next_offset(self) -> int:
        return self.last_offset + 1

    @property
    def compression(self) -> Compression:
        return Compression.from_attributes(self.attributes)

    @property
    def timestamp_type(self) -> TimestampType:
        return TimestampType((self.attributes & TIMESTAMP_TYPE_BIT) >> 3)

    @property
    def is_transactional(self) -> bool:
        return bool(self.attributes & TRANSACTIONAL_BIT)

    @property
    def is_control(self) -> bool:
        return bool(self.attributes & CONTROL_BIT)

    @property
    def delete_horizon_ms(self) -> int | None:
        """Kafka 3.1+ stores the tombstone delete horizon in baseTimestamp when bit 6 is set."""
        return self.base_timestamp if self.attributes & DELETE_HORIZON_BIT else None

    @property
    def last_sequence(self) -> int:
        """Kafka's `incrementSequence`: wraps past Int.MAX to 0."""
        if self.base_sequence == NO_SEQUENCE:
            return NO_SEQUENCE
        return (self.base_sequence + self.last_offset_delta) % (1 << 31)


assert len(fields(BatchHeader)) == len(_HEADER.unpack(bytes(_HEADER.size)))


@dataclass(frozen=True, slots=True)
class Header:
    key: str
    value: bytes | None


@dataclass(frozen=True, slots=True)
class Record:
    """One record with absolute offset and timestamp (deltas are a wire detail)."""

    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: tuple[Header, ...] = ()
    sequence: int = NO_SEQUENCE


@dataclass(frozen=True, slots=True)
class RecordBatch:
    header: BatchHeader
    records: tuple[Record, ...] = field(default=())


def compute_crc(batch: bytes | bytearray | memoryview) -> int:
    """CRC-32C over attributes through the last record byte, as Kafka computes it."""
    return crc32c.crc32c(memoryview(batch)[CRC_START:])


def _at(where: str) -> str:
    """The ` (where)` suffix of an error message, empty without a where."""
    return f" ({where})" if where else ""


_LAST_CODEC = int(Compression.ZSTD)  # a plain int: an enum member's lookup costs more than the check


def check_batch(batch: bytes | memoryview, where: str = "") -> BatchHeader:
    """Validate one whole batch (size, magic, declared length, CRC) and return its header.

    `where` names the topic-partition/file/position for the error message (formatted only for one:
    every produced and recovered batch comes through here).
    """
    if len(batch) < BATCH_OVERHEAD:
        raise CorruptRecordError(f"record batch of {len(batch)} bytes is smaller than the v2 header of 61{_at(where)}")
    header = BatchHeader.parse(batch)
    if header.magic != MAGIC:
        raise CorruptRecordError(
            f"unsupported record batch magic {header.magic} at offset {header.base_offset}{_at(where)}")
    if LOG_OVERHEAD + header.batch_length != len(batch):
        raise CorruptRecordError(
            f"record batch at offset {header.base_offset} declares {header.size} bytes but has {len(batch)}{_at(where)}"
        )
    computed = compute_crc(batch)
    if computed != header.crc:
        raise CorruptRecordError(
            f"record batch at offset {header.base_offset} is corrupt (stored crc = {header.crc}, computed crc = "
            f"{computed}){_at(where)}"
        )
    if header.records_count < 0:
        raise CorruptRecordError(f"record batch at offset {header.base_offset} has negative record count{_at(where)}")
    if header.attributes & COMPRESSION_MASK > _LAST_CODEC:
        Compression.from_attributes(header.attributes)  # raises with the codec id
    return header


def with_base_offset(batch: bytes | bytearray, base_offset: int) -> bytes:
    """The same batch at another base offset; the CRC does not cover it, so it stays valid."""
    return _BASE_OFFSET.pack(base_offset) + bytes(batch[8:])


def set_base_offset(batch: bytearray | memoryview, base_offset: int, pos: int = 0) -> None:
    """Rewrite a batch's base offset in place, as a broker does when it assigns offsets."""
    _BASE_OFFSET.pack_into(batch, pos, base_offset)


def set_partition_leader_epoch(batch: bytearray | memoryview, epoch: int, pos: int = 0) -> None:
    """Rewrite the leader epoch in place; outside the CRC like the base offset."""
    _INT32.pack_into(batch, pos + 12, epoch)


def decode_batch(batch: bytes | memoryview, where: str = "") -> RecordBatch:
    """Validate and fully decode one batch, decompressing its records."""
    header = check_batch(batch, where)
    return RecordBatch(header, tuple(decode_records(header, memoryview(batch)[BATCH_OVERHEAD:], where)))


def decode_records(header: BatchHeader, body: bytes | memoryview, where: str = "") -> list[Record]:
    """Decode the records that follow the header (`body` = bytes after recordsCount)."""
    at = f" ({where})" if where else ""
    data = decompress(header.compression, body) if header.compression else body
    records: list[Record] = []
    pos = 0
    log_append = header.timestamp_type is TimestampType.LOG_APPEND_TIME
    try:
        for _ in range(header.records_count):
            length, pos = decode_varint(data, pos)
            end = pos + length
            if length < 0 or end > len(data):
                raise CorruptRecordError(f"record of {length} bytes runs past the end of the batch")
            pos += 1  # record attributes, unused
            ts_delta, pos = decode_varlong(data, pos)
            offset_delta, pos = decode_varint(data, pos)
            key, pos = _read_bytes(data, pos)
            value, pos = _read_bytes(data, pos)
            n_headers, pos = decode_varint(data, pos)
            if n_headers < 0:
                raise CorruptRecordError(f"negative header count {n_headers}")
            headers = []
            for _h in range(n_headers):
                hkey, pos = _read_bytes(data, pos)
                if hkey is None:
                    raise CorruptRecordError("null header key")
                hval, pos = _read_bytes(data, pos)
                headers.append(Header(hkey.decode("utf-8", "replace"), hval))
            if pos != end:
                raise CorruptRecordError(
                    f"invalid record size: expected to read {length} bytes in record payload, but instead read {length - (end - pos)}"
                )
            sequence = NO_SEQUENCE if header.base_sequence < 0 else (header.base_sequence + offset_delta) % (1 << 31)
            records.append(
                Record(
                    offset=header.base_offset + offset_delta,
                    timestamp=header.max_timestamp if log_append else header.base_timestamp + ts_delta,
                    key=key,
                    value=value,
                    headers=tuple(headers),
                    sequence=sequence,
                )
            )
    except CorruptRecordError as e:
        raise CorruptRecordError(f"batch at offset {header.base_offset}: {e}{at}") from None
    if pos != len(data):
        raise CorruptRecordError(
            f"batch at offset {header.base_offset}: incorrect declared batch size, records still remaining{at}"
        )
    return records


@dataclass(frozen=True, slots=True)
class RecordColumns:
    """A batch's records as parallel lists, for readers that build columns (Arrow) and need no `Record`."""

    offsets: list[int]
    timestamps: list[int]
    keys: list[bytes | None]
    values: list[bytes | None]
    headers: list[list[tuple[str, bytes | None]] | None]  # None for a record without headers


def decode_columns(header: BatchHeader, body: bytes | memoryview, where: str = "") -> RecordColumns:
    """`decode_records` as columns: one C pass when the kernel is built, the same values either way."""
    data = decompress(header.compression, body) if header.compression else body
    if _records_columns is not None:
        cols = _records_columns(data, header.records_count, header.base_offset, header.base_timestamp,
                                header.timestamp_type is TimestampType.LOG_APPEND_TIME, header.max_timestamp)
        if cols is not None:
            return RecordColumns(*cols)
    records = decode_records(header, body, where)  # raises the decoder's exact error, or agrees
    return RecordColumns(
        [r.offset for r in records], [r.timestamp for r in records], [r.key for r in records],
        [r.value for r in records], [[(h.key, h.value) for h in r.headers] or None for r in records],
    )


def timestamp_bounds(timestamp_range: tuple[int, int] | None) -> tuple[int, int]:
    """A CreateTime window (None: unlimited) as the int64 bounds the C walks take; Python's ints do not overflow."""
    if timestamp_range is None:
        return _INT64_MIN, _INT64_MAX
    return max(timestamp_range[0], _INT64_MIN), min(timestamp_range[1], _INT64_MAX)


def check_records(
    header: BatchHeader,
    body: bytes | memoryview,
    where: str = "",
    *,
    require_key: bool = False,
    timestamp_range: tuple[int, int] | None = None,
) -> None:
    """Validate a produced batch's records as Kafka's LogValidator does, raising InvalidRecordError or
    InvalidTimestampError naming the offset.

    Exactly `recordsCount` records must fill the batch (decompressed if need be) — a batch whose count
    or size disagrees with its records is refused instead of stored for consumers to trip over. On a
    compacted topic every record needs a key; with `timestamp_range` (lo, hi) every CreateTime
    timestamp must lie in it. The C walk (`records_check`) decides the common case — a valid batch —
    without building a Record per record; only when it declines does Python decode and name the fault.
    """
    try:
        data = decompress(header.compression, body) if header.attributes & COMPRESSION_MASK else body
    except CorruptRecordError as e:
        raise InvalidRecordError(f"batch at offset {header.base_offset}: {e}{_at(where)}") from None
    lo, hi = timestamp_bounds(timestamp_range)
    if _records_check is not None and _records_check(
        data, header.records_count, require_key, header.base_timestamp, lo, hi
    ):
        return
    if require_key or timestamp_range is not None:
        try:
            records = decode_records(header, body, where)
        except CorruptRecordError as e:  # the CRC matched: the producer wrote a malformed batch
            raise InvalidRecordError(str(e)) from None
        for r in records:
            if require_key and r.key is None:
                raise InvalidRecordError(f"compacted topic cannot accept message without key in {where}")
            if not lo <= r.timestamp <= hi:
                raise InvalidTimestampError(
                    f"timestamp {r.timestamp} of record at {where} is out of range "
                    f"[now - message.timestamp.before.max.ms, now + message.timestamp.after.max.ms]"
                )
        return
    try:  # only the length prefixes: Kafka's record framing
        pos, end = 0, len(data)
        for _ in range(header.records_count):
            length, pos = decode_varint(data, pos)
            if length <= 0 or pos + length > end:
                raise CorruptRecordError(f"record of {length} bytes runs past the end of the batch")
            pos += length
    except CorruptRecordError as e:
        raise InvalidRecordError(
            f"batch at offset {header.base_offset}: found invalid record framing: {e}{_at(where)}") from None
    if pos != end:
        raise InvalidRecordError(
            f"batch at offset {header.base_offset}: incorrect declared batch size, records still remaining{_at(where)}"
        )


def _read_bytes(data: bytes | memoryview, pos: int) -> tuple[bytes | None, int]:
    n, pos = decode_varint(data, pos)
    if n < 0:
        return None, pos
    if pos + n > len(data):
        raise CorruptRecordError(f"field of {n} bytes runs past the end of the record")
    return bytes(data[pos : pos + n]), pos + n


def encode_record(offset_delta: int, timestamp_delta: int, key: bytes | None, value: bytes | None,
                  headers: Iterable[Header] = ()) -> bytes:
    """One record as it sits inside a batch, length prefix included."""
    headers = tuple(headers)
    parts = [b"\x00", encode_varint(timestamp_delta), encode_varint(offset_delta), _bytes_field(key),
             _bytes_field(value), encode_varint(len(headers))]
    for h in headers:
        parts.append(_bytes_field(h.key.encode("utf-8")))
        parts.append(_bytes_field(h.value))
    body = b"".join(parts)
    return encode_varint(len(body)) + body


def _bytes_field(b: bytes | None) -> bytes:
    return encode_varint(-1) if b is None else encode_varint(len(b)) + b


def encode_batch(
    records: Sequence[Record],
    *,
    base_offset: int | None = None,
    compression: Compression = Compression.NONE,
    compression_level: int | None = None,
    timestamp_type: TimestampType = TimestampType.CREATE_TIME,
    producer_id: int = NO_PRODUCER_ID,
    producer_epoch: int = NO_PRODUCER_EPOCH,
    base_sequence: int = NO_SEQUENCE,
    partition_leader_epoch: int = NO_PARTITION_LEADER_EPOCH,
    is_transactional: bool = False,
    is_control: bool = False,
    delete_horizon_ms: int | None = None,
    last_offset_delta: int | None = None,
    max_timestamp: int | None = None,
) -> bytes:
    """Build one v2 batch from records with absolute offsets and timestamps.

    Defaults follow Kafka's builder: base offset = first record's offset, base
    timestamp = first record's (or the delete horizon), max timestamp = largest.
    `last_offset_delta` and `max_timestamp` may be given to keep them across
    compaction, where records in the middle or all of them go (an empty batch).
    """
    if base_offset is None:
        base_offset = records[0].offset if records else 0
    if delete_horizon_ms is not None:
        base_timestamp = delete_horizon_ms
    else:
        base_timestamp = records[0].timestamp if records else NO_TIMESTAMP
    if max_timestamp is None:
        max_timestamp = max((r.timestamp for r in records), default=NO_TIMESTAMP)
    if last_offset_delta is None:
        last_offset_delta = records[-1].offset - base_offset if records else 0
    body = b"".join(
        encode_record(r.offset - base_offset, r.timestamp - base_timestamp, r.key, r.value, r.headers) for r in records
    )
    if not records:
        # Kafka writes an empty batch as the bare 61-byte header with codec NONE (writeEmptyHeader).
        compression = Compression.NONE
    if compression:
        body = compress(compression, body, compression_level)
    attributes = (
        int(compression)
        | (TIMESTAMP_TYPE_BIT if timestamp_type is TimestampType.LOG_APPEND_TIME else 0)
        | (TRANSACTIONAL_BIT if is_transactional else 0)
        | (CONTROL_BIT if is_control else 0)
        | (DELETE_HORIZON_BIT if delete_horizon_ms is not None else 0)
    )
    batch = bytearray(
        _HEADER.pack(
            base_offset, BATCH_OVERHEAD - LOG_OVERHEAD + len(body), partition_leader_epoch, MAGIC, 0, attributes,
            last_offset_delta, base_timestamp, max_timestamp, producer_id, producer_epoch, base_sequence, len(records),
        )
    )
    batch += body
    struct.pack_into(">I", batch, 17, compute_crc(batch))
    return bytes(batch)


def encode_control_key(control_type: ControlType, version: int = 0) -> bytes:
    """Key of a control record: version int16 + type int16."""
    return _INT16.pack(version) + _INT16.pack(int(control_type))


def parse_control_key(key: bytes | None) -> ControlType:
    """Kafka's ControlRecordType.parse: at least 4 bytes, non-negative version; unknown types are UNKNOWN."""
    if key is None or len(key) < 4:
        raise CorruptRecordError(f"control record key of {0 if key is None else len(key)} bytes is shorter than 4")
    version, ctype = struct.unpack_from(">hh", key)
    if version < 0:
        raise CorruptRecordError(f"control record key has negative version {version}")
    try:
        return ControlType(ctype)
    except ValueError:
        return ControlType.UNKNOWN


def encode_end_txn_marker(coordinator_epoch: int, version: int = 0) -> bytes:
    """Value of an ABORT/COMMIT control record: version int16 + coordinator epoch int32."""
    return struct.pack(">hi", version, coordinator_epoch)


def end_txn_marker_batch(producer_id: int, producer_epoch: int, control: ControlType, timestamp: int,
                         coordinator_epoch: int = 0) -> bytes:
    """A transactional control batch of one COMMIT/ABORT record: what a coordinator appends to close a
    producer's transaction on a partition (Kafka's `MemoryRecords.withEndTransactionMarker`)."""
    return encode_batch([Record(0, timestamp, encode_control_key(control), encode_end_txn_marker(coordinator_epoch))],
                        producer_id=producer_id, producer_epoch=producer_epoch, is_transactional=True,
                        is_control=True)


def parse_end_txn_marker(value: bytes | None) -> int:
    """Coordinator epoch of an end-transaction marker value."""
    if value is None or len(value) < 6:
        raise CorruptRecordError("end transaction marker value is shorter than 6 bytes")
    version, epoch = struct.unpack_from(">hi", value)
    if version < 0:
        raise CorruptRecordError(f"end transaction marker has negative version {version}")
    return cast(int, epoch)
