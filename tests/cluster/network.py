"""The test cluster's network: one bridge with no uplink, addresses only in 198.18.0.0/15, nothing masqueraded.

The workplace's rule (DEVELOPERS.md, "The network rule") allows test traffic to loopback and to pods and
services in network namespaces of this machine, never elsewhere. The plan (../shared/spec/kubernetes.md
§7.3), each part a guard of its own:
- every address of the cluster is in 198.18.0.0/15 (RFC 2544's benchmarking range), which must not
  overlap any address or route the machine has (`check_free`, before anything is created);
- the whole range is `unreachable` on the host, and only its cluster parts are routed onto the bridge:
  pods 198.18.0.0/17 (node i: 198.18.i.0/24, its gateway 198.18.i.1 on the bridge), Services
  198.18.128.0/24, node IPs 198.18.255.(1+i)/32 — so a ClusterIP that kube-proxy has not translated yet
  dies on the host instead of following the default route;
- pods get no default route (their CNI routes are the three cluster ranges) and no masquerade;
- FORWARD drops whatever would cross between the bridge and any other interface (SHALE-K8S-GUARD);
- `verify_routes` asks the kernel (`ip route get`) before the first pod starts.
Everything here is undone by `remove` (idempotent: also after a run that died).
"""

from __future__ import annotations

import ipaddress
import json
import shlex
import subprocess
from dataclasses import dataclass
from pathlib import Path

RANGE = ipaddress.ip_network("198.18.0.0/15")
POD_CIDR = ipaddress.ip_network("198.18.0.0/17")
SERVICE_CIDR = ipaddress.ip_network("198.18.128.0/24")
NODE_IPS = ipaddress.ip_network("198.18.255.0/24")
BRIDGE = "shale-k8s0"
GUARD = "SHALE-K8S-GUARD"
# Host settings the cluster changes (kubelet's kernel tunables, kube-proxy's route_localnet, forwarding for
# pod -> ClusterIP -> pod): saved before the start and written back at the end.
SYSCTLS = ("net.ipv4.ip_forward", "net.bridge.bridge-nf-call-iptables", "net.ipv4.conf.all.route_localnet",
           "vm.overcommit_memory", "vm.panic_on_oom", "kernel.panic", "kernel.panic_on_oops",
           "kernel.keys.root_maxkeys", "kernel.keys.root_maxbytes")
# Of those, the ones that turn a kernel oops into a reboot: written back as soon as the kubelet has set them.
PANIC_SYSCTLS = ("kernel.panic", "kernel.panic_on_oops", "vm.panic_on_oom")


def node_ip(index: int) -> str:
    return str(NODE_IPS[1 + index])


def node_subnet(index: int) -> ipaddress.IPv4Network:
    return ipaddress.ip_network(f"198.18.{index}.0/24")


def service_ip(offset: int) -> str:
    """The `offset`-th address of the Service range (1: the `kubernetes` Service's)."""
    return str(SERVICE_CIDR[offset])


def cni_config(index: int, ipam_dir: Path) -> dict:
    """The bridge CNI network of node `index`: its /24, hairpin for Service traffic back to the same pod,
    and routes only to the cluster's ranges, through the gateway `create` put on the bridge (isGateway would
    have the plugin set the bridge's address itself, and it refuses a bridge that has others: the node IPs)."""
    subnet = node_subnet(index)
    return {
        "cniVersion": "0.4.0", "name": "shale-test",
        "plugins": [{
            "type": "bridge", "bridge": BRIDGE, "isGateway": False, "isDefaultGateway": False, "ipMasq": False,
            "hairpinMode": True,
            "ipam": {"type": "host-local", "dataDir": str(ipam_dir),
                     "ranges": [[{"subnet": str(subnet), "gateway": str(subnet[1])}]],
                     "routes": [{"dst": str(POD_CIDR)}, {"dst": str(SERVICE_CIDR)}, {"dst": str(NODE_IPS)}]},
        }, {"type": "portmap", "capabilities": {"portMappings": True}}],
    }


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check)


def check_free() -> None:
    """Refuse to start when any address or route of the machine (outside this bridge) overlaps the range."""
    for family in ("addr", "route"):
        for entry in json.loads(_ip("-j", family, "show").stdout or "[]"):
            if entry.get("ifname") == BRIDGE or entry.get("dev") == BRIDGE:
                continue
            prefixes = [f"{a['local']}/{a['prefixlen']}" for a in entry.get("addr_info", ())
                        if a.get("family") == "inet"] if family == "addr" else [entry.get("dst", "")]
            for prefix in prefixes:
                try:
                    network = ipaddress.ip_network(prefix, strict=False)
                except ValueError:  # "default", or an IPv6 route
                    continue
                if network.version == 4 and network.overlaps(RANGE) and entry.get("type") != "unreachable":
                    raise RuntimeError(f"the machine already uses {network} ({family}: {entry}); the test "
                                       f"cluster needs {RANGE} to itself")


def iptables(*args: str, table: str = "filter", check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["iptables", "-w", "-t", table, *args], capture_output=True, text=True, check=check)


