"""What a Produce must pass before a partition's log sees its records, refused and named in one place.

Kafka checks a Produce in layers: the whole request (KafkaApis: transactional records need a transactional id),
then each partition (the version, `acks`, ProduceRequest.validateRecords, LogValidator's rule that control batches
come from coordinators only, the transaction verification of KIP-890, `min.insync.replicas`), then the log's
validation of each batch (`Log.append`: sizes, CRC, keys, timestamps, producer state). This module is the first
two layers; the handler (partitions.py) calls `request_refusal` once per request and `partition_refusal` once per
partition, after it found the partition's log here.

Python is authoritative: every refusal's code and message is made here or by `Log.append`. Two fast paths in C
restate some of these checks, only to decline, never to refuse - whatever they do not take goes to the handler,
which refuses it here exactly as if they did not exist:

- The native Produce (`_native_produce.c`, native_produce.py) takes a request only with Produce v3+, no
  transactional id, one topic with one partition, `acks` -1, 0 or 1 and a record set, on a connection where the
  handler would run no other check (no replica manager, so no `min.insync.replicas` to meet).
- The native Produce finds the partition's log through `native_log`, which hides it (the C call declines) while
  the log's dir is under its free-space floor (log/free_space.py), so that the handler refuses and names it.
- The C append (`_append_kernel.c`: `append_produced` with `one_batch`, and `prepare_produce`) takes a set only
  when every batch is whole, of magic 2, uncompressed, not a control batch, with as many records as its offset
  range, and (`append_produced`) exactly one, without a producer id (so never a transactional one). It restates
  the log's own checks (`Log.append`) too, which come after this module's.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any, Callable

from ...log.log import Log
from ...log.topic_partition import TopicPartition
from ...protocol.error_codes import (
    CORRUPT_MESSAGE,
    INVALID_RECORD,
    INVALID_REQUIRED_ACKS,
    KAFKA_STORAGE_ERROR,
    NONE,
    NOT_ENOUGH_REPLICAS,
    UNSUPPORTED_VERSION,
)
from ...replication.replica_manager import Partition
from ..network.native_produce import FIRST_BATCH_VERSION
from .transaction_verification import (
    CONTROL_FROM_CLIENT,
    Verify,
    batch_header,
    needs_verification,
    produce_error,
    transactional,
)


@dataclass(frozen=True, slots=True)
class Refusal:
    """A partition's answer without an append: its error code and the message that names why; `log` False when
    the refusal's owner rate-limits its lines (the free-space floor: one per log dir every few seconds)."""

    code: int
    message: str
    log: bool = True


def request_refusal(transactional_id: str | None, topic_data: Any) -> bool:
    """Kafka refuses the whole request before looking at a partition when it carries transactional records without
    a transactional id (every partition answers TRANSACTIONAL_ID_AUTHORIZATION_FAILED)."""
    return transactional_id is None and any(pd.records is not None and transactional(pd.records)
                                            for topic in topic_data for pd in topic.partition_data)


def partition_refusal(version: int, acks: int, records: bytes | None, tp: TopicPartition, log: Log,
                      transactional_id: str | None, verify: Verify, leading: Partition | None) -> Refusal | None:
    """Why the records for `tp` (whose log is `log`, led here as `leading` with a replica manager) may not be
    appended, in Kafka's order of checks; None to append them."""
    where = f"{tp.topic}-{tp.partition}"
    if version < FIRST_BATCH_VERSION:
        return Refusal(UNSUPPORTED_VERSION, "Produce v0-2 (message format v0/v1) is not supported")
    if acks not in (0, 1, -1):
        return Refusal(INVALID_REQUIRED_ACKS, f"acks={acks}")
    if records is None:
        return Refusal(CORRUPT_MESSAGE, "null record set")
    refused = records_error(version, records)
    if refused is not None:
        return Refusal(INVALID_RECORD, f"{refused} ({where})")
    header = batch_header(records)
    if header is not None and header.is_control:  # LogValidator: markers come from coordinators only
        return Refusal(INVALID_RECORD, f"{CONTROL_FROM_CLIENT} ({where}, producer {header.producer_id})")
    if header is not None and transactional_id is not None and needs_verification(log, header):
        verified = verify(transactional_id, header.producer_id, header.producer_epoch, tp)
        if verified is not None and verified != NONE:
            code, why = produce_error(version, verified)
            return Refusal(code, f"{why} ({where}, transactional id {transactional_id!r}, producer "
                                 f"{header.producer_id} epoch {header.producer_epoch})")
    if leading is not None and acks == -1 and leading.state.under_min_isr(log.config.min_insync_replicas):
        isr = list(leading.state.record.isr)
        return Refusal(NOT_ENOUGH_REPLICAS, f"the ISR {isr} of {where} is smaller than its minimum "
                                            f"{leading.state.min_isr(log.config.min_insync_replicas)} "
                                            f"(min.insync.replicas, capped by the replication factor)")
    if log.space is not None:  # last: the records are valid and may go to the ISR, but the disk keeps its reserve
        floor = log.space.produce_refusal(where, len(records))
        if floor is not None:
            return Refusal(KAFKA_STORAGE_ERROR, *floor)
    return None


def native_log(local_log: Callable[[str, int], Log | None]) -> Callable[[str, int], Log | None]:
    """The native Produce's `local_log`: no log (the C call declines) while the partition's dir is under its
    free-space floor, so that the handler refuses the request here and names the partition and the dir."""
    def find(topic: str, partition: int) -> Log | None:
        log = local_log(topic, partition)
        return log if log is None or log.space is None or log.space.has_room() else None
    return find


def records_error(version: int, records: bytes) -> str | None:
    """Kafka's ProduceRequest.validateRecords (v3+): exactly one whole record batch, of magic 2 (and, from
    LogValidator.validateBatch, a non-negative offset range: lastOffsetDelta -1 would make the next batch
    reuse the offset).

    Kafka answers these INVALID_RECORD before the log sees the bytes; framing errors (a declared size
    below the minimum, a partial trailing batch) are left to the log, which answers CORRUPT_MESSAGE.
    """
    first = _whole_batch_size(records, 0)
    if first is None:
        return f"Produce requests with version {version} must have at least one record batch per partition"
    if first < 0:
        return None
    if records[16] != 2:
        return (f"Produce requests with version {version} are only allowed to contain record batches with "
                f"magic version 2 (got magic {records[16]})")
    if first >= 27 and struct.unpack_from(">i", records, 23)[0] < 0:  # LogValidator.validateBatch
        return "Batch has an invalid offset range (lastOffsetDelta < 0)"
    second = _whole_batch_size(records, first)
    if second is not None and second > 0:
        return (f"Produce requests with version {version} are only allowed to contain exactly one record batch "
                f"per partition")
    return None


def _whole_batch_size(records: bytes, pos: int) -> int | None:
    """Size of the whole batch at `pos`; None if none fits there; -1 if its declared size is corrupt."""
    if len(records) - pos < 17:  # offset, length, leader epoch and magic
        return None
    (length,) = struct.unpack_from(">i", records, pos + 8)
    if length < 14:  # Kafka's minimum record overhead
        return -1
    return 12 + length if pos + 12 + length <= len(records) else None
