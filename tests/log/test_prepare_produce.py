"""A leader's append through the C check (`prepare_produce`) is the append Python's path makes.

`Log.append` hands a leader's record set to one C call that checks it and gives it offsets, and runs its own
Python (`Log._assign`) whenever the C call declines. Two logs receive the same appends, one with the C call and
one without: every answer (offsets, timestamps, the error and its text) and every byte of the files must be
the same, whatever the bytes — valid sets, sets of several batches, producer ids, compression, corruption
anywhere in the header or the records, with the CRC left wrong or made right again.
"""

from __future__ import annotations

import os
import struct

import crc32c
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from shale.sidecar.log import log as log_module
from shale.sidecar.log._cleaner_kernel import prepare_produce
from shale.sidecar.log.compression import Compression
from shale.sidecar.log.log import Log
from shale.sidecar.log.records import Header, Record, encode_batch
from shale.sidecar.topic_config import TopicConfig

NOW = 1_800_000_000_000
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


def crc_fixed(batch: bytearray, pos: int = 0) -> bytearray:
    """The batch at `pos` with its CRC-32C made right again (a producer that wrote bad records correctly)."""
    size = 12 + struct.unpack_from(">i", batch, pos + 8)[0]
    struct.pack_into(">I", batch, pos + 17, crc32c.crc32c(bytes(batch[pos + 21:pos + size])))
    return batch


@st.composite
def record_sets(draw) -> bytes:
    """One to three batches as a producer would send them, then perhaps damaged."""
    out = bytearray()
    for _ in range(draw(st.integers(1, 3))):
        base = draw(st.integers(0, 50))  # whatever the producer wrote: the log gives its own offsets
        records = [Record(base + i, NOW + draw(st.integers(-5_000, 5_000)), draw(st.none() | st.binary(max_size=6)),
                          draw(st.none() | st.binary(max_size=30)),
                          tuple(Header(k, v) for k, v in draw(st.lists(
                              st.tuples(st.text(max_size=3), st.none() | st.binary(max_size=3)), max_size=2))))
                   for i in range(draw(st.integers(1, 4)))]
        kind = draw(st.sampled_from(["plain"] * 4 + ["idempotent", "idempotent", "transactional", "lz4"]))
        producer = kind in ("idempotent", "transactional")
        out += encode_batch(
            records,
            partition_leader_epoch=draw(st.sampled_from([-1, 0, 7])),
            # sequences that follow on, repeat (a retry: a duplicate) or jump (out of order), epochs that fence
            producer_id=draw(st.sampled_from([1000, 1001])) if producer else -1,
            producer_epoch=draw(st.sampled_from([0, 1])) if producer else -1,
            base_sequence=draw(st.sampled_from([0, 1, 2, 4, 2**31 - 2])) if producer else -1,
            is_transactional=kind == "transactional",
            compression=Compression.LZ4 if kind == "lz4" else Compression.NONE)
    damage = draw(st.sampled_from(["none"] * 4 + ["byte", "byte and crc", "crc", "cut", "count"]))
    if damage == "crc":  # the records intact, the checksum not
        out[draw(st.integers(17, 20))] ^= draw(st.integers(1, 255))
    elif damage in ("byte", "byte and crc"):
        at = draw(st.integers(0, len(out) - 1))
        out[at] ^= draw(st.integers(1, 255))
        if damage == "byte and crc" and at >= 21 and len(out) >= 61:
            try:
                crc_fixed(out)
            except struct.error:
                pass
    elif damage == "cut":
        del out[draw(st.integers(0, len(out) - 1)):]
    elif damage == "count":  # records count and offset range disagree, CRC right
        struct.pack_into(">i", out, 57, struct.unpack_from(">i", out, 57)[0] + 1)
        crc_fixed(out)
    return bytes(out)


configs = st.builds(
    lambda compact, window, max_bytes: {
        "cleanup.policy": "compact" if compact else "delete", "max.message.bytes": str(max_bytes),
        **({"message.timestamp.before.max.ms": "2000", "message.timestamp.after.max.ms": "2000"} if window else {})},
    st.booleans(), st.booleans(), st.sampled_from([100, 300, 1_000_000]))


