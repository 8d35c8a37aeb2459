"""Crash tests with real processes: SIGKILL a writer at random moments, then recover and check everything.

`crash_writer.py` appends keyed batches (mixed sizes and codecs, small segments, a small
index interval) and prints every acknowledged record. The tests kill it many times on
the same directory, so recovery runs on top of earlier recoveries, and then check that
what was acknowledged is there, that nothing corrupt is served, that offsets are dense
and that both indexes agree with the log. Other tests damage the tail of a log left
without a clean-shutdown marker and check Kafka's truncation (spec sections 2.2, 5.3, 5.4).

Reproduce a failure with the CRASH_SEED=<n> printed in its captured output (timing stays random).
"""

from __future__ import annotations

import bisect
import importlib.util
import logging
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import zlib
from dataclasses import dataclass, field

import pytest

from shale.sidecar.log.checkpoint import RECOVERY_POINT_CHECKPOINT, read_offsets
from shale.sidecar.log.log_dir import CLEAN_SHUTDOWN_FILE, LogDir
from shale.sidecar.log.records import Record, decode_batch, encode_batch
from shale.sidecar.log.topic_partition import TopicPartition

WRITER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "crash_writer.py")
_spec = importlib.util.spec_from_file_location("_crash_writer", WRITER)
cw = sys.modules.setdefault("_crash_writer", importlib.util.module_from_spec(_spec))
_spec.loader.exec_module(cw)

TP = TopicPartition(cw.TOPIC, cw.PARTITION)
PARTITION_NAME = str(TP)  # "crash-0"
INDEX_BYTES = int(cw.crash_props("noflush", False)["segment.index.bytes"])
BASE_SEED = int(os.environ.get("CRASH_SEED", random.SystemRandom().randrange(2**32)))


# -- driving the writer ----------------------------------------------------------------------------


@dataclass
class Run:
    returncode: int
    start: tuple[int, int] | None  # (log end offset, recovery point) after the writer's recovery
    acks: list[tuple[int, str, str]] = field(default_factory=list)  # (offset, key, digest)
    closed: bool = False
    done: bool = False
    stderr: str = ""


def _writer_cmd(directory: str, mode: str, preallocate: bool, seed: int, *extra: str) -> list[str]:
    cmd = [sys.executable, WRITER, directory, "--mode", mode, "--seed", str(seed), *extra]
    if preallocate:
        cmd.append("--preallocate")
    return cmd


_WRITERS: list[subprocess.Popen] = []


@pytest.fixture(autouse=True)
def _reap_writers():
    """A failed assertion must not leave a writer running: kill the ones this test started."""
    print(f"CRASH_SEED={BASE_SEED}")  # shown with a failure, to reproduce it
    yield
    while _WRITERS:
        proc = _WRITERS.pop()
        if proc.poll() is None:
            proc.kill()
        proc.wait()


class Writer:
    """A writer subprocess whose stdout lines are collected by a thread as they arrive."""

    def __init__(self, cmd: list[str]) -> None:
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        _WRITERS.append(self.proc)
        self.lines: list[bytes] = []
        self.cond = threading.Condition()
        self.err = b""
        self._out = threading.Thread(target=self._pump, daemon=True)
        self._err = threading.Thread(target=self._pump_err, daemon=True)
        self._out.start()
        self._err.start()

    def _pump(self) -> None:
        for line in iter(self.proc.stdout.readline, b""):
            with self.cond:
                self.lines.append(line)
                self.cond.notify_all()

    def _pump_err(self) -> None:
        self.err = self.proc.stderr.read()

    def wait_for(self, predicate, timeout: float = 20.0) -> bool:
        deadline = time.monotonic() + timeout
        with self.cond:
            while not predicate(self.lines):
                left = deadline - time.monotonic()
                if left <= 0 or self.proc.poll() is not None and not self._out.is_alive():
                    return predicate(self.lines)
                self.cond.wait(min(left, 0.05))
            return True

    def signal(self, sig: int) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)

    def finish(self, timeout: float = 30.0) -> Run:
        try:
            rc = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(f"writer did not stop; stderr so far: {self.err!r}")
        self._out.join(10)
        self._err.join(10)
        run = Run(rc, None, stderr=self.err.decode(errors="replace"))
        for raw in self.lines:
            if not raw.endswith(b"\n"):
                continue  # a line cut by the kill was never acknowledged
            parts = raw.decode().split()
            if parts[0] == "start":
                run.start = (int(parts[1]), int(parts[2]))
            elif parts[0] == "closed":
                run.closed = True
            elif parts[0] == "done":
                run.done = True
            else:
                run.acks.append((int(parts[0]), parts[1], parts[2]))
        return run


