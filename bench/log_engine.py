"""Log engine benchmark: append and read throughput against `dd`, and lookup cost against the segment count.

    .venv/bin/python bench/log_engine.py            # full run (1 GiB), updates docs/performance.md
    .venv/bin/python bench/log_engine.py --quick    # 256 MiB, prints only (add --markdown to write the doc)
    .venv/bin/python bench/log_engine.py --profile  # also cProfile the append and fetch loops

Everything runs in one process on one disk: data goes to bench/out/ (git-ignored) and is
deleted at the end. Measurements:

1. append: 1 KiB records, 500 per batch, batches built before timing (as a producer sends
   them); a fresh `Log` with the default segment.bytes; one flush (fsync) at the end, inside
   the timing. Reference: `dd if=/dev/zero of=FILE bs=1M count=N conv=fdatasync`.
2. read: a fetch loop `read(offset, 1 MiB)` over the whole log, the bytes taken with
   `LogSlice.read_into()` (os.preadv into one reused buffer) or sent with `os.sendfile` to /dev/null. Reference:
   `dd if=FILE of=/dev/null bs=1M` on the dd file. Hot (both read once before timing) and,
   when `/proc/sys/vm/drop_caches` is writable, cold (both after sync + drop_caches).
3. lookups: `read(random offset, 1)` and `offset_for_timestamp(random ts)` as one log grows
   to 10, 30, 100, 300 and 1000 segments (small segment.bytes).

Memory on this kind of VM is backed lazily by the host: a page-cache write into guest memory
that was never used (or was handed back by the balloon) runs at ~0.4 GB/s instead of ~5 GB/s.
So the timed writers run as a chain, like a broker whose retention deletes old segments: each
run first deletes the previous output of its kind (a warm-up file for the first run), and its
page cache reuses the memory just freed. dd and Shale alternate and get the same treatment.
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import os
import platform
import pstats
import random
import shutil
import statistics
import struct
import subprocess
import sys
import time
from dataclasses import dataclass, field

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT_DIR = os.path.join(ROOT, "bench", "out")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from perf_doc import bullets, measured, paragraph, section, update_section  # noqa: E402  (beside this script)

DOC = os.path.join(ROOT, "docs", "performance.md")
SECTION = "## Log engine (issue: Log engine)"

from shale.sidecar.log.log import Log  # noqa: E402
from shale.sidecar.log.records import BATCH_OVERHEAD, Record, encode_batch  # noqa: E402
from shale.sidecar.topic_config import TopicConfig  # noqa: E402

MiB = 1 << 20
GiB = 1 << 30
FETCH_BYTES = 1 * MiB
TS0 = 1_700_000_000_000
GOAL_RATIO = 0.70

_I64 = struct.Struct(">q")
_I32 = struct.Struct(">i")

def make_config(props: dict[str, str] | None = None) -> TopicConfig:
    return TopicConfig.from_mapping(props or {})


# -- environment ---------------------------------------------------------------------------------


def _meminfo_kib(key: str) -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    return 0


def _fs_type(path: str) -> str:
    best, fstype, dev = "", "?", "?"
    path = os.path.realpath(path)
    with open("/proc/mounts") as f:
        for line in f:
            parts = line.split()
            mnt = parts[1]
            if (path == mnt or path.startswith(mnt.rstrip("/") + "/")) and len(mnt) >= len(best):
                best, fstype, dev = mnt, parts[2], parts[0]
    return f"{fstype} on {dev}"


def machine_facts(path: str) -> dict[str, str]:
    cpu = "?"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    du = shutil.disk_usage(path)
    return {
        "nproc": str(len(os.sched_getaffinity(0))),
        "cpu": cpu,
        "memory": f"{_meminfo_kib('MemTotal') / 1024**2:.1f} GiB",
        "disk": f"{_fs_type(path)} ({du.free / GiB:.0f} GiB free of {du.total / GiB:.0f} GiB)",
        "python": f"{platform.python_implementation()} {platform.python_version()}",
        "kernel": f"{platform.system()} {platform.release()}",
    }


def can_drop_caches() -> bool:
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return True
    except OSError:
        return False


def prepare(*, drop: bool) -> None:
    """Start a timed run with nothing dirty and, for cold reads, nothing cached."""
    os.sync()
    if drop:
        can_drop_caches()
    gc.collect()


def remove(path: str) -> None:
    if os.path.isdir(path):
        shutil.rmtree(path)
    elif os.path.exists(path):
        os.unlink(path)


# -- data ----------------------------------------------------------------------------------------


def build_batches(total_bytes: int, record_size: int = 1024, per_batch: int = 500, seed: int = 1) -> list[bytes]:
    """Producer batches of `per_batch` records of `record_size` bytes, about `total_bytes` in all.

    Base offsets are those the log will assign (0, 500, 1000, ...), so the log's bytes equal
    the producer's and a read can be compared with what was appended.
    """
    rng = random.Random(seed)
    values = [rng.randbytes(record_size) for _ in range(16)]

    def batch(i: int) -> bytes:
        base = i * per_batch
        v = values[i % len(values)]
        return encode_batch([Record(base + j, TS0 + i, None, v) for j in range(per_batch)], base_offset=base)

    first = batch(0)
    n = max(1, total_bytes // len(first))  # not above total_bytes: 1 GiB stays in one default segment
    return [first] + [batch(i) for i in range(1, n)]


# -- append --------------------------------------------------------------------------------------


def time_shale_append(directory: str, batches: list[bytes], config=None) -> tuple[float, Log]:
    """Append every batch to a fresh log and flush once; seconds including the fsync, and the open log."""
    shutil.rmtree(directory, ignore_errors=True)
    log = Log(directory, config if config is not None else make_config())
    append = log.append
    t0 = time.perf_counter()
    for b in batches:
        append(b)
    log.flush()
    elapsed = time.perf_counter() - t0
    return elapsed, log


def time_dd_write(path: str, mib: int) -> float:
    if os.path.exists(path):
        os.unlink(path)
    cmd = ["dd", "if=/dev/zero", f"of={path}", "bs=1M", f"count={mib}", "conv=fdatasync", "status=none"]
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True)
    return time.perf_counter() - t0


def time_dd_read(path: str) -> float:
    t0 = time.perf_counter()
    subprocess.run(["dd", f"if={path}", "of=/dev/null", "bs=1M", "status=none"], check=True)
    return time.perf_counter() - t0


# -- read ----------------------------------------------------------------------------------------


def fetch_pread(log: Log, max_bytes: int = FETCH_BYTES, on_data=None) -> tuple[int, list[int]]:
    """A consumer's fetch loop from the log start: `read(offset, max_bytes)`, take the bytes, go on after the
    last whole batch. Returns (bytes of whole batches received, the fetch offsets). `on_data(view, whole)` gets
    a view of the one reused buffer, valid only during the call."""
    offset = log.log_start_offset
    received = 0
    offsets = []
    read = log.read
    buf = bytearray(max_bytes)  # one buffer for the whole loop, as a consumer's socket buffer
    while True:
        s = read(offset, max_bytes)
        if s is None:
            break
        data = s.read_into(buf)
        n = len(data)
        pos = last = 0
        while pos + BATCH_OVERHEAD <= n:  # whole batches; a fetch may end inside one, as in Kafka
            size = 12 + _I32.unpack_from(data, pos + 8)[0]
            if pos + size > n:
                break
            last = pos
            pos += size
        if on_data is not None:
            on_data(data, pos)
        offsets.append(offset)
        offset = _I64.unpack_from(data, last)[0] + _I32.unpack_from(data, last + 23)[0] + 1
        received += pos
    return received, offsets


def fetch_sendfile(log: Log, offsets: list[int], out_fd: int, max_bytes: int = FETCH_BYTES) -> int:
    """A broker's side of the same fetches: `read(offset, max_bytes)`, then sendfile the slice. Returns bytes sent."""
    sent = 0
    read = log.read
    sendfile = os.sendfile
    for offset in offsets:
        s = read(offset, max_bytes)
        fd, pos, left = s.segment.fileno(), s.position, s.size
        while left:
            n = sendfile(out_fd, fd, pos, left)
            if n <= 0:
                raise OSError(f"sendfile returned {n}")
            pos += n
            left -= n
        sent += s.size
    return sent


