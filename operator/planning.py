"""Decide what a Topic's ConfigMap key should hold, from the ConfigMap as read and what the pods hold.

Pure, so every rule is tested without a cluster: one Topic per Kafka topic name (a second one is a
ResourceConflict, as in Strimzi), no decrease of partitions and no change of topicName (NotSupported),
existing partitions stay where they are (from the applied manifest, else from the logs the pods
report), new ones go to the least loaded pods.
"""

from __future__ import annotations

from typing import Mapping

from shale.operator.assignment import assign, load_of
from shale.operator.crd import TOPIC_NAME_CHANGE_MESSAGE
from shale.operator.manifests import AppliedTopic, DesiredTopic, SpecError, parse_applied, render, to_yaml
from shale.operator.storage import Storage, StorageError


def applied_topics(data: Mapping[str, str]) -> dict[str, AppliedTopic]:
    """The Topic manifests among a ConfigMap's keys (other keys are left alone)."""
    out = {}
    for key, text in data.items():
        applied = parse_applied(key, text)
        if applied is not None:
            out[key] = applied
    return out


def plan(topic: DesiredTopic, data: Mapping[str, str], storage: Storage, address_template: str,
         found: Mapping[int, int]) -> tuple[str, list[int]]:
    """The text for `topic.key` and its assignment; SpecError if the spec cannot be applied as it is.

    found: partition → node id, for partitions whose logs the pods already hold (from their /status).
    """
    applied = applied_topics(data)
    mine = applied.get(topic.key)
    for key, other in sorted(applied.items()):
        if key != topic.key and other.topic_name == topic.topic_name:
            raise SpecError("ResourceConflict", f"topic {topic.topic_name} is managed by Topic {other.ref} "
                                                f"({key} in the topics ConfigMap)")
    if mine is not None and mine.topic_name != topic.topic_name:
        raise SpecError("NotSupported", f"{TOPIC_NAME_CHANGE_MESSAGE} (applied {mine.topic_name!r}, "
                                        f"spec {topic.topic_name!r})")
    held = max([mine.partitions if mine is not None else 0] + [p + 1 for p in found])
    if topic.partitions < held:
        raise SpecError("NotSupported", f"spec.partitions cannot be decreased from {held} to {topic.partitions}: "
                                        "Kafka cannot remove partitions")
    previous: list[int | None] = list(mine.assignment) if mine is not None and mine.assignment else []
    previous += [found.get(p) for p in range(len(previous), topic.partitions)]
    load = load_of(a.assignment for k, a in applied.items() if k != topic.key and a.assignment)
    try:
        owners = assign(topic.partitions, previous, storage.nodes, load)
    except ValueError as exc:  # no pod to place new partitions on (replicas: 0)
        raise StorageError(f"StatefulSet {storage.namespace}/{storage.statefulset}: {exc}") from None
    addresses = {node: storage.render(address_template, node) for node in sorted(set(storage.nodes) | set(owners))}
    manifest = render(topic, owners, addresses)
    if mine is not None and mine.manifest == manifest:
        return data[topic.key], owners
    return to_yaml(manifest), owners