def _has_start(lines) -> bool:
    return any(line.startswith(b"start ") for line in lines)


def _acked_records(n: int):
    return lambda lines: sum(1 for line in lines if line[:1].isdigit()) >= n


def _config(mode: str = "noflush", preallocate: bool = False):
    return cw.make_config(cw.crash_props(mode, preallocate))


def _open(directory: str, config) -> tuple[LogDir, object]:
    log_dir = LogDir(directory, lambda topic: config)
    assert TP in log_dir.logs, f"{PARTITION_NAME} was not loaded from {directory}"
    return log_dir, log_dir.logs[TP]


# -- checking a recovered log ----------------------------------------------------------------------


@dataclass
class Scanned:
    records: dict[int, tuple[bytes | None, bytes | None, int]]  # offset -> (key, value, timestamp)


def check_log(log, acked: dict[int, tuple[str, str]], rng: random.Random, *, preallocate: bool = False) -> Scanned:
    """Everything the crash tests require of a log that was just opened (recovered or clean)."""
    records: dict[int, tuple[bytes | None, bytes | None, int]] = {}
    next_offset = log.log_start_offset
    assert log.segments[0].base_offset == log.log_start_offset == 0
    for n, seg in enumerate(log.segments):
        last_segment = n == len(log.segments) - 1
        # Every batch is whole, passes its CRC, and offsets are dense across batches and segments.
        position = 0
        starts: set[int] = set()
        batches = []
        for bp in seg.batches():
            assert bp.position == position, f"gap in {seg.log_path} at {position}"
            batch = decode_batch(seg.read_bytes(bp.position, bp.size), seg.log_path)
            h = batch.header
            if not batches:
                assert h.base_offset == seg.base_offset, f"{seg.log_path} starts at {h.base_offset}"
            assert h.base_offset == next_offset, f"offsets not dense: batch at {h.base_offset}, expected {next_offset}"
            assert [r.offset for r in batch.records] == list(range(h.base_offset, h.last_offset + 1))
            for r in batch.records:
                records[r.offset] = (r.key, r.value, r.timestamp)
            starts.add(bp.position)
            batches.append(h)
            next_offset = h.last_offset + 1
            position += bp.size
        assert position == seg.size, f"{seg.log_path}: {seg.size - position} bytes after the last whole batch"
        file_size = os.path.getsize(seg.log_path)
        if file_size != seg.size:
            assert preallocate and last_segment, f"{seg.log_path} is {file_size} bytes, {seg.size} valid"
            with open(seg.log_path, "rb") as f:
                f.seek(seg.size)
                assert f.read() == b"\0" * (file_size - seg.size), f"non-zero bytes after the end of {seg.log_path}"
        assert batches or last_segment, f"empty segment {seg.log_path} in the middle of the log"
        assert seg.next_offset == next_offset
        _check_offset_index(seg, batches, starts)
        _check_time_index(seg, batches, last_segment)
    assert log.log_end_offset == next_offset
    assert log.recovery_point <= log.log_end_offset
    # Loading resizes the active segment's indexes back to segment.index.bytes (spec 5.3), so appends go on
    # without an early roll; the inactive ones hold exactly their entries (spec 2.3).
    active = log.active_segment
    assert os.path.getsize(active.offset_index.path) == INDEX_BYTES - INDEX_BYTES % 8
    assert os.path.getsize(active.time_index.path) == INDEX_BYTES - INDEX_BYTES % 12
    for seg in log.segments[:-1]:
        assert os.path.getsize(seg.offset_index.path) == 8 * seg.offset_index.entries, seg.offset_index.path
        assert os.path.getsize(seg.time_index.path) == 12 * seg.time_index.entries, seg.time_index.path

    # Every acknowledged record is there with its key and value.
    missing = [o for o in acked if o not in records]
    assert not missing, f"{len(missing)} acknowledged records lost, first {missing[:5]}, log end {log.log_end_offset}"
    for offset, (key, dig) in acked.items():
        k, v, _ = records[offset]
        assert k is not None and k.decode() == key, f"offset {offset}: key {k!r}, acknowledged {key!r}"
        assert cw.digest(k, v) == dig, f"offset {offset}: value differs from the acknowledged one"

    _check_lookups(log, acked, rng)
    _check_reads(log, records, rng)
    _check_timestamp_lookups(log, records, rng)
    return Scanned(records)


