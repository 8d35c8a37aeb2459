"""Compression codecs of record batches, framed exactly as Kafka frames them (spec section 1.5).

Pure functions over bytes: `compress` and `decompress` do no I/O and keep no state, so the
record-batch code can call them on any buffer. Decoding is strict and bounded: whatever the
input, it returns the original bytes or raises `CorruptRecordError` naming the codec; it never
lets a library exception escape, never loops without progress, and stops once the output
passes `max_size` (a few kilobytes of garbage can otherwise claim gigabytes).
"""

from __future__ import annotations

import enum
import struct
import zlib
from typing import cast

import cramjam
import lz4.frame
import zstandard

from .errors import CorruptRecordError

__all__ = ["Compression", "MAX_DECOMPRESSED_SIZE", "compress", "decompress"]

# Far above any batch a Kafka producer builds (max.request.size defaults to 1 MiB), yet a
# bounded allocation: Kafka streams records out of a batch, we materialise the whole body.
MAX_DECOMPRESSED_SIZE = 1 << 30

# Output is produced in steps of this size so the cap is checked before memory is spent.
_STEP = 1 << 20

# Bits 0-2 of the batch attributes hold the codec id.
_CODEC_MASK = 0x07


class Compression(enum.IntEnum):
    """Codec ids as stored in the low 3 bits of a batch's attributes."""

    NONE = 0
    GZIP = 1
    SNAPPY = 2
    LZ4 = 3
    ZSTD = 4

    @property
    def kafka_name(self) -> str:
        """The name `kafka-dump-log` prints after `compresscodec:` (NONE, GZIP, ...)."""
        return self.name

    @property
    def config_name(self) -> str:
        """The value of the `compression.type` config for this codec (none, gzip, ...)."""
        return self.name.lower()

    @classmethod
    def from_attributes(cls, attributes: int) -> Compression:
        """Codec of a batch; ids 5-7 are unassigned, so a batch carrying one is corrupt."""
        codec_id = attributes & _CODEC_MASK
        try:
            return cls(codec_id)
        except ValueError:
            raise CorruptRecordError(
                f"unknown compression codec id {codec_id} in batch attributes 0x{attributes & 0xFFFF:04x}"
            ) from None


def compress(codec: Compression, data: bytes, level: int | None = None) -> bytes:
    """Frame `data` the way Kafka's producer does for `codec`, so any Kafka client can read it.

    `level` is Kafka's level for the codec (`compression.<codec>.level`, KIP-390); None is
    Kafka's default. Codecs without levels (none, snappy) refuse one. Out-of-range levels raise
    ValueError, as Kafka refuses them in its config.
    """
    codec = Compression(codec)
    if codec is Compression.NONE:
        _no_level(codec, level)
        return bytes(data)
    if codec is Compression.GZIP:
        return _gzip_compress(data, level)
    if codec is Compression.SNAPPY:
        _no_level(codec, level)
        return _snappy_compress(data)
    if codec is Compression.LZ4:
        return _lz4_compress(data, level)
    return _zstd_compress(data, level)


def decompress(codec: Compression, data: bytes | memoryview, *, max_size: int = MAX_DECOMPRESSED_SIZE) -> bytes:
    """Undo Kafka's framing for `codec`; any malformed, truncated or oversized input is corrupt.

    `max_size` caps the output: decoding runs in bounded steps and a stream that would decode
    to more raises CorruptRecordError as soon as a step passes the cap.
    """
    codec = Compression(codec)
    raw = bytes(data)  # no copy when given bytes; flattens any memoryview
    if codec is Compression.NONE:
        _check_size(codec, len(raw), max_size)
        return raw
    if codec is Compression.GZIP:
        return _gzip_decompress(raw, max_size)
    if codec is Compression.SNAPPY:
        return _snappy_decompress(raw, max_size)
    if codec is Compression.LZ4:
        return _lz4_decompress(raw, max_size)
    return _zstd_decompress(raw, max_size)


def _no_level(codec: Compression, level: int | None) -> None:
    if level is not None:
        raise ValueError(f"{codec.config_name}: compression level not supported (got {level})")


def _check_size(codec: Compression, size: int, max_size: int) -> None:
    if size > max_size:
        raise CorruptRecordError(f"{codec.config_name}: decompressed data exceed the {max_size}-byte limit")


