"""The storage StatefulSet as the operator sees it: how many pods, their names, addresses and ports.

Node ids are the pods' ordinals (`shale serve --node-id` is set from the pod name in the chart), so
node N is pod `<statefulset>-N` and is reached through the headless Service. Addresses and status URLs
come from templates (settings.py) filled with the pod's name, ordinal, Service, namespace, IP and
named container ports: the Kafka address must be stable (a DNS name) because clients are sent to it,
while in tests the same templates point at loopback ports of real `shale serve` processes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import kubernetes

from .settings import Settings

ZONE_LABEL = "topology.kubernetes.io/zone"
# The StatefulSet's scale-in target while the pods above it are drained (docs/moves.md, "The operator").
SCALE_IN_ANNOTATION = "shale.dev/scale-in-to"


class StorageError(RuntimeError):
    """The storage cannot take the change now; the message names what. `reason`: the Ready condition's reason."""

    def __init__(self, message: str, reason: str = "StorageNotReady") -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True)
class StoragePod:
    name: str
    ordinal: int
    ip: str | None
    ports: dict[str, int] = field(default_factory=dict)  # named container ports
    node: str | None = None  # the Kubernetes node it is scheduled on


@dataclass(frozen=True)
class Storage:
    namespace: str
    statefulset: str
    service: str
    replicas: int
    pods: dict[int, StoragePod]
    zones: dict[int, str] = field(default_factory=dict)  # ordinal → zone label of its pod's node, where known
    scale_in_to: int | None = None  # the pods from this ordinal up are being drained before a scale-in
    resource_version: str | None = None  # of the StatefulSet as read: the precondition of the operator's patches

    @property
    def nodes(self) -> list[int]:
        """The node ids replicas may be placed on: the StatefulSet's ordinals, below a scale-in target."""
        return list(range(self.replicas if self.scale_in_to is None else min(self.replicas, self.scale_in_to)))

    def pod_name(self, ordinal: int) -> str:
        return f"{self.statefulset}-{ordinal}"

    def render(self, template: str, ordinal: int) -> str:
        """Fill a template for node `ordinal`; StorageError if it needs a pod field the pod does not have."""
        pod = self.pods.get(ordinal)
        fields: dict[str, Any] = {"pod": self.pod_name(ordinal), "ordinal": ordinal, "service": self.service,
                                  "namespace": self.namespace}
        if pod is not None:
            if pod.ip:
                fields["pod_ip"] = pod.ip
            fields.update({f"port_{name}": port for name, port in pod.ports.items()})
        try:
            return template.format(**fields)
        except (KeyError, IndexError) as exc:
            state = "does not exist" if pod is None else "has no such field yet"
            raise StorageError(f"pod {self.namespace}/{self.pod_name(ordinal)} {state}: template {template!r} "
                               f"needs {exc}") from None


def read_storage(api: kubernetes.client.ApiClient, settings: Settings) -> Storage:
    """Read the StatefulSet and its pods (blocking)."""
    ns, name = settings.storage_namespace, settings.statefulset
    try:
        sts = kubernetes.client.AppsV1Api(api).read_namespaced_stateful_set(name, ns)
    except kubernetes.client.ApiException as exc:
        if exc.status == 404:
            raise StorageError(f"storage StatefulSet {ns}/{name} not found") from None
        raise
    service = settings.service or sts.spec.service_name
    if not service:
        raise StorageError(f"StatefulSet {ns}/{name} has no spec.serviceName and no headless Service is set")
    selector = ",".join(f"{k}={v}" for k, v in sorted((sts.spec.selector.match_labels or {}).items()))
    pods: dict[int, StoragePod] = {}
    own_name = re.compile(re.escape(name) + r"-(0|[1-9][0-9]*)")
    for pod in kubernetes.client.CoreV1Api(api).list_namespaced_pod(ns, label_selector=selector).items:
        match = own_name.fullmatch(pod.metadata.name or "")
        if match is None:  # a selector may match more than this StatefulSet's pods
            continue
        ports = {p.name: p.container_port for c in pod.spec.containers or () for p in c.ports or () if p.name}
        ordinal = int(match.group(1))
        pods[ordinal] = StoragePod(pod.metadata.name, ordinal, pod.status.pod_ip if pod.status else None, ports,
                                   pod.spec.node_name)
    zones = _zones(api, {o: p.node for o, p in pods.items() if p.node})
    return Storage(ns, name, service, sts.spec.replicas if sts.spec.replicas is not None else 1, pods, zones,
                   _scale_in_to(sts.metadata.annotations or {}), sts.metadata.resource_version)


def _scale_in_to(annotations: dict[str, str]) -> int | None:
    """The scale-in target annotation; an unreadable one is ignored (as absent), not a reason to stop placing."""
    raw = annotations.get(SCALE_IN_ANNOTATION)
    try:
        value = int(raw) if raw is not None else None
    except ValueError:
        return None
    return value if value is not None and value >= 0 else None


def _zones(api: kubernetes.client.ApiClient, node_of: dict[int, str]) -> dict[int, str]:
    """The zone label of each pod's node, so that replicas spread over zones; none where unlabelled or unreadable
    (the chart grants `get nodes`; without it, or on a cluster without zones, replicas spread over pods only)."""
    core = kubernetes.client.CoreV1Api(api)
    labels: dict[str, str | None] = {}
    for node in set(node_of.values()):
        try:
            labels[node] = (core.read_node(node).metadata.labels or {}).get(ZONE_LABEL)
        except kubernetes.client.ApiException as exc:
            if exc.status not in (403, 404):
                raise
            labels[node] = None
    return {ordinal: labels[node] for ordinal, node in node_of.items() if labels.get(node)}
