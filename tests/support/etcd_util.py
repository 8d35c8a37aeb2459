"""A real etcd for the replication tests: one member on free loopback ports, in a directory of the test's.

Heartbeat 25 ms and election timeout 250 ms make etcd's minimum lease TTL (1.5 election timeouts, rounded up
to whole seconds) one second, so sessions of `broker.session.timeout.ms=1000` are what etcd grants rather than
silently stretched to its default minimum of two seconds. `stop`/`start` keep the ports and the data
directory (clients reconnect to the same store, its leases survive as etcd's do); `sigstop`/`sigcont`
freeze it as an overloaded or partitioned store would look (connections accepted by the kernel, no answers);
`kill` is a crash. A first start whose probed port was taken meanwhile (free_port's race with other
processes) retries on new ports. What cannot start raises with the log's tail: a test that needs etcd
fails, never skips.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from support import stop_util
from support.node_util import free_port

START_TIMEOUT = 30.0
HEARTBEAT_MS = 25
ELECTION_TIMEOUT_MS = 250


class PortTaken(RuntimeError):
    """etcd could not bind its client or peer port."""


@dataclass
class EtcdServer:
    """One etcd member under `workdir`; `endpoint` for clients, `url` for `shale serve --store`."""

    workdir: Path
    port: int = field(default_factory=free_port)
    peer_port: int = field(default_factory=free_port)
    proc: subprocess.Popen | None = field(default=None, init=False)
    _log_start: int = field(default=0, init=False)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        return f"etcd://127.0.0.1:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.workdir / "etcd.log"

    def start(self) -> "EtcdServer":
        """Start (or restart on the same data and ports) and wait until it serves requests."""
        if self.proc is not None and self.proc.poll() is None:
            raise RuntimeError(f"etcd on port {self.port} is already running (pid {self.proc.pid})")
        first_start = not (self.workdir / "data").exists()
        attempts = 1
        while True:
            try:
                return self._start_once()
            except PortTaken:
                if not first_start or attempts == 3:  # a restart keeps its ports: clients hold the address
                    raise
                # free_port()'s port was taken by another process between the probe and etcd's bind.
                attempts += 1
                self.port, self.peer_port = free_port(), free_port()

    def _start_once(self) -> "EtcdServer":
        binary = shutil.which("etcd")
        if binary is None:
            raise RuntimeError("etcd is not installed: apt-get install etcd-server (Debian's etcd 3.4)")
        self.workdir.mkdir(parents=True, exist_ok=True)
        client, peer = self.endpoint, f"http://127.0.0.1:{self.peer_port}"
        argv = [binary, "--name", "shale-test", "--data-dir", str(self.workdir / "data"),
                "--listen-client-urls", client, "--advertise-client-urls", client,
                "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
                "--initial-cluster", f"shale-test={peer}",
                f"--heartbeat-interval={HEARTBEAT_MS}", f"--election-timeout={ELECTION_TIMEOUT_MS}"]
        if shutil.which("setpriv"):  # killed with the test process, however it ends
            argv = ["setpriv", "--pdeathsig", "KILL", "--", *argv]
        with open(self.log_path, "ab") as log:
            self._log_start = log.tell()  # this run's lines start here
            self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        self.wait_ready()
        return self

    def wait_ready(self) -> None:
        """Until /health says the member has a leader and serves (a restarted member elects itself first)."""
        deadline, last = time.monotonic() + START_TIMEOUT, ""
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                tail, self.proc = self.log_tail(), None
                error = PortTaken if "address already in use" in tail else RuntimeError
                raise error(f"etcd exited:\n{tail}")
            try:
                with urllib.request.urlopen(f"{self.endpoint}/health", timeout=2) as response:
                    body = response.read()
                    if b'"true"' in body:
                        return
                    last = body.decode(errors="replace")
            except (OSError, urllib.error.URLError) as exc:
                last = str(exc)
            time.sleep(0.05)
        raise RuntimeError(f"etcd on port {self.port} not ready after {START_TIMEOUT}s ({last}):\n{self.log_tail()}")

    def stop(self) -> None:
        """SIGTERM and wait: a clean shutdown; `start()` brings back the same data."""
        self._signal_and_wait(signal.SIGTERM)

    def kill(self) -> None:
        """SIGKILL and wait: a crash; `start()` recovers from the WAL."""
        self._signal_and_wait(signal.SIGKILL)

    def sigstop(self) -> None:
        """Freeze the process: connections are accepted by the kernel but nothing answers."""
        assert self.proc is not None and self.proc.poll() is None, "etcd is not running"
        stop_util.sigstop(self.proc.pid)

    def sigcont(self) -> None:
        assert self.proc is not None and self.proc.poll() is None, "etcd is not running"
        self.proc.send_signal(signal.SIGCONT)

    def log_tail(self, lines: int = 30) -> str:
        """The last lines the current (or last) run wrote."""
        try:
            with open(self.log_path, "rb") as log:
                log.seek(self._log_start)
                return "\n".join(log.read().decode(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def _signal_and_wait(self, sig: signal.Signals) -> None:
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGCONT)  # a frozen etcd cannot act on SIGTERM
        proc.send_signal(sig)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
