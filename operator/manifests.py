"""A `Topic` custom resource → the manifest the storage pods read, and the ConfigMap keys that hold them.

The manifest is what `shale serve --topics` parses (sidecar/topics/manifests.py): metadata.uid (the
CR's uid) becomes the Kafka topic id, spec.topicName is always written out, spec.config holds the keys
the user set in Kafka's string form, and spec.assignment places each partition's replicas on pods. Config is
checked with the one topic-config table (`TopicConfig.from_mapping`) so a bad key is reported on the
Topic by name, and every rendered manifest goes through the sidecar's own parser before it is
written, so the operator never writes what the pods would refuse.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import yaml

from shale.sidecar.topic_config import CONFIG_KEYS_BY_NAME, InvalidConfigError, TopicConfig
from shale.sidecar.topics.manifests import ManifestError, parse_topic

from .crd import GROUP, KIND, TOPIC_NAME_MAX, VERSION

API_VERSION = f"{GROUP}/{VERSION}"
_KEY_MAX = 253  # a ConfigMap key is at most 253 characters of [-._a-zA-Z0-9]


class SpecError(ValueError):
    """A Topic spec that cannot be applied; `reason` is the Ready condition's reason."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True)
class DesiredTopic:
    """What a Topic CR asks for, validated."""

    namespace: str
    name: str
    uid: str
    topic_name: str
    partitions: int
    config: dict[str, str]  # the keys the user set, as Kafka strings
    replicas: int | None = None  # spec.replicas (Kafka's replication factor); None: the operator's default

    @property
    def key(self) -> str:
        return configmap_key(self.namespace, self.name)

    @property
    def ref(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def spec(self) -> dict[str, Any]:
        """The spec as written to the pods, config in Kafka's string form: `status.appliedSpec`, read back by
        `last_applied` when the key is lost while the current spec is refused."""
        return {"topicName": self.topic_name, "partitions": self.partitions, "config": dict(self.config)}


@dataclass(frozen=True)
class AppliedTopic:
    """A manifest found in the ConfigMap: who wrote it and where its partitions are."""

    key: str
    namespace: str | None
    name: str | None
    uid: str | None
    topic_name: str | None
    partitions: int
    assignment: tuple[tuple[int, ...], ...] | None  # each partition's replicas, the preferred leader first
    manifest: dict[str, Any]

    @property
    def ref(self) -> str:
        return f"{self.namespace}/{self.name}"


# A key beside the Topics' that declares nothing (a YAML comment). The pods take the vanishing of every
# manifest file for a lost volume and delete nothing (sidecar/topics/manifests.py); with this file
# still there, removing the last Topic's key is an explicit deletion like any other. No '_' in it, so
# it is never a Topic's key.
PLACEHOLDER_KEY = "shale-operator.yaml"
PLACEHOLDER_TEXT = ("# Written by the Shale operator; declares no topic. While it is here, removing the last Topic's\n"
                    "# key deletes that topic on the pods. Do not edit this ConfigMap by hand: delete a Topic to\n"
                    "# delete its topic (docs/operator.md).\n")


def configmap_key(namespace: str, name: str) -> str:
    """`<namespace>_<name>.yaml`: '_' is in neither a namespace nor an object name, so keys never collide."""
    key = f"{namespace}_{name}.yaml"
    if len(key) <= _KEY_MAX:
        return key
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    return f"{key[:_KEY_MAX - len(digest) - 6]}-{digest}.yaml"


def desired_topic(body: Mapping[str, Any]) -> DesiredTopic:
    """Read and check a Topic CR; SpecError(reason, message naming the field) when it cannot be applied."""
    meta = body.get("metadata") or {}
    spec = body.get("spec") or {}
    namespace, name = meta.get("namespace") or "default", meta.get("name")
    topic_name = spec.get("topicName") or name
    if not isinstance(topic_name, str) or not topic_name:
        raise SpecError("InvalidSpec", "spec.topicName must be a non-empty string")
    if len(topic_name) > TOPIC_NAME_MAX:
        raise SpecError("InvalidSpec", f"topic name {topic_name!r} is longer than {TOPIC_NAME_MAX} characters: "
                                       "set a shorter spec.topicName")
    partitions = spec.get("partitions", 1)
    if not isinstance(partitions, int) or isinstance(partitions, bool) or partitions < 1:
        raise SpecError("InvalidSpec", f"spec.partitions must be an integer >= 1, got {partitions!r}")
    raw_config = spec.get("config") or {}
    if not isinstance(raw_config, Mapping):
        raise SpecError("InvalidConfig", "spec.config must be a mapping of Kafka topic config names to values")
    try:
        parsed = TopicConfig.from_mapping(raw_config)
    except InvalidConfigError as exc:
        raise SpecError("InvalidConfig", f"spec.config.{exc.key}: {exc}") from None
    config = {key: CONFIG_KEYS_BY_NAME[key].to_string(parsed.value_of(key)) for key in raw_config}
    replicas = spec.get("replicas")
    if replicas is not None and (not isinstance(replicas, int) or isinstance(replicas, bool) or replicas < 1):
        raise SpecError("InvalidSpec", f"spec.replicas must be an integer >= 1, got {replicas!r}")
    return DesiredTopic(namespace, name, str(meta.get("uid") or ""), topic_name, partitions, config, replicas)


def last_applied(body: Mapping[str, Any]) -> DesiredTopic | None:
    """The Topic at the spec the operator last wrote for it (`status.appliedSpec`); None if it never wrote one.

    SpecError if that spec no longer passes `desired_topic` (e.g. a config rule tightened since).
    """
    spec = (body.get("status") or {}).get("appliedSpec")
    return desired_topic({**body, "spec": spec}) if isinstance(spec, Mapping) else None


def render(topic: DesiredTopic, assignment: Sequence[tuple[int, ...]], nodes: Mapping[int, str]) -> dict[str, Any]:
    """The manifest for the storage pods; SpecError("InvalidSpec") if their parser would refuse it.

    Partitions of one replica each are written as plain node ids, as before replication, so the manifests
    (and the digests the pods report) of single-replica topics stay what they were.
    """
    single = all(len(replicas) == 1 for replicas in assignment)
    partitions = [replicas[0] if single else list(replicas) for replicas in assignment]
    manifest = {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": topic.name, "namespace": topic.namespace, "uid": topic.uid},
        "spec": {
            "topicName": topic.topic_name,
            "partitions": topic.partitions,
            "config": dict(topic.config),
            "assignment": {"partitions": partitions, "nodes": {str(n): nodes[n] for n in sorted(nodes)}},
        },
    }
    try:
        parse_topic(manifest, origin=f"Topic {topic.ref}")
    except ManifestError as exc:
        raise SpecError("InvalidSpec", str(exc)) from None
    return manifest


def to_yaml(manifest: Mapping[str, Any]) -> str:
    return yaml.safe_dump(dict(manifest), sort_keys=False, default_flow_style=False)


def loaded_digest(text: str) -> str:
    """The `spec_digest` a pod's /status shows once it has loaded this manifest text.

    The pods' own parser and `TopicSpec.digest` run on the very text they will read, so the operator
    and the pods agree on the value without sharing anything but the code.
    """
    return parse_topic(yaml.safe_load(text), origin="operator").digest


def parse_applied(key: str, text: str) -> AppliedTopic | None:
    """The manifest under a ConfigMap key, or None if it is not one of ours (not YAML, not a Topic)."""
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError:
        return None
    if not isinstance(doc, dict) or doc.get("kind") != KIND or not isinstance(doc.get("spec"), dict):
        return None
    meta = doc.get("metadata") if isinstance(doc.get("metadata"), dict) else {}
    spec = doc["spec"]
    assignment = (spec.get("assignment") or {}).get("partitions") if isinstance(spec.get("assignment"), dict) else None
    partitions = spec.get("partitions", 1)
    return AppliedTopic(
        key=key, namespace=meta.get("namespace"), name=meta.get("name"), uid=meta.get("uid"),
        topic_name=spec.get("topicName") or meta.get("name"),
        partitions=partitions if isinstance(partitions, int) else 0,
        assignment=_replica_sets(assignment), manifest=doc)


def _replica_sets(raw: Any) -> tuple[tuple[int, ...], ...] | None:
    """`spec.assignment.partitions` as replica tuples: a node id per partition (one replica) or a list each."""
    if not isinstance(raw, list):
        return None
    out = []
    for entry in raw:
        replicas = [entry] if isinstance(entry, int) else entry
        if not isinstance(replicas, list) or not replicas or not all(
                isinstance(n, int) and not isinstance(n, bool) for n in replicas):
            return None
        out.append(tuple(replicas))
    return tuple(out)