def verify_log(log: Log, batches: list[bytes], max_bytes: int = FETCH_BYTES) -> int:
    """Read the log back with the fetch loop and check that it holds exactly `batches`; return bytes checked."""
    state = {"i": 0}

    def check(data: bytes, whole: int) -> None:
        pos = 0
        while pos < whole:
            expected = batches[state["i"]]
            if data[pos : pos + len(expected)] != expected:
                raise AssertionError(f"batch {state['i']} read back differs from the one appended")
            pos += len(expected)
            state["i"] += 1

    received, _ = fetch_pread(log, max_bytes, on_data=check)
    if state["i"] != len(batches) or received != sum(map(len, batches)):
        raise AssertionError(f"read back {state['i']} batches / {received} bytes, appended {len(batches)}")
    return received


# -- lookups -------------------------------------------------------------------------------------


@dataclass
class LookupPoint:
    segments: int
    log_end_offset: int
    read_us: float  # median µs of read(random offset, 1)
    ts_us: float  # median µs of offset_for_timestamp(random ts)
    read_p90_us: float = 0.0
    ts_p90_us: float = 0.0
    pread_us: float = 0.0  # control: median µs of one 61-byte os.pread at a random place of a random segment


def run_lookups(directory: str, checkpoints=(10, 30, 100, 300, 1000), lookups: int = 2000,
                segment_bytes: int = 64 * 1024, per_batch: int = 10, value_size: int = 100,
                seed: int = 7) -> list[LookupPoint]:
    """Grow one log to each segment count in `checkpoints`; at each, time random offset and timestamp lookups.

    Record at offset o has timestamp TS0 + o, so every answer is checked as well.
    """
    shutil.rmtree(directory, ignore_errors=True)
    log = Log(directory, make_config({"segment.bytes": str(segment_bytes)}))
    rng = random.Random(seed)
    value = rng.randbytes(value_size)
    points = []
    try:
        for target in checkpoints:
            while len(log.segments) < target:
                base = log.log_end_offset
                log.append(encode_batch([Record(base + j, TS0 + base + j, None, value) for j in range(per_batch)],
                                        base_offset=base))
            end = log.log_end_offset
            offs = [rng.randrange(0, end) for _ in range(lookups)]
            tss = [TS0 + rng.randrange(0, end) for _ in range(lookups)]
            read_ns, ts_ns = [], []
            clock = time.perf_counter_ns
            read, oft = log.read, log.offset_for_timestamp
            gc.disable()
            try:
                for o in offs:
                    t0 = clock()
                    s = read(o, 1)
                    read_ns.append(clock() - t0)
                    if s is None:
                        raise AssertionError(f"read({o}) found nothing")
                for ts in tss:
                    t0 = clock()
                    r = oft(ts)
                    ts_ns.append(clock() - t0)
                    if r != (ts - TS0, ts):
                        raise AssertionError(f"offset_for_timestamp({ts}) = {r}, expected {(ts - TS0, ts)}")
            finally:
                gc.enable()
            raw_ns = []
            for o in offs:  # control: the kernel's cost of one header-sized read, which a lookup does ~3 times
                seg = log.segments[log._floor_segment(o)]
                fd, pos = seg.fileno(), rng.randrange(max(1, seg.size - BATCH_OVERHEAD))
                t0 = clock()
                os.pread(fd, BATCH_OVERHEAD, pos)
                raw_ns.append(clock() - t0)
            for o in offs[:50]:  # the slice starts at the batch holding the offset
                head = log.read(o, 1).read()[:BATCH_OVERHEAD]
                first = _I64.unpack_from(head, 0)[0]
                if not first <= o <= first + _I32.unpack_from(head, 23)[0]:
                    raise AssertionError(f"read({o}) returned the batch at {first}")
            q = lambda xs, p: statistics.quantiles(xs, n=10)[p] / 1000 if len(xs) > 1 else xs[0] / 1000  # noqa: E731
            points.append(LookupPoint(len(log.segments), end, statistics.median(read_ns) / 1000,
                                      statistics.median(ts_ns) / 1000, q(read_ns, 8), q(ts_ns, 8),
                                      statistics.median(raw_ns) / 1000))
    finally:
        log.close()
        shutil.rmtree(directory, ignore_errors=True)
    return points