def _check_offset_index(seg, batches, starts: set[int]) -> None:
    idx = seg.offset_index
    positions = sorted(starts)
    prev = None
    for slot in range(idx.entries):
        offset, position = idx.entry(slot)
        where = f"{idx.path} slot {slot} = ({offset}, {position})"
        assert position in starts, f"{where}: position is not the start of a batch"
        batch = batches[positions.index(position)]
        assert batch.base_offset <= offset < seg.next_offset, f"{where}: offset outside the batch/segment"
        # The batch holding `offset` starts at or after the entry's position, so a scan from it finds it.
        holder = next(i for i, b in enumerate(batches) if b.base_offset <= offset <= b.last_offset)
        assert positions[holder] >= position, where
        if prev is not None:
            assert offset > prev[0] and position > prev[1], f"{where}: not increasing after {prev}"
        prev = (offset, position)


def _check_time_index(seg, batches, last_segment: bool) -> None:
    idx = seg.time_index
    prev = None
    for slot in range(idx.entries):
        ts, offset = idx.entry(slot)
        where = f"{idx.path} slot {slot} = ({ts}, {offset})"
        # Kafka's entry is (max timestamp so far, last offset of the first batch that reached it).
        holder = [i for i, b in enumerate(batches) if b.last_offset == offset]
        assert holder, f"{where}: offset is not the last offset of a batch"
        i = holder[0]
        assert batches[i].max_timestamp == ts, f"{where}: batch max timestamp is {batches[i].max_timestamp}"
        assert all(b.max_timestamp < ts for b in batches[:i]), f"{where}: an earlier batch has a larger timestamp"
        if prev is not None:
            assert ts > prev[0] and offset >= prev[1], f"{where}: not increasing after {prev}"
        prev = (ts, offset)
    if batches and not last_segment:
        # Roll and close write the segment's max timestamp as the final entry (spec 2.6); retention needs it.
        assert prev is not None and prev[0] == max(b.max_timestamp for b in batches), (
            f"{idx.path}: last entry {prev}, segment max timestamp {max(b.max_timestamp for b in batches)}"
        )


def _batches_in(data: bytes) -> list[bytes]:
    """Whole batches of a fetch response; a partial trailing batch is skipped, as consumers do."""
    out, pos = [], 0
    while pos + 12 <= len(data):
        size = 12 + int.from_bytes(data[pos + 8 : pos + 12], "big", signed=True)
        assert size >= 61, f"a read returned a batch length of {size} at byte {pos}"
        if pos + size > len(data):
            break
        out.append(data[pos : pos + size])
        pos += size
    return out


