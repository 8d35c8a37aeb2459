"""The transaction coordinator's state machine for one `transactional.id`: pure, no I/O, no clock.

Kafka's `TransactionMetadata` and the checks of its `TransactionCoordinator`, as functions from the current
metadata, a request and `now_ms` to either an error code (answered as is, nothing written) or the next
metadata (written to `__transaction_state` before the client is answered; the coordinator applies it only
once the write succeeded, and answers CONCURRENT_TRANSACTIONS to anything else about that id meanwhile —
the part Kafka's `pendingState` plays). Keeping the rules here lets every transition and refusal be tested
without a node, and lets the loader replay the log through the same metadata type.

Kafka's PrepareEpochFence (7) is such a pending state: it is never written. Fencing an Ongoing transaction
(a new producer instance, or its timeout) goes straight to PrepareAbort with the epoch bumped, which is what
Kafka writes after passing through it; a coordinator that dies before that write leaves Ongoing in the log,
and the retried InitProducerId (or the timeout) fences again.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, replace
from typing import Any, Callable

from ....protocol.error_codes import (
    CONCURRENT_TRANSACTIONS,
    INVALID_PRODUCER_ID_MAPPING,
    INVALID_TRANSACTION_TIMEOUT,
    INVALID_TXN_STATE,
    NONE,
    PRODUCER_FENCED,
)

NO_PRODUCER_ID = -1
NO_PRODUCER_EPOCH = -1
INT16_MAX = 2**15 - 1


class TxnState(enum.IntEnum):
    """Kafka's `TransactionState`; the value is the byte stored in `TransactionLogValue.TransactionStatus`."""

    EMPTY = 0
    ONGOING = 1
    PREPARE_COMMIT = 2
    PREPARE_ABORT = 3
    COMPLETE_COMMIT = 4
    COMPLETE_ABORT = 5
    DEAD = 6
    PREPARE_EPOCH_FENCE = 7

# Kafka's names of the states (TransactionState.name), as DescribeTransactions and ListTransactions show them.
STATE_NAMES: dict[TxnState, str] = {
    TxnState.EMPTY: "Empty", TxnState.ONGOING: "Ongoing", TxnState.PREPARE_COMMIT: "PrepareCommit",
    TxnState.PREPARE_ABORT: "PrepareAbort", TxnState.COMPLETE_COMMIT: "CompleteCommit",
    TxnState.COMPLETE_ABORT: "CompleteAbort", TxnState.DEAD: "Dead", TxnState.PREPARE_EPOCH_FENCE: "PrepareEpochFence"}


_COMPLETE = frozenset({TxnState.COMPLETE_COMMIT, TxnState.COMPLETE_ABORT})
_PREPARE = frozenset({TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT})

# Kafka's TransactionState.validPreviousStates: a transition from any other state is a coordinator bug.
VALID_PREVIOUS: dict[TxnState, frozenset[TxnState]] = {
    TxnState.EMPTY: frozenset({TxnState.EMPTY}) | _COMPLETE,
    TxnState.ONGOING: frozenset({TxnState.ONGOING, TxnState.EMPTY}) | _COMPLETE,
    TxnState.PREPARE_COMMIT: frozenset({TxnState.ONGOING}),
    TxnState.PREPARE_ABORT: frozenset({TxnState.ONGOING, TxnState.PREPARE_EPOCH_FENCE}),
    TxnState.COMPLETE_COMMIT: frozenset({TxnState.PREPARE_COMMIT}),
    TxnState.COMPLETE_ABORT: frozenset({TxnState.PREPARE_ABORT}),
    TxnState.DEAD: frozenset({TxnState.EMPTY}) | _COMPLETE,
    TxnState.PREPARE_EPOCH_FENCE: frozenset({TxnState.ONGOING}),
}


class IllegalTransition(RuntimeError):
    """A transition Kafka's state machine forbids: a coordinator bug, never a client's error."""


@dataclass(frozen=True, slots=True)
class TxnMetadata:
    """What the coordinator knows of one transactional id; all but `last_producer_epoch` is written.

    `last_producer_epoch` is the epoch before the last InitProducerId bump, kept in memory only (as Kafka):
    it lets a producer that missed that response retry with its old epoch and get the same answer.
    """

    transactional_id: str
    producer_id: int
    producer_epoch: int
    timeout_ms: int
    state: TxnState
    partitions: frozenset[tuple[str, int]]
    start_timestamp_ms: int
    last_update_timestamp_ms: int
    last_producer_epoch: int = NO_PRODUCER_EPOCH
    previous_producer_id: int = NO_PRODUCER_ID  # KIP-890 tagged fields: read and kept
    next_producer_id: int = NO_PRODUCER_ID
    client_transaction_version: int = 0

    def __post_init__(self) -> None:
        if self.state == TxnState.EMPTY and self.partitions:
            raise IllegalTransition(f"transactional id {self.transactional_id!r}: state Empty with partitions "
                                    f"{sorted(self.partitions)}")