# -- the whole run -------------------------------------------------------------------------------


@dataclass
class Results:
    total_bytes: int = 0
    dd_bytes: int = 0
    batches: int = 0
    batch_bytes: int = 0
    append_s: list[float] = field(default_factory=list)
    dd_write_s: list[float] = field(default_factory=list)
    read: dict[str, list[float]] = field(default_factory=dict)  # "hot pread" etc. -> seconds
    read_bytes: int = 0
    fetches: int = 0
    cold: bool = False
    lookups: list[LookupPoint] = field(default_factory=list)
    lookups_per_point: int = 0
    wall_s: float = 0.0
    load: tuple[float, float] = (0.0, 0.0)  # 1-minute load average before and after the run
    profile: dict[str, list[tuple[str, float, int]]] = field(default_factory=dict)  # loop -> (function, share, calls)


def mbps(nbytes: int, seconds: float) -> float:
    return nbytes / seconds / 1e6


def run(total_bytes: int, rounds: int, read_reps: int, checkpoints, lookups: int, out_dir: str = OUT_DIR,
        cold: bool | None = None, profile: bool = False, say=print) -> Results:
    """The whole benchmark; the smoke test calls it with tiny sizes and cold=False."""
    started = time.perf_counter()
    load_before = os.getloadavg()[0]
    os.makedirs(out_dir, exist_ok=True)
    work = os.path.join(out_dir, f"log_engine-{os.getpid()}")
    remove(work)
    os.makedirs(work)
    if cold is None:
        cold = can_drop_caches()
    res = Results(cold=cold)
    log = None
    try:
        say(f"building {total_bytes / MiB:.0f} MiB of producer batches ...")
        batches = build_batches(total_bytes)
        res.batches, res.batch_bytes = len(batches), len(batches[0])
        res.total_bytes = sum(map(len, batches))
        mib = max(1, round(res.total_bytes / MiB))
        res.dd_bytes = mib * MiB

        # 1. append: a chain of writers, alternating which goes first; each deletes its kind's last output
        previous = {"dd": os.path.join(work, "warm-dd.bin"), "shale": os.path.join(work, "warm-shale.bin")}
        for path in previous.values():
            time_dd_write(path, mib)  # untimed: memory for the first runs to reuse
        for r in range(rounds):
            for kind in (("dd", "shale") if r % 2 == 0 else ("shale", "dd")):
                if kind == "shale" and log is not None:
                    log.close()
                    log = None
                prepare(drop=False)
                remove(previous[kind])
                if kind == "dd":
                    previous[kind] = os.path.join(work, f"dd-{r}.bin")
                    res.dd_write_s.append(time_dd_write(previous[kind], mib))
                    rate = mbps(res.dd_bytes, res.dd_write_s[-1])
                else:
                    previous[kind] = os.path.join(work, f"bench-{r}")
                    elapsed, log = time_shale_append(previous[kind], batches)
                    res.append_s.append(elapsed)
                    rate = mbps(res.total_bytes, elapsed)
                    if log.log_end_offset != res.batches * 500:
                        raise AssertionError(f"unexpected log after append: {log}")
                say(f"  append round {r + 1}: {kind} {rate:.0f} MB/s")
        dd_file = previous["dd"]

        # 2. reads of the last log and dd file
        res.read_bytes = verify_log(log, batches)  # also warms the page cache
        del batches
        gc.collect()
        _, offsets = fetch_pread(log)
        res.fetches = len(offsets)
        devnull = os.open(os.devnull, os.O_WRONLY)
        try:
            def shale_pread() -> float:
                t0 = time.perf_counter()
                got, _ = fetch_pread(log)
                t = time.perf_counter() - t0
                if got != res.read_bytes:
                    raise AssertionError(f"fetch loop read {got} bytes of {res.read_bytes}")
                return t

            def shale_sendfile() -> float:
                t0 = time.perf_counter()
                fetch_sendfile(log, offsets, devnull)
                return time.perf_counter() - t0

            kinds = {"pread": shale_pread, "sendfile": shale_sendfile, "dd": lambda: time_dd_read(dd_file)}
            for mode in ["hot"] + (["cold"] if cold else []):
                if mode == "hot":
                    time_dd_read(dd_file)  # warm the dd file; the log is warm from verify_log
                for rep in range(read_reps if mode == "cold" else 8):
                    for name in (list(kinds) if rep % 2 == 0 else list(kinds)[::-1]):
                        prepare(drop=mode == "cold")
                        res.read.setdefault(f"{mode} {name}", []).append(kinds[name]())
                say("  read " + mode + ": " + ", ".join(
                    f"{k} {mbps(res.dd_bytes if k == 'dd' else res.read_bytes, statistics.median(res.read[f'{mode} {k}'])):.0f} MB/s"
                    for k in kinds))
        finally:
            os.close(devnull)
        log.close()
        log = None
        for path in previous.values():
            remove(path)

        if profile:
            res.profile = profile_loops(work)

        # 3. lookups
        say("growing a log to " + "/".join(map(str, checkpoints)) + " segments for lookups ...")
        res.lookups_per_point = lookups
        res.lookups = run_lookups(os.path.join(work, "lookups-0"), checkpoints, lookups)
        for p in res.lookups:
            say(f"  {p.segments:5d} segments: read {p.read_us:.1f} µs, offset_for_timestamp {p.ts_us:.1f} µs")
    finally:
        if log is not None:
            log.close()
        remove(work)
    res.wall_s = time.perf_counter() - started
    res.load = (load_before, os.getloadavg()[0])
    return res


