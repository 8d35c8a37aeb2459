"""Moving replicas between pods: where each partition's replicas should be, which moves start now, their status.

The operator never touches partition records: it writes each partition's target replicas into the topic's
manifest (`spec.assignment`), and the nodes turn a changed target into Kafka's reassignment (docs/moves.md).
Everything here is pure, so the rules are tested without a cluster:

- `goal`: the replicas each partition should have, from the ones it has. Replicas on pods that are going
  (a scale-in) are dropped; a partition above the replication factor loses replicas from the pods above their
  share of the end result first (then nothing has to move to even it out), a follower before its leader, the
  most loaded pod first; one below gains replicas on the pods holding the fewest, zones it does not use first
  (ties to the lowest ordinal, as `assign`). Then the topic's replicas are evened out over the pods (a
  scale-out): each pod ends with ⌊n/N⌋ or ⌈n/N⌉ of the n replicas, the ⌈n/N⌉ quotas going to the pods
  holding the most already, which moves the fewest replicas; each move takes a replica off the pod furthest
  above its quota — a follower rather than the leader — onto the pod furthest below that the partition does
  not use.
- `step`: which of those changes to write now: one move per partition at a time (a partition whose last
  move has not finished is left alone), at most `max_moves` in flight per topic, new partitions at once
  (they have no data to move).
- `moves_status`: each move as the Topic's status shows it (Strimzi's replicasChange, per partition):
  pending, ongoing, done, failed with the reason; bytes copied and remaining from the replicas' sizes.
- `scale_in_refusal`: why draining pods would lose data (the last in-sync copy on a pod that is down, or a
  topic without replication whose only copy is on a leaving pod).
- `scale_action`: what the operator does to the StatefulSet: a lowered `spec.replicas` that pods above it
  still need is put back and recorded as the scale-in target (Strimzi's scale-down check refuses the same
  way), and the target is applied once those pods hold nothing.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from .conditions import REASSIGNING, Condition

Replicas = tuple[int, ...]

PENDING, ONGOING, DONE, FAILED = "pending", "ongoing", "done", "failed"


@dataclass(frozen=True)
class Progress:
    """A partition's replicas as its record says (a node's /status `replica`): during a move, old and new."""

    replicas: Replicas
    adding: Replicas = ()
    removing: Replicas = ()
    isr: Replicas = ()
    leader: int | None = None

    def settled_at(self, target: Replicas) -> bool:
        """The record holds exactly `target`, with no move in progress."""
        return not self.adding and not self.removing and set(self.replicas) == set(target)


def progress_of(entries: Sequence[Mapping[str, Any]]) -> Progress | None:
    """The record of one partition from the /status entries of the pods holding it (the leader's first)."""
    records = [e.get("replica") for e in sorted(entries, key=lambda e: (e.get("replica") or {}).get("role") != "leader")
               if e.get("served", True) and isinstance(e.get("replica"), Mapping)]
    if not records:
        return None
    r = records[0]
    leader = r.get("leader")
    return Progress(tuple(r.get("replicas") or ()), tuple(r.get("adding_replicas") or ()),
                    tuple(r.get("removing_replicas") or ()), tuple(r.get("isr") or ()),
                    leader if isinstance(leader, int) and leader >= 0 else None)


def goal(current: Sequence[Replicas], replication_factor: int, nodes: Sequence[int],
         zones: Mapping[int, str] | None = None, leaders: Mapping[int, int] | None = None) -> list[Replicas]:
    """The replicas each partition should have: on `nodes` only, `replication_factor` of them (capped by the
    nodes), evened out over the nodes with the fewest moves. leaders: partition → its current leader."""
    zones, leaders = zones or {}, leaders or {}
    allowed = set(nodes)
    width = min(replication_factor, len(nodes))
    placed = [[n for n in replicas if n in allowed] for replicas in current]
    counts = Counter({n: 0 for n in nodes})
    for replicas in placed:
        counts.update(replicas)
    # First every removal, so the additions see the lightened pods. A removal takes a replica from a pod above
    # its share of the end result when it can (no data moves later to even it out), a follower before the
    # leader, then the most loaded pod (ties: the highest ordinal).
    share = quotas(counts, nodes, total=width * len(placed))
    for p, replicas in enumerate(placed):
        while len(replicas) > width:
            leader = leaders.get(p, replicas[0])
            victim = max(replicas, key=lambda n: (counts[n] > share[n], n != leader, counts[n], n))
            replicas.remove(victim)
            counts[victim] -= 1
    for replicas in placed:
        while len(replicas) < width:
            used = {zones.get(n) for n in replicas} - {None}
            chosen = min((n for n in nodes if n not in replicas), key=lambda n: (zones.get(n) in used, counts[n], n))
            replicas.append(chosen)
            counts[chosen] += 1
    _even_out(placed, nodes, counts, zones, leaders)
    return [tuple(replicas) for replicas in placed]


def quotas(counts: Mapping[int, int], nodes: Sequence[int], total: int | None = None) -> dict[int, int]:
    """Each node's share of `total` replicas (default: those counted): ⌈n/N⌉ for the nodes holding the most
    (ties: lowest ordinal), ⌊n/N⌋ for the others — the even spread that moves the fewest replicas."""
    if not nodes:
        return {}
    base, extra = divmod(sum(counts[n] for n in nodes) if total is None else total, len(nodes))
    ranked = sorted(nodes, key=lambda n: (-counts[n], n))
    return {n: base + (1 if i < extra else 0) for i, n in enumerate(ranked)}


def _even_out(placed: list[list[int]], nodes: Sequence[int], counts: Counter, zones: Mapping[int, str],
              leaders: Mapping[int, int]) -> None:
    quota = quotas(counts, nodes)
    while True:
        over = [n for n in nodes if counts[n] > quota[n]]
        if not over:
            return
        source = min(over, key=lambda n: (quota[n] - counts[n], n))
        under = [n for n in nodes if counts[n] < quota[n]]
        best = None
        for p, replicas in enumerate(placed):
            if source not in replicas:
                continue
            others = {zones.get(n) for n in replicas if n != source} - {None}
            for target in under:
                if target in replicas:
                    continue
                rank = (leaders.get(p, replicas[0]) == source, zones.get(target) in others,
                        counts[target] - quota[target], target, p)
                if best is None or rank < best[0]:
                    best = (rank, p, target)
        # A node above its quota holds more of the topic than one below it, so some partition has it and not
        # the other: a move always exists.
        assert best is not None, (placed, quota)
        _, p, target = best
        placed[p][placed[p].index(source)] = target
        counts[source] -= 1
        counts[target] += 1


def step(written: Sequence[Replicas | None], target: Sequence[Replicas], settled: Sequence[bool],
         max_moves: int) -> list[Replicas]:
    """What to write now. written[p]: the partition's replicas in the manifest (None: a new partition);
    settled[p]: its record holds written[p] with no move running. A partition moves only when settled, and
    at most `max_moves` partitions of the topic are in flight; the others keep what is written (pending)."""
    out: list[Replicas] = []
    in_flight = sum(1 for p, w in enumerate(written) if w is not None and not settled[p])
    for p, wanted in enumerate(target):
        current = written[p] if p < len(written) else None
        if current is None:
            out.append(wanted)
        elif current == wanted or not settled[p] or in_flight >= max_moves:
            out.append(current)
        else:
            out.append(wanted)
            in_flight += 1
    return out


def shown_placement(partitions: Sequence[Mapping[str, Any]], statefulset: str) -> dict[int, frozenset[int]]:
    """partition → the pods the Topic's `status.partitions` last showed its replicas on (one entry per replica of
    the manifest then written)."""
    prefix = f"{statefulset}-"
    shown: dict[int, set[int]] = {}
    for entry in partitions:
        pod = str(entry.get("pod") or "")
        if isinstance(entry.get("partition"), int) and pod.startswith(prefix) and pod[len(prefix):].isdigit():
            shown.setdefault(entry["partition"], set()).add(int(pod[len(prefix):]))
    return {p: frozenset(nodes) for p, nodes in shown.items()}


def moves_status(previous: Sequence[Mapping[str, Any]], before: Sequence[Replicas | None],
                 written: Sequence[Replicas], target: Sequence[Replicas], progress: Mapping[int, Progress | None],
                 sizes: Mapping[tuple[int, int], int], failures: Mapping[int, str], now: str,
                 shown: Mapping[int, frozenset[int]] | None = None) -> list[dict[str, Any]]:
    """The Topic's `status.moves`: one entry per partition with a move, kept (done or failed) until its next one.

    previous: the entries shown before; before[p]: what the manifest held before this write (None: new);
    written / target: what it holds now / what the partition should end with; sizes: (partition, node) →
    bytes of that replica; failures: partition → why its move cannot go on; shown: where the status last
    showed each partition's replicas (`shown_placement`). A manifest written by an earlier reconcile whose
    status patch was lost (the API server dropped it) differs from `shown` though not from `before`: its move
    is shown from where the status last had the partition, rather than never.
    """
    old = {e.get("partition"): e for e in previous if isinstance(e, Mapping)}
    out: list[dict[str, Any]] = []
    for p, now_written in enumerate(written):
        prev = old.get(p)
        was = before[p] if p < len(before) else None
        last = (shown or {}).get(p)
        if (was == now_written and last is not None and last != frozenset(now_written)
                and not (prev is not None and prev.get("targetReplicas") == list(now_written))):
            was = tuple(sorted(last))
        state = None
        if was is not None and was != now_written:  # started by this write
            entry = {"partition": p, "fromReplicas": list(was), "targetReplicas": list(now_written), "startedAt": now}
            state = ONGOING
        elif prev is not None and prev.get("targetReplicas") == list(now_written) and prev.get("state") != PENDING:
            entry = dict(prev)
            state = ONGOING
        elif target[p] != now_written and was is not None:
            entry = {"partition": p, "fromReplicas": list(now_written), "targetReplicas": list(target[p])}
            state = PENDING
        elif prev is not None and prev.get("state") in (DONE, FAILED):
            out.append(dict(prev))
            continue
        else:
            continue
        record = progress.get(p)
        if state == ONGOING:
            if p in failures:
                state, entry["message"] = FAILED, failures[p]
            elif record is not None and record.settled_at(now_written):
                state = DONE
                entry.setdefault("finishedAt", now)
            else:
                entry.pop("message", None)
        entry["state"] = state
        entry.update(_bytes(p, entry, record, sizes, state))
        out.append(entry)
    return out


def _bytes(p: int, entry: Mapping[str, Any], record: Progress | None, sizes: Mapping[tuple[int, int], int],
           state: str) -> dict[str, int]:
    """Bytes copied to the replicas the move adds, and still to copy, against the leader's log size."""
    added = [n for n in entry["targetReplicas"] if n not in entry["fromReplicas"]]
    leader = record.leader if record is not None else None
    if leader is None or (p, leader) not in sizes:
        sources = [sizes[(p, n)] for n in entry["fromReplicas"] if (p, n) in sizes]
        full = max(sources, default=0)
    else:
        full = sizes[(p, leader)]
    if state == PENDING:
        return {"bytesCopied": 0, "bytesRemaining": full * len(added)}
    copied = sum(min(sizes.get((p, n), 0), full) for n in added)
    remaining = 0 if state == DONE else sum(max(0, full - sizes.get((p, n), 0)) for n in added)
    return {"bytesCopied": copied, "bytesRemaining": remaining}


def reassigning(moves: Sequence[Mapping[str, Any]]) -> Condition:
    """The `Reassigning` condition: True while a move is pending or ongoing, or failed (it needs a person)."""
    def line(m: Mapping[str, Any]) -> str:
        text = f"partition {m['partition']} {m['fromReplicas']} -> {m['targetReplicas']} {m['state']}"
        if m["state"] == ONGOING:
            text += f" ({m.get('bytesRemaining', 0)} bytes to copy)"
        return text + (f": {m['message']}" if m.get("message") else "")
    open_moves = [m for m in moves if m.get("state") in (PENDING, ONGOING, FAILED)]
    if not open_moves:
        return Condition(REASSIGNING, False, "NoMoves", "no partition is moving between pods")
    reason = "MoveFailed" if any(m["state"] == FAILED for m in open_moves) else "MovesInProgress"
    return Condition(REASSIGNING, True, reason, "; ".join(line(m) for m in open_moves))


def scale_in_refusal(assignment: Sequence[Replicas], leaving: set[int], replicated: bool,
                     progress: Mapping[int, Progress | None], down: set[int]) -> list[str]:
    """Why the pods in `leaving` cannot be drained of this topic's replicas without losing data (empty: they can).

    Without replication (no control store) a replica cannot be copied to another pod; with it, a copy is made
    from an in-sync replica, so a partition whose in-sync replicas are all on leaving pods that are down
    would lose its last in-sync copy.
    """
    out = []
    for p, replicas in enumerate(assignment):
        gone = [n for n in replicas if n in leaving]
        if not gone:
            continue
        if not replicated:
            if all(n in leaving for n in replicas):
                out.append(f"partition {p}: its only copies are on leaving pod(s) {gone} and the topic is not "
                           "replicated (no control store), so they cannot be moved")
            continue
        record = progress.get(p)
        isr = set(record.isr) if record is not None and record.isr else set(replicas)
        if isr and isr <= leaving and isr <= down:
            out.append(f"partition {p}: its in-sync replicas {sorted(isr)} are all on leaving pods that are down; "
                       "draining them would drop the last in-sync copy")
    return out


@dataclass(frozen=True)
class ScaleAction:
    """A change to the StatefulSet: its new spec.replicas and scale-in target (None: leave as is)."""

    replicas: int | None = None
    scale_in_to: int | None = None
    clear_scale_in: bool = False
    message: str = ""


def scale_action(spec_replicas: int, scale_in_to: int | None, held: set[int]) -> ScaleAction | None:
    """What to do to the StatefulSet. held: the pods that topics' manifests name or that serve a partition.

    A spec.replicas below a pod that still holds replicas is put back above it and becomes the scale-in
    target — also when the pod is gone already (scaled in while the operator was down): put back, the
    StatefulSet brings it back on its volume, with its data. A target is applied once no pod at or above it
    holds anything; a target at or above spec.replicas means nothing (done, or cancelled by scaling out) and
    is removed.
    """
    needed = max(held) + 1 if held else 0
    if spec_replicas < needed:
        pods = sorted(n for n in held if n >= spec_replicas)
        return ScaleAction(replicas=needed, scale_in_to=spec_replicas,
                           message=f"spec.replicas lowered to {spec_replicas} while pods {pods} hold replicas: "
                                   f"put back to {needed}; they are drained first, then the StatefulSet is "
                                   f"scaled to {spec_replicas}")
    if scale_in_to is None:
        return None
    if scale_in_to >= spec_replicas:
        return ScaleAction(clear_scale_in=True, message=f"scale-in target {scale_in_to} is not below spec.replicas "
                                                        f"{spec_replicas}: removed")
    if needed <= scale_in_to:
        return ScaleAction(replicas=scale_in_to, clear_scale_in=True,
                           message=f"pods {scale_in_to}..{spec_replicas - 1} hold no replicas: scaled to "
                                   f"{scale_in_to}")
    return None
