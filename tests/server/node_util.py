"""Run real storage nodes for tests: in a thread of this process, or as a `shale serve` process."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import yaml

from shale.sidecar.server.node import ServeOptions, StorageNode


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def topic_manifest(name: str, partitions: int = 1, config: dict | None = None, **spec) -> dict:
    return {"apiVersion": "shale.dev/v1alpha1", "kind": "Topic", "metadata": {"name": name},
            "spec": {"partitions": partitions, "config": {k: str(v) for k, v in (config or {}).items()}, **spec}}


def write_manifests(path: Path, *topics: dict) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name("." + path.name + ".tmp")
    tmp.write_text(yaml.safe_dump_all(list(topics)))
    os.replace(tmp, path)  # atomically, as an editor or a ConfigMap update does
    return path


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
                 port: int | None = None, http_port: int | None = None) -> None:
        self.data_dir, self.topics = str(data_dir), str(topics)
        self.port = port or free_port()
        self.http_port = http_port or free_port()
        self.args = [sys.executable, "-m", "shale.sidecar.cli", "serve", "--data-dir", self.data_dir,
                     "--topics", self.topics, "--listen", f"127.0.0.1:{self.port}",
                     "--http", f"127.0.0.1:{self.http_port}", "--node-id", str(node_id), *extra]
        self.proc: subprocess.Popen | None = None
        self.log_path = Path(self.data_dir).with_name(Path(self.data_dir).name + f".node{node_id}.log")

    def start(self, timeout: float = 30.0) -> "ServeProcess":
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(self.args, stdout=log, stderr=log)
        log.close()

        def listening() -> bool:
            if self.proc.poll() is not None:
                raise AssertionError(f"shale serve exited with {self.proc.returncode}:\n{self.log()}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.5).close()
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
        self.proc.kill()
        self.proc.wait(10)

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def __enter__(self) -> "ServeProcess":
        return self.start()

    def __exit__(self, *exc) -> None:
        if self.proc is not None and self.proc.poll() is None:
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
