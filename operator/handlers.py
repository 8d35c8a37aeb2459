"""The kopf handlers: a Topic's create/update/resume and timer reconcile it, its deletion removes its key.

Reconciling is level-based and idempotent, so every entry point runs the same `reconcile`: validate
the spec (a bad one only sets Ready=False with the reason, nothing is written), read the StatefulSet
and the pods' /status, plan the ConfigMap key (planning.py) and write it with optimistic concurrency,
then report what the pods serve — Ready only once every pod's /status shows the digest of the
manifest just written, i.e. the pods loaded this spec and not an older one. Change handlers wait up
to `ready_wait_seconds` for the pods to pick the change up so Ready turns True promptly; the timer
repeats everything every `status_interval_seconds`, which refreshes offsets and cleaning and repairs
a ConfigMap edited or recreated behind the operator's back. One lock per Topic keeps a timer from
racing a change handler, one lock per process serialises this operator's own ConfigMap writes (other
writers are caught by the resourceVersion precondition).

The Topics are the source of truth, and only deleting one deletes: a key that is missing although its
Topic was applied (a ConfigMap emptied, deleted or edited by hand) is written back by whichever Topic
is reconciled next, for every such Topic in one write (`plan_restore`, from kopf's index of the
Topics), so the pods see the set come back at once. A Topic whose spec is refused now is written
back at the spec last applied, which every successful apply records in `status.appliedSpec`: the
whole set must come back, since pods that see only the final state would take a key left out for
a deletion. Only a Topic without an applied spec cannot be written back: a Warning Event says so,
once. Every write also keeps the placeholder key (`PLACEHOLDER_KEY`), without which the pods could
not tell the deletion of the last Topic from a lost volume.

Annotations (Strimzi's semantics): `shale.dev/paused-reconciliation: "true"` applies nothing and sets
ReconciliationPaused=True; `shale.dev/managed: "false"` hands the topic back (Unmanaged=True), and
deleting such a Topic — or a paused one — keeps its key, so the topic and its data stay on the pods.
"""

from __future__ import annotations

import asyncio
import copy
import logging
import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Mapping

import kopf
import kubernetes

from .conditions import PAUSED, READY, REASSIGNING, SCALE_IN_BLOCKED, UNMANAGED, Condition, find, merge, rfc3339
from .configmap import ConflictError, Snapshot, TopicsConfigMap
from .crd import GROUP, MANAGED_ANNOTATION, PAUSE_ANNOTATION, PLURAL, VERSION
from .discovery import lister, wait_for_resources
from .kube import connection_info
from .manifests import (
    PLACEHOLDER_KEY,
    PLACEHOLDER_TEXT,
    DesiredTopic,
    SpecError,
    configmap_key,
    desired_topic,
    loaded_digest,
    parse_applied,
)
from .metrics import OperatorMetrics
from .moves import Progress, moves_status, progress_of, reassigning, scale_in_refusal, shown_placement
from .planning import Moves, Restore, lost_topics, plan, plan_restore
from .scaling import scale_loop
from .settings import Settings
from .status import NodeReport, Observation, ReportCache, fetch_reports, observe, partitions_of, placements, refusals
from .storage import Storage, StorageError, read_storage
from .timer_work import run_until_stopped
from .user_crd import PLURAL as USERS_PLURAL
from .user_handlers import register as register_users

FINALIZER = f"{GROUP}/topic-operator"
_POLL_SECONDS = 0.25  # while a change handler waits for the pods


@dataclass
class Context:
    """What every handler shares (passed to kopf as memo.ctx)."""

    settings: Settings
    api: kubernetes.client.ApiClient
    configmap: TopicsConfigMap
    metrics: OperatorMetrics = field(default_factory=OperatorMetrics)
    configmap_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    topic_locks: dict[str, asyncio.Lock] = field(default_factory=lambda: defaultdict(asyncio.Lock))
    reports: ReportCache = field(default_factory=lambda: ReportCache(0.0))
    deleted: set[str] = field(default_factory=set)  # uids whose key was removed: never written again
    unrestorable: dict[str, str] = field(default_factory=dict)  # lost key → why it cannot be written back (reported)
    scaler: asyncio.Task | None = None  # scaling.scale_loop: the StatefulSet's size against the drains

    @classmethod
    def create(cls, settings: Settings, api: kubernetes.client.ApiClient) -> "Context":
        # Refreshes may reuse a pod's /status for half an interval: one fetch per pod per half interval.
        return cls(settings, api, TopicsConfigMap(api, settings.storage_namespace, settings.configmap),
                   reports=ReportCache(settings.status_interval_seconds / 2))


