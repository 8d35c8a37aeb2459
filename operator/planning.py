"""Decide what a Topic's ConfigMap key should hold, from the ConfigMap as read and what the pods hold.

Pure, so every rule is tested without a cluster: one Topic per Kafka topic name (a second one is a
ResourceConflict, as in Strimzi), no decrease of partitions and no change of topicName (NotSupported),
existing partitions stay where they are (from the applied manifest, else from the logs the pods
report), new ones go to the least loaded pods. `plan_restore` writes back, all together or not at
all, the keys of Topics that were applied but are missing from the ConfigMap (emptied, deleted or
edited by hand): the Topics are the source of truth, and a missing key is never taken as a deletion.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

from shale.operator.assignment import assign, load_of
from shale.operator.crd import TOPIC_NAME_CHANGE_MESSAGE
from shale.operator.manifests import (AppliedTopic, DesiredTopic, SpecError, configmap_key, desired_topic,
                                      parse_applied, render, to_yaml)
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


def plan_restore(lost: Sequence[Mapping[str, Any]], data: Mapping[str, str], storage: Storage, address_template: str,
                 found_of: Callable[[str], Mapping[int, int]]) -> dict[str, str]:
    """The texts that write back the keys of the `lost` Topic bodies, planned one after another.

    Partitions stay where the pods' logs are (`found_of(topic name)`), as a lost key's placements can
    only come from there. All or nothing: if one Topic cannot be planned (its spec is refused now, so
    its last good manifest is gone with the key), StorageError("ManifestsLost") and nothing is
    written — writing back the others would leave that one's key missing beside restored ones, which
    reads as its deletion on the pods, while writing nothing leaves them all as they are.
    """
    working, restored = dict(data), {}
    for body in sorted(lost, key=lambda b: configmap_key(b["metadata"]["namespace"], b["metadata"]["name"])):
        try:
            topic = desired_topic(body)
            text, _ = plan(topic, working, storage, address_template, found_of(topic.topic_name))
        except (SpecError, StorageError) as exc:
            meta = body["metadata"]
            keys = ", ".join(sorted(configmap_key(b["metadata"]["namespace"], b["metadata"]["name"]) for b in lost))
            raise StorageError(f"keys of applied Topics are missing from the topics ConfigMap ({keys}) and none is "
                               f"written back while Topic {meta['namespace']}/{meta['name']} cannot be: {exc}",
                               reason="ManifestsLost") from None
        working[topic.key] = restored[topic.key] = text
    return restored