def _top(pr: cProfile.Profile, n: int) -> list[tuple[str, float, int]]:
    """The `n` functions with the most own time: (name, share of the total, calls)."""
    stats = pstats.Stats(pr).stats  # type: ignore[attr-defined]
    total = sum(v[2] for v in stats.values()) or 1.0
    rows = sorted(stats.items(), key=lambda kv: kv[1][2], reverse=True)[:n]
    return [(func.strip("{}").replace("built-in method ", "").replace("method ", "") if path == "~" else
             f"{os.path.basename(path)}:{line}({func})", tt / total, calls)
            for (path, line, func), (_cc, calls, tt, _ct, _callers) in rows]


def profile_loops(work: str, nbytes: int = 256 * MiB) -> dict[str, list[tuple[str, float, int]]]:
    """cProfile (own time) of an append run and of a hot fetch loop over 256 MiB."""
    batches = build_batches(nbytes)
    prepare(drop=False)
    pr = cProfile.Profile()
    pr.enable()
    _, plog = time_shale_append(os.path.join(work, "profile-0"), batches)
    pr.disable()
    out = {"append + flush": _top(pr, 6)}
    del batches
    fetch_pread(plog)  # warm
    pr = cProfile.Profile()
    pr.enable()
    fetch_pread(plog)
    pr.disable()
    out["hot fetch loop"] = _top(pr, 6)
    plog.close()
    remove(os.path.join(work, "profile-0"))
    return out


