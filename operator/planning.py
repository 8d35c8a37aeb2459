"""Decide what a Topic's ConfigMap key should hold, from the ConfigMap as read and what the pods hold.

Pure, so every rule is tested without a cluster: one Topic per Kafka topic name (a second one is a
ResourceConflict, as in Strimzi), no decrease of partitions and no change of topicName (NotSupported),
existing partitions stay where they are (from the applied manifest, else from the logs the pods
report), new ones go to the least loaded pods. With replication (the pods report partition records), replicas
also move between pods — to follow spec.replicas, onto pods added and off pods being drained — by the rules
of moves.py, a few partitions at a time. `plan_restore` writes back, together, the keys of
Topics that were applied but are missing from the ConfigMap (emptied, deleted or edited by hand),
each at its current spec or, if that is refused, at the spec last applied (`status.appliedSpec`):
the Topics are the source of truth, and a missing key is never taken as a deletion.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping, NamedTuple, Sequence

from .assignment import Replicas, assign, load_of
from .crd import MANAGED_ANNOTATION, PAUSE_ANNOTATION, TOPIC_NAME_CHANGE_MESSAGE
from .manifests import (
    AppliedTopic,
    DesiredTopic,
    SpecError,
    configmap_key,
    desired_topic,
    last_applied,
    parse_applied,
    render,
    to_yaml,
)
from .moves import Progress, goal, step
from .storage import Storage, StorageError


@dataclass(frozen=True)
class Moves:
    """What moving replicas needs from the pods: each partition's record (None: not read yet) and the cap."""

    progress: Mapping[int, Progress | None]
    max_moves: int = 2


class Planned(NamedTuple):
    text: str  # the manifest for the Topic's key
    owners: list[Replicas]  # each partition's replicas in it
    target: list[Replicas]  # where each partition is headed (owners, unless moves wait their turn)


def applied_topics(data: Mapping[str, str]) -> dict[str, AppliedTopic]:
    """The Topic manifests among a ConfigMap's keys (other keys are left alone)."""
    out = {}
    for key, text in data.items():
        applied = parse_applied(key, text)
        if applied is not None:
            out[key] = applied
    return out


def plan(topic: DesiredTopic, data: Mapping[str, str], storage: Storage, address_template: str,
         found: Mapping[int, tuple[int, ...]], default_replicas: int = 1, moves: Moves | None = None) -> Planned:
    """The text for `topic.key`, its assignment and target; SpecError if the spec cannot be applied as it is.

    found: partition → the node ids whose pods already hold its logs (from their /status).
    default_replicas: the replication factor of a Topic without spec.replicas.
    moves: given when the topic's partitions can move (replication): placed replicas then follow
    spec.replicas and the pods (moves.goal), `moves.max_moves` partitions at a time; None: they stay.
    """
    applied = applied_topics(data)
    mine = applied.get(topic.key)
    for key, other in sorted(applied.items()):
        if key != topic.key and other.topic_name == topic.topic_name:
            raise SpecError("ResourceConflict", f"topic {topic.topic_name} is managed by Topic {other.ref} "
                                                f"({key} in the topics ConfigMap)")
    if mine is not None and mine.topic_name != topic.topic_name:
        raise _name_change(mine.topic_name, topic)
    held = max([mine.partitions if mine is not None else 0] + [p + 1 for p in found])
    if topic.partitions < held:
        raise SpecError("NotSupported", f"spec.partitions cannot be decreased from {held} to {topic.partitions}: "
                                        "Kafka cannot remove partitions")
    previous: list[tuple[int, ...] | None] = list(mine.assignment) if mine is not None and mine.assignment else []
    previous += [found.get(p) for p in range(len(previous), topic.partitions)]
    load, leaders = load_of(a.assignment for k, a in applied.items() if k != topic.key and a.assignment)
    # As Kafka's CreatePartitions: new partitions get the replication factor the topic has. Changing it for
    # existing partitions is a reassignment: only with `moves`, where spec.replicas is the replication factor.
    existing = next((len(replicas) for replicas in previous if replicas), None)
    factor = (topic.replicas or existing or default_replicas) if moves is not None else (
        existing or topic.replicas or default_replicas)
    try:
        owners = assign(topic.partitions, factor, previous, storage.nodes, load, leaders, storage.zones)
    except ValueError as exc:  # no pod to place new partitions on (replicas: 0)
        raise StorageError(f"StatefulSet {storage.namespace}/{storage.statefulset}: {exc}") from None
    target = owners
    if moves is not None and storage.nodes:
        current_leaders = {p: r.leader for p, r in moves.progress.items() if r is not None and r.leader is not None}
        target = goal(owners, factor, storage.nodes, storage.zones, current_leaders)
        records = [moves.progress.get(p) for p in range(len(previous))]
        settled = [replicas is not None and record is not None and record.settled_at(replicas)
                   for replicas, record in zip(previous, records)]
        owners = step(previous, target, settled, moves.max_moves)
    placed = {node for replicas in owners for node in replicas}
    written = ((mine.manifest["spec"].get("assignment") or {}).get("nodes") or {}) if mine is not None else {}
    addresses = {node: _address(storage, address_template, node, written)
                 for node in sorted(set(storage.nodes) | placed)}
    manifest = render(topic, owners, addresses)
    if mine is not None and mine.manifest == manifest:
        return Planned(data[topic.key], owners, target)
    return Planned(to_yaml(manifest), owners, target)