def outcome(log: Log, data: bytes, leader_epoch: int | None):
    try:
        info = log.append(data, leader_epoch=leader_epoch)
    except Exception as exc:  # noqa: BLE001 - the error is the outcome compared
        return type(exc).__name__, str(exc)
    return info


def files(directory: str) -> dict[str, bytes]:
    out = {}
    for name in sorted(os.listdir(directory)):
        with open(os.path.join(directory, name), "rb") as f:
            out[name] = f.read()
    return out


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(configs, st.lists(st.tuples(record_sets(), st.none() | st.integers(0, 3)), min_size=1, max_size=5))
def test_the_c_check_appends_what_python_appends(tmp_path_factory, monkeypatch, config, appends):
    root = tmp_path_factory.mktemp("logs")
    # The same partition name in two directories: the errors name it.
    with_c = Log(str(root / "c" / "t-0"), TopicConfig.from_mapping(config), clock=lambda: NOW)
    python = Log(str(root / "py" / "t-0"), TopicConfig.from_mapping(config), clock=lambda: NOW)
    try:
        for data, epoch in sorted(appends, key=lambda a: -1 if a[1] is None else a[1]):  # epochs never go back
            got = outcome(with_c, data, epoch)
            with monkeypatch.context() as m:
                m.setattr(log_module, "_prepare_produce", None)
                expected = outcome(python, data, epoch)
            assert got == expected
        assert with_c.log_end_offset == python.log_end_offset
        assert with_c.leader_epoch_cache.entries == python.leader_epoch_cache.entries
        with_c.flush()
        python.flush()
        assert files(with_c.dir) == files(python.dir)
    finally:
        with_c.close()
        python.close()


def plain(**kwargs) -> bytearray:
    return bytearray(encode_batch([Record(0, NOW, b"k", b"v")], **kwargs))


def prepare(buf: bytearray, next_offset: int = 10, epoch: int = 3, require_key: bool = False):
    return prepare_produce(buf, next_offset, epoch, 1 << 30, 1 << 20, require_key, INT64_MIN, INT64_MAX,
                           crc32c.crc32c)


def test_a_plain_set_is_checked_and_numbered_in_c():
    """The common case does not fall back: otherwise the property above would compare Python with itself."""
    buf = plain() + plain()
    assert prepare(buf) == (11, NOW, 10, 2, None)
    assert struct.unpack_from(">qii", buf, 0)[0::2] == (10, 3)
    assert struct.unpack_from(">q", buf, len(buf) // 2)[0] == 11


def test_producer_batches_come_back_at_their_new_offsets():
    """An idempotent producer's batches are numbered in C too; producer state gets their fields, sequences wrapped."""
    buf = plain(producer_id=5, producer_epoch=2, base_sequence=2**31 - 1) + bytearray(encode_batch(
        [Record(0, NOW, b"k", b"v"), Record(1, NOW + 1, b"k", b"w")], producer_id=6, producer_epoch=0,
        base_sequence=2**31 - 1, is_transactional=True))
    assert prepare(buf) == (12, NOW + 1, 12, 2, [(5, 2, 2**31 - 1, 2**31 - 1, 10, 10, NOW, False),
                                                 (6, 0, 2**31 - 1, 0, 11, 12, NOW + 1, True)])


@pytest.mark.parametrize("buf", [
    plain(is_control=True),
    plain(is_transactional=True),
    bytearray(encode_batch([Record(0, NOW, b"k", b"v")], compression=Compression.LZ4)),
    plain(is_control=False)[:-1],
    bytearray(),
], ids=["control", "transactional without a producer id", "compressed", "cut", "empty"])
def test_what_c_declines_is_left_untouched(buf):
    before = bytes(buf)
    assert prepare(buf) is None
    assert buf == before


def test_a_missing_key_on_a_compacted_topic_is_declined():
    buf = bytearray(encode_batch([Record(0, NOW, None, b"v")]))
    assert prepare(buf, require_key=True) is None
    assert prepare(buf, require_key=False) is not None
