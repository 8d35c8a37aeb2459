"""Compaction benchmark: one cleaner pass over a log of 10 million records on 1 million keys.

    .venv/bin/python bench/compaction.py            # full run (~3 minutes), updates docs/performance.md
    .venv/bin/python bench/compaction.py --quick    # 1M records (C) and 200k (pure Python), prints only
    .venv/bin/python bench/compaction.py --profile  # also cProfile each cleaning pass

The log: uncompressed v2 batches of 300 records (~39 KB), keys `user-0000000`..`user-0999999`
(12 bytes, stored inline in the offset map), each record's key drawn **uniformly** at random
(seeded), 100-byte values, timestamps 1 ms apart, Kafka's default segment.bytes (1 GiB). The
batches are built directly (a fixed record layout, CRC-32C per batch) and appended as a follower
appends (`assign_offsets=False`: no per-record key check); the active segment is rolled so the
whole log is cleanable. Data goes to bench/out/ (git-ignored) and is deleted at the end.

The pass: `Cleaner.clean` with one `OffsetMap` sized for the keys at Kafka's load factor 0.9
(24-byte slots: slots = ceil((keys + 1) / 0.9)), one thread, no throttling, in a fresh process
so that its peak RSS (`getrusage(RUSAGE_SELF).ru_maxrss`) is the pass's own. The log's pages are
in the page cache (just written), as for a cleaner that runs soon after the writes. Measured:
map build (pass 1) and cleaning (pass 2) separately, records/s and MB/s over the whole pass
(records and bytes of the log read), offset-map bytes per distinct key, peak RSS, size before and
after. The C path (`_cleaner_kernel`) runs the full log; the pure-Python path (the same cleaner
with the compiled module switched off and the BLAKE2b map hash) runs a log of a tenth of it.
After every pass the cleaned log is read back and compared with the model: exactly the latest
record of every key, in offset order, with its value and timestamp.
"""

from __future__ import annotations

import argparse
import cProfile
import importlib.util
import io
import json
import math
import os
import pstats
import random
import resource
import shutil
import struct
import subprocess
import sys
import time
from array import array
from dataclasses import asdict, dataclass, field

import crc32c

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT_DIR = os.path.join(ROOT, "bench", "out")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from perf_doc import bullets, measured, paragraph, section, update_section  # noqa: E402  (beside this script)

DOC = os.path.join(ROOT, "docs", "performance.md")
SECTION = "## Compaction (issue: Retention and compaction)"

from shale.sidecar.log import cleaner_kernel  # noqa: E402
from shale.sidecar.log.cleaner import Cleaner, LogToClean  # noqa: E402
from shale.sidecar.log.log import Log  # noqa: E402
from shale.sidecar.log.offset_map import SLOT_SIZE, OffsetMap, default_hash  # noqa: E402
from shale.sidecar.log.records import BATCH_OVERHEAD, check_batch, decode_records  # noqa: E402
from shale.sidecar.log.varint import encode_varint  # noqa: E402
from shale.sidecar.topic_config import TopicConfig  # noqa: E402

MiB = 1 << 20
TS0 = 1_700_000_000_000
LOAD_FACTOR = 0.9
GOAL_RECORDS_PER_S = 1_000_000
GOAL_MAP_BYTES_PER_KEY = 27.0
KEY_FORMAT = b"user-%07d"
VALUE_SIZE = 100
PER_BATCH = 300
APPEND_BYTES = 1 * MiB  # batches per Log.append, as a producer request would carry

_HEADER = struct.Struct(">qiibIhiqqqhii")
_I64 = struct.Struct(">q")
_VALUE_PAD = bytes((i * 37 + 11) & 0xFF for i in range(VALUE_SIZE - 8))



def value_of(offset: int) -> bytes:
    """The value written at `offset` (92 fixed bytes + the offset), so the check knows what to expect."""
    return _VALUE_PAD + _I64.pack(offset)


def log_config(**extra: str) -> TopicConfig:
    return TopicConfig.from_mapping({"cleanup.policy": "compact", **extra})


# -- building the log ------------------------------------------------------------------------------


