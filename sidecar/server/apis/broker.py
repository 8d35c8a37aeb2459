"""The storage sidecar's Kafka server: the broker over the partitions a `TopicRegistry` hosts here.

Each connection (`connection.Connection`: frames received into one reused
buffer and decoded as they complete) gets a task that dispatches its requests
to the handlers below, which translate them into `Log` calls, and writes the
responses; Fetch responses send large record sets from the segment file with
`sendfile` (`connection.FileRange`), as Kafka does, instead of copying them
through Python.

The broker serves ApiVersions, Metadata, Produce, Fetch, ListOffsets and
OffsetForLeaderEpoch itself. With a control store (`replicas`, the replica
manager) those answer what the store's records say: leaders and epochs, acks=all
parked until the ISR has the records, followers' fetches read to the log end;
without one every partition here has its single replica. The other APIs come from components (group coordinator, admin, producer ids) as
a table of handlers, `async (request, connection) -> response body`.  Responses
are written in request order per connection (a FIFO of handler tasks), and at
most MAX_HANDLING_PER_CONNECTION of a connection's requests are handled at once
(Kafka's processor mutes a connection while its one request is in flight): the
requests pipelined behind them are read and wait their turn.
A request with nothing ahead of it is handled as its frame arrives, its handler
started in place (`eager`): one that does not wait is answered then and there,
with no task and no further event-loop iteration.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import resource
import socket
import ssl
import struct
import time
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Mapping, Sequence

from ...log.errors import (
    CorruptRecordError,
    InvalidRecordError,
    InvalidTimestampError,
    KafkaStorageError,
    LogError,
    OffsetOutOfRangeError,
    RecordTooLargeError,
)
from ...log.log import Log
from ...log.segment import LogSlice
from ...log.topic_partition import TopicPartition
from ...plural import plural
from ...protocol import codec
from ...protocol.codec import MAX_FRAME_BYTES
from ...protocol.error_codes import (
    CORRUPT_MESSAGE,
    FENCED_LEADER_EPOCH,
    INVALID_RECORD,
    INVALID_REQUIRED_ACKS,
    INVALID_TIMESTAMP,
    KAFKA_STORAGE_ERROR,
    LEADER_NOT_AVAILABLE,
    LISTENER_NOT_FOUND,
    MESSAGE_TOO_LARGE,
    NONE,
    NOT_ENOUGH_REPLICAS,
    NOT_ENOUGH_REPLICAS_AFTER_APPEND,
    NOT_LEADER_OR_FOLLOWER,
    OFFSET_NOT_AVAILABLE,
    OFFSET_OUT_OF_RANGE,
    REQUEST_TIMED_OUT,
    TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
    UNKNOWN_LEADER_EPOCH,
    UNKNOWN_SERVER_ERROR,
    UNKNOWN_TOPIC_ID,
    UNKNOWN_TOPIC_OR_PARTITION,
    UNSUPPORTED_VERSION,
)
from ...replication.fetch_session import FetchSessionCache
from ...replication.partition import NO_EPOCH
from ...replication.replica_manager import ReplicaManager
from ...replication.store_records import NO_LEADER
from ...security.principal import ANONYMOUS, KafkaPrincipal
from ...topics.registry import TopicRegistry, topic_uuid
from ..network import eager
from ..network.channel import Channel, FailedAuthentication
from ..network.connection import Connection, FileRange, RequestMemory
from ..network.io_thread import IoThread
from ..network.io_thread import available as io_thread_available
from ..network.listener_security import ListenerSecurity
from ..network.native_produce import FIRST_BATCH_VERSION, NativeProduce, answerer, appended, native_produce
from .authorized_operations import CLUSTER_OPERATIONS, TOPIC_OPERATIONS
from .transaction_verification import (
    CONTROL_FROM_CLIENT,
    Verify,
    batch_header,
    needs_verification,
    produce_error,
    transactional,
)

logger = logging.getLogger(__name__)

# Fetched record sets at least this big go out with sendfile; smaller ones are read and sent inline,
# where the few loop iterations of a sendfile would cost more than the copy they save.
SENDFILE_MIN_BYTES = 64 * 1024

# A fetched record set goes through TLS in pieces this big, each encrypted and handed to the socket before the
# next is read: the client decrypts one piece while the next is encrypted, where one 1 MiB write made the two
# sides take turns (docs/performance.md, "TLS").
TLS_PIECE_BYTES = 128 * 1024

# Requests of one connection handled at once while earlier ones wait (acks=all Produces parked for the ISR, long
# polls); the rest are read and wait their turn. Kafka's broker handles one at a time; a few let one connection's
# appends overlap its replication (Java producers send at most 5 unanswered requests), and any bound keeps a
# producer with a deep queue from appending ahead of its followers past its request timeout.
MAX_HANDLING_PER_CONNECTION = 5

# accept() failing for lack of descriptors or memory: wait before the next try, doubling up to a second
# (the connections wait in the listen backlog meanwhile), and log it at most once a minute.
ACCEPT_RETRY_FIRST_S, ACCEPT_RETRY_MAX_S, ACCEPT_LOG_EVERY_S = 0.01, 1.0, 60.0
_OUT_OF_RESOURCES = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)


API_PRODUCE, API_FETCH, API_LIST_OFFSETS, API_METADATA, API_API_VERSIONS = 0, 1, 2, 3, 18
API_OFFSET_FOR_LEADER_EPOCH = 23
DEBUGGING_REPLICA_ID = -2  # Kafka's: a request that may read any replica, not only the leader's

# Caps below the codec's ranges where a version identifies topics by ID, which is
# not routed yet (kafka-protocol.md G6): Fetch >= 13, Produce 13, OffsetCommit and
# OffsetFetch >= 10.
# AddPartitionsToTxn v4+, EndTxn v5 and TxnOffsetCommit v5 are KIP-890's transaction version 2 (server-side
# partition verification, an epoch bump per transaction), which the coordinator does not implement.
VERSION_CAPS = {API_FETCH: 12, API_PRODUCE: 12, 8: 9, 9: 9, 24: 3, 26: 4, 28: 4}


@dataclass(frozen=True, slots=True)
class ConnectionInfo:
    """Who sent a request: group members record the client id and host; the authorizer checks the principal
    (`User:ANONYMOUS` on a PLAINTEXT listener) and which listener it came through."""

    client_id: str | None
    host: str
    principal: KafkaPrincipal = ANONYMOUS
    listener: str = "PLAINTEXT"


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


def _aborted_transactions(log: Log, fetch_offset: int, found: LogSlice | None) -> list[dict]:
    """A read_committed fetch's `aborted_transactions`: those overlapping what it returns (Kafka's
    addAbortedTransactions); an empty list, not null, when none or nothing is returned."""
    if found is None or found.size == 0:
        return []
    return [{"producer_id": t.producer_id, "first_offset": t.first_offset}
            for t in log.collect_aborted_transactions(fetch_offset, log.fetch_upper_bound(found))]


def _whole_batch_size(records: bytes, pos: int) -> int | None:
    """Size of the whole batch at `pos`; None if none fits there; -1 if its declared size is corrupt."""
    if len(records) - pos < 17:  # offset, length, leader epoch and magic
        return None
    (length,) = struct.unpack_from(">i", records, pos + 8)
    if length < 14:  # Kafka's minimum record overhead
        return -1
    return 12 + length if pos + 12 + length <= len(records) else None


@dataclass(eq=False, slots=True)
class _ParkedFetch:
    """A Fetch waiting for its partitions to change: one future, set by the first poke or by its max wait (no
    task per partition, and the handler resumes in the loop iteration after the poke)."""

    wake: asyncio.Future
    follower: bool  # a replica reads to the log end: a high watermark that rose alone gives it nothing new

    def wake_up(self) -> None:
        if not self.wake.done():
            self.wake.set_result(None)


class _Closing(Exception):
    """The connection must be closed without a response (already logged)."""


@dataclass
class _Listening:
    """One listener's socket and its accept loop's backoff."""

    security: ListenerSecurity
    sock: socket.socket
    retry: asyncio.TimerHandle | None = None
    delay: float = 0.0

    @property
    def where(self) -> str:
        host, port = self.sock.getsockname()[:2]
        return f"{self.security.name} {host}:{port}"


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
        replicas: ReplicaManager | None = None,
        listeners: Sequence[ListenerSecurity] | None = None,
        fetch_session_slots: int = 1000,
        consumer_fetch_sessions: bool = True,
        io_thread: bool = True,
    ) -> None:
        self.registry = registry
        # max.incremental.fetch.session.cache.slots: the fetch sessions of followers and consumers (KIP-227).
        # consumer_fetch_sessions is False under an authorizer: the topics a consumer's session reads without
        # naming them would not be authorized again (Kafka re-checks each), so consumers fetch without sessions.
        self.fetch_sessions = FetchSessionCache(fetch_session_slots, consumer_sessions=consumer_fetch_sessions)
        # With a control store: leadership, epochs and the high watermark come from the replica manager
        # (docs/replication.md); without one (None) every partition here has one replica, as before.
        self.replicas = replicas
        if replicas is not None:
            replicas.wake_fetches = self.poke
            replicas.wake_consumers = self.poke_consumers
        # The Kafka port's listeners (the first one's address is `host`/`port`); default: PLAINTEXT on host:port.
        self.listeners = list(listeners or [ListenerSecurity.plaintext(host, port)])
        self.host = self.listeners[0].endpoint.host or "0.0.0.0"
        self.port = self.listeners[0].endpoint.port
        self.ports: dict[str, int] = {}  # listener name -> bound port, once started
        self.advertised_at: dict[str, tuple[str, int]] = {}  # listener -> this node's address on it (Metadata)
        self.cluster_id = cluster_id
        self._observe = observe  # (api name, seconds) of every answered request, for the metrics
        self.on_failed_authentication: FailedAuthentication = lambda _listener, _mechanism, _reason: None  # metrics
        self.max_request_bytes = max_request_bytes  # socket.request.max.bytes
        # queued.max.request.bytes; -1 (or 0) bounds the requests in flight by one largest request instead
        self.memory = RequestMemory(queued_max_request_bytes if queued_max_request_bytes > 0 else max_request_bytes)
        self.accept_errors = 0  # accept() calls that failed for lack of descriptors or memory
        self._listening: list[_Listening] = []
        self._accept_logged = (float("-inf"), 0)  # (loop time of the last log line, accept_errors then)
        self._events: dict[TopicPartition, set[_ParkedFetch]] = {}  # the fetches parked on each partition
        self._native: NativeProduce | None = None  # built for the first connection that may use it
        # The I/O thread that plain native connections lend their sockets to (io_thread.py), started with the
        # native path when `io_thread`.
        self._io_wanted = io_thread and io_thread_available
        self._io: IoThread | None = None
        self._connections: set[asyncio.Task] = set()
        # The transaction coordinator's check of a producer's first transactional batch to a partition
        # (transaction_verification.py); the default verifies nothing, as a node without a coordinator.
        self.verify_transaction: Verify = lambda _tid, _pid, _epoch, _tp: None
        self.handlers: dict[int, Handler] = {
            API_API_VERSIONS: self._api_versions,
            API_METADATA: self._metadata,
            API_PRODUCE: self._produce,
            API_FETCH: self._fetch,
            API_LIST_OFFSETS: self._list_offsets,
            API_OFFSET_FOR_LEADER_EPOCH: self._offset_for_leader_epoch,
            **(handlers or {}),
        }
        self.advertised = {key: advertised_range(key) for key in self.handlers}

    @property
    def io(self) -> IoThread | None:
        """The I/O thread, once a connection could lend it its socket (for the metrics)."""
        return self._io

    @property
    def node_id(self) -> int:
        return self.registry.node.node_id

    # -- lifecycle ---------------------------------------------------------------------------

    async def start(self) -> None:
        """Listen, with our own accept loop: asyncio's retries accept() 100 times per wakeup when it fails with
        EMFILE and logs each (tens of MB of log a minute), and turns a listening socket it could not create
        into a server with no sockets."""
        loop = asyncio.get_running_loop()
        try:
            for security in self.listeners:
                host = security.endpoint.host or "0.0.0.0"
                family = socket.getaddrinfo(host, security.endpoint.port, type=socket.SOCK_STREAM)[0][0]  # IPv6 too
                sock = socket.create_server((host, security.endpoint.port), family=family, backlog=1024)
                sock.setblocking(False)
                listening = _Listening(security, sock)
                self._listening.append(listening)
                self.ports[security.name] = sock.getsockname()[1]
                if security.advertised is not None:
                    self.advertised_at[security.name] = (security.advertised.host,
                                                         security.advertised.port or self.ports[security.name])
                loop.add_reader(sock.fileno(), self._accept_ready, listening)
        except BaseException:
            await self.close()
            raise
        self.port = self.ports[self.listeners[0].name]
        node = self.registry.node
        logger.info("broker %d listening on %s (advertised %s:%d)", node.node_id,
                    ", ".join(f"{x.where} ({x.security.protocol.name})" for x in self._listening), node.host, node.port)

    async def close(self) -> None:
        loop = asyncio.get_running_loop()
        for listening in self._listening:
            loop.remove_reader(listening.sock.fileno())
            if listening.retry is not None:
                listening.retry.cancel()
            listening.sock.close()
        self._listening = []
        if self._io is not None:  # its sockets come back to their connections, which end below
            self._io.stop()
        for task in list(self._connections):
            task.cancel()
        if self._connections:
            await asyncio.gather(*self._connections, return_exceptions=True)

    # -- connections -------------------------------------------------------------------------

    def _accept_ready(self, listening: _Listening) -> None:
        loop = asyncio.get_running_loop()
        for _ in range(64):  # a burst of connections is taken in one wakeup, as asyncio does
            try:
                sock, peer = listening.sock.accept()
            except (BlockingIOError, InterruptedError, ConnectionAbortedError):
                return
            except OSError as exc:
                if exc.errno not in _OUT_OF_RESOURCES:
                    logger.error("accepting a connection on %s failed: %s", listening.where, exc)
                    return
                self._accept_failed(loop, listening, exc)
                return
            listening.delay = 0.0
            sock.setblocking(False)
            task = loop.create_task(self._connect(loop, sock, peer, listening))
            self._connections.add(task)
            task.add_done_callback(self._connections.discard)

    def _accept_failed(self, loop: asyncio.AbstractEventLoop, listening: _Listening, exc: OSError) -> None:
        """Stop accepting for a while (the descriptor stays readable, so retrying at once would spin)."""
        self.accept_errors += 1
        loop.remove_reader(listening.sock.fileno())
        listening.delay = min(ACCEPT_RETRY_MAX_S, max(ACCEPT_RETRY_FIRST_S, 2 * listening.delay))
        listening.retry = loop.call_later(listening.delay, self._resume_accepting, listening)
        last, errors_then = self._accept_logged
        if loop.time() - last >= ACCEPT_LOG_EVERY_S:
            logger.error("cannot accept connections on %s: %s (%s since the last report; descriptor "
                         "limit %d); retrying, next in %.2f s", listening.where, exc,
                         plural(self.accept_errors - errors_then, "failure"),
                         resource.getrlimit(resource.RLIMIT_NOFILE)[0], listening.delay)
            self._accept_logged = (loop.time(), self.accept_errors)

    def _resume_accepting(self, listening: _Listening) -> None:
        listening.retry = None
        if listening in self._listening:
            asyncio.get_running_loop().add_reader(listening.sock.fileno(), self._accept_ready, listening)

    async def _connect(self, loop: asyncio.AbstractEventLoop, sock: socket.socket, peer: Any,
                       listening: _Listening) -> None:
        security = listening.security
        where = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)
        try:  # on a TLS listener the handshake is done before the connection is made
            _, conn = await loop.connect_accepted_socket(
                lambda: Connection(self.memory, self.max_request_bytes,
                                   Channel(security, where, self.on_failed_authentication)), sock,
                ssl=security.ssl_context)
        except ssl.SSLError as exc:  # a refused certificate, plaintext on a TLS port: the client's problem
            logger.warning("listener %s: TLS handshake with %s failed: %s", listening.where, where, exc)
            self.on_failed_authentication(security.name, "none", "tls")
            sock.close()
            return
        except OSError as exc:
            logger.error("dropping a connection from %s accepted on %s: %s", where, listening.where, exc)
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
        state: dict[str, Any] = {"client_id": None, "info": None}

        def client() -> str:
            return f"client {state['client_id']!r} at {where}" if state["client_id"] is not None else f"client at {where}"

        replies = _Replies()
        write_task = asyncio.create_task(self._write_loop(replies, conn, client))

        def at_once(received) -> bool:
            """A frame with nothing ahead of it, handled as it arrives: answered then and there if its handler does
            not wait, else queued for the writer like any other. False leaves it to the loop below."""
            request = received.request
            if replies.waiting or conn.writing_paused or request.api_key not in self.handlers:
                return False
            lo, hi = self.advertised[request.api_key]
            if not lo <= request.api_version <= hi:
                return False
            state["client_id"] = request.client_id
            info = state["info"]  # one per connection while its client id and principal stay the same
            if info is None or info.client_id != request.client_id or info.principal is not conn.principal:
                info = state["info"] = ConnectionInfo(request.client_id, host, conn.principal, conn.listener)
            try:
                answered, out = self._start(request, info)
            except Exception:  # noqa: BLE001 - as the writer does for a handler that fails
                logger.exception("closing connection of %s: request handler failed", client())
                conn.done(received)
                conn.transport.abort()
                return True
            if not answered:
                out.add_done_callback(lambda _task: conn.done(received))
                replies.put(out, running=True)
                return True
            conn.done(received)
            if isinstance(out, list) and not all(isinstance(part, bytes) for part in out):
                replies.put_result(out)  # record sets to send from their files: the writer's job
            elif isinstance(out, list):
                for part in out:
                    conn.write(part)
            elif out is not None:
                conn.write(out)
            return True

        conn.at_once = at_once
        conn.native = self._native_answerer(conn, replies)
        if conn.native is not None and conn.transport.get_extra_info("ssl_object") is None:
            conn.io = self._io  # plain bytes on the socket (TLS needs the ssl object): the I/O thread may serve it
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
                            replies.put_result(out)
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
                    while len(replies.running) >= MAX_HANDLING_PER_CONNECTION:
                        # Pipelined requests wait their turn (Kafka's processor mutes a connection while one is in
                        # flight): acks=all Produces must not append ahead of replication without bound, or the
                        # followers fall behind the clients' request timeouts.
                        await asyncio.wait(replies.running, return_when=asyncio.FIRST_COMPLETED)
                    # not `conn`: that is the Connection read above
                    info = ConnectionInfo(request.client_id, host, conn.principal, conn.listener)
                    try:
                        answered, out = self._start(request, info)
                    except Exception as exc:  # noqa: BLE001 - the writer reports it in its turn
                        answered, out = False, asyncio.get_running_loop().create_future()
                        out.set_exception(exc)
                    if answered:
                        replies.put_result(out)
                    else:
                        out.add_done_callback(lambda _task, held=received: conn.done(held))
                        received = None
                        replies.put(out, running=True)
                finally:
                    if received is not None:
                        conn.done(received)
        finally:
            conn.at_once = None
            if clean:
                replies.queue.put_nowait(None)
                try:
                    await write_task
                except Exception:  # noqa: BLE001 - already logged by the write loop
                    pass
            else:
                write_task.cancel()
                replies.cancel()
            conn.stop_reading()  # frames never taken release their memory
            try:
                await conn.close()
            except Exception:  # noqa: BLE001 - the peer may be gone already
                pass

    async def _write_loop(self, replies: "_Replies", conn: Connection, client) -> None:
        """Write the queued answers in request order, each when its handler is done (None ends the loop)."""
        pending = replies.queue
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
                    replies.waiting -= 1
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
                replies.waiting -= 1
        except ConnectionError:
            conn.transport.abort()
        except _Closing:
            conn.transport.abort()
        finally:
            replies.cancel()

    async def _send_file_range(self, conn: Connection, part: FileRange, client) -> None:
        """Write `part` with sendfile (read and write it where sendfile cannot), then release its descriptor."""
        try:
            sent = 0
            sock = conn.sendfile_socket()
            if sock is None:  # TLS: the bytes must pass the TLS layer, in pieces (TLS_PIECE_BYTES)
                if conn.transport.is_closing():
                    raise ConnectionResetError("connection closing")
                while sent < part.size:
                    data = os.pread(part.fd, min(TLS_PIECE_BYTES, part.size - sent), part.position + sent)
                    if not data:
                        break
                    conn.write(data)
                    sent += len(data)
            elif conn.transport.get_write_buffer_size() == 0 and not conn.transport.is_closing():
                # Nothing of ours is queued, so the socket can take the bytes directly; a loopback or LAN
                # socket usually takes a whole fetch in one call, without loop.sendfile's round trips.
                try:
                    sent = os.sendfile(sock.fileno(), part.fd, part.position, part.size)
                except (BlockingIOError, InterruptedError):
                    sent = 0
                except OSError:
                    sent = 0  # not sendfile-able here: loop.sendfile below decides (and falls back to a copy)
            try:
                if sent < part.size and sock is not None:
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

    def _native_answerer(self, conn: Connection, replies: _Replies) -> Callable[[bytearray, int, int], bytes | None] | None:
        """The connection's native Produce (native_produce.py), where its answers are the handler's: one replica per
        partition (no replica manager), the Produce handler unwrapped (no authorizer), no SASL session."""
        if (self.replicas is not None or getattr(self.handlers[API_PRODUCE], "__func__", None) is not Broker._produce
                or (conn.channel is not None and conn.channel.session is not None)):
            return None
        if self._native is None:
            self._native = native_produce(self.advertised[API_PRODUCE], local_log=self.registry.local_log,
                                          events=self._events, poke=self.poke_partition, observe=self._observe)
            if self._native is None:
                return None
            if self._io_wanted:
                self._io = IoThread(asyncio.get_running_loop())
        return answerer(self._native, replies)

    def _start(self, request: codec.Request, conn: ConnectionInfo) -> tuple[bool, Any]:
        """Run the request's handler at once: (True, the framed answer or None) when it did not wait, else (False,
        the task that finishes it and gives the answer). A handler's exception, if raised at once, propagates."""
        started = time.perf_counter()
        answered, value = eager.start(self.handlers[request.api_key](request, conn))
        if answered:
            return True, self._answer(request, value, started)
        return False, asyncio.get_running_loop().create_task(self._dispatch(request, value, started))

    async def _dispatch(self, request: codec.Request, rest: Awaitable, started: float) -> bytes | list | None:
        return self._answer(request, await rest, started)

    def _answer(self, request: codec.Request, resp: Any, started: float) -> bytes | list | None:
        """The response frame (pieces, for a Fetch whose record sets go out with sendfile), or None for acks=0."""
        if self._observe is not None:
            self._observe(request.api_name, time.perf_counter() - started)
        if not request.expects_response:
            return None
        if request.api_key == API_FETCH:  # record sets in files stay out of the encoding (sendfile)
            parts = codec.encode_response_parts(request.api_key, request.api_version, request.correlation_id,
                                                resp, framed=True)
            # All inline (a follower's fetch of the newest records, mostly): one write, no TCP_CORK round trip.
            return parts[0] if len(parts) == 1 else parts
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

    def poke_partition(self, topic: str, partition: int) -> None:
        """`poke` by name: the native Produce's call after an append while some fetch waits (from the I/O thread,
        through the loop)."""
        tp = TopicPartition(topic, partition)
        if self._io is None:
            self._poke(tp)
        else:
            self._io.on_loop(self._poke, tp)

    def topic_changed(self, name: str) -> None:
        """Wake the fetches waiting on a topic that changed: a deleted or moved partition answers now, as Kafka's
        DelayedFetch completes when its partition goes, not at the fetch's max wait."""
        for tp in [tp for tp in self._events if tp.topic == name]:
            self._poke(tp)

    def poke_consumers(self, tp: TopicPartition) -> None:
        """Wake the consumers' fetches of a partition whose high watermark rose (followers read to the log end:
        they wait for records, as Kafka's DelayedFetch of a follower does not complete on the high watermark)."""
        self._poke(tp, followers=False)

    def _poke(self, tp: TopicPartition, *, followers: bool = True) -> None:
        for parked in self._events.get(tp, ()):
            if followers or not parked.follower:
                parked.wake_up()

    async def _park(self, tps: set[TopicPartition], deadline: float, follower: bool, since: int) -> None:
        """Wait until one of `tps` is poked or the loop time reaches `deadline`. `since`: the count of native appends
        before the fetch read its partitions; if the I/O thread appended since, it may not have seen this fetch
        parked, so the fetch reads again at once."""
        loop = asyncio.get_running_loop()
        parked = _ParkedFetch(loop.create_future(), follower)
        for tp in tps:
            self._events.setdefault(tp, set()).add(parked)
        if self._io is not None and appended() != since:
            parked.wake_up()
        timer = loop.call_at(deadline, parked.wake_up)
        try:
            await parked.wake
        finally:
            timer.cancel()
            for tp in tps:
                waiting = self._events.get(tp)
                if waiting is not None:
                    waiting.discard(parked)
                    if not waiting:
                        del self._events[tp]

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
                if self.replicas is not None:
                    partitions.append(self._replicated_metadata(TopicPartition(name, p), spec.replicas_of(p)))
                    continue
                leader = spec.node_of(p, self.node_id)
                partitions.append({"error_code": NONE, "partition_index": p, "leader_id": leader,
                                   "leader_epoch": -1, "replica_nodes": [leader], "isr_nodes": [leader],
                                   "offline_replicas": []})
            topics.append({"error_code": NONE, "name": name, "topic_id": topic_uuid(registry.topic_id(name)),
                           "is_internal": spec.internal, "partitions": partitions,
                           "authorized_operations": TOPIC_OPERATIONS if topic_operations else None})
        racks = {} if self.replicas is None else {n: reg.rack for n, reg in self.replicas.view.nodes.items()}
        addresses = {n.node_id: (n, self.address_on(n.node_id, conn.listener)) for n in registry.nodes().values()}
        for topic in topics:  # a leader without this listener: Kafka's KRaftMetadataCache answers no leader
            for part in topic.get("partitions", ()):
                leader = addresses.get(part["leader_id"])
                if leader is not None and leader[1] is None:
                    part["error_code"] = LISTENER_NOT_FOUND if version >= 6 else LEADER_NOT_AVAILABLE
                    part["leader_id"] = NO_LEADER
        return {
            "throttle_time_ms": 0,
            "brokers": [{"node_id": n.node_id, "host": n.host, "port": n.port, "rack": racks.get(n.node_id)} | shown
                        for n, shown in sorted(addresses.values(), key=lambda a: a[0].node_id) if shown is not None],
            "cluster_id": self.cluster_id,
            "controller_id": controller_id(registry),
            "topics": topics,
            "authorized_operations": CLUSTER_OPERATIONS if cluster_operations else None,
        }

    def address_on(self, node_id: int, listener: str) -> dict | None:
        """A node's address on the listener a request came through, as Kafka answers each listener with its own
        endpoints: {} keeps the registered (inter-broker) address — a listener not advertised here, a node
        registered without listeners (one listener, or an older node), or a node known only from manifests;
        None: the node registered its listeners and this one is not among them (Kafka leaves it out)."""
        if listener not in self.advertised_at:
            return {}
        if node_id == self.node_id:
            shown: tuple[str, int] | None = self.advertised_at[listener]
        else:
            registration = self.replicas.view.nodes.get(node_id) if self.replicas is not None else None
            if registration is None or not registration.listeners:
                return {}
            shown = registration.endpoint(listener)
        return None if shown is None else {"host": shown[0], "port": shown[1]}

    def _replicated_metadata(self, tp: TopicPartition, assigned: tuple[int, ...] | None) -> dict:
        """A partition as its store record has it: leader (-1 while being elected: LEADER_NOT_AVAILABLE, as
        Kafka answers), leader epoch, replicas, ISR, and the replicas without a live session."""
        replicas = self.replicas
        record = replicas.record(tp)
        if record is None:  # not created in the store yet
            return {"error_code": LEADER_NOT_AVAILABLE, "partition_index": tp.partition, "leader_id": -1,
                    "leader_epoch": -1, "replica_nodes": list(assigned or ()), "isr_nodes": [],
                    "offline_replicas": []}
        leader = replicas.announced_leader(record)
        return {"error_code": NONE if leader >= 0 else LEADER_NOT_AVAILABLE, "partition_index": tp.partition,
                "leader_id": leader, "leader_epoch": record.leader_epoch, "replica_nodes": list(record.replicas),
                "isr_nodes": list(record.isr),
                "offline_replicas": [r for r in record.replicas if not replicas.view.is_live(r)]}

    async def _produce(self, request: codec.Request, conn: ConnectionInfo) -> dict:
        version, body = request.api_version, request.body
        responses = []
        parked: list[tuple[str, dict, Any]] = []  # acks=all appends waiting for the high watermark
        if body.transactional_id is None and any(pd.records is not None and transactional(pd.records)
                                                 for topic in body.topic_data for pd in topic.partition_data):
            # Kafka refuses the whole request before looking at a partition: transactional records need an id.
            logger.error("produce from client %r at %s refused: transactional records without a transactional id",
                         conn.client_id, conn.host)
            return {"throttle_time_ms": 0, "responses": [
                {"name": t.name, "partition_responses": [
                    {"index": pd.index, "error_code": TRANSACTIONAL_ID_AUTHORIZATION_FAILED, "base_offset": -1,
                     "log_append_time_ms": -1, "log_start_offset": -1} for pd in t.partition_data]}
                for t in body.topic_data]}
        for topic in body.topic_data:
            parts = []
            for pd in topic.partition_data:
                part = self._produce_partition(version, body.acks, topic.name, pd.index, pd.records,
                                               body.transactional_id)
                reason = part.pop("_reason", None)
                if reason is not None:  # Kafka logs refused appends too (ReplicaManager.processFailedRecord)
                    self._log_refused(conn, topic.name, pd.index, part["error_code"], reason)
                waiter = part.pop("_waiter", None)
                if waiter is not None:
                    parked.append((topic.name, part, waiter))
                parts.append(part)
            responses.append({"name": topic.name, "partition_responses": parts})
        if parked:
            await self._await_replication(version, body.timeout_ms, parked, conn)
        if self.replicas is None:
            return {"responses": responses, "throttle_time_ms": 0}
        endpoints = self._point_to_leaders(
            (TopicPartition(t["name"], part["index"]), part) for t in responses for part in t["partition_responses"])
        shown = {e["node_id"]: self.address_on(e["node_id"], conn.listener) for e in endpoints}  # on its listener
        endpoints = [e | shown[e["node_id"]] for e in endpoints if shown[e["node_id"]] is not None]
        return {"responses": responses, "throttle_time_ms": 0, "node_endpoints": endpoints}

    def _point_to_leaders(self, parts) -> list[dict]:
        """KIP-951: a partition answered NOT_LEADER_OR_FOLLOWER (or FENCED_LEADER_EPOCH) names the leader this
        node knows, with its epoch (`current_leader`; Produce v10+, Fetch v12+), so a client can go there
        without first re-reading Metadata; the leaders' addresses go in `node_endpoints` (Produce v10+)."""
        endpoints: dict[int, dict] = {}
        for tp, out in parts:
            if out["error_code"] not in (NOT_LEADER_OR_FOLLOWER, FENCED_LEADER_EPOCH):
                continue
            record = self.replicas.record(tp)
            leader = NO_LEADER if record is None else self.replicas.valid_leader(record)
            if leader == NO_LEADER:
                continue
            out["current_leader"] = {"leader_id": leader, "leader_epoch": record.leader_epoch}
            node = self.replicas.view.nodes[leader]
            endpoints[leader] = {"node_id": leader, "host": node.host, "port": node.port, "rack": node.rack}
        return list(endpoints.values())

    @staticmethod
    def _log_refused(conn: ConnectionInfo, topic: str, partition: int, code: int, reason: str) -> None:
        # A client behind a leadership change is routine; replication slower than the request's timeout, or an
        # ISR shrunk under the append, is the cluster's state (as Kafka, which logs neither as an error); the
        # rest (corrupt or invalid records, storage failures) stays an error.
        level = (logging.INFO if code in (UNKNOWN_TOPIC_OR_PARTITION, NOT_LEADER_OR_FOLLOWER, NOT_ENOUGH_REPLICAS)
                 else logging.WARNING if code in (REQUEST_TIMED_OUT, NOT_ENOUGH_REPLICAS_AFTER_APPEND)
                 else logging.ERROR)
        logger.log(level,
                   "produce from client %r at %s to %s-%d refused with error %d: %s", conn.client_id,
                   conn.host, topic, partition, code, reason)

    async def _await_replication(self, version: int, timeout_ms: int, parked: list, conn: ConnectionInfo) -> None:
        """Kafka's DelayedProduce: each parked partition answers when its waiter is done, or REQUEST_TIMED_OUT
        after the request's `timeout_ms`. The records stay appended whatever the answer (the client may retry;
        an idempotent producer's retry is answered from the log)."""
        waiters = [w for _, _, w in parked]
        try:
            await asyncio.wait([w.done for w in waiters], timeout=max(timeout_ms, 0) / 1000)
        finally:
            for w in waiters:
                self.replicas.delayed.forget(w)
        for topic, part, waiter in parked:
            code = waiter.done.result() if waiter.done.done() else REQUEST_TIMED_OUT
            if code == NONE:
                continue
            part["error_code"] = code
            message = (f"{topic}-{part['index']}: offsets {part['base_offset']}..{waiter.required_offset - 1} "
                       f"appended in leader epoch {waiter.leader_epoch} but not acknowledged by the ISR")
            if version >= 8:
                part["error_message"] = message
            self._log_refused(conn, topic, part["index"], code, message)

    def _produce_partition(self, version: int, acks: int, topic: str, partition: int, records,
                           transactional_id: str | None = None) -> dict:
        out = {"index": partition, "error_code": NONE, "base_offset": -1, "log_append_time_ms": -1,
               "log_start_offset": -1}

        def fail(code: int, message: str) -> dict:
            out["error_code"] = code
            out["_reason"] = message  # for the log line; removed before encoding
            if version >= 8:
                out["error_message"] = message
            return out

        tp = TopicPartition(topic, partition)
        leading = self.replicas.leader(tp) if self.replicas is not None else None
        log = self.registry.local_log(topic, partition) if self.replicas is None else (
            leading.log if leading is not None else None)
        if log is None:
            code = self._partition_error(topic, partition)
            where = "unknown" if code == UNKNOWN_TOPIC_OR_PARTITION else "not led by this node:"
            return fail(code, f"{where} topic-partition {topic}-{partition}")
        if version < FIRST_BATCH_VERSION:
            return fail(UNSUPPORTED_VERSION, "Produce v0-2 (message format v0/v1) is not supported")
        if acks not in (0, 1, -1):
            return fail(INVALID_REQUIRED_ACKS, f"acks={acks}")
        if records is None:
            return fail(CORRUPT_MESSAGE, "null record set")
        refused = _produce_records_error(version, records)
        if refused is not None:
            return fail(INVALID_RECORD, f"{refused} ({topic}-{partition})")
        header = batch_header(records)
        if header is not None and header.is_control:  # LogValidator: markers come from coordinators only
            return fail(INVALID_RECORD, f"{CONTROL_FROM_CLIENT} ({topic}-{partition}, producer {header.producer_id})")
        if header is not None and transactional_id is not None and needs_verification(log, header):
            verified = self.verify_transaction(transactional_id, header.producer_id, header.producer_epoch, tp)
            if verified is not None and verified != NONE:
                code, why = produce_error(version, verified)
                return fail(code, f"{why} ({topic}-{partition}, transactional id {transactional_id!r}, producer "
                                  f"{header.producer_id} epoch {header.producer_epoch})")
        if leading is not None and acks == -1 and leading.state.under_min_isr(log.config.min_insync_replicas):
            isr = list(leading.state.record.isr)
            return fail(NOT_ENOUGH_REPLICAS, f"the ISR {isr} of {topic}-{partition} is smaller than its minimum "
                                             f"{leading.state.min_isr(log.config.min_insync_replicas)} "
                                             f"(min.insync.replicas, capped by the replication factor)")
        try:
            info = log.append(records, leader_epoch=None if leading is None else leading.leader_epoch)
        except Exception as exc:  # noqa: BLE001 - mapped to a per-partition error code
            code = _append_error_code(exc)
            if code in (UNKNOWN_SERVER_ERROR, KAFKA_STORAGE_ERROR) and not isinstance(exc, KafkaStorageError):
                logger.exception("append to %s-%d failed", topic, partition)  # the engine logged its own reason
            return fail(code, str(exc))
        out.update(base_offset=info.first_offset, log_append_time_ms=info.log_append_time,
                   log_start_offset=log.log_start_offset)
        if leading is None:
            self._poke(tp)
            return out
        self.replicas.appended(leading)
        if acks == -1:
            out["_waiter"] = self.replicas.park(leading, info.last_offset)
        return out

    async def _fetch(self, request: codec.Request, conn: ConnectionInfo) -> dict:
        body = request.body
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(body.max_wait_ms, 0) / 1000
        min_bytes = max(body.min_bytes, 0)
        follower = self.replicas is not None and body.replica_id >= 0
        # What to read: the request's partitions, or for an incremental fetch every partition of its session.
        context = self.fetch_sessions.context(
            body.session_id, body.session_epoch, [(t.topic, t.partitions) for t in body.topics],
            [(t.topic, p) for t in body.forgotten_topics_data for p in t.partitions], body.replica_id >= 0,
            int(loop.time() * 1000))
        if context.error:  # an unknown session or a stale epoch: nothing is read
            return {"throttle_time_ms": 0, "error_code": context.error, "session_id": 0, "responses": []}
        first = True
        while True:
            # Reading and parking are one synchronous step for the appends made on this loop, so none falls
            # between them; a poke made by this very read (a follower's position raising the high watermark)
            # does not wake it back. The I/O thread's appends are counted: one made between the read and the
            # parking wakes the fetch at once (`_park`).
            since = appended() if self._io is not None else 0
            responses, total, errors = self._fetch_once(body, context.topics, first)
            first = False
            if total >= min_bytes or errors or loop.time() >= deadline:
                break
            hosted = {TopicPartition(topic, p.partition) for topic, partitions in context.topics for p in partitions
                      if self._hosts(topic, p.partition)}
            if not hosted:
                break
            await self._park(hosted, deadline, follower, since)
        error, session_id, responses = context.answer(responses, int(loop.time() * 1000))
        return {"throttle_time_ms": 0, "error_code": error, "session_id": session_id, "responses": responses}

    def _hosts(self, topic: str | None, partition: int) -> bool:
        """A replica of the partition is here (a fetch of it may wait for appends)."""
        if self.replicas is None:
            return self.registry.local_log(topic, partition) is not None
        return topic is not None and TopicPartition(topic, partition) in self.replicas.partitions

    def _fetch_once(self, body, topics: list[tuple[str, list[Any]]], first: bool) -> tuple[list, int, bool]:
        """One read of `topics` ((topic, the request's partitions) in answer order) under `body`'s limits."""
        budget = body.max_bytes if body.max_bytes > 0 else MAX_FRAME_BYTES
        read_committed = body.isolation_level == 1
        total = 0
        errors = False
        responses = []
        for topic, partitions in topics:
            parts = []
            for p in partitions:
                out = {"partition_index": p.partition, "error_code": NONE, "high_watermark": -1,
                       "last_stable_offset": -1, "log_start_offset": -1, "aborted_transactions": None,
                       "records": b""}
                parts.append(out)
                if self.replicas is None:
                    log = self.registry.local_log(topic, p.partition)
                    if log is None:
                        out["error_code"] = self._partition_error(topic, p.partition)
                        errors = True
                        continue
                    hw = log.high_watermark
                    lso = log.last_stable_offset
                    max_offset = lso if read_committed else hw
                else:
                    log, max_offset = self._replicated_fetch(body.replica_id, TopicPartition(topic, p.partition),
                                                             p, read_committed, first, out)
                    if log is None:
                        errors = True
                        continue
                    hw, lso = out["high_watermark"], out["last_stable_offset"]
                out.update(high_watermark=hw, last_stable_offset=lso, log_start_offset=log.log_start_offset)
                limit = min(p.partition_max_bytes, budget - total)
                try:
                    with log.lock:  # the slice and the duplicated descriptor describe the same file
                        found = log.read(p.fetch_offset, max(limit, 0), max_offset=max_offset,
                                         min_one_message=(total == 0))
                        if read_committed:
                            out["aborted_transactions"] = _aborted_transactions(log, p.fetch_offset, found)
                        if found is not None and found.size >= SENDFILE_MIN_BYTES:
                            try:
                                out["records"] = FileRange(found.segment.dup_fd(), found.position, found.size,
                                                            f"{topic}-{p.partition} {found.segment.log_path}")
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
                    if self.replicas is not None and body.replica_id >= 0:  # throttles, reassignment bytes
                        self.replicas.sent_to_follower(TopicPartition(topic, p.partition), body.replica_id,
                                                       found.size)
            responses.append({"topic": topic, "partitions": parts})
        if self.replicas is not None and errors:
            self._point_to_leaders((TopicPartition(t["topic"], part["partition_index"]), part)
                                   for t in responses for part in t["partitions"])
        return responses, total, errors

    def _replicated_fetch(self, replica_id: int, tp: TopicPartition, p, read_committed: bool, first: bool,
                          out: dict) -> tuple[Log | None, int | None]:
        """Where a fetch of a replicated partition reads: (log, highest offset to read; None = the log end),
        or (None, None) with the error (or the diverging epoch) set in `out`.

        Consumers read the leader up to its high watermark (last stable offset); followers (replica id >= 0,
        Kafka's FetchIsolation.LOG_END) read to the log end, are told where their log diverged from the
        leader's (`DivergingEpoch`, from their last fetched epoch), and their first read of a request counts as
        their position (Kafka's updateFollowerFetchState), which may raise the high watermark."""
        replicas = self.replicas
        follower = replica_id >= 0
        current_epoch = p.current_leader_epoch
        part, code = replicas.replica_for(tp, current_epoch, acknowledging=follower)
        if part is not None and follower and replica_id not in part.state.followers:
            part, code = None, UNKNOWN_LEADER_EPOCH if current_epoch != NO_EPOCH else NOT_LEADER_OR_FOLLOWER
        if part is None:
            out["error_code"] = code
            return None, None
        log = part.log
        if not follower:
            hw, lso = log.high_watermark, log.last_stable_offset
            out.update(high_watermark=hw, last_stable_offset=lso)
            return log, lso if read_committed else hw
        with log.lock:
            leo, log_start = log.log_end_offset, log.log_start_offset
            end = log.end_offset_for_epoch(p.last_fetched_epoch) if p.last_fetched_epoch >= 0 else None
        if end is not None:
            epoch, end_offset = end
            if epoch < 0 or end_offset < 0 or p.fetch_offset < log_start:
                out["error_code"] = OFFSET_OUT_OF_RANGE
                return None, None
            if epoch < p.last_fetched_epoch or end_offset < p.fetch_offset:
                out["diverging_epoch"] = {"epoch": epoch, "end_offset": end_offset}
                out.update(high_watermark=log.high_watermark, last_stable_offset=log.last_stable_offset,
                           log_start_offset=log_start)
                return None, None
        if first and log_start <= p.fetch_offset <= leo:
            replicas.follower_fetched(part, replica_id, p.fetch_offset, p.log_start_offset, leo)
        out.update(high_watermark=log.high_watermark, last_stable_offset=log.last_stable_offset)
        if replicas.leader_held_back(part, replica_id):  # leader.replication.throttled.rate: no records now
            return log, p.fetch_offset
        return log, None

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
                if self.replicas is not None:
                    self._replicated_list_offset(body.replica_id, TopicPartition(t.name, p.partition_index), p,
                                                 read_committed, out)
                    continue
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

    def _replicated_list_offset(self, replica_id: int, tp: TopicPartition, p, read_committed: bool,
                                out: dict) -> None:
        """Kafka's Partition.fetchOffsetForTimestamp: the leader answers (after the epoch checks), consumers up to
        the high watermark (last stable offset) and followers up to the log end, each answer with its leader
        epoch. A new leader whose high watermark has not yet reached the start of its epoch answers
        OFFSET_NOT_AVAILABLE for the latest offset, so no consumer is told an offset that may move back."""
        part, code = self.replicas.replica_for(tp, p.current_leader_epoch,
                                               leader_only=replica_id != DEBUGGING_REPLICA_ID)
        if part is None:
            out["error_code"] = code
            return
        log, ts = part.log, p.timestamp
        with log.lock:
            follower = replica_id >= 0
            fetchable = log.log_end_offset if follower else (
                log.last_stable_offset if read_committed else log.high_watermark)
            lagging = not follower and part.state.leader_epoch_start_offset > log.high_watermark
            if ts == -1:
                if lagging:
                    out["error_code"] = OFFSET_NOT_AVAILABLE
                else:
                    out.update(offset=fetchable, leader_epoch=part.leader_epoch)
                return
            if ts in (-2, -4):  # earliest, earliest-local (no tiered storage)
                found = (log.log_start_offset, -1)
            elif ts == -3 or ts >= 0:
                found = log.offset_for_timestamp(ts)
                if found is None or found[0] >= fetchable:
                    found = None
                    if lagging:
                        out["error_code"] = OFFSET_NOT_AVAILABLE
            else:  # other negative targets (tiered storage): offset -1, timestamp -1
                found = None
            if found is not None:
                epoch = log.leader_epoch_cache.epoch_for_offset(found[0])
                out.update(offset=found[0], timestamp=found[1], leader_epoch=-1 if epoch is None else epoch)

    async def _offset_for_leader_epoch(self, request: codec.Request, conn: ConnectionInfo) -> dict:
        """OffsetForLeaderEpoch (API 23): the end offset of the largest leader epoch at or below the one asked for
        (Kafka's endOffsetForEpoch: the start of the next epoch, or the log end for the latest; -1/-1 when
        unknown). Clients check their positions with it after a leader change (KIP-320). With a control store
        the leader answers, after the epoch checks; without one, the partition's only replica."""
        body = request.body
        topics = []
        for t in body.topics:
            parts = []
            for p in t.partitions:
                out = {"partition": p.partition, "error_code": NONE, "leader_epoch": -1, "end_offset": -1}
                parts.append(out)
                if self.replicas is not None:
                    part, code = self.replicas.replica_for(TopicPartition(t.topic, p.partition),
                                                           p.current_leader_epoch,
                                                           leader_only=body.replica_id != DEBUGGING_REPLICA_ID)
                    log = None if part is None else part.log
                else:
                    log = self.registry.local_log(t.topic, p.partition)
                    code = NONE if log is not None else self._partition_error(t.topic, p.partition)
                if log is None:
                    out["error_code"] = code
                    continue
                out["leader_epoch"], out["end_offset"] = log.end_offset_for_epoch(p.leader_epoch)
            topics.append({"topic": t.topic, "partitions": parts})
        return {"throttle_time_ms": 0, "topics": topics}



class _Replies:
    """One connection's answers not yet written, in request order: the writer's FIFO of futures (tasks, or
    answers already there), and how many it holds, so a request may be answered at once only with none ahead."""

    __slots__ = ("queue", "waiting", "running")

    def __init__(self) -> None:
        self.queue: asyncio.Queue[asyncio.Future | None] = asyncio.Queue()
        self.waiting = 0
        self.running: set[asyncio.Future] = set()  # handlers that waited and are not done yet

    def put(self, future: asyncio.Future, *, running: bool = False) -> None:
        self.waiting += 1
        self.queue.put_nowait(future)
        if running:
            self.running.add(future)
            future.add_done_callback(self.running.discard)

    def put_result(self, out: Any) -> None:
        future = asyncio.get_running_loop().create_future()
        future.set_result(out)
        self.put(future)

    def cancel(self) -> None:
        while not self.queue.empty():
            future = self.queue.get_nowait()
            if future is not None:
                future.cancel()


