"""The topics this node serves: their partitions, config, ids and which node leads each partition.

One `TopicRegistry` per process is the server's source of truth for "what exists": the manifest
watcher, CreateTopics/AlterConfigs and the built-in `__consumer_offsets` all change topics through
it, and it applies each change to the `LogDir` (create partition logs, swap a log's config live,
delete Kafka's way). Every mutation happens on the server's event loop; the maintenance threads only
read `LogDir.logs`, which has its own lock.

Partitions of a topic may be spread over several `shale serve` processes: `TopicSpec.assignment`
names the replicas of each partition and `TopicSpec.nodes` their addresses. Without a control store
(`--store`) every partition has one replica: a node keeps logs only for the partitions assigned to
it and answers NOT_LEADER_OR_FOLLOWER for the others, while Metadata sends clients to the right node.
With a store, the partition records in it decide (docs/replication.md): `TopicRegistry.replication`
(the replica manager) says which node leads, which logs are replicas here and which nodes are live,
and creates replica logs through `ensure_log`; topics created through the admin API are topic records in
the store, applied on every node from its view (`apply_store_topics`) as manifests are.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import json
import logging
import os
import uuid
from dataclasses import dataclass, field
from typing import Callable, Iterable, Mapping, Protocol

from ..log.atomic_file import atomic_write
from ..log.log import Log
from ..log.log_dir import LogDir
from ..log.topic_partition import TopicPartition
from ..plural import plural
from ..topic_config import InvalidConfigError, TopicConfig
from .capacity import partitions_refusal

logger = logging.getLogger(__name__)

API_TOPICS_FILE = "shale-api-topics.json"  # topics created through CreateTopics, kept across restarts
_TOPIC_ID_NAMESPACE = uuid.UUID("6f1c3c2e-8a2b-4d0e-9a53-5ad0c0ffee00")


class TopicError(ValueError):
    """A topic change that cannot be applied (e.g. fewer partitions); the message names the topic."""


class CapacityError(TopicError):
    """A topic change refused because this node cannot hold its new partitions (`capacity`); nothing was created."""


@dataclass(frozen=True, slots=True)
class NodeAddress:
    node_id: int
    host: str
    port: int


@dataclass(frozen=True)
class TopicSpec:
    """What a topic should be, wherever it was declared."""

    name: str
    partitions: int
    config: TopicConfig
    origin: str = "manifest"  # the manifest's path, "api" (CreateTopics) or "internal"
    topic_id: str | None = None  # Kafka's text form; None = keep the one on disk or derive one from the name
    # The replicas of each partition, preferred leader first; None = all on this node, or (with a store) chosen
    # from the live nodes by the first replica to create the partition's record.
    assignment: tuple[tuple[int, ...], ...] | None = None
    nodes: Mapping[int, tuple[str, int]] = field(default_factory=dict)  # addresses of the assigned nodes
    internal: bool = False
    replication_factor: int | None = None  # replicas per partition where no assignment names them (`spec.replicas`)

    def node_of(self, partition: int, default: int) -> int:
        """The partition's preferred leader: its node when it has one replica."""
        return default if self.assignment is None else self.assignment[partition][0]

    def replicas_of(self, partition: int) -> tuple[int, ...] | None:
        """The replicas the spec names for a partition, or None when the store's first writer chooses them."""
        return None if self.assignment is None else self.assignment[partition]

    @property
    def replicated(self) -> bool:
        """More than one replica of some partition: only a node with a control store can serve it."""
        return (self.replication_factor or 1) > 1 or any(len(r) > 1 for r in self.assignment or ())

    @functools.cached_property
    def digest(self) -> str:
        """A hash of what the spec declares, not where it came from (`origin`): shown per topic in /status.

        The operator computes it from the manifest it writes, with this same code, and counts a Topic as
        Ready only once every pod reports it: proof that the pods loaded that manifest, not an older one.
        """
        # One-replica partitions keep the plain node ids they had before replication, so that the digest of an
        # unchanged manifest stays the same across an upgrade.
        assignment = None if self.assignment is None else [r[0] if len(r) == 1 else list(r) for r in self.assignment]
        declared = {"name": self.name, "partitions": self.partitions, "config": self.config.as_kafka_strings(),
                    "topic_id": self.topic_id, "assignment": assignment,
                    "nodes": sorted([node, host, port] for node, (host, port) in self.nodes.items())}
        if self.replication_factor is not None:
            declared["replicas"] = self.replication_factor
        return hashlib.sha256(json.dumps(declared, sort_keys=True).encode()).hexdigest()[:16]