@dataclass
class Built:
    directory: str
    records: int
    keys: int  # key space
    distinct_keys: int  # keys that occur
    batches: int
    log_bytes: int
    build_s: float
    last_offset: array = field(repr=False)  # key -> offset of its latest record (-1: never written)


def build_log(directory: str, records: int, keys: int, *, per_batch: int = PER_BATCH, seed: int = 1,
              segment_bytes: int | None = None) -> Built:
    """Write `records` records on uniformly random keys out of `keys`, batch by batch, and roll."""
    t0 = time.perf_counter()
    shutil.rmtree(directory, ignore_errors=True)
    props = {} if segment_bytes is None else {"segment.bytes": str(segment_bytes)}
    log = Log(directory, log_config(**props))
    append_bytes = APPEND_BYTES if segment_bytes is None else min(APPEND_BYTES, segment_bytes // 4)
    rng = random.Random(seed)
    rand = rng.random
    key_bytes = [KEY_FORMAT % k for k in range(keys)]
    key_len = len(key_bytes[0])
    assert all(len(k) == key_len for k in (key_bytes[0], key_bytes[-1])) and key_len <= 19
    # Record i of a batch: length, attributes 0, timestamp delta i, offset delta i, key length, then the
    # key, value length, value, no headers. Only the key and the value's last 8 bytes vary.
    tail_len = 1 + len(encode_varint(key_len)) + key_len + len(encode_varint(VALUE_SIZE)) + VALUE_SIZE + 1
    prefixes = []
    for i in range(per_batch):
        body_len = tail_len + len(encode_varint(i)) * 2
        prefixes.append(encode_varint(body_len) + b"\x00" + encode_varint(i) + encode_varint(i) + encode_varint(key_len))
    mid = encode_varint(VALUE_SIZE) + _VALUE_PAD
    end_of_record = b"\x00"
    last_offset = array("q", [-1]) * keys
    pack_i64 = _I64.pack
    pending: list[bytes] = []
    pending_bytes = 0
    batches = 0
    offset = 0
    while offset < records:
        n = min(per_batch, records - offset)
        parts = []
        add = parts.extend
        for i in range(n):
            k = int(rand() * keys)
            last_offset[k] = offset + i
            add((prefixes[i], key_bytes[k], mid, pack_i64(offset + i), end_of_record))
        body = b"".join(parts)
        header = _HEADER.pack(offset, BATCH_OVERHEAD - 12 + len(body), -1, 2, 0, 0, n - 1, TS0 + offset,
                              TS0 + offset + n - 1, -1, -1, -1, n)
        crc = crc32c.crc32c(header[21:])
        crc = crc32c.crc32c(body, crc)
        batch = header[:17] + crc.to_bytes(4, "big") + header[21:] + body
        pending.append(batch)
        pending_bytes += len(batch)
        batches += 1
        offset += n
        if pending_bytes >= append_bytes or offset >= records:
            log.append(b"".join(pending), assign_offsets=False)
            pending, pending_bytes = [], 0
    log.roll()
    size = log.size_in_bytes
    log.close()
    distinct = sum(1 for o in last_offset if o >= 0)
    return Built(directory, records, keys, distinct, batches, size, time.perf_counter() - t0, last_offset)


def map_memory_for(keys: int) -> int:
    """Bytes of an offset map whose 0.9 load holds `keys` keys with one to spare (a full map ends the pass)."""
    return SLOT_SIZE * math.ceil((keys + 1) / LOAD_FACTOR)


# -- one cleaning pass (in a fresh process for its RSS) ---------------------------------------------


@dataclass
class PassResult:
    kernel: str  # "c" or "python"
    hash_name: str
    records_read: int
    records_written: int
    bytes_read: int
    bytes_written: int
    map_records: int
    map_s: float
    clean_s: float
    map_memory: int
    map_entries: int
    map_utilization: float
    size_before: int
    size_after: int
    rss_start_kib: int
    rss_peak_kib: int
    c_batches: int
    python_batches: int
    fallback_batches: int
    end_offset: int
    cpu_s: float = 0.0  # the pass's CPU time (user + system): what other processes on the machine cannot inflate
    profile: str = ""
    profile_split: dict = field(default_factory=dict)  # own time (ms) by kind, from the profiled pass

    @property
    def total_s(self) -> float:
        return self.map_s + self.clean_s

    @property
    def records_per_s(self) -> float:
        return self.records_read / self.total_s

    @property
    def mb_per_s(self) -> float:
        return self.bytes_read / 1e6 / self.total_s

    @property
    def map_bytes_per_key(self) -> float:
        return self.map_memory / max(self.map_entries, 1)

    @property
    def reduction(self) -> float:
        return 1.0 - self.size_after / self.size_before if self.size_before else 0.0


def peak_rss_kib() -> int:
    """This process's peak RSS in KiB: VmHWM of /proc/self/status where there is one, else getrusage.

    getrusage's ru_maxrss would do, but Linux carries the parent's RSS at fork over into it (it
    keeps the maximum of the mm that exec replaced), so a worker started by the builder would report
    the builder's. VmHWM belongs to the worker's own address space since its exec.
    """
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def clean_pass(directory: str, map_memory: int, kernel: str, *, profile: bool = False) -> PassResult:
    """One `Cleaner.clean` of the whole log (all but the empty active segment), C or pure Python."""
    rss_start = peak_rss_kib()
    if kernel == "c":
        if not cleaner_kernel.c_available():
            raise RuntimeError("the C cleaner kernel is not built: run .venv/bin/pip install -e .")
        offset_map = OffsetMap(map_memory, LOAD_FACTOR)
        assert cleaner_kernel.uses_c(offset_map)
        saved = cleaner_kernel._c
    elif kernel == "python":
        offset_map = OffsetMap(map_memory, LOAD_FACTOR, hash_fn=default_hash)
        saved, cleaner_kernel._c = cleaner_kernel._c, None
    else:
        raise ValueError(kernel)
    log = Log(directory, log_config())
    try:
        size_before = log.size_in_bytes
        cleaner = Cleaner(offset_map, clock=log.clock)
        task = LogToClean(log, 0, log.active_segment.base_offset, 0, size_before)
        before = cleaner_kernel.counters.snapshot()
        prof = cProfile.Profile() if profile else None
        if prof:
            prof.enable()
        cpu0 = time.process_time()
        end_offset, stats = cleaner.clean(task)
        cpu_s = time.process_time() - cpu0
        if prof:
            prof.disable()
        after = cleaner_kernel.counters.snapshot()
        log.delete_expired_files()
        size_after = log.size_in_bytes
    finally:
        cleaner_kernel._c = saved
        log.close()
    return PassResult(
        kernel=kernel, hash_name=offset_map.hash_name, records_read=stats.messages_read,
        records_written=stats.messages_written, bytes_read=stats.bytes_read, bytes_written=stats.bytes_written,
        map_records=stats.map_messages_read, map_s=stats.map_elapsed_s, clean_s=stats.clean_elapsed_s,
        map_memory=offset_map.memory_bytes, map_entries=offset_map.size, map_utilization=offset_map.utilization,
        size_before=size_before, size_after=size_after, rss_start_kib=rss_start,
        rss_peak_kib=peak_rss_kib(),
        c_batches=after[0] - before[0], python_batches=after[1] - before[1], fallback_batches=after[2] - before[2],
        end_offset=end_offset, cpu_s=cpu_s, profile=_top(prof) if prof else "",
        profile_split=_split(prof) if prof else {},
    )


def _top(prof: cProfile.Profile, n: int = 10) -> str:
    st = pstats.Stats(prof, stream=io.StringIO())
    total = sum(v[2] for v in st.stats.values())
    rows = sorted(st.stats.items(), key=lambda kv: kv[1][2], reverse=True)[:n]
    parts = []
    for (file, line, name), (cc, nc, tt, ct, callers) in rows:
        where = name if file == "~" else f"{os.path.basename(file)}:{line}({name})"
        parts.append(f"{where} {tt * 1000:,.0f} ms ({100 * tt / total:.0f}%, {nc:,} calls)")
    return f"{total * 1000:,.0f} ms in all: " + "; ".join(parts)


# Own time by kind: the record loops (C or Python), reading/writing files, CRC-32C, and the per-batch Python.
_KINDS = (
    ("record loops", ("_cleaner_kernel.map_batch", "_cleaner_kernel.retain_batch", "cleaner_kernel.py:",
                      "records.py:222(decode_records)", "records.py:274(_read_bytes)", "varint.py:",
                      "offset_map.py:", "records.py:244(encode_record)", "records.py:255(_bytes_field)")),
    ("file I/O", ("posix.pread", "posix.pwrite", "posix.fsync", "posix.ftruncate", "posix.open", "mmap")),
    ("CRC-32C", ("crc32c",)),
)


def _split(prof: cProfile.Profile) -> dict:
    st = pstats.Stats(prof, stream=io.StringIO())
    out = {kind: 0.0 for kind, _ in _KINDS}
    out["per-batch Python"] = 0.0
    for (file, line, name), (cc, nc, tt, ct, callers) in st.stats.items():
        where = f"{name}" if file == "~" else f"{os.path.basename(file)}:{line}({name})"
        for kind, needles in _KINDS:
            if any(n in where for n in needles):
                out[kind] += tt * 1000
                break
        else:
            out["per-batch Python"] += tt * 1000
    return out


def clean_pass_in_subprocess(directory: str, map_memory: int, kernel: str, *, profile: bool = False) -> PassResult:
    """`clean_pass` in a fresh interpreter, so its peak RSS is that of a cleaner, not of the builder."""
    cmd = [sys.executable, os.path.abspath(__file__), "--clean-worker", directory, "--map-bytes", str(map_memory),
           "--kernel", kernel] + (["--profile"] if profile else [])
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"cleaning worker failed ({done.returncode}):\n{done.stderr}")
    return PassResult(**json.loads(done.stdout.strip().splitlines()[-1]))