def _address(storage: Storage, template: str, node: int, written: Mapping[str, str]) -> str:
    """Node `node`'s address; the one written before while its pod is gone (a restart, a scale-in held back),
    so a missing pod does not stop the topic from being reconciled — only a new node needs its pod."""
    try:
        return storage.render(template, node)
    except StorageError:
        if isinstance(written.get(str(node)), str):
            return written[str(node)]
        raise


def _name_change(applied: str | None, topic: DesiredTopic) -> SpecError:
    return SpecError("NotSupported", f"{TOPIC_NAME_CHANGE_MESSAGE} (applied {applied!r}, spec {topic.topic_name!r})")


def _current(body: Mapping[str, Any]) -> DesiredTopic:
    """The Topic at its current spec; a lost key took the applied name with it, so check the status's."""
    topic = desired_topic(body)
    applied = (body.get("status") or {}).get("topicName")
    if applied and applied != topic.topic_name:
        raise _name_change(applied, topic)
    return topic


def lost_topics(bodies: Sequence[Mapping[str, Any]], data: Mapping[str, str],
                deleted: set[str]) -> list[Mapping[str, Any]]:
    """The Topic bodies that were applied but whose key `data` lacks (deleted: uids whose key was removed).

    Applied = `status.topicName` set, which only a successful apply does; a Topic never applied is
    written by its own handler. Deleted, paused and unmanaged Topics are not the operator's to write.
    """
    out = []
    for body in bodies:
        meta = body["metadata"]
        annotations = meta.get("annotations") or {}
        if (configmap_key(meta["namespace"], meta["name"]) in data or meta.get("deletionTimestamp")
                or meta.get("uid") in deleted or annotations.get(PAUSE_ANNOTATION) == "true"
                or annotations.get(MANAGED_ANNOTATION) == "false" or not (body.get("status") or {}).get("topicName")):
            continue
        out.append(body)
    return out


@dataclass(frozen=True)
class Restore:
    """What writing back lost keys comes to: the texts to write, and the keys not written at the current spec."""

    texts: dict[str, str]
    fallback: dict[str, str]  # key → why its Topic's current spec is refused: written at status.appliedSpec
    refused: dict[str, str]  # key → why it cannot be written back: refused now and no applied spec to fall back on


def plan_restore(lost: Sequence[Mapping[str, Any]], data: Mapping[str, str], storage: Storage, address_template: str,
                 found_of: Callable[[str], Mapping[int, tuple[int, ...]]], default_replicas: int = 1) -> Restore:
    """The texts that write back the keys of the `lost` Topic bodies, planned one after another.

    Partitions stay where the pods' logs are (`found_of(topic name)`): a lost key's placements can
    only come from there. A Topic whose current spec is refused is written back at the spec last
    applied (`status.appliedSpec`): leaving its key out of a set that comes back would read, to pods
    that only see the final state (a kubelet syncs a volume about once a minute), as removing that
    one manifest — an explicit deletion of the topic and its data. Only a Topic with no applied spec
    to fall back on is refused, and waits for a good spec.
    """
    working, restore = dict(data), Restore({}, {}, {})

    def planned(topic: DesiredTopic) -> str:
        return plan(topic, working, storage, address_template, found_of(topic.topic_name), default_replicas)[0]

    for body in sorted(lost, key=lambda b: configmap_key(b["metadata"]["namespace"], b["metadata"]["name"])):
        key = configmap_key(body["metadata"]["namespace"], body["metadata"]["name"])
        try:
            text = planned(_current(body))
        except (SpecError, StorageError) as exc:
            try:
                applied = last_applied(body)
                if applied is None:
                    restore.refused[key] = str(exc)
                    continue
                text = planned(applied)
            except (SpecError, StorageError) as again:
                restore.refused[key] = f"{exc}; its last applied spec (status.appliedSpec) is refused too: {again}"
                continue
            restore.fallback[key] = str(exc)
        working[key] = restore.texts[key] = text
    return restore