def topic_id_for(name: str) -> str:
    """A stable topic id for a topic that brings none: the same on every node that hosts part of it."""
    raw = uuid.uuid5(_TOPIC_ID_NAMESPACE, name).bytes
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


def topic_uuid(topic_id: str) -> uuid.UUID:
    return uuid.UUID(bytes=base64.urlsafe_b64decode(topic_id + "=" * (-len(topic_id) % 4)))


class StoredTopic(Protocol):
    """A topic's record in the control store (replication's TopicRecord), as the registry applies it."""

    name: str

    def spec(self) -> TopicSpec:
        """The spec the record declares; InvalidConfigError for a config this node refuses."""


class Replication(Protocol):
    """What the registry asks the replica manager when the node has a control store (`--store`)."""

    def leader_id(self, tp: TopicPartition) -> int:
        """The node the partition's record names leader; -1 when it has no leader (offline, or no record yet)."""

    def leader_log(self, tp: TopicPartition) -> Log | None:
        """The partition's log if this node leads it now (with a valid session), else None."""

    def is_replica(self, tp: TopicPartition) -> bool:
        """The partition's record names this node among its replicas."""

    def live_nodes(self) -> Mapping[int, NodeAddress]:
        """The nodes with a live session, this one included: Metadata's brokers."""


