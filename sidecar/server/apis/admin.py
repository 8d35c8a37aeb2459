"""Kafka's admin APIs over the `TopicRegistry`: CreateTopics, DeleteTopics, CreatePartitions, DescribeConfigs,
AlterConfigs, IncrementalAlterConfigs, DescribeCluster and DescribeLogDirs, answered the way a KRaft broker and
controller answer them (error codes and messages of ControllerApis, ReplicationControlManager,
ConfigurationControlManager, ConfigAdminManager, ConfigHelper, ReplicaManager).

Topic configs are read and validated with the one config table (`TopicConfig.from_mapping`), so a
value refused here is refused in a manifest too, with the same message. A topic stores its config as
the keys that differ from Kafka's defaults (`TopicConfig.overrides()`): a key set to its default value
is therefore described as DEFAULT_CONFIG, not as DYNAMIC_TOPIC_CONFIG as Kafka would.

Who owns a topic decides whether it may be altered. Topics created here (origin "api") belong to the
API: they are changed live and persisted by the registry. Topics declared by a Topic manifest belong
to the manifest, because Kubernetes is declarative: a change made over the wire would be silently
reverted by the next reload of the manifest (or the next restart), and `kubectl get topic` would no
longer show the truth. Altering, deleting or growing them is refused with POLICY_VIOLATION and a message
saying which manifest to edit; once their manifest is gone and the removal is only held (see `manifests`),
DeleteTopics deletes them. Internal topics (`__consumer_offsets`) belong to the node and are refused alike.
DeleteTopics honours the broker setting `delete.topic.enable` (TOPIC_DELETION_DISABLED when false).

Without a control store Shale keeps one replica of each partition on the node that leads it, so a
replication factor above 1 cannot be honoured and is refused with INVALID_REPLICATION_FACTOR, as Kafka
refuses a factor larger than its number of brokers. With one (`--store`), the API's topics are topic records
in the store (`store_topics`), applied by every node from its view: replication factors and manual
assignments are checked against the live nodes with Kafka's errors, the replicas are fixed in the record
when a topic is created or grown, and the answer goes out once this node serves the change.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import re
import uuid
from base64 import urlsafe_b64encode
from collections import Counter
from typing import Any, Callable, Iterable, Mapping

from ...log.topic_partition import TopicPartition
from ...plural import plural
from ...protocol import codec
from ...protocol.error_codes import (
    INVALID_CONFIG,
    INVALID_PARTITIONS,
    INVALID_REPLICA_ASSIGNMENT,
    INVALID_REPLICATION_FACTOR,
    INVALID_REQUEST,
    INVALID_TOPIC_EXCEPTION,
    KAFKA_STORAGE_ERROR,
    MISMATCHED_ENDPOINT_TYPE,
    NONE,
    POLICY_VIOLATION,
    REQUEST_TIMED_OUT,
    TOPIC_ALREADY_EXISTS,
    TOPIC_DELETION_DISABLED,
    UNKNOWN_TOPIC_ID,
    UNKNOWN_TOPIC_OR_PARTITION,
    UNSUPPORTED_ENDPOINT_TYPE,
    name_of,
)
from ...replication.control_store import StoreUnavailable, StoreView
from ...replication.election import choose_replicas
from ...replication.topic_record import TopicRecord
from ...server_config import SERVER_CONFIG_KEYS, SERVER_CONFIG_KEYS_BY_NAME, ServerConfig
from ...topic_config import CONFIG_KEYS, CONFIG_KEYS_BY_NAME, InvalidConfigError, TopicConfig
from ...topics.manifests import ORIGIN_PREFIX, RESERVED
from ...topics.registry import CapacityError, TopicError, TopicRegistry, TopicSpec, topic_id_for, topic_uuid
from ..network.handler import ConnectionInfo, Handler
from ..ops.dynamic_broker_configs import DynamicBrokerConfigs
from ..ops.log_dir_moves import LogDirMoves
from .authorized_operations import CLUSTER_OPERATIONS
from .listener_addresses import ListenerAddresses
from .partitions import controller_id
from .store_topics import StoreConflict, StoreTopics

logger = logging.getLogger(__name__)

API_CREATE_TOPICS, API_DELETE_TOPICS, API_DESCRIBE_CONFIGS, API_ALTER_CONFIGS = 19, 20, 32, 33
API_DESCRIBE_LOG_DIRS, API_CREATE_PARTITIONS, API_INCREMENTAL_ALTER_CONFIGS, API_DESCRIBE_CLUSTER = 35, 37, 44, 60
API_ALTER_REPLICA_LOG_DIRS = 34

# Kafka's default messages of the errors a lookup by name or by id answers.
UNKNOWN_TOPIC_MESSAGE = "This server does not host this topic-partition."
UNKNOWN_TOPIC_ID_MESSAGE = "This server does not host this topic ID."

# DescribeCluster's EndpointType: a node is a broker endpoint, never a KRaft controller endpoint.
ENDPOINT_BROKERS, ENDPOINT_CONTROLLERS = 1, 2


# ConfigResource.Type ids.
RESOURCE_TOPIC, RESOURCE_BROKER, RESOURCE_BROKER_LOGGER = 2, 4, 8

# DescribeConfigsResponse.ConfigSource ids.
DYNAMIC_TOPIC_CONFIG, DYNAMIC_BROKER_CONFIG, STATIC_BROKER_CONFIG, DEFAULT_CONFIG = 1, 2, 4, 5

# DescribeConfigsResponse.ConfigType ids, by ConfigDef type name.
CONFIG_TYPE_IDS = {"boolean": 1, "string": 2, "int": 3, "short": 4, "long": 5, "double": 6, "list": 7}

# IncrementalAlterConfigs operations (AlterConfigOp.OpType).
OP_SET, OP_DELETE, OP_APPEND, OP_SUBTRACT = 0, 1, 2, 3
_OP_NAMES = {OP_SET: "SET", OP_DELETE: "DELETE", OP_APPEND: "APPEND", OP_SUBTRACT: "SUBTRACT"}

DEFAULT_NUM_PARTITIONS = 1  # Kafka's num.partitions
DEFAULT_TIMEOUT_MS = 30000  # how long a store write waits to be applied here when the request names no timeout
MAX_TOPIC_NAME_LENGTH = 249
_LEGAL_TOPIC_CHARS = re.compile(r"[a-zA-Z0-9._-]+")

# The broker config holding each topic config's default, as Kafka's ServerTopicConfigSynonyms names it, and
# the factor from the topic's unit to the broker's (retention.ms defaults through log.retention.hours).
# Topic configs missing here have no broker default (Kafka's CONFIGS_WITH_NO_SERVER_DEFAULTS).
_BROKER_SYNONYMS: Mapping[str, tuple[str, int]] = {
    "cleanup.policy": ("log.cleanup.policy", 1),
    "retention.ms": ("log.retention.hours", 3600000),
    "retention.bytes": ("log.retention.bytes", 1),
    "segment.bytes": ("log.segment.bytes", 1),
    "segment.ms": ("log.roll.hours", 3600000),
    "segment.jitter.ms": ("log.roll.jitter.hours", 3600000),
    "segment.index.bytes": ("log.index.size.max.bytes", 1),
    "index.interval.bytes": ("log.index.interval.bytes", 1),
    "flush.messages": ("log.flush.interval.messages", 1),
    "flush.ms": ("log.flush.scheduler.interval.ms", 1),
    "min.cleanable.dirty.ratio": ("log.cleaner.min.cleanable.ratio", 1),
    "min.compaction.lag.ms": ("log.cleaner.min.compaction.lag.ms", 1),
    "max.compaction.lag.ms": ("log.cleaner.max.compaction.lag.ms", 1),
    "delete.retention.ms": ("log.cleaner.delete.retention.ms", 1),
    "file.delete.delay.ms": ("log.segment.delete.delay.ms", 1),
    "max.message.bytes": ("message.max.bytes", 1),
    "message.timestamp.type": ("log.message.timestamp.type", 1),
    "message.timestamp.before.max.ms": ("log.message.timestamp.before.max.ms", 1),
    "message.timestamp.after.max.ms": ("log.message.timestamp.after.max.ms", 1),
    "message.timestamp.difference.max.ms": ("log.message.timestamp.difference.max.ms", 1),
    "message.format.version": ("log.message.format.version", 1),
    "message.downconversion.enable": ("log.message.downconversion.enable", 1),
    "compression.type": ("compression.type", 1),
    "compression.gzip.level": ("compression.gzip.level", 1),
    "compression.lz4.level": ("compression.lz4.level", 1),
    "compression.zstd.level": ("compression.zstd.level", 1),
    "preallocate": ("log.preallocate", 1),
    "min.insync.replicas": ("min.insync.replicas", 1),
    "unclean.leader.election.enable": ("unclean.leader.election.enable", 1),
    "local.retention.ms": ("log.local.retention.ms", 1),
    "local.retention.bytes": ("log.local.retention.bytes", 1),
}


# How a request's configs become the new overrides of a topic (or this node's dynamic configs), from the current
# ones (Kafka names -> string values).
NewOverrides = Callable[[Mapping[str, str], list], dict[str, str]]


class AdminError(Exception):
    """A resource or topic the request cannot be applied to: a Kafka error code and its message."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code, self.message = code, message


