"""Log-dir move benchmark (issue 16): an unthrottled move's copy rate against `dd`, and produce latency during a
throttled move against idle.

    .venv/bin/python bench/moves.py              # full run, updates docs/performance.md ("Moves")
    .venv/bin/python bench/moves.py --quick      # small run, prints only (add --markdown to write the doc)

One real `shale serve` (tests/support/node_util.py's `ServeProcess`) with two log dirs on the same filesystem
(bench/out/, deleted at the end) and one topic of one partition, `segment.bytes` a quarter of its size so the
move copies sealed segments and the active one. confluent-kafka preloads it with N MB of 1 KiB records
(bench/broker.py's `produce`). In order:

1. copy rate: `sync`, then the partition's segment files (`*.log`) copied to a scratch directory on the same
   filesystem with `dd bs=1M conv=fsync` (one `dd` per file; the baseline), then AlterReplicaLogDirs
   (kafka-python) moves the partition to the other log dir, timed from the request until `/status` shows the
   move `done` (polled every 20 ms); R rounds, the partition moving back and forth, then `dd` once more from
   the last moved copy. The page cache is warm for every copy: the files were just written and read, and
   `sync` before each leaves nothing dirty, so each reads from memory and writes (with fsync) to the disk. The
   move's rate is the bytes it copied (`/status`: the segments, their indexes' used part, the small files) over
   its time, the median of the rounds; the baseline is the median of the `dd` rates over the segment bytes (the
   indexes, preallocated sparse to `segment.index.bytes`, left out: `dd` would write their zeros). The issue's
   goal: ≥ 50 % of `dd`.
2. latency under a throttled move: the node is restarted on the same dirs with
   `replica.alter.log.dirs.io.max.bytes.per.second` set so a move takes about T seconds; one record at a time
   (`acks=all`, `linger.ms` 0, bench/broker.py's `produce_latency`) to another partition of the node: the copy
   competes with its appends for the disk and the CPU, and the swap holds every append of the node (it runs on
   the event loop). Not to the moving partition itself: one record at a time appends ~5 MB/s here, more than a
   low throttle copies, and the move would not end (nor would Kafka's: a future replica copying slower than its
   partition grows never catches up). Idle, move, idle, move, …, idle (R moves, back and forth; the idle
   figures pooled, and those during the moves), so both sides see the machine's load as it varies; during a
   move, in rounds of 100 records (10 warm-up) until `/status` shows it done (rounds begun before it ended
   count). The issue's goal: p99 during ≤ 2× idle.
3. latency under a throttled reassignment (a move between nodes; `--no-reassign` leaves it out): a real etcd
   (tests/support/etcd_util.py) and three `shale serve --store etcd://…` nodes (node_util's `start_replicated_cluster`),
   with `leader.replication.throttled.rate` and `follower.replication.throttled.rate` set on every node and the
   topic's `leader/follower.replication.throttled.replicas` `*`. A topic of one partition on nodes [0, 1]
   preloaded with the same N MB (`acks=1`, then until the high watermark reaches the end: in-sync replication
   is not throttled), then its manifest's assignment changed to [0, 2], back to [0, 1], … (what the operator
   does for a Topic's `spec.assignment`): the new node copies the partition under the throttle while node 0
   keeps leading. The same one-record produces (`acks=all`) go to another partition, on nodes [0, 1], led by
   node 0 as well, idle and during alternately as in 2, a move lasting until Metadata shows the new replicas,
   all in sync. The rate is N MB / T s on both sides.

A full run: N = 512 MiB, R = 3, T = 20 s, 1,000 idle records before each throttled move and after the last;
`--quick`: 32 MiB, 1 round, 10 s, 300 (at 32 MiB the move's fixed costs — the pause, the swap's renames and
fsyncs, the old copy's deletion — weigh on its rate: its ratio to `dd` is not the goal's).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
# Beside this script, and the tests' helpers (tests/support/).
sys.path[:0] = [HERE, os.path.join(ROOT, "tests")]
from broker import OUT_DIR, RECORD_SIZE, ServerProcess, make_values, percentile, produce, produce_latency  # noqa: E402
from kafka.admin import KafkaAdminClient  # noqa: E402
from perf_doc import bullets, machine_facts, measured, paragraph, section, update_section  # noqa: E402

from support.etcd_util import EtcdServer  # noqa: E402
from support.node_util import (  # noqa: E402
    ReplicatedCluster,
    ServeProcess,
    start_replicated_cluster,
    topic_manifest,
    wait_for,
    write_manifests,
)

DOC = os.path.join(ROOT, "docs", "performance.md")
SECTION = "## Moves (issue 16)"
TOPIC = "moved"
LATENCY_TOPIC = "latency"  # where the one-record produces go: not the moving partition (see the docstring)
FULL_MB, QUICK_MB = 512, 32
FULL_LATENCY, QUICK_LATENCY = 1000, 300  # idle records before each throttled move and after the last
FULL_MOVE_S, QUICK_MOVE_S = 20.0, 10.0  # how long the throttle makes a move last
FULL_ROUNDS, QUICK_ROUNDS = 3, 1  # moves of each kind: unthrottled ones each between two `dd`s, throttled ones
# each between two idle measures
ROUND, ROUND_WARMUP = 100, 10
GOAL_COPY = 0.5  # move / dd
GOAL_P99 = 2.0  # p99 during / idle
THROTTLED = {"leader.replication.throttled.replicas": "*", "follower.replication.throttled.replicas": "*"}


@dataclass
class Results:
    size_mb: int
    segment_bytes: int = 0  # the partition's `*.log` files: what `dd` copies
    move_s: list[float] = field(default_factory=list)
    move_bytes_copied: list[int] = field(default_factory=list)  # the move's own count (/status)
    move_server_cpu_s: list[float] = field(default_factory=list)
    dd_s: list[float] = field(default_factory=list)
    throttle_bps: int = 0
    throttled_move_s: list[float] = field(default_factory=list)
    idle: list[float] = field(default_factory=list)  # seconds per record
    during: list[float] = field(default_factory=list)
    reassign_throttle_bps: int = 0  # 0: not measured
    reassign_s: list[float] = field(default_factory=list)
    reassign_idle: list[float] = field(default_factory=list)
    reassign_during: list[float] = field(default_factory=list)
    wall_s: float = 0.0
    load: tuple[float, float] = (0.0, 0.0)

    @property
    def move_rates(self) -> list[float]:
        return [b / s / 1e6 for b, s in zip(self.move_bytes_copied, self.move_s)]

    @property
    def move_mb_per_s(self) -> float:
        return statistics.median(self.move_rates)

    @property
    def dd_mb_per_s(self) -> float:
        return statistics.median(self.segment_bytes / s / 1e6 for s in self.dd_s)

    @property
    def copy_ratio(self) -> float:
        return self.move_mb_per_s / self.dd_mb_per_s

    @property
    def move_cpu_ms_per_mb(self) -> float:
        return statistics.median(c * 1e3 / (b / 1e6) for c, b in zip(self.move_server_cpu_s, self.move_bytes_copied))

    def ms(self, which: str, p: float) -> float:
        return percentile(getattr(self, which), p) * 1e3

    @property
    def p99_ratio(self) -> float:
        return self.ms("during", 99) / self.ms("idle", 99)

    @property
    def reassign_p99_ratio(self) -> float:
        return self.ms("reassign_during", 99) / self.ms("reassign_idle", 99)


# -- the node ------------------------------------------------------------------------------------


def start_node(work: Path, dirs: tuple[Path, Path], *overrides: str) -> ServeProcess:
    """`shale serve` on both log dirs (node 0); `overrides` are `key=value` server settings."""
    args = ["--data-dir", str(dirs[1])] + [a for o in overrides for a in ("--override", o)]
    return ServeProcess(dirs[0], work / "topics", *args).start()


def as_server(node: ServeProcess) -> ServerProcess:
    """The node seen as bench/broker.py's ServerProcess (its clients and the process's CPU time)."""
    return ServerProcess("shale serve", node.proc, node.port, str(node.log_path))


def partition_status(node: ServeProcess) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{node.http_port}/status", timeout=10) as r:
        return json.loads(r.read())["topics"][TOPIC]["partitions"][0]


def alter(node: ServeProcess, target: Path) -> None:
    """AlterReplicaLogDirs: the partition's replica on node 0 to `target`; answered at once, the move runs."""
    admin = KafkaAdminClient(bootstrap_servers=node.bootstrap)
    try:
        result = admin.alter_replica_log_dirs({(TOPIC, 0, 0): str(target)})
    finally:
        admin.close()
    if [e.__name__ for e in result.values()] != ["NoError"]:
        raise AssertionError(f"AlterReplicaLogDirs of {TOPIC}-0 to {target}: {result}")