# -- checking the result ----------------------------------------------------------------------------


def verify_cleaned(directory: str, built: Built) -> int:
    """The cleaned log holds exactly each key's latest record, in offset order; return the records read."""
    log = Log(directory, log_config())
    try:
        expected = built.distinct_keys
        seen = 0
        prev = -1
        for seg in log.segments:
            for b in seg.batches():
                raw = seg.read_bytes(b.position, b.size)
                h = check_batch(raw, seg.where)
                for r in decode_records(h, memoryview(raw)[BATCH_OVERHEAD:], seg.where):
                    k = int(r.key[5:])
                    if not (r.key == KEY_FORMAT % k and built.last_offset[k] == r.offset and r.offset > prev):
                        raise AssertionError(f"record {r.offset} (key {r.key!r}) is not its key's latest, "
                                             f"or out of order (latest: {built.last_offset[k]})")
                    if r.value != value_of(r.offset) or r.timestamp != TS0 + r.offset:
                        raise AssertionError(f"record {r.offset} has the wrong value or timestamp")
                    prev = r.offset
                    seen += 1
        if seen != expected:
            raise AssertionError(f"cleaned log holds {seen} records, the model {expected} (one per key)")
        return seen
    finally:
        log.close()


# -- a run ------------------------------------------------------------------------------------------


