"""The storage sidecar's Kafka server: the broker over the partitions a `TopicRegistry` hosts here.

Each connection (`connection.Connection`: frames received into one reused
buffer and decoded as they complete) gets a task that dispatches its requests
to the handlers below, which translate them into `Log` calls, and writes the
responses; Fetch responses send large record sets from the segment file with
`sendfile` (`connection.FileRange`), as Kafka does, instead of copying them
through Python.

The broker serves ApiVersions, Metadata, Produce, Fetch and ListOffsets itself;
the other APIs come from components (group coordinator, admin, producer ids) as
a table of handlers, `async (request, connection) -> response body`.  Responses
are written in request order per connection (a FIFO of handler tasks), so a
Fetch or JoinGroup that waits does not reorder the replies to pipelined requests.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import resource
import socket
import struct
import time
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Mapping

from shale.sidecar.log.checkpoint import TopicPartition
from shale.sidecar.log.errors import (
    CorruptRecordError,
    InvalidRecordError,
    KafkaStorageError,
    LogError,
    OffsetOutOfRangeError,
    RecordTooLargeError,
)
from shale.sidecar.log.errors import InvalidTimestampError
from shale.sidecar.plural import plural
from shale.sidecar.protocol import codec
from shale.sidecar.server.authorized_operations import CLUSTER_OPERATIONS, TOPIC_OPERATIONS
from shale.sidecar.server.connection import MAX_FRAME_BYTES, Connection, FileRange, RequestMemory
from shale.sidecar.server.topics import TopicRegistry, topic_uuid
from shale.sidecar.protocol.error_codes import (
    NONE, UNKNOWN_SERVER_ERROR, OFFSET_OUT_OF_RANGE, CORRUPT_MESSAGE, UNKNOWN_TOPIC_OR_PARTITION,
    NOT_LEADER_OR_FOLLOWER, MESSAGE_TOO_LARGE, INVALID_REQUIRED_ACKS, INVALID_TIMESTAMP, UNSUPPORTED_VERSION,
    KAFKA_STORAGE_ERROR, INVALID_RECORD, UNKNOWN_TOPIC_ID,
)

logger = logging.getLogger(__name__)

# Fetched record sets at least this big go out with sendfile; smaller ones are read and sent inline,
# where the few loop iterations of a sendfile would cost more than the copy they save.
SENDFILE_MIN_BYTES = 64 * 1024

# accept() failing for lack of descriptors or memory: wait before the next try, doubling up to a second
# (the connections wait in the listen backlog meanwhile), and log it at most once a minute.
ACCEPT_RETRY_FIRST_S, ACCEPT_RETRY_MAX_S, ACCEPT_LOG_EVERY_S = 0.01, 1.0, 60.0
_OUT_OF_RESOURCES = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)


API_PRODUCE, API_FETCH, API_LIST_OFFSETS, API_METADATA, API_API_VERSIONS = 0, 1, 2, 3, 18

# Caps below the codec's ranges where a version identifies topics by ID, which is
# not routed yet (kafka-protocol.md G6): Fetch >= 13, Produce 13, OffsetCommit and
# OffsetFetch >= 10.
VERSION_CAPS = {API_FETCH: 12, API_PRODUCE: 12, 8: 9, 9: 9}


@dataclass(frozen=True, slots=True)
class ConnectionInfo:
    """Who sent a request: group members record the client id and host."""

    client_id: str | None
    host: str


Handler = Callable[[codec.Request, ConnectionInfo], Awaitable[Any]]


def controller_id(registry: TopicRegistry) -> int:
    """The node Metadata and DescribeCluster name as controller: the lowest node id, which also coordinates groups."""
    return min(registry.nodes())


def advertised_range(api_key: int) -> tuple[int, int]:
    lo, hi = codec.SUPPORTED_VERSIONS[api_key]
    return lo, min(hi, VERSION_CAPS.get(api_key, hi))


def _append_error_code(exc: Exception) -> int:
    if isinstance(exc, CorruptRecordError):
        return CORRUPT_MESSAGE
    if isinstance(exc, RecordTooLargeError):
        return MESSAGE_TOO_LARGE
    code = getattr(exc, "error_code", None)  # engine errors that carry their Kafka code (idempotence)
    if code is not None:
        return code
    if isinstance(exc, InvalidTimestampError):  # before InvalidRecordError: it is a subclass
        return INVALID_TIMESTAMP
    if isinstance(exc, InvalidRecordError):
        return INVALID_RECORD
    if isinstance(exc, (LogError, OSError)):  # Kafka: an IOException becomes KafkaStorageException
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


def _produce_records_error(version: int, records: bytes) -> str | None:
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


class _Closing(Exception):
    """The connection must be closed without a response (already logged)."""


class Broker:
    """A single-node Kafka broker serving the topics given to it from one log directory."""

    def __init__(
        self,
        registry: TopicRegistry,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        handlers: Mapping[int, Handler] | None = None,
        cluster_id: str = "shale",
        observe: Callable[[str, float], None] | None = None,
        max_request_bytes: int = MAX_FRAME_BYTES,
        queued_max_request_bytes: int = -1,
    ) -> None:
        self.registry = registry
        self.host = host
        self.port = port
        self.cluster_id = cluster_id
        self._observe = observe  # (api name, seconds) of every answered request, for the metrics
        self.max_request_bytes = max_request_bytes  # socket.request.max.bytes
        # queued.max.request.bytes; -1 (or 0) bounds the requests in flight by one largest request instead
        self.memory = RequestMemory(queued_max_request_bytes if queued_max_request_bytes > 0 else max_request_bytes)
        self.accept_errors = 0  # accept() calls that failed for lack of descriptors or memory
        self._listener: socket.socket | None = None
        self._accept_retry: asyncio.TimerHandle | None = None
        self._accept_delay = 0.0
        self._accept_logged = (float("-inf"), 0)  # (loop time of the last log line, accept_errors then)
        self._events: dict[TopicPartition, asyncio.Event] = {}
        self._connections: set[asyncio.Task] = set()
        self.handlers: dict[int, Handler] = {
            API_API_VERSIONS: self._api_versions,
            API_METADATA: self._metadata,
            API_PRODUCE: self._produce,
            API_FETCH: self._fetch,
            API_LIST_OFFSETS: self._list_offsets,
            **(handlers or {}),
        }
        self.advertised = {key: advertised_range(key) for key in self.handlers}

    @property
    def node_id(self) -> int:
        return self.registry.node.node_id

    # -- lifecycle ---------------------------------------------------------------------------

    async def start(self) -> None:
        """Listen, with our own accept loop: asyncio's retries accept() 100 times per wakeup when it fails with
        EMFILE and logs each (tens of MB of log a minute), and turns a listening socket it could not create
        into a server with no sockets."""
        family = socket.getaddrinfo(self.host, self.port, type=socket.SOCK_STREAM)[0][0]  # an IPv6 host too
        self._listener = socket.create_server((self.host, self.port), family=family, backlog=1024)
        self._listener.setblocking(False)
        self.port = self._listener.getsockname()[1]
        asyncio.get_running_loop().add_reader(self._listener.fileno(), self._accept_ready)
        node = self.registry.node
        logger.info("broker %d listening on %s:%d (advertised %s:%d)", node.node_id, self.host, self.port,
                    node.host, node.port)

    async def close(self) -> None:
        if self._listener is not None:
            asyncio.get_running_loop().remove_reader(self._listener.fileno())
            if self._accept_retry is not None:
                self._accept_retry.cancel()
            self._listener.close()
            self._listener = None
        for task in list(self._connections):
            task.cancel()
        if self._connections:
            await asyncio.gather(*self._connections, return_exceptions=True)

    # -- connections -------------------------------------------------------------------------

    def _accept_ready(self) -> None:
        loop = asyncio.get_running_loop()
        for _ in range(64):  # a burst of connections is taken in one wakeup, as asyncio does
            try:
                sock, _ = self._listener.accept()
            except (BlockingIOError, InterruptedError, ConnectionAbortedError):
                return
            except OSError as exc:
                if exc.errno not in _OUT_OF_RESOURCES:
                    logger.error("accepting a connection on %s:%d failed: %s", self.host, self.port, exc)
                    return
                self._accept_failed(loop, exc)
                return
            self._accept_delay = 0.0
            sock.setblocking(False)
            task = loop.create_task(self._connect(loop, sock))
            self._connections.add(task)
            task.add_done_callback(self._connections.discard)

    def _accept_failed(self, loop: asyncio.AbstractEventLoop, exc: OSError) -> None:
        """Stop accepting for a while (the descriptor stays readable, so retrying at once would spin)."""
        self.accept_errors += 1
        loop.remove_reader(self._listener.fileno())
        self._accept_delay = min(ACCEPT_RETRY_MAX_S, max(ACCEPT_RETRY_FIRST_S, 2 * self._accept_delay))
        self._accept_retry = loop.call_later(self._accept_delay, self._resume_accepting)
        last, errors_then = self._accept_logged
        if loop.time() - last >= ACCEPT_LOG_EVERY_S:
            logger.error("cannot accept connections on %s:%d: %s (%s since the last report; descriptor "
                         "limit %d); retrying, next in %.2f s", self.host, self.port, exc,
                         plural(self.accept_errors - errors_then, "failure"),
                         resource.getrlimit(resource.RLIMIT_NOFILE)[0], self._accept_delay)
            self._accept_logged = (loop.time(), self.accept_errors)

    def _resume_accepting(self) -> None:
        self._accept_retry = None
        if self._listener is not None:
            asyncio.get_running_loop().add_reader(self._listener.fileno(), self._accept_ready)

    async def _connect(self, loop: asyncio.AbstractEventLoop, sock: socket.socket) -> None:
        try:
            _, conn = await loop.connect_accepted_socket(
                lambda: Connection(self.memory, self.max_request_bytes), sock)
        except OSError as exc:
            logger.error("dropping a connection accepted on %s:%d: %s", self.host, self.port, exc)
            sock.close()
            return
        except asyncio.CancelledError:  # the broker closes
            sock.close()
            raise
        await self._on_connect(conn)

    async def _on_connect(self, conn: Connection) -> None:
        try:
            await self._serve_connection(conn)
        except asyncio.CancelledError:
            pass  # only close() cancels these

    async def _serve_connection(self, conn: Connection) -> None:
        peer = conn.peername()
        where = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)
        host = peer[0] if isinstance(peer, tuple) else str(peer)
        state = {"client_id": None}

        def client() -> str:
            return f"client {state['client_id']!r} at {where}" if state["client_id"] is not None else f"client at {where}"

        # FIFO of (task producing the framed response or None).  The writer drains it in order.
        pending: asyncio.Queue[asyncio.Task | None] = asyncio.Queue()
        write_task = asyncio.create_task(self._write_loop(pending, conn, client))
        clean = True
        try:
            while True:
                received = await conn.next_frame()
                if received is None:
                    break
                try:  # the frame's bytes count as in flight until its handler is done
                    size, frame = received.size, received.head
                    if size < 0 or size > self.max_request_bytes:  # Kafka's InvalidReceiveException
                        logger.error("closing connection of %s: frame size %d outside 0..%d bytes "
                                     "(socket.request.max.bytes)", client(), size, self.max_request_bytes)
                        clean = False
                        break
                    try:
                        if received.error is not None:
                            raise received.error
                        request = received.request
                    except codec.UnsupportedVersionError as exc:
                        if exc.api_key == API_API_VERSIONS:  # KIP-511: tell the client what we do support, at v0
                            lo, hi = self.advertised[API_API_VERSIONS]
                            body = {"error_code": UNSUPPORTED_VERSION, "api_keys": [
                                {"api_key": API_API_VERSIONS, "min_version": lo, "max_version": hi}]}
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
                    if request.api_key not in self.handlers:
                        logger.error("closing connection of %s: %s v%d is not implemented", client(),
                                     request.api_name, request.api_version)
                        clean = False
                        break
                    lo, hi = self.advertised[request.api_key]
                    if not lo <= request.api_version <= hi:  # Kafka closes on a version it does not serve
                        logger.error("closing connection of %s: %s v%d is not supported (supported %d-%d)", client(),
                                     request.api_name, request.api_version, lo, hi)
                        clean = False
                        break
                    info = ConnectionInfo(request.client_id, host)  # not `conn`: that is the Connection read above
                    task = asyncio.create_task(self._dispatch(request, info))
                    task.add_done_callback(lambda _task, held=received: conn.done(held))
                    received = None
                    await pending.put(task)
                finally:
                    if received is not None:
                        conn.done(received)
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
            conn.stop_reading()  # frames never taken release their memory
            try:
                await conn.close()
            except Exception:  # noqa: BLE001 - the peer may be gone already
                pass

    async def _write_loop(self, pending: asyncio.Queue, conn: Connection, client) -> None:
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
                    conn.transport.abort()
                    return
                if out is None:
                    continue
                if isinstance(out, list):  # a Fetch response: bytes, and record sets to send from their files
                    conn.cork(True)
                    try:
                        for part in out:
                            if isinstance(part, FileRange):
                                await self._send_file_range(conn, part, client)
                            else:
                                conn.write(part)
                    finally:
                        conn.cork(False)
                else:
                    conn.write(out)
                await conn.drain()
        except ConnectionError:
            conn.transport.abort()
        except _Closing:
            conn.transport.abort()
        finally:
            while not pending.empty():
                t = pending.get_nowait()
                if t is not None:
                    t.cancel()

    async def _send_file_range(self, conn: Connection, part: FileRange, client) -> None:
        """Write `part` with sendfile (read and write it where sendfile cannot), then release its descriptor."""
        try:
            sent = 0
            sock = conn.transport.get_extra_info("socket")
            if sock is not None and conn.transport.get_write_buffer_size() == 0 and not conn.transport.is_closing():
                # Nothing of ours is queued, so the socket can take the bytes directly; a loopback or LAN
                # socket usually takes a whole fetch in one call, without loop.sendfile's round trips.
                try:
                    sent = os.sendfile(sock.fileno(), part.fd, part.position, part.size)
                except (BlockingIOError, InterruptedError):
                    sent = 0
                except OSError:
                    sent = 0  # not sendfile-able here: loop.sendfile below decides (and falls back to a copy)
            try:
                if sent < part.size:
                    sent += await asyncio.get_running_loop().sendfile(
                        conn.transport, part, part.position + sent, part.size - sent, fallback=False)
            except (asyncio.SendfileNotAvailableError, RuntimeError) as exc:
                if conn.transport.is_closing():
                    raise ConnectionResetError("connection closing") from exc
                data = os.pread(part.fd, part.size - sent, part.position + sent)
                conn.write(data)
                sent += len(data)
            if sent != part.size:
                # The segment shrank under the fetch (truncation): the response is already framed with the
                # larger size, so only closing the connection keeps the client's stream in sync.
                logger.error("closing connection of %s: %s ended after %d of the %d fetched bytes at position %d",
                             client(), part.where, sent, part.size, part.position)
                raise _Closing()
        finally:
            part.close()

    async def _dispatch(self, request: codec.Request, conn: ConnectionInfo) -> bytes | list | None:
        started = time.perf_counter()
        resp = await self.handlers[request.api_key](request, conn)
        if self._observe is not None:
            self._observe(request.api_name, time.perf_counter() - started)
        if not request.expects_response:
            return None
        if request.api_key == API_FETCH:  # record sets in files stay out of the encoding (sendfile)
            return codec.encode_response_parts(request.api_key, request.api_version, request.correlation_id,
                                               resp, framed=True)
        return codec.encode_response(request.api_key, request.api_version, request.correlation_id, resp,
                                     framed=True)

    # -- helpers -----------------------------------------------------------------------------

    def _partition_error(self, topic: str | None, partition: int) -> int:
        """Why a partition has no local log: unknown, or led by another node."""
        leader = self.registry.leader(topic, partition) if topic is not None else None
        return UNKNOWN_TOPIC_OR_PARTITION if leader is None else NOT_LEADER_OR_FOLLOWER

    def poke(self, tp: TopicPartition) -> None:
        """Wake fetches waiting on a partition (after an append by another component)."""
        self._poke(tp)

    def topic_changed(self, name: str) -> None:
        """Wake the fetches waiting on a topic that changed: a deleted or moved partition answers now, as Kafka's
        DelayedFetch completes when its partition goes, not at the fetch's max wait."""
        for tp in [tp for tp in self._events if tp.topic == name]:
            self._poke(tp)

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

    async def _api_versions(self, request: codec.Request, conn: ConnectionInfo) -> dict:
        return {
            "error_code": NONE,
            "api_keys": [{"api_key": k, "min_version": lo, "max_version": hi}
                         for k, (lo, hi) in sorted(self.advertised.items())],
            "throttle_time_ms": 0,
        }

    async def _metadata(self, request: codec.Request, conn: ConnectionInfo) -> dict:
        version, body = request.api_version, request.body
        registry = self.registry
        cluster_operations = 8 <= version <= 10 and body.include_cluster_authorized_operations
        topic_operations = version >= 8 and body.include_topic_authorized_operations
        if body.topics is None or (version == 0 and not body.topics):
            wanted = list(registry.topics)
        else:
            wanted = [t.name for t in body.topics]
        topics = []
        for name in wanted:
            spec = registry.topics.get(name) if name is not None else None
            if spec is None:
                topics.append({"error_code": UNKNOWN_TOPIC_ID if name is None else UNKNOWN_TOPIC_OR_PARTITION,
                               "name": name, "partitions": []})
                continue
            partitions = []
            for p in range(spec.partitions):
                leader = spec.node_of(p, self.node_id)
                partitions.append({"error_code": NONE, "partition_index": p, "leader_id": leader,
                                   "leader_epoch": -1, "replica_nodes": [leader], "isr_nodes": [leader],
                                   "offline_replicas": []})
            topics.append({"error_code": NONE, "name": name, "topic_id": topic_uuid(registry.topic_id(name)),
                           "is_internal": spec.internal, "partitions": partitions,
                           "authorized_operations": TOPIC_OPERATIONS if topic_operations else None})
        return {
            "throttle_time_ms": 0,
            "brokers": [{"node_id": n.node_id, "host": n.host, "port": n.port, "rack": None}
                        for n in sorted(registry.nodes().values(), key=lambda n: n.node_id)],
            "cluster_id": self.cluster_id,
            "controller_id": controller_id(registry),
            "topics": topics,
            "authorized_operations": CLUSTER_OPERATIONS if cluster_operations else None,
        }

    async def _produce(self, request: codec.Request, conn: ConnectionInfo) -> dict:
        version, body = request.api_version, request.body
        responses = []
        for topic in body.topic_data:
            parts = []
            for pd in topic.partition_data:
                part = self._produce_partition(version, body.acks, topic.name, pd.index, pd.records)
                reason = part.pop("_reason", None)
                if reason is not None:  # Kafka logs refused appends too (ReplicaManager.processFailedRecord)
                    stale = part["error_code"] in (UNKNOWN_TOPIC_OR_PARTITION, NOT_LEADER_OR_FOLLOWER)
                    logger.log(logging.INFO if stale else logging.ERROR,
                               "produce from client %r at %s to %s-%d refused with error %d: %s", conn.client_id,
                               conn.host, topic.name, pd.index, part["error_code"], reason)
                parts.append(part)
            responses.append({"name": topic.name, "partition_responses": parts})
        return {"responses": responses, "throttle_time_ms": 0}

    def _produce_partition(self, version: int, acks: int, topic: str, partition: int, records) -> dict:
        out = {"index": partition, "error_code": NONE, "base_offset": -1, "log_append_time_ms": -1,
               "log_start_offset": -1}

        def fail(code: int, message: str) -> dict:
            out["error_code"] = code
            out["_reason"] = message  # for the log line; removed before encoding
            if version >= 8:
                out["error_message"] = message
            return out

        log = self.registry.local_log(topic, partition)
        if log is None:
            code = self._partition_error(topic, partition)
            where = "unknown" if code == UNKNOWN_TOPIC_OR_PARTITION else "not led by this node:"
            return fail(code, f"{where} topic-partition {topic}-{partition}")
        if version < 3:
            return fail(UNSUPPORTED_VERSION, "Produce v0-2 (message format v0/v1) is not supported")
        if acks not in (0, 1, -1):
            return fail(INVALID_REQUIRED_ACKS, f"acks={acks}")
        if records is None:
            return fail(CORRUPT_MESSAGE, "null record set")
        refused = _produce_records_error(version, records)
        if refused is not None:
            return fail(INVALID_RECORD, f"{refused} ({topic}-{partition})")
        try:
            info = log.append(records)
        except Exception as exc:  # noqa: BLE001 - mapped to a per-partition error code
            code = _append_error_code(exc)
            if code in (UNKNOWN_SERVER_ERROR, KAFKA_STORAGE_ERROR) and not isinstance(exc, KafkaStorageError):
                logger.exception("append to %s-%d failed", topic, partition)  # the engine logged its own reason
            return fail(code, str(exc))
        self._poke(TopicPartition(topic, partition))
        out.update(base_offset=info.first_offset, log_append_time_ms=info.log_append_time,
                   log_start_offset=log.log_start_offset)
        return out

    async def _fetch(self, request: codec.Request, conn: ConnectionInfo) -> dict:
        body = request.body
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(body.max_wait_ms, 0) / 1000
        min_bytes = max(body.min_bytes, 0)
        while True:
            # Take the events before reading, so an append in between still wakes us.
            events = []
            for t in body.topics:
                for p in t.partitions:
                    if self.registry.local_log(t.topic, p.partition) is not None:
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
                log = self.registry.local_log(t.topic, p.partition)
                if log is None:
                    out["error_code"] = self._partition_error(t.topic, p.partition)
                    errors = True
                    continue
                hw = log.high_watermark
                lso = log.last_stable_offset
                out.update(high_watermark=hw, last_stable_offset=lso, log_start_offset=log.log_start_offset)
                limit = min(p.partition_max_bytes, budget - total)
                try:
                    with log.lock:  # the slice and the duplicated descriptor describe the same file
                        found = log.read(p.fetch_offset, max(limit, 0), max_offset=lso if read_committed else hw,
                                         min_one_message=(total == 0))
                        if found is not None and found.size >= SENDFILE_MIN_BYTES:
                            try:
                                out["records"] = FileRange(found.segment.dup_fd(), found.position, found.size,
                                                            f"{t.topic}-{p.partition} {found.segment.log_path}")
                            except OSError as exc:  # out of descriptors: the bytes go inline instead
                                if exc.errno not in _OUT_OF_RESOURCES:
                                    raise
                                out["records"] = found.read()
                except OffsetOutOfRangeError:
                    out["error_code"] = OFFSET_OUT_OF_RANGE
                    errors = True
                    continue
                if found is not None and found.size > 0:
                    if found.size < SENDFILE_MIN_BYTES:
                        out["records"] = found.read()
                    total += found.size
            responses.append({"topic": t.topic, "partitions": parts})
        return responses, total, errors

    async def _list_offsets(self, request: codec.Request, conn: ConnectionInfo) -> dict:
        body = request.body
        read_committed = body.isolation_level == 1
        topics = []
        for t in body.topics:
            parts = []
            for p in t.partitions:
                out = {"partition_index": p.partition_index, "error_code": NONE, "timestamp": -1, "offset": -1,
                       "leader_epoch": -1}
                parts.append(out)
                log = self.registry.local_log(t.name, p.partition_index)
                if log is None:
                    out["error_code"] = self._partition_error(t.name, p.partition_index)
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


