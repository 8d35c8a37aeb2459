"""Run real storage nodes for tests: in a thread of this process, or as `shale serve` processes, alone, as a
cluster by assignment (`start_cluster`), or replicated through a real etcd (`start_replicated_cluster`)."""

from __future__ import annotations

import asyncio
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import yaml
from kafka.protocol.consumer.offsets import ListOffsetsRequest, ListOffsetsResponse
from kafka.protocol.metadata.metadata import MetadataRequest, MetadataResponse
from prometheus_client.parser import text_string_to_metric_families

from shale.sidecar.log.records import BatchHeader
from shale.sidecar.server.node import ServeOptions, StorageNode
from support import stop_util
from support.clients_util import build, call, raw_batches

_PORTS_PER_WORKER = 2000
_next_port: list[int] = []


def free_port() -> int:
    """A free port below the kernel's ephemeral range, from a block of its own for each pytest-xdist worker.

    Port 0 would hand out ephemeral ports: a node restarted on its old port could then find it taken by
    another worker's node or by any client's outgoing connection, and a test would talk to someone else.
    """
    if not _next_port:
        worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw")
        block = 20000 + (int(worker) if worker.isdigit() else 0) % 6 * _PORTS_PER_WORKER
        _next_port.append(block + random.randrange(_PORTS_PER_WORKER))  # apart from other test runs' nodes
    base = _next_port[0] - _next_port[0] % _PORTS_PER_WORKER
    for _ in range(_PORTS_PER_WORKER):
        port = _next_port[0]
        _next_port[0] = base + (port + 1 - base) % _PORTS_PER_WORKER
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port in {base}..{base + _PORTS_PER_WORKER - 1}")


def topic_manifest(name: str, partitions: int = 1, config: dict | None = None, **spec) -> dict:
    return {"apiVersion": "shale.dev/v1alpha1", "kind": "Topic", "metadata": {"name": name},
            "spec": {"partitions": partitions, "config": {k: str(v) for k, v in (config or {}).items()}, **spec}}


def write_manifests(path: Path, *topics: dict) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name("." + path.name + ".tmp")
    tmp.write_text(yaml.safe_dump_all(list(topics)))
    os.replace(tmp, path)  # atomically, as an editor or a ConfigMap update does
    return path


def scrape_metrics(http_port: int) -> dict[tuple[str, frozenset], float]:
    """Every sample of a node's /metrics, keyed by (sample name, labels)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/metrics", timeout=10) as response:
        text = response.read().decode()
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def fetch_sessions(http_port: int) -> tuple[float, float]:
    """A node's incremental fetch sessions and the partitions they hold (docs/fetch-sessions.md)."""
    metrics = scrape_metrics(http_port)
    return metrics[("shale_fetch_sessions", frozenset())], metrics[("shale_fetch_session_partitions", frozenset())]


def fetch_session_errors(http_port: int) -> dict[str, float]:
    """The session errors a node answered, by error name (`shale_fetch_session_errors_total`)."""
    return {dict(labels)["error"]: value for (name, labels), value in scrape_metrics(http_port).items()
            if name == "shale_fetch_session_errors_total"}


def wait_for(predicate, timeout: float = 15.0, interval: float = 0.05, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


class NodeThread:
    """A StorageNode on its own event loop in a background thread, with ephemeral ports."""

    def __init__(self, data_dir: str | Path, topics: str | Path, **options) -> None:
        options.setdefault("listen", ("127.0.0.1", 0))
        options.setdefault("http", ("127.0.0.1", 0))
        self.node = StorageNode(ServeOptions(data_dir=str(data_dir), topics=str(topics), **options))
        self._error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name="shale-node", daemon=True)

    def _run(self) -> None:
        try:
            asyncio.run(self.node.run())
        except BaseException as exc:  # noqa: BLE001 - reported to the test thread
            self._error = exc

    def start(self) -> "NodeThread":
        self.thread.start()
        wait_for(lambda: self.node.ready or self._error is not None, what="the node to start")
        if self._error:
            raise self._error
        return self

    def stop(self) -> None:
        self.node.stop()
        self.thread.join(30)
        assert not self.thread.is_alive(), "node did not stop"
        if self._error:
            raise self._error

    def call(self, fn, *args):
        """Run `fn(*args)` on the node's event loop and return its result (mutations belong there)."""
        async def run():
            return fn(*args)
        return asyncio.run_coroutine_threadsafe(run(), self.node._loop).result(10)

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.node.broker.port}"

    def __enter__(self) -> "NodeThread":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