@dataclasses.dataclass(frozen=True)
class BrokerSetting:
    """One entry of the BROKER resource: read-only, since a node's settings come from its command line (but for
    the few it changes live, `AdminApis.dynamic_broker`)."""

    name: str
    value: str
    type: str = "string"
    source: int = STATIC_BROKER_CONFIG


def topic_name_error(name: str | None) -> str | None:
    """Kafka's Topic.validate: why `name` cannot be a topic name, or None."""
    if not name:
        return "Topic name is illegal, it can't be empty"
    if name in (".", ".."):
        return 'Topic name cannot be "." or ".."'
    if len(name) > MAX_TOPIC_NAME_LENGTH:
        return (f"Topic name is illegal, it can't be longer than {MAX_TOPIC_NAME_LENGTH} characters, "
                f"topic name: {name}")
    if not _LEGAL_TOPIC_CHARS.fullmatch(name):
        return (f'Topic name "{name}" is illegal, it contains a character other than ASCII alphanumerics, '
                "'.', '_' and '-'")
    return None


def _broker_default(topic_key: str) -> tuple[str, str] | None:
    """The broker synonym of a topic config and Kafka's default for it, in the broker's unit."""
    synonym = _BROKER_SYNONYMS.get(topic_key)
    if synonym is None:
        return None
    name, factor = synonym
    key = CONFIG_KEYS_BY_NAME[topic_key]
    value = key.default // factor if factor != 1 else key.default
    return name, key.to_string(value)