def _check_lookups(log, acked, rng: random.Random) -> None:
    """Index lookups of acknowledged offsets land on the batch holding them, via the segment and via read()."""
    offsets = sorted(acked)
    bases = [seg.base_offset for seg in log.segments]
    for offset in offsets:
        seg = log.segments[bisect.bisect_right(bases, offset) - 1]
        found = seg.translate_offset(offset)
        assert found is not None and found.header.base_offset <= offset <= found.header.last_offset, (
            f"translate_offset({offset}) in {seg.log_path} gave {found}"
        )
    for offset in rng.sample(offsets, min(len(offsets), 1500)):
        data = log.read(offset, 1).read()
        first = decode_batch(_batches_in(data)[0])
        assert first.header.base_offset <= offset <= first.header.last_offset, f"read({offset}) started at {first.header}"


def _check_reads(log, records, rng: random.Random) -> None:
    """A consumer fetching from the start with varying sizes gets every record, each batch CRC-valid."""
    offset = log.log_start_offset
    seen = 0
    while offset < log.log_end_offset:
        sliced = log.read(offset, rng.choice((1, 700, 5000, 40000)))
        assert sliced is not None, f"read({offset}) returned nothing below the log end {log.log_end_offset}"
        batches = _batches_in(sliced.read())
        assert batches, f"read({offset}) returned no whole batch"
        for raw in batches:
            batch = decode_batch(raw)  # raises on a CRC mismatch: nothing corrupt is served
            for r in batch.records:
                if r.offset >= offset:
                    assert records[r.offset] == (r.key, r.value, r.timestamp), f"read differs at {r.offset}"
                    seen += 1
            offset = max(offset, batch.header.last_offset + 1)
    assert seen == len(records)
    assert log.read(log.log_end_offset, 100) is None


def _check_timestamp_lookups(log, records, rng: random.Random) -> None:
    """offset_for_timestamp agrees with a brute-force scan for the first record with ts >= target."""
    if not records:
        assert log.offset_for_timestamp(cw.T0) is None
        return
    offsets = sorted(records)
    stamps = [records[o][2] for o in offsets]
    running, prefix = -(2**63), []
    for ts in stamps:
        running = max(running, ts)
        prefix.append(running)

    def brute(target: int):
        i = bisect.bisect_left(prefix, target)  # first record whose timestamp reaches the target
        return None if i == len(offsets) else (offsets[i], stamps[i])

    targets = {min(stamps) - 1, min(stamps), max(stamps), max(stamps) + 1}
    for ts in rng.sample(stamps, min(len(stamps), 150)):
        targets.update((ts - 1, ts, ts + 1))
    targets.update(rng.randint(min(stamps), max(stamps)) for _ in range(100))
    for target in sorted(targets):
        assert log.offset_for_timestamp(target) == brute(target), f"offset_for_timestamp({target})"


def _continue_appending(log, scanned: Scanned) -> None:
    """After recovery the log takes appends at its end offset and serves them."""
    leo = log.log_end_offset
    recs = [Record(i, cw.T0 + leo * 7 + i, f"after-{leo}-{i}".encode(), b"v" * (50 * i)) for i in range(3)]
    info = log.append(encode_batch(recs))
    assert (info.first_offset, info.last_offset) == (leo, leo + 2)
    assert log.log_end_offset == leo + 3
    got = decode_batch(_batches_in(log.read(leo, 1).read())[0])
    assert [(r.offset, r.key) for r in got.records] == [(leo + i, r.key) for i, r in enumerate(recs)]
    for i, r in enumerate(recs):
        scanned.records[leo + i] = (r.key, r.value, r.timestamp)


# -- random kills ----------------------------------------------------------------------------------

CYCLES = 10
CLEAN_STOP_CYCLES = {3, 7}  # SIGTERM: the writer closes cleanly, so the next start takes the clean path
TERM_THEN_KILL_CYCLES = {5}  # SIGTERM then SIGKILL a moment later: the kill may land inside the clean close


