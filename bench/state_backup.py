"""State backup and restore, measured: Shale's compacted topic against Redis (AOF) and PostgreSQL (upserts).

    .venv/bin/python bench/state_backup.py       # 1,000,000 keys, 10,000,000 updates (~8-10 min on 2 cores)
    .venv/bin/python bench/state_backup.py --profile --also-dirty-ratio 0.9   # what docs/performance.md shows
    .venv/bin/python bench/state_backup.py --keys 100000 --updates 1000000 --no-markdown   # a smaller run

`--profile` py-spies `shale serve` while it takes the writes; `--also-dirty-ratio 0.9` runs Shale a
second time with that `min.cleanable.dirty.ratio` while writing. Unless `--no-markdown`, the run
writes its section of docs/performance.md and the plot docs/state_backup.png.

The seeds argue that a compacted log beats an external store for backing up stream-processing state.
This runs the same job against three stores, one after the other, each started fresh by the run on
127.0.0.1 and stopped after it:

- **Shale**: `shale serve` on a fresh data directory under bench/out/, one compacted topic declared in
  a Topic manifest in a directory of its own; confluent-kafka (librdkafka) produces and consumes.
- **Redis**: Debian's `redis-server`, `appendonly yes`, `appendfsync everysec`, no RDB snapshots;
  redis-py with the hiredis parser, MSET commands in pipelines.
- **PostgreSQL**: Debian's server, a private cluster made with `initdb` in a temporary directory (as the
  `postgres` user when the run is root); psycopg 3, each batch `COPY`ed into a temporary table and
  applied with one `INSERT … SELECT DISTINCT ON (k) … ON CONFLICT (k) DO UPDATE` (or `executemany` of
  single-row upserts in pipeline mode, `--pg-method executemany`).

The workload (seeded, the same bytes for every store): K keys `key-0000000`…; N updates, the first K
writing every key once in a shuffled order, the other N − K drawing keys from a Zipf distribution
(s = 1.1 over K ranks, ranks mapped to keys by a seeded permutation); each value 100–1,000 bytes
(uniform), a slice at a random offset of a seeded text of words (compressible, like serialized
state) or of random bytes (`--values random`). Then, per store:

1. write all N updates in batches (timed until the last one is acknowledged);
2. bytes on disk; compaction (Shale: the cleaner, told by a manifest change to clean everything;
   Redis: BGREWRITEAOF; PostgreSQL: VACUUM FULL), timed; bytes on disk again;
3. restore: a fresh client reads the full latest state into a Python dict (timed), which must equal
   the model (every key, every latest value: asserted);
4. the server's peak memory: VmHWM of the one process (Shale, Redis), or the peak of the summed PSS
   of the postmaster and its children, sampled every 0.2 s (PostgreSQL).

If `redis-server` or PostgreSQL is missing, the run installs them with apt-get or fails.
"""

from __future__ import annotations

import argparse
import dataclasses
import glob
import json
import os
import platform
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from typing import Callable, Iterator

import numpy as np
import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT_DIR = os.path.join(ROOT, "bench", "out")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from perf_doc import bullets, machine_facts, measured, paragraph, section, update_section  # noqa: E402  (beside this script)

DOC = os.path.join(ROOT, "docs", "performance.md")
PLOT = os.path.join(ROOT, "docs", "state_backup.png")
SECTION = "## State backup and restore: Shale vs Redis vs PostgreSQL (issue: the seed's claim, measured)"

SHALE, REDIS, POSTGRES = "Shale", "Redis", "PostgreSQL"
SYSTEMS = (SHALE, REDIS, POSTGRES)
FULL_KEYS, FULL_UPDATES = 1_000_000, 10_000_000
ZIPF_S = 1.1
MIN_VALUE, MAX_VALUE = 100, 1000
SEED = 20261121
CORPUS_BYTES = 32 << 20
BATCH = 10_000  # updates per client batch for Redis (one pipeline) and PostgreSQL (one COPY + upsert)
REDIS_MSET_PAIRS = 1000  # key/value pairs per MSET in a pipeline
TOPIC = "state-backup"
DEDUPE_CAP = 8_000_000  # Shale's offset map, at most: a third of what one pass over a million keys needs


# -- workload ------------------------------------------------------------------------------------


def key_names(count: int) -> list[bytes]:
    width = max(7, len(str(count - 1)))
    return [b"key-%0*d" % (width, i) for i in range(count)]