# -- report --------------------------------------------------------------------------------------


def _ok(ratio: float) -> str:
    return "yes" if ratio >= GOAL_RATIO else "**no**"


def _spread(xs: list[float], nbytes: int) -> str:
    rates = sorted(mbps(nbytes, x) for x in xs)
    return f"{rates[0]:.0f}–{rates[-1]:.0f}" if len(rates) > 1 else f"{rates[0]:.0f}"


def paired_ratio(shale_s: list[float], shale_bytes: int, dd_s: list[float], dd_bytes: int) -> float:
    """Median over runs i of rate(Shale run i) / rate(dd run i); the two runs of a pair were adjacent in time."""
    return statistics.median(mbps(shale_bytes, a) / mbps(dd_bytes, b) for a, b in zip(shale_s, dd_s))


def tables(res: Results) -> str:
    size = f"{res.total_bytes / MiB:.0f} MiB"
    lines = [
        "| Measurement | runs | Shale MB/s median (range) | dd MB/s median (range) | Shale / dd, medians "
        "| Shale / dd, median of paired runs | goal ≥ 70 % |",
        "|---|---:|---:|---:|---:|---:|:---:|",
    ]

    def row(what: str, shale_s: list[float], shale_bytes: int, dd_s: list[float]) -> str:
        s_med, d_med = mbps(shale_bytes, statistics.median(shale_s)), mbps(res.dd_bytes, statistics.median(dd_s))
        paired = paired_ratio(shale_s, shale_bytes, dd_s, res.dd_bytes)
        return (f"| {what} | {len(shale_s)} + {len(dd_s)} | {s_med:.0f} ({_spread(shale_s, shale_bytes)}) "
                f"| {d_med:.0f} ({_spread(dd_s, res.dd_bytes)}) | {s_med / d_med:.0%} | {paired:.0%} "
                f"| {_ok(paired)} |")

    lines.append(row(f"append {size} + 1 fsync", res.append_s, res.total_bytes, res.dd_write_s))
    for mode in ("hot", "cold"):
        if f"{mode} dd" not in res.read:
            continue
        for k in ("pread", "sendfile"):
            how = "`LogSlice.read_into()` (preadv, reused buffer)" if k == "pread" else "`os.sendfile` → /dev/null"
            lines.append(row(f"read {mode}: fetch loop of 1 MiB, {how}", res.read[f"{mode} {k}"], res.read_bytes,
                             res.read[f"{mode} dd"]))
    out = "\n".join(lines)
    if res.lookups:
        lk = [
            "",
            "| Segments | Log end offset | `read(random offset, 1)` µs (median / p90) "
            "| `offset_for_timestamp(random ts)` µs (median / p90) | control: one 61-byte `os.pread` µs |",
            "|---:|---:|---:|---:|---:|",
        ]
        for p in res.lookups:
            lk.append(f"| {p.segments} | {p.log_end_offset:,} | {p.read_us:.1f} / {p.read_p90_us:.1f} | {p.ts_us:.1f} / {p.ts_p90_us:.1f} | {p.pread_us:.2f} |")
        first, last = res.lookups[0], res.lookups[-1]
        lk.append(f"| **ratio {last.segments}/{first.segments}** | | **{last.read_us / first.read_us:.2f}** | **{last.ts_us / first.ts_us:.2f}** | {last.pread_us / first.pread_us:.2f} |")
        out += "\n" + "\n".join(lk)
    return out


