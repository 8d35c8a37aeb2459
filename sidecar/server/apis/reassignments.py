"""AlterPartitionReassignments (API 45) and ListPartitionReassignments (API 46), KIP-455, served by any node.

A reassignment is state in the partition record (`replication/reassignment.py`, docs/moves.md). Who declares
a topic's replicas decides how a request becomes that state:

- a topic created through the API (a topic record in the store): its record's assignment is rewritten (CAS),
  and every replica's controller starts or cancels the move from it, as for a changed manifest — so the
  declaration and the partition record never disagree and no node moves the partition back;
- a topic whose replicas no declaration names (a manifest with `spec.replicas` only, `__consumer_offsets`):
  the partition record itself is rewritten (CAS);
- a topic whose manifest names its replicas (`spec.assignment`, the operator's): POLICY_VIOLATION naming the
  manifest, since the next reload would undo the move; the manifest is where that topic's replicas change.

The answer goes out once this node's view shows the change (bounded by the request's timeout), so a
ListPartitionReassignments that follows sees it. Kafka's errors: UNKNOWN_TOPIC_OR_PARTITION,
INVALID_REPLICA_ASSIGNMENT (empty, duplicates, a node without a session), INVALID_REPLICATION_FACTOR
(`AllowReplicationFactorChange` false), NO_REASSIGNMENT_IN_PROGRESS (cancelling none), REQUEST_TIMED_OUT
(the store did not answer).
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any, Callable

from ...log.topic_partition import TopicPartition
from ...protocol import codec
from ...protocol.error_codes import (
    INVALID_REPLICA_ASSIGNMENT,
    INVALID_REPLICATION_FACTOR,
    NO_REASSIGNMENT_IN_PROGRESS,
    NONE,
    POLICY_VIOLATION,
    REQUEST_TIMED_OUT,
    UNKNOWN_TOPIC_OR_PARTITION,
)
from ...replication import reassignment
from ...replication.control_store import StoreUnavailable, StoreView
from ...replication.store_records import PartitionRecord
from ...replication.topic_record import TopicRecord
from ...topics.manifests import ORIGIN_PREFIX
from ...topics.registry import TopicRegistry
from ..network.handler import ConnectionInfo, Handler
from .admin_errors import AdminError
from .store_topics import StoreConflict, StoreTopics

logger = logging.getLogger(__name__)

API_ALTER_PARTITION_REASSIGNMENTS, API_LIST_PARTITION_REASSIGNMENTS = 45, 46
DEFAULT_TIMEOUT_MS = 60000


@dataclasses.dataclass
class Reassignments:
    """The two handlers; `view()` is this node's latest view of the store (the replica manager's)."""

    registry: TopicRegistry
    store_topics: StoreTopics | None
    view: Callable[[], StoreView]

    def handlers(self) -> dict[int, Handler]:
        return {API_ALTER_PARTITION_REASSIGNMENTS: self._alter, API_LIST_PARTITION_REASSIGNMENTS: self._list}

    # -- AlterPartitionReassignments ---------------------------------------------------------------

    async def _alter(self, request: codec.Request, conn: ConnectionInfo) -> dict:
        body = request.body
        timeout_s = (body.timeout_ms if body.timeout_ms and body.timeout_ms > 0 else DEFAULT_TIMEOUT_MS) / 1000
        allow_rf_change = getattr(body, "allow_replication_factor_change", True)
        responses = []
        for topic in body.topics:
            partitions = []
            for part in topic.partitions:
                tp = TopicPartition(topic.name, part.partition_index)
                target = None if part.replicas is None else tuple(part.replicas)
                out = {"partition_index": part.partition_index, "error_code": NONE, "error_message": None}
                try:
                    await self._alter_one(tp, target, allow_rf_change, timeout_s)
                    logger.info("%s: reassignment %s by AlterPartitionReassignments from client %r at %s", tp,
                                "cancelled" if target is None else f"to replicas {list(target)}", conn.client_id,
                                conn.host)
                except AdminError as exc:
                    logger.info("%s: AlterPartitionReassignments from client %r refused: %s", tp, conn.client_id,
                                exc.message)
                    out.update(error_code=exc.code, error_message=exc.message)
                partitions.append(out)
            responses.append({"name": topic.name, "partitions": partitions})
        return {"throttle_time_ms": 0, "error_code": NONE, "error_message": None, "responses": responses}

    async def _alter_one(self, tp: TopicPartition, target: tuple[int, ...] | None, allow_rf_change: bool,
                         timeout_s: float) -> None:
        spec = self.registry.topics.get(tp.topic)
        if spec is None or not 0 <= tp.partition < spec.partitions:
            raise AdminError(UNKNOWN_TOPIC_OR_PARTITION, "The partition does not exist.")
        if self.store_topics is None:
            raise AdminError(INVALID_REPLICA_ASSIGNMENT, "This node has no control store (shale serve --store): each "
                                                      "partition has one replica, which cannot move.")
        try:
            view = await self.store_topics.view()
            current = view.partitions.get(tp)
            if current is None:
                raise AdminError(UNKNOWN_TOPIC_OR_PARTITION, f"{tp} has no partition record yet.")
            record = current.record
            if target is None:
                if not record.reassigning:
                    raise AdminError(NO_REASSIGNMENT_IN_PROGRESS, f"No ongoing reassignment for {tp}.")
                wanted = record.original_replicas
            else:
                try:
                    reassignment.check_target(target, view.nodes)
                except reassignment.InvalidTarget as exc:
                    raise AdminError(INVALID_REPLICA_ASSIGNMENT, f"{tp}: {exc}.") from None
                if not allow_rf_change and len(target) != len(record.target_replicas):
                    raise AdminError(INVALID_REPLICATION_FACTOR, f"The replication factor is changed from "
                                  f"{len(record.target_replicas)} to {len(target)} but AllowReplicationFactorChange"
                                  " is false.")
                wanted = target
            await self._write(tp, spec.origin, wanted, view, timeout_s)
        except (StoreUnavailable, StoreConflict) as exc:
            raise AdminError(REQUEST_TIMED_OUT, f"The control store did not take the change: {exc}") from None
        done = (lambda r: not r.reassigning) if target is None else (lambda r: r.target_replicas == target)
        await self.store_topics.applied(lambda: self._shows(tp, done), timeout_s, f"the reassignment of {tp}")

    async def _write(self, tp: TopicPartition, origin: str, wanted: tuple[int, ...], view: StoreView,
                     timeout_s: float) -> None:
        assert self.store_topics is not None
        if origin.startswith(ORIGIN_PREFIX):
            spec = self.registry.topics[tp.topic]
            if spec.assignment is not None:
                raise AdminError(POLICY_VIOLATION, f"Topic '{tp.topic}' is declared by the Topic manifest "
                              f"{origin[len(ORIGIN_PREFIX):]}, which names its replicas: change spec.assignment "
                              "there (a move made here would be undone at its next reload).")
        if tp.topic in view.topics:
            def change(record: TopicRecord | None, _view: StoreView) -> TopicRecord:
                if record is None or tp.partition >= record.partitions:
                    raise AdminError(UNKNOWN_TOPIC_OR_PARTITION, "The partition does not exist.")
                assignment = list(record.assignment)
                assignment[tp.partition] = wanted
                return dataclasses.replace(record, assignment=tuple(assignment))

            await self.store_topics.change(tp.topic, change, timeout_s)  # every replica's controller moves it
            return
        live = {n: reg.incarnation for n, reg in view.nodes.items()}

        def move(record: PartitionRecord) -> PartitionRecord | None:
            return reassignment.start(record, wanted, live)

        await self.store_topics.change_partition(tp, move)

    def _shows(self, tp: TopicPartition, done: Callable[[PartitionRecord], bool]) -> bool:
        current = self.view().partitions.get(tp)
        return current is not None and done(current.record)

    # -- ListPartitionReassignments ----------------------------------------------------------------

    async def _list(self, request: codec.Request, conn: ConnectionInfo) -> dict:
        wanted: dict[str, set[int] | None] | None = None
        if request.body.topics is not None:
            wanted = {t.name: set(t.partition_indexes) for t in request.body.topics}
        if self.store_topics is None:
            return {"throttle_time_ms": 0, "error_code": NONE, "error_message": None, "topics": []}
        try:
            view = await self.store_topics.view()
        except StoreUnavailable as exc:
            return {"throttle_time_ms": 0, "error_code": REQUEST_TIMED_OUT,
                    "error_message": f"The control store did not answer: {exc}", "topics": []}
        topics: dict[str, list[dict[str, Any]]] = {}
        for tp, versioned in sorted(view.partitions.items(), key=lambda item: (item[0].topic, item[0].partition)):
            record = versioned.record
            if not record.reassigning or (wanted is not None and tp.partition not in wanted.get(tp.topic, ())):
                continue
            topics.setdefault(tp.topic, []).append({
                "partition_index": tp.partition, "replicas": list(record.replicas),
                "adding_replicas": list(record.adding_replicas), "removing_replicas": list(record.removing_replicas)})
        return {"throttle_time_ms": 0, "error_code": NONE, "error_message": None,
                "topics": [{"name": name, "partitions": parts} for name, parts in topics.items()]}