@pytest.mark.parametrize(
    "mode,preallocate",
    [("flush", False), ("noflush", False), ("noflush", True), ("flush", True)],
    ids=["flush-every-append", "no-flush", "no-flush-preallocate", "flush-preallocate"],
)
def test_random_kills_keep_every_acknowledged_record(tmp_path, mode, preallocate):
    seed = BASE_SEED ^ zlib.crc32(f"{mode}/{preallocate}".encode())
    rng = random.Random(seed)
    directory = str(tmp_path / "data")
    acked: dict[int, tuple[str, str]] = {}
    next_expected = 0  # the log end offset after a clean stop, else a lower bound
    clean_before = False
    kills = 0
    for cycle in range(CYCLES):
        ctx = f"seed {seed}, cycle {cycle} ({mode}, preallocate={preallocate})"
        checkpoint_every = rng.choice(("0", "7", "40"))
        w = Writer(_writer_cmd(directory, mode, preallocate, seed * 100 + cycle, "--checkpoint-every", checkpoint_every))
        if cycle in CLEAN_STOP_CYCLES:
            assert w.wait_for(_has_start), f"writer did not start ({ctx}): {w.err!r}"
            time.sleep(rng.uniform(0.02, 0.15))
            w.signal(signal.SIGTERM)
            run = w.finish()
            assert run.returncode == 0 and run.closed, f"clean stop failed ({ctx}): rc {run.returncode}\n{run.stderr}"
        else:
            if cycle in TERM_THEN_KILL_CYCLES:
                assert w.wait_for(_has_start), f"writer did not start ({ctx}): {w.err!r}"
                time.sleep(rng.uniform(0.02, 0.15))
                w.signal(signal.SIGTERM)
                time.sleep(rng.uniform(0.0, 0.01))
            elif cycle == 0:  # enough data for several segments whatever the machine's speed
                assert w.wait_for(_acked_records(rng.randint(150, 400))), f"writer made no progress ({ctx}): {w.err!r}"
            elif rng.random() < 0.3:
                time.sleep(rng.uniform(0.0, 0.3))  # blind: may land in start-up or recovery
            else:
                assert w.wait_for(_has_start), f"writer did not start ({ctx}): {w.err!r}"
                time.sleep(rng.uniform(0.0, 0.2))
            w.signal(signal.SIGKILL)
            run = w.finish()
            if cycle in TERM_THEN_KILL_CYCLES and run.returncode == 0:
                assert run.closed, f"{ctx}: {run.stderr}"  # the clean close finished before the kill
            else:
                assert run.returncode == -signal.SIGKILL, f"writer died on its own ({ctx}): rc {run.returncode}\n{run.stderr}"
                kills += 1
        assert "Traceback" not in run.stderr, f"{ctx}:\n{run.stderr}"
        if run.start is not None:
            leo, recovery_point = run.start
            # Recovery kept every acknowledged record (the page cache survives SIGKILL, so both modes).
            assert leo >= next_expected, f"log end {leo} after recovery, {next_expected} already acknowledged ({ctx})"
            assert recovery_point <= leo
            if clean_before:
                assert (leo, recovery_point) == (next_expected, next_expected), (
                    f"after a clean shutdown at {next_expected}: start {run.start} ({ctx})"
                )
            # The writer continued at the log end offset, densely.
            assert [a[0] for a in run.acks] == list(range(leo, leo + len(run.acks))), ctx
            for offset, key, dig in run.acks:
                acked[offset] = (key, dig)
            next_expected = leo + len(run.acks)
        else:
            assert not run.acks
        clean_before = run.closed
    assert kills >= 7
    assert len(acked) > 50, f"the writers acknowledged only {len(acked)} records in {CYCLES} runs (seed {seed})"

    # Recover in this process and check everything; then append, close, reopen cleanly and check again.
    config = _config(mode, preallocate)
    log_dir, log = _open(directory, config)
    scanned = check_log(log, acked, rng, preallocate=preallocate)
    assert len(log.segments) > 3, "segments did not roll"
    assert any(seg.offset_index.entries for seg in log.segments), "no offset index entries were written"
    _continue_appending(log, scanned)
    leo = log.log_end_offset
    log_dir.close()
    log_dir, log = _open(directory, config)
    assert log_dir.had_clean_shutdown and log.log_end_offset == leo and log.recovery_point == leo
    check_log(log, acked, rng, preallocate=preallocate)
    log_dir.close()


