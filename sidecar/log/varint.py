"""Zigzag varints as Kafka writes them inside v2 records (protobuf base-128, least significant group first)."""

from __future__ import annotations

from .errors import CorruptRecordError


def encode_uvarint(u: int) -> bytes:
    """An unsigned base-128 varint (the wire protocol's compact lengths and tagged-field sizes)."""
    out = bytearray()
    while u >= 0x80:
        out.append((u & 0x7F) | 0x80)
        u >>= 7
    out.append(u)
    return bytes(out)


def encode_varint(value: int) -> bytes:
    """Zigzag-encode a signed int32 or int64 (the same bytes for both when the value fits in 32 bits)."""
    return encode_uvarint(((value << 1) ^ (value >> 63)) & 0xFFFFFFFFFFFFFFFF)


def decode_varint(buf: bytes | memoryview, pos: int, max_bytes: int = 5) -> tuple[int, int]:
    """Read one zigzag varint at `pos`; return (value, next position).

    `max_bytes` is 5 for Kafka's varint (int32) and 10 for its varlong; a longer
    encoding is corrupt, as it is for Kafka's ByteUtils.
    """
    u = 0
    shift = 0
    for i in range(max_bytes):
        try:
            b = buf[pos + i]
        except IndexError:
            raise CorruptRecordError(f"varint runs past the end of the buffer at position {pos}") from None
        u |= (b & 0x7F) << shift
        if not b & 0x80:
            return (u >> 1) ^ -(u & 1), pos + i + 1
        shift += 7
    raise CorruptRecordError(f"varint longer than {max_bytes} bytes at position {pos}")


def decode_varlong(buf: bytes | memoryview, pos: int) -> tuple[int, int]:
    """Read one zigzag varlong (at most 10 bytes)."""
    return decode_varint(buf, pos, 10)


def varint_size(value: int) -> int:
    """Bytes `encode_varint(value)` takes, without building them."""
    u = ((value << 1) ^ (value >> 63)) & 0xFFFFFFFFFFFFFFFF
    n = 1
    while u >= 0x80:
        u >>= 7
        n += 1
    return n