@dataclass
class Case:
    name: str
    built: Built
    result: PassResult  # the median pass
    verified: int  # records of the cleaned log checked against the model
    runs: list[float] = field(default_factory=list)  # records/s of every pass


@dataclass
class Run:
    cases: list[Case] = field(default_factory=list)
    wall_s: float = 0.0
    load: list[float] = field(default_factory=list)  # 1-minute load average before and after


def run_case(name: str, records: int, keys: int, kernel: str, out_dir: str, *, subprocess_pass: bool = True,
             profile: bool = False, repeats: int = 1, say=print, per_batch: int = PER_BATCH,
             segment_bytes: int | None = None) -> Case:
    """Build a log, clean it with one path (in a worker process), check it against the model, delete it.

    With `repeats` > 1 the pass also runs on copies of the log made before cleaning, and the case
    reports the median pass; the figures of every pass are kept in `Case.runs`.
    """
    directory = os.path.join(out_dir, f"compaction-{kernel}-{records}-0")
    say(f"{name}: building {records:,} records on {keys:,} keys ...")
    built = build_log(directory, records, keys, per_batch=per_batch, segment_bytes=segment_bytes)
    say(f"  built {built.log_bytes / 1e6:,.0f} MB in {built.batches:,} batches in {built.build_s:.1f} s; "
        f"cleaning with the {kernel} path ...")
    memory = map_memory_for(keys)
    clean = clean_pass_in_subprocess if subprocess_pass else clean_pass
    copies = [directory + f"-copy{i}" for i in range(1, repeats)]
    profiled_copy = directory + "-profiled"
    for copy in copies + ([profiled_copy] if profile else []):  # the profiled pass runs without timing weight
        shutil.rmtree(copy, ignore_errors=True)
        shutil.copytree(directory, copy)
    results = []
    for where in [directory] + copies:
        results.append(clean(where, memory, kernel))
        say(f"  map {results[-1].map_s:.2f} s + clean {results[-1].clean_s:.2f} s = "
            f"{results[-1].records_per_s:,.0f} records/s")
    for copy in copies:
        shutil.rmtree(copy, ignore_errors=True)
    if len({(r.records_written, r.size_after) for r in results}) != 1:
        raise AssertionError("passes over copies of one log gave different logs")
    result = sorted(results, key=lambda r: r.total_s)[len(results) // 2]
    if profile:
        profiled = clean(profiled_copy, memory, kernel, profile=True)
        result.profile, result.profile_split = profiled.profile, profiled.profile_split
        shutil.rmtree(profiled_copy, ignore_errors=True)
    say("  checking the cleaned log against the model ...")
    verified = verify_cleaned(directory, built)
    shutil.rmtree(directory, ignore_errors=True)
    return Case(name, built, result, verified, [r.records_per_s for r in results])


def run(*, full_records: int, full_keys: int, small_records: int, small_keys: int, out_dir: str = OUT_DIR,
        profile: bool = False, repeats: int = 1, subprocess_pass: bool = True, segment_bytes: int | None = None,
        say=print) -> Run:
    """The C path on the full log, then the C and the pure-Python paths on the small one (C passes `repeats` times)."""
    t0 = time.perf_counter()
    res = Run(load=[os.getloadavg()[0]])
    os.makedirs(out_dir, exist_ok=True)
    kw = dict(profile=profile, subprocess_pass=subprocess_pass, segment_bytes=segment_bytes, say=say)
    res.cases.append(run_case("C kernel", full_records, full_keys, "c", out_dir, repeats=repeats, **kw))
    if small_records != full_records:
        res.cases.append(run_case("C kernel", small_records, small_keys, "c", out_dir, repeats=repeats, **kw))
    res.cases.append(run_case("pure Python", small_records, small_keys, "python", out_dir, **kw))
    res.wall_s = time.perf_counter() - t0
    res.load.append(os.getloadavg()[0])
    return res


# -- reporting --------------------------------------------------------------------------------------


def _mb(n: int) -> str:
    return f"{n / 1e6:,.1f}"


def _range(runs: list[float]) -> str:
    return f" ({min(runs) / 1e6:.2f}–{max(runs) / 1e6:.2f} M, {len(runs)} passes)" if len(runs) > 1 else ""


def table(res: Run) -> str:
    rows = [
        "| Path | Records / distinct keys | Log MB | Map build s | Clean s | Pass s (CPU s) | **Records/s** (range) | MB/s "
        "| Map bytes/key (map MB) | Peak RSS MiB (at start) | Size after MB | Reduction |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for c in res.cases:
        r = c.result
        rows.append(
            f"| {c.name} | {c.built.records:,} / {r.map_entries:,} | {_mb(r.size_before)} | {r.map_s:.2f} "
            f"| {r.clean_s:.2f} | {r.total_s:.2f} ({r.cpu_s:.2f}) | **{r.records_per_s:,.0f}**{_range(c.runs)} "
            f"| {r.mb_per_s:,.0f} "
            f"| {r.map_bytes_per_key:.2f} ({_mb(r.map_memory)}) | {r.rss_peak_kib / 1024:,.0f} "
            f"({r.rss_start_kib / 1024:,.0f}) | {_mb(r.size_after)} | {100 * r.reduction:.1f}% |"
        )
    return "\n".join(rows)


def interpretation(res: Run) -> str:
    """The section's bullets, from the figures (and the profiles, when the run made them)."""
    main = res.cases[0]
    r = main.result
    median = f"median of {len(main.runs)} passes; " if len(main.runs) > 1 else ""
    shared = f": other processes shared the CPUs (load average {max(res.load):.1f})" if max(res.load) > 1 else ""
    out = [
        f"**Throughput: {r.records_per_s:,.0f} records/s** over the whole pass ({median}{r.map_records / r.map_s:,.0f}/s "
        f"building the map, {r.records_read / r.clean_s:,.0f}/s cleaning), "
        f"{1e6 * r.total_s / max(main.built.batches, 1):.0f} µs per {PER_BATCH}-record batch for both passes. "
        f"{r.cpu_s:.2f} s of CPU for {r.total_s:.2f} s of wall time{shared}.",
    ]
    if r.profile_split:
        total = sum(r.profile_split.values()) or 1.0
        load = r.map_entries / (r.map_memory / SLOT_SIZE)
        probes = (1 + 1 / (1 - min(load, 0.99))) / 2  # Knuth's estimate for a hit under linear probing
        out.append(
            "**Where the time goes** (C path, profiled): "
            + ", ".join(f"{kind} {ms / total:.0%}" for kind, ms in r.profile_split.items())
            + f". The C loops mostly wait for the map's cache lines: a {_mb(r.map_memory)} MB table probed at random, "
            f"~{probes:.1f} slots per lookup at load {load:.2f}, the first two cache lines of each lookup prefetched.")
    out.append("**Per-batch Python**: walking the batch headers (a 61-byte `pread` and a `BatchHeader` each, in both "
               "passes), one `pread` of each batch, its CRC check (pass 2), and building and appending the retained "
               "batch.")
    py = next((c.result for c in res.cases if c.result.kernel == "python"), None)
    if py is not None:
        loops = (f" ({py.profile_split.get('record loops', 0) / (sum(py.profile_split.values()) or 1.0):.0%} in the "
                 "record loops)" if py.profile_split else "")
        out.append(f"**Pure Python: {py.records_per_s:,.0f} records/s**{loops}: per record a `Record` built (a varint "
                   "decode per field), a BLAKE2b hash and `struct` probes, twice. It stays as the fallback and as the "
                   "reference the tests compare the C kernel with.")
    out += [
        f"**Memory**: the map is {_mb(r.map_memory)} MB for {r.map_entries:,} keys ({SLOT_SIZE}-byte slots at load "
        f"{r.map_entries / (r.map_memory / SLOT_SIZE):.2f}). Peak RSS {r.rss_peak_kib / 1024:,.0f} MiB = the "
        f"interpreter with Shale imported ({r.rss_start_kib / 1024:,.0f} MiB) + the map + a few batch buffers; the "
        "log is read with `pread`, so the page cache does not count.",
        f"**Size**: {_mb(r.size_before)} MB → {_mb(r.size_after)} MB ({r.reduction:.1%} smaller): one record per key, "
        "in batches that keep their offset range (base offset and last offset delta) with only the surviving "
        "records.",
    ]
    return bullets(out)


def goals(res: Run) -> list[str]:
    """Each goal of the issue with the run's figure, and the C path's lead over the pure-Python one."""
    main = res.cases[0].result
    out = [
        f"records/s (C path, {res.cases[0].built.records:,} records) {main.records_per_s:,.0f}, goal ≥ "
        f"{GOAL_RECORDS_PER_S:,}: {'met' if main.records_per_s >= GOAL_RECORDS_PER_S else '**not met**'}",
        f"offset-map bytes per key {main.map_bytes_per_key:.2f}, goal ≤ {GOAL_MAP_BYTES_PER_KEY}: "
        f"{'met' if main.map_bytes_per_key <= GOAL_MAP_BYTES_PER_KEY else '**not met**'}",
    ]
    py = [c for c in res.cases if c.result.kernel == "python"]
    same = [c for c in res.cases if c.result.kernel == "c" and py and c.built.records == py[0].built.records]
    if py and same:
        out.append(f"C / pure Python on the same {py[0].built.records:,}-record log: "
                   f"{same[0].result.records_per_s / py[0].result.records_per_s:.0f}×")
    return out


def machine_facts() -> dict[str, str]:
    spec = importlib.util.spec_from_file_location("_bench_log_engine", os.path.join(ROOT, "bench", "log_engine.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    try:
        spec.loader.exec_module(module)
        return module.machine_facts(ROOT)
    finally:
        sys.modules.pop(spec.name, None)


def markdown(res: Run, facts: dict[str, str], command: str) -> str:
    """This benchmark's section of docs/performance.md."""
    main = res.cases[0].result
    what = [
        f"**The log**: uncompressed batches of {PER_BATCH} records, keys `user-0000000`… (12 bytes) drawn uniformly at "
        f"random (seeded), {VALUE_SIZE}-byte values, segment.bytes 1 GiB, appended as a follower, active segment "
        "rolled. No tombstones.",
        f"**The pass**: one `Cleaner.clean` over the whole log, one thread, an offset map of ceil((keys + 1) / "
        f"{LOAD_FACTOR}) slots × {SLOT_SIZE} bytes, in a fresh process (its peak RSS; in brackets the RSS before the "
        "pass). Log pages hot in the page cache. Records/s and MB/s = records and bytes read / (map build + clean).",
        "**Checked**: after each pass the log holds exactly the latest record of every key, in offset order, with its "
        "value and timestamp.",
        "**Paths**: *C kernel* = `sidecar/log/_cleaner_kernel.c`, the default when built; *pure Python* = the same "
        "cleaner with the module switched off and the BLAKE2b map hash.",
    ]
    return section(
        SECTION,
        measured(command, res.wall_s, res.load, "Wall time includes building and checking the logs. `--quick` runs "
                 "1M records (C) and 200k (pure Python) and prints only; `--profile` adds cProfile of each pass."),
        paragraph("Machine: " + ", ".join(f"{k} {v}" for k, v in facts.items()) + "."),
        "What is measured:", bullets(what), table(res),
        paragraph("Goals: " + "; ".join(goals(res)) + f". Batches of the C run handled in C: {main.c_batches:,}, "
                  f"given back to Python: {main.fallback_batches}."),
        "Interpretation:", interpretation(res))


def update_doc(section: str, path: str = DOC) -> None:
    """Replace this benchmark's section of docs/performance.md (or add it)."""
    update_section(SECTION, section, path)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="1M records (C) and 200k (pure Python), prints only")
    ap.add_argument("--profile", action="store_true", help="cProfile each cleaning pass")
    ap.add_argument("--no-markdown", action="store_true", help="do not write docs/performance.md")
    ap.add_argument("--records", type=int, help="records of the main log (keys = records / 10)")
    ap.add_argument("--repeats", type=int, help="C passes per log, on copies; the median is reported (default 3)")
    ap.add_argument("--clean-worker", metavar="DIR", help=argparse.SUPPRESS)
    ap.add_argument("--map-bytes", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--kernel", choices=("c", "python"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.clean_worker:
        result = clean_pass(args.clean_worker, args.map_bytes, args.kernel, profile=args.profile)
        print(json.dumps(asdict(result)))
        return 0
    full = args.records or (1_000_000 if args.quick else 10_000_000)
    small = max(full // 10, 1000) if not args.quick else full // 5
    command = ".venv/bin/python bench/compaction.py" + (" --quick" if args.quick else "") + (
        f" --records {args.records}" if args.records else "") + (" --profile" if args.profile else "")
    facts = machine_facts()
    print("\n".join(f"{k}: {v}" for k, v in facts.items()))
    res = run(full_records=full, full_keys=full // 10, small_records=small, small_keys=max(small // 10, 1),
              profile=args.profile or not args.quick, repeats=args.repeats or (1 if args.quick else 3))
    print()
    print(table(res))
    print()
    print("\n".join(goals(res)))
    print()
    print(interpretation(res))
    for c in res.cases:
        if c.result.profile:
            print(f"\nprofile, {c.name} {c.built.records:,}: {c.result.profile}")
    print(f"\nwall time {res.wall_s:.0f} s")
    if not args.quick and not args.records and not args.no_markdown:
        update_doc(markdown(res, facts, command))
        print(f"updated {os.path.relpath(DOC, ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
