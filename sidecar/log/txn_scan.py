"""A header-only walk of a log for what the cleaner must know about producers and transactions.

Kafka keeps this in its producer state and `.txnindex` files; the cleaner asks for
each active producer's last data batch (kept, possibly emptied, so idempotent
de-duplication survives compaction), the aborted transactions (their data is
removed at once), and the last stable offset (cleaning never passes an undecided
transaction). Only control batches — one small record each — are decoded.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable

from .records import BATCH_OVERHEAD, ControlType, decode_records, parse_control_key
from .segment import LogSegment
from .transaction_index import AbortedTxn

NO_PRODUCER = -1


@dataclass
class TxnScan:
    """Result of one walk over a log's segments."""

    last_data_offset: dict[int, int] = field(default_factory=dict)  # producer id -> lastOffset of its last data batch
    last_timestamp: dict[int, int] = field(default_factory=dict)  # producer id -> max timestamp of its last batch
    last_epoch: dict[int, int] = field(default_factory=dict)
    aborted: list[AbortedTxn] = field(default_factory=list)
    open_txns: dict[int, int] = field(default_factory=dict)  # producer id -> first offset of its open transaction
    last_control_offset: dict[int, int] = field(default_factory=dict)  # producer id -> lastOffset of its last marker

    def last_stable_offset(self, high_watermark: int) -> int:
        """The first offset of the earliest undecided transaction, or the high watermark."""
        return min([high_watermark, *self.open_txns.values()])

    def last_batches_of_active_producers(self, now_ms: int, expiration_ms: int) -> dict[int, int]:
        """Producer id -> last offset of the batch that holds its state, for producers not expired
        (producer.id.expiration.ms): its last data batch, or — Kafka's LastRecord without a data offset —
        for a producer that only wrote markers, its last control batch (which carries its epoch)."""
        last = {**{pid: off for pid, off in self.last_control_offset.items() if pid not in self.last_data_offset},
                **self.last_data_offset}
        return {
            pid: off for pid, off in last.items()
            if pid in self.open_txns or now_ms - self.last_timestamp.get(pid, now_ms) < expiration_ms
        }


def scan(segments: Iterable[LogSegment]) -> TxnScan:
    """Walk every batch header once; decode only control batches."""
    result = TxnScan()
    for seg in segments:
        for b in seg.batches():
            h = b.header
            pid = h.producer_id
            if pid == NO_PRODUCER:
                continue
            result.last_timestamp[pid] = h.max_timestamp
            result.last_epoch[pid] = h.producer_epoch
            if h.is_control:
                result.last_control_offset[pid] = h.last_offset
                if h.records_count == 0:
                    continue
                raw = seg.read_bytes(b.position, b.size)
                records = decode_records(h, memoryview(raw)[BATCH_OVERHEAD:], seg.where)
                if not records:
                    continue
                ctype = parse_control_key(records[0].key)
                first = result.open_txns.pop(pid, None)
                if ctype is ControlType.ABORT and first is not None:
                    # Kafka's lastStableOffset(completedTxn), as the `.txnindex` entry records it
                    lso = min(result.open_txns.values(), default=h.last_offset + 1)
                    result.aborted.append(AbortedTxn(pid, first, h.last_offset, lso))
                continue
            result.last_data_offset[pid] = h.last_offset
            if h.is_transactional and pid not in result.open_txns:
                result.open_txns[pid] = h.base_offset
    return result