# -- damaged tails ---------------------------------------------------------------------------------


@dataclass
class Base:
    directory: str
    acked: dict[int, tuple[str, str]]
    recovery_point: int


@pytest.fixture(scope="module")
def crashed_base(tmp_path_factory) -> Base:
    """A log left as a crash leaves it: 220 appends, recovery point checkpointed after append 60, no marker."""
    directory = str(tmp_path_factory.mktemp("crashed") / "data")
    run = Writer(_writer_cmd(directory, "noflush", False, BASE_SEED, "--appends", "220", "--checkpoint-at", "60")).finish()
    assert run.returncode == 0 and not run.closed, run.stderr
    assert not os.path.exists(os.path.join(directory, CLEAN_SHUTDOWN_FILE))
    recovery_point = read_offsets(os.path.join(directory, RECOVERY_POINT_CHECKPOINT))[TP]
    return Base(directory, {o: (k, d) for o, k, d in run.acks}, recovery_point)


def _copy(base: Base, tmp_path) -> str:
    directory = str(tmp_path / "data")
    shutil.copytree(base.directory, directory)
    return directory


def _segments_on_disk(directory: str) -> list[str]:
    part = os.path.join(directory, PARTITION_NAME)
    return sorted(os.path.join(part, n) for n in os.listdir(part) if n.endswith(".log"))


def _batches_on_disk(path: str) -> list[tuple[int, int, int, int]]:
    """(position, size, base offset, last offset) of the batches of a `.log` file."""
    out = []
    with open(path, "rb") as f:
        data = f.read()
    pos = 0
    while pos < len(data):
        batch = decode_batch(data[pos : pos + 12 + int.from_bytes(data[pos + 8 : pos + 12], "big")])
        out.append((pos, batch_size := 12 + batch.header.batch_length, batch.header.base_offset, batch.header.last_offset))
        pos += batch_size
    return out


def _warned(caplog, offset: int) -> bool:
    """A WARNING names the partition and the offset where the log was cut."""
    pattern = re.compile(rf"(?<!\d){offset}(?!\d)")
    return any(
        r.levelno == logging.WARNING and PARTITION_NAME in r.getMessage() and pattern.search(r.getMessage())
        for r in caplog.records
    )


def _reopen_and_check(directory: str, acked, expected_end: int, caplog, rng, warn_offset: int | None = None,
                      after_open=None):
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        log_dir, log = _open(directory, _config())
    if after_open is not None:
        after_open()
    assert not log_dir.had_clean_shutdown
    assert log.log_end_offset == expected_end
    if warn_offset is not None:
        assert _warned(caplog, warn_offset), (
            f"no WARNING naming {PARTITION_NAME} and offset {warn_offset}: {[r.getMessage() for r in caplog.records]}"
        )
    kept = {o: v for o, v in acked.items() if o < expected_end}
    scanned = check_log(log, kept, rng)
    assert set(scanned.records) == set(range(expected_end))
    _continue_appending(log, scanned)
    log_dir.close()
    # Recovered, appended and closed cleanly: a second open sees the same, appended log.
    log_dir, log = _open(directory, _config())
    assert log_dir.had_clean_shutdown and log.log_end_offset == expected_end + 3
    check_log(log, kept, rng)
    log_dir.close()


