"""The roll of the storage pods, decided as a pure function of what Kubernetes and the pods' /status show.

The chart sets `updateStrategy: OnDelete` when the operator runs, so a new revision of the pod template
replaces no pod by itself: `next_step` names the one pod to evict next, or why none may go yet, and the
operator's periodic check evicts it. Nothing is stored between checks, so an operator restarted mid-roll
continues where the cluster is. `pdb_max_unavailable` gives the operator-owned PodDisruptionBudget the same
safety figures, so a drain and the roll never take an in-sync replica a partition cannot spare.
docs/day-2-operations.md, sections 3 and 4.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Mapping, Sequence

from .status import NodeReport
from .storage import Storage


@dataclass(frozen=True)
class RollPod:
    """One ordinal of the StatefulSet as the roll sees it; `present` False: no pod exists for it."""

    ordinal: int
    name: str
    present: bool = True
    outdated: bool = False  # its controller-revision-hash is not the StatefulSet's updateRevision
    ready: bool = True
    caught_up: bool = True  # /status read, and in the ISR of every partition it is a replica of
    leads: int = 0  # partitions it leads


@dataclass(frozen=True)
class RollPartition:
    """A replicated partition as its leader (else its most recent reporter) records it."""

    topic: str
    partition: int
    replicas: tuple[int, ...]
    isr: tuple[int, ...]
    min_isr: int  # min.insync.replicas capped by the replication factor

    @property
    def spared(self) -> bool:
        """No roll can keep it writable (replicas ≤ min ISR, e.g. one replica): waiting would never help, so it
        holds neither the roll nor the PDB — otherwise a one-pod install could never be upgraded or drained."""
        return len(self.replicas) <= self.min_isr

    def safe_without(self, ordinal: int) -> bool:
        return self.spared or ordinal not in self.isr or len(self.isr) - 1 >= self.min_isr


@dataclass(frozen=True)
class Done:
    """Every pod runs the StatefulSet's updateRevision."""


@dataclass(frozen=True)
class Wait:
    reason: str


@dataclass(frozen=True)
class Evict:
    pod: str
    reason: str


Step = Done | Wait | Evict


def _unsafe(pod: RollPod, partitions: Iterable[RollPartition]) -> RollPartition | None:
    return next((p for p in partitions if not p.safe_without(pod.ordinal)), None)


def next_step(pods: Sequence[RollPod], partitions: Sequence[RollPartition]) -> Step:
    """The roll's next step, by the rules of docs/day-2-operations.md section 3, in order."""
    outdated = [p for p in pods if p.present and p.outdated]
    if not outdated:
        return Done()
    troubled = [p for p in pods if not (p.present and p.ready and p.caught_up)]
    held = [p for p in troubled if not (p.present and p.outdated and not p.ready)]
    if held:
        pod = held[0]
        why = ("is missing" if not pod.present else "is not Ready" if not pod.ready
               else "is not back in every ISR it is assigned to (or its /status cannot be read)")
        return Wait(f"pod {pod.name} {why}")
    # Rule 2's exception: an outdated pod that is not Ready serves nothing; it goes first.
    candidates = sorted(troubled or outdated, key=lambda p: (p.leads, -p.ordinal))
    blocked = []
    for pod in candidates:
        partition = _unsafe(pod, partitions)
        if partition is None:
            state = "outdated and not Ready" if not pod.ready else "outdated"
            return Evict(pod.name, f"pod {pod.name} is {state}; every partition keeps min.insync.replicas without it")
        blocked.append(f"{pod.name} ({partition.topic}-{partition.partition}: ISR {list(partition.isr)}, "
                       f"min.insync.replicas {partition.min_isr})")
    return Wait("no outdated pod can go without a partition falling below min.insync.replicas: " + "; ".join(blocked))


def pdb_max_unavailable(partitions: Iterable[RollPartition]) -> int:
    """1 while every partition could lose any one in-sync member and keep its min ISR; 0 otherwise (section 4)."""
    return 1 if all(p.spared or len(p.isr) - 1 >= p.min_isr for p in partitions) else 0


def roll_inputs(storage: Storage, reports: Mapping[int, NodeReport]) -> tuple[list[RollPod], list[RollPartition]]:
    """`next_step`'s inputs from the StatefulSet and its pods as read, and their /status reports.

    A partition's record is taken from its leader's report (else the highest leader epoch reported): the
    leader's ISR is the committed one. An unreadable /status counts as not caught up: the roll waits
    rather than guesses."""
    records: dict[tuple[str, int], tuple[bool, int, RollPartition]] = {}
    leads: dict[int, int] = {}
    for ordinal, report in reports.items():
        for topic, body in ((report.document or {}).get("topics") or {}).items():
            for entry in (body or {}).get("partitions") or ():
                replica = entry.get("replica")
                if not replica or not entry.get("served", True):
                    continue
                leader = replica.get("role") == "leader"
                leads[ordinal] = leads.get(ordinal, 0) + leader
                rank = (leader, int(replica.get("leader_epoch") or 0))
                key = (topic, entry["partition"])
                if key not in records or rank > records[key][:2]:
                    replicas_of = tuple(replica.get("replicas") or ())
                    # Unknown (a node older than the field): the strictest a roll can meet, a full ISR.
                    min_isr = int(replica.get("min_isr") or max(1, len(replicas_of) - 1))
                    records[key] = (*rank, RollPartition(topic, entry["partition"], replicas_of,
                                                         tuple(replica.get("isr") or ()), min_isr))
    partitions = [record[2] for _, record in sorted(records.items())]
    pods = []
    for ordinal in sorted(set(range(storage.replicas)) | set(storage.pods)):
        kube = storage.pods.get(ordinal)
        if kube is None:
            pods.append(RollPod(ordinal, storage.pod_name(ordinal), present=False))
            continue
        report = reports.get(ordinal)
        caught_up = (report is not None and report.document is not None
                     and all(ordinal in p.isr for p in partitions if ordinal in p.replicas))
        pods.append(RollPod(ordinal, kube.name, outdated=kube.revision != storage.update_revision, ready=kube.ready,
                            caught_up=caught_up, leads=leads.get(ordinal, 0)))
    return pods, partitions
