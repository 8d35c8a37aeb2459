"""The transaction coordinator: every transactional id whose `__transaction_state` partition this node leads,
its state stored and loaded, its transactions ended (docs/transactions.md).

The rules are `transaction_state.py`'s; this module stores their results (`transaction_records.py`'s bytes,
appended to the id's partition, and with a control store replicated to the ISR, before the client is answered
and before the new state is current), drives the COMMIT/ABORT markers (`markers.py` writes each round), aborts
transactions past their timeout and loads the state back. An id with a write in flight answers
CONCURRENT_TRANSACTIONS (Kafka's pending state), so one request's write-then-apply is never interleaved with
another's. Its Kafka APIs are `handlers.py`'s.

Without a store every partition is local: markers are direct appends and the state is loaded at start. With a
store (docs/transactions.md, "Replicated like any topic") the coordinator of an id is the leader of its
`__transaction_state` partition, which loads the partition when it comes to lead it in a new leader epoch (that
epoch is the markers' coordinator epoch) and unloads it when it stops (docs/coordinator-runtime.md); markers go
to each partition's leader, by WriteTxnMarkers to other nodes, retried until every partition has them. On
several nodes without a store, FindCoordinator for transactions answers COORDINATOR_NOT_AVAILABLE: no node can
reach the others' partitions' leaders by election.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Callable, Iterable

from ....log.records import Record, encode_batch
from ....log.topic_partition import TopicPartition
from ....plural import plural
from ....protocol.error_codes import (
    CONCURRENT_TRANSACTIONS,
    COORDINATOR_LOAD_IN_PROGRESS,
    COORDINATOR_NOT_AVAILABLE,
    INVALID_PRODUCER_ID_MAPPING,
    INVALID_REQUEST,
    INVALID_TRANSACTION_TIMEOUT,
    NONE,
    NOT_COORDINATOR,
    NOT_ENOUGH_REPLICAS,
    NOT_ENOUGH_REPLICAS_AFTER_APPEND,
    PRODUCER_FENCED,
    REQUEST_TIMED_OUT,
    TRANSACTION_ABORTABLE,
    name_of,
)
from ....topics.registry import TopicRegistry
from ..coordinator_log import declare_internal_topic, loaded_batches
from ..group.offset_records import partition_for
from ..runtime import Clock, LedPartitions, LocalPartitionWriter, LoopClock, PartitionWriter, Timer
from . import transaction_state as rules  # its functions share names with our handlers
from .handlers import TransactionApis
from .markers import MarkerWriter
from .producer_ids import ProducerIdAllocator
from .transaction_records import TRANSACTION_STATE_TOPIC, decode_key, decode_value, encode_key, encode_value
from .transaction_state import STATE_NAMES, IllegalTransition, Refused, TxnMetadata, TxnState
from .txn_markers import Marker, MarkerChannels

logger = logging.getLogger(__name__)

# TransactionStateManager's defaults (transaction.state.log.*, transaction.*.ms).
STATE_LOG_SEGMENT_BYTES = 100 * 1024 * 1024
STATE_TOPIC_CONFIG = {"cleanup.policy": "compact", "compression.type": "uncompressed",
                      "segment.bytes": str(STATE_LOG_SEGMENT_BYTES)}
MAX_TIMEOUT_MS = 900_000
ABORT_INTERVAL_MS = 10_000
ID_EXPIRATION_MS = 7 * 24 * 3600 * 1000
MARKER_RETRY_S = (0.05, 1.0)  # first and longest pause between rounds of markers some partition refused
ENDTXN_MARKER_WAIT_S = 5.0  # EndTxn answers once its markers are written, or after this (they go on after it)

# Kafka's TransactionStateManager.appendTransactionToLog: a write the ISR did not take is retriable elsewhere.
_NOT_AVAILABLE = (NOT_ENOUGH_REPLICAS, NOT_ENOUGH_REPLICAS_AFTER_APPEND, REQUEST_TIMED_OUT)


class TransactionCoordinator:
    """Every transactional id whose `__transaction_state` partition this node leads (without a store: all)."""

    def __init__(self, registry: TopicRegistry, producer_ids: ProducerIdAllocator, *, partitions: int = 50,
                 max_timeout_ms: int = MAX_TIMEOUT_MS, abort_interval_ms: int = ABORT_INTERVAL_MS,
                 id_expiration_ms: int = ID_EXPIRATION_MS, offsets_partitions: int = 50,
                 replication_factor: int | None = None, min_isr: int = 1,
                 clock: Clock | None = None, serving: Callable[[], bool] = lambda: True,
                 writer: PartitionWriter | None = None, channels: MarkerChannels | None = None,
                 complete_txn_offsets: Callable[[int, int, bool], None] = lambda _p, _pid, _commit: None) -> None:
        self.registry = registry
        self.producer_ids = producer_ids
        self.partitions = partitions
        self.max_timeout_ms = max_timeout_ms
        self.abort_interval_ms = abort_interval_ms
        self.id_expiration_ms = id_expiration_ms
        self.offsets_partitions = offsets_partitions
        # With a control store: transaction.state.log.replication.factor and .min.isr of __transaction_state.
        self.replication_factor = replication_factor
        self.min_isr = min_isr
        self.clock: Clock = clock or LoopClock()
        self.serving = serving  # False where no node can coordinate (several nodes without a control store)
        # State writes and markers, waking fetches (read_committed ones wait for markers); with a store in the
        # leader epoch, and waited for until the ISR has them, as acks=all.
        self.writer: PartitionWriter = writer or LocalPartitionWriter()
        self.markers = MarkerWriter(registry, self.writer, self.clock, channels, complete_txn_offsets)
        self.txns: dict[str, TxnMetadata] = {}
        self.active = False
        # `__transaction_state` declared (on first use, at start if on disk, or seen in the store's view); without a
        # store it is loaded then.
        self.declared = False
        # With a store: the partitions loaded here, each in the leader epoch it was loaded in, the coordinator epoch
        # of its ids.
        self.led = LedPartitions(TRANSACTION_STATE_TOPIC, "transactional id", registry.log_dir.logs,
                                 load=self._load_led, unload=self._unload)
        self.pending: set[str] = set()  # ids whose next state is being written (CONCURRENT_TRANSACTIONS)
        self._marker_tasks: dict[str, asyncio.Task] = {}  # id -> the task writing its markers
        self._timer: Timer | None = None
        self._ticking: asyncio.Task | None = None  # the last tick's work (one at a time)

    def handlers(self) -> dict[int, Any]:
        return TransactionApis(self).handlers()

    # -- lifecycle ----------------------------------------------------------------------------------------------

    async def start(self) -> None:
        """Declare `__transaction_state` if this node has logs of it; without a store load it and finish what a
        crash left between Prepare* and Complete*; start the timeout ticks. As in Kafka, the topic itself is
        created by the first transactional producer's FindCoordinator (`_declared`), not at every start."""
        self.active = True
        if any(tp.topic == TRANSACTION_STATE_TOPIC for tp in self.registry.log_dir.logs):
            self._declare()
        self._schedule()

    @property
    def replicated_state(self) -> bool:
        """With a control store: the state partitions are replicated and loaded on election."""
        return self.writer.replicates

    def _declared(self) -> bool:
        """Declare (and without a store load) `__transaction_state` on first use; False where no node can
        coordinate."""
        if not self.active or not self.serving():
            return False
        if not self.declared:
            self._declare()
        return True

    def declare_if_in(self, topics: set[str]) -> None:
        """With a store: another node created `__transaction_state` (its partition records are in the view), so
        this node declares it too, before the replica manager applies the records (it hosts only known topics)."""
        if self.active and not self.declared and TRANSACTION_STATE_TOPIC in topics:
            self._declare()

    def _declare(self) -> None:
        config = dict(STATE_TOPIC_CONFIG)
        if self.replicated_state:
            config["min.insync.replicas"] = str(self.min_isr)
        self.partitions = declare_internal_topic(self.registry, TRANSACTION_STATE_TOPIC, self.partitions, config,
                                                 "transaction.state.log.num.partitions",
                                                 self.replication_factor if self.replicated_state else None)
        self.declared = True
        if not self.replicated_state:
            records = sum(self._load_partition(p) for p in range(self.partitions))
            logger.info("transaction coordinator loaded %s (%s) from %s", plural(len(self.txns), "transactional id"),
                        plural(records, "record"), TRANSACTION_STATE_TOPIC)
            self._resume_markers(self.txns.values())

    def _load_partition(self, p: int) -> int:
        """Replay one partition of `__transaction_state` to its end into `txns`; the number of records read."""
        log = self.registry.log_dir.logs.get(TopicPartition(TRANSACTION_STATE_TOPIC, p))
        if log is None:
            return 0
        records = 0
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
        return records

    def leadership_changed(self, led: dict[int, int]) -> None:
        """With a store: `led` is {partition: leader epoch} of the `__transaction_state` partitions this node
        leads now (`LedPartitions.follow`); the ids in Prepare* of a partition loaded get their markers again."""
        if self.active and self.declared:
            self._resume_markers(m for p in self.led.follow(led) for m in self._ids_in(p))

    def _ids_in(self, partition: int) -> list[TxnMetadata]:
        return [m for tid, m in self.txns.items() if self.partition_for(tid) == partition]

    def _unload(self, partition: int) -> int:
        """Forget the ids of a partition no longer led here (in this epoch)."""
        unloaded = [m.transactional_id for m in self._ids_in(partition)]
        for tid in unloaded:
            del self.txns[tid]
        return len(unloaded)

    def _load_led(self, partition: int) -> tuple[int, int]:
        """Replay a partition led here: (ids loaded, records read)."""
        records = self._load_partition(partition)
        return len(self._ids_in(partition)), records

    def _resume_markers(self, loaded: Iterable[TxnMetadata]) -> None:
        """Markers of the loaded ids found between Prepare* and Complete*: sent again (a second marker of the
        same producer epoch closes nothing twice)."""
        for meta in list(loaded):
            if meta.state in (TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT):
                logger.info("transactional id %r: loaded in %s; sending its markers again", meta.transactional_id,
                            STATE_NAMES[meta.state])
                self._start_markers(meta)

    def close(self) -> None:
        self.active = False
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        for task in [*self._marker_tasks.values(), self._ticking]:
            if task is not None:
                task.cancel()
        self._marker_tasks.clear()
        self.markers.close()

    def _schedule(self) -> None:
        self._timer = self.clock.call_later(self.abort_interval_ms, self._tick)

    def _tick(self) -> None:
        """Every `abort_interval_ms`: each id's timeout, markers and expiry (`_tick_one`), then the next tick."""
        if not self.active:
            return
        if self._ticking is None or self._ticking.done():  # a tick still waiting on the ISR is not doubled
            self._ticking = asyncio.get_running_loop().create_task(self._tick_all())
        self._schedule()

    async def _tick_all(self) -> None:
        now = self.clock.now_ms()
        for meta in list(self.txns.values()):
            if meta.transactional_id in self.pending or self.txns.get(meta.transactional_id) is not meta:
                continue  # a request is writing it, or it changed meanwhile: the next tick looks again
            try:
                await self._tick_one(meta, now)
            except IllegalTransition as exc:  # a bug for this id must not stop the others' timeouts
                logger.error("transaction coordinator tick: %s", exc)

    async def _tick_one(self, meta: TxnMetadata, now: int) -> None:
        """Abort a transaction past its timeout, retry unfinished markers, remove a long-idle id."""
        if rules.timed_out(meta, now):
            logger.info("transactional id %r: transaction of producer %d epoch %d timed out after %d ms; "
                        "aborting", meta.transactional_id, meta.producer_id, meta.producer_epoch,
                        meta.timeout_ms)
            aborted = rules.fence(meta, now)
            if await self._store(aborted) == NONE:
                self._start_markers(aborted)
        elif meta.state in (TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT):
            self._start_markers(meta)
        elif rules.expired(meta, now, self.id_expiration_ms):
            await self._store(rules.remove(meta, now))

    # -- storage ------------------------------------------------------------------------------------------------

    def partition_for(self, transactional_id: str) -> int:
        return partition_for(transactional_id, self.partitions)

    def _epoch_of(self, p: int) -> int | None:
        """The coordinator epoch of partition `p` while this node coordinates its ids, else None (without a
        store: 0 while the partition is local)."""
        if self.replicated_state:
            return self.led.epoch(p) if self.registry.local_log(TRANSACTION_STATE_TOPIC, p) is not None else None
        return 0 if self.registry.local_log(TRANSACTION_STATE_TOPIC, p) is not None else None

    async def _store(self, meta: TxnMetadata) -> int:
        """Append `meta` to its id's partition (with a store: and wait until the ISR has it), then make it current;
        NOT_COORDINATOR if this node stopped coordinating the id, COORDINATOR_NOT_AVAILABLE if the ISR did not
        take it (Kafka's appendTransactionToLog). Only then is the new state current."""
        tid = meta.transactional_id
        p = self.partition_for(tid)
        tp = TopicPartition(TRANSACTION_STATE_TOPIC, p)
        epoch = self._epoch_of(p)
        log = self.registry.local_log(TRANSACTION_STATE_TOPIC, p)
        if epoch is None or log is None:
            return NOT_COORDINATOR
        batch = encode_batch([Record(0, self.clock.now_ms(), encode_key(tid), encode_value(meta))])
        self.pending.add(tid)
        try:
            try:
                info = self.writer.append(tp, log, batch)
            except Exception as exc:  # noqa: BLE001 - Kafka answers a failed coordinator append NOT_COORDINATOR
                logger.error("transactional id %r: writing %s to %s failed: %s", tid, STATE_NAMES[meta.state], tp,
                             exc)
                return NOT_COORDINATOR
            code = await self.writer.replicated(tp, info.last_offset)
            if code != NONE:
                logger.warning("transactional id %r: %s at %s offset %d not replicated: %s", tid,
                               STATE_NAMES[meta.state], tp, info.last_offset, name_of(code))
                return COORDINATOR_NOT_AVAILABLE if code in _NOT_AVAILABLE else NOT_COORDINATOR
            if self._epoch_of(p) != epoch:  # lost the partition meanwhile: the new leader has loaded it
                return NOT_COORDINATOR
        finally:
            self.pending.discard(tid)
        if meta.state == TxnState.DEAD:
            self.txns.pop(tid, None)
        else:
            self.txns[tid] = meta
        return NONE

    # -- markers ------------------------------------------------------------------------------------------------

    def _start_markers(self, meta: TxnMetadata) -> asyncio.Task:
        """The task writing `meta`'s markers (one per id; a running one is kept)."""
        task = self._marker_tasks.get(meta.transactional_id)
        if task is None or task.done():
            task = asyncio.get_running_loop().create_task(self._write_markers(meta))
            self._marker_tasks[meta.transactional_id] = task
            task.add_done_callback(lambda t, tid=meta.transactional_id: self._marker_tasks.pop(tid, None)
                                   if self._marker_tasks.get(tid) is t else None)
        return task

    async def _write_markers(self, meta: TxnMetadata) -> None:
        """The COMMIT/ABORT marker to every partition of the transaction, in rounds, each partition by its
        leader; then Complete* is stored. Partitions that refuse are retried, with a growing pause, for as long
        as this node coordinates the id in the same epoch; a stale coordinator's markers stop (the current
        one sends its own)."""
        tid = meta.transactional_id
        p = self.partition_for(tid)
        epoch = self._epoch_of(p)
        if epoch is None:
            return
        marker = Marker(meta.producer_id, meta.producer_epoch, rules.marker_outcome(meta), epoch)
        remaining = set(TopicPartition(t, q) for t, q in meta.partitions)
        pause = MARKER_RETRY_S[0]
        while remaining:
            failed = await self.markers.write_round(marker, remaining)
            if failed is None:
                logger.warning("transactional id %r: %s refused as stale; this coordinator stops sending it", tid,
                               marker.describe())
                return
            remaining = set(failed)
            if not remaining:
                break
            logger.warning("transactional id %r: %s not written to %s; retrying", tid, marker.describe(),
                           "; ".join(f"{tp}: {why}" for tp, why in sorted(failed.items())))
            await asyncio.sleep(pause)
            pause = min(pause * 2, MARKER_RETRY_S[1])
            if not self.active or self._epoch_of(p) != epoch or self.txns.get(tid) is not meta:
                return  # unloaded, or led in another epoch: the loader sends them
        if self.txns.get(tid) is meta:
            await self._store(rules.complete(meta, self.clock.now_ms()))

    # -- FindCoordinator ----------------------------------------------------------------------------------------

    def find_coordinator(self, key: str | None) -> dict:
        """FindCoordinator key type 1: the leader of the id's `__transaction_state` partition (without a store:
        this node, which holds every partition)."""
        out = {"error_code": NONE, "error_message": None, "node_id": -1, "host": "", "port": -1}
        if key is None:
            return {**out, "error_code": INVALID_REQUEST, "error_message": "the transactional id is null"}
        if not self._declared():
            return {**out, "error_code": COORDINATOR_NOT_AVAILABLE,
                    "error_message": "transactions need a single node or a control store (--store)"}
        p = self.partition_for(key)
        leader = self.registry.leader(TRANSACTION_STATE_TOPIC, p)
        node = self.registry.nodes().get(leader) if leader is not None else None
        if node is None:
            return {**out, "error_code": COORDINATOR_NOT_AVAILABLE,
                    "error_message": f"no leader for {TRANSACTION_STATE_TOPIC}-{p}"}
        return {**out, "node_id": node.node_id, "host": node.host, "port": node.port}

    # -- requests -----------------------------------------------------------------------------------------------

    def verify_partition(self, transactional_id: str, producer_id: int, epoch: int, tp: TopicPartition) -> int | None:
        """Kafka's handleVerifyPartitionsInTransaction for one partition (Produce's first transactional batch to it,
        transaction_verification.py): NONE if `tp` is in the producer's transaction, else the error. None where
        this node does not coordinate the id: nothing verifies the batch then (Kafka with
        transaction.partition.verification.enable=false) until AddPartitionsToTxn v4 asks the coordinating node.
        An id whose next state is being written is checked as it stands (Kafka does not look at the pending state
        here)."""
        error = self.coordinating(transactional_id)
        if error == NOT_COORDINATOR:
            return None
        if error not in (NONE, CONCURRENT_TRANSACTIONS):
            return error
        meta = self.txns.get(transactional_id)
        if meta is None or meta.producer_id != producer_id:
            return INVALID_PRODUCER_ID_MAPPING
        if meta.producer_epoch != epoch:
            return PRODUCER_FENCED
        if meta.state in (TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT):
            return CONCURRENT_TRANSACTIONS
        return NONE if (tp.topic, tp.partition) in meta.partitions else TRANSACTION_ABORTABLE

    def coordinating(self, transactional_id: str | None) -> int:
        """NONE if this node coordinates the id now (Kafka's getTransactionState checks)."""
        if transactional_id is None or transactional_id == "":
            return INVALID_REQUEST
        if not self._declared():
            return NOT_COORDINATOR
        p = self.partition_for(transactional_id)
        if self.registry.local_log(TRANSACTION_STATE_TOPIC, p) is None:
            return NOT_COORDINATOR
        if self._epoch_of(p) is None:
            return COORDINATOR_LOAD_IN_PROGRESS
        if transactional_id in self.pending:
            return CONCURRENT_TRANSACTIONS
        return NONE

    async def init_producer_id(self, transactional_id: str, timeout_ms: int, expected: tuple[int, int] | None
                               ) -> tuple[int, int, int]:
        """(error, producer id, epoch) for a transactional producer; an Ongoing transaction is fenced first."""
        error = self.coordinating(transactional_id)
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
        error = await self._store(out)
        if error != NONE:
            return error, -1, -1
        if out.state == TxnState.PREPARE_ABORT:  # fenced its predecessor: abort, and let the client retry
            logger.info("transactional id %r: a new producer fenced epoch %d; aborting its open transaction",
                        transactional_id, meta.producer_epoch)
            self._start_markers(out)
            return CONCURRENT_TRANSACTIONS, -1, -1
        return NONE, out.producer_id, out.producer_epoch

    async def _apply(self, transactional_id: str, step: Callable[[TxnMetadata, int], TxnMetadata | Refused]
                     ) -> tuple[int, TxnMetadata | None]:
        """(error, the metadata stored) of a request about an id's current producer: `step` maps its metadata
        and now to the next metadata or a refusal; an id without metadata is INVALID_PRODUCER_ID_MAPPING."""
        error = self.coordinating(transactional_id)
        if error != NONE:
            return error, None
        meta = self.txns.get(transactional_id)
        if meta is None:
            return INVALID_PRODUCER_ID_MAPPING, None
        out = step(meta, self.clock.now_ms())
        if isinstance(out, Refused):
            return out.error, None
        return await self._store(out), out

    async def add_partitions(self, transactional_id: str, producer_id: int, epoch: int,
                             partitions: frozenset[tuple[str, int]]) -> int:
        error, _ = await self._apply(
            transactional_id, lambda meta, now: rules.add_partitions(meta, producer_id, epoch, partitions, now))
        return error

    async def end_txn(self, transactional_id: str, producer_id: int, epoch: int, commit: bool) -> int:
        """Prepare* stored, then the markers; answered once they are written (or after ENDTXN_MARKER_WAIT_S, as
        Kafka answers after Prepare*), so the producer's next transaction rarely meets CONCURRENT_TRANSACTIONS."""
        error, out = await self._apply(
            transactional_id, lambda meta, now: rules.end_transaction(meta, producer_id, epoch, commit, now))
        if error == NONE and out.state in (TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT):
            await asyncio.wait([self._start_markers(out)], timeout=ENDTXN_MARKER_WAIT_S)
        return error