class TopicRegistry:
    """Topics, their partition leaders, and the logs of the partitions hosted here."""

    def __init__(self, log_dir: LogDir, node: NodeAddress,
                 on_change: Callable[[str], None] | None = None) -> None:
        self.log_dir = log_dir
        self.node = node
        self.topics: dict[str, TopicSpec] = {}
        self._ids: dict[str, str] = {}
        self._on_change = on_change or (lambda _name: None)
        self._api_file = os.path.join(log_dir.path, API_TOPICS_FILE)
        # Called with each local partition before its log is deleted (the cleaner must let go of it first).
        self.before_delete: list[Callable[[TopicPartition], None]] = []
        self.replication: Replication | None = None  # the replica manager, with a control store (`follow`)
        self._refused_records: set[tuple[str, str]] = set()  # (topic, why) of store records logged as not applied

    def follow(self, replication: Replication) -> None:
        """Who leads, and which nodes live, come from `replication` from now on: the replica manager calls this as
        it is built on this registry (the two need each other: the node's one cycle)."""
        self.replication = replication

    def bound(self, port: int) -> None:
        """The node listens on an ephemeral port (`--listen host:0`, tests): its address takes the port bound."""
        self.node = NodeAddress(self.node.node_id, self.node.host, port)

    # -- queries ---------------------------------------------------------------------------------

    def config_for(self, topic: str) -> TopicConfig:
        """The LogDir's callback: the topic's config, or Kafka's defaults for a log no topic claims."""
        spec = self.topics.get(topic)
        return spec.config if spec is not None else TopicConfig.from_mapping({})

    def nodes(self) -> dict[int, NodeAddress]:
        """Every node some topic is assigned to, and this one (with a store: every live node)."""
        if self.replication is not None:
            return {self.node.node_id: self.node, **self.replication.live_nodes()}
        out = {self.node.node_id: self.node}
        for spec in self.topics.values():
            for node_id, (host, port) in spec.nodes.items():
                if node_id != self.node.node_id:
                    out.setdefault(node_id, NodeAddress(node_id, host, port))
        return out

    def leader(self, topic: str, partition: int) -> int | None:
        """The node leading a partition (-1: none now), or None for an unknown topic or partition."""
        spec = self.topics.get(topic)
        if spec is None or not 0 <= partition < spec.partitions:
            return None
        if self.replication is not None:
            return self.replication.leader_id(TopicPartition(topic, partition))
        return spec.node_of(partition, self.node.node_id)

    def local_log(self, topic: str | None, partition: int) -> Log | None:
        """The log of a partition this node leads, or None (unknown topic/partition, or led elsewhere).

        Without replication it is one call and `spec.node_of`, not `leader`'s two: every Produce asks it (issue 18)."""
        if self.replication is not None:
            if topic is None or self.leader(topic, partition) != self.node.node_id:
                return None
            return self.replication.leader_log(TopicPartition(topic, partition))
        spec = self.topics.get(topic)  # type: ignore[arg-type]
        node = self.node.node_id
        if spec is None or not 0 <= partition < spec.partitions or spec.node_of(partition, node) != node:
            return None
        return self.log_dir.logs.get((topic, partition))  # type: ignore[call-overload]  # == its TopicPartition

    def topic_id(self, topic: str) -> str:
        return self._ids[topic]

    def topic_named_by(self, topic_id: uuid.UUID) -> str | None:
        """The topic whose id is `topic_id` (a request naming topics by id), None if none has it."""
        return next((name for name in self.topics if topic_uuid(self._ids[name]) == topic_id), None)

    def hosts(self, tp: TopicPartition) -> bool:
        """This node keeps a replica of the partition (its leader, or with a store any of its replicas)."""
        spec = self.topics.get(tp.topic)
        if spec is None or not 0 <= tp.partition < spec.partitions:
            return False
        if self.replication is not None:
            return self.replication.is_replica(tp)
        return spec.node_of(tp.partition, self.node.node_id) == self.node.node_id

    def local_partitions(self, spec: TopicSpec) -> list[int]:
        """The partitions of `spec` with a replica here (with a store: those whose log exists already)."""
        if self.replication is not None:
            return [p for p in range(spec.partitions) if self.hosts(TopicPartition(spec.name, p))
                    and TopicPartition(spec.name, p) in self.log_dir.logs]
        return [p for p in range(spec.partitions) if spec.node_of(p, self.node.node_id) == self.node.node_id]

    # -- changes ---------------------------------------------------------------------------------

    def put(self, spec: TopicSpec) -> bool:
        """Create the topic or change it live; True if anything changed. Raises TopicError if it cannot."""
        old = self.topics.get(spec.name)
        if old is not None and spec.partitions < old.partitions:
            raise TopicError(f"topic {spec.name}: the number of partitions cannot be decreased "
                             f"({old.partitions} -> {spec.partitions})")
        if spec.assignment is not None and len(spec.assignment) != spec.partitions:
            raise TopicError(f"topic {spec.name}: the assignment names {len(spec.assignment)} nodes "
                             f"for {spec.partitions} partitions")
        if self.replication is None:
            self._check_unreplicated(spec)
        if old == spec:
            return False
        # With a store, logs are created as the records name this node a replica (`ensure_log`), not here.
        missing = [] if self.replication is not None else [
            TopicPartition(spec.name, p) for p in self.local_partitions(spec)
            if TopicPartition(spec.name, p) not in self.log_dir.logs]
        refusal = partitions_refusal(len(missing), spec.config.segment_index_bytes) if missing else None
        if refusal is not None:
            raise CapacityError(f"topic {spec.name}: {refusal}")
        topic_id = self._resolve_id(spec)
        self._create_logs(spec, missing, topic_id)
        self.topics[spec.name] = spec
        self._ids[spec.name] = topic_id
        for p in self.local_partitions(spec):
            log = self.log_dir.logs[TopicPartition(spec.name, p)]
            if log.config != spec.config:
                log.config = spec.config  # read at every append/roll/retention check: takes effect now
        for p in range(spec.partitions):  # partitions moved away from this node stay on disk, unserved
            tp = TopicPartition(spec.name, p)
            if self.replication is None and spec.node_of(p, self.node.node_id) != self.node.node_id \
                    and tp in self.log_dir.logs:
                logger.warning("%s is now assigned to node %d; its log stays on disk, no longer served",
                               tp, spec.node_of(p, self.node.node_id))
        if self.replication is None and (spec.origin == "api" or (old is not None and old.origin == "api")):
            self._save_api_topics()
        logger.info("topic %s %s: %s (%d here), config overrides %s", spec.name,
                    "created" if old is None else "updated", plural(spec.partitions, "partition"),
                    len(self.local_partitions(spec)),
                    spec.config.overrides())
        self._on_change(spec.name)
        return True

    def _check_unreplicated(self, spec: TopicSpec) -> None:
        """Without a control store a partition has one replica, and Metadata needs every assigned node's address."""
        if spec.replicated:
            raise TopicError(f"topic {spec.name}: more than one replica per partition needs a control store "
                             "(shale serve --store etcd://HOST:PORT); this node has none")
        unknown = sorted({r[0] for r in spec.assignment or ()} - set(spec.nodes) - {self.node.node_id})
        if unknown:
            raise TopicError(f"topic {spec.name}: spec.assignment.nodes names no address for node "
                             f"{', '.join(map(str, unknown))}, and without a control store nothing else does")

    def ensure_log(self, tp: TopicPartition) -> Log:
        """The partition's log here, created if missing (the replica manager, when a record names this node a
        replica). Raises TopicError for an unknown partition, CapacityError when the node cannot hold another."""
        spec = self.topics.get(tp.topic)
        if spec is None or not 0 <= tp.partition < spec.partitions:
            raise TopicError(f"{tp}: no such topic partition here")
        log = self.log_dir.logs.get(tp)
        if log is None:
            refusal = partitions_refusal(1, spec.config.segment_index_bytes)
            if refusal is not None:
                raise CapacityError(f"topic {tp.topic}: {refusal}")
            self._create_logs(spec, [tp], self._ids[tp.topic])
            log = self.log_dir.logs[tp]
        elif log.config != spec.config:  # a log loaded at start opened with the defaults; `put` skipped it then
            log.config = spec.config
        return log

    def _create_logs(self, spec: TopicSpec, missing: list[TopicPartition], topic_id: str) -> None:
        """Create the partitions' logs, all or none: a failure (out of descriptors, maps or disk despite the
        capacity check) deletes the ones this call created and raises CapacityError."""
        created: list[TopicPartition] = []
        try:
            for tp in missing:
                self.log_dir.get_or_create(tp, topic_id, spec.config)  # not yet config_for's
                created.append(tp)
        except OSError as exc:
            for tp in created:
                self.log_dir.delete(tp)
            failed = missing[len(created)]
            raise CapacityError(f"topic {spec.name}: creating partition {failed.partition} failed ({exc}); the "
                                f"{len(created)} partitions created before it were removed") from exc

    def remove(self, name: str) -> bool:
        """Delete a topic Kafka's way: each local partition directory is renamed `-delete`, then removed.

        The one way a topic and its data go; False if no such topic. Whether a deletion is allowed (an explicit
        act, `delete.topic.enable`) is the caller's decision: ManifestSource for manifests, DeleteTopics for the
        admin API. Listeners (`on_change`) learn of it, so the manifests forget the topic's last good spec."""
        spec = self.topics.pop(name, None)
        if spec is None:
            return False
        self._ids.pop(name, None)
        for p in range(spec.partitions):
            tp = TopicPartition(name, p)
            if tp in self.log_dir.logs:
                for hook in self.before_delete:
                    hook(tp)
                self.log_dir.delete(tp)
        if spec.origin == "api" and self.replication is None:
            self._save_api_topics()
        logger.info("topic %s deleted", name)
        self._on_change(name)
        return True

    def delete_replica(self, tp: TopicPartition) -> None:
        """A replica moved off this node (Kafka's StopReplica with delete): its log goes the way a deleted
        topic's does (the cleaner lets go first, `-delete`), the topic stays."""
        if tp not in self.log_dir.logs:
            return
        for hook in self.before_delete:
            hook(tp)
        self.log_dir.delete(tp)
        logger.info("%s: replica deleted from node %d (moved to other nodes)", tp, self.node.node_id)
        self._on_change(tp.topic)

    def sync_origin(self, origin_prefix: str, specs: Iterable[TopicSpec]) -> dict[str, str]:
        """Make the topics declared by one source (e.g. the manifests) exactly `specs`.

        A topic of the source missing from `specs` is deleted: the source must list every topic it keeps (the
        manifests list refused and held topics at their last good spec). Returns {topic: message} for the specs that could not be applied; those topics stay as they were.
        A name another source already owns (CreateTopics, internal) is refused the same way.
        """
        wanted = {s.name: s for s in specs}
        errors: dict[str, str] = {}
        for name in [n for n, s in self.topics.items() if s.origin.startswith(origin_prefix) and n not in wanted]:
            self.remove(name)
        for spec in wanted.values():
            current = self.topics.get(spec.name)
            if current is not None and not current.origin.startswith(origin_prefix):
                errors[spec.name] = f"topic {spec.name} already exists (created by {current.origin})"
                continue
            try:
                self.put(spec)
            except TopicError as exc:
                errors[spec.name] = str(exc)
        for message in errors.values():
            logger.error("refused topic change: %s", message)
        return errors

    def apply_store_topics(self, records: Mapping[str, StoredTopic], complete: bool = True) -> list[str]:
        """Make the API's topics exactly the control store's topic records (one view's, every node alike).

        A record naming a topic a manifest or the node owns is not applied (manifests keep precedence); one
        whose config this node refuses keeps the topic at its current spec. A record whose topic id differs
        from the served topic's is a topic deleted and created again: the old one's logs go first. When some
        record was unreadable (`complete` false) no topic is deleted: a topic missing may be that one. Returns
        the names of the API topics removed, for the caller to delete their partition records."""
        specs: list[TopicSpec] = []
        for name, record in records.items():
            current = self.topics.get(name)
            if current is not None and current.origin != "api":
                self._refuse_record_once(name, f"topic {name} is declared by {current.origin}; its record in the "
                                               "control store is not applied")
                continue
            try:
                spec = record.spec()
            except InvalidConfigError as exc:
                self._refuse_record_once(name, f"topic {name}: its record in the control store has a config this "
                                               f"node refuses ({exc}); kept as it is")
                if current is not None:
                    specs.append(current)
                continue
            if current is not None and self._ids.get(name) != spec.topic_id:
                logger.info("topic %s: the control store holds it with topic id %s, not %s: deleted and created "
                            "again", name, spec.topic_id, self._ids.get(name))
                self.remove(name)
            specs.append(spec)
        missing = [s for n, s in self.topics.items() if s.origin == "api" and n not in records]
        if not complete:
            specs += missing
            missing = []
        removed = [s.name for s in missing]
        self.sync_origin("api", specs)
        return removed

    def _refuse_record_once(self, name: str, message: str) -> None:
        """Views arrive several times a second; a record that cannot be applied is logged once per reason."""
        if (name, message) not in self._refused_records:
            self._refused_records.add((name, message))
            logger.error("%s", message)

    def load_api_topics(self) -> None:
        """Re-create the topics CreateTopics made before a restart (without a control store, which holds them
        otherwise: then those of the file are left unserved, their logs on disk as strays)."""
        if self.replication is not None:
            if os.path.exists(self._api_file):
                logger.warning("%s lists topics created through the API before this node had a control store; "
                               "they are not served (their logs stay on disk)", self._api_file)
            return
        try:
            with open(self._api_file, encoding="utf-8") as f:
                saved = json.load(f)
        except FileNotFoundError:
            return
        for entry in saved:
            assignment = entry.get("assignment")
            self.put(TopicSpec(entry["name"], entry["partitions"], TopicConfig.from_mapping(entry["config"]),
                               origin="api", topic_id=entry["topic_id"],
                               assignment=None if assignment is None else tuple(tuple(r) for r in assignment),
                               replication_factor=entry.get("replication_factor")))

    def _save_api_topics(self) -> None:
        saved = [{"name": s.name, "partitions": s.partitions, "config": s.config.overrides(),
                  "topic_id": self._ids[s.name],
                  **({"assignment": [list(r) for r in s.assignment]} if s.assignment is not None else {}),
                  **({"replication_factor": s.replication_factor} if s.replication_factor is not None else {})}
                 for s in self.topics.values() if s.origin == "api"]
        atomic_write(self._api_file, json.dumps(saved, indent=1, sort_keys=True).encode())

    def _resolve_id(self, spec: TopicSpec) -> str:
        if spec.name in self._ids:
            return self._ids[spec.name]
        if spec.topic_id is not None:
            return spec.topic_id
        for p in self.local_partitions(spec):
            on_disk = self.log_dir.topic_id(TopicPartition(spec.name, p))
            if on_disk is not None:
                return on_disk
        return topic_id_for(spec.name)

    def strays(self) -> list[TopicPartition]:
        """Partition logs on disk that no topic assigns to this node: kept, never served (Kafka's strays)."""
        return sorted((tp for tp in self.log_dir.logs if not self.hosts(tp)), key=str)