def interpretation(res: Results) -> str:
    """The section's bullets: each figure against its goal, and what sets it."""
    def ratio(kind: str) -> float:
        if kind == "append":
            return paired_ratio(res.append_s, res.total_bytes, res.dd_write_s, res.dd_bytes)
        return paired_ratio(res.read[kind], res.read_bytes, res.read[f"{kind.split()[0]} dd"], res.dd_bytes)

    def met(r: float) -> str:
        return "goal met" if r >= GOAL_RATIO else "**below the goal**"

    app, hot_p, hot_s = ratio("append"), ratio("hot pread"), ratio("hot sendfile")
    out = [
        f"**Append: {app:.0%} of dd** ({met(app)}). Both pay the final fsync (~0.55 s per GiB, about half of either "
        "run). Shale's loop takes about twice dd's write phase: a CRC-32C check per batch (~0.12 s per GiB), one "
        "copy into a `bytearray` to rewrite the base offset (~0.13 s per GiB), and 1 GiB of distinct producer "
        "buffers read where dd re-reads one 1 MiB buffer.",
        f"**Hot reads: pread loop {hot_p:.0%} of dd** ({met(hot_p)}). Per 1 MiB fetch the engine does a `bisect` "
        "over the segments, a binary search in the mmap'd offset index and a walk of two batch headers, ~50 µs in "
        f"the loop against ~150 µs for the page-cache copy dd makes too. The sendfile loop ({hot_s:.1f}× dd) "
        "copies nothing: it is the ceiling of a sendfile server, not a like-for-like figure.",
    ]
    if res.cold:
        cold_p, cold_s = ratio("cold pread"), ratio("cold sendfile")
        out.append(f"**Cold reads: pread loop {cold_p:.0%}, sendfile loop {cold_s:.0%} of dd** "
                   f"({met(min(cold_p, cold_s))}). All three wait for the virtual disk, whose cold-read speed varies "
                   "about 2× between runs (see the ranges); readahead serves the fetch loop and dd alike.")
    first, last = res.lookups[0], res.lookups[-1]
    by_offset, by_ts = last.read_us / first.read_us, last.ts_us / first.ts_us
    out.append(
        f"**Lookups: {by_offset:.2f}× (offset) and {by_ts:.2f}× (timestamp) from {first.segments} to "
        f"{last.segments} segments** ({'flat: goal met' if max(by_offset, by_ts) < 2 else '**not flat**'}). "
        "Nothing walks the segments: a `bisect`, one binary search in one index, ~3 batch headers read with a "
        "61-byte `pread` each. Most of the growth is the kernel's cost of that `pread` as the data outgrows the CPU "
        f"caches (control column: {last.pread_us / first.pread_us:.1f}×).")
    if res.profile:
        out.append("**Where the time goes** (`--profile`, 256 MiB, own time): " + "; ".join(
            f"{loop}: " + ", ".join(f"`{name}` {share:.0%}" for name, share, _ in rows[:2])
            for loop, rows in res.profile.items()) + ".")
    out.append(
        "**Environment**: this VM backs guest memory lazily (Firecracker, virtio-balloon), so a page-cache write "
        "into untouched memory runs at ~0.4 GB/s instead of ~5 GB/s. Each writer therefore first deletes the "
        "previous output of its kind, as a broker whose retention deletes old segments does. dd writes zeros; the "
        "disk does not compress.")
    return bullets(out)


