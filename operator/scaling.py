"""The storage StatefulSet's size against what its pods hold: scale-ins wait until the pods going are drained.

Kubernetes removes a StatefulSet's highest pods as soon as `spec.replicas` drops, whatever they hold. So the
operator keeps a scale-in target of its own, the StatefulSet's annotation `shale.dev/scale-in-to`: while it is
set, the Topics move their replicas off the pods at and above it (moves.py), and once none of those pods is
named by a topic manifest or serves a partition, the operator lowers `spec.replicas` to it and removes the
annotation. A `spec.replicas` lowered directly (`kubectl scale`, a Helm upgrade) below a pod that still holds
replicas is put back and turned into that annotation — Strimzi's scale-down check, which refuses the same
change — so the pods are drained first. Checked every `scale_check_interval_seconds`.
"""

from __future__ import annotations

import asyncio
import logging

import kubernetes

from .configmap import TopicsConfigMap
from .metrics import OperatorMetrics
from .moves import ScaleAction, scale_action
from .planning import applied_topics
from .settings import Settings
from .status import ReportCache, fetch_reports, partitions_of
from .storage import SCALE_IN_ANNOTATION, Storage, StorageError, read_storage

logger = logging.getLogger(__name__)


async def holders(storage: Storage, settings: Settings, configmap: TopicsConfigMap,
                  cache: ReportCache | None) -> dict[int, set[str]]:
    """pod ordinal → the topics it holds replicas of: named in a manifest, served by the pod (any topic, also
    those created through the Kafka API, which no manifest names), or named by a partition record a pod reports
    (a replica a move has yet to remove, perhaps on a pod that is down)."""
    held: dict[int, set[str]] = {}
    snapshot = await asyncio.to_thread(configmap.read)
    for applied in applied_topics(snapshot.data).values():
        for replicas in applied.assignment or ():
            for node in replicas:
                held.setdefault(node, set()).add(applied.topic_name or applied.key)
    every = set(storage.pods) | set(range(storage.replicas))
    reports = await fetch_reports(storage, settings.status_url_template, every, settings.http_timeout_seconds, cache)
    for ordinal, report in reports.items():
        for topic in (report.document or {}).get("topics") or {}:
            for entry in partitions_of(report, topic):
                if not entry.get("served", True):
                    continue
                held.setdefault(ordinal, set()).add(topic)
                for node in (entry.get("replica") or {}).get("replicas") or ():  # a record naming a pod holds it
                    held.setdefault(node, set()).add(topic)
    return held


async def check_scale(settings: Settings, api: kubernetes.client.ApiClient, configmap: TopicsConfigMap,
                      metrics: OperatorMetrics, cache: ReportCache | None = None) -> ScaleAction | None:
    """One check: the StatefulSet patched as `scale_action` says (with the read's resourceVersion)."""
    try:
        storage = await asyncio.to_thread(read_storage, api, settings)
    except StorageError:
        return None  # the Topics report it
    held = await holders(storage, settings, configmap, cache)
    action = scale_action(storage.replicas, storage.scale_in_to, set(held))
    draining = {n: sorted(topics) for n, topics in sorted(held.items())
                if storage.scale_in_to is not None and n >= storage.scale_in_to}
    if action is None:
        if storage.scale_in_to is not None and storage.scale_in_to < storage.replicas:
            metrics.scale_in_target.set(storage.scale_in_to)
            logger.debug("StatefulSet %s/%s: scale-in to %d waits for pods to be drained: %s", storage.namespace,
                         storage.statefulset, storage.scale_in_to, draining)
        return None
    patch: dict = {"metadata": {"resourceVersion": storage.resource_version}}
    if action.replicas is not None:
        patch["spec"] = {"replicas": action.replicas}
    if action.clear_scale_in:
        patch["metadata"]["annotations"] = {SCALE_IN_ANNOTATION: None}
    elif action.scale_in_to is not None:
        patch["metadata"]["annotations"] = {SCALE_IN_ANNOTATION: str(action.scale_in_to)}
    await asyncio.to_thread(kubernetes.client.AppsV1Api(api).patch_namespaced_stateful_set, storage.statefulset,
                            storage.namespace, patch, _content_type="application/merge-patch+json")
    level = logging.WARNING if action.scale_in_to is not None else logging.INFO
    detail = f" (pods still holding replicas: {draining})" if action.scale_in_to is not None and draining else ""
    logger.log(level, "StatefulSet %s/%s: %s%s", storage.namespace, storage.statefulset, action.message, detail)
    if action.scale_in_to is not None:
        metrics.scale_in_target.set(action.scale_in_to)
    elif action.clear_scale_in:
        metrics.scale_in_target.set(-1)
    return action


async def scale_loop(settings: Settings, api: kubernetes.client.ApiClient, configmap: TopicsConfigMap,
                     metrics: OperatorMetrics, cache: ReportCache | None = None) -> None:
    """`check_scale` every interval until cancelled; a failed check is logged and tried again."""
    while True:
        try:
            await check_scale(settings, api, configmap, metrics, cache)
        except kubernetes.client.ApiException as exc:  # 409: changed since our read; 403: RBAC — logged, retried
            logger.warning("StatefulSet %s/%s: scale check failed: %s %s", settings.storage_namespace,
                           settings.statefulset, exc.status, exc.reason)
        except Exception:  # noqa: BLE001 - the loop must outlive any one failure
            logger.exception("StatefulSet %s/%s: scale check failed", settings.storage_namespace,
                             settings.statefulset)
        await asyncio.sleep(settings.scale_check_interval_seconds)