def _same(current: Mapping[str, Any] | None, cond: Condition) -> bool:
    return current is not None and (current.get("status"), current.get("reason"), current.get("message")) == (
        cond.status_text, cond.reason, cond.message)


def _status_patch(patch: kopf.Patch, current: Mapping[str, Any], new: Mapping[str, Any]) -> None:
    """Patch only the status fields that changed, so an idle Topic causes no writes."""
    for key, value in new.items():
        if current.get(key) != value:
            patch.status[key] = _replacing(current.get(key), value)


def _replacing(old: Any, new: Any) -> Any:
    """`new` as a merge patch over `old`: keys `old` has and `new` lacks are nulled (e.g. a config key removed)."""
    if not isinstance(old, Mapping) or not isinstance(new, Mapping):
        return new
    return {**dict.fromkeys(old), **{k: _replacing(old.get(k), v) for k, v in new.items()}}


Topics = Mapping[str, Any]  # kopf's index `topic_bodies`: ConfigMap key → the bodies of the Topic(s) with it


async def reconcile(ctx: Context, body: kopf.Body, patch: kopf.Patch, logger: logging.Logger | logging.LoggerAdapter,
                    wait: bool, topics: Topics) -> None:
    meta = body["metadata"]
    namespace, name = meta["namespace"], meta["name"]
    status = dict(body.get("status") or {})
    annotations = meta.get("annotations") or {}
    generation = meta.get("generation")
    now = rfc3339(time.time())
    async with ctx.topic_locks[meta["uid"]]:
        if meta["uid"] in ctx.deleted or meta.get("deletionTimestamp"):
            return  # a refresh that waited for the delete handler must not write the key back
        if annotations.get(PAUSE_ANNOTATION) == "true":
            cond = Condition(PAUSED, True, "ReconciliationPaused",
                             f'{PAUSE_ANNOTATION} is "true": changes to this Topic are not applied')
            _status_patch(patch, status, {"conditions": merge(status.get("conditions"), [cond],
                                                              generation=generation, now=now)})
            return
        if annotations.get(MANAGED_ANNOTATION) == "false":
            ctx.metrics.forget(namespace, name)
            cond = Condition(UNMANAGED, True, "Unmanaged",
                             f'{MANAGED_ANNOTATION} is "false": the topic is left as it is, also when the Topic '
                             "is deleted")
            _status_patch(patch, status, {"conditions": merge(status.get("conditions"), [cond],
                                                              generation=generation, now=now, drop=(PAUSED,))})
            return
        drop = (PAUSED, UNMANAGED)
        try:
            topic, observation, moved = await _apply(ctx, body, logger, wait, topics)
        except (SpecError, StorageError) as exc:
            reason = exc.reason if isinstance(exc, SpecError) else "StorageNotReady"
            cond = Condition(READY, False, reason, str(exc))
            # Warn, and post a Warning Event (reason = the condition's) that `kubectl describe topic` shows,
            # when this becomes the Topic's state, not on every refresh.
            if _same(find(status.get("conditions"), READY), cond):
                logger.debug("Topic %s/%s not applied (%s): %s", namespace, name, reason, exc)
            else:
                logger.warning("Topic %s/%s not applied (%s): %s", namespace, name, reason, exc)
                kopf.warn(body, reason=reason, message=str(exc))
            ctx.metrics.set_ready(namespace, name, False)
            conditions = merge(status.get("conditions"), [cond], generation=generation, now=now, drop=drop)
            _status_patch(patch, status, {"observedGeneration": generation, "conditions": conditions})
            return
        except ConflictError as exc:
            raise kopf.TemporaryError(str(exc), delay=2) from None
        ctx.metrics.set_ready(namespace, name, bool(observation.ready.status))
        ctx.metrics.set_moves(namespace, name, moved.moves)
        if not _same(find(status.get("conditions"), READY), observation.ready):
            logger.info("Topic %s/%s: Ready=%s (%s): %s", namespace, name, observation.ready.status_text,
                        observation.ready.reason, observation.ready.message)
        if not _same(find(status.get("conditions"), REASSIGNING), moved.reassigning):
            logger.info("Topic %s/%s: Reassigning=%s (%s): %s", namespace, name, moved.reassigning.status_text,
                        moved.reassigning.reason, moved.reassigning.message)
        updates = [observation.ready, observation.cleaning_stuck, moved.reassigning]
        if moved.scale_in_blocked is not None:
            updates.append(moved.scale_in_blocked)
            if not _same(find(status.get("conditions"), SCALE_IN_BLOCKED), moved.scale_in_blocked):
                logger.warning("Topic %s/%s: %s", namespace, name, moved.scale_in_blocked.message)
                kopf.warn(body, reason=moved.scale_in_blocked.reason, message=moved.scale_in_blocked.message)
        conditions = merge(status.get("conditions"), updates, generation=generation, now=now,
                           drop=drop + (() if moved.scale_in_blocked else (SCALE_IN_BLOCKED,)))
        fields = {"observedGeneration": generation, "topicName": topic.topic_name, "appliedSpec": topic.spec,
                  "conditions": conditions, "partitions": observation.partitions,
                  "diskUsageBytes": observation.disk_usage_bytes}
        if moved.moves or status.get("moves"):  # a topic that never moved has no `moves`
            fields["moves"] = moved.moves
        _status_patch(patch, status, fields)


