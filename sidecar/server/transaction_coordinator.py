"""The transaction coordinator: InitProducerId (with a transactional id), AddPartitionsToTxn, AddOffsetsToTxn,
EndTxn, DescribeTransactions and ListTransactions, with state in `__transaction_state` (docs/transactions.md).

The rules are `transaction_state.py`'s; this module stores their results (`transaction_records.py`'s bytes,
appended to the id's partition before the client is answered), writes the COMMIT/ABORT markers, aborts
transactions past their timeout and loads the state back at start. Handlers run on the event loop and every
append is synchronous, so one request's write-then-apply is never interleaved with another's.

Scope today: one node without a control store (every partition of a transaction is local, so markers are
direct appends). On several nodes or with a store, FindCoordinator for transactions answers
COORDINATOR_NOT_AVAILABLE: WriteTxnMarkers to other leaders and loading on election are not built yet.
"""

from __future__ import annotations

import logging
import re
from typing import Any, Callable

from shale.sidecar.log.checkpoint import TopicPartition
from shale.sidecar.log.records import ControlType, Record, encode_batch, end_txn_marker_batch
from shale.sidecar.plural import plural
from shale.sidecar.protocol import codec
from shale.sidecar.protocol.error_codes import (
    CONCURRENT_TRANSACTIONS,
    COORDINATOR_NOT_AVAILABLE,
    INVALID_PRODUCER_EPOCH,
    INVALID_PRODUCER_ID_MAPPING,
    INVALID_REQUEST,
    INVALID_TRANSACTION_TIMEOUT,
    NONE,
    NOT_COORDINATOR,
    OPERATION_NOT_ATTEMPTED,
    PRODUCER_FENCED,
    TRANSACTIONAL_ID_NOT_FOUND,
    UNKNOWN_TOPIC_OR_PARTITION,
)
from shale.sidecar.server.coordinator_log import declare_internal_topic, loaded_batches
from shale.sidecar.server.group_coordinator import Clock, LoopClock, Timer
from shale.sidecar.server.offset_records import OFFSETS_TOPIC, partition_for
from shale.sidecar.server.producer_ids import ProducerIdAllocator, init_producer_id as idempotent_producer_id
from shale.sidecar.server.topics import TopicRegistry
from shale.sidecar.server.transaction_records import (
    TRANSACTION_STATE_TOPIC,
    decode_key,
    decode_value,
    encode_key,
    encode_value,
)
from shale.sidecar.server import transaction_state as rules  # its functions share names with our handlers
from shale.sidecar.server.transaction_state import IllegalTransition, Refused, TxnMetadata, TxnState

logger = logging.getLogger(__name__)

API_INIT_PRODUCER_ID, API_ADD_PARTITIONS_TO_TXN, API_ADD_OFFSETS_TO_TXN, API_END_TXN = 22, 24, 25, 26
API_DESCRIBE_TRANSACTIONS, API_LIST_TRANSACTIONS = 65, 66

# TransactionStateManager's defaults (transaction.state.log.*, transaction.*.ms).
STATE_LOG_SEGMENT_BYTES = 100 * 1024 * 1024
STATE_TOPIC_CONFIG = {"cleanup.policy": "compact", "compression.type": "uncompressed",
                      "segment.bytes": str(STATE_LOG_SEGMENT_BYTES)}
MAX_TIMEOUT_MS = 900_000
ABORT_INTERVAL_MS = 10_000
ID_EXPIRATION_MS = 7 * 24 * 3600 * 1000

# Request versions before KIP-588 get INVALID_PRODUCER_EPOCH where newer ones get PRODUCER_FENCED.
_FIRST_FENCED_VERSION = {API_INIT_PRODUCER_ID: 4, API_ADD_PARTITIONS_TO_TXN: 2, API_ADD_OFFSETS_TO_TXN: 2,
                         API_END_TXN: 2}

STATE_NAMES = {TxnState.EMPTY: "Empty", TxnState.ONGOING: "Ongoing", TxnState.PREPARE_COMMIT: "PrepareCommit",
               TxnState.PREPARE_ABORT: "PrepareAbort", TxnState.COMPLETE_COMMIT: "CompleteCommit",
               TxnState.COMPLETE_ABORT: "CompleteAbort", TxnState.DEAD: "Dead",
               TxnState.PREPARE_EPOCH_FENCE: "PrepareEpochFence"}


