"""The storage pods' `/status` → a Topic's status: partitions, offsets, bytes, cleaning, Ready, CleaningStuck.

`fetch_reports` reads every pod's `/status` (docs/metrics.md, shape version 1) concurrently; `observe`
is pure. A partition counts as served when the pods it is assigned to list it with `served: true`
and, when replicated, one of them reports itself its leader (a partition nobody leads takes no writes);
Ready needs all of them, no refusal of the topic's manifest by any pod, and every pod reporting the
`spec_digest` of the manifest last written — served partitions alone could still run an older config.
Durations come from the pods' own `seconds_in_state`, so clock skew between the operator and the pods
cannot fake a stuck partition.
"""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Mapping, Sequence

import aiohttp

from .conditions import CLEANING_STUCK, READY, Condition, rfc3339
from .storage import Storage, StorageError

STUCK_STATES = {"paused": "CleaningPaused", "uncleanable": "PartitionUncleanable"}


@dataclass(frozen=True)
class NodeReport:
    """One pod's /status document, or why there is none."""

    ordinal: int
    pod: str
    document: Mapping[str, Any] | None = None
    error: str | None = None


@dataclass(frozen=True)
class Observation:
    partitions: list[dict[str, Any]]
    disk_usage_bytes: int
    ready: Condition
    cleaning_stuck: Condition


class ReportCache:
    """Recent /status answers by URL, shared by the Topics' periodic refreshes.

    Every Topic's timer needs every pod's /status, which lists all topics; without sharing, N Topics
    would fetch it N times per interval. A report younger than `max_age` is reused, and one fetch per
    URL runs at a time (the others wait for it). Change handlers do not use it: they need fresh answers.
    """

    def __init__(self, max_age: float) -> None:
        self.max_age = max_age
        self._entries: dict[str, tuple[float, NodeReport]] = {}
        self._locks: dict[str, asyncio.Lock] = {}

    async def get(self, url: str, fetch: Callable[[], Awaitable[NodeReport]]) -> NodeReport:
        async with self._locks.setdefault(url, asyncio.Lock()):
            entry = self._entries.get(url)
            if entry is not None and time.monotonic() - entry[0] < self.max_age:
                return entry[1]
            report = await fetch()
            self._entries[url] = (time.monotonic(), report)
            return report


async def fetch_reports(storage: Storage, url_template: str, ordinals: set[int], timeout: float,
                        cache: ReportCache | None = None) -> dict[int, NodeReport]:
    """GET /status of the pods with these ordinals; a pod that cannot be asked gets a report with an error."""
    async def fetch(session: aiohttp.ClientSession, ordinal: int, pod: str, url: str) -> NodeReport:
        try:
            async with session.get(url) as response:
                if response.status != 200:
                    return NodeReport(ordinal, pod, error=f"GET {url}: HTTP {response.status}")
                return NodeReport(ordinal, pod, document=await response.json())
        except (aiohttp.ClientError, asyncio.TimeoutError, ValueError) as exc:
            return NodeReport(ordinal, pod, error=f"GET {url}: {exc or type(exc).__name__}")

    async def one(session: aiohttp.ClientSession, ordinal: int) -> NodeReport:
        pod = storage.pod_name(ordinal)
        try:
            url = storage.render(url_template, ordinal)
        except StorageError as exc:
            return NodeReport(ordinal, pod, error=str(exc))
        if cache is None:
            return await fetch(session, ordinal, pod, url)
        report = await cache.get(url, lambda: fetch(session, ordinal, pod, url))
        return report if report.ordinal == ordinal else NodeReport(ordinal, pod, report.document, report.error)

    client_timeout = aiohttp.ClientTimeout(total=timeout)
    async with aiohttp.ClientSession(timeout=client_timeout) as session:
        reports = await asyncio.gather(*(one(session, o) for o in sorted(ordinals)))
    return {r.ordinal: r for r in reports}


def partitions_of(report: NodeReport, topic: str) -> list[Mapping[str, Any]]:
    topics = (report.document or {}).get("topics") or {}
    return list((topics.get(topic) or {}).get("partitions") or [])


def placements(topic: str, reports: Mapping[int, NodeReport]) -> dict[int, tuple[int, ...]]:
    """partition → the nodes holding a log of it (served or stray), lowest ordinal first: its replicas."""
    seen: dict[int, set[int]] = {}
    for ordinal, report in reports.items():
        for entry in partitions_of(report, topic):
            seen.setdefault(entry["partition"], set()).add(ordinal)
    return {p: tuple(sorted(nodes)) for p, nodes in seen.items()}


# /status's replica roles (docs/metrics.md) in the Topic's words (the CRD's `role`): "none" is a replica that knows
# of no valid leader — the partition is offline as far as it can tell.
_ROLES = {"leader": "leader", "follower": "follower", "none": "offline"}


def _partition_status(entry: Mapping[str, Any], pod: str) -> dict[str, Any]:
    cleaning = entry.get("cleaning") or {}
    replica = entry.get("replica") or {}  # replicated topics: this copy's role, ISR membership and lag
    role = _ROLES.get(replica.get("role"), replica.get("role"))
    lag = 0 if role == "leader" else replica.get("lag")  # the leader is its own reference
    out: dict[str, Any] = {"partition": entry["partition"], "pod": pod, "role": role,
                           "inSync": replica.get("in_sync"), "lag": lag,
                           "logStartOffset": entry.get("log_start_offset"), "logEndOffset": entry.get("log_end_offset"),
                           "sizeBytes": entry.get("size_bytes"), "cleaningState": cleaning.get("state")}
    if cleaning.get("since_ms") is not None:
        out["cleaningSince"] = rfc3339(cleaning["since_ms"] / 1000)
    if entry.get("dirty_ratio") is not None:
        out["dirtyRatio"] = entry["dirty_ratio"]
    if entry.get("last_clean_ms") is not None:
        out["lastCleaned"] = rfc3339(entry["last_clean_ms"] / 1000)
    return {k: v for k, v in out.items() if v is not None}