@dataclass(frozen=True)
class Moved:
    """The Topic's moves between pods as its status shows them, and the conditions they set."""

    moves: list[dict[str, Any]]
    reassigning: Condition
    scale_in_blocked: Condition | None  # None: no scale-in waits on this topic, or it can be drained


def _progress(topic: str, partitions: int, reports: Mapping[int, NodeReport], max_moves: int) -> Moves | None:
    """Each partition's record as the pods report it; None when no pod reports any record (no replication):
    then replicas cannot move, and stay where they are placed."""
    if not any(e.get("replica") for r in reports.values() for t in ((r.document or {}).get("topics") or {})
               for e in partitions_of(r, t)):
        return None
    entries: dict[int, list[Mapping[str, Any]]] = {}
    for report in reports.values():
        for entry in partitions_of(report, topic):
            entries.setdefault(entry.get("partition"), []).append(entry)
    return Moves({p: progress_of(entries.get(p, [])) for p in range(partitions)}, max_moves)


def _moved(body: kopf.Body, storage: Storage, reports: Mapping[int, NodeReport], planned: Mapping[str, Any],
           moves: Moves | None, topic: DesiredTopic, now: str) -> Moved:
    owners, target, before = planned["owners"], planned["target"], planned["before"]
    progress: Mapping[int, Progress | None] = moves.progress if moves is not None else {}
    sizes = {(e.get("partition"), ordinal): int(e.get("size_bytes") or 0)
             for ordinal, report in reports.items() for e in partitions_of(report, topic.topic_name)}
    refused = "; ".join(refusals(topic.topic_name, topic.key, reports))
    failures = {}
    for p, replicas in enumerate(owners):
        missing = [n for n in replicas if n not in storage.pods and n not in storage.nodes]
        if refused:
            failures[p] = refused
        elif missing:
            failures[p] = (f"pod(s) {', '.join(storage.pod_name(n) for n in missing)} do not exist and are beyond "
                           f"the StatefulSet's {storage.replicas} replicas")
    status = body.get("status") or {}
    shown = shown_placement(status.get("partitions") or [], storage.statefulset)
    moves_now = moves_status(list(status.get("moves") or []), before, owners, target, progress, sizes, failures, now,
                             shown)
    blocked = None
    if storage.scale_in_to is not None and storage.scale_in_to < storage.replicas:
        leaving = {n for n in set(storage.pods) | set(range(storage.replicas)) if n >= storage.scale_in_to}
        down = {n for n in leaving if n not in reports or reports[n].document is None}  # no pod or no /status
        why = scale_in_refusal(owners, leaving, moves is not None, progress, down)
        if not storage.nodes:
            why = [f"the StatefulSet would have no pods left to hold the topic's {len(owners)} partition(s)"]
        if why:
            blocked = Condition(SCALE_IN_BLOCKED, True, "ScaleInRefused",
                                f"StatefulSet {storage.namespace}/{storage.statefulset} cannot be scaled in to "
                                f"{storage.scale_in_to}: " + "; ".join(why) + ". Remove its annotation "
                                f"shale.dev/scale-in-to (or scale it back to {storage.replicas}) to cancel")
    return Moved(moves_now, reassigning(moves_now), blocked)