class TransactionCoordinator:
    """Every transactional id whose `__transaction_state` partition this node holds."""

    def __init__(self, registry: TopicRegistry, producer_ids: ProducerIdAllocator, *, partitions: int = 50,
                 max_timeout_ms: int = MAX_TIMEOUT_MS, abort_interval_ms: int = ABORT_INTERVAL_MS,
                 id_expiration_ms: int = ID_EXPIRATION_MS, offsets_partitions: int = 50,
                 clock: Clock | None = None, serving: Callable[[], bool] = lambda: True) -> None:
        self.registry = registry
        self.producer_ids = producer_ids
        self.partitions = partitions
        self.max_timeout_ms = max_timeout_ms
        self.abort_interval_ms = abort_interval_ms
        self.id_expiration_ms = id_expiration_ms
        self.offsets_partitions = offsets_partitions
        self.clock: Clock = clock or LoopClock()
        self.serving = serving  # False where this scope cannot coordinate (several nodes, a control store)
        self.on_append: Callable[[TopicPartition], None] = lambda _tp: None  # the broker's poke
        # A marker reached `__consumer_offsets` partition p: (p, producer id, commit) for the group coordinator,
        # which then commits or drops that producer's pending TxnOffsetCommit offsets.
        self.on_offsets_marker: Callable[[int, int, bool], None] = lambda _p, _pid, _commit: None
        self.txns: dict[str, TxnMetadata] = {}
        self.active = False
        self.loaded = False  # `__transaction_state` declared and read (on first use, or at start if on disk)
        self._timer: Timer | None = None

    def handlers(self) -> dict[int, Any]:
        return {API_INIT_PRODUCER_ID: self._handle_init_producer_id,
                API_ADD_PARTITIONS_TO_TXN: self._handle_add_partitions,
                API_ADD_OFFSETS_TO_TXN: self._handle_add_offsets,
                API_END_TXN: self._handle_end_txn,
                API_DESCRIBE_TRANSACTIONS: self._handle_describe,
                API_LIST_TRANSACTIONS: self._handle_list}

    # -- lifecycle ----------------------------------------------------------------------------------------------

    async def start(self) -> None:
        """Load `__transaction_state` if this node has it, finish what a crash left between Prepare* and Complete*,
        and start the timeout ticks. As in Kafka, the topic itself is created by the first transactional
        producer's FindCoordinator (`_declared`), not at every start."""
        if any(tp.topic == TRANSACTION_STATE_TOPIC for tp in self.registry.log_dir.logs):
            self._declare_and_load()
        self.active = True
        self._schedule()

    def _declared(self) -> bool:
        """Declare and load `__transaction_state` on first use; False where this node cannot coordinate."""
        if not self.active or not self.serving():
            return False
        if not self.loaded:
            self._declare_and_load()
        return True

    def _declare_and_load(self) -> None:
        self.partitions = declare_internal_topic(self.registry, TRANSACTION_STATE_TOPIC, self.partitions,
                                                 STATE_TOPIC_CONFIG, "transaction.state.log.num.partitions")
        records = 0
        for p in range(self.partitions):
            log = self.registry.local_log(TRANSACTION_STATE_TOPIC, p)
            if log is None:
                continue
            for batch in loaded_batches(log):
                if batch.header.is_control:
                    continue
                for record in batch.records():
                    tid = decode_key(record.key) if record.key is not None else None
                    if tid is None:
                        logger.warning("skipping a record that is not a transaction log record at %s",
                                       batch.where(record))
                        continue
                    meta = decode_value(tid, record.value)
                    if meta is None:
                        self.txns.pop(tid, None)
                    else:
                        self.txns[tid] = meta
                    records += 1
        self.loaded = True
        logger.info("transaction coordinator loaded %s (%s) from %s", plural(len(self.txns), "transactional id"),
                    plural(records, "record"), TRANSACTION_STATE_TOPIC)
        for meta in list(self.txns.values()):
            if meta.state in (TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT):
                self._write_markers(meta)

    def close(self) -> None:
        self.active = False
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _schedule(self) -> None:
        self._timer = self.clock.call_later(self.abort_interval_ms, self._tick)

    def _tick(self) -> None:
        """Every `abort_interval_ms`: each id's timeout, markers and expiry (`_tick_one`), then the next tick."""
        if not self.active:
            return
        now = self.clock.now_ms()
        for meta in list(self.txns.values()):
            try:
                self._tick_one(meta, now)
            except IllegalTransition as exc:  # a bug for this id must not stop the others' timeouts
                logger.error("transaction coordinator tick: %s", exc)
        self._schedule()

    def _tick_one(self, meta: TxnMetadata, now: int) -> None:
        """Abort a transaction past its timeout, retry unfinished markers, remove a long-idle id."""
        if rules.timed_out(meta, now):
            logger.info("transactional id %r: transaction of producer %d epoch %d timed out after %d ms; "
                        "aborting", meta.transactional_id, meta.producer_id, meta.producer_epoch,
                        meta.timeout_ms)
            aborted = rules.fence(meta, now)
            if self._store(aborted) == NONE:
                self._write_markers(aborted)
        elif meta.state in (TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT):
            self._write_markers(meta)
        elif rules.expired(meta, now, self.id_expiration_ms):
            self._store(rules.remove(meta, now))

    # -- storage ------------------------------------------------------------------------------------------------

    def partition_for(self, transactional_id: str) -> int:
        return partition_for(transactional_id, self.partitions)

    def _store(self, meta: TxnMetadata) -> int:
        """Append `meta` to its id's partition, then make it current; NOT_COORDINATOR if the append fails."""
        p = self.partition_for(meta.transactional_id)
        log = self.registry.local_log(TRANSACTION_STATE_TOPIC, p)
        if log is None:
            return NOT_COORDINATOR
        batch = encode_batch([Record(0, self.clock.now_ms(), encode_key(meta.transactional_id), encode_value(meta))])
        try:
            log.append(batch)
        except Exception as exc:  # noqa: BLE001 - Kafka answers a failed coordinator append NOT_COORDINATOR
            logger.error("transactional id %r: writing %s to %s-%d failed: %s", meta.transactional_id,
                         STATE_NAMES[meta.state], TRANSACTION_STATE_TOPIC, p, exc)
            return NOT_COORDINATOR
        self.on_append(TopicPartition(TRANSACTION_STATE_TOPIC, p))
        if meta.state == TxnState.DEAD:
            self.txns.pop(meta.transactional_id, None)
        else:
            self.txns[meta.transactional_id] = meta
        return NONE

    def _write_markers(self, meta: TxnMetadata) -> None:
        """Append the COMMIT/ABORT marker to every partition of the transaction, then store Complete*.

        A partition that refuses it keeps the transaction in Prepare*; the next tick tries every marker again
        (a second marker of the same producer epoch closes nothing twice).
        """
        control = ControlType.COMMIT if rules.marker_outcome(meta) else ControlType.ABORT
        now = self.clock.now_ms()
        batch = end_txn_marker_batch(meta.producer_id, meta.producer_epoch, control, now)
        failed = []
        for topic, partition in sorted(meta.partitions):
            log = self.registry.local_log(topic, partition)
            if log is None:
                if self.registry.leader(topic, partition) is None:
                    continue  # the partition was deleted: nothing left to close
                failed.append(f"{topic}-{partition}: not led here")
                continue
            try:
                log.append(batch)
            except Exception as exc:  # noqa: BLE001 - retried on the next tick
                failed.append(f"{topic}-{partition}: {exc}")
                continue
            self.on_append(TopicPartition(topic, partition))
            if topic == OFFSETS_TOPIC:
                self.on_offsets_marker(partition, meta.producer_id, control is ControlType.COMMIT)
        if failed:
            logger.error("transactional id %r: %s marker of producer %d epoch %d not written to %s; retrying",
                         meta.transactional_id, control.name, meta.producer_id, meta.producer_epoch,
                         "; ".join(failed))
            return
        self._store(rules.complete(meta, self.clock.now_ms()))

    # -- FindCoordinator ----------------------------------------------------------------------------------------

    def find_coordinator(self, key: str | None) -> dict:
        """FindCoordinator key type 1: this node for every id while it coordinates them all."""
        out = {"error_code": NONE, "error_message": None, "node_id": -1, "host": "", "port": -1}
        if key is None:
            return {**out, "error_code": INVALID_REQUEST, "error_message": "the transactional id is null"}
        if not self._declared():
            return {**out, "error_code": COORDINATOR_NOT_AVAILABLE,
                    "error_message": "transactions are coordinated on a single node without a control store only"}
        node = self.registry.node
        return {**out, "node_id": node.node_id, "host": node.host, "port": node.port}

    # -- requests -----------------------------------------------------------------------------------------------

    def _coordinating(self, transactional_id: str | None) -> int:
        if transactional_id is None or transactional_id == "":
            return INVALID_REQUEST
        if not self._declared():
            return NOT_COORDINATOR
        return NONE

    def init_producer_id(self, transactional_id: str, timeout_ms: int, expected: tuple[int, int] | None
                         ) -> tuple[int, int, int]:
        """(error, producer id, epoch) for a transactional producer; an Ongoing transaction is fenced first."""
        error = self._coordinating(transactional_id)
        if error != NONE:
            return error, -1, -1
        if not rules.valid_timeout(timeout_ms, self.max_timeout_ms):
            return INVALID_TRANSACTION_TIMEOUT, -1, -1  # before an id is spent on a new transactional id
        now = self.clock.now_ms()
        meta = self.txns.get(transactional_id)
        if meta is None:
            meta = rules.new_metadata(transactional_id, self.producer_ids.next_id(), timeout_ms, now)
        out = rules.init_producer_id(meta, timeout_ms, self.max_timeout_ms, now, self.producer_ids.next_id, expected)
        if isinstance(out, Refused):
            return out.error, -1, -1
        error = self._store(out)
        if error != NONE:
            return error, -1, -1
        if out.state == TxnState.PREPARE_ABORT:  # fenced its predecessor: abort, and let the client retry
            logger.info("transactional id %r: a new producer fenced epoch %d; aborting its open transaction",
                        transactional_id, meta.producer_epoch)
            self._write_markers(out)
            return CONCURRENT_TRANSACTIONS, -1, -1
        return NONE, out.producer_id, out.producer_epoch

    def _apply(self, transactional_id: str, step: Callable[[TxnMetadata, int], TxnMetadata | Refused]
               ) -> tuple[int, TxnMetadata | None]:
        """(error, the metadata stored) of a request about an id's current producer: `step` maps its metadata
        and now to the next metadata or a refusal; an id without metadata is INVALID_PRODUCER_ID_MAPPING."""
        error = self._coordinating(transactional_id)
        if error != NONE:
            return error, None
        meta = self.txns.get(transactional_id)
        if meta is None:
            return INVALID_PRODUCER_ID_MAPPING, None
        out = step(meta, self.clock.now_ms())
        if isinstance(out, Refused):
            return out.error, None
        return self._store(out), out

    def add_partitions(self, transactional_id: str, producer_id: int, epoch: int,
                       partitions: frozenset[tuple[str, int]]) -> int:
        error, _ = self._apply(transactional_id,
                               lambda meta, now: rules.add_partitions(meta, producer_id, epoch, partitions, now))
        return error

    def end_txn(self, transactional_id: str, producer_id: int, epoch: int, commit: bool) -> int:
        error, out = self._apply(transactional_id,
                                 lambda meta, now: rules.end_transaction(meta, producer_id, epoch, commit, now))
        if error == NONE:
            self._write_markers(out)
        return error

    # -- wire handlers ------------------------------------------------------------------------------------------

    @staticmethod
    def _error_for(api_key: int, version: int, error: int) -> int:
        if error == PRODUCER_FENCED and version < _FIRST_FENCED_VERSION[api_key]:
            return INVALID_PRODUCER_EPOCH
        return error

    async def _handle_init_producer_id(self, request: codec.Request, conn) -> dict:
        v, b = request.api_version, request.body
        if b.transactional_id is None:
            return idempotent_producer_id(self.producer_ids, v, b)
        expected = (b.producer_id, b.producer_epoch) if v >= 3 and b.producer_id >= 0 else None
        error, pid, epoch = self.init_producer_id(b.transactional_id, b.transaction_timeout_ms, expected)
        return {"throttle_time_ms": 0, "error_code": self._error_for(API_INIT_PRODUCER_ID, v, error),
                "producer_id": pid, "producer_epoch": epoch}

    def _partition_errors(self, topics) -> tuple[frozenset[tuple[str, int]], dict[tuple[str, int], int]]:
        """The partitions asked for, and UNKNOWN_TOPIC_OR_PARTITION for those that do not exist."""
        asked = frozenset((t.name, p) for t in topics for p in t.partitions)
        unknown = {tp: UNKNOWN_TOPIC_OR_PARTITION for tp in asked if self.registry.leader(*tp) is None}
        return asked, unknown

    async def _handle_add_partitions(self, request: codec.Request, conn) -> dict:
        v, b = request.api_version, request.body
        asked, errors = self._partition_errors(b.v3_and_below_topics)
        if errors:  # Kafka: the unknown ones fail, the others OPERATION_NOT_ATTEMPTED (55)
            errors = {tp: errors.get(tp, OPERATION_NOT_ATTEMPTED) for tp in asked}
        else:
            error = self._error_for(API_ADD_PARTITIONS_TO_TXN, v, self.add_partitions(
                b.v3_and_below_transactional_id, b.v3_and_below_producer_id, b.v3_and_below_producer_epoch, asked))
            errors = {tp: error for tp in asked}
        by_topic: dict[str, list[dict]] = {}
        for (topic, partition), error in sorted(errors.items()):
            by_topic.setdefault(topic, []).append({"partition_index": partition, "partition_error_code": error})
        return {"throttle_time_ms": 0, "results_by_topic_v3_and_below": [
            {"name": t, "results_by_partition": r} for t, r in by_topic.items()]}

    async def _handle_add_offsets(self, request: codec.Request, conn) -> dict:
        v, b = request.api_version, request.body
        offsets_partition = (OFFSETS_TOPIC, partition_for(b.group_id, self.offsets_partitions))
        error = self.add_partitions(b.transactional_id, b.producer_id, b.producer_epoch, frozenset({offsets_partition}))
        return {"throttle_time_ms": 0, "error_code": self._error_for(API_ADD_OFFSETS_TO_TXN, v, error)}

    async def _handle_end_txn(self, request: codec.Request, conn) -> dict:
        v, b = request.api_version, request.body
        error = self.end_txn(b.transactional_id, b.producer_id, b.producer_epoch, bool(b.committed))
        return {"throttle_time_ms": 0, "error_code": self._error_for(API_END_TXN, v, error),
                "producer_id": -1, "producer_epoch": -1}

    def describe(self, transactional_id: str) -> dict:
        meta = self.txns.get(transactional_id)
        out = {"transactional_id": transactional_id, "transaction_state": "", "transaction_timeout_ms": 0,
               "transaction_start_time_ms": -1, "producer_id": -1, "producer_epoch": -1, "topics": []}
        error = self._coordinating(transactional_id)
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
        now = self.clock.now_ms()
        regex = re.compile(pattern) if pattern else None
        found = [m for m in self.txns.values()
                 if (not states or m.state in wanted) and (not producer_ids or m.producer_id in producer_ids)
                 and (min_duration_ms < 0 or (m.start_timestamp_ms >= 0 and now - m.start_timestamp_ms >= min_duration_ms))
                 and (regex is None or regex.fullmatch(m.transactional_id))]
        return unknown, [{"transactional_id": m.transactional_id, "producer_id": m.producer_id,
                          "transaction_state": STATE_NAMES[m.state]} for m in sorted(found, key=lambda m: m.transactional_id)]

    async def _handle_list(self, request: codec.Request, conn) -> dict:
        v, b = request.api_version, request.body
        if not self.active:
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