@dataclass(frozen=True, slots=True)
class Refused:
    """The answer when nothing is to be written: `error` (NONE for an idempotent retry) and the metadata as is."""

    error: int


Outcome = TxnMetadata | Refused


def new_metadata(transactional_id: str, producer_id: int, timeout_ms: int, now_ms: int) -> TxnMetadata:
    """A first-seen id: Empty at NO_PRODUCER_EPOCH, so the InitProducerId that follows makes it epoch 0."""
    return TxnMetadata(transactional_id, producer_id, NO_PRODUCER_EPOCH, timeout_ms, TxnState.EMPTY, frozenset(),
                       -1, now_ms)


def is_epoch_exhausted(epoch: int) -> bool:
    """Kafka keeps the last epoch (Short.MAX) for fencing; at MAX - 1 the next InitProducerId rotates the id."""
    return epoch >= INT16_MAX - 1


def valid_timeout(timeout_ms: int, max_timeout_ms: int) -> bool:
    """`transaction.timeout.ms` is accepted when positive and at most `transaction.max.timeout.ms`."""
    return 0 < timeout_ms <= max_timeout_ms


def _to(meta: TxnMetadata, state: TxnState, now_ms: int, **changes: Any) -> TxnMetadata:
    if meta.state not in VALID_PREVIOUS[state]:
        raise IllegalTransition(f"transactional id {meta.transactional_id!r}: {meta.state.name} -> {state.name}")
    return replace(meta, state=state, last_update_timestamp_ms=now_ms, **changes)


def init_producer_id(meta: TxnMetadata, timeout_ms: int, max_timeout_ms: int, now_ms: int,
                     new_producer_id: Callable[[], int], expected: tuple[int, int] | None = None) -> Outcome:
    """InitProducerId for a transactional id (Kafka's prepareInitProducerIdTransit).

    `expected` is the (producer id, epoch) a KIP-360 client sends (v3+); `new_producer_id` is called only
    when the epoch is exhausted and the id must rotate. An Ongoing transaction is fenced: the result is
    PrepareAbort at a bumped epoch, after which the client, answered CONCURRENT_TRANSACTIONS, retries.
    """
    if not valid_timeout(timeout_ms, max_timeout_ms):
        return Refused(INVALID_TRANSACTION_TIMEOUT)
    if expected is not None and not _valid_expected_producer(meta, *expected):
        return Refused(PRODUCER_FENCED)
    if meta.state in _PREPARE or meta.state in (TxnState.PREPARE_EPOCH_FENCE, TxnState.DEAD):
        return Refused(CONCURRENT_TRANSACTIONS)
    if meta.state == TxnState.ONGOING:
        return fence(meta, now_ms)
    expected_epoch = None if expected is None else expected[1]
    if is_epoch_exhausted(meta.producer_epoch) and expected_epoch in (None, meta.producer_epoch):
        return _to(meta, TxnState.EMPTY, now_ms, producer_id=new_producer_id(), producer_epoch=0,
                   previous_producer_id=meta.producer_id,
                   last_producer_epoch=NO_PRODUCER_EPOCH if expected is None else meta.producer_epoch,
                   timeout_ms=timeout_ms, partitions=frozenset(), start_timestamp_ms=-1)
    bumped = meta.producer_epoch + 1
    if expected_epoch is None:
        epoch, last = bumped, NO_PRODUCER_EPOCH
    elif meta.producer_epoch == NO_PRODUCER_EPOCH or expected_epoch == meta.producer_epoch:
        epoch, last = bumped, meta.producer_epoch
    elif expected_epoch == meta.last_producer_epoch:
        epoch, last = meta.producer_epoch, meta.last_producer_epoch  # a retry of the bump it missed
    else:
        return Refused(PRODUCER_FENCED)
    return _to(meta, TxnState.EMPTY, now_ms, producer_epoch=epoch, last_producer_epoch=last, timeout_ms=timeout_ms,
               partitions=frozenset(), start_timestamp_ms=-1)


def _valid_expected_producer(meta: TxnMetadata, producer_id: int, epoch: int) -> bool:
    """Kafka's isValidProducerId: a just-created id, the current id, or the previous one at an exhausted epoch."""
    return (meta.producer_epoch == NO_PRODUCER_EPOCH or producer_id == meta.producer_id
            or (producer_id == meta.previous_producer_id and is_epoch_exhausted(epoch)))


