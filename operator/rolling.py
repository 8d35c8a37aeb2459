"""The roll of the storage pods and their PodDisruptionBudget, acted on every `roll_check_interval_seconds`.

Only while the StatefulSet's `updateStrategy` is `OnDelete` — the chart's sign that the operator rolls (with
`RollingUpdate` the StatefulSet controller does, and the chart renders the PDB). Each check reads the
StatefulSet, its pods and their /status, sets the PDB's `maxUnavailable` (roll.pdb_max_unavailable) and
evicts the pod `roll.next_step` names through the Eviction API, so a drain and the roll share the one budget.
The PDB is the operator's own: owned by the StatefulSet, so deleting it (`helm uninstall`) deletes the PDB.
docs/day-2-operations.md, sections 3 and 4.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import time
from dataclasses import dataclass

import kubernetes

from .metrics import OperatorMetrics
from .roll import Evict, Step, Wait, next_step, pdb_max_unavailable, roll_inputs
from .settings import Settings
from .status import ReportCache, fetch_reports
from .storage import Storage, StorageError, read_storage

logger = logging.getLogger(__name__)

MANAGED_BY = {"app.kubernetes.io/managed-by": "shale-operator"}


@dataclass
class Stuck:
    """Since when the roll has waited (monotonic seconds), and whether that wait was reported stuck."""

    since: float | None = None
    reported: bool = False


def ensure_pdb(api: kubernetes.client.ApiClient, storage: Storage, max_unavailable: int) -> None:
    """Create the storage PDB, or set its budget and owner where they differ (blocking).

    Through the generic object API, in policy/v1 where served (Kubernetes 1.21 on), else policy/v1beta1 (the
    same fields): the chart's floor is 1.29, but the real-cluster tests run 1.20 (docs/real-cluster.md). A
    create answered 404 is a version not served (the namespace exists: the StatefulSet is in it)."""
    for version in ("v1", "v1beta1"):
        try:
            _ensure_pdb(api, storage, max_unavailable, version)
            return
        except kubernetes.client.ApiException as exc:
            if exc.status != 404 or version == "v1beta1":
                raise


def _ensure_pdb(api: kubernetes.client.ApiClient, storage: Storage, max_unavailable: int, version: str) -> None:
    objects = kubernetes.client.CustomObjectsApi(api)
    where = ("policy", version, storage.namespace, "poddisruptionbudgets")
    owner = {"apiVersion": "apps/v1", "kind": "StatefulSet", "name": storage.statefulset, "uid": storage.uid}
    body = {"apiVersion": f"policy/{version}", "kind": "PodDisruptionBudget",
            "metadata": {"name": storage.statefulset, "namespace": storage.namespace,
                         "labels": {**storage.selector, **MANAGED_BY}, "ownerReferences": [owner]},
            "spec": {"maxUnavailable": max_unavailable, "selector": {"matchLabels": storage.selector}}}
    try:
        current = objects.get_namespaced_custom_object(*where, storage.statefulset)
    except kubernetes.client.ApiException as exc:
        if exc.status != 404:
            raise
        objects.create_namespaced_custom_object(*where, body)
        return
    owned = any(o.get("uid") == storage.uid for o in current["metadata"].get("ownerReferences") or ())
    if current["spec"].get("maxUnavailable") != max_unavailable or not owned:
        objects.patch_namespaced_custom_object(*where, storage.statefulset, body,
                                               _content_type="application/merge-patch+json")


def evict(api: kubernetes.client.ApiClient, namespace: str, pod: str) -> None:
    """POST the pod's eviction: the API server refuses it (429) while the PDB allows none. The body names no
    apiVersion, so the server takes the version it serves (policy/v1 from 1.22, v1beta1 before)."""
    eviction = kubernetes.client.V1Eviction(metadata=kubernetes.client.V1ObjectMeta(name=pod, namespace=namespace))
    kubernetes.client.CoreV1Api(api).create_namespaced_pod_eviction(pod, namespace, eviction)


def post_event(api: kubernetes.client.ApiClient, storage: Storage, type_: str, reason: str, message: str) -> None:
    """An Event about the StatefulSet (blocking), as `kubectl describe statefulset` lists them; kopf's own Events
    are posted only from the handlers of the objects it watches."""
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    kubernetes.client.CoreV1Api(api).create_namespaced_event(storage.namespace, {
        "metadata": {"generateName": f"{storage.statefulset}.", "namespace": storage.namespace},
        "involvedObject": {"apiVersion": "apps/v1", "kind": "StatefulSet", "name": storage.statefulset,
                           "namespace": storage.namespace, "uid": storage.uid},
        "type": type_, "reason": reason, "message": message[:1024], "source": {"component": "shale-operator"},
        "firstTimestamp": now, "lastTimestamp": now, "count": 1})


async def check_roll(settings: Settings, api: kubernetes.client.ApiClient, metrics: OperatorMetrics, stuck: Stuck,
                     cache: ReportCache | None = None) -> Step | None:
    """One check: the PDB's budget set, then the roll's next step taken; None while the operator does not roll."""
    try:
        storage = await asyncio.to_thread(read_storage, api, settings)
    except StorageError:
        return None  # the Topics report it
    if not storage.on_delete:
        return None
    every = set(storage.pods) | set(range(storage.replicas))
    reports = await fetch_reports(storage, settings.status_url_template, every, settings.http_timeout_seconds, cache)
    pods, partitions = roll_inputs(storage, reports)
    budget = pdb_max_unavailable(partitions)
    await asyncio.to_thread(ensure_pdb, api, storage, budget)
    metrics.roll_pdb_budget.set(budget)
    metrics.roll_outdated.set(sum(1 for p in pods if p.present and p.outdated))
    step = next_step(pods, partitions)
    where = f"StatefulSet {storage.namespace}/{storage.statefulset}"
    if isinstance(step, Evict):
        try:
            await asyncio.to_thread(evict, api, storage.namespace, step.pod)
        except kubernetes.client.ApiException as exc:
            if exc.status != 429:
                raise
            step = Wait(f"the eviction of pod {step.pod} was refused (429: the PDB allows none now, e.g. a drain "
                        "took a pod)")
        else:
            logger.info("%s: roll: evicted pod %s: %s", where, step.pod, step.reason)
            metrics.roll_evictions.inc()
            await asyncio.to_thread(post_event, api, storage, "Normal", "RollEvicted", step.reason)
    if not isinstance(step, Wait):
        stuck.since, stuck.reported = None, False
        metrics.roll_stuck.set(0)
        return step
    now = time.monotonic()
    stuck.since = now if stuck.since is None else stuck.since
    waited = now - stuck.since
    logger.debug("%s: roll waits (%.0f s): %s", where, waited, step.reason)
    if waited >= settings.roll_stuck_seconds:
        metrics.roll_stuck.set(1)
        if not stuck.reported:
            stuck.reported = True
            message = f"the roll has waited {waited:.0f} s: {step.reason}"
            logger.warning("%s: %s", where, message)
            await asyncio.to_thread(post_event, api, storage, "Warning", "RollStuck", message)
    return step


async def roll_loop(settings: Settings, api: kubernetes.client.ApiClient, metrics: OperatorMetrics,
                    cache: ReportCache | None = None) -> None:
    """`check_roll` every interval until cancelled; a failed check is logged and tried again."""
    stuck = Stuck()
    while True:
        try:
            await check_roll(settings, api, metrics, stuck, cache)
        except kubernetes.client.ApiException as exc:  # 403: RBAC; 409: changed since our read — retried
            logger.warning("StatefulSet %s/%s: roll check failed: %s %s", settings.storage_namespace,
                           settings.statefulset, exc.status, exc.reason)
        except Exception:  # noqa: BLE001 - the loop must outlive any one failure
            logger.exception("StatefulSet %s/%s: roll check failed", settings.storage_namespace, settings.statefulset)
        await asyncio.sleep(settings.roll_check_interval_seconds)