# --- gzip -------------------------------------------------------------------------------------
# Kafka accepts -1 (zlib's default, i.e. 6) or 1..9 for compression.gzip.level.
_GZIP_DEFAULT_LEVEL = -1
_GZIP_WBITS = 16 + zlib.MAX_WBITS  # gzip member with header and trailer


def _gzip_compress(data: bytes, level: int | None) -> bytes:
    if level is None:
        level = _GZIP_DEFAULT_LEVEL
    if level != -1 and not 1 <= level <= 9:
        raise ValueError(f"gzip: compression level must be -1 or 1..9, got {level}")
    # zlib writes mtime 0, so equal input gives equal output (no clock in a pure function).
    return zlib.compress(data, level, _GZIP_WBITS)


def _gzip_decompress(data: bytes, max_size: int) -> bytes:
    """Inflate one or more gzip members (the JDK reader accepts concatenated members)."""
    if not data:
        raise CorruptRecordError("gzip: empty input, expected a gzip member")
    out = bytearray()
    rest = data
    try:
        while rest:
            inflater = zlib.decompressobj(_GZIP_WBITS)
            pending = rest
            while not inflater.eof:
                chunk = inflater.decompress(pending, min(_STEP, max_size - len(out) + 1))
                pending = inflater.unconsumed_tail
                if not chunk and not pending:
                    break  # all input consumed, member unfinished
                out += chunk
                _check_size(Compression.GZIP, len(out), max_size)
            if not inflater.eof:
                raise CorruptRecordError(f"gzip: truncated stream ({len(data)} input bytes end inside a member)")
            rest = inflater.unused_data
    except zlib.error as exc:
        raise CorruptRecordError(f"gzip: invalid data ({exc})") from None
    return bytes(out)


# --- snappy (xerial snappy-java framing) ------------------------------------------------------
_XERIAL_MAGIC = b"\x82SNAPPY\x00"
_XERIAL_HEADER = _XERIAL_MAGIC + struct.pack(">ii", 1, 1)  # version 1, compatible version 1
_XERIAL_BLOCK = 32 * 1024  # snappy-java's default block of uncompressed input
# A snappy element of n input bytes yields at most 64 output bytes per 3 input bytes (a copy
# with a 2-byte offset); a declared length above this bound cannot be honest.
_SNAPPY_MAX_RATIO = 22


def _snappy_compress(data: bytes) -> bytes:
    parts = [_XERIAL_HEADER]
    view = memoryview(data)
    for start in range(0, len(view), _XERIAL_BLOCK):
        block = bytes(cramjam.snappy.compress_raw(view[start : start + _XERIAL_BLOCK]))
        parts.append(struct.pack(">i", len(block)))
        parts.append(block)
    return b"".join(parts)


def _snappy_decompress(data: bytes, max_size: int) -> bytes:
    """Read xerial framing, or a bare raw block when the header is absent (as snappy-java does)."""
    if len(data) < len(_XERIAL_HEADER) or data[:8] != _XERIAL_MAGIC:
        return _snappy_raw_block(data, max_size)
    version = struct.unpack_from(">i", data, 8)[0]
    if version < 1:
        raise CorruptRecordError(f"snappy: xerial stream version {version} is not supported")
    out = bytearray()
    pos = len(_XERIAL_HEADER)
    end = len(data)
    while pos < end:
        # snappy-java reads a repeated header as the start of a concatenated stream.
        if data[pos : pos + 8] == _XERIAL_MAGIC and end - pos >= len(_XERIAL_HEADER):
            pos += len(_XERIAL_HEADER)
            continue
        if end - pos < 4:
            raise CorruptRecordError(f"snappy: truncated block length at byte {pos}")
        size = struct.unpack_from(">i", data, pos)[0]
        pos += 4
        if size <= 0 or size > end - pos:
            raise CorruptRecordError(
                f"snappy: block length {size} at byte {pos - 4} does not fit the {end - pos} bytes left"
            )
        out += _snappy_raw_block(data[pos : pos + size], max_size - len(out))
        pos += size
    return bytes(out)


