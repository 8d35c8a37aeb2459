"""The Kafka port: listening sockets and their accept loops, each connection's requests handed to the handler of
their API, and the answers written back in request order (Kafka's SocketServer and request channel).

Each connection (`connection.Connection`: frames received into one reused buffer and decoded as they complete)
gets a task that dispatches its requests to the handler table (handler.py) and a writer that sends the answers;
Fetch answers send large record sets from the segment file with `sendfile` (`connection.FileRange`), as Kafka
does, instead of copying them through Python. Answers go out in request order per connection (a FIFO of handler
tasks), and at most MAX_HANDLING_PER_CONNECTION of a connection's requests are handled at once (Kafka's processor
mutes a connection while its one request is in flight): the requests pipelined behind them are read and wait
their turn.

A request with nothing ahead of it is handled as its frame arrives, its handler started in place (`eager`): one
that does not wait is answered then and there, with no task and no further event-loop iteration. A one-record
Produce may not reach Python at all: a native source (`NativeSource`) lets the connection answer it in one C
call (native_produce.py), on the loop or on the I/O thread (io_thread.py).
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

from ...log.log import Log
from ...log.topic_partition import TopicPartition
from ...plural import plural
from ...protocol import codec
from ...protocol.codec import MAX_FRAME_BYTES
from ...protocol.error_codes import NONE, UNSUPPORTED_VERSION
from . import eager
from .channel import Channel, FailedAuthentication
from .connection import Connection, FastPaths, FileRange, RequestMemory
from .handler import API_API_VERSIONS, API_FETCH, API_PRODUCE, ConnectionInfo, Handler, advertised_range
from .io_thread import IoThread
from .io_thread import available as io_thread_available
from .listener_security import ListenerSecurity
from .native_produce import NativeProduce, answerer, native_produce

logger = logging.getLogger(__name__)

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
OUT_OF_RESOURCES = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)


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



@dataclass(frozen=True, slots=True)
class NativeSource:
    """What a connection's native Produce stands for (native_produce.py): the Produce handler whose answers it
    gives (another handler in the table, an authorizer's wrapper, turns it off), the logs it appends to, and the
    fetch purgatory it wakes (`events`: read by the C call, which pokes only when some fetch waits)."""

    handler: Handler
    local_log: Callable[[str, int], Log | None]
    events: dict
    poke: Callable[[TopicPartition], None]


class SocketServer:
    """Listeners, connections and a table of handlers: requests in, answers out, nothing about what they mean."""

    def __init__(
        self,
        handlers: Mapping[int, Handler],
        *,
        listeners: Sequence[ListenerSecurity],
        observe: Callable[[str, float], None] | None = None,
        max_request_bytes: int = MAX_FRAME_BYTES,
        queued_max_request_bytes: int = -1,
        native: NativeSource | None = None,
        io_thread: bool = True,
        authorize: Callable[[dict[int, Handler]], dict[int, Handler]] | None = None,
        on_failed_authentication: FailedAuthentication | None = None,
        advertised_at: dict[str, tuple[str, int]] | None = None,
    ) -> None:
        # The Kafka port's listeners (the first one's address is `host`/`port`).
        self.listeners = list(listeners)
        self.host = self.listeners[0].endpoint.host or "0.0.0.0"
        self.port = self.listeners[0].endpoint.port
        self.ports: dict[str, int] = {}  # listener name -> bound port, once started
        # listener -> this node's address on it, filled as the listeners bind (the partition APIs' Metadata reads it)
        self.advertised_at: dict[str, tuple[str, int]] = advertised_at if advertised_at is not None else {}
        self._observe = observe  # (api name, seconds) of every answered request, for the metrics
        # Failed TLS handshakes and SASL exchanges (the metrics); the default counts nothing.
        self.on_failed_authentication: FailedAuthentication = (
            on_failed_authentication or (lambda _listener, _mechanism, _reason: None))
        self.max_request_bytes = max_request_bytes  # socket.request.max.bytes
        # queued.max.request.bytes; -1 (or 0) bounds the requests in flight by one largest request instead
        self.memory = RequestMemory(queued_max_request_bytes if queued_max_request_bytes > 0 else max_request_bytes)
        self.accept_errors = 0  # accept() calls that failed for lack of descriptors or memory
        self._listening: list[_Listening] = []
        self._accept_logged = (float("-inf"), 0)  # (loop time of the last log line, accept_errors then)
        self.native = native
        self._native: NativeProduce | None = None  # built for the first connection that may use it
        # The I/O thread that plain native connections lend their sockets to (io_thread.py), started with the
        # native path when `io_thread`.
        self._io_wanted = io_thread and io_thread_available
        self._io: IoThread | None = None
        self._connections: set[asyncio.Task] = set()
        # ApiVersions answers for every API in the table; `authorize` (authorization.py) wraps the whole table.
        table: dict[int, Handler] = {API_API_VERSIONS: self._api_versions, **handlers}
        self.handlers: dict[int, Handler] = authorize(table) if authorize is not None else table
        self.advertised = {key: advertised_range(key) for key in self.handlers}

    @property
    def io(self) -> IoThread | None:
        """The I/O thread, once a connection could lend it its socket (for the metrics)."""
        return self._io

    @property
    def where(self) -> str:
        """The listening sockets, for log lines: `NAME host:port (PROTOCOL)`, comma-separated."""
        return ", ".join(f"{x.where} ({x.security.protocol.name})" for x in self._listening)

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

    def _accept_ready(self, listening: _Listening) -> None:
        loop = asyncio.get_running_loop()
        for _ in range(64):  # a burst of connections is taken in one wakeup, as asyncio does
            try:
                sock, peer = listening.sock.accept()
            except (BlockingIOError, InterruptedError, ConnectionAbortedError):
                return
            except OSError as exc:
                if exc.errno not in OUT_OF_RESOURCES:
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

        native = self._native_answerer(conn, replies)
        # Plain bytes on the socket (TLS needs the ssl object): the I/O thread may serve a native connection.
        plain = native is not None and conn.transport.get_extra_info("ssl_object") is None
        conn.serve(FastPaths(at_once, native, self._io if plain else None))
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
            conn.stop_at_once()
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
        """The connection's native Produce (native_produce.py), where its answers are the handler's: a native source
        given (one replica per partition), its Produce handler in the table unwrapped (no authorizer), no SASL
        session."""
        source = self.native
        if (source is None or self.handlers[API_PRODUCE] != source.handler
                or (conn.channel is not None and conn.channel.session is not None)):
            return None
        if self._native is None:
            self._native = native_produce(self.advertised[API_PRODUCE], local_log=source.local_log,
                                          events=source.events, poke=self._poke_from_native, observe=self._observe)
            if self._native is None:
                return None
            if self._io_wanted:
                self._io = IoThread(asyncio.get_running_loop())
        return answerer(self._native, replies)

    def _poke_from_native(self, topic: str, partition: int) -> None:
        """The native Produce's call after an append while some fetch waits (from the I/O thread, through the
        loop)."""
        assert self.native is not None
        tp = TopicPartition(topic, partition)
        if self._io is None:
            self.native.poke(tp)
        else:
            self._io.on_loop(self.native.poke, tp)

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

    async def _api_versions(self, request: codec.Request, conn: ConnectionInfo) -> dict:
        return {
            "error_code": NONE,
            "api_keys": [{"api_key": k, "min_version": lo, "max_version": hi}
                         for k, (lo, hi) in sorted(self.advertised.items())],
            "throttle_time_ms": 0,
        }


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