async def _apply(ctx: Context, body: kopf.Body, logger: Any, wait: bool,
                 topics: Topics) -> tuple[DesiredTopic, Observation, Moved]:
    settings = ctx.settings
    topic = desired_topic(body)
    storage: Storage = await asyncio.to_thread(read_storage, ctx.api, settings)
    every_node = set(storage.nodes) | set(storage.pods)
    cache = None if wait else ctx.reports  # a change handler looks at the pods afresh
    reports = await fetch_reports(storage, settings.status_url_template, every_node, settings.http_timeout_seconds,
                                  cache)
    found = placements(topic.topic_name, reports)
    moves = _progress(topic.topic_name, topic.partitions, reports, settings.max_moves_per_topic)
    planned: dict[str, Any] = {}
    every_topic = [b for bodies in topics.values() for b in bodies]  # read here: kopf changes it on this loop

    def compute(snapshot: Snapshot) -> dict[str, str]:
        lost = lost_topics(every_topic, snapshot.data, ctx.deleted)
        restore = plan_restore(lost, snapshot.data, storage, settings.node_address_template,
                               lambda name: placements(name, reports), settings.default_replicas)
        text, owners, target = plan(topic, {**snapshot.data, **restore.texts}, storage, settings.node_address_template,
                                    found, settings.default_replicas, moves)
        planned["owners"], planned["text"], planned["changed"] = owners, text, snapshot.data.get(topic.key) != text
        mine = parse_applied(topic.key, snapshot.data.get(topic.key) or "")
        planned["target"], planned["before"] = target, list(mine.assignment or ()) if mine is not None else []
        planned["lost"], planned["restore"] = lost, restore
        return {PLACEHOLDER_KEY: PLACEHOLDER_TEXT, **restore.texts, topic.key: text}

    try:
        async with ctx.configmap_lock:
            await asyncio.to_thread(ctx.configmap.update, compute)
    except kubernetes.client.ApiException as exc:  # e.g. 403: retry at the refresh pace, not kopf's 60 s backoff,
        # so that lost keys come back soon after the cause is fixed
        raise kopf.TemporaryError(f"{ctx.configmap.ref}: writing {topic.key} failed: {exc.status} {exc.reason}",
                                  delay=settings.status_interval_seconds) from None
    _report_lost(ctx, planned["lost"], planned["restore"], logger)
    owners = planned["owners"]
    digest = loaded_digest(planned["text"])  # what the pods report once they have loaded this manifest
    if planned["changed"]:
        logger.info("Topic %s: wrote %s to %s (topic %s, %d partitions on nodes %s, spec %s)", topic.ref,
                    topic.key, ctx.configmap.ref, topic.topic_name, topic.partitions, owners, digest)
    moved = _moved(body, storage, reports, planned, moves, topic, rfc3339(time.time()))
    if not wait:  # a refresh: what the pods said above is recent enough
        return topic, observe(topic.topic_name, topic.key, owners, storage, reports,
                              settings.cleaning_stuck_after_seconds, digest), moved
    deadline = time.monotonic() + settings.ready_wait_seconds
    while True:
        reports = await fetch_reports(storage, settings.status_url_template, every_node,
                                      settings.http_timeout_seconds)
        observation = observe(topic.topic_name, topic.key, owners, storage, reports,
                              settings.cleaning_stuck_after_seconds, digest)
        if observation.ready.status or time.monotonic() >= deadline:
            return topic, observation, moved
        await asyncio.sleep(_POLL_SECONDS)