def move_ended(node: ServeProcess) -> dict | None:
    """The move's /status entry once it ended; a move that failed or was cancelled fails the run."""
    move = partition_status(node)["move"]
    if move and move["state"] in ("failed", "cancelled"):
        raise AssertionError(f"the move of {TOPIC}-0 to {move['target']} ended {move['state']}: {move['reason']}")
    return move if move and move["state"] == "done" else None


def other_dir(node: ServeProcess, dirs: tuple[Path, Path]) -> tuple[Path, Path]:
    """(the dir holding the partition, the other one)."""
    source = Path(partition_status(node)["log_dir"])
    return source, dirs[1] if source == dirs[0] else dirs[0]


# -- copy rate -----------------------------------------------------------------------------------


def sync() -> None:
    subprocess.run(["sync"], check=True)


def segment_files(partition_dir: Path) -> list[Path]:
    return sorted(partition_dir.glob("*.log"))


def dd_copy(partition_dir: Path, scratch: Path) -> tuple[float, int]:
    """The segment files of `partition_dir` into `scratch` with `dd bs=1M conv=fsync`: seconds and bytes."""
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir(parents=True)
    files = segment_files(partition_dir)
    sync()
    t0 = time.perf_counter()
    for f in files:
        subprocess.run(["dd", f"if={f}", f"of={scratch / f.name}", "bs=1M", "conv=fsync", "status=none"], check=True)
    elapsed = time.perf_counter() - t0
    copied = sum((scratch / f.name).stat().st_size for f in files)
    shutil.rmtree(scratch)
    return elapsed, copied


