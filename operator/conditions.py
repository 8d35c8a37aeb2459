"""Status conditions the Kubernetes way (metav1.Condition): one per type, transition time kept while unchanged.

`lastTransitionTime` moves only when a condition's status flips, so `kubectl wait` and alerts on how
long a Topic has been not Ready see the real duration, however often the operator rewrites the status.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

READY = "Ready"
CLEANING_STUCK = "CleaningStuck"
PAUSED = "ReconciliationPaused"
UNMANAGED = "Unmanaged"
REASSIGNING = "Reassigning"  # replicas moving between pods (docs/moves.md)
SCALE_IN_BLOCKED = "ScaleInBlocked"  # draining the pods of a scale-in would lose this topic's data


@dataclass(frozen=True)
class Condition:
    type: str
    status: bool | None  # None = Unknown
    reason: str
    message: str = ""

    @property
    def status_text(self) -> str:
        return "Unknown" if self.status is None else ("True" if self.status else "False")


def rfc3339(when: datetime.datetime | float) -> str:
    """A time as Kubernetes writes it (UTC, seconds, 'Z'); floats are Unix seconds."""
    if not isinstance(when, datetime.datetime):
        when = datetime.datetime.fromtimestamp(when, datetime.timezone.utc)
    return when.astimezone(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def merge(existing: Iterable[Mapping[str, Any]] | None, updates: Iterable[Condition], *,
          generation: int | None, now: str, drop: Iterable[str] = ()) -> list[dict[str, Any]]:
    """`existing` with each of `updates` set and the types in `drop` removed; order of first appearance."""
    out: dict[str, dict[str, Any]] = {c["type"]: dict(c) for c in existing or () if isinstance(c, Mapping) and "type" in c}
    for cond in updates:
        old = out.get(cond.type)
        changed = old is None or old.get("status") != cond.status_text
        new = {"type": cond.type, "status": cond.status_text, "reason": cond.reason, "message": cond.message,
               "lastTransitionTime": now if changed else old.get("lastTransitionTime", now)}
        if generation is not None:
            new["observedGeneration"] = generation
        out[cond.type] = new
    for kind in drop:
        out.pop(kind, None)
    return list(out.values())


def find(conditions: Iterable[Mapping[str, Any]] | None, kind: str) -> Mapping[str, Any] | None:
    return next((c for c in conditions or () if isinstance(c, Mapping) and c.get("type") == kind), None)