def test_base_log_is_a_real_crash_state(crashed_base, tmp_path, caplog):
    """The fixture's log rolls, has index entries, a recovery point inside it, and recovers untouched."""
    segs = _segments_on_disk(crashed_base.directory)
    assert len(segs) >= 5
    last_base = int(os.path.basename(segs[-1])[:20])
    assert 0 < crashed_base.recovery_point < last_base
    end = max(crashed_base.acked) + 1
    directory = _copy(crashed_base, tmp_path)
    # The active segment's index is still preallocated (untrimmed), as a crash leaves it.
    assert os.path.getsize(segs[-1][:-4] + ".index") == 4096
    _reopen_and_check(directory, crashed_base.acked, end, caplog, random.Random(BASE_SEED))
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING and "truncated" in r.getMessage()]


def _damage_tail(path: str, how: str, rng: random.Random) -> tuple[int, int]:
    """Damage the active segment; return (expected log end, offset the warning must name)."""
    batches = _batches_on_disk(path)
    pos, size, base, last = batches[-1]
    with open(path, "r+b") as f:
        if how == "cut":
            f.truncate(pos + rng.randint(1, size - 1))
        elif how == "cut-in-header":  # 17 bytes or fewer left: the reader stops before the magic
            f.truncate(pos + rng.randint(1, 17))
        elif how == "garbage":
            k = rng.randint(1, min(size - 61, 64)) if size > 61 else 1
            f.seek(pos + size - k)
            old = f.read(k)
            f.seek(pos + size - k)
            f.write(bytes(b ^ rng.randint(1, 255) for b in old))
        elif how in ("zeros-few", "zeros"):
            f.seek(0, os.SEEK_END)
            f.write(b"\0" * (rng.randint(1, 17) if how == "zeros-few" else rng.randint(18, 12000)))
            return last + 1, last + 1
        elif how in ("length-huge", "length-small", "length-off"):
            declared = size - 12
            new = {"length-huge": 2**31 - 1, "length-small": rng.randint(0, 13),
                   "length-off": declared + rng.choice((-7, -1, 1, 9))}[how]
            f.seek(pos + 8)
            f.write(new.to_bytes(4, "big", signed=True))
        else:
            raise AssertionError(how)
    return base, base


@pytest.mark.parametrize(
    "how", ["cut", "cut-in-header", "garbage", "zeros", "zeros-few", "length-huge", "length-small", "length-off"]
)
def test_torn_tail_is_truncated_to_the_last_valid_batch(crashed_base, tmp_path, caplog, how):
    rng = random.Random(BASE_SEED ^ zlib.crc32(how.encode()))
    directory = _copy(crashed_base, tmp_path)
    active = _segments_on_disk(directory)[-1]
    before = _batches_on_disk(active)
    expected_end, warn_offset = _damage_tail(active, how, rng)
    zeros = how.startswith("zeros")
    kept = before if zeros else before[:-1]
    assert expected_end == (before[-1][3] + 1 if zeros else before[-1][2])

    def cut_at_last_valid_batch():
        assert _batches_on_disk(active) == kept
        assert os.path.getsize(active) == (kept[-1][0] + kept[-1][1] if kept else 0)

    _reopen_and_check(directory, crashed_base.acked, expected_end, caplog, rng, warn_offset,
                      after_open=cut_at_last_valid_batch)


@pytest.mark.parametrize("how", ["crc", "length"])
def test_corrupt_batch_in_older_segment_after_recovery_point(crashed_base, tmp_path, caplog, how):
    """Recovery truncates at the corrupt batch and deletes every later segment (spec 5.3)."""
    rng = random.Random(BASE_SEED ^ 0x5EED)
    directory = _copy(crashed_base, tmp_path)
    segs = _segments_on_disk(directory)
    rp = crashed_base.recovery_point
    # An older (not active) segment entirely above the recovery point's segment, with a batch in its middle.
    candidates = [s for s in segs[:-1] if int(os.path.basename(s)[:20]) > rp and len(_batches_on_disk(s)) >= 3]
    assert candidates, "no older segment above the recovery point to corrupt"
    victim = rng.choice(candidates)
    batches = _batches_on_disk(victim)
    pos, size, base, last = batches[rng.randrange(1, len(batches) - 1)]
    with open(victim, "r+b") as f:
        if how == "crc":
            at = pos + rng.randrange(61, size) if size > 61 else pos + 30
            f.seek(at)
            byte = f.read(1)[0]
            f.seek(at)
            f.write(bytes([byte ^ (1 << rng.randrange(8))]))
        else:
            f.seek(pos + 8)
            f.write((size - 12 + rng.choice((-3, 5, 10_000_000))).to_bytes(4, "big"))
    later = segs[segs.index(victim) + 1 :]

    def files_after_recovery():
        assert _segments_on_disk(directory) == segs[: segs.index(victim) + 1]
        for path in later:
            stem = path[:-4]
            assert not any(os.path.exists(stem + s) for s in (".log", ".index", ".timeindex")), f"{stem} not deleted"
        assert os.path.getsize(victim) == pos

    _reopen_and_check(directory, crashed_base.acked, base, caplog, rng, base, after_open=files_after_recovery)