def make_corpus(kind: str, size: int, rng: np.random.Generator) -> bytes:
    """The bytes values are cut from: `text` (words from a 4,096-word vocabulary) or `random`."""
    if kind == "random":
        return rng.bytes(size)
    if kind != "text":
        raise ValueError(f"unknown value kind {kind!r}: text or random")
    letters = np.frombuffer(b"abcdefghijklmnopqrstuvwxyz", dtype=np.uint8)
    lengths = rng.integers(2, 13, size=4096)
    vocab = [letters[rng.integers(0, 26, size=n)].tobytes() for n in lengths]
    picks = rng.integers(0, len(vocab), size=size // 7 + 16).tolist()
    return b" ".join([vocab[i] for i in picks])[:size]


@dataclass
class Workload:
    """N updates of K keys, generated from a seed; update i writes `value(i)` to key `key_ids[i]`."""

    keys: int
    updates: int
    seed: int
    values_kind: str
    key_ids: np.ndarray  # int32 [updates]
    offsets: np.ndarray  # int64 [updates], into corpus
    lengths: np.ndarray  # int32 [updates]
    corpus: bytes
    names: list[bytes]

    @classmethod
    def generate(cls, keys: int, updates: int, seed: int = SEED, values: str = "text",
                 zipf_s: float = ZIPF_S) -> Workload:
        if keys < 1 or updates < keys:
            raise ValueError(f"need 1 <= keys <= updates, got keys={keys} updates={updates}")
        rng = np.random.default_rng(seed)
        corpus = make_corpus(values, max(CORPUS_BYTES if updates > 100_000 else 1 << 20, MAX_VALUE * 4), rng)
        first = rng.permutation(keys).astype(np.int32)  # every key once: the state has exactly K keys
        cdf = np.cumsum(np.arange(1, keys + 1, dtype=np.float64) ** -zipf_s)
        ranks = np.searchsorted(cdf, rng.random(updates - keys) * cdf[-1], side="right")
        ranks = np.minimum(ranks, keys - 1)
        hot = rng.permutation(keys).astype(np.int32)[ranks]  # rank r is key perm[r]
        key_ids = np.concatenate([first, hot])
        lengths = rng.integers(MIN_VALUE, MAX_VALUE + 1, size=updates, dtype=np.int32)
        offsets = rng.integers(0, len(corpus) - MAX_VALUE, size=updates, dtype=np.int64)
        return cls(keys, updates, seed, values, key_ids, offsets, lengths, corpus, key_names(keys))

    @property
    def value_bytes(self) -> int:
        return int(self.lengths.sum(dtype=np.int64))

    @property
    def payload_bytes(self) -> int:
        """Key plus value bytes of all updates: what the MB/s figures count."""
        return self.value_bytes + self.updates * len(self.names[0])

    def batches(self, size: int, start: int = 0, stop: int | None = None
                ) -> Iterator[tuple[list[bytes], list[bytes]]]:
        """(keys, values) of updates [start, stop) in order, `size` at a time."""
        stop = self.updates if stop is None else stop
        names, corpus = self.names, self.corpus
        for i in range(start, stop, size):
            j = min(i + size, stop)
            ks = [names[k] for k in self.key_ids[i:j].tolist()]
            vs = [corpus[o:o + n] for o, n in zip(self.offsets[i:j].tolist(), self.lengths[i:j].tolist())]
            yield ks, vs

    def latest_update(self) -> np.ndarray:
        """Index of each key's last update (every key has one)."""
        rev = self.key_ids[::-1]
        _, first_in_rev = np.unique(rev, return_index=True)
        return (self.updates - 1 - first_in_rev).astype(np.int64)

    def skew(self) -> tuple[float, float]:
        """(share of the updates that went to the hottest 1 % of keys, share of keys updated more than once)."""
        counts = np.bincount(self.key_ids, minlength=self.keys)
        top = np.sort(counts)[::-1][: max(1, self.keys // 100)].sum()
        return float(top / self.updates), float((counts > 1).sum() / self.keys)

    def compression_ratio(self, codec: str = "lz4", sample: int = 2000) -> float:
        """Bytes of a typical producer batch of values over its compressed size."""
        raw = b"".join(next(self.batches(min(sample, self.updates)))[1])
        if codec == "zstd":
            import zstandard
            return len(raw) / len(zstandard.ZstdCompressor(level=3).compress(raw))
        import lz4.frame
        return len(raw) / len(lz4.frame.compress(raw))


@dataclass
class StateCheck:
    keys_expected: int
    keys_restored: int
    wrong: int  # keys missing or with another value than the model's
    examples: list[str] = field(default_factory=list)

    @property
    def equal(self) -> bool:
        return self.wrong == 0 and self.keys_restored == self.keys_expected


def check_state(wl: Workload, restored: dict) -> StateCheck:
    """Compare a restored dict with the model: every key, holding the value of its last update, nothing else."""
    latest = wl.latest_update()
    wrong, examples = 0, []
    corpus = wl.corpus
    offs, lens = wl.offsets[latest].tolist(), wl.lengths[latest].tolist()
    for k, name in enumerate(wl.names):
        got = restored.get(name)
        if got is None or len(got) != lens[k] or got != corpus[offs[k]:offs[k] + lens[k]]:
            wrong += 1
            if len(examples) < 3:
                examples.append(f"{name.decode()}: {'missing' if got is None else f'{len(got)} bytes, not update #{latest[k]}'}")
    return StateCheck(wl.keys, len(restored), wrong, examples)


# -- processes -----------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port: int, proc: subprocess.Popen | None, what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode} before listening on port {port}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{what} did not listen on 127.0.0.1:{port} within {timeout} s")
            time.sleep(0.05)


def proc_status_kb(pid: int, field_name: str) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field_name + ":"):
                return int(line.split()[1])
    return 0


def children(pid: int) -> list[int]:
    out = []
    for path in glob.glob("/proc/[0-9]*/stat"):
        try:
            with open(path) as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        if ppid == pid:
            out.append(int(path.split("/")[2]))
    return out


def pss_kb(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


class TreeMemorySampler:
    """Peak of the summed PSS of a process and its children, sampled every `interval` s in a thread.

    PSS (proportional set size) splits each shared page between the processes that map it, so shared
    buffers count once over PostgreSQL's processes instead of once per backend.
    """

    def __init__(self, pid: int, interval: float = 0.2) -> None:
        self.pid, self.interval = pid, interval
        self.peak_kb = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="pss-sampler", daemon=True)
        self._thread.start()

    def sample(self) -> int:
        total = pss_kb(self.pid) + sum(pss_kb(c) for c in children(self.pid))
        self.peak_kb = max(self.peak_kb, total)
        return total

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.sample()

    def stop(self) -> int:
        self._stop.set()
        self._thread.join(5)
        self.sample()
        return self.peak_kb


def du_bytes(path: str, exclude: Callable[[str], bool] = lambda name: False) -> int:
    """Allocated bytes of the files under `path` (like `du`: sparse index files count what they use)."""
    total = 0
    for dirpath, _, files in os.walk(path):
        for name in files:
            if exclude(name):
                continue
            try:
                total += os.stat(os.path.join(dirpath, name)).st_blocks * 512
            except FileNotFoundError:
                pass
    return total


def stop_process(proc: subprocess.Popen, timeout: float = 60.0) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def ensure_installed() -> None:
    """Install Debian's redis-server and postgresql with apt-get if missing; fail loudly if that fails."""
    missing = []
    if shutil.which("redis-server") is None:
        missing.append("redis-server")
    if postgres_bindir() is None:
        missing.append("postgresql")
    if not missing:
        return
    apt = ["apt-get", "-o", "DPkg::Lock::Timeout=300", "install", "-y", "--no-install-recommends", *missing]
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    if subprocess.run(apt, env=env, capture_output=True).returncode != 0:
        subprocess.run(["apt-get", "-o", "DPkg::Lock::Timeout=300", "update"], env=env, capture_output=True)
        done = subprocess.run(apt, env=env, capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"could not install {' '.join(missing)} with apt-get (needed by the state backup "
                               f"benchmark): {done.stderr[-2000:]}")
    if shutil.which("redis-server") is None or postgres_bindir() is None:
        raise RuntimeError(f"{' '.join(missing)} still missing after apt-get install")


def postgres_bindir() -> str | None:
    """Debian keeps PostgreSQL's server binaries in /usr/lib/postgresql/<major>/bin, off the PATH."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"),
                   key=lambda p: int(p.split("/")[4]) if p.split("/")[4].isdigit() else 0)
    if found:
        return os.path.dirname(found[-1])
    initdb = shutil.which("initdb")
    return os.path.dirname(os.path.realpath(initdb)) if initdb else None


# -- results -------------------------------------------------------------------------------------


@dataclass
class SystemResult:
    name: str
    version: str = ""
    client: str = ""
    settings: str = ""
    write_s: float = 0.0
    records: int = 0
    payload_bytes: int = 0
    disk_after_write: int = 0
    disk_after_compaction: int = 0
    compaction_s: float = 0.0
    restore_s: float = 0.0
    restore_records: int = 0  # records the restore read (Shale: records in the log; others: keys)
    check: StateCheck | None = None
    peak_memory_bytes: int = 0
    memory_how: str = ""
    server_cpu_write_s: float = 0.0
    load_after_write: float = 0.0  # the machine's 1-minute load average as the write phase ended

    @property
    def records_per_s(self) -> float:
        return self.records / self.write_s if self.write_s else 0.0

    @property
    def mb_per_s(self) -> float:
        return self.payload_bytes / self.write_s / 1e6 if self.write_s else 0.0


def cpu_seconds(pids: list[int]) -> float:
    total = 0.0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        except OSError:
            pass
    return total


# -- Shale ---------------------------------------------------------------------------------------

SHALE_PRODUCER = {  # plus compression.type, linger.ms, batch.size and max.in.flight from ShaleOptions
    "acks": "all",
    "batch.num.messages": 100_000,
    "enable.idempotence": False,
    "queue.buffering.max.kbytes": 512 * 1024,
    "queue.buffering.max.messages": 2_000_000,
    "delivery.report.only.error": True,
}
SHALE_CONSUMER = {
    "enable.auto.commit": False,
    "auto.offset.reset": "earliest",
    "fetch.max.bytes": 64 << 20,
    "max.partition.fetch.bytes": 16 << 20,
    "queued.max.messages.kbytes": 1024 * 1024,
    "queued.min.messages": 10_000_000,
}


@dataclass(frozen=True)
class ShaleOptions:
    """The knobs of Shale's side of the run: producer, topic and node settings (flags of the command line)."""

    compression: str = "lz4"  # producer compression.type; the topic keeps the producer's codec
    linger_ms: int = 20
    batch_bytes: int = 256 << 10  # producer batch.size
    max_in_flight: int = 5  # producer max.in.flight: requests the server may hold (and buffer) at once
    write_dirty_ratio: float = 0.5  # min.cleanable.dirty.ratio while writing (Kafka's default)
    segment_bytes: int = 0  # 0: the payload / 16, between 1 MiB and 64 MiB, so small runs roll segments too
    dedupe_bytes: int = DEDUPE_CAP  # log.cleaner.dedupe.buffer.size, at most; 0: every key in one pass
    malloc_arena_max: int = 0  # MALLOC_ARENA_MAX of the server process; 0: glibc's default

    def dedupe_for(self, keys: int) -> int:
        """The offset map's bytes: 24-byte slots at load 0.9 for every key, capped at `dedupe_bytes`.

        The map is allocated and zeroed when the node starts, so its size is resident memory whatever the
        log holds (Kafka's default, 128 MiB, would be most of this node's memory). Above the cap a pass
        cleans the part of the dirty section whose keys fit, and the next pass goes on from there.
        """
        one_pass = max(1 << 20, int((keys + 1) / 0.9 * 24 * 1.1))
        return min(one_pass, self.dedupe_bytes) if self.dedupe_bytes else one_pass

    def segment_for(self, payload_bytes: int) -> int:
        """Only rolled segments are cleaned: the active one keeps its duplicates, so it must be a small part."""
        return self.segment_bytes or min(64 << 20, max(1 << 20, payload_bytes // 16))

    def topic_config(self, dirty_ratio: float, segment_bytes: int) -> dict[str, str]:
        return {
            "cleanup.policy": "compact",
            "compression.type": "producer",
            "segment.bytes": str(segment_bytes),
            "min.cleanable.dirty.ratio": str(dirty_ratio),
            "file.delete.delay.ms": "1000",
            "flush.ms": "1000",  # fsync every second, as Redis's appendfsync everysec
        }


class ShaleStore:
    name = SHALE

    def __init__(self, work: str, wl: Workload, say: Callable[..., None], options: ShaleOptions = ShaleOptions()
                 ) -> None:
        self.work, self.wl, self.say, self.options = work, wl, say, options
        self.producer_config = {**SHALE_PRODUCER, "compression.type": options.compression,
                                "linger.ms": options.linger_ms, "batch.size": options.batch_bytes,
                                "max.in.flight": options.max_in_flight}
        self.manifest = os.path.join(work, "topics", "state-backup.yaml")
        self.data = os.path.join(work, "shale-data")
        self.port, self.http = free_port(), free_port()
        self.dedupe = options.dedupe_for(wl.keys)
        self.segment_bytes = options.segment_for(wl.payload_bytes)
        self.launcher = [sys.executable, "-m", "shale.sidecar.cli"]  # the `shale` command
        self.proc: subprocess.Popen | None = None

    def write_manifest(self, dirty_ratio: float) -> None:
        os.makedirs(os.path.dirname(self.manifest), exist_ok=True)
        doc = {"apiVersion": "shale.dev/v1alpha1", "kind": "Topic", "metadata": {"name": TOPIC},
               "spec": {"partitions": 1, "config": self.options.topic_config(dirty_ratio, self.segment_bytes)}}
        tmp = self.manifest + ".tmp"
        with open(tmp, "w") as f:
            yaml.safe_dump(doc, f)
        os.replace(tmp, self.manifest)  # atomically, as a ConfigMap update does

    def start(self) -> None:
        self.write_manifest(self.options.write_dirty_ratio)
        args = [*self.launcher, "--log-level", "WARNING", "serve",
                "--data-dir", self.data, "--topics", os.path.dirname(self.manifest),
                "--listen", f"127.0.0.1:{self.port}", "--http", f"127.0.0.1:{self.http}",
                "--override", "log.cleaner.backoff.ms=1000",
                "--override", f"log.cleaner.dedupe.buffer.size={self.dedupe}",
                "--override", "log.flush.scheduler.interval.ms=1000",
                "--override", "log.initial.task.delay.ms=1000"]
        self.log_path = os.path.join(self.work, "shale.log")
        env = dict(os.environ)
        if self.options.malloc_arena_max:
            env["MALLOC_ARENA_MAX"] = str(self.options.malloc_arena_max)
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(args, stdout=log, stderr=log, cwd=ROOT, env=env)
        wait_port(self.port, self.proc, "shale serve")
        deadline = time.monotonic() + 30
        while not self.partition_status():
            if time.monotonic() > deadline:
                raise RuntimeError(f"shale serve: topic {TOPIC} did not appear in /status")
            time.sleep(0.1)

    @property
    def version(self) -> str:
        from importlib.metadata import version
        return f"shale {version('shale')} (`shale serve`, Python {platform.python_version()})"

    @property
    def client(self) -> str:
        from importlib.metadata import version

        from confluent_kafka import libversion
        return f"confluent-kafka {version('confluent-kafka')} (librdkafka {libversion()[0]})"

    @property
    def settings(self) -> str:
        p, o = self.producer_config, self.options
        return (f"Topic: 1 partition, `cleanup.policy=compact`, `segment.bytes={self.segment_bytes:,}`, "
                f"`min.cleanable.dirty.ratio={o.write_dirty_ratio}` while writing, `flush.ms=1000`; node: "
                f"`log.cleaner.backoff.ms=1000`, "
                f"`log.cleaner.dedupe.buffer.size={self.dedupe:,}`; producer: `acks={p['acks']}`, "
                f"`linger.ms={p['linger.ms']}`, `batch.size={p['batch.size']:,}`, "
                f"`compression.type={p['compression.type']}`; restore: one consumer, `assign()` from the "
                f"beginning, `consume(100000)`")

    def status(self) -> dict:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.http}/status", timeout=10) as r:
            return json.load(r)

    def partition_status(self) -> dict | None:
        topics = self.status().get("topics", {})
        parts = topics.get(TOPIC, {}).get("partitions", [])
        return parts[0] if parts else None

    def pids(self) -> list[int]:
        return [self.proc.pid]

    def write(self) -> float:
        from confluent_kafka import Producer

        failures: list[str] = []

        def on_delivery(err, msg) -> None:
            if err is not None:
                failures.append(f"{msg.topic()}-{msg.partition()}: {err}")

        producer = Producer({"bootstrap.servers": f"127.0.0.1:{self.port}", "on_delivery": on_delivery,
                             **self.producer_config})
        producer.list_topics(TOPIC, timeout=10)
        send, poll = producer.produce, producer.poll
        t0 = time.perf_counter()
        for keys, values in self.wl.batches(50_000):
            for k, v in zip(keys, values):
                try:
                    send(TOPIC, v, k, 0)
                except BufferError:
                    while True:
                        poll(0.01)
                        try:
                            send(TOPIC, v, k, 0)
                            break
                        except BufferError:
                            continue
            poll(0)
        left = producer.flush(600)
        elapsed = time.perf_counter() - t0
        if left or failures:
            raise AssertionError(f"Shale: {left} records not delivered to {TOPIC}-0, {len(failures)} failed: "
                                 f"{failures[:3]}")
        return elapsed

    def disk_bytes(self) -> int:
        return du_bytes(os.path.join(self.data, f"{TOPIC}-0"))

    def compact(self) -> float:
        """Tell the cleaner to clean everything (a manifest change, applied live) and wait until it has."""
        timeout = 120 + self.wl.payload_bytes / 5e6  # the cleaner does hundreds of MB/s; this is a hang
        t0 = time.perf_counter()
        asked_ms = int(time.time() * 1000)
        before = self.partition_status()
        needs_pass = bool(before and before["segments"] > 1 and (before["dirty_ratio"] or 0.0) > 0.0)
        self.write_manifest(0.0)
        part_dir = os.path.join(self.data, f"{TOPIC}-0")
        deadline = time.monotonic() + timeout
        while True:
            p = self.partition_status()
            if (p and p["min_cleanable_dirty_ratio"] == 0.0 and p["cleaning"]["state"] == "idle"
                    and (not needs_pass or (p["last_clean_ms"] or 0) >= asked_ms) and (p["dirty_ratio"] or 0.0) == 0.0
                    and not any(n.endswith((".deleted", ".cleaned", ".swap")) for n in os.listdir(part_dir))):
                return time.perf_counter() - t0
            if p and p["cleaning"]["state"] == "uncleanable":
                raise AssertionError(f"Shale: {TOPIC}-0 became uncleanable: {p['cleaning']}")
            if time.monotonic() > deadline:
                raise AssertionError(f"Shale: {TOPIC}-0 not compacted within {timeout} s: {p}")
            time.sleep(0.2)

    def restore(self) -> tuple[dict, int]:
        from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaException, Message, TopicPartition

        consumer = Consumer({"bootstrap.servers": f"127.0.0.1:{self.port}", "group.id": "state-restore",
                             **SHALE_CONSUMER})
        try:
            t0 = time.perf_counter()
            low, high = consumer.get_watermark_offsets(TopicPartition(TOPIC, 0), timeout=10)
            consumer.assign([TopicPartition(TOPIC, 0, OFFSET_BEGINNING)])
            state: dict[bytes, bytes] = {}
            records, last = 0, low - 1
            consume, key, value, error = consumer.consume, Message.key, Message.value, Message.error
            while last < high - 1:
                msgs = consume(100_000, 0.05)
                # As Redis's restore below: the dict is filled by C loops (map, zip, update), not per record in Python.
                failed = next(filter(None, map(error, msgs)), None)
                if failed is not None:
                    raise KafkaException(failed)
                state.update(zip(map(key, msgs), map(value, msgs)))
                if msgs:
                    records += len(msgs)
                    last = msgs[-1].offset()
                if time.perf_counter() - t0 > 600:
                    raise AssertionError(f"Shale: restore of {TOPIC}-0 stuck at offset {last} of {high}")
            self.restore_s = time.perf_counter() - t0
        finally:
            consumer.close()
        return state, records

    def peak_memory(self) -> tuple[int, str]:
        return proc_status_kb(self.proc.pid, "VmHWM") * 1024, "VmHWM of `shale serve`"

    def stop(self) -> None:
        if self.proc is not None:
            stop_process(self.proc)
            with open(self.log_path, errors="replace") as f:
                errors = [ln for ln in f.read().splitlines() if " ERROR " in ln or "Traceback" in ln]
            if errors:
                raise AssertionError(f"shale serve logged errors during the benchmark: {errors[:5]}")


# -- Redis ---------------------------------------------------------------------------------------


class RedisStore:
    name = REDIS

    def __init__(self, work: str, wl: Workload, say: Callable[..., None]) -> None:
        self.work, self.wl, self.say = os.path.join(work, "redis"), wl, say
        self.port = free_port()
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        import redis

        os.makedirs(self.work, exist_ok=True)
        args = ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--dir", self.work,
                "--appendonly", "yes", "--appendfsync", "everysec", "--save", "",
                "--logfile", os.path.join(self.work, "redis.log"), "--daemonize", "no"]
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_port(self.port, self.proc, "redis-server")
        self.r = redis.Redis(host="127.0.0.1", port=self.port)
        self.r.ping()

    @property
    def version(self) -> str:
        out = subprocess.run(["redis-server", "--version"], capture_output=True, text=True).stdout
        return "Redis " + out.split("v=")[1].split()[0] if "v=" in out else out.strip()

    @property
    def client(self) -> str:
        import redis
        from redis.utils import HIREDIS_AVAILABLE
        hi = ""
        if HIREDIS_AVAILABLE:
            import hiredis
            hi = f", hiredis {hiredis.__version__} parser"
        return f"redis-py {redis.__version__}{hi}"

    @property
    def settings(self) -> str:
        return (f"`appendonly yes`, `appendfsync everysec`, `save \"\"`, other settings the defaults (AOF rewrite "
                f"at +100 % over 64 MB, RDB preamble); writes: "
                f"pipelines of {BATCH // REDIS_MSET_PAIRS} MSETs of {REDIS_MSET_PAIRS} pairs; restore: "
                f"SCAN COUNT 10000 + MGET of each batch")

    def pids(self) -> list[int]:
        return [self.proc.pid]

    def write(self) -> float:
        pipe = self.r.pipeline(transaction=False)
        n = REDIS_MSET_PAIRS
        t0 = time.perf_counter()
        for keys, values in self.wl.batches(BATCH):
            flat: list[bytes] = [b""] * (2 * len(keys))
            flat[0::2], flat[1::2] = keys, values
            for i in range(0, len(flat), 2 * n):
                pipe.execute_command("MSET", *flat[i:i + 2 * n])
            pipe.execute()
        return time.perf_counter() - t0

    def _wait_no_rewrite(self, timeout: float = 1800.0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            info = self.r.info("persistence")
            if not info["aof_rewrite_in_progress"] and not info["aof_rewrite_scheduled"]:
                if info.get("aof_last_bgrewrite_status", "ok") != "ok":
                    raise AssertionError(f"Redis: AOF rewrite failed: {info}")
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"Redis: AOF rewrite still running after {timeout} s")
            time.sleep(0.1)

    def disk_bytes(self) -> int:
        return du_bytes(os.path.join(self.work, "appendonlydir"))

    def compact(self) -> float:
        t0 = time.perf_counter()
        self._wait_no_rewrite()  # an automatic rewrite may still run: BGREWRITEAOF would only be scheduled
        self.r.bgrewriteaof()
        time.sleep(0.05)
        self._wait_no_rewrite()
        # the history files of the previous AOF are deleted right after the rewrite's manifest is written
        deadline = time.monotonic() + 30
        while len(os.listdir(os.path.join(self.work, "appendonlydir"))) > 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        return time.perf_counter() - t0

    def restore(self) -> tuple[dict, int]:
        import redis

        client = redis.Redis(host="127.0.0.1", port=self.port)
        state: dict[bytes, bytes] = {}
        t0 = time.perf_counter()
        cursor = 0
        while True:
            cursor, keys = client.scan(cursor, count=10_000)
            if keys:
                state.update(zip(keys, client.mget(keys)))
            if cursor == 0:
                break
        self.restore_s = time.perf_counter() - t0
        client.close()
        return state, len(state)

    def peak_memory(self) -> tuple[int, str]:
        return (proc_status_kb(self.proc.pid, "VmHWM") * 1024,
                "VmHWM of `redis-server` (the AOF rewrite's forked child not counted)")

    def stop(self) -> None:
        if self.proc is not None:
            try:
                self.r.close()
            except Exception:  # noqa: BLE001
                pass
            stop_process(self.proc)


# -- PostgreSQL ----------------------------------------------------------------------------------


class PostgresStore:
    name = POSTGRES

    def __init__(self, work: str, wl: Workload, say: Callable[..., None], method: str = "copy") -> None:
        self.wl, self.say, self.method = wl, say, method
        self.bindir = postgres_bindir()
        if self.bindir is None:
            raise RuntimeError("PostgreSQL's initdb was not found (apt-get install postgresql)")
        # A directory the server's user can reach: pytest's and bench/out's parents may be private to root.
        self.base = tempfile.mkdtemp(prefix="shale-bench-pg-")
        self.data = os.path.join(self.base, "data")
        self.port = free_port()
        self.pid = 0
        self.sampler: TreeMemorySampler | None = None
        self.user = None
        if os.geteuid() == 0:  # the server refuses to run as root
            try:
                self.user = pwd.getpwnam("postgres")
            except KeyError:
                raise RuntimeError("running as root, and there is no `postgres` user to run PostgreSQL as "
                                   "(Debian's postgresql package creates it)") from None
            os.chown(self.base, self.user.pw_uid, self.user.pw_gid)

    def _as_server_user(self, args: list[str]) -> list[str]:
        return ["runuser", "-u", self.user.pw_name, "--", *args] if self.user else args

    def _run(self, args: list[str]) -> str:
        done = subprocess.run(self._as_server_user(args), capture_output=True, text=True, cwd=self.base)
        if done.returncode != 0:
            raise RuntimeError(f"PostgreSQL: {' '.join(args[:2])} failed ({done.returncode}): "
                               f"{done.stdout[-1500:]}{done.stderr[-1500:]}")
        return done.stdout

    def start(self) -> None:
        import psycopg

        self._run([os.path.join(self.bindir, "initdb"), "-D", self.data, "-U", "bench", "--auth=trust",
                   "--encoding=UTF8", "--no-instructions"])
        opts = (f"-c listen_addresses=127.0.0.1 -c port={self.port} -c unix_socket_directories={self.base}")
        self._run([os.path.join(self.bindir, "pg_ctl"), "-D", self.data, "-o", opts,
                   "-l", os.path.join(self.base, "postgres.log"), "-w", "-t", "120", "start"])
        with open(os.path.join(self.data, "postmaster.pid")) as f:
            self.pid = int(f.readline())
        self.sampler = TreeMemorySampler(self.pid)
        self.conn = psycopg.connect(host="127.0.0.1", port=self.port, user="bench", dbname="postgres",
                                    autocommit=True)
        self.conn.execute("CREATE TABLE state (k bytea PRIMARY KEY, v bytea NOT NULL)")

    @property
    def version(self) -> str:
        out = subprocess.run([os.path.join(self.bindir, "postgres"), "--version"], capture_output=True,
                             text=True).stdout.strip()
        return out.replace("postgres (PostgreSQL) ", "PostgreSQL ")

    @property
    def client(self) -> str:
        import psycopg
        return f"psycopg {psycopg.__version__} ({psycopg.pq.__impl__} implementation, libpq {psycopg.pq.version()})"

    @property
    def settings(self) -> str:
        how = (f"each batch of {BATCH:,} updates `COPY … (FORMAT BINARY)` into a temporary table, then "
               "one `INSERT INTO state SELECT DISTINCT ON (k) … ON CONFLICT (k) DO UPDATE`, one transaction per "
               "batch" if self.method == "copy" else
               f"`executemany` of `INSERT … ON CONFLICT (k) DO UPDATE` in pipeline mode, {BATCH:,} rows per "
               "transaction")
        return (f"initdb defaults (shared_buffers 128 MB, synchronous_commit on, autovacuum on); table "
                f"`state (k bytea PRIMARY KEY, v bytea NOT NULL)`; {how}; restore: `SELECT k, v FROM state`, "
                "binary, `fetchall()`")

    def pids(self) -> list[int]:
        return [self.pid, *children(self.pid)]

    def write(self) -> float:
        conn = self.conn
        t0 = time.perf_counter()
        if self.method == "copy":
            conn.execute("CREATE TEMPORARY TABLE batch (seq int8, k bytea, v bytea) ON COMMIT DELETE ROWS")
            seq = 0
            for keys, values in self.wl.batches(BATCH):
                with conn.transaction():
                    with conn.cursor() as cur:
                        with cur.copy("COPY batch (seq, k, v) FROM STDIN (FORMAT BINARY)") as copy:
                            copy.set_types(["int8", "bytea", "bytea"])
                            for i, (k, v) in enumerate(zip(keys, values), seq):
                                copy.write_row((i, k, v))
                        cur.execute("INSERT INTO state (k, v) SELECT DISTINCT ON (k) k, v FROM batch "
                                    "ORDER BY k, seq DESC ON CONFLICT (k) DO UPDATE SET v = EXCLUDED.v")
                seq += len(keys)
        else:
            sql = "INSERT INTO state (k, v) VALUES (%s, %s) ON CONFLICT (k) DO UPDATE SET v = EXCLUDED.v"
            for keys, values in self.wl.batches(BATCH):
                with conn.transaction():
                    with conn.cursor() as cur:
                        cur.executemany(sql, list(zip(keys, values)))
        return time.perf_counter() - t0

    def disk_bytes(self) -> int:
        return int(self.conn.execute("SELECT pg_total_relation_size('state')").fetchone()[0])

    def compact(self) -> float:
        t0 = time.perf_counter()
        self.conn.execute("VACUUM FULL state")
        return time.perf_counter() - t0

    def restore(self) -> tuple[dict, int]:
        import psycopg

        t0 = time.perf_counter()
        with psycopg.connect(host="127.0.0.1", port=self.port, user="bench", dbname="postgres") as conn:
            with conn.cursor(binary=True) as cur:
                cur.execute("SELECT k, v FROM state")
                state = dict(cur.fetchall())
        self.restore_s = time.perf_counter() - t0
        return state, len(state)

    def peak_memory(self) -> tuple[int, str]:
        peak = self.sampler.stop() if self.sampler else 0
        return peak * 1024, "peak of the summed PSS of the postmaster and its children, sampled every 0.2 s"

    def stop(self) -> None:
        try:
            if self.sampler:
                self.sampler.stop()
            if getattr(self, "conn", None) is not None:
                self.conn.close()
            if self.pid:
                self._run([os.path.join(self.bindir, "pg_ctl"), "-D", self.data, "-m", "fast", "-w", "stop"])
        finally:
            shutil.rmtree(self.base, ignore_errors=True)


# -- the run -------------------------------------------------------------------------------------


@dataclass
class Results:
    keys: int
    updates: int
    values_kind: str
    payload_bytes: int
    top1_share: float
    repeat_share: float
    lz4_ratio: float
    systems: dict[str, SystemResult] = field(default_factory=dict)
    wall_s: float = 0.0
    load: tuple[float, float] = (0.0, 0.0)
    profile: str = ""


def make_store(name: str, work: str, wl: Workload, say: Callable[..., None], pg_method: str = "copy",
               shale: ShaleOptions = ShaleOptions()):
    if name == SHALE:
        return ShaleStore(work, wl, say, shale)
    if name == REDIS:
        return RedisStore(work, wl, say)
    if name == POSTGRES:
        return PostgresStore(work, wl, say, method=pg_method)
    raise ValueError(f"unknown system {name!r}")


def measure(store, wl: Workload, say: Callable[..., None], profile: bool = False) -> tuple[SystemResult, str]:
    """Start the store, write, compact, restore and check, stop; the figures of one system."""
    res = SystemResult(store.name)
    prof = ""
    try:
        store.start()
        res.version, res.client, res.settings = store.version, store.client, store.settings
        cpu0 = cpu_seconds(store.pids())
        spy = start_profile(store.proc.pid, store.work) if profile and isinstance(store, ShaleStore) else None
        res.write_s = store.write()
        if spy is not None:
            prof = finish_profile(*spy)
        res.server_cpu_write_s = cpu_seconds(store.pids()) - cpu0
        res.load_after_write = os.getloadavg()[0]
        res.records, res.payload_bytes = wl.updates, wl.payload_bytes
        say(f"  {store.name}: wrote {wl.updates:,} updates in {res.write_s:.1f} s ({res.records_per_s:,.0f} "
            f"records/s, {res.mb_per_s:.1f} MB/s; server CPU {res.server_cpu_write_s:.1f} s)")
        res.disk_after_write = store.disk_bytes()
        res.compaction_s = store.compact()
        res.disk_after_compaction = store.disk_bytes()
        say(f"  {store.name}: on disk {res.disk_after_write / 1e6:,.1f} MB after the writes, "
            f"{res.disk_after_compaction / 1e6:,.1f} MB after compaction ({res.compaction_s:.1f} s)")
        state, res.restore_records = store.restore()
        res.restore_s = store.restore_s
        res.check = check_state(wl, state)
        del state
        say(f"  {store.name}: restored {res.check.keys_restored:,} keys ({res.restore_records:,} records read) "
            f"in {res.restore_s:.2f} s; equal to the model: {res.check.equal}")
        res.peak_memory_bytes, res.memory_how = store.peak_memory()
        say(f"  {store.name}: peak server memory {res.peak_memory_bytes / 2**20:,.0f} MiB")
    finally:
        store.stop()
    if not res.check.equal:
        raise AssertionError(f"{store.name}: the restored state is not the model's: {res.check.wrong:,} keys wrong "
                             f"of {res.check.keys_expected:,}, {res.check.keys_restored:,} restored; e.g. "
                             f"{res.check.examples}")
    return res, prof


def start_profile(pid: int, work: str):
    import broker  # bench/broker.py: py-spy's location and the profile summary

    exe = broker.py_spy()
    if exe is None:
        return None
    raw = os.path.join(work, "py-spy.txt")
    spy = subprocess.Popen([exe, "record", "--pid", str(pid), "--rate", "200", "--format", "raw", "--threads",
                            "--nonblocking", "--output", raw], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    time.sleep(1.0)
    return spy, raw


def _thread_own_time(raw: str, thread: str, top: int = 8) -> tuple[int, list[tuple[str, int]]]:
    """Busy samples of one thread (by name) and its functions with the most own samples."""
    import broker

    own: dict[str, int] = {}
    total = 0
    for line in raw.splitlines():
        stack, _, count = line.rpartition(" ")
        parts = stack.split(";")
        if not count.isdigit() or thread not in parts[0]:
            continue
        leaf = broker._frame_name(parts[-1])
        if leaf.startswith(("wait (threading", "EpollSelector.select", "_wait_for_tstate_lock")):
            continue
        total += int(count)
        own[leaf] = own.get(leaf, 0) + int(count)
    return total, sorted(own.items(), key=lambda x: -x[1])[:top]


def _shares(rows: list[tuple[str, int]], total: int, n: int) -> str:
    """The first `n` of py-spy's (function (file), samples) as "`function` share"."""
    return ", ".join(f"`{name.split(' (')[0]}` {count / max(total, 1):.0%}" for name, count in rows[:n])


def finish_profile(spy: subprocess.Popen, raw: str) -> str:
    """The profile in short: the event loop's own time and the most of it under Shale's code, the cleaner's."""
    import broker

    broker.stop_py_spy(spy, 60)
    if not os.path.exists(raw):
        return "py-spy wrote nothing"
    with open(raw) as f:
        text = f.read()
    samples, own, under = broker.summarize_profile(text, top=10)
    if not samples:
        return "py-spy recorded no busy samples"
    ours = [(name, n) for name, n in under if any(k in name for k in ("log/", "protocol/", "compression"))]
    cleaner, cleaner_own = _thread_own_time(text, "shale-log-cleaner")
    return (f"event-loop thread, own time {_shares(own, samples, 3)}, with {_shares(ours, samples, 1)} of the time "
            f"under; cleaner thread, {cleaner} busy samples ({cleaner / samples:.0%} of the event loop's), "
            f"{_shares(cleaner_own, cleaner, 3)}")


def run(keys: int, updates: int, systems: tuple[str, ...] = SYSTEMS, values: str = "text", out_dir: str = OUT_DIR,
        pg_method: str = "copy", profile: bool = False, shale: ShaleOptions = ShaleOptions(),
        also_dirty_ratio: float | None = None, say: Callable[..., None] = print) -> Results:
    """The whole benchmark; the smoke test calls it with tiny sizes.

    `also_dirty_ratio`: run Shale once more with that `min.cleanable.dirty.ratio` while writing, shown
    beside the others (the goals judge the first Shale run).
    """
    started = time.perf_counter()
    load_before = os.getloadavg()[0]
    if REDIS in systems or POSTGRES in systems:
        ensure_installed()
    t = time.perf_counter()
    wl = Workload.generate(keys, updates, values=values)
    top1, repeat = wl.skew()
    res = Results(keys, updates, values, wl.payload_bytes, top1, repeat, wl.compression_ratio("lz4"))
    say(f"workload: {keys:,} keys, {updates:,} updates, {wl.payload_bytes / 1e6:,.0f} MB of keys and values "
        f"({values} values, lz4 ratio {res.lz4_ratio:.2f}); the hottest 1 % of keys take {top1:.0%} of the updates; "
        f"generated in {time.perf_counter() - t:.1f} s")
    os.makedirs(out_dir, exist_ok=True)
    work = os.path.join(out_dir, f"state-backup-{os.getpid()}")
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    try:
        runs = [(name, make_store, shale) for name in systems]
        if also_dirty_ratio is not None and SHALE in systems:
            runs.append((f"{SHALE}, ratio {also_dirty_ratio:g}", make_store,
                         dataclasses.replace(shale, write_dirty_ratio=also_dirty_ratio)))
        for i, (name, make, options) in enumerate(runs):
            say(f"{name}:")
            store = make(name.split(",")[0], os.path.join(work, str(i)), wl, say, pg_method=pg_method, shale=options)
            store.name = name
            result, prof = measure(store, wl, say, profile=profile and name == SHALE)
            res.systems[name] = result
            if prof:
                res.profile = prof
    finally:
        shutil.rmtree(work, ignore_errors=True)
    res.wall_s = time.perf_counter() - started
    res.load = (load_before, os.getloadavg()[0])
    return res


# -- report --------------------------------------------------------------------------------------


def _mb(n: int) -> str:
    return f"{n / 1e6:,.1f}"


def table(res: Results) -> str:
    names = list(res.systems)
    lines = ["| Measurement | " + " | ".join(names) + " |", "|---|" + "---:|" * len(names)]

    def row(label: str, fmt: Callable[[SystemResult], str]) -> None:
        lines.append(f"| {label} | " + " | ".join(fmt(res.systems[n]) for n in names) + " |")

    row("write: records/s", lambda s: f"{s.records_per_s:,.0f}")
    row("write: MB/s (keys + values)", lambda s: f"{s.mb_per_s:,.1f}")
    row("write: seconds", lambda s: f"{s.write_s:,.1f}")
    row("write: server CPU seconds", lambda s: f"{s.server_cpu_write_s:,.1f}")
    row("write: server CPU µs per update", lambda s: f"{_us_per_record(s):,.1f}")
    row("load average (1 min) as the writes ended", lambda s: f"{s.load_after_write:.2f}")
    row("restore: seconds", lambda s: f"{s.restore_s:,.2f}")
    row("restore: records read", lambda s: f"{s.restore_records:,}")
    row("restored state equals the model", lambda s: "yes" if s.check and s.check.equal else "**no**")
    row("server peak memory, MiB", lambda s: f"{s.peak_memory_bytes / 2**20:,.0f}")
    row("on disk after the writes, MB", lambda s: _mb(s.disk_after_write))
    row("on disk after compaction, MB", lambda s: _mb(s.disk_after_compaction))
    row("compaction: seconds", lambda s: f"{s.compaction_s:,.1f}")
    return "\n".join(lines)


@dataclass
class Goal:
    what: str
    shale: float
    other: float
    met: bool


def goals(res: Results) -> list[Goal]:
    s = res.systems.get(SHALE)
    r = res.systems.get(REDIS)
    p = res.systems.get(POSTGRES)
    out = []
    if s and p:
        out.append(Goal("write throughput above PostgreSQL's (records/s)", s.records_per_s, p.records_per_s,
                        s.records_per_s > p.records_per_s))
    if s and r:
        out.append(Goal("write throughput at least Redis's (records/s)", s.records_per_s, r.records_per_s,
                        s.records_per_s >= r.records_per_s))
        out.append(Goal("restore time at most Redis's (s)", s.restore_s, r.restore_s, s.restore_s <= r.restore_s))
        out.append(Goal("server memory under a tenth of Redis's (MiB)", s.peak_memory_bytes / 2**20,
                        r.peak_memory_bytes / 2**20, s.peak_memory_bytes < r.peak_memory_bytes / 10))
    return out


def goals_table(res: Results) -> str:
    lines = ["| Goal for Shale | Shale | other | ratio | met |", "|---|---:|---:|---:|:---:|"]
    for g in goals(res):
        lines.append(f"| {g.what} | {g.shale:,.2f} | {g.other:,.2f} | {g.shale / g.other:.2f} | "
                     f"{'yes' if g.met else '**no**'} |")
    return "\n".join(lines)


def plot(res: Results, path: str = PLOT) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(res.systems)
    base = {SHALE: "#2b7bba", REDIS: "#d6453d", POSTGRES: "#5a9e4b"}
    colors = {n: base.get(n, "#7fb3dc") for n in names}  # a second Shale run in a lighter blue
    labels = [n.replace(", ", ",\n") for n in names]
    fig, axes = plt.subplots(1, 4, figsize=(15, 4.2))
    panels = [
        ("write throughput\n(thousand records/s, higher is better)", lambda s: s.records_per_s / 1e3, "{:,.0f}"),
        ("restore into a Python dict\n(seconds, lower is better)", lambda s: s.restore_s, "{:,.2f}"),
        ("server peak memory\n(MiB, lower is better)", lambda s: s.peak_memory_bytes / 2**20, "{:,.0f}"),
    ]
    for ax, (title, get, fmt) in zip(axes, panels):
        vals = [get(res.systems[n]) for n in names]
        bars = ax.bar(range(len(names)), vals, color=[colors[n] for n in names])
        ax.set_xticks(range(len(names)), labels)
        ax.bar_label(bars, labels=[fmt.format(v) for v in vals], fontsize=9)
        ax.set_title(title, fontsize=10)
        ax.margins(y=0.15)
    if REDIS in res.systems:  # the memory goal: a tenth of Redis's
        tenth = res.systems[REDIS].peak_memory_bytes / 2**20 / 10
        axes[2].axhline(tenth, color="#555555", linestyle="--", linewidth=1, label="goal for Shale: < Redis / 10")
        axes[2].legend(fontsize=8, loc="upper right")
    ax = axes[3]
    x = np.arange(len(names))
    before = [res.systems[n].disk_after_write / 1e6 for n in names]
    after = [res.systems[n].disk_after_compaction / 1e6 for n in names]
    b1 = ax.bar(x - 0.2, before, 0.4, label="after the writes", color=[colors[n] for n in names], alpha=0.45)
    b2 = ax.bar(x + 0.2, after, 0.4, label="after compaction", color=[colors[n] for n in names])
    ax.bar_label(b1, labels=[f"{v:,.0f}" for v in before], fontsize=8)
    ax.bar_label(b2, labels=[f"{v:,.0f}" for v in after], fontsize=8)
    ax.set_xticks(x, labels)
    ax.set_title("bytes on disk\n(MB, lower is better)", fontsize=10)
    ax.legend(fontsize=8, loc="upper left")
    ax.margins(y=0.15)
    fig.suptitle(f"State backup and restore: {res.keys:,} keys, {res.updates:,} updates (Zipf s={ZIPF_S}), "
                 f"values {MIN_VALUE}–{MAX_VALUE} bytes ({res.values_kind}); 2-core VM", fontsize=11)
    fig.tight_layout()
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _us_per_record(s: SystemResult) -> float:
    return s.server_cpu_write_s / s.records * 1e6 if s.records else 0.0


def interpretation(res: Results) -> str:
    """The section's bullets: each goal with its figures, and what sets them; numbers from this run."""
    sy = res.systems
    s, r, p = sy.get(SHALE), sy.get(REDIS), sy.get(POSTGRES)
    met = {g.what: "met" if g.met else "**not met**" for g in goals(res)}
    if not (s and r and p):
        return bullets(f"**{g.what}**: Shale {g.shale:,.2f}, other {g.other:,.2f} — {met[g.what]}."
                       for g in goals(res))
    mib = {n: x.peak_memory_bytes / 2**20 for n, x in sy.items()}
    write_r, write_p, restore, memory = (met[g] for g in (
        "write throughput at least Redis's (records/s)", "write throughput above PostgreSQL's (records/s)",
        "restore time at most Redis's (s)", "server memory under a tenth of Redis's (MiB)"))
    out = [
        f"**Write: Shale {s.records_per_s:,.0f} records/s, {s.records_per_s / r.records_per_s:.2f}× Redis "
        f"({write_r}) and {s.records_per_s / p.records_per_s:.2f}× "
        f"PostgreSQL ({write_p}).** Server CPU per update: Shale "
        f"{_us_per_record(s):.1f} µs, Redis {_us_per_record(r):.1f}, PostgreSQL {_us_per_record(p):.1f} (all its "
        "processes). Produce validation is one C walk over every record (`records_check`); the node's time goes to "
        "lz4 decompression of each batch for that walk, the segment append and the response, and the cleaner thread "
        "recompresses the batches that lose records.",
        f"**The others**: Redis's server is not the limit ({r.server_cpu_write_s / r.write_s:.2f} CPU s per s): "
        "redis-py waits for each pipeline's replies before packing the next, and AOF rewrites fork a child. "
        "PostgreSQL's `DISTINCT ON` upsert writes only the latest update of each key in a batch, plus WAL and index "
        "maintenance; its `executemany` path measured 33,968 records/s in a 1,000,000-update trial.",
        f"**Restore: Shale {s.restore_s:.2f} s, {s.restore_s / r.restore_s:.2f}× Redis's {r.restore_s:.2f} s "
        f"({restore}); PostgreSQL {p.restore_s:.2f} s.** Shale's consumer reads "
        f"{s.restore_records:,} records (one per key, plus the duplicates in the active segment, which the cleaner "
        "never touches) as lz4 batches sent with `sendfile`; librdkafka decompresses and C loops fill the dict. "
        "Redis answers SCAN and MGET one request at a time; PostgreSQL streams one binary `SELECT`.",
        f"**Memory: Shale {mib[SHALE]:,.0f} MiB, {mib[SHALE] / mib[REDIS]:.3f} of Redis's {mib[REDIS]:,.0f} MiB "
        f"({memory}); PostgreSQL {mib[POSTGRES]:,.0f} MiB.** Shale "
        f"holds no records: ~45 MiB is the interpreter with Shale's modules, {DEDUPE_CAP / 1e6:.0f} MB the cleaner's "
        "offset map (capped by `log.cleaner.dedupe.buffer.size`; a map for every key would be 29 MB and a peak of "
        "~90 MiB), the rest request buffers, kept small by `batch.size` 256 KiB.",
        f"**Disk: after the writes {s.disk_after_write / 1e6:,.0f} / {r.disk_after_write / 1e6:,.0f} / "
        f"{p.disk_after_write / 1e6:,.0f} MB, after compaction {s.disk_after_compaction / 1e6:,.0f} / "
        f"{r.disk_after_compaction / 1e6:,.0f} / {p.disk_after_compaction / 1e6:,.0f} MB.** Shale keeps the "
        "producer's lz4 batches compressed; Redis's rewritten AOF is an RDB snapshot; PostgreSQL compresses only "
        "values above ~2 kB and keeps a B-tree of the keys. Shale's compaction time includes "
        "`log.cleaner.backoff.ms` and `file.delete.delay.ms` (1 s each).",
    ]
    variant = next((v for n, v in sy.items() if n.startswith(SHALE + ",")), None)
    if variant is not None:
        ratio = variant.name.rsplit(" ", 1)[1]
        out.append(
            f"**Ratio {ratio}: {variant.records_per_s:,.0f} records/s, {variant.records_per_s / r.records_per_s:.2f}× "
            f"Redis, {_us_per_record(variant):.1f} µs per update**: the cleaner recopies the log only when that share "
            f"of it is dead, at the price of a larger log between passes ({variant.disk_after_write / 1e6:,.0f} MB). "
            "The default run keeps Kafka's 0.5 (Redis rewrites at twice the size, the same share) and fsyncs every "
            "second, as Redis's `appendfsync everysec`.")
    return bullets(out)


def markdown(res: Results, facts: str, command: str, plot_rel: str = "state_backup.png") -> str:
    """This benchmark's section of docs/performance.md."""
    stores = []
    for n, x in res.systems.items():
        if n.startswith(SHALE + ","):
            stores.append(f"**{n}**: the same with `min.cleanable.dirty.ratio={n.rsplit(' ', 1)[1]}` while writing.")
        else:
            stores.append(f"**{n}**: {x.version}; client {x.client}. {x.settings}.")
    stores.append("**Memory**: " + "; ".join(f"{n}, {x.memory_how}" for n, x in res.systems.items()
                                             if not n.startswith(SHALE + ",")) + ".")
    values = ("text from a 4,096-word vocabulary" if res.values_kind == "text" else "seeded random bytes")
    profile = ""
    if res.profile:
        profile = paragraph(f"Profile of `shale serve` while it took the writes (py-spy, `--profile`): {res.profile}. "
                            "Other work shared the CPUs (load average as each store's writes ended is in the table); "
                            "server CPU per update is the figure least moved by it.")
    return section(
        SECTION,
        measured(command, res.wall_s, res.load, "`--keys 100000 --updates 1000000 --no-markdown` is a smaller run "
                 "that only prints."),
        paragraph(f"Machine: {facts}. Each server runs alone on 127.0.0.1, started fresh and stopped after; the client "
                  "is the benchmark's process on the same 2 cores."),
        paragraph(f"Workload (seeded, the same bytes for every store): {res.keys:,} keys, {res.updates:,} updates. The "
                  f"first {res.keys:,} write every key once, shuffled; the rest draw keys from a Zipf distribution "
                  f"(s = {ZIPF_S}): the hottest 1 % of the keys take {res.top1_share:.0%} of all updates, and "
                  f"{res.repeat_share:.0%} of the keys are written more than once. Values are {MIN_VALUE}–{MAX_VALUE} "
                  f"bytes of {values} (lz4 packs a producer batch {res.lz4_ratio:.2f}:1); "
                  f"{res.payload_bytes / 1e6:,.0f} MB of keys and values in all."),
        paragraph("Restore = a fresh client reads the whole latest state into a Python dict, compared with the model "
                  "key by key."),
        bullets(stores), f"![state backup and restore]({plot_rel})", table(res), goals_table(res),
        "Interpretation:", interpretation(res), profile)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--keys", type=int, default=FULL_KEYS)
    ap.add_argument("--updates", type=int, default=FULL_UPDATES)
    ap.add_argument("--values", choices=("text", "random"), default="text")
    ap.add_argument("--systems", default=",".join(SYSTEMS), help="comma-separated: " + ", ".join(SYSTEMS))
    ap.add_argument("--pg-method", choices=("copy", "executemany"), default="copy")
    d = ShaleOptions()
    ap.add_argument("--compression", default=d.compression, help="the Shale producer's compression.type")
    ap.add_argument("--linger-ms", type=int, default=d.linger_ms, help="the Shale producer's linger.ms")
    ap.add_argument("--batch-bytes", type=int, default=d.batch_bytes, help="the Shale producer's batch.size")
    ap.add_argument("--max-in-flight", type=int, default=d.max_in_flight, help="the Shale producer's max.in.flight")
    ap.add_argument("--write-dirty-ratio", type=float, default=d.write_dirty_ratio,
                    help="Shale's min.cleanable.dirty.ratio while the updates are written")
    ap.add_argument("--also-dirty-ratio", type=float, default=None,
                    help="run Shale once more with this min.cleanable.dirty.ratio while writing (e.g. 0.9)")
    ap.add_argument("--segment-bytes", type=int, default=d.segment_bytes,
                    help="Shale's segment.bytes (0: the payload / 16, between 1 MiB and 64 MiB)")
    ap.add_argument("--dedupe-bytes", type=int, default=d.dedupe_bytes,
                    help="cap on Shale's log.cleaner.dedupe.buffer.size (0: enough for every key in one pass)")
    ap.add_argument("--malloc-arena-max", type=int, default=d.malloc_arena_max,
                    help="MALLOC_ARENA_MAX for shale serve (0: glibc's default)")
    ap.add_argument("--profile", action="store_true", help="py-spy shale serve while it takes the writes")
    ap.add_argument("--no-markdown", action="store_true", help="do not write docs/performance.md and the plot")
    args = ap.parse_args(argv)
    systems = tuple(s.strip() for s in args.systems.split(",") if s.strip())
    for s in systems:
        if s not in SYSTEMS:
            ap.error(f"unknown system {s!r}; choose from {', '.join(SYSTEMS)}")
    command = " ".join([".venv/bin/python bench/state_backup.py", *(argv if argv is not None else sys.argv[1:])])
    facts = machine_facts()
    print(facts)
    print(f"running: {command}")
    if os.getloadavg()[0] > 0.5:
        print(f"warning: load average {os.getloadavg()[0]:.2f}: other processes will add noise to the figures")
    shale = ShaleOptions(compression=args.compression, linger_ms=args.linger_ms, batch_bytes=args.batch_bytes,
                         max_in_flight=args.max_in_flight, write_dirty_ratio=args.write_dirty_ratio,
                         segment_bytes=args.segment_bytes, dedupe_bytes=args.dedupe_bytes,
                         malloc_arena_max=args.malloc_arena_max)
    res = run(args.keys, args.updates, systems, values=args.values, pg_method=args.pg_method, profile=args.profile,
              shale=shale, also_dirty_ratio=args.also_dirty_ratio)
    print()
    print(table(res))
    print()
    print(goals_table(res))
    print()
    print(interpretation(res))
    if res.profile:
        print(f"\nprofile of shale serve during the writes: {res.profile}")
    print(f"\nwall time {res.wall_s:.0f} s, load average {res.load[0]:.2f} before, {res.load[1]:.2f} after")
    if not args.no_markdown:
        plot(res)
        update_section(SECTION, markdown(res, facts, command))
        print(f"wrote {os.path.relpath(DOC, ROOT)} and {os.path.relpath(PLOT, ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