def create(nodes: int) -> None:
    """The bridge, its addresses and routes, the unreachable range and the forwarding guard."""
    check_free()
    _ip("link", "add", BRIDGE, "type", "bridge")
    for index in range(nodes):
        _ip("addr", "add", f"{node_ip(index)}/32", "dev", BRIDGE)
        subnet = node_subnet(index)
        _ip("addr", "add", f"{subnet[1]}/{subnet.prefixlen}", "dev", BRIDGE)
    _ip("link", "set", BRIDGE, "up")
    _ip("route", "add", "unreachable", str(RANGE))
    for network in (POD_CIDR, SERVICE_CIDR, NODE_IPS):
        _ip("route", "replace", str(network), "dev", BRIDGE)
    iptables("-N", GUARD)
    iptables("-A", GUARD, "-i", BRIDGE, "!", "-o", BRIDGE, "-j", "DROP")
    iptables("-A", GUARD, "!", "-i", BRIDGE, "-o", BRIDGE, "-j", "DROP")
    iptables("-I", "FORWARD", "1", "-j", GUARD)


def guard_first() -> None:
    """Put the guard back at the head of FORWARD (kube-proxy and the kubelet insert their chains there)."""
    while iptables("-D", "FORWARD", "-j", GUARD, check=False).returncode == 0:
        pass
    iptables("-I", "FORWARD", "1", "-j", GUARD)


@dataclass(frozen=True)
class Route:
    destination: str
    device: str
    kind: str  # "unicast", "unreachable", …


def route_to(address: str) -> Route:
    """What the kernel does with a packet to `address` (`ip route get`)."""
    result = _ip("-j", "route", "get", address, check=False)
    if result.returncode != 0:  # an unreachable route answers "No route to host" (EHOSTUNREACH)
        unreachable = "no route to host" in result.stderr.lower()
        return Route(address, "", "unreachable" if unreachable else result.stderr.strip())
    entry = json.loads(result.stdout)[0]
    return Route(address, entry.get("dev", ""), entry.get("type", "unicast"))


def verify_routes(nodes: int) -> list[Route]:
    """Every cluster range goes onto the bridge and the rest of the range nowhere; raises otherwise."""
    routes = [route_to(str(node_subnet(i)[10])) for i in range(nodes)] + \
        [route_to(service_ip(10)), route_to(node_ip(0)), route_to(str(RANGE[-2]))]
    *bridged, outside = routes
    wrong = [r for r in bridged if r.device != BRIDGE and r.kind != "local"] + \
        ([outside] if outside.kind != "unreachable" else [])
    if wrong:
        raise RuntimeError(f"test cluster routes are not as planned: {wrong}")
    return routes


def read_sysctls() -> dict[str, str]:
    values = {}
    for name in SYSCTLS:
        path = Path("/proc/sys") / name.replace(".", "/")
        if path.exists():
            values[name] = path.read_text().strip()
    return values


def write_sysctls(values: dict[str, str]) -> None:
    for name, value in values.items():
        (Path("/proc/sys") / name.replace(".", "/")).write_text(value + "\n")


def remove() -> None:
    """Undo `create` and whatever kube-proxy, the kubelet and the CNI plugins added: every chain named KUBE-*,
    CNI-* or ours, and every rule that jumps to one; the bridge (its veths went with the pods' namespaces);
    the routes. Safe to call when nothing, or only part, is there."""
    for table in ("filter", "nat", "mangle"):
        saved = iptables("-S", table=table, check=False).stdout.splitlines()
        ours = {line.split()[1] for line in saved if line.startswith("-N ") and _ours(line.split()[1])}
        for line in saved:  # rules of the built-in chains (and of others) that jump into ours
            words = shlex.split(line)
            if words[0] == "-A" and "-j" in words and words[words.index("-j") + 1] in ours and words[1] not in ours:
                iptables("-D", *words[1:], table=table, check=False)
        for chain in ours:
            iptables("-F", chain, table=table, check=False)
        for chain in ours:
            iptables("-X", chain, table=table, check=False)
    _ip("link", "del", BRIDGE, check=False)
    _ip("route", "del", "unreachable", str(RANGE), check=False)


def _ours(chain: str) -> bool:
    return chain.startswith(("KUBE-", "CNI-")) or chain == GUARD


def leftovers() -> list[str]:
    """What `remove` should have left nothing of: routes into the range, the bridge, our chains."""
    found = [f"route {r['dst']}" for r in json.loads(_ip("-j", "route", "show").stdout or "[]")
             if r.get("dst", "default") != "default" and ipaddress.ip_network(r["dst"], strict=False).overlaps(RANGE)]
    if _ip("link", "show", BRIDGE, check=False).returncode == 0:
        found.append(f"link {BRIDGE}")
    for table in ("filter", "nat", "mangle"):
        found += [f"{table} chain {line.split()[1]}" for line in iptables("-S", table=table, check=False).stdout.splitlines()
                  if line.startswith("-N ") and _ours(line.split()[1])]
    return found
