"""A real Kubernetes API server for the tests: etcd and kube-apiserver v1.20.2 on free loopback ports.

kube-apiserver is built once from Debian's `kubernetes` source package by tests/cluster/build_kubernetes.sh
(`make test` runs it) and cached outside the work tree; etcd is Debian's etcd-server. `ApiServer`
generates the service-account signing key (openssl), a token file (an administrator in
`system:masters`; every other user the tests need is a real service account whose token comes from
the TokenRequest API, so RBAC sees exactly what it sees in a cluster), starts etcd, then the API server
with RBAC on, and waits for `/readyz`. `kill_apiserver`/`start_apiserver` and `restart_etcd` keep the
ports, data and keys, so clients reconnect to the same server. What cannot start raises with the log's
tail: a test that needs the server fails, never skips.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import kubernetes
import yaml

from support.node_util import free_port

VERSION = "v1.20.2"
BUILD_SCRIPT = Path(__file__).resolve().parents[1] / "cluster" / "build_kubernetes.sh"
ADMIN = "shale-test-admin"
START_TIMEOUT = 60.0


def cache_dir() -> Path:
    """Where the slow builds are cached, outside the work tree ($SHALE_APISERVER_CACHE, else ~/.cache/shale)."""
    return Path(os.environ.get("SHALE_APISERVER_CACHE") or
                os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "shale"))


def cached_binary(name: str, version: str) -> Path:
    """Where fetch_helm.sh caches a binary (keyed by version, outside the tree)."""
    return cache_dir() / f"{name}-{version}" / name


def kubernetes_binary(name: str) -> Path:
    """One of the binaries build_kubernetes.sh caches: kube-apiserver, kubelet, kubectl, pause, …"""
    return cache_dir() / f"kubernetes-{VERSION}" / name


def apiserver_binary() -> Path:
    return kubernetes_binary("kube-apiserver")


def log_tail(path: Path, lines: int = 30) -> str:
    """The last `lines` of a component's log, for the error that says why it did not start."""
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


