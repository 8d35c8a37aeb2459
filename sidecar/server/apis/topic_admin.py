"""The topic admin APIs: CreateTopics, DeleteTopics and CreatePartitions, answered the way a KRaft controller
answers them (error codes and messages of ControllerApis and ReplicationControlManager). Every topic change goes
through `registry.put`, or with a control store through a topic record; only a topic the API owns changes
(`admin_errors.check_api_owned`). DeleteTopics honours the broker setting `delete.topic.enable`
(TOPIC_DELETION_DISABLED when false).

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
import uuid
from base64 import urlsafe_b64encode
from collections import Counter
from typing import Any, Callable, Iterable

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
    NONE,
    TOPIC_ALREADY_EXISTS,
    TOPIC_DELETION_DISABLED,
    UNKNOWN_TOPIC_ID,
    UNKNOWN_TOPIC_OR_PARTITION,
)
from ...replication.control_store import StoreView
from ...replication.election import choose_replicas
from ...replication.topic_record import TopicRecord
from ...server_config import ServerConfig
from ...topics.manifests import RESERVED
from ...topics.registry import TopicRegistry, TopicSpec, topic_id_for, topic_uuid
from ..network.handler import ConnectionInfo, Handler
from .admin_errors import (
    DEFAULT_TIMEOUT_MS,
    AdminError,
    check_api_owned,
    client,
    parse_config,
    put,
    stored,
    topic_name_error,
)
from .config_admin import DEFAULT_NUM_PARTITIONS, topic_entries
from .store_topics import StoreTopics

logger = logging.getLogger(__name__)

API_CREATE_TOPICS, API_DELETE_TOPICS, API_CREATE_PARTITIONS = 19, 20, 37

# Kafka's default messages of the errors a lookup by name or by id answers.
UNKNOWN_TOPIC_MESSAGE = "This server does not host this topic-partition."
UNKNOWN_TOPIC_ID_MESSAGE = "This server does not host this topic ID."


class TopicAdmin:
    """The topic handlers; with `store_topics` the API's topics are its topic records (every node applies them),
    without it this node's."""

    def __init__(self, registry: TopicRegistry, server_config: ServerConfig | None,
                 removal_held: Callable[[str], bool], store_topics: StoreTopics | None) -> None:
        self.registry = registry
        self.server_config = server_config
        # A topic whose manifest is gone but whose removal the manifests hold (`ManifestSource.held`, e.g. an
        # unmounted volume): no manifest declares it any more, so DeleteTopics is the explicit act that deletes it.
        self.removal_held = removal_held
        self.store_topics = store_topics

    def handlers(self) -> dict[int, Handler]:
        return {
            API_CREATE_TOPICS: self._create_topics,
            API_DELETE_TOPICS: self._delete_topics,
            API_CREATE_PARTITIONS: self._create_partitions,
        }

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
                logger.info("CreateTopics from %s refused for topic %s: %s", client(conn), topic.name, exc.message)
                out.update(error_code=exc.code, error_message=exc.message)
                results.append(out)
                continue
            if not validate_only:
                logger.info("topic %s created by CreateTopics from %s (%s)", spec.name, client(conn),
                            plural(spec.partitions, "partition"))
            if version >= 5:
                replicas = len(spec.assignment[0]) if spec.assignment else 1
                out.update(num_partitions=spec.partitions, replication_factor=replicas, topic_config_error_code=NONE,
                           configs=[{"name": name, "value": value, "read_only": False, "config_source": source,
                                     "is_sensitive": False}
                                    for name, value, source in topic_entries(spec.config, None)])
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
            put(self.registry, spec)
            return spec
        topic_id = urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode("ascii")
        record = TopicRecord(spec.name, topic_id, spec.assignment, spec.config.overrides())
        if not await stored(self.store_topics.create(record, timeout_s)):
            raise AdminError(TOPIC_ALREADY_EXISTS, f"Topic '{spec.name}' already exists.")
        return record.spec()

    async def _view(self) -> StoreView:
        return await stored(self.store_topics.view())

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
        config = parse_config({c.name: c.value for c in topic.configs})
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

    # -- DeleteTopics ----------------------------------------------------------------------------

    async def _delete_topics(self, request: codec.Request, conn: ConnectionInfo) -> dict:
        """Kafka's ControllerApis.deleteTopics: topics by name (v1+) or by id (v6), each deleted at once."""
        version, body = request.api_version, request.body
        asked = ([(t.name, _given_id(t.topic_id)) for t in body.topics] if version >= 6
                 else [(name, None) for name in body.topic_names])
        if self.server_config is not None and not self.server_config.delete_topic_enable:
            code = TOPIC_DELETION_DISABLED if version >= 3 else INVALID_REQUEST
            logger.info("DeleteTopics from %s refused: delete.topic.enable is false", client(conn))
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
                logger.info("DeleteTopics from %s refused for topic %s: %s", client(conn), name or tid, exc.message)
                responses.append({"name": name, "topic_id": tid, "error_code": exc.code,
                                  "error_message": exc.message})
                continue
            logger.info("topic %s deleted by DeleteTopics from %s", name, client(conn))
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
            check_api_owned(self.registry.topics[name],
                            "delete the manifest (kubectl delete) to delete the topic; a deletion through the "
                            "Kafka API would be undone by the manifest",
                            "the node keeps it")
        if self.store_topics is not None and not held:  # every node deletes it as its view loses the record
            if not await stored(self.store_topics.delete(name, timeout_s)):
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
                                old, spec.partitions, client(conn))
            except AdminError as exc:
                logger.info("CreatePartitions from %s refused for topic %s: %s", client(conn), topic.name,
                            exc.message)
                out.update(error_code=exc.code, error_message=exc.message)
            results.append(out)
        return {"throttle_time_ms": 0, "results": results}

    async def _grow(self, topic: Any, spec: TopicSpec, timeout_s: float) -> None:
        """Apply a growth checked by `_grown`; with a store, to the topic record as it is when written."""
        if self.store_topics is None:
            put(self.registry, spec)
            return

        def grown(record: TopicRecord | None, view: StoreView) -> TopicRecord:
            if record is None:
                raise AdminError(UNKNOWN_TOPIC_OR_PARTITION, UNKNOWN_TOPIC_MESSAGE)
            new = self._grown(topic, view, record.spec())
            return dataclasses.replace(record, assignment=new.assignment)
        await stored(self.store_topics.change(topic.name, grown, timeout_s))

    def _grown(self, topic: Any, view: StoreView | None, spec: TopicSpec | None = None) -> TopicSpec:
        """The spec a CreatePartitionsTopic asks for, or AdminError, checked in Kafka's order. With a store
        (`view`), the new partitions' replicas are added to the assignment: as many as the topic's first
        partition has, on live nodes."""
        spec = spec or self.registry.topics.get(topic.name)
        if spec is None:
            raise AdminError(UNKNOWN_TOPIC_OR_PARTITION, UNKNOWN_TOPIC_MESSAGE)
        check_api_owned(spec, "edit the manifest's partitions (kubectl apply) to add partitions; the manifest "
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


def _given_id(topic_id: uuid.UUID | None) -> uuid.UUID | None:
    """A DeleteTopics v6 entry's id, None when it names the topic instead (the zero UUID)."""
    return None if topic_id is None or topic_id.int == 0 else topic_id
