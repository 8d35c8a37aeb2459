"""A transaction's COMMIT/ABORT markers written to its partitions: appended to those this node leads (for its
own transactions, and for other coordinators' WriteTxnMarkers), sent to the leaders of the others by
WriteTxnMarkers (`txn_markers.py`), one request per node (docs/transactions.md, "Markers")."""

from __future__ import annotations

import asyncio
import logging
from typing import Awaitable, Callable

from ....log.errors import InvalidProducerEpochError, KafkaStorageError
from ....log.topic_partition import TopicPartition
from ....protocol.error_codes import (
    INVALID_PRODUCER_EPOCH,
    KAFKA_STORAGE_ERROR,
    NONE,
    NOT_LEADER_OR_FOLLOWER,
    PRODUCER_FENCED,
    TRANSACTION_COORDINATOR_FENCED,
    UNKNOWN_TOPIC_OR_PARTITION,
    name_of,
)
from ....topics.registry import TopicRegistry
from ..group.offset_records import OFFSETS_TOPIC
from ..runtime import Clock, PartitionWriter
from .txn_markers import Marker, MarkerChannels

logger = logging.getLogger(__name__)

# ... with one of these, the whole transaction's markers stop: this coordinator is stale (Kafka's
# TransactionMarkerRequestCompletionHandler drops them; the current coordinator sends its own).
_MARKER_STALE = (INVALID_PRODUCER_EPOCH, PRODUCER_FENCED, TRANSACTION_COORDINATOR_FENCED)


class MarkerWriter:
    """One round of a transaction's markers, and the leader's side of a marker."""

    def __init__(self, registry: TopicRegistry, writer: PartitionWriter, clock: Clock,
                 channels: MarkerChannels | None, complete_txn_offsets: Callable[[int, int, bool], None]) -> None:
        self.registry = registry
        self.writer = writer  # markers are written acks=all, waking read_committed fetches
        self.clock = clock
        self.channels = channels  # WriteTxnMarkers to other nodes (with a store)
        # A marker reached `__consumer_offsets` partition p: (p, producer id, commit) for the group coordinator,
        # which then commits or drops that producer's pending TxnOffsetCommit offsets.
        self.complete_txn_offsets = complete_txn_offsets

    def close(self) -> None:
        if self.channels is not None:
            self.channels.close()

    async def write_round(self, marker: Marker, partitions: set[TopicPartition]
                          ) -> dict[TopicPartition, str] | None:
        """One try of every partition: local ones appended, the others' leaders asked (one request per node).
        The partitions still to do and why, or None when a partition refused the marker as stale."""
        me = self.registry.node.node_id
        by_node: dict[int, list[TopicPartition]] = {}
        failed: dict[TopicPartition, str] = {}
        for tp in partitions:
            leader = self.registry.leader(tp.topic, tp.partition)
            if leader is None:
                continue  # the partition was deleted: nothing left to close
            if leader < 0:
                failed[tp] = "no leader now"
                continue
            by_node.setdefault(leader, []).append(tp)
        nodes = self.registry.nodes()
        asked: list[list[TopicPartition]] = []
        asks: list[Awaitable[dict[TopicPartition, int] | None]] = []
        for node_id, tps in sorted(by_node.items()):
            if node_id == me:
                asks.append(self.append_all(marker, tps))
            elif node_id in nodes and self.channels is not None:
                asks.append(self.channels.send(nodes[node_id], marker, sorted(tps)))
            else:
                failed.update({tp: f"leader {node_id} not reachable" for tp in tps})
                continue
            asked.append(tps)
        for tps, codes in zip(asked, await asyncio.gather(*asks)):
            if codes is None:
                failed.update({tp: "no answer" for tp in tps})
                continue
            for tp, code in codes.items():
                if code in _MARKER_STALE:
                    return None
                # Done when written, or when the partition is gone here too (a leader that has not applied a
                # new topic yet is asked again, as Kafka checks its metadata before dropping a marker).
                gone = code == UNKNOWN_TOPIC_OR_PARTITION and self.registry.leader(tp.topic, tp.partition) is None
                if code != NONE and not gone:
                    failed[tp] = name_of(code)
        return failed

    async def append_all(self, marker: Marker, partitions: list[TopicPartition]) -> dict[TopicPartition, int]:
        codes = await asyncio.gather(*(self.append_marker(tp, marker) for tp in partitions))
        return dict(zip(partitions, codes))

    async def append_marker(self, tp: TopicPartition, marker: Marker) -> int:
        """Append `marker` to a partition this node leads, acks=all: the error code once the ISR has it (Kafka's
        WriteTxnMarkers handling: a lower coordinator epoch than the producer's last marker is
        TRANSACTION_COORDINATOR_FENCED, an older producer epoch INVALID_PRODUCER_EPOCH)."""
        log = self.registry.local_log(tp.topic, tp.partition)
        if log is None:
            leader = self.registry.leader(tp.topic, tp.partition)
            return UNKNOWN_TOPIC_OR_PARTITION if leader is None else NOT_LEADER_OR_FOLLOWER
        last = log.producer_state.last_entry(marker.producer_id)
        if last is not None and last.coordinator_epoch > marker.coordinator_epoch:
            logger.warning("%s: refusing the %s: the producer's last marker had coordinator epoch %d", tp,
                           marker.describe(), last.coordinator_epoch)
            return TRANSACTION_COORDINATOR_FENCED
        try:
            info = self.writer.append(tp, log, marker.batch(self.clock.now_ms()))
        except InvalidProducerEpochError as exc:
            logger.warning("%s: refusing the %s: %s", tp, marker.describe(), exc)
            return INVALID_PRODUCER_EPOCH
        except KafkaStorageError as exc:
            logger.error("%s: writing the %s failed: %s", tp, marker.describe(), exc)
            return KAFKA_STORAGE_ERROR
        except Exception as exc:  # noqa: BLE001 - not the leader any more (LogError), or a refusal: retried
            logger.warning("%s: writing the %s failed: %s", tp, marker.describe(), exc)
            return NOT_LEADER_OR_FOLLOWER
        if tp.topic == OFFSETS_TOPIC:
            self.complete_txn_offsets(tp.partition, marker.producer_id, marker.commit)
        return await self.writer.replicated(tp, info.last_offset)