class ServeProcess:
    """`shale serve` as a real process (for SIGTERM/SIGKILL tests and the clients that need one)."""

    def __init__(self, data_dir: str | Path, topics: str | Path, *extra: str, node_id: int = 0,
                 port: int | None = None, http_port: int | None = None, env: dict[str, str] | None = None) -> None:
        self.data_dir, self.topics, self.node_id = str(data_dir), str(topics), node_id
        self.port = port or free_port()
        self.http_port = http_port or free_port()
        self.args = [sys.executable, "-m", "shale.sidecar.cli", "serve", "--data-dir", self.data_dir,
                     "--topics", self.topics, "--listen", f"127.0.0.1:{self.port}",
                     "--http", f"127.0.0.1:{self.http_port}", "--node-id", str(node_id), *extra]
        self.env = None if env is None else {**os.environ, **env}
        self.proc: subprocess.Popen | None = None
        self.paused = False
        self.log_path = Path(self.data_dir).with_name(Path(self.data_dir).name + f".node{node_id}.log")

    def start(self, timeout: float = 30.0) -> "ServeProcess":
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(self.args, stdout=log, stderr=log, env=self.env)
        log.close()

        def listening() -> bool:
            if self.proc.poll() is not None:
                raise AssertionError(f"shale serve exited with {self.proc.returncode}:\n{self.log()}")
            try:  # both ports: the HTTP endpoints may open a moment after the Kafka listener
                for port in (self.port, self.http_port):
                    socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                return True
            except OSError:
                return False

        wait_for(listening, timeout, what="shale serve to listen")
        return self

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def terminate(self, timeout: float = 30.0) -> int:
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)  # a paused process dies at once either way; this reaps it
        self.proc.kill()
        self.proc.wait(10)

    def pause(self) -> None:
        """SIGSTOP: the process holds its sockets and answers nothing, as a stalled VM or a long GC would."""
        stop_util.sigstop(self.proc.pid)
        self.paused = True

    def resume(self) -> None:
        self.proc.send_signal(signal.SIGCONT)
        self.paused = False

    @property
    def running(self) -> bool:
        """Started, not exited, not paused."""
        return self.proc is not None and self.proc.poll() is None and not self.paused

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def __enter__(self) -> "ServeProcess":
        """`with ServeProcess(...)` starts it; `with ServeProcess(...).start()` must not start a second process."""
        return self if self.proc is not None and self.proc.poll() is None else self.start()

    def __exit__(self, *exc) -> None:
        if self.proc is not None and self.proc.poll() is None:
            if self.paused:
                self.resume()
            self.terminate()


def start_cluster(tmp_path: Path, topic: str, placement: list[int], *extra: str) -> list[ServeProcess]:
    """One `shale serve` per node id in `placement`, all reading one manifest that spreads `topic`'s
    partitions over them (partition i on node placement[i]); started, in node-id order."""
    ports = {n: free_port() for n in sorted(set(placement))}
    nodes = {str(n): f"127.0.0.1:{p}" for n, p in ports.items()}
    write_manifests(tmp_path / "topics" / f"{topic}.yaml",
                    topic_manifest(topic, len(placement), assignment={"partitions": placement, "nodes": nodes}))
    servers = [ServeProcess(tmp_path / f"data{n}", tmp_path / "topics", *extra, node_id=n, port=p)
               for n, p in ports.items()]
    for s in servers:
        s.start()
    return servers


# The session settings stay at their defaults (2000 / 500 ms): shorter ones fence nodes whose controller thread
# a loaded test machine stalls for a few hundred milliseconds. Fewer `__consumer_offsets` partitions (each a log
# on every node) keep three nodes on two shared cores quick to start.
TEST_OVERRIDES = ("--override", "offsets.topic.num.partitions=5")


@dataclass(frozen=True)
class PartitionState:
    """One partition as a node's Metadata answer shows it."""

    leader: int
    leader_epoch: int
    replicas: tuple[int, ...]
    isr: tuple[int, ...]
    error_code: int


