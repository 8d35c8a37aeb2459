"""Tests of shale.sidecar.log.compression: Kafka's codec framing, checked against independent readers and writers."""

from __future__ import annotations

import gzip
import math
import random
import struct
import zlib

import cramjam
import kafka.codec
import lz4.block
import lz4.frame
import pytest
import xxhash
import zstandard
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shale.sidecar.log.compression import Compression, compress, decompress
from shale.sidecar.log.errors import CorruptRecordError

CODECS = list(Compression)
COMPRESSED = [c for c in Compression if c is not Compression.NONE]
XERIAL_HEADER = b"\x82SNAPPY\x00" + b"\x00\x00\x00\x01" + b"\x00\x00\x00\x01"
LZ4_HEADER = bytes([0x04, 0x22, 0x4D, 0x18, 0x60, 0x40])

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _sample(n: int, seed: int = 7) -> bytes:
    """Half-compressible bytes: random words joined, like record payloads."""
    rng = random.Random(seed)
    words = [rng.randbytes(rng.randint(1, 12)) for _ in range(200)]
    out = bytearray()
    while len(out) < n:
        out += rng.choice(words)
    return bytes(out[:n])


@st.composite
def payloads(draw: st.DrawFn) -> bytes:
    """Arbitrary bytes: small ones, and ones over 64 KiB (several snappy and lz4 blocks)."""
    kind = draw(st.sampled_from(["small", "repeated", "random"]))
    if kind == "small":
        return draw(st.binary(max_size=2048))
    size = draw(st.integers(min_value=64 * 1024 + 1, max_value=300_000))
    if kind == "repeated":
        seed = draw(st.binary(min_size=1, max_size=100))
        return (seed * (size // len(seed) + 1))[:size]
    return random.Random(draw(st.integers(min_value=0, max_value=2**32))).randbytes(size)


# --- the enum ---------------------------------------------------------------------------------


def test_ids_and_names_match_kafka() -> None:
    assert [(c.value, c.kafka_name, c.config_name) for c in Compression] == [
        (0, "NONE", "none"),
        (1, "GZIP", "gzip"),
        (2, "SNAPPY", "snappy"),
        (3, "LZ4", "lz4"),
        (4, "ZSTD", "zstd"),
    ]


@given(st.integers(min_value=0, max_value=0xFFFF))
def test_from_attributes_reads_the_low_three_bits(attributes: int) -> None:
    codec_id = attributes & 0x07
    if codec_id <= 4:
        assert Compression.from_attributes(attributes) == codec_id
    else:
        with pytest.raises(CorruptRecordError, match=f"codec id {codec_id}"):
            Compression.from_attributes(attributes)


@pytest.mark.parametrize("codec_id", [5, 6, 7])
def test_unassigned_codec_ids_are_corrupt(codec_id: int) -> None:
    # Bit 4 (transactional) and bit 5 (control) set as well: only the low bits decide.
    with pytest.raises(CorruptRecordError):
        Compression.from_attributes(0x30 | codec_id)


# --- round trips ------------------------------------------------------------------------------


@pytest.mark.parametrize("codec", CODECS, ids=lambda c: c.config_name)
@SETTINGS
@given(data=payloads())
def test_round_trip(codec: Compression, data: bytes) -> None:
    packed = compress(codec, data)
    assert decompress(codec, packed) == data
    assert decompress(codec, memoryview(packed)) == data
    assert compress(codec, data) == packed  # pure: no clock or state in the output


@pytest.mark.parametrize("codec", CODECS, ids=lambda c: c.config_name)
def test_round_trip_empty(codec: Compression) -> None:
    assert decompress(codec, compress(codec, b"")) == b""


@pytest.mark.parametrize(
    ("codec", "level"),
    [(Compression.GZIP, lvl) for lvl in (-1, *range(1, 10))]
    + [(Compression.LZ4, lvl) for lvl in range(1, 18)]
    + [(Compression.ZSTD, lvl) for lvl in (-131072, -5, 0, 1, 3, 19, 22)],
)
def test_round_trip_every_kafka_level(codec: Compression, level: int) -> None:
    data = _sample(150_000)
    assert decompress(codec, compress(codec, data, level)) == data


def test_none_is_identity() -> None:
    data = _sample(1000)
    assert compress(Compression.NONE, data) == data
    assert decompress(Compression.NONE, bytearray(data)) == data


# --- levels -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("codec", "level"),
    [
        (Compression.NONE, 1),
        (Compression.SNAPPY, 1),
        (Compression.GZIP, 0),
        (Compression.GZIP, 10),
        (Compression.GZIP, -2),
        (Compression.LZ4, 0),
        (Compression.LZ4, 18),
        (Compression.ZSTD, 23),
        (Compression.ZSTD, -131073),
    ],
)
def test_levels_kafka_refuses_are_refused(codec: Compression, level: int) -> None:
    with pytest.raises(ValueError, match=codec.config_name):
        compress(codec, b"payload", level)


def test_gzip_default_level_is_zlib_default_six() -> None:
    data = _sample(100_000)
    assert compress(Compression.GZIP, data) == compress(Compression.GZIP, data, 6)
    assert compress(Compression.GZIP, data) != compress(Compression.GZIP, data, 1)


def test_lz4_default_level_nine_uses_the_fast_compressor_like_kafka() -> None:
    # Kafka's Lz4BlockOutputStream picks lz4-java's fast compressor for its default level 9
    # and the HC compressor for any other level.
    data = _sample(100_000)
    fast = lz4.frame.compress(
        data,
        compression_level=0,
        block_size=lz4.frame.BLOCKSIZE_MAX64KB,
        block_linked=False,
        content_checksum=False,
        block_checksum=False,
        store_size=False,
    )
    assert compress(Compression.LZ4, data) == fast
    assert compress(Compression.LZ4, data, 9) == fast
    assert len(compress(Compression.LZ4, data, 8)) < len(fast)


def test_zstd_default_level_is_three() -> None:
    data = _sample(100_000)
    assert compress(Compression.ZSTD, data) == compress(Compression.ZSTD, data, 3)
    assert compress(Compression.ZSTD, data) != compress(Compression.ZSTD, data, 19)


# --- framing bytes ----------------------------------------------------------------------------


def _xerial_blocks(framed: bytes) -> list[bytes]:
    assert framed[:16] == XERIAL_HEADER
    blocks, pos = [], 16
    while pos < len(framed):
        (size,) = struct.unpack_from(">i", framed, pos)
        blocks.append(framed[pos + 4 : pos + 4 + size])
        pos += 4 + size
    assert pos == len(framed)
    return blocks


def _lz4_blocks(framed: bytes) -> list[tuple[bool, bytes]]:
    """(stored uncompressed?, block bytes) of a frame with no content size and no checksums."""
    pos, blocks = 7, []
    while True:
        (word,) = struct.unpack_from("<I", framed, pos)
        pos += 4
        if word == 0:
            break
        size = word & 0x7FFFFFFF
        blocks.append((bool(word & 0x80000000), framed[pos : pos + size]))
        pos += size
    assert pos == len(framed), "nothing may follow the end mark"
    return blocks


def test_snappy_xerial_header_bytes() -> None:
    framed = compress(Compression.SNAPPY, b"hello kafka")
    assert framed[:16] == bytes.fromhex("82 53 4e 41 50 50 59 00 00 00 00 01 00 00 00 01")
    assert compress(Compression.SNAPPY, b"") == XERIAL_HEADER


@pytest.mark.parametrize("size", [1, 32 * 1024, 32 * 1024 + 1, 100_000, 300_000])
def test_snappy_blocks_hold_32_kib_of_input_each(size: int) -> None:
    data = _sample(size)
    blocks = _xerial_blocks(compress(Compression.SNAPPY, data))
    assert len(blocks) == math.ceil(size / (32 * 1024))
    decoded = [bytes(cramjam.snappy.decompress_raw(b)) for b in blocks]
    assert all(len(d) == 32 * 1024 for d in decoded[:-1])
    assert b"".join(decoded) == data


def test_lz4_header_bytes() -> None:
    framed = compress(Compression.LZ4, b"hello kafka")
    # magic, FLG 0x60 (v1, independent blocks, no checksums, no content size), BD 0x40 (64 KB),
    # HC = second byte of xxh32(FLG BD).
    hc = (xxhash.xxh32_intdigest(b"\x60\x40") >> 8) & 0xFF
    assert framed[:7] == LZ4_HEADER + bytes([hc])
    assert framed[:7] == bytes.fromhex("04 22 4d 18 60 40 82")
    assert framed[-4:] == b"\x00\x00\x00\x00"  # end mark, no content checksum
    assert compress(Compression.LZ4, b"") == bytes.fromhex("04 22 4d 18 60 40 82 00 00 00 00")


@pytest.mark.parametrize("level", [None, 12])
def test_lz4_blocks_are_independent_and_at_most_64_kib(level: int | None) -> None:
    data = _sample(300_000)
    blocks = _lz4_blocks(compress(Compression.LZ4, data, level))
    assert len(blocks) == math.ceil(len(data) / 65536)
    # Each block decodes on its own (no dependency on the previous block's window).
    out = b"".join(
        raw if stored else lz4.block.decompress(raw, uncompressed_size=65536) for stored, raw in blocks
    )
    assert out == data


def test_lz4_incompressible_blocks_are_stored() -> None:
    data = random.Random(1).randbytes(70_000)
    blocks = _lz4_blocks(compress(Compression.LZ4, data))
    assert [stored for stored, _ in blocks] == [True, True]
    assert b"".join(raw for _, raw in blocks) == data


def test_gzip_is_one_deterministic_rfc1952_member() -> None:
    framed = compress(Compression.GZIP, b"hello kafka")
    assert framed[:4] == b"\x1f\x8b\x08\x00"  # magic, deflate, no optional fields
    assert framed[4:8] == b"\x00\x00\x00\x00"  # mtime 0
    assert struct.unpack("<II", framed[-8:]) == (zlib.crc32(b"hello kafka"), len(b"hello kafka"))


def test_zstd_is_a_standard_frame() -> None:
    framed = compress(Compression.ZSTD, _sample(5000))
    assert framed[:4] == b"\x28\xb5\x2f\xfd"
    assert zstandard.ZstdDecompressor().decompress(framed) == _sample(5000)


# --- cross-implementation oracles -------------------------------------------------------------

KAFKA_DECODERS = {
    Compression.GZIP: kafka.codec.gzip_decode,
    Compression.SNAPPY: kafka.codec.snappy_decode,
    Compression.LZ4: kafka.codec.lz4_decode,
    Compression.ZSTD: kafka.codec.zstd_decode,
}


@pytest.mark.parametrize("codec", COMPRESSED, ids=lambda c: c.config_name)
@SETTINGS
@given(data=payloads())
def test_kafka_python_reads_what_we_write(codec: Compression, data: bytes) -> None:
    if codec is Compression.SNAPPY and not data:
        # kafka-python only detects xerial framing when more than the 16-byte header is present.
        data = b"x"
    assert KAFKA_DECODERS[codec](compress(codec, data)) == data


@pytest.mark.parametrize(
    "encode",
    [
        pytest.param(lambda d: kafka.codec.gzip_encode(d), id="gzip"),
        pytest.param(lambda d: kafka.codec.gzip_encode(d, compresslevel=1), id="gzip-1"),
    ],
)
@SETTINGS
@given(data=payloads())
def test_we_read_kafka_python_gzip(encode, data: bytes) -> None:
    assert decompress(Compression.GZIP, encode(data)) == data


@SETTINGS
@given(data=payloads())
def test_we_read_kafka_python_snappy(data: bytes) -> None:
    assert decompress(Compression.SNAPPY, kafka.codec.snappy_encode(data)) == data
    # Raw snappy without the xerial header, as non-Java clients may send.
    assert decompress(Compression.SNAPPY, kafka.codec.snappy_encode(data, xerial_compatible=False)) == data


@SETTINGS
@given(data=payloads())
def test_we_read_kafka_python_lz4(data: bytes) -> None:
    framed = kafka.codec.lz4_encode(data)
    # kafka-python stores the content size (except for empty input); the reader must skip it.
    assert framed[4] & 0x08 or not data
    assert decompress(Compression.LZ4, framed) == data


@SETTINGS
@given(data=payloads())
def test_we_read_lz4_with_the_pre_0_10_broken_header_checksum(data: bytes) -> None:
    # Magic v0 producers hashed the magic bytes into the header checksum (KAFKA-3160).
    framed = kafka.codec.lz4_encode_old_kafka(data)
    assert framed[6] != (xxhash.xxh32_intdigest(framed[4:6]) >> 8) & 0xFF
    assert decompress(Compression.LZ4, framed) == data


@SETTINGS
@given(data=payloads())
def test_we_read_kafka_python_zstd(data: bytes) -> None:
    assert decompress(Compression.ZSTD, kafka.codec.zstd_encode(data)) == data


def test_we_read_hand_built_xerial_stream_with_literal_blocks() -> None:
    # Built without any snappy encoder: each block is one literal element.
    def literal_block(chunk: bytes) -> bytes:
        assert 0 < len(chunk) <= 60
        return bytes([len(chunk), (len(chunk) - 1) << 2]) + chunk

    chunks = [b"first chunk ", b"second ", b"and the last one"]
    framed = XERIAL_HEADER + b"".join(struct.pack(">i", len(b)) + b for b in map(literal_block, chunks))
    assert decompress(Compression.SNAPPY, framed) == b"".join(chunks)


def test_we_read_hand_built_lz4_frame_with_stored_blocks_and_checksums() -> None:
    # FLG 0x74: v1, independent, block checksum, content checksum; blocks stored uncompressed.
    chunks = [b"a" * 65536, b"tail"]
    descriptor = bytes([0x74, 0x40])
    framed = bytearray(b"\x04\x22\x4d\x18" + descriptor + bytes([(xxhash.xxh32_intdigest(descriptor) >> 8) & 0xFF]))
    for chunk in chunks:
        framed += struct.pack("<I", len(chunk) | 0x80000000) + chunk + struct.pack("<I", xxhash.xxh32_intdigest(chunk))
    framed += struct.pack("<I", 0) + struct.pack("<I", xxhash.xxh32_intdigest(b"".join(chunks)))
    assert decompress(Compression.LZ4, bytes(framed)) == b"".join(chunks)
    framed[-1] ^= 0xFF  # content checksum wrong
    with pytest.raises(CorruptRecordError, match="lz4"):
        decompress(Compression.LZ4, bytes(framed))


def test_we_read_gzip_written_by_the_gzip_module_with_optional_header_fields() -> None:
    import io

    buf = io.BytesIO()
    with gzip.GzipFile(filename="records.bin", mode="wb", fileobj=buf, mtime=1_700_000_000) as f:
        f.write(b"named member")
    assert buf.getvalue()[3] & 0x08  # FNAME set
    assert decompress(Compression.GZIP, buf.getvalue()) == b"named member"


# --- zstd frames as zstd-jni writes them ------------------------------------------------------


@SETTINGS
@given(data=payloads())
def test_zstd_frame_without_content_size_is_decoded(data: bytes) -> None:
    framed = zstandard.ZstdCompressor(write_content_size=False, write_checksum=True).compress(data)
    assert zstandard.get_frame_parameters(framed).content_size == zstandard.CONTENTSIZE_UNKNOWN
    assert decompress(Compression.ZSTD, framed) == data


def test_zstd_streamed_frame_is_decoded_where_one_shot_decompress_fails() -> None:
    data = _sample(200_000)
    cobj = zstandard.ZstdCompressor(level=3).compressobj()
    framed = cobj.compress(data) + cobj.flush()
    with pytest.raises(zstandard.ZstdError, match="content size"):
        zstandard.decompress(framed)
    assert decompress(Compression.ZSTD, framed) == data


def test_zstd_concatenated_frames_are_read_across() -> None:
    one = zstandard.ZstdCompressor(write_content_size=False).compress(b"first frame, ")
    two = compress(Compression.ZSTD, _sample(70_000))
    assert decompress(Compression.ZSTD, one + two) == b"first frame, " + _sample(70_000)


# --- other accepted framings ------------------------------------------------------------------


def test_gzip_concatenated_members_are_read_like_the_jdk_does() -> None:
    framed = compress(Compression.GZIP, b"one ") + compress(Compression.GZIP, b"two")
    assert decompress(Compression.GZIP, framed) == b"one two"


def test_snappy_concatenated_xerial_streams_are_read() -> None:
    framed = compress(Compression.SNAPPY, b"one ") + compress(Compression.SNAPPY, b"two")
    assert decompress(Compression.SNAPPY, framed) == b"one two"


# --- corrupt input ----------------------------------------------------------------------------

GARBAGE = [
    b"",
    b"\x01",
    b"not compressed at all, just some plain text that is long enough",
    bytes(range(256)),
    b"\xff" * 100,
]


@pytest.mark.parametrize("codec", COMPRESSED, ids=lambda c: c.config_name)
@pytest.mark.parametrize("garbage", GARBAGE, ids=range(len(GARBAGE)))
def test_garbage_is_corrupt(codec: Compression, garbage: bytes) -> None:
    with pytest.raises(CorruptRecordError, match=codec.config_name):
        decompress(codec, garbage)


def test_snappy_bare_empty_block_is_valid() -> None:
    # One byte 0x00 is a complete raw snappy block of length 0, so it is not garbage.
    assert decompress(Compression.SNAPPY, b"\x00") == b""


@pytest.mark.parametrize("codec", COMPRESSED, ids=lambda c: c.config_name)
@settings(max_examples=300, deadline=None)
@given(garbage=st.binary(max_size=400))
def test_random_bytes_never_escape_as_another_error(codec: Compression, garbage: bytes) -> None:
    try:
        out = decompress(codec, garbage)
    except CorruptRecordError as exc:
        assert codec.config_name in str(exc)
    else:
        # Only snappy's bare raw blocks are dense enough for random bytes to be valid.
        assert codec is Compression.SNAPPY
        assert isinstance(out, bytes)


@pytest.mark.parametrize("codec", COMPRESSED, ids=lambda c: c.config_name)
@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_damaged_frames_never_escape_as_another_error(codec: Compression, data: st.DataObject) -> None:
    framed = bytearray(compress(codec, _sample(data.draw(st.integers(0, 150_000)), seed=3)))
    for _ in range(data.draw(st.integers(1, 4))):
        action = data.draw(st.sampled_from(["flip", "cut", "insert"]))
        pos = data.draw(st.integers(0, max(len(framed) - 1, 0)))
        if action == "flip" and framed:
            framed[pos] ^= data.draw(st.integers(1, 255))
        elif action == "cut":
            del framed[pos : pos + data.draw(st.integers(1, 64))]
        else:
            framed[pos:pos] = data.draw(st.binary(min_size=1, max_size=8))
    try:
        out = decompress(codec, bytes(framed))
    except CorruptRecordError as exc:
        assert codec.config_name in str(exc)
    else:
        assert isinstance(out, bytes)


@pytest.mark.parametrize("codec", [Compression.GZIP, Compression.LZ4, Compression.ZSTD], ids=lambda c: c.config_name)
def test_every_truncation_is_corrupt(codec: Compression) -> None:
    framed = compress(codec, _sample(150_000))
    step = max(1, len(framed) // 500)
    for cut in [*range(0, len(framed), step), *range(len(framed) - 40, len(framed))]:
        with pytest.raises(CorruptRecordError, match=codec.config_name):
            decompress(codec, framed[:cut])


def test_snappy_truncation_is_corrupt_unless_it_falls_on_a_block_boundary() -> None:
    # Xerial framing has no end mark: a stream cut between blocks is a valid shorter stream
    # (snappy-java reads it the same way); the batch CRC is what catches that.
    data = _sample(100_000)
    framed = compress(Compression.SNAPPY, data)
    boundaries = {16}
    pos = 16
    while pos < len(framed):
        pos += 4 + struct.unpack_from(">i", framed, pos)[0]
        boundaries.add(pos)
    step = max(1, len(framed) // 500)
    for cut in sorted({*range(0, len(framed), step), *range(len(framed) - 40, len(framed)), *boundaries}):
        if cut in boundaries:
            out = decompress(Compression.SNAPPY, framed[:cut])
            assert data.startswith(out) and len(out) % (32 * 1024) == 0 or out == data
        else:
            with pytest.raises(CorruptRecordError, match="snappy"):
                decompress(Compression.SNAPPY, framed[:cut])


def test_trailing_bytes_after_the_stream_are_corrupt() -> None:
    for codec in (Compression.GZIP, Compression.LZ4, Compression.ZSTD):
        with pytest.raises(CorruptRecordError, match=codec.config_name):
            decompress(codec, compress(codec, b"payload") + b"\x00junk")


def test_lz4_header_rules_follow_kafka() -> None:
    good = compress(Compression.LZ4, b"payload")

    def with_header(flg: int, bd: int, hc: int | None = None) -> bytes:
        if hc is None:
            hc = (xxhash.xxh32_intdigest(bytes([flg, bd])) >> 8) & 0xFF
        return good[:4] + bytes([flg, bd, hc]) + good[7:]

    assert decompress(Compression.LZ4, with_header(0x60, 0x70)) == b"payload"  # 4 MB blocks are fine
    for flg, bd, why in [
        (0x40, 0x40, "dependent"),  # block independence off
        (0x20, 0x40, "version"),  # version 0
        (0x61, 0x40, "reserved"),  # reserved / dict id bit
        (0x60, 0x30, "block descriptor"),  # 16 KB: below Kafka's 64 KB minimum
        (0x60, 0xC0, "block descriptor"),  # reserved bit 7
    ]:
        with pytest.raises(CorruptRecordError, match=why):
            decompress(Compression.LZ4, with_header(flg, bd))
    with pytest.raises(CorruptRecordError, match="checksum"):
        decompress(Compression.LZ4, with_header(0x60, 0x40, hc=0x00))
    with pytest.raises(CorruptRecordError, match="magic"):
        decompress(Compression.LZ4, b"\x04\x22\x4d\x19" + good[4:])


def test_lz4_linked_blocks_from_the_lz4_library_are_refused() -> None:
    framed = lz4.frame.compress(_sample(200_000), block_linked=True, block_size=lz4.frame.BLOCKSIZE_MAX64KB)
    assert not framed[4] & 0x20
    with pytest.raises(CorruptRecordError, match="dependent"):
        decompress(Compression.LZ4, framed)


def test_snappy_bad_block_lengths_are_corrupt() -> None:
    block = bytes(cramjam.snappy.compress_raw(b"payload"))
    for length in (0, -1, len(block) + 1):
        with pytest.raises(CorruptRecordError, match="snappy"):
            decompress(Compression.SNAPPY, XERIAL_HEADER + struct.pack(">i", length) + block)
    version_zero = b"\x82SNAPPY\x00" + struct.pack(">ii", 0, 1)
    with pytest.raises(CorruptRecordError, match="version"):
        decompress(Compression.SNAPPY, version_zero + struct.pack(">i", len(block)) + block)


@pytest.mark.parametrize("claimed", [500 << 20, 0xFFFFFFFF])
def test_snappy_block_claiming_a_huge_length_is_refused_without_allocating_it(claimed: int) -> None:
    # A length varint no block of this size can honestly produce (snappy expands at most
    # 64 bytes per 3), followed by one literal byte: refused before the buffer is allocated.
    varint = bytearray()
    while claimed >= 0x80:
        varint.append(claimed & 0x7F | 0x80)
        claimed >>= 7
    block = bytes(varint) + bytes([claimed]) + b"\x00x"
    for framed in (block, XERIAL_HEADER + struct.pack(">i", len(block)) + block):
        with pytest.raises(CorruptRecordError, match="snappy: block of 7 bytes claims"):
            decompress(Compression.SNAPPY, framed)


# --- output cap -------------------------------------------------------------------------------


@pytest.mark.parametrize("codec", CODECS, ids=lambda c: c.config_name)
def test_output_is_capped(codec: Compression) -> None:
    data = bytes(3_000_000)  # compresses to almost nothing: a small bomb
    framed = compress(codec, data)
    assert decompress(codec, framed, max_size=len(data)) == data
    with pytest.raises(CorruptRecordError, match=codec.config_name):
        decompress(codec, framed, max_size=len(data) - 1)
    with pytest.raises(CorruptRecordError, match="limit"):
        decompress(codec, framed, max_size=1000)


def test_zstd_bomb_is_stopped_early() -> None:
    # 256 MiB of zeros in a frame of a few kilobytes; the cap stops decoding long before.
    cobj = zstandard.ZstdCompressor(level=1, write_content_size=False).compressobj()
    framed = b"".join(cobj.compress(bytes(1 << 20)) for _ in range(256)) + cobj.flush()
    assert len(framed) < 100_000
    with pytest.raises(CorruptRecordError, match="zstd.*limit"):
        decompress(Compression.ZSTD, framed, max_size=10 << 20)