class AdminApis:
    """The admin handlers a `Broker` serves; every topic change goes through `registry.put`."""

    def __init__(self, registry: TopicRegistry, server_config: ServerConfig | None = None,
                 cluster_id: str = "shale", removal_held: Callable[[str], bool] = lambda _name: False,
                 store_topics: StoreTopics | None = None, log_dir_moves: LogDirMoves | None = None,
                 dynamic_broker: Mapping[str, Callable[[Any], None]] | None = None,
                 addresses: ListenerAddresses | None = None, dynamic_file: DynamicBrokerConfigs | None = None) -> None:
        self.registry = registry
        # Each node's address on each listener (DescribeCluster answers a request's listener with its endpoints).
        self.addresses = addresses if addresses is not None else ListenerAddresses(registry.node.node_id)
        # The broker configs this node changes live (Kafka's per-broker dynamic configs; here the replication
        # throttles): name -> apply(parsed value, or None for the command line's). Set ones, as strings, kept
        # across restarts in `dynamic_file`:
        self.dynamic_broker = dict(dynamic_broker or {})
        self.dynamic_values: dict[str, str] = {}
        self.dynamic_file = dynamic_file
        if dynamic_file is not None:
            self._restore_dynamic(dynamic_file.load())
        self.log_dir_moves = log_dir_moves  # AlterReplicaLogDirs is served with it (docs/moves.md)
        # With a control store the API's topics are its topic records (every node applies them); None: this node's.
        self.store_topics = store_topics
        self.server_config = server_config
        self.cluster_id = cluster_id
        # A topic whose manifest is gone but whose removal the manifests hold (`ManifestSource.held`, e.g. an
        # unmounted volume): no manifest declares it any more, so DeleteTopics is the explicit act that deletes it.
        self.removal_held = removal_held

    def handlers(self) -> dict[int, Handler]:
        return {
            API_CREATE_TOPICS: self._create_topics,
            API_DELETE_TOPICS: self._delete_topics,
            API_CREATE_PARTITIONS: self._create_partitions,
            API_DESCRIBE_CONFIGS: self._describe_configs,
            API_ALTER_CONFIGS: self._alter_configs,
            API_INCREMENTAL_ALTER_CONFIGS: self._incremental_alter_configs,
            API_DESCRIBE_CLUSTER: self._describe_cluster,
            API_DESCRIBE_LOG_DIRS: self._describe_log_dirs,
            **({API_ALTER_REPLICA_LOG_DIRS: self._alter_replica_log_dirs} if self.log_dir_moves is not None else {}),
        }

    @staticmethod
    def _check_api_owned(spec: TopicSpec, manifest_advice: str, internal_advice: str) -> None:
        """Only a topic created through the API changes through it (see the module docstring)."""
        if spec.origin.startswith(ORIGIN_PREFIX):
            path = spec.origin[len(ORIGIN_PREFIX):]
            raise AdminError(POLICY_VIOLATION, f"Topic '{spec.name}' is declared by the Topic manifest {path}: "
                                               f"{manifest_advice}")
        if spec.origin != "api":
            raise AdminError(POLICY_VIOLATION, f"Topic '{spec.name}' is an internal topic ({spec.origin}); "
                                               f"{internal_advice}")

    # -- CreateTopics ----------------------------------------------------------------------------

    async def _create_topics(self, request: codec.Request, conn: ConnectionInfo) -> dict:
        version, body = request.api_version, request.body
        validate_only = bool(getattr(body, "validate_only", False))
        counts = Counter(t.name for t in body.topics)
        results = []
        for topic in body.topics:
            out: dict[str, Any] = {"name": topic.name, "error_code": NONE, "error_message": None}
            try:
                if counts[topic.name] > 1:
                    raise AdminError(INVALID_REQUEST, "Duplicate topic name.")
                spec = self._new_topic(topic, None if self.store_topics is None else await self._view())
                if not validate_only:
                    spec = await self._create(spec, _timeout_s(body))
            except AdminError as exc:
                logger.info("CreateTopics from %s refused for topic %s: %s", _client(conn), topic.name, exc.message)
                out.update(error_code=exc.code, error_message=exc.message)
                results.append(out)
                continue
            if not validate_only:
                logger.info("topic %s created by CreateTopics from %s (%s)", spec.name, _client(conn),
                            plural(spec.partitions, "partition"))
            if version >= 5:
                replicas = len(spec.assignment[0]) if spec.assignment else 1
                out.update(num_partitions=spec.partitions, replication_factor=replicas, topic_config_error_code=NONE,
                           configs=[{"name": name, "value": value, "read_only": False, "config_source": source,
                                     "is_sensitive": False}
                                    for name, value, source in _topic_entries(spec.config, None)])
            if version >= 7:  # validate_only: the id the topic would get
                exists = spec.name in self.registry.topics
                out["topic_id"] = topic_uuid(spec.topic_id or (self.registry.topic_id(spec.name) if exists
                                                               else topic_id_for(spec.name)))
            results.append(out)
        return {"throttle_time_ms": 0, "topics": results}

    async def _create(self, spec: TopicSpec, timeout_s: float) -> TopicSpec:
        """Create the topic: in the registry, or with a store as a topic record under a fresh random topic id
        (Kafka's Uuid.randomUuid: a topic deleted and created again is another topic)."""
        if self.store_topics is None:
            self._put(spec)
            return spec
        topic_id = urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode("ascii")
        record = TopicRecord(spec.name, topic_id, spec.assignment, spec.config.overrides())
        if not await self._stored(self.store_topics.create(record, timeout_s)):
            raise AdminError(TOPIC_ALREADY_EXISTS, f"Topic '{spec.name}' already exists.")
        return record.spec()

    async def _view(self) -> StoreView:
        return await self._stored(self.store_topics.view())

    @staticmethod
    async def _stored(write: Any) -> Any:
        """A store call's result; its failures as the retriable error Kafka answers when its controller
        does not answer in time."""
        try:
            return await write
        except (StoreUnavailable, StoreConflict) as exc:
            raise AdminError(REQUEST_TIMED_OUT, f"The control store did not take the change: {exc}") from None

    def _new_topic(self, topic: Any, view: StoreView | None) -> TopicSpec:
        """The spec a CreatableTopic asks for, or AdminError, checked in Kafka's order. With a store (`view`:
        a fresh read of it) the spec carries the replicas of every partition."""
        name = topic.name
        problem = topic_name_error(name)
        if problem is not None:
            raise AdminError(INVALID_TOPIC_EXCEPTION, problem)
        if name in self.registry.topics:
            raise AdminError(TOPIC_ALREADY_EXISTS, f"Topic '{name}' already exists.")
        if name in RESERVED:
            raise AdminError(INVALID_TOPIC_EXCEPTION, f"Topic '{name}' is reserved for an internal topic of the node")
        if view is not None and name in view.topics:  # created through another node, not applied here yet
            raise AdminError(TOPIC_ALREADY_EXISTS, f"Topic '{name}' already exists.")
        unified = name.replace(".", "_")
        for other in {*self.registry.topics, *(view.topics if view is not None else ())}:
            if other.replace(".", "_") == unified:
                raise AdminError(INVALID_TOPIC_EXCEPTION, f"Topic '{name}' collides with existing topic: {other}")
        nulls = [c.name for c in topic.configs if c.value is None]
        if nulls:
            raise AdminError(INVALID_CONFIG, "Null value not supported for topic configs: " + ",".join(nulls))
        config = _parse_config({c.name: c.value for c in topic.configs})
        if view is None:
            return TopicSpec(name, self._partition_count(topic), config, origin="api")
        assignment = self._replicated_assignment(topic, view)
        return TopicSpec(name, len(assignment), config, origin="api", assignment=assignment)

    def _replicated_assignment(self, topic: Any, view: StoreView) -> tuple[tuple[int, ...], ...]:
        """The replicas of each partition of a new topic on a cluster with a store (ReplicationControlManager's
        createTopic): a manual assignment checked against the live nodes, or Kafka's round robin over them."""
        if topic.assignments:
            self._check_manual_counts(topic)
            replicas: dict[int, tuple[int, ...]] = {}
            for a in topic.assignments:
                if a.partition_index in replicas:
                    raise AdminError(INVALID_REPLICA_ASSIGNMENT, "Found multiple manual partition assignments for "
                                                                 f"partition {a.partition_index}")
                rf = len(next(iter(replicas.values()))) if replicas else None
                replicas[a.partition_index] = _checked_replicas(list(a.broker_ids), view, rf)
            if set(replicas) != set(range(len(replicas))):
                raise AdminError(INVALID_REPLICA_ASSIGNMENT,
                                 "partitions should be a consecutive 0-based integer sequence")
            return tuple(replicas[p] for p in range(len(replicas)))
        self._check_counts(topic)
        rf = self._default_replication_factor() if topic.replication_factor == -1 else topic.replication_factor
        partitions = DEFAULT_NUM_PARTITIONS if topic.num_partitions == -1 else topic.num_partitions
        return tuple(_round_robin(view, rf, p, topic.name) for p in range(partitions))

    def _default_replication_factor(self) -> int:
        """Kafka's default.replication.factor: the replicas of a topic created without a factor."""
        return self.server_config.default_replication_factor if self.server_config is not None else 1

    @staticmethod
    def _check_manual_counts(topic: Any) -> None:
        if topic.replication_factor != -1:
            raise AdminError(INVALID_REQUEST, "A manual partition assignment was specified, but replication "
                                              "factor was not set to -1.")
        if topic.num_partitions != -1:
            raise AdminError(INVALID_REQUEST, "A manual partition assignment was specified, but numPartitions "
                                              "was not set to -1.")

    @staticmethod
    def _check_counts(topic: Any) -> None:
        if topic.replication_factor < -1 or topic.replication_factor == 0:
            raise AdminError(INVALID_REPLICATION_FACTOR,
                             "Replication factor must be larger than 0, or -1 to use the default value.")
        if topic.num_partitions < -1 or topic.num_partitions == 0:
            raise AdminError(INVALID_PARTITIONS, "Number of partitions was set to an invalid non-positive value.")

    def _partition_count(self, topic: Any) -> int:
        """Partitions of a new topic; the replication factor must come out as 1 (one replica per partition)."""
        if topic.assignments:
            self._check_manual_counts(topic)
            return self._manual_partitions(topic.assignments)
        self._check_counts(topic)
        if topic.replication_factor > 1:
            raise AdminError(INVALID_REPLICATION_FACTOR,
                             f"Unable to replicate the partition {topic.replication_factor} time(s): The target "
                             f"replication factor of {topic.replication_factor} cannot be reached because only 1 "
                             "broker(s) are registered. (Shale keeps one replica of each partition.)")
        return DEFAULT_NUM_PARTITIONS if topic.num_partitions == -1 else topic.num_partitions

    def _manual_partitions(self, assignments: Iterable[Any]) -> int:
        """Honour a manual assignment that places one replica of each partition on this node."""
        seen: set[int] = set()
        for a in assignments:
            p = a.partition_index
            if p in seen:
                raise AdminError(INVALID_REPLICA_ASSIGNMENT, f"Found multiple manual partition assignments for "
                                                             f"partition {p}")
            seen.add(p)
            self._check_local_replica(p, list(a.broker_ids), INVALID_REPLICATION_FACTOR)
        if seen != set(range(len(seen))):
            raise AdminError(INVALID_REPLICA_ASSIGNMENT, "partitions should be a consecutive 0-based integer sequence")
        return len(seen)

    def _check_local_replica(self, partition: int, brokers: list[int], too_many: int) -> None:
        """A manual assignment may only name this node, once: a partition created here lives here, unreplicated."""
        node_id = self.registry.node.node_id
        if not brokers:
            raise AdminError(INVALID_REPLICA_ASSIGNMENT, "The manual partition assignment includes an empty replica "
                                                         "list.")
        if len(brokers) > 1:
            raise AdminError(too_many, f"The manual partition assignment gives partition {partition} {len(brokers)} "
                                       "replicas; Shale keeps one replica of each partition.")
        if brokers[0] != node_id:
            raise AdminError(INVALID_REPLICA_ASSIGNMENT,
                             f"The manual partition assignment includes broker {brokers[0]}, but no such broker is "
                             f"registered (topics created through node {node_id} have their partitions on it).")

    def _put(self, spec: TopicSpec) -> None:
        try:
            self.registry.put(spec)
        except CapacityError as exc:  # more partitions than the node can hold (KRaft refuses too large a batch alike)
            raise AdminError(POLICY_VIOLATION, str(exc)) from None
        except TopicError as exc:  # e.g. an assignment the registry cannot apply; the message names the topic
            raise AdminError(INVALID_REQUEST, str(exc)) from None

    # -- DeleteTopics ----------------------------------------------------------------------------

    async def _delete_topics(self, request: codec.Request, conn: ConnectionInfo) -> dict:
        """Kafka's ControllerApis.deleteTopics: topics by name (v1+) or by id (v6), each deleted at once."""
        version, body = request.api_version, request.body
        asked = ([(t.name, _given_id(t.topic_id)) for t in body.topics] if version >= 6
                 else [(name, None) for name in body.topic_names])
        if self.server_config is not None and not self.server_config.delete_topic_enable:
            code = TOPIC_DELETION_DISABLED if version >= 3 else INVALID_REQUEST
            logger.info("DeleteTopics from %s refused: delete.topic.enable is false", _client(conn))
            return {"throttle_time_ms": 0, "responses": [
                {"name": name, "topic_id": tid, "error_code": code,
                 "error_message": "Topic deletion is disabled (delete.topic.enable=false)."} for name, tid in asked]}
        counts = Counter(asked)
        resolved: list[tuple[str | None, uuid.UUID | None, AdminError | None]] = []
        for name, tid in dict.fromkeys(asked):  # a duplicate is answered once
            try:
                resolved.append((*self._deletion_target(name, tid, counts[(name, tid)]), None))
            except AdminError as exc:
                resolved.append((name, tid, exc))
        targets = Counter(name for name, _tid, error in resolved if error is None)
        responses = []
        for name, tid, error in resolved:
            try:
                if error is not None:
                    raise error
                if targets[name] > 1:
                    raise AdminError(INVALID_REQUEST, "The provided topic name maps to an ID that was already "
                                                      "supplied.")
                await self._delete_topic(name, _timeout_s(body))
            except AdminError as exc:
                logger.info("DeleteTopics from %s refused for topic %s: %s", _client(conn), name or tid, exc.message)
                responses.append({"name": name, "topic_id": tid, "error_code": exc.code,
                                  "error_message": exc.message})
                continue
            logger.info("topic %s deleted by DeleteTopics from %s", name, _client(conn))
            responses.append({"name": name, "topic_id": tid, "error_code": NONE, "error_message": None})
        return {"throttle_time_ms": 0, "responses": responses}

    def _deletion_target(self, name: str | None, tid: uuid.UUID | None, times: int) -> tuple[str, uuid.UUID]:
        """The (name, id) a DeleteTopics entry names, or Kafka's error for it."""
        if name is not None and tid is not None:
            raise AdminError(INVALID_REQUEST, "You may not specify both topic name and topic id.")
        if name is None and tid is None:
            raise AdminError(INVALID_REQUEST, "Neither topic name nor id were specified.")
        if times > 1:
            raise AdminError(INVALID_REQUEST, "Duplicate topic name." if tid is None else "Duplicate topic id.")
        if tid is not None:
            known = self.registry.topic_named_by(tid)
            if known is None:
                raise AdminError(UNKNOWN_TOPIC_ID, UNKNOWN_TOPIC_ID_MESSAGE)
            return known, tid
        if name not in self.registry.topics:
            raise AdminError(UNKNOWN_TOPIC_OR_PARTITION, UNKNOWN_TOPIC_MESSAGE)
        return name, topic_uuid(self.registry.topic_id(name))

    async def _delete_topic(self, name: str, timeout_s: float) -> None:
        held = self.removal_held(name)
        if not held:
            self._check_api_owned(self.registry.topics[name],
                                  "delete the manifest (kubectl delete) to delete the topic; a deletion through the "
                                  "Kafka API would be undone by the manifest",
                                  "the node keeps it")
        if self.store_topics is not None and not held:  # every node deletes it as its view loses the record
            if not await self._stored(self.store_topics.delete(name, timeout_s)):
                raise AdminError(UNKNOWN_TOPIC_OR_PARTITION, UNKNOWN_TOPIC_MESSAGE)
            return
        try:
            self.registry.remove(name)
        except OSError as exc:
            logger.exception("deleting topic %s failed", name)
            raise AdminError(KAFKA_STORAGE_ERROR, f"Deleting topic '{name}' failed: {exc}") from None

    # -- CreatePartitions ------------------------------------------------------------------------

    async def _create_partitions(self, request: codec.Request, conn: ConnectionInfo) -> dict:
        """Kafka's ReplicationControlManager.createPartitions: grow a topic, never shrink it."""
        body = request.body
        counts = Counter(t.name for t in body.topics)
        results = []
        answered: set[str] = set()
        for topic in body.topics:
            if topic.name in answered:  # a duplicate is answered once
                continue
            answered.add(topic.name)
            out: dict[str, Any] = {"name": topic.name, "error_code": NONE, "error_message": None}
            try:
                if counts[topic.name] > 1:
                    raise AdminError(INVALID_REQUEST, "Duplicate topic name.")
                spec = self._grown(topic, None if self.store_topics is None else await self._view())
                if not body.validate_only:
                    old = self.registry.topics[topic.name].partitions
                    await self._grow(topic, spec, _timeout_s(body))
                    logger.info("topic %s grown from %d to %d partitions by CreatePartitions from %s", spec.name,
                                old, spec.partitions, _client(conn))
            except AdminError as exc:
                logger.info("CreatePartitions from %s refused for topic %s: %s", _client(conn), topic.name,
                            exc.message)
                out.update(error_code=exc.code, error_message=exc.message)
            results.append(out)
        return {"throttle_time_ms": 0, "results": results}

    async def _grow(self, topic: Any, spec: TopicSpec, timeout_s: float) -> None:
        """Apply a growth checked by `_grown`; with a store, to the topic record as it is when written."""
        if self.store_topics is None:
            self._put(spec)
            return

        def grown(record: TopicRecord | None, view: StoreView) -> TopicRecord:
            if record is None:
                raise AdminError(UNKNOWN_TOPIC_OR_PARTITION, UNKNOWN_TOPIC_MESSAGE)
            new = self._grown(topic, view, record.spec())
            return dataclasses.replace(record, assignment=new.assignment)
        await self._stored(self.store_topics.change(topic.name, grown, timeout_s))

    def _grown(self, topic: Any, view: StoreView | None, spec: TopicSpec | None = None) -> TopicSpec:
        """The spec a CreatePartitionsTopic asks for, or AdminError, checked in Kafka's order. With a store
        (`view`), the new partitions' replicas are added to the assignment: as many as the topic's first
        partition has, on live nodes."""
        spec = spec or self.registry.topics.get(topic.name)
        if spec is None:
            raise AdminError(UNKNOWN_TOPIC_OR_PARTITION, UNKNOWN_TOPIC_MESSAGE)
        self._check_api_owned(spec, "edit the manifest's partitions (kubectl apply) to add partitions; the manifest "
                                    "is the topic's source of truth",
                              "its partitions are set by the node")
        if topic.count == spec.partitions:
            raise AdminError(INVALID_PARTITIONS, f"Topic already has {spec.partitions} partition(s).")
        if topic.count < spec.partitions:
            raise AdminError(INVALID_PARTITIONS, f"The topic {spec.name} currently has {spec.partitions} "
                                                 f"partition(s); {topic.count} would not be an increase.")
        added = topic.count - spec.partitions
        if topic.assignments is not None:
            if len(topic.assignments) != added:
                raise AdminError(INVALID_REPLICA_ASSIGNMENT, f"Attempted to add {added} additional partition(s), but "
                                                             f"only {len(topic.assignments)} assignment(s) were "
                                                             "specified.")
        if view is not None:
            rf = len(spec.replicas_of(0) or (1,))
            added_replicas = (tuple(_checked_replicas(list(a.broker_ids), view, rf) for a in topic.assignments)
                              if topic.assignments is not None else
                              tuple(_round_robin(view, rf, p, spec.name) for p in range(spec.partitions, topic.count)))
            return dataclasses.replace(spec, partitions=topic.count,
                                       assignment=(spec.assignment or ()) + added_replicas)
        if topic.assignments is not None:
            for i, a in enumerate(topic.assignments):
                self._check_local_replica(spec.partitions + i, list(a.broker_ids), INVALID_REPLICA_ASSIGNMENT)
        return dataclasses.replace(spec, partitions=topic.count)

    # -- DescribeCluster and DescribeLogDirs -----------------------------------------------------

    async def _describe_cluster(self, request: codec.Request, conn: ConnectionInfo) -> dict:
        """The nodes Metadata names and its controller id; a node serves the broker endpoint only."""
        version, body = request.api_version, request.body
        endpoint = body.endpoint_type if version >= 1 else ENDPOINT_BROKERS
        if endpoint not in (ENDPOINT_BROKERS, ENDPOINT_CONTROLLERS):
            return {"error_code": INVALID_REQUEST if version == 0 else UNSUPPORTED_ENDPOINT_TYPE,
                    "error_message": f"Unsupported endpoint type {endpoint}", "cluster_id": self.cluster_id}
        if endpoint != ENDPOINT_BROKERS:
            return {"error_code": INVALID_REQUEST if version == 0 else MISMATCHED_ENDPOINT_TYPE,
                    "error_message": "The request was sent to an endpoint of type BROKER, but we wanted an endpoint "
                                     "of type CONTROLLER", "cluster_id": self.cluster_id}
        nodes = sorted(self.registry.nodes().values(), key=lambda n: n.node_id)
        shown = {n.node_id: self.addresses.address_on(n.node_id, conn.listener) for n in nodes}  # None: not on this listener
        return {
            "throttle_time_ms": 0, "error_code": NONE, "error_message": None, "endpoint_type": ENDPOINT_BROKERS,
            "cluster_id": self.cluster_id, "controller_id": controller_id(self.registry),
            "brokers": [{"broker_id": n.node_id, "host": n.host, "port": n.port, "rack": None, "is_fenced": False}
                        | shown[n.node_id] for n in nodes if shown[n.node_id] is not None],
            "authorized_operations": CLUSTER_OPERATIONS if body.include_cluster_authorized_operations else None,
        }

    async def _describe_log_dirs(self, request: codec.Request, conn: ConnectionInfo) -> dict:
        """Kafka's ReplicaManager.describeLogDirs: every log dir, each partition's size and offset lag, and the
        future replicas of log-dir moves (`is_future_key`, their lag behind the current log)."""
        body = request.body
        log_dir = self.registry.log_dir
        with log_dir.lock:
            logs = dict(log_dir.logs)
            homes = {tp: log_dir.dir_of(tp) for tp in logs}
        moves = self.log_dir_moves.snapshot() if self.log_dir_moves is not None else {}
        if body.topics is not None:
            wanted = {(t.topic, p) for t in body.topics for p in t.partitions}
            logs = {tp: log for tp, log in logs.items() if (tp.topic, tp.partition) in wanted}
        results = []
        for path in log_dir.paths:
            result: dict[str, Any] = {"error_code": NONE, "log_dir": path}
            try:
                fs = os.statvfs(path)
            except OSError as exc:
                logger.error("DescribeLogDirs: cannot read the file system of %s: %s", path, exc)
                results.append({**result, "error_code": KAFKA_STORAGE_ERROR, "topics": []})
                continue
            by_topic: dict[str, list[dict]] = {}
            for tp, log in sorted(logs.items(), key=lambda item: (item[0].topic, item[0].partition)):
                with log.lock:
                    size, end = log.size_in_bytes, log.log_end_offset
                if homes.get(tp) == path:
                    # Kafka's offset lag of a current log is max(HW - LEO, 0): 0, the HW never passing the log end.
                    by_topic.setdefault(tp.topic, []).append({"partition_index": tp.partition, "partition_size": size,
                                                              "offset_lag": 0, "is_future_key": False})
                move = moves.get(tp)
                if move is not None and move.running and move.target == path:
                    by_topic.setdefault(tp.topic, []).append({
                        "partition_index": tp.partition, "partition_size": move.bytes_copied,
                        "offset_lag": max(end - move.copied_through, 0), "is_future_key": True})
            result.update(topics=[{"name": name, "partitions": parts} for name, parts in by_topic.items()],
                          total_bytes=fs.f_blocks * fs.f_frsize, usable_bytes=fs.f_bavail * fs.f_frsize)
            results.append(result)
        return {"throttle_time_ms": 0, "error_code": NONE, "results": results}

    async def _alter_replica_log_dirs(self, request: codec.Request, conn: ConnectionInfo) -> dict:
        """Kafka's alterReplicaLogDirs: each partition moves to the dir named (docs/moves.md); the copy runs on."""
        out: dict[str, list[dict]] = {}
        for d in request.body.dirs:
            for t in d.topics:
                for p in t.partitions:
                    tp = TopicPartition(t.name, p)
                    code = self.log_dir_moves.alter(tp, d.path)
                    if code != NONE:
                        logger.info("AlterReplicaLogDirs from %s: %s to %s refused: %s", _client(conn), tp, d.path,
                                    name_of(code))
                    out.setdefault(t.name, []).append({"partition_index": p, "error_code": code})
        return {"throttle_time_ms": 0,
                "results": [{"topic_name": name, "partitions": parts} for name, parts in out.items()]}

    # -- DescribeConfigs -------------------------------------------------------------------------

    async def _describe_configs(self, request: codec.Request, conn: ConnectionInfo) -> dict:
        body = request.body
        synonyms = bool(getattr(body, "include_synonyms", False))
        docs = bool(getattr(body, "include_documentation", False))
        results = []
        for res in body.resources:
            out: dict[str, Any] = {"error_code": NONE, "error_message": None, "resource_type": res.resource_type,
                                   "resource_name": res.resource_name, "configs": []}
            wanted = set(res.configuration_keys) if res.configuration_keys else None
            try:
                if res.resource_type == RESOURCE_TOPIC:
                    out["configs"] = self._describe_topic(res.resource_name, wanted, synonyms, docs)
                elif res.resource_type == RESOURCE_BROKER:
                    out["configs"] = self._describe_broker(res.resource_name, wanted, synonyms)
                else:
                    raise AdminError(INVALID_REQUEST, f"Unsupported resource type: {res.resource_type} "
                                                      f"(resource {res.resource_name!r})")
            except AdminError as exc:
                logger.info("DescribeConfigs from %s refused for resource %d %r: %s", _client(conn),
                            res.resource_type, res.resource_name, exc.message)
                out.update(error_code=exc.code, error_message=exc.message, configs=[])
            results.append(out)
        return {"throttle_time_ms": 0, "results": results}

    def _existing_topic(self, name: str) -> TopicSpec:
        """The topic a config resource names, or Kafka's error for a bad or unknown name."""
        problem = topic_name_error(name)
        if problem is not None:
            raise AdminError(INVALID_TOPIC_EXCEPTION, problem)
        spec = self.registry.topics.get(name)
        if spec is None:
            raise AdminError(UNKNOWN_TOPIC_OR_PARTITION, f"The topic '{name}' does not exist.")
        return spec

    def _describe_topic(self, name: str, wanted: set[str] | None, synonyms: bool, docs: bool) -> list[dict]:
        spec = self._existing_topic(name)
        entries = []
        for key_name, value, source in _topic_entries(spec.config, wanted):
            key = CONFIG_KEYS_BY_NAME[key_name]
            chain = []
            if source == DYNAMIC_TOPIC_CONFIG:
                chain.append({"name": key_name, "value": value, "source": DYNAMIC_TOPIC_CONFIG})
            default = _broker_default(key_name)
            if default is not None:
                chain.append({"name": default[0], "value": default[1], "source": DEFAULT_CONFIG})
            entries.append({"name": key_name, "value": value, "read_only": False, "config_source": source,
                            "is_sensitive": False, "synonyms": chain if synonyms else [],
                            "config_type": CONFIG_TYPE_IDS[key.type.name], "documentation": key.doc if docs else None})
        return entries

    def _broker_settings(self) -> list[BrokerSetting]:
        """What this node can tell about itself: its identity, where it keeps data, and its topic defaults."""
        node = self.registry.node
        settings = [
            BrokerSetting("node.id", str(node.node_id), "int"),
            BrokerSetting("broker.id", str(node.node_id), "int"),
            BrokerSetting("log.dirs", ",".join(self.registry.log_dir.paths)),
            BrokerSetting("advertised.listeners", ",".join(
                f"{name}://{host}:{port}" for name, (host, port) in self.addresses.own.items())
                or f"PLAINTEXT://{node.host}:{node.port}", "list"),
            BrokerSetting("num.partitions", str(DEFAULT_NUM_PARTITIONS), "int", DEFAULT_CONFIG),
            BrokerSetting("auto.create.topics.enable", "false", "boolean"),  # topics come from manifests or the API
        ]
        if self.server_config is not None:  # `--override`s are STATIC_BROKER_CONFIG, the rest Kafka's defaults
            overridden = self.server_config.overrides()
            for key in SERVER_CONFIG_KEYS:
                if key.name == "log.dirs":
                    continue  # the dirs in use, above (the setting is empty when --data-dir names them)
                if key.name in self.dynamic_values:
                    settings.append(BrokerSetting(key.name, self.dynamic_values[key.name], key.type.name,
                                                  DYNAMIC_BROKER_CONFIG))
                    continue
                value = key.to_string(self.server_config.value_of(key.name))
                settings.append(BrokerSetting(key.name, value, key.type.name,
                                              STATIC_BROKER_CONFIG if key.name in overridden else DEFAULT_CONFIG))
        for key in CONFIG_KEYS:
            default = _broker_default(key.name)
            if default is not None and default[0] not in {s.name for s in settings}:
                unit_changed = _BROKER_SYNONYMS[key.name][1] != 1  # log.retention.hours and the like are ints
                settings.append(BrokerSetting(default[0], default[1], "int" if unit_changed else key.type.name,
                                              DEFAULT_CONFIG))
        return settings

    def _describe_broker(self, name: str, wanted: set[str] | None, synonyms: bool) -> list[dict]:
        if name == "":
            return []  # the cluster-wide dynamic defaults: a node has none
        self._check_broker_name(name)
        return [{"name": s.name, "value": s.value, "read_only": s.name not in self.dynamic_broker,
                 "config_source": s.source,
                 "is_sensitive": False, "config_type": CONFIG_TYPE_IDS[s.type], "documentation": None,
                 "synonyms": [{"name": s.name, "value": s.value, "source": s.source}] if synonyms else []}
                for s in self._broker_settings() if wanted is None or s.name in wanted]

    def _check_broker_name(self, name: str) -> None:
        node_id = self.registry.node.node_id
        try:
            asked = int(name)
        except ValueError:
            raise AdminError(INVALID_REQUEST, f"Broker id must be an integer, but it is: {name}") from None
        if asked != node_id:
            raise AdminError(INVALID_REQUEST,
                             f"Unexpected broker id, expected {node_id} or empty string, but received {name}")

    # -- AlterConfigs and IncrementalAlterConfigs ------------------------------------------------

    async def _alter_configs(self, request: codec.Request, conn: ConnectionInfo) -> dict:
        """Legacy AlterConfigs: the given configs become the topic's whole override set."""
        return await self._alter(request, conn, _replace_all)

    async def _incremental_alter_configs(self, request: codec.Request, conn: ConnectionInfo) -> dict:
        """SET/DELETE/APPEND/SUBTRACT applied to the topic's current overrides."""
        return await self._alter(request, conn, _apply_ops)

    async def _alter(self, request: codec.Request, conn: ConnectionInfo, compute: NewOverrides) -> dict:
        body = request.body
        counts = Counter((r.resource_type, r.resource_name) for r in body.resources)
        responses = []
        for res in body.resources:
            out = {"error_code": NONE, "error_message": None, "resource_type": res.resource_type,
                   "resource_name": res.resource_name}
            try:
                if counts[(res.resource_type, res.resource_name)] > 1:
                    raise AdminError(INVALID_REQUEST, "Each resource must appear at most once.")
                if len({c.name for c in res.configs}) != len(res.configs):
                    raise AdminError(INVALID_REQUEST, "Error due to duplicate config keys")
                if res.resource_type == RESOURCE_TOPIC:
                    await self._alter_topic(res.resource_name, res.configs, compute, bool(body.validate_only), conn)
                elif res.resource_type == RESOURCE_BROKER:
                    if res.resource_name != "":  # a legacy AlterConfigs with no configs removes them all, as Kafka's
                        self._check_broker_name(res.resource_name)
                        self._alter_broker(res.resource_name, res.configs, compute, bool(body.validate_only))
                    elif res.configs:  # refused: the cluster-wide default is not served
                        self._alter_broker(res.resource_name, res.configs, compute, bool(body.validate_only))
                else:
                    raise AdminError(INVALID_REQUEST, f"Unknown resource type {res.resource_type}")
            except AdminError as exc:
                logger.info("%s from %s refused for resource %d %r: %s", request.api_name, _client(conn),
                            res.resource_type, res.resource_name, exc.message)
                out.update(error_code=exc.code, error_message=exc.message)
            responses.append(out)
        return {"throttle_time_ms": 0, "responses": responses}

    def _restore_dynamic(self, saved: dict[str, str]) -> None:
        """Apply the dynamic configs a previous run of this node set (`dynamic_file`); what no longer applies
        here is logged and left out."""
        for key, value in saved.items():
            if key not in self.dynamic_broker:
                logger.warning("node %d: dynamic broker config %s=%s in %s is not dynamic on this node; ignored",
                               self.registry.node.node_id, key, value, self.dynamic_file.path)
                continue
            try:
                parsed = SERVER_CONFIG_KEYS_BY_NAME[key].parse(value)
            except InvalidConfigError as exc:
                logger.error("node %d: dynamic broker config %s=%s in %s is invalid (%s); ignored",
                             self.registry.node.node_id, key, value, self.dynamic_file.path, exc)
                continue
            self.dynamic_broker[key](parsed)
            self.dynamic_values[key] = value
        if self.dynamic_values:
            logger.info("node %d: dynamic broker configs restored from %s: %s", self.registry.node.node_id,
                        self.dynamic_file.path, self.dynamic_values)

    def _alter_broker(self, name: str, configs: list, compute: NewOverrides, validate_only: bool) -> None:
        """This node's dynamic configs (`dynamic_broker`), as Kafka's per-broker ones: kafka-reassign-partitions
        sets the replication throttles this way. Written to `dynamic_file` before they apply, so a restart comes
        back with them (Kafka keeps them in its metadata); the cluster-wide default (an empty name) is not
        served."""
        fixed = [c.name for c in configs if c.name not in self.dynamic_broker or name == ""]
        if fixed:
            raise AdminError(INVALID_REQUEST, f"Cannot update these configs dynamically: {', '.join(fixed)} (a "
                                              "node's settings come from its command line; per node only: "
                                              f"{', '.join(sorted(self.dynamic_broker)) or 'none here'})")
        new = compute(self.dynamic_values, list(configs))
        parsed = {}
        for key, value in new.items():
            try:
                parsed[key] = SERVER_CONFIG_KEYS_BY_NAME[key].parse(value)
            except InvalidConfigError as exc:
                raise AdminError(INVALID_CONFIG, str(exc)) from None
        if validate_only:
            return
        if self.dynamic_file is not None:
            try:
                self.dynamic_file.save(new)
            except OSError as exc:
                raise AdminError(KAFKA_STORAGE_ERROR, f"Cannot keep the dynamic broker configs in "
                                                      f"{self.dynamic_file.path}: {exc}") from None
        for key, apply in self.dynamic_broker.items():
            apply(parsed.get(key))
        self.dynamic_values = new
        logger.info("node %d: dynamic broker configs now %s", self.registry.node.node_id, new or "none")

    async def _alter_topic(self, name: str, configs: list, compute: NewOverrides, validate_only: bool,
                           conn: ConnectionInfo) -> None:
        if name == "":
            raise AdminError(INVALID_REQUEST, "Default topic resources are not allowed.")
        spec = self._existing_topic(name)
        self._check_api_owned(spec, "edit the manifest (kubectl apply) to change its config; changes made through the "
                                    "Kafka API would be reverted by the manifest",
                              "its config is set by the node")
        config = _parse_config(compute(spec.config.overrides(), list(configs)))
        if validate_only or config == spec.config:
            return
        if self.store_topics is None:
            self._put(dataclasses.replace(spec, config=config))
        else:  # computed again on the record as written: an incremental change applies to the latest overrides
            def altered(record: TopicRecord | None, _view: StoreView) -> TopicRecord:
                if record is None:
                    raise AdminError(UNKNOWN_TOPIC_OR_PARTITION, f"The topic '{name}' does not exist.")
                new = _parse_config(compute(record.spec().config.overrides(), list(configs)))
                return dataclasses.replace(record, config=new.overrides())
            config = (await self._stored(
                self.store_topics.change(name, altered, DEFAULT_TIMEOUT_MS / 1000))).spec().config
        logger.info("topic %s config altered by %s: overrides now %s", name, _client(conn), config.overrides())