def _report_lost(ctx: Context, lost: list[Mapping[str, Any]], restore: Restore, logger: Any) -> None:
    """Say loudly that keys went missing (someone emptied, deleted or edited the ConfigMap): each key once."""
    keys = {configmap_key(b["metadata"]["namespace"], b["metadata"]["name"]): b for b in lost}
    if restore.texts:
        logger.warning("%s had lost the keys of %d applied Topic(s) (emptied, deleted or edited by hand): wrote "
                       "back %s from the Topics in one write", ctx.configmap.ref, len(restore.texts),
                       ", ".join(sorted(restore.texts)))
        ctx.metrics.manifests_restored.inc(len(restore.texts))
    for key in sorted(restore.texts):
        message = (f"{key} was missing from {ctx.configmap.ref} (emptied, deleted or edited by hand) and was "
                   "written back from this Topic; only deleting the Topic deletes the topic")
        if key in restore.fallback:
            message = (f"{key} was missing from {ctx.configmap.ref} (emptied, deleted or edited by hand) and was "
                       "written back at this Topic's last applied spec (status.appliedSpec), since its current spec "
                       f"is refused: {restore.fallback[key]}. Only deleting the Topic deletes the topic")
            logger.warning("%s", message)
        kopf.warn(dict(keys[key]), reason="ManifestRestored", message=message)
    for key in set(ctx.unrestorable) - set(restore.refused):  # written back, deleted, or put back by hand
        del ctx.unrestorable[key]
    for key, why in sorted(restore.refused.items()):
        if ctx.unrestorable.get(key) == why:
            continue
        ctx.unrestorable[key] = why
        message = (f"{key} is missing from {ctx.configmap.ref} (emptied, deleted or edited by hand) and cannot be "
                   f"written back now: {why}. It is written back once the Topic can be applied; meanwhile the pods "
                   "hold the topic if its manifest vanished with all the others")
        logger.error("%s", message)
        kopf.warn(dict(keys[key]), reason="ManifestLost", message=message)


async def remove(ctx: Context, body: kopf.Body, logger: Any) -> None:
    """Remove the Topic's key (the pods then delete the topic Kafka's way); never blocks on missing storage."""
    meta = body["metadata"]
    namespace, name, uid = meta["namespace"], meta["name"], meta.get("uid")
    annotations = meta.get("annotations") or {}
    async with ctx.topic_locks[uid]:  # waits for a refresh in flight, which then sees `deleted`
        ctx.deleted.add(uid)
        await _remove_key(ctx, namespace, name, uid, annotations, logger)
    ctx.topic_locks.pop(uid, None)
    ctx.metrics.forget(namespace, name)


async def _remove_key(ctx: Context, namespace: str, name: str, uid: str | None, annotations: Mapping[str, str],
                      logger: Any) -> None:
    if annotations.get(MANAGED_ANNOTATION) == "false" or annotations.get(PAUSE_ANNOTATION) == "true":
        logger.info("Topic %s/%s is unmanaged or paused: its topic and data are kept", namespace, name)
        return
    key = configmap_key(namespace, name)

    def compute(snapshot: Snapshot) -> dict[str, str | None]:
        text = snapshot.data.get(key)
        if text is None:
            return {}
        applied = parse_applied(key, text)
        if applied is not None and applied.uid not in (None, uid):
            logger.info("%s in %s belongs to another Topic (uid %s): left in place", key, ctx.configmap.ref,
                        applied.uid)
            return {}
        return {key: None}

    try:
        async with ctx.configmap_lock:
            await asyncio.to_thread(ctx.configmap.update, compute)
    except ConflictError as exc:
        raise kopf.TemporaryError(str(exc), delay=2) from None
    logger.info("Topic %s/%s: removed %s from %s", namespace, name, key, ctx.configmap.ref)


