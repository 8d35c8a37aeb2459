"""The storage sidecar's Kafka server: a single-node broker over a `LogDir`.

This module is the socket edge only: asyncio streams read 4-byte size-prefixed
frames, `shale.sidecar.protocol.codec` decodes requests and encodes responses,
and the handlers below translate them into `Log` calls.

First slice: ApiVersions, Metadata, Produce, Fetch, ListOffsets.  Responses are
written in request order per connection (a FIFO of handler tasks), so a Fetch
waiting for data does not reorder the replies to pipelined requests.
"""

from __future__ import annotations

import asyncio
import logging
import struct
from typing import Any, Mapping

from shale.sidecar.log.checkpoint import TopicPartition
from shale.sidecar.log.errors import (
    CorruptRecordError,
    InvalidRecordError,
    LogError,
    OffsetOutOfRangeError,
    RecordTooLargeError,
)
from shale.sidecar.log.log import Log, InvalidTimestampError
from shale.sidecar.log.log_dir import LogDir
from shale.sidecar.protocol import codec

logger = logging.getLogger(__name__)

MAX_FRAME_BYTES = 100 * 1024 * 1024

# Kafka error codes used here.
NONE = 0
UNKNOWN_SERVER_ERROR = -1
OFFSET_OUT_OF_RANGE = 1
CORRUPT_MESSAGE = 2
UNKNOWN_TOPIC_OR_PARTITION = 3
MESSAGE_TOO_LARGE = 10
INVALID_REQUIRED_ACKS = 21
INVALID_TIMESTAMP = 32
UNSUPPORTED_VERSION = 35
KAFKA_STORAGE_ERROR = 56
INVALID_RECORD = 87
UNKNOWN_TOPIC_ID = 100

API_PRODUCE, API_FETCH, API_LIST_OFFSETS, API_METADATA, API_API_VERSIONS = 0, 1, 2, 3, 18

# What this broker advertises: the codec's ranges for the APIs implemented here,
# capped where the request identifies topics by ID (kafka-protocol.md G6:
# Fetch >= 13 and Produce 13 use topic IDs, which are not routed yet).
_CAPS = {API_FETCH: 12, API_PRODUCE: 12}
ADVERTISED_VERSIONS: dict[int, tuple[int, int]] = {
    key: (codec.SUPPORTED_VERSIONS[key][0], min(codec.SUPPORTED_VERSIONS[key][1], _CAPS.get(key, 1 << 15)))
    for key in (API_PRODUCE, API_FETCH, API_LIST_OFFSETS, API_METADATA, API_API_VERSIONS)
}


def _append_error_code(exc: Exception) -> int:
    if isinstance(exc, CorruptRecordError):
        return CORRUPT_MESSAGE
    if isinstance(exc, RecordTooLargeError):
        return MESSAGE_TOO_LARGE
    if isinstance(exc, InvalidTimestampError):  # before InvalidRecordError: it is a subclass
        return INVALID_TIMESTAMP
    if isinstance(exc, InvalidRecordError):
        return INVALID_RECORD
    if isinstance(exc, LogError):
        return KAFKA_STORAGE_ERROR
    return UNKNOWN_SERVER_ERROR


def _peek_client_id(frame: bytes) -> str | None:
    """Best-effort client id of a frame that did not decode (request header v1/v2 layout)."""
    try:
        (n,) = struct.unpack_from(">h", frame, 8)
        if n < 0 or 10 + n > len(frame):
            return None
        return frame[10 : 10 + n].decode("utf-8", "replace")
    except struct.error:
        return None


class _Closing(Exception):
    """The connection must be closed without a response (already logged)."""


