"""A leader's append in C is the append Python's path makes.

`Log.append` hands a single replica's record set to one C call that does the whole append (`append_produced`);
when that declines, a leader's set goes to one that checks it and gives it offsets (`prepare_produce`); when
that declines too, `Log._assign`'s Python runs. Two logs receive the same appends, one with the C calls and one
without: every answer (offsets, timestamps, the error and its text), the active segment's counters after each
append, and every byte of the files (indexes included) must be the same, whatever the bytes — valid sets, sets
of several batches, producer ids, compression, corruption anywhere in the header or the records, with the CRC
left wrong or made right again — and whatever the topic's limits make the append do: roll on size or time,
write an index entry, flush.
"""

from __future__ import annotations

import os
import random
import struct
import threading

import crc32c
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from shale.sidecar.log import log as log_module
from shale.sidecar.log._append_kernel import append_produced, prepare_produce
from shale.sidecar.log.compression import Compression
from shale.sidecar.log.errors import KafkaStorageError
from shale.sidecar.log.log import Log
from shale.sidecar.log.open_files import SEGMENT_FILES
from shale.sidecar.log.records import Header, Record, encode_batch
from shale.sidecar.topic_config import TopicConfig
from support.fs_util import PAGE, fill, small_fs

NOW = 1_800_000_000_000
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


def crc_fixed(batch: bytearray, pos: int = 0) -> bytearray:
    """The batch at `pos` with its CRC-32C made right again (a producer that wrote bad records correctly)."""
    size = 12 + struct.unpack_from(">i", batch, pos + 8)[0]
    struct.pack_into(">I", batch, pos + 17, crc32c.crc32c(bytes(batch[pos + 21:pos + size])))
    return batch


@st.composite
def record_sets(draw, plain: bool = False) -> bytes:
    """One to three batches as a producer would send them, then perhaps damaged; `plain`: batches without a
    producer id or compression, with keys, undamaged (what a single replica's C append takes whole)."""
    out = bytearray()
    for _ in range(draw(st.integers(1, 3))):
        base = draw(st.integers(0, 50))  # whatever the producer wrote: the log gives its own offsets
        key = st.binary(max_size=6) if plain else st.none() | st.binary(max_size=6)
        records = [Record(base + i, NOW + draw(st.integers(-5_000, 5_000)), draw(key),
                          draw(st.none() | st.binary(max_size=30)),
                          tuple(Header(k, v) for k, v in draw(st.lists(
                              st.tuples(st.text(max_size=3), st.none() | st.binary(max_size=3)), max_size=2))))
                   for i in range(draw(st.integers(1, 4)))]
        kind = "plain" if plain else draw(st.sampled_from(["plain"] * 4 + ["idempotent", "idempotent", "transactional",
                                                                            "lz4"]))
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
    damage = "none" if plain else draw(st.sampled_from(["none"] * 4 + ["byte", "byte and crc", "crc", "cut", "count"]))
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
    lambda compact, window, max_bytes, limits: {
        "cleanup.policy": "compact" if compact else "delete", "max.message.bytes": str(max_bytes),
        **({"message.timestamp.before.max.ms": "2000", "message.timestamp.after.max.ms": "2000"} if window else {}),
        **limits},
    st.booleans(), st.booleans(), st.sampled_from([100, 300, 1_000_000]),
    # what makes an append roll, index, flush or stamp its own time
    st.fixed_dictionaries({}, optional={
        "segment.bytes": st.sampled_from(["400", "1000", "3000"]),
        "index.interval.bytes": st.sampled_from(["0", "150", "600"]),
        "segment.ms": st.sampled_from(["1000", "5000"]),
        "max.compaction.lag.ms": st.sampled_from(["500", "3000"]),
        "segment.jitter.ms": st.sampled_from(["0", "400"]),
        "flush.messages": st.sampled_from(["1", "4"]),
        "message.timestamp.type": st.sampled_from(["CreateTime", "LogAppendTime"]),
    }))


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


def segment_state(log: Log) -> list[tuple]:
    """What an append changes in memory besides the log end offset, per segment."""
    return [(seg.base_offset, seg.size, seg.bytes_since_last_index_entry, seg.max_ts, seg.offset_index.entries,
             seg.time_index.entries) for seg in log.segments]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(configs, st.lists(st.one_of(st.tuples(record_sets(), st.none() | st.integers(0, 3), st.integers(0, 1500)),
                                   st.tuples(record_sets(plain=True), st.none(), st.integers(0, 1500))),
                         min_size=1, max_size=12))
def test_the_c_append_writes_what_python_writes(tmp_path_factory, monkeypatch, config, appends):
    root = tmp_path_factory.mktemp("logs")
    now = [NOW]
    # The same partition name in two directories (the errors name it), the same segment jitter.
    with_c, python = (Log(str(root / side / "t-0"), TopicConfig.from_mapping(config), clock=lambda: now[0],
                          rng=random.Random(7)) for side in ("c", "py"))
    try:
        # epochs never go back
        for data, epoch, later in sorted(appends, key=lambda a: -1 if a[1] is None else a[1]):
            now[0] += later
            with monkeypatch.context() as m:
                answers = c_appends(m)
                got = outcome(with_c, data, epoch)
            if any(a is not None for a in answers):
                event("appended in C")
            with monkeypatch.context() as m:
                m.setattr(log_module, "_append_produced", None)
                m.setattr(log_module, "_prepare_produce", None)
                expected = outcome(python, data, epoch)
            assert got == expected
            assert segment_state(with_c) == segment_state(python)
            assert (with_c.log_end_offset, with_c.recovery_point) == (python.log_end_offset, python.recovery_point)
        assert with_c.leader_epoch_cache.entries == python.leader_epoch_cache.entries
        with_c.flush()
        python.flush()
        assert files(with_c.dir) == files(python.dir)
    finally:
        with_c.close()
        python.close()


