"""The transaction coordinator's Kafka APIs: InitProducerId, AddPartitionsToTxn, AddOffsetsToTxn, EndTxn,
DescribeTransactions, ListTransactions and WriteTxnMarkers, each request decoded into a call on the coordinator
and each result encoded as the request's version has it."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from ....protocol import codec
from ....protocol.error_codes import (
    COORDINATOR_NOT_AVAILABLE,
    INVALID_PRODUCER_EPOCH,
    INVALID_REQUEST,
    NONE,
    OPERATION_NOT_ATTEMPTED,
    PRODUCER_FENCED,
    TRANSACTIONAL_ID_NOT_FOUND,
    UNKNOWN_TOPIC_OR_PARTITION,
)
from ..group.offset_records import OFFSETS_TOPIC, partition_for
from .producer_ids import init_producer_id as idempotent_producer_id
from .transaction_state import STATE_NAMES
from .txn_markers import API_WRITE_TXN_MARKERS, Marker, request_partitions, response_markers

if TYPE_CHECKING:
    from .coordinator import TransactionCoordinator

API_INIT_PRODUCER_ID, API_ADD_PARTITIONS_TO_TXN, API_ADD_OFFSETS_TO_TXN, API_END_TXN = 22, 24, 25, 26
API_DESCRIBE_TRANSACTIONS, API_LIST_TRANSACTIONS = 65, 66

# Request versions before KIP-588 get INVALID_PRODUCER_EPOCH where newer ones get PRODUCER_FENCED.
_FIRST_FENCED_VERSION = {API_INIT_PRODUCER_ID: 4, API_ADD_PARTITIONS_TO_TXN: 2, API_ADD_OFFSETS_TO_TXN: 2,
                         API_END_TXN: 2}


class TransactionApis:
    """The wire side of a `TransactionCoordinator`."""

    def __init__(self, coordinator: TransactionCoordinator) -> None:
        self.coordinator = coordinator

    def handlers(self) -> dict[int, Any]:
        return {API_INIT_PRODUCER_ID: self._handle_init_producer_id,
                API_ADD_PARTITIONS_TO_TXN: self._handle_add_partitions,
                API_ADD_OFFSETS_TO_TXN: self._handle_add_offsets,
                API_END_TXN: self._handle_end_txn,
                API_DESCRIBE_TRANSACTIONS: self._handle_describe,
                API_LIST_TRANSACTIONS: self._handle_list,
                API_WRITE_TXN_MARKERS: self._handle_write_markers}

    @staticmethod
    def _error_for(api_key: int, version: int, error: int) -> int:
        if error == PRODUCER_FENCED and version < _FIRST_FENCED_VERSION[api_key]:
            return INVALID_PRODUCER_EPOCH
        return error

    async def _handle_init_producer_id(self, request: codec.Request, conn) -> dict:
        v, b = request.api_version, request.body
        if b.transactional_id is None:
            return idempotent_producer_id(self.coordinator.producer_ids, v, b)
        expected = (b.producer_id, b.producer_epoch) if v >= 3 and b.producer_id >= 0 else None
        error, pid, epoch = await self.coordinator.init_producer_id(b.transactional_id, b.transaction_timeout_ms, expected)
        return {"throttle_time_ms": 0, "error_code": self._error_for(API_INIT_PRODUCER_ID, v, error),
                "producer_id": pid, "producer_epoch": epoch}

    def _partition_errors(self, topics) -> tuple[frozenset[tuple[str, int]], dict[tuple[str, int], int]]:
        """The partitions asked for, and UNKNOWN_TOPIC_OR_PARTITION for those that do not exist."""
        asked = frozenset((t.name, p) for t in topics for p in t.partitions)
        unknown = {tp: UNKNOWN_TOPIC_OR_PARTITION for tp in asked if self.coordinator.registry.leader(*tp) is None}
        return asked, unknown

    async def _handle_add_partitions(self, request: codec.Request, conn) -> dict:
        v, b = request.api_version, request.body
        asked, errors = self._partition_errors(b.v3_and_below_topics)
        if errors:  # Kafka: the unknown ones fail, the others OPERATION_NOT_ATTEMPTED (55)
            errors = {tp: errors.get(tp, OPERATION_NOT_ATTEMPTED) for tp in asked}
        else:
            error = self._error_for(API_ADD_PARTITIONS_TO_TXN, v, await self.coordinator.add_partitions(
                b.v3_and_below_transactional_id, b.v3_and_below_producer_id, b.v3_and_below_producer_epoch, asked))
            errors = {tp: error for tp in asked}
        by_topic: dict[str, list[dict]] = {}
        for (topic, partition), error in sorted(errors.items()):
            by_topic.setdefault(topic, []).append({"partition_index": partition, "partition_error_code": error})
        return {"throttle_time_ms": 0, "results_by_topic_v3_and_below": [
            {"name": t, "results_by_partition": r} for t, r in by_topic.items()]}

    async def _handle_add_offsets(self, request: codec.Request, conn) -> dict:
        v, b = request.api_version, request.body
        offsets_partition = (OFFSETS_TOPIC, partition_for(b.group_id, self.coordinator.offsets_partitions))
        error = await self.coordinator.add_partitions(b.transactional_id, b.producer_id, b.producer_epoch,
                                                      frozenset({offsets_partition}))
        return {"throttle_time_ms": 0, "error_code": self._error_for(API_ADD_OFFSETS_TO_TXN, v, error)}

    async def _handle_end_txn(self, request: codec.Request, conn) -> dict:
        v, b = request.api_version, request.body
        error = await self.coordinator.end_txn(b.transactional_id, b.producer_id, b.producer_epoch, bool(b.committed))
        return {"throttle_time_ms": 0, "error_code": self._error_for(API_END_TXN, v, error),
                "producer_id": -1, "producer_epoch": -1}

    def describe(self, transactional_id: str) -> dict:
        meta = self.coordinator.txns.get(transactional_id)
        out = {"transactional_id": transactional_id, "transaction_state": "", "transaction_timeout_ms": 0,
               "transaction_start_time_ms": -1, "producer_id": -1, "producer_epoch": -1, "topics": []}
        error = self.coordinator.coordinating(transactional_id)
        if error == NONE and meta is None:
            error = TRANSACTIONAL_ID_NOT_FOUND
        if error != NONE:
            return {**out, "error_code": error}
        by_topic: dict[str, list[int]] = {}
        for topic, partition in sorted(meta.partitions):
            by_topic.setdefault(topic, []).append(partition)
        return {**out, "error_code": NONE, "transaction_state": STATE_NAMES[meta.state],
                "transaction_timeout_ms": meta.timeout_ms, "transaction_start_time_ms": meta.start_timestamp_ms,
                "producer_id": meta.producer_id, "producer_epoch": meta.producer_epoch,
                "topics": [{"topic": t, "partitions": ps} for t, ps in by_topic.items()]}

    async def _handle_describe(self, request: codec.Request, conn) -> dict:
        return {"throttle_time_ms": 0,
                "transaction_states": [self.describe(t) for t in request.body.transactional_ids]}

    def list_transactions(self, states: list[str], producer_ids: list[int], min_duration_ms: int = -1,
                          pattern: str | None = None) -> tuple[list[str], list[dict]]:
        """Kafka's ListTransactions filters: states by name (unknown ones reported), producer ids, the time
        since the transaction started, and (v2) a Java regular expression on the id (Python's `re` here)."""
        names = {name: state for state, name in STATE_NAMES.items()}
        unknown = [s for s in states if s not in names]
        wanted = {names[s] for s in states if s in names}
        now = self.coordinator.clock.now_ms()
        regex = re.compile(pattern) if pattern else None
        found = [m for m in self.coordinator.txns.values()
                 if (not states or m.state in wanted) and (not producer_ids or m.producer_id in producer_ids)
                 and (min_duration_ms < 0 or (m.start_timestamp_ms >= 0 and now - m.start_timestamp_ms >= min_duration_ms))
                 and (regex is None or regex.fullmatch(m.transactional_id))]
        return unknown, [{"transactional_id": m.transactional_id, "producer_id": m.producer_id,
                          "transaction_state": STATE_NAMES[m.state]} for m in sorted(found, key=lambda m: m.transactional_id)]

    async def _handle_list(self, request: codec.Request, conn) -> dict:
        v, b = request.api_version, request.body
        if not self.coordinator.active:
            return {"throttle_time_ms": 0, "error_code": COORDINATOR_NOT_AVAILABLE, "unknown_state_filters": [],
                    "transaction_states": []}
        try:
            unknown, states = self.list_transactions(list(b.state_filters or []), list(b.producer_id_filters or []),
                                                     b.duration_filter if v >= 1 else -1,
                                                     b.transactional_id_pattern if v >= 2 else None)
        except re.error:
            return {"throttle_time_ms": 0, "error_code": INVALID_REQUEST, "unknown_state_filters": [],
                    "transaction_states": []}
        return {"throttle_time_ms": 0, "error_code": NONE, "unknown_state_filters": unknown,
                "transaction_states": states}

    async def _handle_write_markers(self, request: codec.Request, conn) -> dict:
        """WriteTxnMarkers from another node's coordinator: each marker appended to the partitions it names."""
        results = []
        for m in request.body.markers:
            marker = Marker(m.producer_id, m.producer_epoch, bool(m.transaction_result), m.coordinator_epoch)
            tps = request_partitions(m)
            results.append((m.producer_id, await self.coordinator.markers.append_all(marker, tps)))
        return {"markers": response_markers(results)}