def _snappy_raw_block(block: bytes, max_size: int) -> bytes:
    declared = _snappy_declared_length(block)
    if declared > max(len(block), 1) * _SNAPPY_MAX_RATIO:
        raise CorruptRecordError(f"snappy: block of {len(block)} bytes claims {declared} bytes of output")
    _check_size(Compression.SNAPPY, declared, max_size)
    try:
        out = bytes(cramjam.snappy.decompress_raw(block))
    except Exception as exc:  # cramjam.DecompressionError, but be sure nothing else leaks
        raise CorruptRecordError(f"snappy: invalid block ({exc})") from None
    if len(out) != declared:
        raise CorruptRecordError(f"snappy: block decoded to {len(out)} bytes, header said {declared}")
    return out


def _snappy_declared_length(block: bytes) -> int:
    """The uncompressed length a raw snappy block starts with (unsigned varint, < 2**32)."""
    value = 0
    for i, byte in enumerate(block[:5]):
        value |= (byte & 0x7F) << (7 * i)
        if not byte & 0x80:
            if value >= 1 << 32:
                break
            return value
    raise CorruptRecordError("snappy: block does not start with a valid length varint")


# --- lz4 (Kafka's Lz4BlockOutputStream frame) -------------------------------------------------
_LZ4_MAGIC = b"\x04\x22\x4d\x18"  # 0x184D2204 little-endian
_LZ4_KAFKA_DEFAULT_LEVEL = 9
# Kafka levels map onto the lz4 frame API's compression_level like this:
#   9 (Kafka's default) -> 0: Kafka then uses lz4-java's *fast* compressor, not HC level 9;
#   1, 2 -> 3: Kafka uses HC there, lz4's frame API treats levels < 3 as the fast compressor;
#   3..12 -> same HC level; 13..17 -> 12: liblz4 caps HC at 12, in lz4-java too.
_LZ4_FAST = 0


def _lz4_level(level: int | None) -> int:
    if level is None or level == _LZ4_KAFKA_DEFAULT_LEVEL:
        return _LZ4_FAST
    if not 1 <= level <= 17:
        raise ValueError(f"lz4: compression level must be 1..17, got {level}")
    return cast(int, min(max(level, lz4.frame.COMPRESSIONLEVEL_MINHC), 12))


def _lz4_compress(data: bytes, level: int | None) -> bytes:
    # Header: magic, FLG 0x60 (v1, independent blocks, no checksums, no size), BD 0x40 (64 KB).
    return cast(bytes, lz4.frame.compress(
        data,
        compression_level=_lz4_level(level),
        block_size=lz4.frame.BLOCKSIZE_MAX64KB,
        block_linked=False,
        content_checksum=False,
        block_checksum=False,
        store_size=False,
    ))


def _lz4_decompress(data: bytes, max_size: int) -> bytes:
    """Decode one frame with the header rules of Kafka's Lz4BlockInputStream."""
    data = _lz4_check_header(data)
    decoder = lz4.frame.LZ4FrameDecompressor()
    out = bytearray()
    pending = data
    try:
        while not decoder.eof:
            chunk = decoder.decompress(pending, max_length=min(_STEP, max_size - len(out) + 1))
            pending = b""
            if not chunk:
                break  # no progress: input exhausted before the end mark
            out += chunk
            _check_size(Compression.LZ4, len(out), max_size)
    except RuntimeError as exc:  # the lz4 binding reports every LZ4F error as RuntimeError
        raise CorruptRecordError(f"lz4: invalid frame ({exc})") from None
    if not decoder.eof:
        raise CorruptRecordError(f"lz4: truncated frame ({len(data)} input bytes end before the end mark)")
    if decoder.unused_data:
        raise CorruptRecordError(f"lz4: {len(decoder.unused_data)} bytes follow the end of the frame")
    return bytes(out)