@dataclass
class ReplicatedCluster:
    """`shale serve` processes sharing one etcd (`--store`) and one manifest directory, node ids 0..n-1.

    Every process can be SIGKILLed (`kill`), paused (`pause`/`resume`) and started again on the same data
    directory and ports (`restart`). The queries ask the nodes themselves over the Kafka protocol, as a client
    would; `batches` reads a replica's segment files directly, for byte-for-byte comparisons.
    """

    tmp_path: Path
    store: object  # its `url` is `--store`: tests/support/etcd_util.py's EtcdServer, or `KubeStoreUrl`
    servers: dict[int, ServeProcess] = field(default_factory=dict)
    proxies: dict = field(default_factory=dict)  # node id -> tests/support/fault_proxy.py's FaultProxy it advertises

    @property
    def topics_dir(self) -> Path:
        return self.tmp_path / "topics"

    @property
    def bootstrap(self) -> str:
        """Every node, through its proxy when it has one."""
        return ",".join(f"127.0.0.1:{self.proxies[n].port}" if n in self.proxies else s.bootstrap
                        for n, s in self.servers.items())

    def data_dir(self, node_id: int) -> Path:
        return Path(self.servers[node_id].data_dir)

    def running(self) -> list[ServeProcess]:
        return [s for s in self.servers.values() if s.running]

    def kill(self, node_id: int) -> None:
        self.servers[node_id].kill()

    def restart(self, node_id: int, timeout: float = 60.0) -> ServeProcess:
        """SIGKILL the node if it runs, and start it again on its data directory and ports."""
        server = self.servers[node_id]
        if server.proc is not None and server.proc.poll() is None:
            server.kill()
        return server.start(timeout)

    def metadata(self, topic: str, via: int | None = None) -> dict[int, PartitionState]:
        """The partitions of `topic` as node `via` (default: the first running node that answers) shows them."""
        candidates = [self.servers[via]] if via is not None else self.running()
        last: Exception | None = None
        for server in candidates:
            try:
                resp = call(server.port, build(MetadataRequest, {"topics": [{"name": topic}],
                                                                 "allow_auto_topic_creation": False}, 9),
                            MetadataResponse, timeout=5)
            except (OSError, AssertionError) as exc:
                last = exc
                continue
            (t,) = resp.topics
            return {p.partition_index: PartitionState(p.leader_id, p.leader_epoch, tuple(p.replica_nodes),
                                                      tuple(p.isr_nodes), p.error_code) for p in t.partitions}
        raise AssertionError(f"no node answered Metadata for {topic}: {last}")

    def brokers(self, via: int) -> set[int]:
        """The node ids node `via` lists in Metadata: the nodes with a live session."""
        resp = call(self.servers[via].port, build(MetadataRequest, {"topics": [], "allow_auto_topic_creation": False},
                                                  9), MetadataResponse, timeout=5)
        return {b.node_id for b in resp.brokers}

    def wait_for_members(self, timeout: float = 60.0) -> None:
        """Until every running node lists exactly the running nodes as live."""
        def agreed() -> bool:
            running = {s.node_id for s in self.running()}
            try:
                return all(self.brokers(n) == running for n in running)
            except (OSError, AssertionError):
                return False

        wait_for(agreed, timeout, interval=0.1, what="every node to see the others' sessions")

    def wait_for_leader(self, topic: str, partition: int, *, excluding: tuple[int, ...] = (),
                        newer_than: int = -1, timeout: float = 30.0) -> PartitionState:
        """Until every running node names one leader (not in `excluding`, epoch above `newer_than`) for the
        partition, and that leader says the same of itself."""
        seen: list[object] = ["nothing yet"]  # the last views, for the timeout's message

        def agreed() -> PartitionState | None:
            try:
                views = {s.node_id: self.metadata(topic, via=s.node_id).get(partition) for s in self.running()}
            except AssertionError as exc:
                seen[0] = exc
                return None
            seen[0] = views
            states = set(views.values())
            if len(states) != 1:
                return None
            (state,) = states
            ok = state is not None and state.leader >= 0 and state.leader not in excluding \
                and state.leader_epoch > newer_than and state.leader in views
            return state if ok else None

        try:
            return wait_for(agreed, timeout, interval=0.1, what=f"one leader of {topic}-{partition}")
        except AssertionError as exc:
            raise AssertionError(f"{exc}; the nodes' last views: {seen[0]}") from None

    def wait_for_isr(self, topic: str, partition: int, isr: tuple[int, ...] | None = None,
                     timeout: float = 60.0) -> PartitionState:
        """Until the leader's Metadata shows the given ISR (default: every replica), in any order."""
        def reached() -> PartitionState | None:
            state = self.wait_for_leader(topic, partition, timeout=timeout)
            want = set(state.replicas if isr is None else isr)
            return state if set(state.isr) == want else None

        return wait_for(reached, timeout, interval=0.2, what=f"the ISR of {topic}-{partition} to be {isr or 'all'}")

    def high_watermark(self, topic: str, partition: int) -> int:
        """ListOffsets latest (the high watermark) from the partition's leader."""
        state = self.wait_for_leader(topic, partition)
        resp = call(self.servers[state.leader].port, build(ListOffsetsRequest, {
            "replica_id": -1, "isolation_level": 0, "topics": [{"name": topic, "partitions": [
                {"partition_index": partition, "current_leader_epoch": -1, "timestamp": -1}]}]}, 4),
            ListOffsetsResponse, timeout=5)
        (p,) = resp.topics[0].partitions
        assert p.error_code == 0, f"ListOffsets of {topic}-{partition} at node {state.leader}: error {p.error_code}"
        return p.offset

    def log_dir_of(self, node_id: int, topic: str, partition: int) -> Path:
        """The `--data-dir` (of the node's one or more) that holds the partition's current log."""
        args = self.servers[node_id].args
        dirs = [Path(args[i + 1]) for i, arg in enumerate(args[:-1]) if arg == "--data-dir"]
        return next((d for d in dirs if (d / f"{topic}-{partition}").is_dir()), dirs[0])

    def batches(self, node_id: int, topic: str, partition: int) -> list[tuple[BatchHeader, bytes]]:
        """The whole batches in a replica's segment files, as stored (in whichever log dir holds them)."""
        return [(BatchHeader.parse(raw), raw)
                for raw, _ in raw_batches(self.log_dir_of(node_id, topic, partition), topic, partition)]

    def wait_identical_below(self, topic: str, partition: int, offset: int, nodes: tuple[int, ...],
                             timeout: float = 60.0) -> bytes:
        """Until each of `nodes` holds the partition's batches below `offset`, then assert that they are the
        same bytes on every one of them (Kafka's invariant: replicas never diverge below the high watermark).
        Returns those bytes."""
        def prefix(node_id: int) -> bytes | None:
            out = []
            for header, raw in self.batches(node_id, topic, partition):
                if header.base_offset >= offset:
                    break
                out.append(raw)
                if header.last_offset >= offset - 1:
                    return b"".join(out)
            return b"" if offset == 0 else None

        copies = wait_for(lambda: (lambda c: c if all(v is not None for v in c.values()) else None)(
            {n: prefix(n) for n in nodes}), timeout, interval=0.2,
            what=f"every replica of {topic}-{partition} to hold offsets below {offset}")
        first = copies[nodes[0]]
        for n in nodes[1:]:
            assert copies[n] == first, (f"{topic}-{partition}: the bytes below offset {offset} differ between "
                                        f"node {nodes[0]} and node {n}")
        return first

    def stop(self) -> None:
        """SIGTERM every node still alive (paused ones are woken first); the exit codes are not checked here."""
        for proxy in self.proxies.values():
            proxy.heal()
        for server in self.servers.values():
            if server.proc is not None and server.proc.poll() is None:
                if server.paused:
                    server.resume()
                try:
                    server.terminate(30)
                except subprocess.TimeoutExpired:
                    server.kill()
        for proxy in self.proxies.values():
            proxy.stop()