def _round_robin(view: StoreView, rf: int, partition: int, topic: str) -> tuple[int, ...]:
    """Kafka's replica placement over the store's live nodes, or its error when there are too few."""
    if rf > len(view.nodes):
        raise AdminError(INVALID_REPLICATION_FACTOR,
                         f"Unable to replicate the partition {rf} time(s): The target replication factor of {rf} "
                         f"cannot be reached because only {len(view.nodes)} broker(s) are registered.")
    return choose_replicas(view.nodes, rf, partition, topic)


def _checked_replicas(brokers: list[int], view: StoreView, rf: int | None) -> tuple[int, ...]:
    """Kafka's validateManualPartitionAssignment: a non-empty list of distinct live nodes, as many as the other
    partitions' (`rf`, None for the first)."""
    if not brokers:
        raise AdminError(INVALID_REPLICA_ASSIGNMENT, "The manual partition assignment includes an empty replica list.")
    previous = None
    for broker in sorted(brokers):
        if broker not in view.nodes:
            raise AdminError(INVALID_REPLICA_ASSIGNMENT, f"The manual partition assignment includes broker {broker}, "
                                                         "but no such broker is registered.")
        if broker == previous:
            raise AdminError(INVALID_REPLICA_ASSIGNMENT, f"The manual partition assignment includes the broker "
                                                         f"{broker} more than once.")
        previous = broker
    if rf is not None and len(brokers) != rf:
        raise AdminError(INVALID_REPLICA_ASSIGNMENT,
                         f"The manual partition assignment includes a partition with {len(brokers)} replica(s), but "
                         f"this is not consistent with previous partitions, which have {rf} replica(s).")
    return tuple(brokers)


