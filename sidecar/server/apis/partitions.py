"""Kafka's partition APIs over the partitions a `TopicRegistry` hosts here: Metadata, Produce, Fetch, ListOffsets
and OffsetForLeaderEpoch, each a handler translating a request into `Log` calls.

With a control store (`replicas`, the replica manager) they answer what the store's records say: leaders and
epochs, acks=all parked until the ISR has the records (Kafka's DelayedProduce), followers' fetches read to the log
end; without one every partition here has its single replica. A fetch with nothing to read parks in the fetch
purgatory (fetch_purgatory.py) until an append or its max wait.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from ...log.errors import (
    CorruptRecordError,
    InvalidRecordError,
    InvalidTimestampError,
    KafkaStorageError,
    LogError,
    OffsetOutOfRangeError,
    RecordTooLargeError,
)
from ...log.log import Log
from ...log.segment import LogSlice
from ...log.topic_partition import TopicPartition
from ...protocol import codec
from ...protocol.codec import MAX_FRAME_BYTES
from ...protocol.error_codes import (
    CORRUPT_MESSAGE,
    FENCED_LEADER_EPOCH,
    INVALID_RECORD,
    INVALID_TIMESTAMP,
    KAFKA_STORAGE_ERROR,
    LEADER_NOT_AVAILABLE,
    LISTENER_NOT_FOUND,
    MESSAGE_TOO_LARGE,
    NONE,
    NOT_ENOUGH_REPLICAS,
    NOT_ENOUGH_REPLICAS_AFTER_APPEND,
    NOT_LEADER_OR_FOLLOWER,
    OFFSET_NOT_AVAILABLE,
    OFFSET_OUT_OF_RANGE,
    REQUEST_TIMED_OUT,
    TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
    UNKNOWN_LEADER_EPOCH,
    UNKNOWN_SERVER_ERROR,
    UNKNOWN_TOPIC_ID,
    UNKNOWN_TOPIC_OR_PARTITION,
)
from ...replication.fetch_session import FetchSessionCache
from ...replication.partition import NO_EPOCH
from ...replication.replica_manager import ReplicaManager
from ...replication.store_records import NO_LEADER
from ...topics.registry import TopicRegistry, topic_uuid
from ..network.connection import FileRange
from ..network.handler import (
    API_FETCH,
    API_LIST_OFFSETS,
    API_METADATA,
    API_OFFSET_FOR_LEADER_EPOCH,
    API_PRODUCE,
    ConnectionInfo,
    Handler,
)
from ..network.native_produce import appended
from ..network.socket_server import OUT_OF_RESOURCES
from .authorized_operations import CLUSTER_OPERATIONS, TOPIC_OPERATIONS
from .fetch_purgatory import FetchPurgatory
from .listener_addresses import ListenerAddresses
from .produce_admission import partition_refusal, request_refusal
from .transaction_verification import Verify

logger = logging.getLogger(__name__)

# Fetched record sets at least this big go out with sendfile; smaller ones are read and sent inline,
# where the few loop iterations of a sendfile would cost more than the copy they save.
SENDFILE_MIN_BYTES = 64 * 1024

DEBUGGING_REPLICA_ID = -2  # Kafka's: a request that may read any replica, not only the leader's


def controller_id(registry: TopicRegistry) -> int:
    """The node Metadata and DescribeCluster name as controller: the lowest node id, which also coordinates groups."""
    return min(registry.nodes())



def _append_error_code(exc: Exception) -> int:
    if isinstance(exc, CorruptRecordError):
        return CORRUPT_MESSAGE
    if isinstance(exc, RecordTooLargeError):
        return MESSAGE_TOO_LARGE
    code = getattr(exc, "error_code", None)  # engine errors that carry their Kafka code (idempotence)
    if code is not None:
        return code
    if isinstance(exc, InvalidTimestampError):  # before InvalidRecordError: it is a subclass
        return INVALID_TIMESTAMP
    if isinstance(exc, InvalidRecordError):
        return INVALID_RECORD
    if isinstance(exc, (LogError, OSError)):  # Kafka: an IOException becomes KafkaStorageException
        return KAFKA_STORAGE_ERROR
    return UNKNOWN_SERVER_ERROR


def _aborted_transactions(log: Log, fetch_offset: int, found: LogSlice | None) -> list[dict]:
    """A read_committed fetch's `aborted_transactions`: those overlapping what it returns (Kafka's
    addAbortedTransactions); an empty list, not null, when none or nothing is returned."""
    if found is None or found.size == 0:
        return []
    return [{"producer_id": t.producer_id, "first_offset": t.first_offset}
            for t in log.collect_aborted_transactions(fetch_offset, log.fetch_upper_bound(found))]


class PartitionApis:
    """The handlers of the partition APIs, over a registry's partitions (and a replica manager's, with a store)."""

    def __init__(self, registry: TopicRegistry, purgatory: FetchPurgatory, *, fetch_sessions: FetchSessionCache,
                 cluster_id: str = "shale", replicas: ReplicaManager | None = None,
                 verify_transaction: Verify | None = None, addresses: ListenerAddresses | None = None) -> None:
        self.registry = registry
        self.purgatory = purgatory
        # max.incremental.fetch.session.cache.slots: the fetch sessions of followers and consumers (KIP-227).
        self.fetch_sessions = fetch_sessions
        self.cluster_id = cluster_id
        # With a control store: leadership, epochs and the high watermark come from the replica manager
        # (docs/replication.md); without one (None) every partition here has one replica.
        self.replicas = replicas
        # The transaction coordinator's check of a producer's first transactional batch to a partition
        # (transaction_verification.py); the default verifies nothing, as a node without a coordinator.
        self.verify_transaction: Verify = verify_transaction or (lambda _tid, _pid, _epoch, _tp: None)
        # Each node's address on each listener (Metadata answers a request's listener with its endpoints).
        self.addresses = addresses if addresses is not None else ListenerAddresses(registry.node.node_id, replicas)

    @property
    def node_id(self) -> int:
        return self.registry.node.node_id

    def handlers(self) -> dict[int, Handler]:
        return {
            API_METADATA: self._metadata,
            API_PRODUCE: self._produce,
            API_FETCH: self._fetch,
            API_LIST_OFFSETS: self._list_offsets,
            API_OFFSET_FOR_LEADER_EPOCH: self._offset_for_leader_epoch,
        }

    def _partition_error(self, topic: str | None, partition: int) -> int:
        """Why a partition has no local log: unknown, or led by another node."""
        leader = self.registry.leader(topic, partition) if topic is not None else None
        return UNKNOWN_TOPIC_OR_PARTITION if leader is None else NOT_LEADER_OR_FOLLOWER

    async def _metadata(self, request: codec.Request, conn: ConnectionInfo) -> dict:
        version, body = request.api_version, request.body
        registry = self.registry
        cluster_operations = 8 <= version <= 10 and body.include_cluster_authorized_operations
        topic_operations = version >= 8 and body.include_topic_authorized_operations
        if body.topics is None or (version == 0 and not body.topics):
            wanted = list(registry.topics)
        else:
            wanted = [t.name for t in body.topics]
        topics = []
        for name in wanted:
            spec = registry.topics.get(name) if name is not None else None
            if spec is None:
                topics.append({"error_code": UNKNOWN_TOPIC_ID if name is None else UNKNOWN_TOPIC_OR_PARTITION,
                               "name": name, "partitions": []})
                continue
            partitions = []
            for p in range(spec.partitions):
                if self.replicas is not None:
                    partitions.append(self._replicated_metadata(TopicPartition(name, p), spec.replicas_of(p)))
                    continue
                leader = spec.node_of(p, self.node_id)
                partitions.append({"error_code": NONE, "partition_index": p, "leader_id": leader,
                                   "leader_epoch": -1, "replica_nodes": [leader], "isr_nodes": [leader],
                                   "offline_replicas": []})
            topics.append({"error_code": NONE, "name": name, "topic_id": topic_uuid(registry.topic_id(name)),
                           "is_internal": spec.internal, "partitions": partitions,
                           "authorized_operations": TOPIC_OPERATIONS if topic_operations else None})
        racks = {} if self.replicas is None else {n: reg.rack for n, reg in self.replicas.view.nodes.items()}
        addresses = {n.node_id: (n, self.addresses.address_on(n.node_id, conn.listener)) for n in registry.nodes().values()}
        for topic in topics:  # a leader without this listener: Kafka's KRaftMetadataCache answers no leader
            for part in topic.get("partitions", ()):
                leader = addresses.get(part["leader_id"])
                if leader is not None and leader[1] is None:
                    part["error_code"] = LISTENER_NOT_FOUND if version >= 6 else LEADER_NOT_AVAILABLE
                    part["leader_id"] = NO_LEADER
        return {
            "throttle_time_ms": 0,
            "brokers": [{"node_id": n.node_id, "host": n.host, "port": n.port, "rack": racks.get(n.node_id)} | shown
                        for n, shown in sorted(addresses.values(), key=lambda a: a[0].node_id) if shown is not None],
            "cluster_id": self.cluster_id,
            "controller_id": controller_id(registry),
            "topics": topics,
            "authorized_operations": CLUSTER_OPERATIONS if cluster_operations else None,
        }

    def _replicated_metadata(self, tp: TopicPartition, assigned: tuple[int, ...] | None) -> dict:
        """A partition as its store record has it: leader (-1 while being elected: LEADER_NOT_AVAILABLE, as
        Kafka answers), leader epoch, replicas, ISR, and the replicas without a live session."""
        replicas = self.replicas
        record = replicas.record(tp)
        if record is None:  # not created in the store yet
            return {"error_code": LEADER_NOT_AVAILABLE, "partition_index": tp.partition, "leader_id": -1,
                    "leader_epoch": -1, "replica_nodes": list(assigned or ()), "isr_nodes": [],
                    "offline_replicas": []}
        leader = replicas.announced_leader(record)
        return {"error_code": NONE if leader >= 0 else LEADER_NOT_AVAILABLE, "partition_index": tp.partition,
                "leader_id": leader, "leader_epoch": record.leader_epoch, "replica_nodes": list(record.replicas),
                "isr_nodes": list(record.isr),
                "offline_replicas": [r for r in record.replicas if not replicas.view.is_live(r)]}

    async def _produce(self, request: codec.Request, conn: ConnectionInfo) -> dict:
        version, body = request.api_version, request.body
        responses = []
        parked: list[tuple[str, dict, Any]] = []  # acks=all appends waiting for the high watermark
        if request_refusal(body.transactional_id, body.topic_data):
            logger.error("produce from client %r at %s refused: transactional records without a transactional id",
                         conn.client_id, conn.host)
            return {"throttle_time_ms": 0, "responses": [
                {"name": t.name, "partition_responses": [
                    {"index": pd.index, "error_code": TRANSACTIONAL_ID_AUTHORIZATION_FAILED, "base_offset": -1,
                     "log_append_time_ms": -1, "log_start_offset": -1} for pd in t.partition_data]}
                for t in body.topic_data]}
        for topic in body.topic_data:
            parts = []
            for pd in topic.partition_data:
                part = self._produce_partition(version, body.acks, topic.name, pd.index, pd.records,
                                               body.transactional_id)
                reason = part.pop("_reason", None)
                if reason is not None:  # Kafka logs refused appends too (ReplicaManager.processFailedRecord)
                    self._log_refused(conn, topic.name, pd.index, part["error_code"], reason)
                waiter = part.pop("_waiter", None)
                if waiter is not None:
                    parked.append((topic.name, part, waiter))
                parts.append(part)
            responses.append({"name": topic.name, "partition_responses": parts})
        if parked:
            await self._await_replication(version, body.timeout_ms, parked, conn)
        if self.replicas is None:
            return {"responses": responses, "throttle_time_ms": 0}
        endpoints = self._point_to_leaders(
            (TopicPartition(t["name"], part["index"]), part) for t in responses for part in t["partition_responses"])
        shown = {e["node_id"]: self.addresses.address_on(e["node_id"], conn.listener) for e in endpoints}  # on its listener
        endpoints = [e | shown[e["node_id"]] for e in endpoints if shown[e["node_id"]] is not None]
        return {"responses": responses, "throttle_time_ms": 0, "node_endpoints": endpoints}

    def _point_to_leaders(self, parts) -> list[dict]:
        """KIP-951: a partition answered NOT_LEADER_OR_FOLLOWER (or FENCED_LEADER_EPOCH) names the leader this
        node knows, with its epoch (`current_leader`; Produce v10+, Fetch v12+), so a client can go there
        without first re-reading Metadata; the leaders' addresses go in `node_endpoints` (Produce v10+)."""
        endpoints: dict[int, dict] = {}
        for tp, out in parts:
            if out["error_code"] not in (NOT_LEADER_OR_FOLLOWER, FENCED_LEADER_EPOCH):
                continue
            record = self.replicas.record(tp)
            leader = NO_LEADER if record is None else self.replicas.valid_leader(record)
            if leader == NO_LEADER:
                continue
            out["current_leader"] = {"leader_id": leader, "leader_epoch": record.leader_epoch}
            node = self.replicas.view.nodes[leader]
            endpoints[leader] = {"node_id": leader, "host": node.host, "port": node.port, "rack": node.rack}
        return list(endpoints.values())

    @staticmethod
    def _log_refused(conn: ConnectionInfo, topic: str, partition: int, code: int, reason: str) -> None:
        # A client behind a leadership change is routine; replication slower than the request's timeout, or an
        # ISR shrunk under the append, is the cluster's state (as Kafka, which logs neither as an error); the
        # rest (corrupt or invalid records, storage failures) stays an error.
        level = (logging.INFO if code in (UNKNOWN_TOPIC_OR_PARTITION, NOT_LEADER_OR_FOLLOWER, NOT_ENOUGH_REPLICAS)
                 else logging.WARNING if code in (REQUEST_TIMED_OUT, NOT_ENOUGH_REPLICAS_AFTER_APPEND)
                 else logging.ERROR)
        logger.log(level,
                   "produce from client %r at %s to %s-%d refused with error %d: %s", conn.client_id,
                   conn.host, topic, partition, code, reason)

    async def _await_replication(self, version: int, timeout_ms: int, parked: list, conn: ConnectionInfo) -> None:
        """Kafka's DelayedProduce: each parked partition answers when its waiter is done, or REQUEST_TIMED_OUT
        after the request's `timeout_ms`. The records stay appended whatever the answer (the client may retry;
        an idempotent producer's retry is answered from the log)."""
        waiters = [w for _, _, w in parked]
        try:
            await asyncio.wait([w.done for w in waiters], timeout=max(timeout_ms, 0) / 1000)
        finally:
            for w in waiters:
                self.replicas.delayed.forget(w)
        for topic, part, waiter in parked:
            code = waiter.done.result() if waiter.done.done() else REQUEST_TIMED_OUT
            if code == NONE:
                continue
            part["error_code"] = code
            message = (f"{topic}-{part['index']}: offsets {part['base_offset']}..{waiter.required_offset - 1} "
                       f"appended in leader epoch {waiter.leader_epoch} but not acknowledged by the ISR")
            if version >= 8:
                part["error_message"] = message
            self._log_refused(conn, topic, part["index"], code, message)

    def _produce_partition(self, version: int, acks: int, topic: str, partition: int, records,
                           transactional_id: str | None = None) -> dict:
        out = {"index": partition, "error_code": NONE, "base_offset": -1, "log_append_time_ms": -1,
               "log_start_offset": -1}

        def fail(code: int, message: str, log: bool = True) -> dict:
            out["error_code"] = code
            if log:
                out["_reason"] = message  # for the log line; removed before encoding
            if version >= 8:
                out["error_message"] = message
            return out

        tp = TopicPartition(topic, partition)
        leading = self.replicas.leader(tp) if self.replicas is not None else None
        log = self.registry.local_log(topic, partition) if self.replicas is None else (
            leading.log if leading is not None else None)
        if log is None:
            code = self._partition_error(topic, partition)
            where = "unknown" if code == UNKNOWN_TOPIC_OR_PARTITION else "not led by this node:"
            return fail(code, f"{where} topic-partition {topic}-{partition}")
        refused = partition_refusal(version, acks, records, tp, log, transactional_id, self.verify_transaction,
                                    leading)
        if refused is not None:
            return fail(refused.code, refused.message, refused.log)
        try:
            info = log.append(records, leader_epoch=None if leading is None else leading.leader_epoch)
        except Exception as exc:  # noqa: BLE001 - mapped to a per-partition error code
            code = _append_error_code(exc)
            if code in (UNKNOWN_SERVER_ERROR, KAFKA_STORAGE_ERROR) and not isinstance(exc, KafkaStorageError):
                logger.exception("append to %s-%d failed", topic, partition)  # the engine logged its own reason
            return fail(code, str(exc))
        out.update(base_offset=info.first_offset, log_append_time_ms=info.log_append_time,
                   log_start_offset=log.log_start_offset)
        if leading is None:
            self.purgatory.poke(tp)
            return out
        self.replicas.appended(leading)
        if acks == -1:
            out["_waiter"] = self.replicas.park(leading, info.last_offset)
        return out

    async def _fetch(self, request: codec.Request, conn: ConnectionInfo) -> dict:
        body = request.body
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(body.max_wait_ms, 0) / 1000
        min_bytes = max(body.min_bytes, 0)
        follower = self.replicas is not None and body.replica_id >= 0
        # What to read: the request's partitions, or for an incremental fetch every partition of its session.
        context = self.fetch_sessions.context(
            body.session_id, body.session_epoch, [(t.topic, t.partitions) for t in body.topics],
            [(t.topic, p) for t in body.forgotten_topics_data for p in t.partitions], body.replica_id >= 0,
            int(loop.time() * 1000))
        if context.error:  # an unknown session or a stale epoch: nothing is read
            return {"throttle_time_ms": 0, "error_code": context.error, "session_id": 0, "responses": []}
        first = True
        while True:
            # Reading and parking are one synchronous step for the appends made on this loop, so none falls
            # between them; a poke made by this very read (a follower's position raising the high watermark)
            # does not wake it back. The I/O thread's appends are counted: one made between the read and the
            # parking wakes the fetch at once (`FetchPurgatory.park`).
            since = appended()
            responses, total, errors = self._fetch_once(body, context.topics, first)
            first = False
            if total >= min_bytes or errors or loop.time() >= deadline:
                break
            hosted = {TopicPartition(topic, p.partition) for topic, partitions in context.topics for p in partitions
                      if self._hosts(topic, p.partition)}
            if not hosted:
                break
            await self.purgatory.park(hosted, deadline, follower, since)
        error, session_id, responses = context.answer(responses, int(loop.time() * 1000))
        return {"throttle_time_ms": 0, "error_code": error, "session_id": session_id, "responses": responses}

    def _hosts(self, topic: str | None, partition: int) -> bool:
        """A replica of the partition is here (a fetch of it may wait for appends)."""
        if self.replicas is None:
            return self.registry.local_log(topic, partition) is not None
        return topic is not None and TopicPartition(topic, partition) in self.replicas.partitions

    def _fetch_once(self, body, topics: list[tuple[str, list[Any]]], first: bool) -> tuple[list, int, bool]:
        """One read of `topics` ((topic, the request's partitions) in answer order) under `body`'s limits."""
        budget = body.max_bytes if body.max_bytes > 0 else MAX_FRAME_BYTES
        read_committed = body.isolation_level == 1
        total = 0
        errors = False
        responses = []
        for topic, partitions in topics:
            parts = []
            for p in partitions:
                out = {"partition_index": p.partition, "error_code": NONE, "high_watermark": -1,
                       "last_stable_offset": -1, "log_start_offset": -1, "aborted_transactions": None,
                       "records": b""}
                parts.append(out)
                if self.replicas is None:
                    log = self.registry.local_log(topic, p.partition)
                    if log is None:
                        out["error_code"] = self._partition_error(topic, p.partition)
                        errors = True
                        continue
                    hw = log.high_watermark
                    lso = log.last_stable_offset
                    max_offset = lso if read_committed else hw
                else:
                    log, max_offset = self._replicated_fetch(body.replica_id, TopicPartition(topic, p.partition),
                                                             p, read_committed, first, out)
                    if log is None:
                        errors = True
                        continue
                    hw, lso = out["high_watermark"], out["last_stable_offset"]
                out.update(high_watermark=hw, last_stable_offset=lso, log_start_offset=log.log_start_offset)
                limit = min(p.partition_max_bytes, budget - total)
                try:
                    with log.lock:  # the slice and the duplicated descriptor describe the same file
                        found = log.read(p.fetch_offset, max(limit, 0), max_offset=max_offset,
                                         min_one_message=(total == 0))
                        if read_committed:
                            out["aborted_transactions"] = _aborted_transactions(log, p.fetch_offset, found)
                        if found is not None and found.size >= SENDFILE_MIN_BYTES:
                            try:
                                out["records"] = FileRange(found.segment.dup_fd(), found.position, found.size,
                                                            f"{topic}-{p.partition} {found.segment.log_path}")
                            except OSError as exc:  # out of descriptors: the bytes go inline instead
                                if exc.errno not in OUT_OF_RESOURCES:
                                    raise
                                out["records"] = found.read()
                except OffsetOutOfRangeError:
                    out["error_code"] = OFFSET_OUT_OF_RANGE
                    errors = True
                    continue
                if found is not None and found.size > 0:
                    if found.size < SENDFILE_MIN_BYTES:
                        out["records"] = found.read()
                    total += found.size
                    if self.replicas is not None and body.replica_id >= 0:  # throttles, reassignment bytes
                        self.replicas.sent_to_follower(TopicPartition(topic, p.partition), body.replica_id,
                                                       found.size)
            responses.append({"topic": topic, "partitions": parts})
        if self.replicas is not None and errors:
            self._point_to_leaders((TopicPartition(t["topic"], part["partition_index"]), part)
                                   for t in responses for part in t["partitions"])
        return responses, total, errors

    def _replicated_fetch(self, replica_id: int, tp: TopicPartition, p, read_committed: bool, first: bool,
                          out: dict) -> tuple[Log | None, int | None]:
        """Where a fetch of a replicated partition reads: (log, highest offset to read; None = the log end),
        or (None, None) with the error (or the diverging epoch) set in `out`.

        Consumers read the leader up to its high watermark (last stable offset); followers (replica id >= 0,
        Kafka's FetchIsolation.LOG_END) read to the log end, are told where their log diverged from the
        leader's (`DivergingEpoch`, from their last fetched epoch), and their first read of a request counts as
        their position (Kafka's updateFollowerFetchState), which may raise the high watermark."""
        replicas = self.replicas
        follower = replica_id >= 0
        current_epoch = p.current_leader_epoch
        part, code = replicas.replica_for(tp, current_epoch, acknowledging=follower)
        if part is not None and follower and replica_id not in part.state.followers:
            part, code = None, UNKNOWN_LEADER_EPOCH if current_epoch != NO_EPOCH else NOT_LEADER_OR_FOLLOWER
        if part is None:
            out["error_code"] = code
            return None, None
        log = part.log
        if not follower:
            hw, lso = log.high_watermark, log.last_stable_offset
            out.update(high_watermark=hw, last_stable_offset=lso)
            return log, lso if read_committed else hw
        with log.lock:
            leo, log_start = log.log_end_offset, log.log_start_offset
            end = log.end_offset_for_epoch(p.last_fetched_epoch) if p.last_fetched_epoch >= 0 else None
        if end is not None:
            epoch, end_offset = end
            if epoch < 0 or end_offset < 0 or p.fetch_offset < log_start:
                out["error_code"] = OFFSET_OUT_OF_RANGE
                return None, None
            if epoch < p.last_fetched_epoch or end_offset < p.fetch_offset:
                out["diverging_epoch"] = {"epoch": epoch, "end_offset": end_offset}
                out.update(high_watermark=log.high_watermark, last_stable_offset=log.last_stable_offset,
                           log_start_offset=log_start)
                return None, None
        if first and log_start <= p.fetch_offset <= leo:
            replicas.follower_fetched(part, replica_id, p.fetch_offset, p.log_start_offset, leo)
        out.update(high_watermark=log.high_watermark, last_stable_offset=log.last_stable_offset)
        if replicas.leader_held_back(part, replica_id):  # leader.replication.throttled.rate: no records now
            return log, p.fetch_offset
        return log, None

    async def _list_offsets(self, request: codec.Request, conn: ConnectionInfo) -> dict:
        body = request.body
        read_committed = body.isolation_level == 1
        topics = []
        for t in body.topics:
            parts = []
            for p in t.partitions:
                out = {"partition_index": p.partition_index, "error_code": NONE, "timestamp": -1, "offset": -1,
                       "leader_epoch": -1}
                parts.append(out)
                if self.replicas is not None:
                    self._replicated_list_offset(body.replica_id, TopicPartition(t.name, p.partition_index), p,
                                                 read_committed, out)
                    continue
                log = self.registry.local_log(t.name, p.partition_index)
                if log is None:
                    out["error_code"] = self._partition_error(t.name, p.partition_index)
                    continue
                ts = p.timestamp
                if ts == -1:
                    out["offset"] = log.last_stable_offset if read_committed else log.high_watermark
                elif ts in (-2, -4):  # earliest, earliest-local (no tiered storage)
                    out["offset"] = log.log_start_offset
                elif ts == -3 or ts >= 0:
                    found = log.offset_for_timestamp(ts)
                    if found is not None:
                        out["offset"], out["timestamp"] = found
                # other negative targets (tiered storage): offset -1, timestamp -1
            topics.append({"name": t.name, "partitions": parts})
        return {"throttle_time_ms": 0, "topics": topics}

    def _replicated_list_offset(self, replica_id: int, tp: TopicPartition, p, read_committed: bool,
                                out: dict) -> None:
        """Kafka's Partition.fetchOffsetForTimestamp: the leader answers (after the epoch checks), consumers up to
        the high watermark (last stable offset) and followers up to the log end, each answer with its leader
        epoch. A new leader whose high watermark has not yet reached the start of its epoch answers
        OFFSET_NOT_AVAILABLE for the latest offset, so no consumer is told an offset that may move back."""
        part, code = self.replicas.replica_for(tp, p.current_leader_epoch,
                                               leader_only=replica_id != DEBUGGING_REPLICA_ID)
        if part is None:
            out["error_code"] = code
            return
        log, ts = part.log, p.timestamp
        with log.lock:
            follower = replica_id >= 0
            fetchable = log.log_end_offset if follower else (
                log.last_stable_offset if read_committed else log.high_watermark)
            lagging = not follower and part.state.leader_epoch_start_offset > log.high_watermark
            if ts == -1:
                if lagging:
                    out["error_code"] = OFFSET_NOT_AVAILABLE
                else:
                    out.update(offset=fetchable, leader_epoch=part.leader_epoch)
                return
            if ts in (-2, -4):  # earliest, earliest-local (no tiered storage)
                found = (log.log_start_offset, -1)
            elif ts == -3 or ts >= 0:
                found = log.offset_for_timestamp(ts)
                if found is None or found[0] >= fetchable:
                    found = None
                    if lagging:
                        out["error_code"] = OFFSET_NOT_AVAILABLE
            else:  # other negative targets (tiered storage): offset -1, timestamp -1
                found = None
            if found is not None:
                epoch = log.leader_epoch_cache.epoch_for_offset(found[0])
                out.update(offset=found[0], timestamp=found[1], leader_epoch=-1 if epoch is None else epoch)

    async def _offset_for_leader_epoch(self, request: codec.Request, conn: ConnectionInfo) -> dict:
        """OffsetForLeaderEpoch (API 23): the end offset of the largest leader epoch at or below the one asked for
        (Kafka's endOffsetForEpoch: the start of the next epoch, or the log end for the latest; -1/-1 when
        unknown). Clients check their positions with it after a leader change (KIP-320). With a control store
        the leader answers, after the epoch checks; without one, the partition's only replica."""
        body = request.body
        topics = []
        for t in body.topics:
            parts = []
            for p in t.partitions:
                out = {"partition": p.partition, "error_code": NONE, "leader_epoch": -1, "end_offset": -1}
                parts.append(out)
                if self.replicas is not None:
                    part, code = self.replicas.replica_for(TopicPartition(t.topic, p.partition),
                                                           p.current_leader_epoch,
                                                           leader_only=body.replica_id != DEBUGGING_REPLICA_ID)
                    log = None if part is None else part.log
                else:
                    log = self.registry.local_log(t.topic, p.partition)
                    code = NONE if log is not None else self._partition_error(t.topic, p.partition)
                if log is None:
                    out["error_code"] = code
                    continue
                out["leader_epoch"], out["end_offset"] = log.end_offset_for_epoch(p.leader_epoch)
            topics.append({"topic": t.topic, "partitions": parts})
        return {"throttle_time_ms": 0, "topics": topics}