@dataclass(frozen=True)
class KubeStoreUrl:
    """`--store kubernetes` for `start_replicated_cluster`: the nodes reach the API server with a kubeconfig."""

    kubeconfig: Path
    url: str = "kubernetes"


def start_replicated_cluster(tmp_path: Path, store, n_nodes: int, *topics: dict, extra: tuple[str, ...] = (),
                             proxies: bool = False, timeout: float = 60.0,
                             node_args: Callable[[ServeProcess], list[str]] | None = None) -> ReplicatedCluster:
    """`n_nodes` `shale serve --store URL` processes (node ids 0..n-1; `store.url`: an etcd of
    tests/support/etcd_util.py, or `KubeStoreUrl`, whose kubeconfig they are given) reading `topics` (manifests, see
    `topic_manifest`; e.g. `replicas=3` or an assignment of replica lists), started, with every partition of
    every topic led by some node before this returns. With `proxies`, each node advertises a fault-injecting
    proxy in front of its listener (tests/support/fault_proxy.py), so that every client and every other node reaches it
    through that proxy (`cluster.proxies[n]`). `node_args(server)` gives arguments of each node's own (e.g. its
    listeners, from `server.port`)."""
    cluster = ReplicatedCluster(tmp_path, store)
    write_manifests(cluster.topics_dir / "topics.yaml", *topics) if topics else cluster.topics_dir.mkdir(
        parents=True, exist_ok=True)
    env = {"KUBECONFIG": str(store.kubeconfig)} if isinstance(store, KubeStoreUrl) else None
    for n in range(n_nodes):
        cluster.servers[n] = ServeProcess(tmp_path / f"data{n}", cluster.topics_dir, "--store", store.url,
                                          *TEST_OVERRIDES, *extra, node_id=n, env=env)
        if node_args is not None:
            cluster.servers[n].args += node_args(cluster.servers[n])
    if proxies:
        from support.fault_proxy import FaultProxy

        for n, server in cluster.servers.items():
            cluster.proxies[n] = FaultProxy(server.port).start()
            server.args += ["--advertised-port", str(cluster.proxies[n].port)]
    try:
        for server in cluster.servers.values():
            server.start()
        cluster.wait_for_members(timeout)
        for doc in topics:
            name = doc["spec"].get("topicName") or doc["metadata"]["name"]
            for p in range(doc["spec"].get("partitions", 1)):
                cluster.wait_for_leader(name, p, timeout=timeout)
    except BaseException:
        cluster.stop()
        raise
    return cluster
