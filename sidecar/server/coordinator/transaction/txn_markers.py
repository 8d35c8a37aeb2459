"""WriteTxnMarkers (API 27) between nodes: the transaction coordinator's requests to the leaders of a
transaction's partitions, and the pure parts both sides share (docs/transactions.md, "Markers").

The coordinator keeps one connection per destination node on the inter-broker listener (`inter_broker.py`:
TLS and SASL as the replica fetcher's), one request in flight on it at a time, as Kafka's
TransactionMarkerChannelManager keeps one per broker. A lost connection is dropped and opened again by the next
request; the coordinator retries the partitions that did not answer NONE.
"""

from __future__ import annotations

import asyncio
import logging
import struct
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Iterable

from ....log.records import ControlType, end_txn_marker_batch
from ....log.topic_partition import TopicPartition
from ....protocol.client_codec import decode_response, encode_request
from ....protocol.codec import ProtocolError
from ....topics.registry import NodeAddress

logger = logging.getLogger(__name__)

API_WRITE_TXN_MARKERS = 27
REQUEST_VERSION = 1  # the first (flexible) version; v2 adds KIP-890's transaction version, not written here
REQUEST_TIMEOUT_S = 10.0  # a destination that does not answer in time is retried on a new connection
_SIZE = struct.Struct(">i")

Connect = Callable[[str, int], Awaitable[tuple[asyncio.StreamReader, asyncio.StreamWriter]]]


@dataclass(frozen=True)
class Marker:
    """One transaction's end, as every partition of it receives it."""

    producer_id: int
    producer_epoch: int
    commit: bool
    coordinator_epoch: int  # the leader epoch of the coordinator's `__transaction_state` partition

    @property
    def control(self) -> ControlType:
        return ControlType.COMMIT if self.commit else ControlType.ABORT

    def batch(self, timestamp: int) -> bytes:
        return end_txn_marker_batch(self.producer_id, self.producer_epoch, self.control, timestamp,
                                    self.coordinator_epoch)

    def describe(self) -> str:
        return (f"{self.control.name} marker of producer {self.producer_id} epoch {self.producer_epoch} "
                f"(coordinator epoch {self.coordinator_epoch})")


def request_body(marker: Marker, partitions: Iterable[TopicPartition]) -> dict:
    by_topic: dict[str, list[int]] = {}
    for tp in sorted(partitions):
        by_topic.setdefault(tp.topic, []).append(tp.partition)
    return {"markers": [{"producer_id": marker.producer_id, "producer_epoch": marker.producer_epoch,
                         "transaction_result": marker.commit, "coordinator_epoch": marker.coordinator_epoch,
                         "topics": [{"name": t, "partition_indexes": ps} for t, ps in by_topic.items()]}]}


def response_markers(results: list[tuple[int, dict[TopicPartition, int]]]) -> list[dict]:
    """The response's markers: (producer id, error per partition) for each marker of the request."""
    out = []
    for producer_id, codes in results:
        by_topic: dict[str, list[dict]] = {}
        for tp, code in sorted(codes.items()):
            by_topic.setdefault(tp.topic, []).append({"partition_index": tp.partition, "error_code": code})
        out.append({"producer_id": producer_id,
                    "topics": [{"name": t, "partitions": ps} for t, ps in by_topic.items()]})
    return out


def request_partitions(marker_request: Any) -> list[TopicPartition]:
    """The partitions one marker of a decoded request names."""
    return [TopicPartition(t.name, p) for t in marker_request.topics for p in t.partition_indexes]


class MarkerChannels:
    """The coordinator's connections to other nodes, for WriteTxnMarkers."""

    def __init__(self, connect: Connect, client_id: str) -> None:
        self.connect = connect
        self.client_id = client_id
        self._conns: dict[int, tuple[NodeAddress, asyncio.StreamReader, asyncio.StreamWriter]] = {}
        self._locks: dict[int, asyncio.Lock] = {}
        self._correlation = 0

    async def send(self, node: NodeAddress, marker: Marker, partitions: list[TopicPartition]
                   ) -> dict[TopicPartition, int] | None:
        """Each partition's error code from `node`, or None when the node could not be asked (logged)."""
        lock = self._locks.setdefault(node.node_id, asyncio.Lock())
        async with lock:
            try:
                return await asyncio.wait_for(self._exchange(node, marker, partitions), REQUEST_TIMEOUT_S)
            except (OSError, EOFError, asyncio.TimeoutError, asyncio.IncompleteReadError, ProtocolError) as exc:
                self._drop(node.node_id)
                logger.warning("WriteTxnMarkers to node %d at %s:%d (%s to %s): %s", node.node_id, node.host,
                               node.port, marker.describe(), ", ".join(map(str, partitions)),
                               exc.__class__.__name__ if not str(exc) else exc)
                return None

    async def _exchange(self, node: NodeAddress, marker: Marker, partitions: list[TopicPartition]
                        ) -> dict[TopicPartition, int]:
        conn = self._conns.get(node.node_id)
        if conn is not None and conn[0] != node:  # the node came back at another address
            self._drop(node.node_id)
            conn = None
        if conn is None:
            reader, writer = await self.connect(node.host, node.port)
            conn = self._conns[node.node_id] = (node, reader, writer)
        _, reader, writer = conn
        self._correlation += 1
        writer.write(encode_request(API_WRITE_TXN_MARKERS, REQUEST_VERSION, self._correlation, self.client_id,
                                    request_body(marker, partitions)))
        await writer.drain()
        (size,) = _SIZE.unpack(await reader.readexactly(4))
        response = decode_response(API_WRITE_TXN_MARKERS, REQUEST_VERSION, await reader.readexactly(size))
        codes = {TopicPartition(t.name, p.partition_index): p.error_code
                 for m in response.body.markers for t in m.topics for p in t.partitions}
        return {tp: codes.get(tp, -1) for tp in partitions}

    def _drop(self, node_id: int) -> None:
        conn = self._conns.pop(node_id, None)
        if conn is not None:
            conn[2].close()

    def close(self) -> None:
        for node_id in list(self._conns):
            self._drop(node_id)