# -- preallocation ---------------------------------------------------------------------------------


def test_kill_leaves_preallocated_zeros_that_recovery_truncates(tmp_path, caplog):
    directory = str(tmp_path / "data")
    rng = random.Random(BASE_SEED ^ 0xA11C)
    w = Writer(_writer_cmd(directory, "noflush", True, BASE_SEED, "--appends", "150", "--hang"))
    assert w.wait_for(lambda lines: b"done\n" in lines), f"writer did not finish its appends: {w.err!r}"
    w.signal(signal.SIGKILL)
    run = w.finish()
    assert run.returncode == -signal.SIGKILL and run.done, run.stderr
    acked = {o: (k, d) for o, k, d in run.acks}
    end = max(acked) + 1
    segs = _segments_on_disk(directory)
    assert len(segs) >= 3
    # The killed writer left its active segment preallocated: real batches, then zeros to segment.bytes.
    active = segs[-1]
    with open(active, "rb") as f:
        data = f.read()
    assert len(data) == cw.SEGMENT_BYTES
    valid = sum(size for _, size, _, _ in _batches_on_disk_prefix(data))
    assert 0 < valid < len(data) and data[valid:] == b"\0" * (len(data) - valid)
    # Rolled segments were trimmed to their batches (every byte decodes as one: no preallocated zeros are left).
    # Batches may fill one to exactly segment.bytes: Kafka rolls only when the next batch would go past it
    # (CRASH_SEED=2706106825 gives one such segment).
    for path in segs[:-1]:
        assert os.path.getsize(path) == sum(b[1] for b in _batches_on_disk(path)) <= cw.SEGMENT_BYTES
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        log_dir, log = _open(directory, _config("noflush", True))
    assert log.log_end_offset == end
    assert _warned(caplog, end), [r.getMessage() for r in caplog.records]
    assert os.path.getsize(active) == valid
    scanned = check_log(log, acked, rng, preallocate=True)
    _continue_appending(log, scanned)
    # Keep writing through a few rolls: new segments are preallocated again, then trimmed on roll.
    for i in range(40):
        log.append(encode_batch([Record(0, cw.T0 + i, b"k%d" % i, bytes(1500))]))
    assert len(log.segments) > len(segs)
    assert os.path.getsize(log.active_segment.log_path) == cw.SEGMENT_BYTES
    leo = log.log_end_offset
    log_dir.close()
    log_dir, log = _open(directory, _config("noflush", True))
    assert log_dir.had_clean_shutdown and log.log_end_offset == leo
    check_log(log, acked, rng, preallocate=True)
    log_dir.close()


def _batches_on_disk_prefix(data: bytes):
    """Whole valid batches at the start of `data`, stopping at zeros."""
    pos = 0
    while pos + 61 <= len(data):
        size = 12 + int.from_bytes(data[pos + 8 : pos + 12], "big", signed=True)
        if size < 61 or pos + size > len(data):
            return
        batch = decode_batch(data[pos : pos + size])
        yield pos, size, batch.header.base_offset, batch.header.last_offset
        pos += size