def markdown(res: Results, facts: dict[str, str], command: str) -> str:
    """This benchmark's section of docs/performance.md."""
    what = [
        f"**append**: {res.batches} producer batches of {res.batch_bytes:,} bytes (500 records of 1 KiB; "
        f"{res.total_bytes:,} bytes), built before timing, appended to a fresh `Log` (default topic config, "
        "segment.bytes 1 GiB), then one `flush()` (fsync), timed together. Reference: `dd if=/dev/zero of=FILE bs=1M "
        f"count={res.dd_bytes // MiB} conv=fdatasync`. Rounds alternate dd-first and Shale-first.",
        "**read**: a fetch loop from offset 0, `read(offset, 1 MiB)`, the bytes taken with `LogSlice.read_into()` "
        "(preadv into one reused buffer) or `os.sendfile` to /dev/null. Reference: `dd if=FILE of=/dev/null bs=1M`. "
        "Hot = both read once before timing; cold = `sync; echo 3 > /proc/sys/vm/drop_caches` before each run. The "
        "log is checked to read back byte for byte first.",
        "**lookups**: one log grown to each segment count (segment.bytes 64 KiB, batches of 10 records of 100 "
        f"bytes); at each size {res.lookups_per_point:,} random offsets and {res.lookups_per_point:,} random "
        "timestamps, each call timed alone and its answer checked.",
        "\"Median of paired runs\" is the median over i of rate(Shale run i) / rate(dd run i), the two runs of a pair "
        "adjacent in time; the goal column judges it.",
    ]
    return section(
        SECTION,
        measured(command, res.wall_s, res.load, "`--quick` runs 256 MiB and prints only; `--profile` adds cProfile "
                 "of the append and fetch loops."),
        paragraph("Machine: " + ", ".join(f"{k} {v}" for k, v in facts.items())
                  + ". All data on the disk of `bench/out/`, deleted afterwards."),
        "What is measured (MB/s = 10^6 bytes/s):", bullets(what), tables(res), "Interpretation:", interpretation(res))


def update_doc(section: str, path: str = DOC) -> None:
    """Replace this benchmark's section of docs/performance.md (or add it)."""
    update_section(SECTION, section, path)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="256 MiB, 2 rounds, fewer lookups (~1 minute)")
    ap.add_argument("--markdown", action="store_true", help="write docs/performance.md (the default of a full run)")
    ap.add_argument("--no-markdown", action="store_true", help="do not write docs/performance.md")
    ap.add_argument("--profile", action="store_true", help="cProfile the append and fetch loops (always in a full run)")
    ap.add_argument("--size-mib", type=int, help="override the data size")
    args = ap.parse_args(argv)
    quick = args.quick
    total = (args.size_mib * MiB) if args.size_mib else (256 * MiB if quick else GiB)
    command = ".venv/bin/python bench/log_engine.py" + (" --quick" if quick else "") + (
        f" --size-mib {args.size_mib}" if args.size_mib else "")
    facts = machine_facts(ROOT)
    print("\n".join(f"{k}: {v}" for k, v in facts.items()))
    if os.getloadavg()[0] > 0.5:
        print(f"warning: load average {os.getloadavg()[0]:.2f}: other processes will add noise to the figures")
    res = run(total, rounds=2 if quick else 6, read_reps=3 if quick else 6,
              checkpoints=(10, 30, 100, 300, 1000), lookups=1000 if quick else 3000, profile=args.profile or not quick)
    print()
    print(tables(res))
    print()
    print(interpretation(res))
    for k, rows in res.profile.items():
        print(f"\nprofile, {k}: " + "; ".join(f"{name} {share:.0%} ({calls:,} calls)" for name, share, calls in rows))
    print(f"\nwall time {res.wall_s:.0f} s, load average {res.load[0]:.2f} before, {res.load[1]:.2f} after")
    if (args.markdown or not quick) and not args.no_markdown:
        update_doc(markdown(res, facts, command))
        print(f"updated {os.path.relpath(DOC, ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