def fence(meta: TxnMetadata, now_ms: int) -> TxnMetadata:
    """Abort an Ongoing transaction at epoch + 1, so its producer's next write or EndTxn is fenced."""
    if meta.state != TxnState.ONGOING:
        raise IllegalTransition(f"transactional id {meta.transactional_id!r}: fencing in {meta.state.name}")
    if meta.producer_epoch >= INT16_MAX:
        raise IllegalTransition(f"transactional id {meta.transactional_id!r}: epoch {meta.producer_epoch} "
                                f"cannot be bumped to fence")
    return _to(meta, TxnState.PREPARE_ABORT, now_ms, producer_epoch=meta.producer_epoch + 1,
               last_producer_epoch=NO_PRODUCER_EPOCH)


def _check_producer(meta: TxnMetadata, producer_id: int, epoch: int) -> int:
    if meta.producer_id != producer_id:
        return INVALID_PRODUCER_ID_MAPPING
    if meta.producer_epoch != epoch:
        return PRODUCER_FENCED
    return NONE


def add_partitions(meta: TxnMetadata, producer_id: int, epoch: int, partitions: frozenset[tuple[str, int]],
                   now_ms: int) -> Outcome:
    """AddPartitionsToTxn (and AddOffsetsToTxn with the group's offsets partition): Ongoing with them added.

    Already-added partitions answer NONE with nothing to write; the transaction's start time is set by the
    first add after Empty/Complete*, which is what `transaction.timeout.ms` counts from.
    """
    error = _check_producer(meta, producer_id, epoch)
    if error != NONE:
        return Refused(error)
    if meta.state in _PREPARE or meta.state in (TxnState.PREPARE_EPOCH_FENCE, TxnState.DEAD):
        return Refused(CONCURRENT_TRANSACTIONS)
    if meta.state == TxnState.ONGOING and partitions <= meta.partitions:
        return Refused(NONE)
    start = now_ms if meta.state != TxnState.ONGOING else meta.start_timestamp_ms
    return _to(meta, TxnState.ONGOING, now_ms, partitions=meta.partitions | partitions, start_timestamp_ms=start)


def end_transaction(meta: TxnMetadata, producer_id: int, epoch: int, commit: bool, now_ms: int) -> Outcome:
    """EndTxn from the client: PrepareCommit / PrepareAbort, or Kafka's answers to retries and wrong states."""
    if meta.producer_id != producer_id:
        return Refused(INVALID_PRODUCER_ID_MAPPING)
    if epoch != meta.producer_epoch:
        return Refused(PRODUCER_FENCED)
    wanted = TxnState.COMPLETE_COMMIT if commit else TxnState.COMPLETE_ABORT
    preparing = TxnState.PREPARE_COMMIT if commit else TxnState.PREPARE_ABORT
    if meta.state == TxnState.ONGOING:
        return _to(meta, preparing, now_ms)
    if meta.state == wanted:
        return Refused(NONE)  # a retry of an EndTxn that completed
    if meta.state == preparing:
        return Refused(CONCURRENT_TRANSACTIONS)  # markers still being written: the client retries
    if meta.state in (TxnState.PREPARE_EPOCH_FENCE, TxnState.DEAD):
        return Refused(CONCURRENT_TRANSACTIONS)
    return Refused(INVALID_TXN_STATE)  # Empty, or the opposite outcome


def complete(meta: TxnMetadata, now_ms: int) -> TxnMetadata:
    """Every marker acknowledged: CompleteCommit / CompleteAbort with no partitions left."""
    if meta.state not in _PREPARE:
        raise IllegalTransition(f"transactional id {meta.transactional_id!r}: completing in {meta.state.name}")
    done = TxnState.COMPLETE_COMMIT if meta.state == TxnState.PREPARE_COMMIT else TxnState.COMPLETE_ABORT
    return _to(meta, done, now_ms, partitions=frozenset())


def timed_out(meta: TxnMetadata, now_ms: int) -> bool:
    """Kafka's timedOutTransactions: Ongoing for longer than its `transaction.timeout.ms`."""
    return meta.state == TxnState.ONGOING and meta.start_timestamp_ms + meta.timeout_ms < now_ms


def expired(meta: TxnMetadata, now_ms: int, expiration_ms: int) -> bool:
    """Idle past `transactional.id.expiration.ms` with no transaction open: the id is removed (Dead, tombstone)."""
    idle = meta.state == TxnState.EMPTY or meta.state in _COMPLETE
    return idle and meta.last_update_timestamp_ms + expiration_ms <= now_ms


def remove(meta: TxnMetadata, now_ms: int) -> TxnMetadata:
    """The Dead metadata of an expired id; it is written as a tombstone (null value)."""
    return _to(meta, TxnState.DEAD, now_ms)


def marker_outcome(meta: TxnMetadata) -> bool:
    """Whether the markers of a Prepare* state are COMMIT (True) or ABORT (False)."""
    if meta.state not in _PREPARE:
        raise IllegalTransition(f"transactional id {meta.transactional_id!r}: no markers in {meta.state.name}")
    return meta.state == TxnState.PREPARE_COMMIT