def _lz4_check_header(data: bytes) -> bytes:
    """Validate magic and descriptor as Kafka does; return data with a standard header checksum.

    Kafka clients before 0.10 (magic v0) computed the header checksum over the magic bytes too.
    Kafka reads such v0 batches by ignoring the checksum; with no magic to go on here, the
    checksum is accepted in either form and the broken one is repaired for the lz4 library.
    """
    if len(data) < 7:
        raise CorruptRecordError(f"lz4: {len(data)} bytes are too short for a frame header")
    if data[:4] != _LZ4_MAGIC:
        raise CorruptRecordError(f"lz4: bad magic {data[:4].hex()}, expected {_LZ4_MAGIC.hex()}")
    flg, bd = data[4], data[5]
    if flg >> 6 != 1:
        raise CorruptRecordError(f"lz4: frame version {flg >> 6} is not supported")
    if flg & 0x03:
        raise CorruptRecordError(f"lz4: reserved FLG bits set (0x{flg:02x})")
    if not flg & 0x20:
        raise CorruptRecordError("lz4: dependent blocks are not supported by Kafka")
    if bd & 0x8F or not 4 <= (bd >> 4) & 0x07 <= 7:
        raise CorruptRecordError(f"lz4: invalid block descriptor 0x{bd:02x}")
    hc_pos = 14 if flg & 0x08 else 6  # 8-byte content size present or not
    if len(data) <= hc_pos:
        raise CorruptRecordError("lz4: truncated frame header")
    hc = data[hc_pos]
    good = (_xxh32_short(data[4:hc_pos]) >> 8) & 0xFF
    if hc == good:
        return data
    if hc == (_xxh32_short(data[:hc_pos]) >> 8) & 0xFF:
        return data[:hc_pos] + bytes([good]) + data[hc_pos + 1 :]
    raise CorruptRecordError(f"lz4: frame descriptor checksum 0x{hc:02x} does not match 0x{good:02x}")


_P1, _P2, _P3, _P4, _P5 = 0x9E3779B1, 0x85EBCA77, 0xC2B2AE3D, 0x27D4EB2F, 0x165667B1
_M32 = 0xFFFFFFFF


def _rotl32(x: int, r: int) -> int:
    return ((x << r) | (x >> (32 - r))) & _M32


def _xxh32_short(data: bytes) -> int:
    """XXH32 with seed 0 for inputs under 16 bytes: all an LZ4 frame header needs."""
    n = len(data)
    assert n < 16
    acc = (_P5 + n) & _M32
    pos = 0
    while n - pos >= 4:
        word = int.from_bytes(data[pos : pos + 4], "little")
        acc = (_rotl32((acc + word * _P3) & _M32, 17) * _P4) & _M32
        pos += 4
    for byte in data[pos:]:
        acc = (_rotl32((acc + byte * _P5) & _M32, 11) * _P1) & _M32
    acc ^= acc >> 15
    acc = (acc * _P2) & _M32
    acc ^= acc >> 13
    acc = (acc * _P3) & _M32
    acc ^= acc >> 16
    return acc


# --- zstd --------------------------------------------------------------------------------------
_ZSTD_DEFAULT_LEVEL = 3
_ZSTD_MIN_LEVEL = -(1 << 17)  # ZSTD_minCLevel(), Kafka's lower bound
_ZSTD_MAX_LEVEL = 22
# Input is fed in slices this small because one call returns all the output of its input:
# a zstd block header of 3 bytes plus 1 byte (RLE) can expand to 128 KiB.
_ZSTD_FEED = 256


def _zstd_compress(data: bytes, level: int | None) -> bytes:
    if level is None:
        level = _ZSTD_DEFAULT_LEVEL
    if not _ZSTD_MIN_LEVEL <= level <= _ZSTD_MAX_LEVEL:
        raise ValueError(f"zstd: compression level must be {_ZSTD_MIN_LEVEL}..{_ZSTD_MAX_LEVEL}, got {level}")
    return zstandard.ZstdCompressor(level=level).compress(data)


def _zstd_decompress(data: bytes, max_size: int) -> bytes:
    """Decode one or more frames (zstd-jni reads across frames), with or without content size.

    zstandard.decompress() alone refuses frames that do not store their size, which is what
    zstd-jni's streaming writer produces; a streaming decoder handles both.
    """
    if not data:
        raise CorruptRecordError("zstd: empty input, expected a zstd frame")
    out = bytearray()
    view = memoryview(data)
    pos = 0
    context = zstandard.ZstdDecompressor()
    try:
        while pos < len(view):
            decoder = context.decompressobj()
            while not decoder.eof and pos < len(view):
                piece = view[pos : pos + _ZSTD_FEED]
                out += decoder.decompress(piece)
                _check_size(Compression.ZSTD, len(out), max_size)
                pos += len(piece)
            if not decoder.eof:
                raise CorruptRecordError(f"zstd: truncated frame ({len(data)} input bytes end inside a frame)")
            pos -= len(decoder.unused_data)  # bytes of the last slice that belong to the next frame
    except zstandard.ZstdError as exc:
        raise CorruptRecordError(f"zstd: invalid frame ({exc})") from None
    return bytes(out)
