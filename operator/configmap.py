"""The topics ConfigMap: read-modify-write of its keys with optimistic concurrency.

Every storage pod mounts this one ConfigMap as its `--topics` directory, one key per Topic. A change
is computed from the data as read and written as a merge patch carrying that read's resourceVersion,
which the API server treats as a precondition: if anyone (another operator replica during a rollout,
a person with kubectl, Helm) wrote in between, the patch fails with 409 and the change is recomputed
from fresh data. A missing ConfigMap is created on the first write (and a create race is a conflict
too); a removal from a missing ConfigMap is a no-op, so deleting a Topic never waits for storage.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable, Mapping

import kubernetes

logger = logging.getLogger(__name__)

Changes = Mapping[str, str | None]  # key → new text, or None to remove the key
MANAGED_BY = {"app.kubernetes.io/managed-by": "shale-operator"}


class ConflictError(RuntimeError):
    """The ConfigMap kept changing under us for every attempt."""


@dataclass(frozen=True)
class Snapshot:
    data: dict[str, str]
    resource_version: str | None  # None: the ConfigMap does not exist


class TopicsConfigMap:
    def __init__(self, api: kubernetes.client.ApiClient, namespace: str, name: str, attempts: int = 8) -> None:
        self.core = kubernetes.client.CoreV1Api(api)
        self.namespace, self.name, self.attempts = namespace, name, attempts

    @property
    def ref(self) -> str:
        return f"ConfigMap {self.namespace}/{self.name}"

    def read(self) -> Snapshot:
        try:
            cm = self.core.read_namespaced_config_map(self.name, self.namespace)
        except kubernetes.client.ApiException as exc:
            if exc.status == 404:
                return Snapshot({}, None)
            raise
        return Snapshot(dict(cm.data or {}), cm.metadata.resource_version)

    def update(self, compute: Callable[[Snapshot], Changes]) -> Snapshot:
        """Apply `compute(current)`'s changes; recomputed on every conflict. Returns the data written."""
        for attempt in range(self.attempts):
            current = self.read()
            changes = {k: v for k, v in compute(current).items() if current.data.get(k) != v}
            if not changes:
                return current
            if current.resource_version is None:
                data = {k: v for k, v in changes.items() if v is not None}
                if not data:
                    return current
                body = {"metadata": {"name": self.name, "namespace": self.namespace, "labels": MANAGED_BY},
                        "data": data}
                call = lambda: self.core.create_namespaced_config_map(self.namespace, body)  # noqa: E731
            else:
                body = {"metadata": {"resourceVersion": current.resource_version}, "data": dict(changes)}
                call = lambda: self.core.patch_namespaced_config_map(  # noqa: E731
                    self.name, self.namespace, body, _content_type="application/merge-patch+json")
            try:
                cm = call()
            except kubernetes.client.ApiException as exc:
                if exc.status == 409:  # written by someone else since our read, or created meanwhile
                    logger.info("%s changed while writing keys %s (attempt %d); retrying with fresh data",
                                self.ref, ", ".join(sorted(changes)), attempt + 1)
                    continue
                if exc.status == 404:  # deleted between our read and our patch: create it next time
                    continue
                raise
            return Snapshot(dict(cm.data or {}), cm.metadata.resource_version)
        raise ConflictError(f"{self.ref}: still changing after {self.attempts} attempts; will retry")