class Broker:
    """A single-node Kafka broker serving the topics given to it from one log directory."""

    def __init__(
        self,
        log_dir: LogDir,
        topics: Mapping[str, tuple[int, Any]],
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        advertised_host: str | None = None,
        advertised_port: int | None = None,
        node_id: int = 0,
        cluster_id: str = "shale",
    ) -> None:
        self.log_dir = log_dir
        self.topics = {name: (int(parts), cfg) for name, (parts, cfg) in topics.items()}
        self.host = host
        self.port = port
        self.advertised_host = advertised_host or host
        self._advertised_port = advertised_port
        self.node_id = node_id
        self.cluster_id = cluster_id
        self._server: asyncio.Server | None = None
        self._events: dict[TopicPartition, asyncio.Event] = {}
        self._connections: set[asyncio.Task] = set()

    # -- lifecycle ---------------------------------------------------------------------------

    @property
    def advertised_port(self) -> int:
        return self._advertised_port if self._advertised_port is not None else self.port

    async def start(self) -> None:
        for topic, (parts, _cfg) in self.topics.items():
            for p in range(parts):
                self.log_dir.get_or_create(TopicPartition(topic, p))
        self._server = await asyncio.start_server(self._on_connect, self.host, self.port)
        self.port = self._server.sockets[0].getsockname()[1]
        logger.info("broker %d listening on %s:%d (advertised %s:%d)", self.node_id, self.host, self.port,
                    self.advertised_host, self.advertised_port)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._connections):
            task.cancel()
        if self._connections:
            await asyncio.gather(*self._connections, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()
            self._server = None

    # -- connections -------------------------------------------------------------------------

    async def _on_connect(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        self._connections.add(task)
        try:
            await self._serve_connection(reader, writer)
        except asyncio.CancelledError:
            # Only close() cancels these.  Returning normally avoids asyncio 3.11's stream callback calling
            # task.exception() on a cancelled task (an "Exception in callback" traceback at shutdown).
            pass
        finally:
            self._connections.discard(task)

    async def _serve_connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info("peername")
        where = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)
        state = {"client_id": None}

        def client() -> str:
            return f"client {state['client_id']!r} at {where}" if state["client_id"] is not None else f"client at {where}"

        # FIFO of (task producing the framed response or None).  The writer drains it in order.
        pending: asyncio.Queue[asyncio.Task | None] = asyncio.Queue()
        write_task = asyncio.create_task(self._write_loop(pending, writer, client))
        clean = True
        try:
            while True:
                try:
                    prefix = await reader.readexactly(4)
                except (asyncio.IncompleteReadError, ConnectionError):
                    break
                (size,) = struct.unpack(">i", prefix)
                if size < 0 or size > MAX_FRAME_BYTES:
                    logger.error("closing connection of %s: frame size %d outside 0..%d bytes", client(), size,
                                 MAX_FRAME_BYTES)
                    clean = False
                    break
                try:
                    frame = await reader.readexactly(size)
                except (asyncio.IncompleteReadError, ConnectionError):
                    break
                try:
                    request = codec.decode_request(frame)
                except codec.UnsupportedVersionError as exc:
                    if exc.api_key == API_API_VERSIONS:  # KIP-511: tell the client what we do support, at v0
                        lo, hi = ADVERTISED_VERSIONS[API_API_VERSIONS]
                        body = {"error_code": UNSUPPORTED_VERSION,
                                "api_keys": [{"api_key": API_API_VERSIONS, "min_version": lo, "max_version": hi}]}
                        out = codec.encode_response(API_API_VERSIONS, 0, exc.correlation_id, body, framed=True)
                        await pending.put(asyncio.create_task(_ready(out)))
                        continue
                    state["client_id"] = state["client_id"] or _peek_client_id(frame)
                    logger.error("closing connection of %s: %s", client(), exc)
                    clean = False
                    break
                except codec.ProtocolError as exc:
                    state["client_id"] = state["client_id"] or _peek_client_id(frame)
                    logger.error("closing connection of %s: malformed request frame (%d bytes): %s", client(),
                                 size, exc)
                    clean = False
                    break
                state["client_id"] = request.client_id
                if request.api_key not in ADVERTISED_VERSIONS:
                    logger.error("closing connection of %s: %s v%d is not implemented", client(),
                                 request.api_name, request.api_version)
                    clean = False
                    break
                await pending.put(asyncio.create_task(self._dispatch(request, client)))
        finally:
            if clean:
                await pending.put(None)
                try:
                    await write_task
                except Exception:  # noqa: BLE001 - already logged by the write loop
                    pass
            else:
                write_task.cancel()
                while not pending.empty():
                    t = pending.get_nowait()
                    if t is not None:
                        t.cancel()
            writer.close()
            try:
                await writer.wait_closed()
            except Exception:  # noqa: BLE001 - the peer may be gone already
                pass

    async def _write_loop(self, pending: asyncio.Queue, writer: asyncio.StreamWriter, client) -> None:
        try:
            while True:
                task = await pending.get()
                if task is None:
                    return
                try:
                    out = await task
                except asyncio.CancelledError:
                    raise
                except Exception:
                    logger.exception("closing connection of %s: request handler failed", client())
                    writer.transport.abort()
                    return
                if out is not None:
                    writer.write(out)
                    await writer.drain()
        except ConnectionError:
            writer.transport.abort()
        finally:
            while not pending.empty():
                t = pending.get_nowait()
                if t is not None:
                    t.cancel()

    async def _dispatch(self, request: codec.Request, client) -> bytes | None:
        key, version, body = request.api_key, request.api_version, request.body
        if key == API_API_VERSIONS:
            resp = self._api_versions()
        elif key == API_METADATA:
            resp = self._metadata(version, body)
        elif key == API_PRODUCE:
            resp = self._produce(version, body)
            if not request.expects_response:
                return None
        elif key == API_FETCH:
            resp = await self._fetch(version, body)
        elif key == API_LIST_OFFSETS:
            resp = self._list_offsets(version, body)
        else:  # pragma: no cover - filtered by the reader
            raise AssertionError(key)
        return codec.encode_response(key, version, request.correlation_id, resp, framed=True)

    # -- helpers -----------------------------------------------------------------------------

    def _log(self, topic: str | None, partition: int) -> Log | None:
        entry = self.topics.get(topic) if topic is not None else None
        if entry is None or not 0 <= partition < entry[0]:
            return None
        return self.log_dir.get_or_create(TopicPartition(topic, partition))

    def _event(self, tp: TopicPartition) -> asyncio.Event:
        ev = self._events.get(tp)
        if ev is None:
            ev = self._events[tp] = asyncio.Event()
        return ev

    def _poke(self, tp: TopicPartition) -> None:
        ev = self._events.pop(tp, None)
        if ev is not None:
            ev.set()

    # -- APIs --------------------------------------------------------------------------------

    def _api_versions(self) -> dict:
        return {
            "error_code": NONE,
            "api_keys": [{"api_key": k, "min_version": lo, "max_version": hi}
                         for k, (lo, hi) in sorted(ADVERTISED_VERSIONS.items())],
            "throttle_time_ms": 0,
        }

    def _metadata(self, version: int, body) -> dict:
        if body.topics is None or (version == 0 and not body.topics):
            wanted = list(self.topics)
        else:
            wanted = [t.name for t in body.topics]
        topics = []
        for name in wanted:
            entry = self.topics.get(name) if name is not None else None
            if entry is None:
                topics.append({"error_code": UNKNOWN_TOPIC_ID if name is None else UNKNOWN_TOPIC_OR_PARTITION,
                               "name": name, "partitions": []})
                continue
            topics.append({
                "error_code": NONE,
                "name": name,
                "is_internal": False,
                "partitions": [
                    {"error_code": NONE, "partition_index": p, "leader_id": self.node_id, "leader_epoch": -1,
                     "replica_nodes": [self.node_id], "isr_nodes": [self.node_id], "offline_replicas": []}
                    for p in range(entry[0])
                ],
            })
        return {
            "throttle_time_ms": 0,
            "brokers": [{"node_id": self.node_id, "host": self.advertised_host, "port": self.advertised_port,
                         "rack": None}],
            "cluster_id": self.cluster_id,
            "controller_id": self.node_id,
            "topics": topics,
        }

    def _produce(self, version: int, body) -> dict:
        responses = []
        for topic in body.topic_data:
            parts = []
            for pd in topic.partition_data:
                parts.append(self._produce_partition(version, body.acks, topic.name, pd.index, pd.records))
            responses.append({"name": topic.name, "partition_responses": parts})
        return {"responses": responses, "throttle_time_ms": 0}

    def _produce_partition(self, version: int, acks: int, topic: str, partition: int, records) -> dict:
        out = {"index": partition, "error_code": NONE, "base_offset": -1, "log_append_time_ms": -1,
               "log_start_offset": -1}

        def fail(code: int, message: str) -> dict:
            out["error_code"] = code
            if version >= 8:
                out["error_message"] = message
            return out

        log = self._log(topic, partition)
        if log is None:
            return fail(UNKNOWN_TOPIC_OR_PARTITION, f"unknown topic-partition {topic}-{partition}")
        if version < 3:
            return fail(UNSUPPORTED_VERSION, "Produce v0-2 (message format v0/v1) is not supported")
        if acks not in (0, 1, -1):
            return fail(INVALID_REQUIRED_ACKS, f"acks={acks}")
        if records is None:
            return fail(CORRUPT_MESSAGE, "null record set")
        try:
            info = log.append(records)
        except Exception as exc:  # noqa: BLE001 - mapped to a per-partition error code
            code = _append_error_code(exc)
            if code in (UNKNOWN_SERVER_ERROR, KAFKA_STORAGE_ERROR):
                logger.exception("append to %s-%d failed", topic, partition)
            return fail(code, str(exc))
        self._poke(TopicPartition(topic, partition))
        out.update(base_offset=info.first_offset, log_append_time_ms=info.log_append_time,
                   log_start_offset=log.log_start_offset)
        return out

    async def _fetch(self, version: int, body) -> dict:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(body.max_wait_ms, 0) / 1000
        min_bytes = max(body.min_bytes, 0)
        while True:
            # Take the events before reading, so an append in between still wakes us.
            events = []
            for t in body.topics:
                for p in t.partitions:
                    if t.topic in self.topics:
                        events.append(self._event(TopicPartition(t.topic, p.partition)))
            responses, total, errors = self._fetch_once(body)
            remaining = deadline - loop.time()
            if total >= min_bytes or errors or remaining <= 0 or not events:
                return {"throttle_time_ms": 0, "error_code": NONE, "session_id": 0, "responses": responses}
            waiters = [asyncio.ensure_future(ev.wait()) for ev in set(events)]
            try:
                await asyncio.wait(waiters, timeout=remaining, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for w in waiters:
                    w.cancel()

    def _fetch_once(self, body) -> tuple[list, int, bool]:
        budget = body.max_bytes if body.max_bytes > 0 else MAX_FRAME_BYTES
        read_committed = body.isolation_level == 1
        total = 0
        errors = False
        responses = []
        for t in body.topics:
            parts = []
            for p in t.partitions:
                out = {"partition_index": p.partition, "error_code": NONE, "high_watermark": -1,
                       "last_stable_offset": -1, "log_start_offset": -1, "records": b""}
                parts.append(out)
                log = self._log(t.topic, p.partition)
                if log is None:
                    out["error_code"] = UNKNOWN_TOPIC_OR_PARTITION
                    errors = True
                    continue
                hw = log.high_watermark
                lso = log.last_stable_offset
                out.update(high_watermark=hw, last_stable_offset=lso, log_start_offset=log.log_start_offset)
                limit = min(p.partition_max_bytes, budget - total)
                try:
                    found = log.read(p.fetch_offset, max(limit, 0), max_offset=lso if read_committed else hw,
                                     min_one_message=(total == 0))
                except OffsetOutOfRangeError:
                    out["error_code"] = OFFSET_OUT_OF_RANGE
                    errors = True
                    continue
                if found is not None and found.size > 0:
                    data = found.read()
                    out["records"] = data
                    total += len(data)
            responses.append({"topic": t.topic, "partitions": parts})
        return responses, total, errors

    def _list_offsets(self, version: int, body) -> dict:
        read_committed = body.isolation_level == 1
        topics = []
        for t in body.topics:
            parts = []
            for p in t.partitions:
                out = {"partition_index": p.partition_index, "error_code": NONE, "timestamp": -1, "offset": -1,
                       "leader_epoch": -1}
                parts.append(out)
                log = self._log(t.name, p.partition_index)
                if log is None:
                    out["error_code"] = UNKNOWN_TOPIC_OR_PARTITION
                    continue
                ts = p.timestamp
                if ts == -1:
                    out["offset"] = log.last_stable_offset if read_committed else log.high_watermark
                elif ts in (-2, -4):  # earliest, earliest-local (no tiered storage)
                    out["offset"] = log.log_start_offset
                elif ts == -3 or ts >= 0:
                    found = log.offset_for_timestamp(ts)
                    if found is not None:
                        out["offset"], out["timestamp"] = found
                # other negative targets (tiered storage): offset -1, timestamp -1
            topics.append({"name": t.name, "partitions": parts})
        return {"throttle_time_ms": 0, "topics": topics}


async def _ready(value: bytes) -> bytes:
    return value


