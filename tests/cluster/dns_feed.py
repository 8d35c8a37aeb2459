"""Cluster DNS without CoreDNS: dnsmasq answers from a hosts file that this watcher writes from the API.

No registry reachable here ships CoreDNS (../shared/spec/kubernetes.md §7.5), so the test cluster does
what kube-dns once did: dnsmasq on the node IP, authoritative for `cluster.local` and forwarding nothing
(`--no-resolv`, no `--server`), re-reading a hosts directory whenever a file in it changes. This module is
the one piece of glue the real-cluster tests allow: `records` is the pure mapping from Services and
Endpoints to A records, Kubernetes' DNS specification for what the tests use —
- `<service>.<ns>.svc.<domain>`: the ClusterIP, or for a headless Service each address of its Endpoints;
- `<hostname>.<service>.<ns>.svc.<domain>`: an endpoint address that carries a hostname (a StatefulSet's
  pod under its governing headless Service);
and `DnsFeed` keeps the file current from a watch of both kinds. No SRV, PTR or pod-IP records.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any, Iterable

import kubernetes

DOMAIN = "cluster.local"


def records(services: Iterable[dict[str, Any]], endpoints: Iterable[dict[str, Any]],
            domain: str = DOMAIN) -> list[tuple[str, str]]:
    """(address, name) pairs, sorted, for Services and Endpoints as the API returns them (camelCase dicts)."""
    found: set[tuple[str, str]] = set()
    headless: set[tuple[str, str]] = set()
    for service in services:
        meta, spec = service["metadata"], service.get("spec") or {}
        name = f"{meta['name']}.{meta['namespace']}.svc.{domain}"
        cluster_ip = spec.get("clusterIP")
        if cluster_ip and cluster_ip != "None":
            found.add((cluster_ip, name))
        elif cluster_ip == "None":
            headless.add((meta["namespace"], meta["name"]))
    for endpoint in endpoints:
        meta = endpoint["metadata"]
        if (meta["namespace"], meta["name"]) not in headless:
            continue
        name = f"{meta['name']}.{meta['namespace']}.svc.{domain}"
        for subset in endpoint.get("subsets") or ():
            for address in subset.get("addresses") or ():
                found.add((address["ip"], name))
                if address.get("hostname"):
                    found.add((address["ip"], f"{address['hostname']}.{name}"))
    return sorted(found)


def hosts_file(pairs: Iterable[tuple[str, str]]) -> str:
    return "".join(f"{address} {name}\n" for address, name in pairs)


class DnsFeed(threading.Thread):
    """Rewrites `hosts_dir/cluster` from the API every time a Service or Endpoints object changes.

    A list every `interval` seconds, not a watch: the cluster has a handful of objects, a list of both kinds
    costs the API server well under a millisecond, and a poll needs no reconnect logic when the API server
    is restarted by a test. The file is written next to the hosts directory and renamed into it, so dnsmasq
    (inotify on the directory) never reads half of it."""

    def __init__(self, api: kubernetes.client.ApiClient, hosts_dir: Path, interval: float = 0.5):
        super().__init__(name="dns-feed", daemon=True)
        self.api, self.hosts_dir, self.interval = api, hosts_dir, interval
        self.stopped = threading.Event()
        self.errors = 0
        self.written = ""

    def run(self) -> None:
        core = kubernetes.client.CoreV1Api(self.api)
        while not self.stopped.is_set():
            try:
                services = self.api.sanitize_for_serialization(core.list_service_for_all_namespaces().items)
                endpoints = self.api.sanitize_for_serialization(core.list_endpoints_for_all_namespaces().items)
                self.write(hosts_file(records(services, endpoints)))
            except Exception:  # the API server is restarting: keep the last file, try again
                self.errors += 1
            self.stopped.wait(self.interval)

    def write(self, text: str) -> None:
        if text == self.written:
            return
        staging = self.hosts_dir.parent / f".{self.hosts_dir.name}.cluster.tmp"
        staging.write_text(text)
        os.replace(staging, self.hosts_dir / "cluster")
        self.written = text

    def wait_for(self, name: str, timeout: float = 30.0) -> str:
        """The address `name` has in the file, once it has one."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for line in self.written.splitlines():
                address, _, host = line.partition(" ")
                if host == name:
                    return address
            time.sleep(0.1)
        raise AssertionError(f"{name} not in the cluster's DNS after {timeout}s:\n{self.written}")

    def stop(self) -> None:
        self.stopped.set()
        self.join(5)