def dd(res: Results, partition_dir: Path, scratch: Path, say: Callable[..., None]) -> None:
    seconds, copied = dd_copy(partition_dir, scratch)
    if copied != res.segment_bytes:
        raise AssertionError(f"dd of {partition_dir}: {copied} bytes, the segments hold {res.segment_bytes}")
    res.dd_s.append(seconds)
    say(f"  dd {partition_dir.parent.name} -> scratch: {copied / seconds / 1e6:.0f} MB/s")


def process_cpu_s(node: ServeProcess) -> float:
    """User + system CPU seconds of the whole process, ended threads included (`/proc/<pid>/stat`, 10 ms ticks):
    a move's copy runs in a thread of its own that is gone when the move is, so bench/broker.py's per-live-thread
    `cpu_seconds` would leave the copy out."""
    with open(f"/proc/{node.proc.pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def timed_move(node: ServeProcess, target: Path) -> tuple[float, dict, float]:
    """AlterReplicaLogDirs to `target`, then /status until done: seconds, the move's entry, server CPU seconds."""
    cpu0 = process_cpu_s(node)
    t0 = time.perf_counter()
    alter(node, target)
    move = wait_for(lambda: move_ended(node), timeout=3600, interval=0.02, what=f"the move of {TOPIC}-0 to {target}")
    return time.perf_counter() - t0, move, process_cpu_s(node) - cpu0


def segments_bytes(partition_dir: Path) -> int:
    return sum(f.stat().st_size for f in segment_files(partition_dir))


# -- latency -------------------------------------------------------------------------------------


def latency_until(server: ServerProcess, values: list[bytes], start: Callable[[], None],
                  ended: Callable[[], object]) -> tuple[list[float], float]:
    """One record at a time to the moving partition, in rounds, from `start()` until `ended()`: the latencies and
    the seconds the move took (to the end of the round that saw it done)."""
    out: list[float] = []
    t0 = time.perf_counter()
    start()
    while True:
        out += produce_latency(server, LATENCY_TOPIC, ROUND, values, warmup=ROUND_WARMUP).seconds
        if ended():
            return out, time.perf_counter() - t0


def alternate(server: ServerProcess, values: list[bytes], latency_records: int, rounds: int,
              start: Callable[[int], None], ended: Callable[[int], object],
              say: Callable[..., None], what: str) -> tuple[list[float], list[float], list[float]]:
    """Idle, move, idle, move, …, idle: `rounds` moves (`start(i)`, until `ended(i)`) with `latency_records`
    one-record produces before each and after the last, so idle and during share the machine's load as it
    varies. The idle latencies, those during the moves, and each move's seconds."""
    idle: list[float] = []
    during: list[float] = []
    seconds: list[float] = []
    for i in range(rounds):
        idle += produce_latency(server, LATENCY_TOPIC, latency_records, values).seconds
        d, s = latency_until(server, values, lambda: start(i), lambda: ended(i))
        during += d
        seconds.append(s)
        say(f"  {what} {i + 1} ({s:.0f} s): p99 {percentile(d, 99) * 1e3:.2f} ms during")
    idle += produce_latency(server, LATENCY_TOPIC, latency_records, values).seconds
    say(f"  idle: p99 {percentile(idle, 99) * 1e3:.2f} ms")
    return idle, during, seconds


# -- reassignment --------------------------------------------------------------------------------


def assignment(i: int) -> list[int]:
    """The replicas of move `i` (from 1): back and forth between [0, 1] and [0, 2]; node 0 leads throughout."""
    return [0, 2] if i % 2 else [0, 1]


def reassigned(cluster: ReplicatedCluster, replicas: list[int]) -> bool:
    state = cluster.metadata(TOPIC).get(0)
    return state is not None and state.replicas == tuple(replicas) and set(state.isr) == set(replicas)


def led_by_node_0(cluster: ReplicatedCluster, when: str) -> None:
    for topic in (TOPIC, LATENCY_TOPIC):
        leader = cluster.wait_for_leader(topic, 0).leader
        if leader != 0:
            raise AssertionError(f"{topic}-0 is led by node {leader}, not by node 0 (its first replica), {when}")


def measure_reassignment(res: Results, work: Path, size: int, latency_records: int, move_s: float, rounds: int,
                         values: list[bytes], say: Callable[..., None]) -> None:
    """Part 3: produce latency idle and during throttled reassignments between nodes [0, 1] and [0, 2]."""
    res.reassign_throttle_bps = max(int(size / move_s), 1)
    rates = tuple(a for side in ("leader", "follower")
                  for a in ("--override", f"{side}.replication.throttled.rate={res.reassign_throttle_bps}"))
    config = {"segment.bytes": max(size // 4, 2**20), **THROTTLED}
    etcd = EtcdServer(work / "etcd")
    cluster: ReplicatedCluster | None = None
    try:
        etcd.start()
        def manifests(replicas: list[int]) -> tuple[dict, dict]:
            return (topic_manifest(TOPIC, 1, config, assignment={"partitions": [replicas]}),
                    topic_manifest(LATENCY_TOPIC, 1, assignment={"partitions": [[0, 1]]}))

        cluster = start_replicated_cluster(work / "cluster", etcd, 3, *manifests(assignment(0)), extra=rates)
        led_by_node_0(cluster, "before the reassignments")
        server = as_server(cluster.servers[0])
        # acks=1, then the follower caught up: with acks=all, a whole preload queued at once waits on the
        # follower longer than the Produce timeout (error 7 at the leader)
        produce(server, TOPIC, size // RECORD_SIZE, values, acks="1")
        wait_for(lambda: cluster.high_watermark(TOPIC, 0) == size // RECORD_SIZE, timeout=600, interval=0.5,
                 what=f"node 1 to replicate the preload of {TOPIC}-0")
        res.reassign_idle, res.reassign_during, res.reassign_s = alternate(
            server, values, latency_records, rounds,
            lambda i: write_manifests(cluster.topics_dir / "topics.yaml", *manifests(assignment(i + 1))),
            lambda i: reassigned(cluster, assignment(i + 1)), say,
            f"reassignment throttled to {res.reassign_throttle_bps / 1e6:.1f} MB/s")
        led_by_node_0(cluster, "after the reassignments (else the latencies mix two leaders)")
        errors = [f"node {n}: {ln}" for n, s in cluster.servers.items() for ln in s.log().splitlines()
                  if " ERROR " in ln or "Traceback" in ln]
        if errors:
            raise AssertionError(f"shale serve logged errors during the reassignment: {errors[:5]}")
    finally:
        if cluster is not None:
            cluster.stop()
        etcd.kill()


# -- the run -------------------------------------------------------------------------------------


def run(size_mb: int, latency_records: int, move_s: float, rounds: int = 1, reassign: bool = True,
        out_dir: str = OUT_DIR, say: Callable[..., None] = print) -> Results:
    """The whole benchmark; the smoke test calls it with tiny sizes."""
    started = time.perf_counter()
    load_before = os.getloadavg()[0]
    work = Path(out_dir) / f"moves-{os.getpid()}"
    shutil.rmtree(work, ignore_errors=True)
    dirs = (work / "dir-a", work / "dir-b")
    size = size_mb * 2**20
    write_manifests(work / "topics" / "topics.yaml",
                    topic_manifest(TOPIC, 1, {"segment.bytes": max(size // 4, 2**20)}), topic_manifest(LATENCY_TOPIC))
    values = make_values()
    res = Results(size_mb)
    node: ServeProcess | None = None
    try:
        node = start_node(work, dirs)
        produce(as_server(node), TOPIC, size // RECORD_SIZE, values)
        source, target = other_dir(node, dirs)
        res.segment_bytes = segments_bytes(source / f"{TOPIC}-0")
        say(f"  preloaded {TOPIC}-0 in {source.name}: {res.segment_bytes / 1e6:.1f} MB of segments")

        for _ in range(rounds):
            dd(res, source / f"{TOPIC}-0", work / "dd", say)
            sync()
            seconds, move, cpu = timed_move(node, target)
            res.move_s.append(seconds)
            res.move_bytes_copied.append(move["bytes_copied"])
            res.move_server_cpu_s.append(cpu)
            if segments_bytes(target / f"{TOPIC}-0") != res.segment_bytes or (source / f"{TOPIC}-0").exists():
                raise AssertionError(f"{TOPIC}-0 after its move to {target}: not the same segments, or the old "
                                     "copy left")
            say(f"  move {source.name} -> {target.name}: {res.move_rates[-1]:.0f} MB/s "
                f"({move['bytes_copied'] / 1e6:.1f} MB copied, server CPU {cpu:.2f} s)")
            source, target = target, source
        dd(res, source / f"{TOPIC}-0", work / "dd", say)
        node.terminate()

        res.throttle_bps = max(int(statistics.median(res.move_bytes_copied) / move_s), 1)
        node = start_node(work, dirs, f"replica.alter.log.dirs.io.max.bytes.per.second={res.throttle_bps}")
        server = as_server(node)
        res.idle, res.during, res.throttled_move_s = alternate(
            server, values, latency_records, rounds, lambda i: alter(node, other_dir(node, dirs)[1]),
            lambda i: move_ended(node), say, f"log-dir move throttled to {res.throttle_bps / 1e6:.1f} MB/s")
        errors = [ln for ln in node.log().splitlines() if " ERROR " in ln or "Traceback" in ln]
        if errors:
            raise AssertionError(f"shale serve logged errors during the benchmark: {errors[:5]}")
        node.terminate()
        if reassign:
            measure_reassignment(res, work, size, latency_records, move_s, rounds, values, say)
    finally:
        if node is not None and node.proc.poll() is None:
            node.terminate()
        shutil.rmtree(work, ignore_errors=True)
    res.wall_s = time.perf_counter() - started
    res.load = (load_before, os.getloadavg()[0])
    return res


# -- report --------------------------------------------------------------------------------------


def seconds(xs: list[float]) -> str:
    return "–".join(f"{x:.0f}" for x in sorted({min(xs), max(xs)}))


def latency_rows(res: Results, idle: str, during: str, moves: str, move_s: list[float]) -> list[str]:
    """p50, p99 (the goal's) and max of one-record produces during the moves against idle."""
    rows = []
    for p in (50, 99, 100):
        ratio = res.ms(during, p) / res.ms(idle, p)
        goal = (f"≤ {GOAL_P99:.0f}×", "met" if ratio <= GOAL_P99 else "missed") if p == 99 else ("—", "")
        rows.append(f"| produce {'max' if p == 100 else f'p{p}'}, ms, during {len(move_s)} {moves} "
                    f"({len(getattr(res, during))} records, {seconds(move_s)} s each) | {res.ms(during, p):.2f} "
                    f"| idle {res.ms(idle, p):.2f} ({len(getattr(res, idle))} records) | {ratio:.2f} | {goal[0]} "
                    f"| {goal[1]} |")
    return rows


def table(res: Results) -> str:
    dd = ", ".join(f"{res.segment_bytes / s / 1e6:.0f}" for s in res.dd_s)
    moves = ", ".join(f"{r:.0f}" for r in res.move_rates)
    lines = ["| Measure | Figure | Baseline (same run) | Ratio | Goal | |",
             "|---|---:|---:|---:|---|:---:|",
             f"| unthrottled move ({statistics.median(res.move_bytes_copied) / 1e6:.1f} MB copied), MB/s "
             f"| {res.move_mb_per_s:.0f} (median of {moves}) "
             f"| `dd` of {res.segment_bytes / 1e6:.1f} MB: {res.dd_mb_per_s:.0f} (median of {dd}) "
             f"| {res.copy_ratio:.2f} | ≥ {GOAL_COPY:.2f} "
             f"| {'met' if res.copy_ratio >= GOAL_COPY else 'missed'} |"]
    lines += latency_rows(res, "idle", "during", f"log-dir moves throttled to {res.throttle_bps / 1e6:.1f} MB/s",
                          res.throttled_move_s)
    if res.reassign_throttle_bps:
        lines += latency_rows(res, "reassign_idle", "reassign_during", "reassignments (RF 2) throttled to "
                              f"{res.reassign_throttle_bps / 1e6:.1f} MB/s", res.reassign_s)
    return "\n".join(lines)


def summary(res: Results) -> str:
    return (f"move/dd {res.copy_ratio:.2f} ({res.move_mb_per_s:.0f} / {res.dd_mb_per_s:.0f} MB/s; the move's server "
            f"CPU {res.move_cpu_ms_per_mb:.2f} ms/MB); produce p99 during/idle {res.p99_ratio:.2f} "
            f"({res.ms('during', 99):.2f} / {res.ms('idle', 99):.2f} ms)" + (
                f"; reassignment p99 during/idle {res.reassign_p99_ratio:.2f} ({res.ms('reassign_during', 99):.2f}"
                f" / {res.ms('reassign_idle', 99):.2f} ms)" if res.reassign_throttle_bps else ""))


def interpretation(res: Results) -> str:
    """The section's bullets: the goals against the run's ratios, and what sets them."""
    out = [
        f"**Move: {res.copy_ratio:.2f} of `dd`** ({'goal met' if res.copy_ratio >= GOAL_COPY else '**goal missed**'}). "
        "The disk's speed varies by 10× within minutes as other work writes to it, hence the rounds and the medians, "
        "the move and `dd` taken around each other.",
        f"**The copy is not CPU-bound** ({res.move_cpu_ms_per_mb:.2f} ms of server CPU per MB), but that CPU is on "
        "its path: `FutureCopy._copy` reads 256 KiB chunks into Python bytes and writes them back, `dd`'s two copies "
        "plus an allocation per chunk. `os.copy_file_range` per chunk would keep the chunking and the throttle and "
        "leave the copy to the kernel.",
    ]
    ratios = [res.p99_ratio] + ([res.reassign_p99_ratio] if res.reassign_throttle_bps else [])
    out.append(
        f"**Produce p99 during a throttled move: {res.p99_ratio:.2f}× idle"
        + (f"; during a reassignment: {res.reassign_p99_ratio:.2f}×" if res.reassign_throttle_bps else "")
        + f"** ({'goal met' if max(ratios) <= GOAL_P99 else '**goal missed**'}). Idle and moves alternate, so both "
        "sides see the machine's load as it varies.")
    out.append(
        f"**The maximum** ({res.ms('during', 100):.0f} ms during moves against {res.ms('idle', 100):.0f} idle) is one "
        "record of thousands and follows the machine's load spikes; the swap itself holds the node's appends for its "
        "renames and fsyncs once per move.")
    return bullets(out)


def markdown(res: Results, facts: str, command: str) -> str:
    """This benchmark's section of docs/performance.md."""
    steps = [
        "**Copy rate**: `sync`, then the partition's `*.log` files copied with `dd bs=1M conv=fsync` (the baseline), "
        "then AlterReplicaLogDirs moves the partition to the other log dir, timed until `/status` shows the move "
        "`done`; R rounds back and forth. The page cache is warm for every copy, so each reads from memory and writes "
        f"(with fsync) to disk. Medians over the rounds; goal ≥ {GOAL_COPY:.0%} of `dd`.",
        "**Latency under a throttled move**: the node restarts with `replica.alter.log.dirs.io.max.bytes.per.second` "
        "set so a move takes about T s; one record at a time (`acks=all`, `linger.ms` 0) to another partition of the "
        "node, idle and during moves alternately (idle figures pooled). Not to the moving partition: one record at a "
        "time outgrows a low throttle, and the move would never end (nor would Kafka's). Goal: p99 during ≤ "
        f"{GOAL_P99:.0f}× idle.",
        "**Latency under a throttled reassignment**: a real etcd and three `shale serve --store etcd://…` nodes with "
        "`leader/follower.replication.throttled.rate` set; a one-partition topic on [0, 1] preloaded with N MB, its "
        "assignment changed to [0, 2] and back (what the operator does for `spec.assignment`) while node 0 keeps "
        "leading. The same produces go to another partition led by node 0; a move lasts until Metadata shows the new "
        "replicas all in sync.",
    ]
    return section(
        SECTION,
        measured(command, res.wall_s, res.load, "Other work shares the 2 cores and the disk, so the ratios, both sides "
                 f"from the same run, carry over better than the absolute figures. `--quick` runs {QUICK_MB} MiB, "
                 f"{QUICK_ROUNDS} round, {QUICK_MOVE_S:.0f} s and prints only; `--no-reassign` leaves out the "
                 "reassignment."),
        paragraph(f"Machine: {facts}."),
        paragraph("What is measured: one real `shale serve` with two log dirs on the same filesystem (bench/out/) and "
                  "one topic of one partition, `segment.bytes` a quarter of its size, preloaded by confluent-kafka "
                  f"with N MB of 1 KiB records. A full run: N = {FULL_MB} MiB, R = {FULL_ROUNDS} rounds, T = "
                  f"{FULL_MOVE_S:.0f} s per throttled move, {FULL_LATENCY:,} idle records before each throttled move "
                  f"and after the last; this run: N = {res.size_mb} MiB, R = {len(res.move_s)}."),
        bullets(steps, numbered=True), table(res), paragraph(f"Ratios: {summary(res)}."),
        "Interpretation:", interpretation(res))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help=f"{QUICK_MB} MB, {QUICK_LATENCY} idle records, prints only")
    ap.add_argument("--size-mb", type=int, help="the partition's size before the move")
    ap.add_argument("--latency-records", type=int, help="idle one-record produces, before and after the move each")
    ap.add_argument("--rounds", type=int, help="unthrottled moves (the partition moving back and forth)")
    ap.add_argument("--move-seconds", type=float, help="how long the throttled move should last")
    ap.add_argument("--no-reassign", action="store_true", help="leave out part 3 (etcd and three nodes)")
    ap.add_argument("--markdown", action="store_true", help="write docs/performance.md (the default of a full run)")
    ap.add_argument("--no-markdown", action="store_true", help="do not write docs/performance.md")
    args = ap.parse_args(argv)
    size_mb = args.size_mb or (QUICK_MB if args.quick else FULL_MB)
    latency = args.latency_records or (QUICK_LATENCY if args.quick else FULL_LATENCY)
    move_s = args.move_seconds or (QUICK_MOVE_S if args.quick else FULL_MOVE_S)
    rounds = args.rounds or (QUICK_ROUNDS if args.quick else FULL_ROUNDS)
    command = ".venv/bin/python bench/moves.py" + " ".join(
        [""] + (["--quick"] if args.quick else []) + ([f"--size-mb {args.size_mb}"] if args.size_mb else [])
        + ([f"--latency-records {args.latency_records}"] if args.latency_records else [])
        + ([f"--move-seconds {args.move_seconds:g}"] if args.move_seconds else [])
        + ([f"--rounds {args.rounds}"] if args.rounds else []) + (["--no-reassign"] if args.no_reassign else []))
    facts = machine_facts()
    print(facts)
    res = run(size_mb, latency, move_s, rounds, reassign=not args.no_reassign)
    print()
    print(table(res))
    print()
    print(summary(res))
    print(f"\nwall time {res.wall_s:.0f} s, load average {res.load[0]:.2f} before, {res.load[1]:.2f} after")
    if (args.markdown or not args.quick) and not args.no_markdown:
        update_section(SECTION, markdown(res, facts, command), DOC)
        print(f"wrote {os.path.relpath(DOC, ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