def build_registry(settings: Settings) -> kopf.OperatorRegistry:
    """The handlers, registered for this run's settings (the timer interval is one)."""
    registry = kopf.OperatorRegistry()
    resource = (GROUP, VERSION, PLURAL)

    @kopf.on.login(id="login", registry=registry)
    def login(memo: kopf.Memo, **_: Any) -> kopf.ConnectionInfo:
        return connection_info(memo.ctx.api.configuration)

    @kopf.on.startup(id="discovery", registry=registry)
    async def wait_for_discovery(memo: kopf.Memo, logger: Any, **_: Any) -> None:
        await wait_for_resources(lister(memo.ctx.api, GROUP, VERSION), (PLURAL, USERS_PLURAL), f"{GROUP}/{VERSION}",
                                 logger)

    @kopf.on.startup(id="metrics-start", registry=registry)
    async def start_metrics(memo: kopf.Memo, logger: Any, **_: Any) -> None:
        if settings.metrics_port is not None:
            await memo.ctx.metrics.start(settings.metrics_host, settings.metrics_port)
            logger.info("metrics on http://%s:%d/metrics", settings.metrics_host, settings.metrics_port)

    @kopf.on.cleanup(id="metrics-stop", registry=registry)
    async def stop_metrics(memo: kopf.Memo, **_: Any) -> None:
        await memo.ctx.metrics.stop()

    @kopf.on.startup(id="scale-start", registry=registry)
    async def start_scaling(memo: kopf.Memo, **_: Any) -> None:
        ctx = memo.ctx
        ctx.scaler = asyncio.create_task(scale_loop(settings, ctx.api, ctx.configmap, ctx.metrics, ctx.reports))

    @kopf.on.cleanup(id="scale-stop", registry=registry)
    async def stop_scaling(memo: kopf.Memo, **_: Any) -> None:
        if memo.ctx.scaler is not None:
            memo.ctx.scaler.cancel()

    @kopf.on.probe(id="topics", registry=registry)
    def topics_probe(memo: kopf.Memo, **_: Any) -> int:
        return len(memo.ctx.topic_locks)

    @kopf.index(*resource, id="topic_bodies", registry=registry)
    def topic_bodies(body: kopf.Body, **_: Any) -> dict[str, Any]:
        # Every Topic, for writing back lost keys; kopf fills the index from its initial list before
        # any handler runs, so a restarted operator knows them all at once.
        meta = body["metadata"]
        return {configmap_key(meta["namespace"], meta["name"]): copy.deepcopy(dict(body))}

    @kopf.on.create(*resource, id="apply-create", registry=registry)
    @kopf.on.update(*resource, id="apply-update", registry=registry)
    @kopf.on.resume(*resource, id="apply-resume", registry=registry)
    async def apply(body: kopf.Body, patch: kopf.Patch, memo: kopf.Memo, logger: Any,
                    topic_bodies: kopf.Index, **_: Any) -> None:
        await reconcile(memo.ctx, body, patch, logger, wait=True, topics=topic_bodies)

    @kopf.timer(*resource, id="refresh", interval=settings.status_interval_seconds,
                initial_delay=settings.status_interval_seconds, registry=registry)
    async def refresh(body: kopf.Body, patch: kopf.Patch, memo: kopf.Memo, logger: Any,
                      topic_bodies: kopf.Index, stopped: kopf.DaemonStopped, **_: Any) -> None:
        await run_until_stopped(reconcile(memo.ctx, body, patch, logger, wait=False, topics=topic_bodies), stopped)

    @kopf.on.delete(*resource, id="remove", registry=registry)
    async def delete(body: kopf.Body, memo: kopf.Memo, logger: Any, **_: Any) -> None:
        await remove(memo.ctx, body, logger)

    register_users(registry, settings)
    return registry


def kopf_settings() -> kopf.OperatorSettings:
    """Progress and diff-base in annotations (a strict status schema would prune kopf's status fields)."""
    s = kopf.OperatorSettings()
    s.persistence.finalizer = FINALIZER
    s.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=GROUP)
    s.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(prefix=GROUP, key="last-handled-configuration")
    # Events for problems only: the Warnings reconcile posts and kopf's own for failed handlers (log lines
    # are not posted: kopf's default, `posting.loggers` False).
    s.posting.level = logging.WARNING
    s.scanning.disabled = True  # the CRD comes with the chart; no cluster-wide CRD/namespace watching needed
    # Watches end on the server's side every minute and are listed again: a watch that an API server or
    # etcd restart left open but silent (seen in tests/apiserver/test_apiserver_restart.py) then heals
    # within a minute instead of kopf's 70 s inactivity timeout after the next event that never comes.
    s.watching.server_timeout = 60
    s.watching.client_timeout = 90
    return s