def _timeout_s(body: Any) -> float:
    """The request's timeout_ms (CreateTopics, DeleteTopics, CreatePartitions), in seconds."""
    timeout_ms = getattr(body, "timeout_ms", None)
    return (timeout_ms if timeout_ms is not None and timeout_ms > 0 else DEFAULT_TIMEOUT_MS) / 1000


def _replace_all(current: Mapping[str, str], configs: list) -> dict[str, str]:
    """Legacy AlterConfigs: exactly the given configs, every other key back to its default."""
    nulls = [c.name for c in configs if c.value is None]
    if nulls:
        raise AdminError(INVALID_REQUEST, "Null value not supported for : " + ", ".join(nulls))
    return {c.name: c.value for c in configs}


def _apply_ops(current: Mapping[str, str], configs: list) -> dict[str, str]:
    """Kafka's incrementalAlterConfigResource on the current overrides (strings, as stored)."""
    nulls = [c.name for c in configs if c.config_operation != OP_DELETE and c.value is None]
    if nulls:
        raise AdminError(INVALID_REQUEST, "Null value not supported for : " + ", ".join(nulls))
    overrides = dict(current)
    for c in configs:
        op = c.config_operation
        if op == OP_SET:
            overrides[c.name] = c.value
        elif op == OP_DELETE:
            overrides.pop(c.name, None)
        elif op in (OP_APPEND, OP_SUBTRACT):
            key = CONFIG_KEYS_BY_NAME.get(c.name)
            if key is None or key.type.name != "list":
                raise AdminError(INVALID_CONFIG, f"Can't {_OP_NAMES[op]} to key {c.name} because its type is not LIST.")
            current = overrides.get(c.name, key.to_string(key.default))
            parts = [p for p in current.split(",") if p]
            for item in c.value.split(","):
                if op == OP_APPEND and item not in parts:
                    parts.append(item)
                elif op == OP_SUBTRACT and item in parts:
                    parts.remove(item)
            overrides[c.name] = ",".join(parts)
        else:
            raise AdminError(INVALID_REQUEST, f"Unknown operation type {op} for config {c.name}")
    return overrides


def _parse_config(overrides: Mapping[str, object]) -> TopicConfig:
    try:
        return TopicConfig.from_mapping(overrides)
    except InvalidConfigError as exc:
        raise AdminError(INVALID_CONFIG, str(exc)) from None


def _topic_entries(config: TopicConfig, wanted: set[str] | None) -> list[tuple[str, str, int]]:
    """(name, value, source) of every key of the config table, those set on the topic as DYNAMIC_TOPIC_CONFIG."""
    overrides = config.overrides()
    return [(name, value, DYNAMIC_TOPIC_CONFIG if name in overrides else DEFAULT_CONFIG)
            for name, value in sorted(config.as_kafka_strings().items()) if wanted is None or name in wanted]


def _given_id(topic_id: uuid.UUID | None) -> uuid.UUID | None:
    """A DeleteTopics v6 entry's id, None when it names the topic instead (the zero UUID)."""
    return None if topic_id is None or topic_id.int == 0 else topic_id


def _client(conn: ConnectionInfo) -> str:
    return f"client {conn.client_id!r} at {conn.host}"
