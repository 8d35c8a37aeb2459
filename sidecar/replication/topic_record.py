"""The third kind of record the control store holds: a topic created through the Kafka admin API.

Manifests are read by every node from its own `--topics` directory; a topic made by CreateTopics on one node
has no such file, so its declaration lives in the store (etcd `topics/<name>`, a Lease on Kubernetes) and
every node applies it from its view, as it applies a manifest (docs/replication.md, "Topics created through
the API"). The record is Kafka's TopicRecord plus what Kafka keeps in ConfigRecords and the partitions'
replica lists: the assignment is fixed when the topic is created or grown, so no node re-chooses it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Mapping

from ..topic_config import TopicConfig
from ..topics.registry import TopicSpec
from .store_records import RecordError, load_object


@dataclass(frozen=True, slots=True)
class TopicRecord:
    """A topic's name, id (Kafka's base64 text form), config overrides and the replicas of each partition."""

    name: str
    topic_id: str
    assignment: tuple[tuple[int, ...], ...]  # partition -> replicas, preferred leader first
    config: Mapping[str, str] = field(default_factory=dict)  # Kafka names -> string values, overrides only

    def __post_init__(self) -> None:
        if not self.name or not self.topic_id:
            raise RecordError(f"topic record {self.name!r}: needs a name and a topic id")
        if not self.assignment:
            raise RecordError(f"topic record {self.name}: needs at least one partition")
        for partition, replicas in enumerate(self.assignment):
            if not replicas or len(set(replicas)) != len(replicas):
                raise RecordError(f"topic record {self.name}: partition {partition} replicas {list(replicas)} must "
                                  "be distinct node ids, at least one")

    @property
    def partitions(self) -> int:
        return len(self.assignment)

    def spec(self) -> TopicSpec:
        """The spec this record declares; InvalidConfigError for a config this node refuses."""
        return TopicSpec(self.name, self.partitions, TopicConfig.from_mapping(self.config), origin="api",
                         topic_id=self.topic_id, assignment=self.assignment)

    def to_json(self) -> str:
        return json.dumps({"name": self.name, "topic_id": self.topic_id, "partitions": self.partitions,
                           "assignment": [list(r) for r in self.assignment], "config": dict(self.config)},
                          sort_keys=True)

    @classmethod
    def from_json(cls, text: str | bytes, where: str) -> "TopicRecord":
        raw = load_object(text, where)
        try:
            assignment = tuple(tuple(_node_id(n) for n in replicas) for replicas in raw["assignment"])
            config = raw.get("config", {})
            if not isinstance(config, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                                       for k, v in config.items()):
                raise ValueError(f"config {config!r} is not a map of strings")
            if isinstance(raw["partitions"], bool) or raw["partitions"] != len(assignment):
                raise ValueError(f"{raw['partitions']} partitions but {len(assignment)} replica lists")
            if not isinstance(raw["name"], str) or not isinstance(raw["topic_id"], str):
                raise ValueError("name and topic_id must be strings")
            return cls(raw["name"], raw["topic_id"], assignment, dict(config))
        except (KeyError, TypeError, ValueError) as exc:
            raise RecordError(f"{where}: not a topic record ({exc}): {text!r}") from None


def _node_id(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{value!r} is not a node id")
    return value