def refusals(topic: str, key: str, reports: Mapping[int, NodeReport]) -> list[str]:
    """Messages of pods that refused the topic's manifest or a change to the topic."""
    out = []
    for report in reports.values():
        errors = (report.document or {}).get("errors") or {}
        for source, message in (errors.get("manifests") or {}).items():
            if os.path.basename(source.split(": ", 1)[0]) == key:
                out.append(f"pod {report.pod}: {message}")
        if topic in (errors.get("topics") or {}):
            out.append(f"pod {report.pod}: {errors['topics'][topic]}")
    return out


def _not_loaded(topic: str, digest: str, owners: set[int], reports: Mapping[int, NodeReport]) -> list[str]:
    """Pods whose /status shows another spec of the topic than `digest` (the manifest last written).

    Every pod that answers and is ready counts, owner of a partition or not: each one answers Metadata
    for the topic, so a stale one would send clients to old partitions. Pods that do not answer are
    left out here (their partitions are reported as not served), as are pods still loading their logs
    that hold none of the topic's partitions (the Service sends no clients to them yet).
    """
    out = []
    for ordinal, report in sorted(reports.items()):
        doc = report.document
        if doc is None or (ordinal not in owners and doc.get("ready") is False):
            continue
        loaded = ((doc.get("topics") or {}).get(topic) or {}).get("spec_digest")
        if loaded != digest:
            out.append(f"pod {report.pod} " + (f"has spec {loaded}" if loaded else "does not declare the topic yet"))
    return out


def observe(topic: str, key: str, assignment: Sequence[tuple[int, ...]], storage: Storage,
            reports: Mapping[int, NodeReport], stuck_after_seconds: float, spec_digest: str | None = None) -> Observation:
    """The Topic's status from what the pods report about its partitions' replicas: one entry per replica.

    spec_digest: the digest of the manifest last written (`loaded_digest`); Ready then also needs every
    pod to report it. None: only whether every replica is served.
    """
    partitions: list[dict[str, Any]] = []
    missing: list[str] = []
    stuck: list[tuple[str, str]] = []
    for p, replicas in enumerate(assignment):
        replicated = False
        for node in replicas:
            pod = storage.pod_name(node)
            report = reports.get(node)
            entry = (next((e for e in partitions_of(report, topic) if e.get("partition") == p), None)
                     if report else None)
            if entry is None or not entry.get("served", True):
                partitions.append({"partition": p, "pod": pod})
                why = (f"pod {pod}: {report.error}" if report and report.error else f"pod {pod} does not serve it yet"
                       if node in storage.nodes else f"pod {pod} is beyond the StatefulSet's {storage.replicas} replicas")
                missing.append(f"{p} ({why})")
                continue
            partitions.append(_partition_status(entry, pod))
            replicated = replicated or entry.get("replica") is not None
            cleaning = entry.get("cleaning") or {}
            state, seconds = cleaning.get("state"), cleaning.get("seconds_in_state") or 0.0
            if state in STUCK_STATES and seconds >= stuck_after_seconds:
                detail = (f"pause count {cleaning.get('pause_count')}" if state == "paused"
                          else f"{cleaning.get('uncleanable_reason') or 'cleaning failed'}")
                stuck.append((STUCK_STATES[state], f"partition {p} on pod {pod}: cleaning {state} for {seconds:.0f} s "
                                                   f"(longer than {stuck_after_seconds:g} s; {detail})"))
        entries = [e for e in partitions if e["partition"] == p]
        served = [e for e in entries if "logEndOffset" in e]
        if replicated and len(served) == len(replicas) and not any(e.get("role") == "leader" for e in served):
            roles = ", ".join(f"{e['pod']} {e.get('role')}" for e in served)
            missing.append(f"{p} (no replica leads it: {roles})")
    owners = {node for replicas in assignment for node in replicas}
    refused = refusals(topic, key, reports)
    stale = _not_loaded(topic, spec_digest, owners, reports) if spec_digest else []
    if refused:
        ready = Condition(READY, False, "StorageRefused", "; ".join(refused))
    elif missing:
        ready = Condition(READY, False, "PartitionsNotServed", "partitions not served: " + "; ".join(missing))
    elif stale:
        ready = Condition(READY, False, "SpecNotLoaded",
                          f"the current spec ({spec_digest}) is not loaded yet: " + "; ".join(stale))
    else:
        pods = sorted({storage.pod_name(n) for n in owners})
        loaded = f"; spec {spec_digest} loaded by every pod" if spec_digest else ""
        copies = max(len(replicas) for replicas in assignment)
        each = f" ({copies} replicas each)" if copies > 1 else ""
        ready = Condition(READY, True, "PartitionsServed",
                          f"{len(assignment)} partition(s){each} served by {', '.join(pods)}{loaded}")
    if stuck:
        reasons = sorted({reason for reason, _ in stuck})
        cleaning_stuck = Condition(CLEANING_STUCK, True, reasons[0] if len(reasons) == 1 else "CleaningStuck",
                                   "; ".join(message for _, message in stuck))
    else:
        cleaning_stuck = Condition(CLEANING_STUCK, False, "CleaningProgressing",
                                   f"no partition paused or uncleanable for {stuck_after_seconds:g} s or more")
    disk = sum(int(e.get("sizeBytes") or 0) for e in partitions)
    return Observation(partitions, disk, ready, cleaning_stuck)