def c_appends(monkeypatch) -> list:
    """The answers of every `append_produced` call from now on (None: declined)."""
    answers: list = []

    def counted(*args):
        answers.append(append_produced(*args))
        return answers[-1]
    monkeypatch.setattr(log_module, "_append_produced", counted)
    return answers


def one_record(i: int, size: int = 100) -> bytes:
    return encode_batch([Record(0, NOW + i, b"k%d" % i, bytes([i % 251]) * size)])


def test_the_common_append_is_made_in_c(tmp_path, monkeypatch):
    """Without this the property above could compare Python with itself. Python's path makes only the first append
    of a segment (its rolling timestamp) and the first index entry of each page of index (the page's allocation);
    the C call makes the rest, index entries included."""
    answers = c_appends(monkeypatch)
    log = Log(str(tmp_path / "t-0"), TopicConfig.from_mapping({"index.interval.bytes": "1000"}), clock=lambda: NOW)
    infos = [log.append(one_record(i)) for i in range(40)]
    assert [info.first_offset for info in infos] == list(range(40))
    assert [i for i, a in enumerate(answers) if a is None] == [0, 6]  # the empty segment; the first index entry
    assert answers[1][:2] == (1, 1) and log.log_end_offset == 40
    assert log.active_segment.size == sum(len(one_record(i)) for i in range(40))
    assert log.active_segment.offset_index.entries == log.active_segment.time_index.entries == 6
    log.close()


def test_a_set_of_several_batches_is_declined_when_one_is_asked(tmp_path):
    """A Produce v3+ partition must hold one batch: the broker's call asks the C append to leave the rest alone."""
    log = Log(str(tmp_path / "t-0"), TopicConfig.from_mapping({}), clock=lambda: NOW)
    log.append(one_record(0))
    assert log.append_in_c(one_record(1) + one_record(2), one_batch=True) is None
    assert log.log_end_offset == 1
    assert log.append_in_c(one_record(1) + one_record(2)).last_offset == 2
    log.close()


def test_a_log_locked_by_another_thread_is_left_to_python(tmp_path, monkeypatch):
    """A roll, truncation or cleaner swap in another thread holds the lock: the C call does not wait or look."""
    log = Log(str(tmp_path / "t-0"), TopicConfig.from_mapping({}), clock=lambda: NOW)
    log.append(one_record(0))
    held, release = threading.Event(), threading.Event()

    def hold():
        with log.lock:
            held.set()
            release.wait(10)
    other = threading.Thread(target=hold)
    other.start()
    try:
        assert held.wait(10)
        assert append_produced(SEGMENT_FILES, crc32c.crc32c, log_module.now_ms, log, one_record(1), False) is None
        assert log.log_end_offset == 1 and not log.lock._is_owned()
    finally:
        release.set()
        other.join()
    answers = c_appends(monkeypatch)
    assert log.append(one_record(1)).first_offset == 1 and answers[-1] is not None
    log.close()


def test_a_closed_log_declines_and_keeps_its_files(tmp_path):
    """A log-dir move's swap or a deletion closes the log under its lock; the I/O thread may still hold the old log
    object it looked up before, and take its lock after: the C append must decline (the frame then goes back to
    the loop, which finds the new log), never write into the closed one."""
    directory = tmp_path / "t-0"
    log = Log(str(directory), TopicConfig.from_mapping({}), clock=lambda: NOW)
    for i in range(3):
        log.append(one_record(i))
    assert log.close()
    before = files(str(directory))
    assert append_produced(SEGMENT_FILES, crc32c.crc32c, log_module.now_ms, log, one_record(3), True) is None
    assert log.log_end_offset == 3 and files(str(directory)) == before


def test_a_full_disk_under_the_c_append_is_a_storage_error_and_leaves_no_bytes(tmp_path, monkeypatch):
    """The C call's write fails (short, then ENOSPC): it declines, and Python's append meets the same disk, cuts what
    was written, and reports the storage error naming the partition and the position."""
    with small_fs(tmp_path, "tmpfs", 512) as mnt:
        answers = c_appends(monkeypatch)
        log = Log(str(mnt / "t-0"), TopicConfig.from_mapping({"index.interval.bytes": "1000000"}),
                  clock=lambda: NOW)
        acked = [log.append(one_record(i)).first_offset for i in range(10)]
        assert answers[-1] is not None
        size = log.active_segment.size
        filler = fill(mnt)
        with pytest.raises(KafkaStorageError, match=f"t-0.*position {size}"):
            log.append(one_record(10, size=PAGE))  # starts in the last page, needs the next one
        assert answers[-1] is None and os.path.getsize(log.active_segment.log_path) == size
        assert log.log_end_offset == 10 and log.storage_failure is not None
        filler.release()
        # Python's path takes the next append (and ends the failure); the one after is the C call's again.
        acked += [log.append(one_record(i)).first_offset for i in (10, 11)]
        assert acked == list(range(12)) and log.storage_failure is None and answers[-1] is not None
        log.close()


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