@dataclass
class ApiServer:
    """etcd + kube-apiserver under `workdir`; `url` and `admin_token` once started."""

    workdir: Path
    etcd_port: int = field(default_factory=free_port)
    peer_port: int = field(default_factory=free_port)
    port: int = field(default_factory=free_port)
    admin_token: str = field(default_factory=lambda: secrets.token_hex(16))
    # The address it binds and advertises (the `kubernetes` Service's endpoint): a node's IP in a real cluster.
    address: str = "127.0.0.1"
    service_cidr: str = "10.0.0.0/24"
    authorization: str = "RBAC"
    # The CA of its serving certificate when given by `extra_args` (--tls-cert-file); else the one it generates.
    ca: Path | None = None
    extra_args: tuple[str, ...] = ()
    _etcd: subprocess.Popen | None = field(default=None, init=False)
    _apiserver: subprocess.Popen | None = field(default=None, init=False)

    @property
    def url(self) -> str:
        return f"https://{self.address}:{self.port}"

    @property
    def audit_log(self) -> Path:
        return self.workdir / "audit.log"

    @property
    def ca_file(self) -> Path:
        """The serving certificate kube-apiserver generates with its CA (the file holds both), or `ca`."""
        return self.ca or self.workdir / "certs" / "apiserver.crt"

    def start(self) -> "ApiServer":
        binary, etcd = apiserver_binary(), shutil.which("etcd")
        if not binary.exists() or etcd is None:
            raise RuntimeError(f"kube-apiserver ({binary}) or etcd missing: run {BUILD_SCRIPT} (`make test` does); "
                               "a cold build takes ~3.5 min on 2 cores")
        self.workdir.mkdir(parents=True, exist_ok=True)
        key, pub = self.workdir / "sa.key", self.workdir / "sa.pub"
        if not key.exists():  # the service-account signing key pair
            subprocess.run(["openssl", "genrsa", "-out", key, "2048"], check=True, capture_output=True)
            subprocess.run(["openssl", "rsa", "-in", key, "-pubout", "-out", pub], check=True, capture_output=True)
        # Every request's outcome (user, verb, resource, status code) at the Metadata level: the tests read
        # the operator's refusals from it (`responses`).
        (self.workdir / "audit-policy.yaml").write_text(yaml.safe_dump({
            "apiVersion": "audit.k8s.io/v1", "kind": "Policy", "omitStages": ["RequestReceived"],
            "rules": [{"level": "Metadata"}]}))
        (self.workdir / "tokens.csv").write_text(f'{self.admin_token},{ADMIN},{ADMIN},"system:masters"\n')
        self.start_etcd()
        self.start_apiserver()
        return self

    def start_etcd(self) -> None:
        client, peer = f"http://127.0.0.1:{self.etcd_port}", f"http://127.0.0.1:{self.peer_port}"
        self._etcd = self._spawn("etcd", [
            shutil.which("etcd") or "etcd", "--name", "default", "--data-dir", str(self.workdir / "etcd"),
            "--listen-client-urls", client, "--advertise-client-urls", client, "--listen-peer-urls", peer,
            "--initial-advertise-peer-urls", peer, "--initial-cluster", f"default={peer}"])

    def start_apiserver(self) -> None:
        d = self.workdir
        self._apiserver = self._spawn("kube-apiserver", [
            str(apiserver_binary()), f"--etcd-servers=http://127.0.0.1:{self.etcd_port}",
            f"--bind-address={self.address}", f"--advertise-address={self.address}", f"--secure-port={self.port}",
            "--insecure-port=0", f"--cert-dir={d / 'certs'}", f"--service-cluster-ip-range={self.service_cidr}",
            "--service-account-issuer=https://kubernetes.default.svc", f"--service-account-key-file={d / 'sa.pub'}",
            f"--service-account-signing-key-file={d / 'sa.key'}", f"--token-auth-file={d / 'tokens.csv'}",
            f"--authorization-mode={self.authorization}", f"--audit-policy-file={d / 'audit-policy.yaml'}",
            f"--audit-log-path={self.audit_log}", "--audit-log-format=json", *self.extra_args])
        self.wait_ready()

    def _spawn(self, name: str, argv: list[str]) -> subprocess.Popen:
        # Killed with the test process, however it ends: no 400 MB API server outlives an interrupted run.
        if shutil.which("setpriv"):
            argv = ["setpriv", "--pdeathsig", "KILL", "--", *argv]
        log = open(self.workdir / f"{name}.log", "ab")
        try:
            return subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        finally:
            log.close()

    def wait_ready(self) -> None:
        """Until /readyz answers ok (etcd reached, the RBAC bootstrap roles written)."""
        context = ssl.create_default_context(cafile=None)
        context.check_hostname, context.verify_mode = False, ssl.CERT_NONE  # the certificate may not exist yet
        request = urllib.request.Request(f"{self.url}/readyz", headers={"Authorization": f"Bearer {self.admin_token}"})
        deadline, last = time.monotonic() + START_TIMEOUT, ""
        while time.monotonic() < deadline:
            for name, proc in (("etcd", self._etcd), ("kube-apiserver", self._apiserver)):
                if proc is not None and proc.poll() is not None:
                    raise RuntimeError(f"{name} exited with {proc.returncode}:\n{log_tail(self.workdir / f'{name}.log')}")
            try:
                with urllib.request.urlopen(request, timeout=5, context=context) as response:
                    if response.read() == b"ok":
                        return
            except (OSError, urllib.error.URLError) as exc:
                last = str(exc)
            time.sleep(0.2)
        raise RuntimeError(f"kube-apiserver not ready after {START_TIMEOUT}s ({last}):\n"
                           f"{log_tail(self.workdir / 'kube-apiserver.log')}")

    def kill_apiserver(self) -> None:
        """SIGKILL, as a crashed or evicted API server: open watches break without a goodbye."""
        _kill(self._apiserver, signal.SIGKILL)

    def restart_etcd(self) -> None:
        """etcd SIGKILLed and started again on the same data directory and ports."""
        _kill(self._etcd, signal.SIGKILL)
        self.start_etcd()

    def stop(self) -> None:
        _kill(self._apiserver, signal.SIGTERM)
        _kill(self._etcd, signal.SIGTERM)

    # Clients.
    def client(self, token: str | None = None) -> kubernetes.client.ApiClient:
        """A `kubernetes` client logged in with `token` (default: the administrator's)."""
        configuration = kubernetes.client.Configuration()
        configuration.host = self.url
        configuration.ssl_ca_cert = str(self.ca_file)
        configuration.api_key = {"authorization": f"Bearer {token or self.admin_token}"}
        return kubernetes.client.ApiClient(configuration)

    def write_kubeconfig(self, path: Path, token: str | None = None, namespace: str | None = None) -> Path:
        """A kubeconfig as `kubectl config` writes it, for `token` (default: the administrator's), its context in
        `namespace` when given (`kubectl config set-context --namespace`)."""
        context = {"cluster": "test", "user": "test", **({"namespace": namespace} if namespace else {})}
        path.write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": "test",
            "clusters": [{"name": "test", "cluster": {"server": self.url, "certificate-authority": str(self.ca_file)}}],
            "users": [{"name": "test", "user": {"token": token or self.admin_token}}],
            "contexts": [{"name": "test", "context": context}],
        }))
        return path

    def responses(self, user: str) -> list[dict]:
        """The audit log's completed requests of `user`: verb, objectRef, responseStatus.code, requestURI."""
        events = []
        with open(self.audit_log) as log:
            for line in log:
                event = json.loads(line)
                if event.get("stage") == "ResponseComplete" and event["user"]["username"] == user:
                    events.append(event)
        return events

    def service_account_token(self, namespace: str, name: str) -> str:
        """A bound token of service account `namespace/name` (TokenRequest), as the kubelet mounts into a pod."""
        request = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                   "spec": {"expirationSeconds": 3600}}
        api = kubernetes.client.CoreV1Api(self.client())
        return api.create_namespaced_service_account_token(name, namespace, request).status.token


def _kill(proc: subprocess.Popen | None, sig: int) -> None:
    if proc is None or proc.poll() is not None:
        return
    proc.send_signal(sig)
    try:
        proc.wait(20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)
