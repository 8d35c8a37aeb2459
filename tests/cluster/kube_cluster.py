"""A whole real Kubernetes cluster on this machine for the tests: etcd, kube-apiserver, kube-controller-manager,
kube-scheduler, and per node containerd, kubelet and kube-proxy, with dnsmasq as cluster DNS.

Everything is v1.20.2 built from Debian's source package (build_kubernetes.sh) or Debian's own packages
(containerd 1.6, runc, the CNI plugins, dnsmasq); the recipe and every flag that mattered are in
../shared/spec/kubernetes.md §7, the network plan in network.py. `KubeCluster.start` brings it up in a
directory of the test session and waits until every node is Ready, the `default` service account exists,
Shale's images are in each node's containerd and the local PersistentVolumes are there; a part that does
not start raises with every component's log tail. `stop` undoes all of it, also what a run that died
left behind (the next start finds it in STATE_FILE): processes, containers and their cgroups, mounts,
network namespaces, the bridge, iptables chains, the host settings the kubelet changed.

Nodes: `node_count=N` runs N kubelets, each with its own containerd, root directory, cgroup root, node IP on the
shared bridge and zone label (`topology.kubernetes.io/zone=zone-<i>`); they share the host's network namespace,
so one kube-proxy (node 0's) programs it. Volumes (`_storage`): StorageClass `local` (the default), bound to one
node; `small`, a tmpfs that fills up; and `shared`, which any node can mount, as network storage.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import datetime
import fcntl
import json
import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import kubernetes
import network
import yaml
from dns_feed import DnsFeed
from pki import CertificateAuthority, Pair

from support.image import Images
from support.kube_apiserver import ApiServer, kubernetes_binary, log_tail

# One cluster on the machine at a time (the bridge, the node IPs and the fixed ports are the machine's).
LOCK_FILE = Path("/run/shale-test-cluster.lock")
# What a running cluster must be undone by, should its test run die before it stops it.
STATE_FILE = Path("/run/shale-test-cluster.json")
APISERVER_PORT = 6443
DOMAIN = "cluster.local"
PAUSE_IMAGE = "shale.local/pause:v1.20.2"
START_TIMEOUT = 120.0
# Where v1.20's kubelet, controller-manager, containerd 1.6 and libcni write whatever they are configured with
# (pod logs, the CNI result cache, device-plugin sockets, shim sockets, flex-volume probes): each one that is
# not there before the start is removed at the end.
HOST_DIRS = ("/var/log/pods", "/var/log/containers", "/var/lib/cni", "/var/lib/kubelet", "/usr/libexec/kubernetes",
             "/run/containerd", "/run/netns")
VOLUMES_PER_NODE = 8
VOLUME_SIZE = "10Gi"
# Volumes that really fill up (a tmpfs each, bound to its node): the journeys' release runs on them, so a full
# log dir is a full filesystem, not a threshold.
SMALL_VOLUMES_PER_NODE = 2
SMALL_VOLUME_MIB = 128


@dataclass
class Node:
    """One kubelet with its containerd and kube-proxy."""

    index: int
    directory: Path
    procs: dict[str, subprocess.Popen] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return f"node-{self.index}"

    @property
    def ip(self) -> str:
        return network.node_ip(self.index)

    @property
    def zone(self) -> str:
        return f"zone-{self.index}"

    @property
    def socket(self) -> Path:
        return self.directory / "containerd" / "containerd.sock"

    @property
    def cgroup_root(self) -> str:
        """Each kubelet's pods live under a cgroup of their own, so that N kubelets do not share `kubepods`."""
        return f"/shale-{self.name}"

    @property
    def volumes(self) -> Path:
        return self.directory / "volumes"

    def ctr(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        result = subprocess.run(["ctr", "--address", str(self.socket), "--namespace", "k8s.io", *args],
                                capture_output=True, text=True, timeout=300)
        if check and result.returncode != 0:
            raise RuntimeError(f"{self.name}: ctr {' '.join(args)} exited {result.returncode}: {result.stderr.strip()}")
        return result


@dataclass
class KubeCluster:
    """The cluster under `directory`; `start()`, then `kubectl`, `helm`, `client()`; `stop()` at the end."""

    directory: Path
    images: Images
    nodes: list[Node] = field(default_factory=list)
    node_count: int = 1
    apiserver: ApiServer | None = None
    ca: CertificateAuthority | None = None
    dns: DnsFeed | None = None
    timings: dict[str, float] = field(default_factory=dict)
    _procs: dict[str, subprocess.Popen] = field(default_factory=dict)
    _lock: Any = None
    _sysctls: dict[str, str] = field(default_factory=dict)
    _created: list[str] = field(default_factory=list)

    @property
    def _cgroup_roots(self) -> list[str]:
        return [n.cgroup_root for n in self.nodes]

    # --- start ---------------------------------------------------------------------------------------------

    def start(self) -> "KubeCluster":
        started = time.monotonic()
        self._lock = open(LOCK_FILE, "w")
        fcntl.flock(self._lock, fcntl.LOCK_EX)
        undo_leftovers()
        self._sysctls = network.read_sysctls()
        self.nodes = [Node(i, self.directory / f"node-{i}") for i in range(self.node_count)]
        self._created = [d for d in HOST_DIRS if not os.path.lexists(d)]
        STATE_FILE.write_text(json.dumps({"directory": str(self.directory), "sysctls": self._sysctls,
                                          "cgroups": self._cgroup_roots, "created": self._created}))
        try:
            self._start()
        except BaseException as exc:
            report = self.logs()
            self.stop()
            if isinstance(exc, Exception):
                raise RuntimeError(f"the test cluster did not start: {exc}\n{report}") from exc
            raise
        self.timings["start to nodes Ready"] = time.monotonic() - started
        return self

    def _start(self) -> None:
        for d in ("logs", "pki", "dns-hosts"):
            (self.directory / d).mkdir(parents=True, exist_ok=True)
        network.create(len(self.nodes))
        network.verify_routes(len(self.nodes))
        network.write_sysctls({"net.ipv4.ip_forward": "1", "net.bridge.bridge-nf-call-iptables": "1"})
        self._pki()
        self.apiserver.start()
        admin = self.apiserver.client()
        self._spawn("kube-controller-manager", self._controller_manager_args())
        self._spawn("kube-scheduler", [
            str(kubernetes_binary("kube-scheduler")), f"--kubeconfig={self._kubeconfig('kube-scheduler')}",
            "--leader-elect=false", "--port=0", f"--bind-address={network.node_ip(0)}"])
        self._spawn("dnsmasq", [
            shutil.which("dnsmasq") or "/usr/sbin/dnsmasq", "--keep-in-foreground", "--no-resolv", "--no-hosts",
            "--conf-file=/dev/null", "--bind-interfaces", f"--listen-address={network.node_ip(0)}",
            "--except-interface=lo", f"--local=/{DOMAIN}/", f"--hostsdir={self.directory / 'dns-hosts'}",
            "--user=root", "--pid-file", "--log-facility=-"])
        self.dns = DnsFeed(self.apiserver.client(), self.directory / "dns-hosts")
        self.dns.start()
        for node in self.nodes:
            self._configure_node(node)
            self._start_containerd(node)
        # The images go into every node's containerd at once (mostly writing: the unpacked layers), then the kubelets.
        _pause_archive(self.directory / "pause.tar", self.directory / "pause-oci")
        with concurrent.futures.ThreadPoolExecutor(len(self.nodes)) as pool:
            list(pool.map(self._import_images, self.nodes))
        for node in self.nodes:
            self._start_kubelet(node)
        self._wait(self._nodes_ready, "every node Ready")
        # The kubelet has written its kernel tunables by now: a kernel oops must not reboot the machine.
        network.write_sysctls({k: v for k, v in self._sysctls.items() if k in network.PANIC_SYSCTLS})
        network.guard_first()
        core = kubernetes.client.CoreV1Api(admin)
        self._wait(lambda: _exists(lambda: core.read_namespaced_service_account("default", "default")),
                   "the controller-manager's `default` service account")
        self._storage()

    def _pki(self) -> None:
        pki = self.directory / "pki"
        ca = CertificateAuthority.create(pki)
        ip0 = network.node_ip(0)
        serving = ca.issue("kube-apiserver", "kube-apiserver", hosts=(
            ip0, "127.0.0.1", network.service_ip(1), "localhost", "kubernetes", "kubernetes.default",
            "kubernetes.default.svc", f"kubernetes.default.svc.{DOMAIN}"))
        kubelet_client = ca.issue("apiserver-kubelet-client", "kube-apiserver-kubelet-client", ("system:masters",))
        self.apiserver = ApiServer(
            self.directory / "apiserver", port=APISERVER_PORT, address=ip0, service_cidr=str(network.SERVICE_CIDR),
            authorization="Node,RBAC", ca=ca.pair.cert, extra_args=(
                f"--tls-cert-file={serving.cert}", f"--tls-private-key-file={serving.key}",
                f"--client-ca-file={ca.pair.cert}", "--enable-admission-plugins=NodeRestriction",
                f"--kubelet-client-certificate={kubelet_client.cert}", f"--kubelet-client-key={kubelet_client.key}",
                f"--kubelet-certificate-authority={ca.pair.cert}", "--kubelet-preferred-address-types=InternalIP",
                "--allow-privileged=true"))
        self.ca = ca
        for user in ("kube-controller-manager", "kube-scheduler", "kube-proxy"):
            self._write_kubeconfig(user, ca.issue(user, f"system:{user}"))
        for node in self.nodes:
            node.directory.mkdir(parents=True, exist_ok=True)
            self._write_kubeconfig(node.name, ca.issue(node.name, f"system:node:{node.name}", ("system:nodes",)))
            ca.issue(f"{node.name}-serving", node.name, hosts=(node.ip, node.name))

    def _kubeconfig(self, user: str) -> Path:
        return self.directory / "pki" / f"{user}.kubeconfig"

    def _write_kubeconfig(self, user: str, pair: Pair) -> None:
        self._kubeconfig(user).write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": "c",
            "clusters": [{"name": "c", "cluster": {"server": f"https://{network.node_ip(0)}:{APISERVER_PORT}",
                                                   "certificate-authority": str(self.ca.pair.cert)}}],
            "users": [{"name": user, "user": {"client-certificate": str(pair.cert), "client-key": str(pair.key)}}],
            "contexts": [{"name": "c", "context": {"cluster": "c", "user": user}}]}))

    def _controller_manager_args(self) -> list[str]:
        apiserver = self.apiserver
        return [str(kubernetes_binary("kube-controller-manager")),
                f"--kubeconfig={self._kubeconfig('kube-controller-manager')}", "--leader-elect=false",
                "--port=0", "--secure-port=0", "--use-service-account-credentials=true",
                f"--service-account-private-key-file={apiserver.workdir / 'sa.key'}",
                f"--root-ca-file={self.ca.pair.cert}", f"--service-cluster-ip-range={network.SERVICE_CIDR}",
                f"--cluster-cidr={network.POD_CIDR}", "--allocate-node-cidrs=false",
                "--controllers=*,-cloud-node-lifecycle,-nodeipam,-route,-service",
                "--node-monitor-grace-period=20s", "--pod-eviction-timeout=30s",
                f"--flex-volume-plugin-dir={self.directory / 'flex-volumes'}"]

    def _configure_node(self, node: Node) -> None:
        d = node.directory
        for sub in ("containerd", "kubelet", "cni", "ipam", "volumes", "volume-plugins"):
            (d / sub).mkdir(parents=True, exist_ok=True)
        (d / "cni" / "10-shale.conflist").write_text(json.dumps(network.cni_config(node.index, d / "ipam")))
        (d / "containerd" / "config.toml").write_text(_containerd_config(d))
        (d / "resolv.conf").write_text(f"nameserver {network.node_ip(0)}\n")
        (d / "kubelet" / "config.yaml").write_text(yaml.safe_dump(self._kubelet_config(node)))
        (d / "kube-proxy.yaml").write_text(yaml.safe_dump({
            "apiVersion": "kubeproxy.config.k8s.io/v1alpha1", "kind": "KubeProxyConfiguration",
            "clientConnection": {"kubeconfig": str(self._kubeconfig("kube-proxy"))},
            "mode": "iptables", "clusterCIDR": str(network.POD_CIDR), "hostnameOverride": node.name,
            "bindAddress": node.ip, "healthzBindAddress": f"{node.ip}:10256", "metricsBindAddress": f"{node.ip}:10249",
            "nodePortAddresses": [f"{node.ip}/32"],
            # kube-proxy leaves the host's conntrack settings alone (0: do not touch).
            "conntrack": {"maxPerCore": 0, "min": 0, "tcpEstablishedTimeout": "0s", "tcpCloseWaitTimeout": "0s"}}))
        for controller in _cgroup_controllers():  # the kubelet wants its cgroup root to exist
            (controller / node.cgroup_root.lstrip("/")).mkdir(exist_ok=True)

    def _start_containerd(self, node: Node) -> None:
        self._spawn(f"{node.name}-containerd",
                    ["containerd", "--config", str(node.directory / "containerd" / "config.toml")], node=node)
        self._wait(lambda: node.ctr("version", check=False).returncode == 0, f"{node.name}'s containerd")

    def _start_kubelet(self, node: Node) -> None:
        """The kubelet and kube-proxy of `node`, from the configuration `_configure_node` wrote."""
        d = node.directory
        self._spawn(f"{node.name}-kubelet", [
            str(kubernetes_binary("kubelet")), f"--config={d / 'kubelet' / 'config.yaml'}",
            f"--kubeconfig={self._kubeconfig(node.name)}", "--container-runtime=remote",
            f"--container-runtime-endpoint=unix://{node.socket}", f"--node-ip={node.ip}",
            f"--hostname-override={node.name}", f"--root-dir={d / 'kubelet'}",
            f"--node-labels=topology.kubernetes.io/zone={node.zone}", "--register-node=true",
            f"--cert-dir={d / 'kubelet' / 'pki'}", f"--volume-plugin-dir={d / 'volume-plugins'}"], node=node)
        if node.index == 0:  # every node shares the host's network namespace: one kube-proxy programs it
            self._spawn(f"{node.name}-kube-proxy", [str(kubernetes_binary("kube-proxy")),
                                                    f"--config={d / 'kube-proxy.yaml'}"], node=node)

    def kill_node(self, node: Node) -> None:
        """The node's power cut, as far as its processes go: the kubelet, kube-proxy, containerd, every shim and
        every container SIGKILLed at once (volumes and the kernel's page cache stay, as on a process crash)."""
        for name, proc in list(node.procs.items()):
            proc.send_signal(signal.SIGKILL)
        for _ in range(50):
            if not _kill_cgroups([node.cgroup_root]):
                break
            time.sleep(0.1)
        for pid, cmdline in _processes():
            if "containerd-shim" in cmdline and str(node.socket) in cmdline:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        for name, proc in list(node.procs.items()):
            _kill(proc)
            del self._procs[name], node.procs[name]

    def restart_node(self, node: Node) -> None:
        """`kill_node`, then its containerd, kubelet and kube-proxy started again on the same state; until the
        node is Ready again."""
        self.kill_node(node)
        restarted = datetime.datetime.now(datetime.timezone.utc)
        self._start_containerd(node)
        self._start_kubelet(node)
        self._wait(lambda: self._nodes_ready(since=restarted), f"{node.name} Ready again")
        network.write_sysctls({k: v for k, v in self._sysctls.items() if k in network.PANIC_SYSCTLS})
        network.guard_first()

    def _kubelet_config(self, node: Node) -> dict[str, Any]:
        pki = self.directory / "pki"
        return {
            "apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration",
            "address": node.ip, "port": 10250, "readOnlyPort": 0, "healthzPort": 0,
            "tlsCertFile": str(pki / f"{node.name}-serving.crt"), "tlsPrivateKeyFile": str(pki / f"{node.name}-serving.key"),
            "authentication": {"anonymous": {"enabled": False}, "webhook": {"enabled": True},
                               "x509": {"clientCAFile": str(self.ca.pair.cert)}},
            "authorization": {"mode": "Webhook"},
            "cgroupDriver": "cgroupfs", "cgroupsPerQOS": True, "cgroupRoot": node.cgroup_root,
            "enforceNodeAllocatable": ["pods"], "failSwapOn": False, "protectKernelDefaults": False,
            "clusterDNS": [network.node_ip(0)], "clusterDomain": DOMAIN,
            "resolvConf": str(node.directory / "resolv.conf"),
            # This machine's disk is shared with everything else: evict on nothing but a nearly full disk.
            "evictionHard": {"memory.available": "100Mi", "nodefs.available": "1%", "imagefs.available": "1%",
                             "nodefs.inodesFree": "1%"},
            "imageGCHighThresholdPercent": 100, "imageGCLowThresholdPercent": 99,
            "serializeImagePulls": False, "syncFrequency": "10s", "fileCheckFrequency": "10s",
            "nodeStatusUpdateFrequency": "4s", "maxPods": 60,
        }

    def _import_images(self, node: Node) -> None:
        """The pause image (built here from the static binary), Shale's and the client's, into `k8s.io`."""
        pause = self.directory / "pause.tar"
        started = time.monotonic()
        for archive in (pause, self.images.shale_archive, self.images.client_archive):
            node.ctr("images", "import", str(archive))
        self.timings[f"{node.name}: images imported"] = time.monotonic() - started

    def _storage(self) -> None:
        """Three StorageClasses of `local` PersistentVolumes: `local` (the default), each volume in one node's
        directory and bound to that node, as a disk in the machine; `small`, the same on a tmpfs of
        SMALL_VOLUME_MIB, a disk that fills up; and `shared`, each volume in the cluster's directory and
        mountable on every node, as network storage (a pod that moves takes its data along)."""
        objs: list[dict[str, Any]] = [
            {"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
             "metadata": {"name": name, "annotations": {"storageclass.kubernetes.io/is-default-class": default}},
             "provisioner": "kubernetes.io/no-provisioner", "volumeBindingMode": "WaitForFirstConsumer",
             "reclaimPolicy": "Retain"} for name, default in (("local", "true"), ("small", "false"), ("shared", "false"))]
        every_node = [n.name for n in self.nodes]
        volumes = [(f"{n.name}-pv-{i}", "local", n.volumes / f"pv-{i}", [n.name], VOLUME_SIZE)
                   for n in self.nodes for i in range(VOLUMES_PER_NODE)]
        volumes += [(f"{n.name}-small-pv-{i}", "small", n.volumes / f"small-pv-{i}", [n.name], f"{SMALL_VOLUME_MIB}Mi")
                    for n in self.nodes for i in range(SMALL_VOLUMES_PER_NODE)]
        volumes += [(f"shared-pv-{i}", "shared", self.directory / "shared-volumes" / f"pv-{i}", every_node, VOLUME_SIZE)
                    for i in range(VOLUMES_PER_NODE)]
        for name, storage_class, path, hosts, size in volumes:
            path.mkdir(parents=True, exist_ok=True)
            if storage_class == "small":  # unmounted by stop(), as every mount under the cluster's directory
                subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={SMALL_VOLUME_MIB}m,mode=0755", "tmpfs", str(path)],
                               check=True, capture_output=True)
            objs.append({
                "apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": name},
                "spec": {"capacity": {"storage": size}, "accessModes": ["ReadWriteOnce"],
                         "persistentVolumeReclaimPolicy": "Retain", "storageClassName": storage_class,
                         "local": {"path": str(path)},
                         "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [{
                             "key": "kubernetes.io/hostname", "operator": "In", "values": hosts}]}]}}}})
        self.apply(objs)

    # --- using it ------------------------------------------------------------------------------------------

    @property
    def kubeconfig(self) -> Path:
        path = self.directory / "admin.kubeconfig"
        if not path.exists():
            self.apiserver.write_kubeconfig(path)
        return path

    def client(self) -> kubernetes.client.ApiClient:
        return self.apiserver.client()

    def kubectl_argv(self) -> list[str]:
        """kubectl 1.20 (build_kubernetes.sh's; the machine's may be newer) with the administrator's config."""
        return [str(kubernetes_binary("kubectl")), f"--kubeconfig={self.kubeconfig}"]

    def kubectl(self, *args: str, check: bool = True, timeout: float = 120, **kw) -> subprocess.CompletedProcess:
        result = subprocess.run([*self.kubectl_argv(), *args], capture_output=True, text=True, timeout=timeout, **kw)
        if check and result.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} exited {result.returncode}: {result.stderr}")
        return result

    def apply(self, objs: list[dict[str, Any]]) -> None:
        self.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(objs))

    def logs(self) -> str:
        """Every component's log tail (what a failed start or a failed journey prints)."""
        parts = [f"--- {p.stem} ---\n{log_tail(p)}" for p in sorted((self.directory / "logs").glob("*.log"))]
        if self.apiserver is not None:
            parts += [f"--- {n} ---\n{log_tail(self.apiserver.workdir / f'{n}.log')}" for n in ("etcd", "kube-apiserver")]
        return "\n".join(parts)

    def resident_memory(self) -> dict[str, int]:
        """RSS in MiB of each component now, and of the node's pods together (their cgroups' processes)."""
        procs = dict(self._procs)
        if self.apiserver is not None:
            procs.update({"etcd": self.apiserver._etcd, "kube-apiserver": self.apiserver._apiserver})
        found = {name: _rss([proc.pid]) for name, proc in procs.items() if proc is not None and proc.poll() is None}
        for node in self.nodes:
            pids: set[int] = set()
            for path in _cgroup_tree(_cgroup_controllers()[0] / node.cgroup_root.lstrip("/")):
                with contextlib.suppress(OSError):
                    pids.update(int(p) for p in (path / "cgroup.procs").read_text().split())
            found[f"{node.name} pods"] = _rss(pids)
            found[f"{node.name} shims"] = _rss(pid for pid, cmd in _processes()
                                               if "containerd-shim" in cmd and str(node.socket) in cmd)
        return found

    # --- processes -----------------------------------------------------------------------------------------

    def _spawn(self, name: str, argv: list[str], node: Node | None = None) -> subprocess.Popen:
        log = open(self.directory / "logs" / f"{name}.log", "ab")
        try:
            proc = subprocess.Popen(["setpriv", "--pdeathsig", "KILL", "--", *argv], stdout=log,
                                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        finally:
            log.close()
        self._procs[name] = proc
        if node is not None:
            node.procs[name] = proc
        return proc

    def _wait(self, ready, what: str, timeout: float = START_TIMEOUT) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for name, proc in self._procs.items():
                if proc.poll() is not None:
                    raise RuntimeError(f"{name} exited with {proc.returncode} while waiting for {what}")
            if ready():
                return
            time.sleep(0.25)
        raise RuntimeError(f"timed out after {timeout:.0f}s waiting for {what}")

    def _nodes_ready(self, since: datetime.datetime | None = None) -> bool:
        """Every node registered and Ready, by a status its kubelet posted after `since` when given."""
        core = kubernetes.client.CoreV1Api(self.apiserver.client())
        try:
            nodes = {n.metadata.name: n for n in core.list_node().items}
        except (kubernetes.client.ApiException, OSError):
            return False
        if len(nodes) != len(self.nodes) or any(n.name not in nodes for n in self.nodes):
            return False
        ready = [next((c for c in nodes[n.name].status.conditions or () if c.type == "Ready"), None) for n in self.nodes]
        return all(c is not None and c.status == "True" and (since is None or c.last_heartbeat_time > since)
                   for c in ready)

    # --- stop ----------------------------------------------------------------------------------------------

    def stop(self) -> None:
        """Everything down and undone; then what is left (nothing, or an AssertionError naming it)."""
        if self.dns is not None:
            self.dns.stop()
        for name in [n for n in self._procs if "kubelet" in n or "kube-proxy" in n]:
            _kill(self._procs.pop(name))
        _undo(self.directory, self._cgroup_roots, self._created, self._procs.values())
        if self.apiserver is not None:
            self.apiserver.stop()
        if self._sysctls:
            network.write_sysctls(self._sysctls)
        STATE_FILE.unlink(missing_ok=True)
        if self._lock is not None:
            self._lock.close()
            self._lock = None
        left = leftovers(self.directory, self._cgroup_roots, self._created)
        if left:
            raise AssertionError(f"the test cluster left behind: {left}")


def undo_leftovers() -> None:
    """What a cluster whose test run died left behind (STATE_FILE), undone before a new one starts."""
    if not STATE_FILE.exists():
        return
    state = json.loads(STATE_FILE.read_text())
    _undo(Path(state["directory"]), state.get("cgroups", []), state.get("created", []), ())
    network.write_sysctls(state.get("sysctls", {}))
    STATE_FILE.unlink()


def _undo(directory: Path, cgroup_roots: list[str], created: list[str], procs) -> None:
    """Kill the pods' processes (by their cgroups), the shims and the rest of `procs`; unmount everything under
    `directory` and the CNI network namespaces; remove the network, the cgroups and the host directories the
    cluster `created`."""
    for _ in range(50):
        if not _kill_cgroups(cgroup_roots):
            break
        time.sleep(0.1)
    socket_dir = str(directory)
    for pid, cmdline in _processes():
        # containerd's shims re-parent themselves to init: found by the containerd address they serve
        if ("containerd-shim" in cmdline or "dnsmasq" in cmdline or "kubelet" in cmdline) and socket_dir in cmdline:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    for proc in list(procs):
        _kill(proc)
    for mount in sorted(_mounts(), reverse=True):
        if mount.startswith(socket_dir + "/") or mount.startswith("/run/netns/cni-") or \
                mount.startswith("/run/containerd/"):
            subprocess.run(["umount", "-l", mount], capture_output=True)
    for netns in Path("/run/netns").glob("cni-*") if Path("/run/netns").exists() else ():
        netns.unlink(missing_ok=True)
    for path in created:
        shutil.rmtree(path, ignore_errors=True)
    network.remove()
    for root in cgroup_roots:
        for controller in _cgroup_controllers():
            for path in _cgroup_tree(controller / root.lstrip("/")):
                with contextlib.suppress(OSError):
                    path.rmdir()


def _kill_cgroups(roots: list[str]) -> int:
    """SIGKILL every process in the cgroups under `roots`; how many there were."""
    pids: set[int] = set()
    for root in roots:
        for controller in _cgroup_controllers():
            for path in _cgroup_tree(controller / root.lstrip("/")):
                with contextlib.suppress(OSError):
                    pids.update(int(p) for p in (path / "cgroup.procs").read_text().split())
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return len(pids)


def _cgroup_tree(base: Path) -> list[Path]:
    """`base` and the cgroups below it, deepest first; cgroups that vanish while it looks are left out."""
    return [Path(d) for d, _, _ in os.walk(base, topdown=False)]


def _cgroup_controllers() -> list[Path]:
    """The cgroup v1 hierarchies the kubelet creates its pods' cgroups in (one per mounted controller, and the
    named `systemd` one, which the kubelet also requires its cgroup root in)."""
    return [Path(line.split()[1]) for line in Path("/proc/self/mounts").read_text().splitlines()
            if line.split()[2] == "cgroup"]


def _mounts() -> list[str]:
    return [line.split()[4].replace("\\040", " ") for line in Path("/proc/self/mountinfo").read_text().splitlines()]


def _processes() -> Iterator[tuple[int, str]]:
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                yield int(entry.name), (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")


def leftovers(directory: Path, cgroup_roots: list[str], created: list[str]) -> list[str]:
    """Whatever of a stopped cluster is still on the machine: processes, mounts, cgroups, host directories,
    routes, links, chains."""
    found = [f"process {pid}: {cmd[:120]}" for pid, cmd in _processes()
             if str(directory) in cmd and Path(f"/proc/{pid}/status").read_text().find("State:\tZ") < 0]
    found += [f"mount {m}" for m in _mounts() if m.startswith(str(directory) + "/") or m.startswith("/run/netns/cni-")]
    found += [f"cgroup {c / r.lstrip('/')}" for r in cgroup_roots for c in _cgroup_controllers()
              if (c / r.lstrip("/")).exists()]
    found += [f"directory {d}" for d in created if os.path.lexists(d)]
    return found + network.leftovers()


def _rss(pids) -> int:
    """The resident memory of `pids` together, MiB."""
    total = 0
    for pid in pids:
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
    return total // 1024


def _kill(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.kill()
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(10)


def _exists(read) -> bool:
    try:
        read()
        return True
    except kubernetes.client.ApiException:
        return False


def _containerd_config(d: Path) -> str:
    c = d / "containerd"
    return f"""version = 2
root = "{c / 'root'}"
state = "{c / 'state'}"
# Plugins that would write outside the node's directory (/opt/containerd) or need hardware this has none of.
disabled_plugins = ["io.containerd.internal.v1.opt", "io.containerd.snapshotter.v1.aufs",
  "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.zfs",
  "io.containerd.tracing.processor.v1.otlp"]
[grpc]
  address = "{c / 'containerd.sock'}"
[ttrpc]
  address = "{c / 'containerd.sock.ttrpc'}"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{PAUSE_IMAGE}"
  # This VM refuses a negative oom_score_adj even to root; CRI's -998 for sandboxes would kill every pod.
  restrict_oom_score_adj = true
  disable_apparmor = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        Root = "{c / 'runc'}"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "{d / 'cni'}"
"""


def _pause_archive(archive: Path, layout: Path) -> None:
    """The pod sandbox image: upstream's static pause binary alone (no registry serves k8s.gcr.io/pause here)."""
    staging = layout.with_name("pause-root")
    staging.mkdir(parents=True, exist_ok=True)
    shutil.copy(kubernetes_binary("pause"), staging / "pause")
    for args in (("init", "--layout", str(layout)), ("new", "--image", f"{layout}:pause"),
                 ("insert", "--image", f"{layout}:pause", str(staging / "pause"), "/pause"),
                 ("config", "--image", f"{layout}:pause", "--config.entrypoint=/pause", "--config.user=65535:65535")):
        subprocess.run(["umoci", *args], check=True, capture_output=True)
    subprocess.run(["skopeo", "copy", "--quiet", f"oci:{layout}:pause", f"docker-archive:{archive}:{PAUSE_IMAGE}"],
                   check=True, capture_output=True)
