"""What Produce checks about transactions before the log sees a batch (Kafka's KafkaApis.handleProduceRequest,
LogValidator and ReplicaManager's transaction verification, KIP-890 part 1), as pure rules.

- Control batches (COMMIT/ABORT markers) are written by the node alone: from a client they are INVALID_RECORD,
  so no client can end another producer's transaction.
- Transactional records need the request's transactional id (TRANSACTIONAL_ID_AUTHORIZATION_FAILED without one).
- A producer's first transactional batch to a partition (the partition has no open transaction of that producer
  and epoch) is checked against the coordinator: the partition must be in the producer's transaction
  (AddPartitionsToTxn), else Kafka's per-version answer. Later batches of the same transaction are not asked
  about, as in Kafka (the log's open transaction vouches for them).
"""

from __future__ import annotations

from typing import Callable

from ...log.log import Log
from ...log.records import BATCH_OVERHEAD, CONTROL_BIT, CRC_START, TRANSACTIONAL_BIT, BatchHeader
from ...log.topic_partition import TopicPartition
from ...protocol.error_codes import (
    CONCURRENT_TRANSACTIONS,
    COORDINATOR_LOAD_IN_PROGRESS,
    COORDINATOR_NOT_AVAILABLE,
    INVALID_PRODUCER_EPOCH,
    INVALID_TXN_STATE,
    NOT_COORDINATOR,
    NOT_ENOUGH_REPLICAS,
    PRODUCER_FENCED,
    TRANSACTION_ABORTABLE,
    name_of,
)

# (transactional id, producer id, epoch, partition) -> the coordinator's answer (Kafka's
# handleVerifyPartitionsInTransaction, `TransactionCoordinator.verify_partition`), or None where this node does not
# coordinate the id.
Verify = Callable[[str, int, int, TopicPartition], "int | None"]

CONTROL_FROM_CLIENT = "Clients are not allowed to write control records"
NOT_ADDED = "Partition was not added to the transaction"
FIRST_ABORTABLE_PRODUCE_VERSION = 11  # KIP-890: TRANSACTION_ABORTABLE; older clients get INVALID_TXN_STATE


_ATTRIBUTES_LOW = CRC_START + 1  # the low byte of the big-endian int16 attributes, where both bits are


def transactional(records: bytes) -> bool:
    """The Produce's batch has the transactional bit (one byte read: every Produce asks)."""
    return len(records) >= BATCH_OVERHEAD and bool(records[_ATTRIBUTES_LOW] & TRANSACTIONAL_BIT)


def batch_header(records: bytes) -> BatchHeader | None:
    """The header of a Produce's one batch (already checked whole) when it is transactional or a control batch;
    None for a plain batch (nothing to check, and no header built on the hot path) or one shorter than a header."""
    if len(records) < BATCH_OVERHEAD or not records[_ATTRIBUTES_LOW] & (TRANSACTIONAL_BIT | CONTROL_BIT):
        return None
    return BatchHeader.parse(records)


def needs_verification(log: Log, header: BatchHeader) -> bool:
    """Kafka's Partition.maybeStartTransactionVerification: a transactional data batch whose producer (at this
    epoch) has no open transaction in the partition yet."""
    if not header.is_transactional or header.is_control or header.producer_id < 0:
        return False
    entry = log.producer_state.last_entry(header.producer_id)
    return not (entry is not None and entry.current_txn_first_offset >= 0 and entry.epoch == header.producer_epoch)


def produce_error(version: int, error: int) -> tuple[int, str]:
    """A coordinator's verification error as Produce answers it (AddPartitionsToTxnManager, then ReplicaManager):
    a fenced epoch is INVALID_PRODUCER_EPOCH; a partition not added is TRANSACTION_ABORTABLE from v11 and
    INVALID_TXN_STATE before; a coordinator that cannot answer now is NOT_ENOUGH_REPLICAS, which every client
    retries without a metadata refresh."""
    if error == PRODUCER_FENCED:
        return INVALID_PRODUCER_EPOCH, "the producer's epoch is fenced by a newer one"
    if error == TRANSACTION_ABORTABLE:
        return (TRANSACTION_ABORTABLE if version >= FIRST_ABORTABLE_PRODUCE_VERSION else INVALID_TXN_STATE), NOT_ADDED
    if error in (CONCURRENT_TRANSACTIONS, COORDINATOR_LOAD_IN_PROGRESS, COORDINATOR_NOT_AVAILABLE, NOT_COORDINATOR):
        return NOT_ENOUGH_REPLICAS, ("Unable to verify the partition has been added to the transaction. "
                                     f"Underlying error: {name_of(error)}")
    return error, f"transaction verification failed: {name_of(error)}"
