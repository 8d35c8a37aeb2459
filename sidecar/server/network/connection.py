"""The socket edge of the Kafka server: request frames in, response bytes and file ranges out.

`Connection` is an asyncio protocol that receives size-prefixed request frames into one reused buffer
and decodes each as it completes (the broker's connection task takes them in order); `RequestMemory`
bounds the bytes of requests in flight over all connections; `FileRange` is a fetched record set still
in its segment file, which the broker sends with `sendfile`; `tune_malloc` keeps request-sized buffers
on glibc's heap. Nothing here knows what a request means: a connection's `Channel` (its listener, principal
and SASL session) sees every frame first and may answer it or end the connection.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import os
import socket
import struct
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

from ...protocol import codec
from ...protocol.codec import MAX_FRAME_BYTES
from ...security.principal import ANONYMOUS, KafkaPrincipal
from .channel import Channel, Verdict
from .io_thread import READ_BYTES as IO_READ_BYTES

if TYPE_CHECKING:
    from .io_thread import IoThread

logger = logging.getLogger(__name__)

_SIZE = struct.Struct(">i")  # a frame's size prefix


def tune_malloc(mmap_threshold: int = 64 << 20, trim_threshold: int = 128 << 20) -> bool:
    """Keep request-sized buffers (up to a Produce of several MiB) on glibc's heap; True if applied.

    Each Produce of ~1 MiB allocates a few buffers of that size (the decoded record set, the log's copy)
    and frees them. With glibc's defaults these come from fresh mmaps or a heap top that is trimmed after
    every free, so each request page-faults its buffers in again: 256 faults per MiB, each a few µs on a
    VM (measured: 35 % of the server's CPU per produced MB). Fixed thresholds keep that memory reused.
    A process-wide setting, so `shale serve` applies it once at start; a no-op without glibc.
    """
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("c")
    if not name:
        return False
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    m_trim_threshold, m_mmap_threshold = -1, -3  # <malloc.h>
    return bool(mallopt(m_mmap_threshold, mmap_threshold)) and bool(mallopt(m_trim_threshold, trim_threshold))


class RequestMemory:
    """Bytes of requests received and not yet handled, over all connections (Kafka's queued.max.request.bytes).

    Bytes are charged as they arrive, never ahead of them: a frame header announcing 100 MiB costs its 4
    bytes, not 100 MiB. A request's bytes are released when its handler is done. When the total reaches
    `limit`, every connection stops reading (back-pressure: the kernel's socket buffers, then the clients,
    hold the rest) except the one whose partial frame began first, which reads on to the end of that frame:
    half-received frames can then never wait on each other, and the total stays within `limit` plus that
    frame and the read that crossed the limit. Kafka reserves a whole frame when its header arrives instead,
    which lets one stalled client hold the whole budget with 4 bytes. Used on the event loop only.
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0
        self.paused_total = 0  # times a connection stopped reading for memory (a counter for /metrics)
        self._reading: set[Connection] = set()  # live connections not held back for memory
        self._paused: set[Connection] = set()
        self._partial: dict[Connection, None] = {}  # connections inside a frame, in the order their frames began

    def may_read(self, conn: "Connection") -> bool:
        return self.used < self.limit or next(iter(self._partial), None) is conn

    def add(self, conn: "Connection") -> None:
        self._reading.add(conn)

    def charge(self, n: int) -> None:
        below = self.used < self.limit
        self.used += n
        if below and self.used >= self.limit:  # stop the others now, not after one more read each
            for conn in [c for c in self._reading if not self.may_read(c)]:
                conn.set_memory_spent(True)

    def release(self, n: int) -> None:
        if n:
            self.used -= n
            self._wake()

    def frame_state(self, conn: "Connection", inside: bool, new_frame: bool) -> None:
        """Track whether `conn` holds part of a frame (`new_frame`: a frame completed, the rest is a new one)."""
        if inside and not new_frame and conn in self._partial:
            return
        if conn in self._partial:
            del self._partial[conn]
            if not inside:
                self._wake()  # the oldest partial frame may have changed
        if inside:
            self._partial[conn] = None

    def paused(self, conn: "Connection", paused: bool) -> None:
        """`conn` stopped reading for memory (it is called back with `set_memory_spent(False)`), or reads again."""
        if paused and conn in self._reading:
            self._reading.discard(conn)
            self._paused.add(conn)
            self.paused_total += 1
        elif not paused and conn in self._paused:
            self._paused.discard(conn)
            self._reading.add(conn)

    def forget(self, conn: "Connection") -> None:
        """`conn` is gone: it holds no frame and waits for nothing."""
        self._reading.discard(conn)
        self._paused.discard(conn)
        self.frame_state(conn, False, False)

    def _wake(self) -> None:
        for conn in [c for c in self._paused if self.may_read(c)]:
            conn.set_memory_spent(False)


@dataclass(slots=True)
class Frame:
    """One received request frame: decoded, or why not (`size` alone: a size outside 0..the frame limit).

    `charge` is what the frame holds of the connection's `RequestMemory`; `Connection.done(frame)` releases it.
    Not frozen: one is made per request, and a frozen dataclass's `__init__` costs a call per field.
    """

    size: int
    request: codec.Request | None = None
    error: Exception | None = None
    head: bytes = b""  # the frame's first bytes, to name the client of a frame that did not decode
    charge: int = 0


@dataclass(frozen=True)
class FastPaths:
    """What a connection's task lets its frames take before they reach it (socket_server.py): `at_once`, the
    frame handled as it arrives; `native`, a one-record Produce answered in C before it is decoded; `io`, the I/O
    thread the socket is lent to after a native answer. None: that path is not taken."""

    at_once: Callable[[Frame], bool]
    native: Callable[[bytearray, int, int], bytes | None] | None = None
    io: IoThread | None = None


class Connection(asyncio.BufferedProtocol):
    """One client connection: frames are received in place into one reused buffer and decoded as they complete.

    asyncio's StreamReader copied every byte twice (into its buffer, then out as the frame) and paused and
    resumed the socket every 128 KiB of a large Produce. Here the socket reads straight into the free end
    of the buffer, and each complete frame is decoded from a view of it; decoded values own their bytes,
    so the space is reused at once. The buffer grows with the bytes that arrive (at most doubling what is
    there), never to the size a header announces, and is kept for the next frames up to KEEP_BYTES.
    A frame larger than `max_frame` ends the connection before any of it is buffered (Kafka's
    InvalidReceiveException). The connection's task takes the decoded frames in order with `next_frame()`;
    a frame that arrives with none waiting before it is first offered to `at_once`, which may handle it then
    and there (no task wake-up, no loop iteration) and says so by returning True. Before it is even decoded, such
    a frame is offered to `native` (native_produce.py), which answers a one-record Produce in one C call or
    returns None. After a native answer with nothing pending, a plain connection lends its socket to the node's
    I/O thread (`io`, io_thread.py), which makes that same call for the next frames without the event loop and
    hands the socket back with whatever else it reads.
    """

    MIN_READ = 64 * 1024  # free space offered to each recv_into
    KEEP_BYTES = 4 * 1024 * 1024  # a buffer grown beyond this for one huge frame is cut back once it is empty
    MAX_QUEUED = 64  # decoded frames the task has not taken yet before reading pauses (backpressure)
    HEAD_BYTES = 10 + 32767  # request header v1/v2 up to the end of the longest client_id

    def __init__(self, memory: RequestMemory, max_frame: int = MAX_FRAME_BYTES, channel: Channel | None = None) -> None:
        self._memory = memory
        self.max_frame = max_frame
        self.channel = channel  # None: a PLAINTEXT connection with nothing to check
        self._refused = False  # the channel ended the connection: nothing more is read or handled
        self.transport: asyncio.Transport | None = None
        self._buf = bytearray(self.MIN_READ)
        self._start = 0  # first byte not consumed yet
        self._end = 0  # end of the bytes received
        self._frames: collections.deque[Frame] = collections.deque()
        self._waiter: asyncio.Future | None = None
        self._eof = False  # no more frames: end of stream, connection lost, or a frame that ends the connection
        self._reading_paused = False  # the transport's state: paused for either reason below
        self._queue_full = False  # MAX_QUEUED frames not taken yet
        self._memory_spent = False  # the node's RequestMemory is spent
        self._writing_paused = False
        self._drain_waiters: list[asyncio.Future] = []
        self._lost = False
        self._closed: asyncio.Future | None = None
        # What the connection's task lets frames take before it (`serve`): none until it starts.
        self._at_once: Callable[[Frame], bool] | None = None
        self._native: Callable[[bytearray, int, int], bytes | None] | None = None  # where it may be used
        self._io: IoThread | None = None  # the node's I/O thread, where this connection may lend it its socket
        self._lent = False  # the socket is lent to `io` (not read here until it comes back)
        self._ticket = 0  # the lending's, for `io.reclaim`

    def serve(self, paths: FastPaths) -> None:
        """The connection's task starts taking frames: from now on they are offered to `paths` first."""
        self._at_once, self._native, self._io = paths.at_once, paths.native, paths.io

    def stop_at_once(self) -> None:
        """The connection's task ends: frames still arriving are queued, never handled at once."""
        self._at_once = None

    # -- asyncio protocol callbacks --------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self._closed = asyncio.get_running_loop().create_future()
        self._memory.add(self)
        tls = transport.get_extra_info("ssl_object")
        if tls is not None and self.channel is not None:  # the handshake is done before a TLS connection is made
            self.channel.tls_established(tls.getpeercert())

    @property
    def principal(self) -> KafkaPrincipal:
        return ANONYMOUS if self.channel is None else self.channel.principal

    @property
    def listener(self) -> str:
        return "PLAINTEXT" if self.channel is None else self.channel.listener_name

    def connection_lost(self, exc: Exception | None) -> None:
        self._lost = True
        self._finish()
        for w in self._drain_waiters:
            if not w.done():
                w.set_exception(ConnectionResetError("connection lost"))
        self._drain_waiters.clear()
        if self._closed is not None and not self._closed.done():
            self._closed.set_result(None)

    def eof_received(self) -> bool:
        self._finish()
        # half-closed: the responses to what was received are still written, then the task closes (TLS cannot
        # half-close: its transport closes either way)
        return self.transport.get_extra_info("ssl_object") is None

    def get_buffer(self, sizehint: int) -> memoryview:
        buf = self._buf
        if self._end == 0 and len(buf) <= self.KEEP_BYTES:  # nothing pending (reset to 0 then): all of the buffer
            return memoryview(buf)
        start, end = self._start, self._end
        pending = end - start
        if not pending and len(buf) > self.KEEP_BYTES:
            # Cut back after a huge frame, in place (no view of the buffer is held between reads); the next
            # huge frame regrows from here.
            del buf[self.KEEP_BYTES:]
        frame = 4
        if pending >= 4:
            size = _SIZE.unpack_from(buf, start)[0]
            if 0 <= size <= self.max_frame:
                frame = 4 + size
        # Room from `start` for what is here and MIN_READ more, or double what is here while the current frame
        # is longer: the buffer follows the bytes that arrive, a header alone never reserves its frame.
        wanted = max(pending + self.MIN_READ, min(frame, 2 * pending))
        if len(buf) - start < wanted:
            if wanted <= len(buf):
                buf[:pending] = buf[start:end]  # same length: moves the partial frame to the front in place
            else:
                new = bytearray(wanted)
                new[:pending] = buf[start:end]
                self._buf = buf = new
            self._start, self._end = start, end = 0, pending
        if frame - pending >= self.MIN_READ:
            # A large frame is read up to its end and no further, so the next one starts at the front of
            # the emptied buffer and is never moved.
            return memoryview(buf)[end:start + frame]
        return memoryview(buf)[end:]

    def buffer_updated(self, nbytes: int) -> None:
        self._received(nbytes, self._native is not None)

    def _received(self, nbytes: int, native: bool) -> None:
        """`nbytes` more bytes at `_end`; `native`: the first complete frame may be offered to `native`."""
        if native and self._start == self._end:
            whole = self._answer_whole(nbytes)
            if whole:
                return
            native = whole is False  # declined (None): the frame is not offered twice
        self._end += nbytes
        self._memory.charge(nbytes)
        buf, start, end = self._buf, self._start, self._end
        completed = False
        with memoryview(buf) as view:
            while end - start >= 4 and not self._eof and not self._refused:
                size = _SIZE.unpack_from(buf, start)[0]
                if size < 0 or size > self.max_frame:
                    self._push(Frame(size))
                    self._eof = True
                    break
                if self.channel is not None and size > self.channel.frame_limit(self.max_frame):
                    self._refuse(self.channel.refuse_size(size))
                    break
                if end - start - 4 < size:
                    break
                if native and self._native is not None and not self._frames and not self._writing_paused:
                    answer = self._answer_natively(start + 4, start + 4 + size)
                    if answer is not None:
                        start += 4 + size
                        completed = True
                        self._memory.release(4 + size)
                        if answer:  # b"": acks=0, no answer at all
                            self.transport.write(answer)
                        continue
                native = True
                frame = view[start + 4:start + 4 + size]
                try:
                    received = Frame(size, codec.decode_request(frame), charge=4 + size)
                except Exception as exc:  # noqa: BLE001 - handed to the connection's task, which logs and decides
                    received = Frame(size, error=exc, head=bytes(frame[:self.HEAD_BYTES]), charge=4 + size)
                    if not isinstance(exc, codec.UnsupportedVersionError):
                        self._eof = True
                finally:
                    frame.release()
                start += 4 + size
                completed = True
                if self.channel is not None and received.request is not None:
                    verdict = self.channel.admit(received.request, size)
                    if verdict is not None:  # answered (or refused) here: the broker never sees it
                        self._memory.release(received.charge)
                        if verdict.close:
                            self._refuse(verdict)
                            break
                        if verdict.answer is not None:
                            self.transport.write(verdict.answer)
                        continue
                if self._frames or received.request is None or self._at_once is None or not self._at_once(received):
                    self._push(received)
                if self.transport.is_closing():  # the request's handler failed: nothing after it is handled
                    break
        if start == end:
            start = end = 0
        self._start, self._end = start, end
        if self._eof:  # a frame that ends the connection: nothing after it is read or handled
            self._finish()
            self._set_reading(queue_full=True)
            return
        if self._refused:
            return
        self._memory.frame_state(self, start < end, completed)
        queue_full, memory_spent = len(self._frames) >= self.MAX_QUEUED, not self._memory.may_read(self)
        if queue_full is not self._queue_full or memory_spent is not self._memory_spent:  # else nothing changes
            self._set_reading(queue_full=queue_full, memory_spent=memory_spent)

    def _answer_whole(self, nbytes: int) -> bool | None:
        """The usual read of a client that waits for each answer: nothing was pending, and the read is one whole
        frame that `native` answers. Then its bytes were never charged to the request memory nor queued: True,
        and nothing else is done for the read. Otherwise nothing is done: False when the read is not such a
        frame, None when `native` declined it."""
        start, end = self._start, self._start + nbytes
        if (nbytes < 12 or self._frames or self._writing_paused or self._eof or self._refused
                or _SIZE.unpack_from(self._buf, start)[0] != nbytes - 4 or nbytes - 4 > self.max_frame):
            return False
        try:
            answer = self._native(self._buf, start + 4, end)  # type: ignore[misc]
        except Exception:  # noqa: BLE001 - as in _answer_natively (one call fewer on the usual path)
            answer = self._native_failed()
        if answer is None:
            return None
        self._start = self._end = 0
        if answer:  # b"": acks=0, no answer at all
            self.transport.write(answer)
        if self._io is not None and nbytes <= IO_READ_BYTES:  # the next such frame is one read there (not lent: read here)
            self._lend()
        return True

    def _answer_natively(self, start: int, end: int) -> bytes | None:
        """`native`'s answer to the frame at `_buf[start:end]`; None leaves it to the decoder and the broker. A
        failure after the append (a bug: nothing before it raises) ends the connection, as a failed handler's
        does."""
        try:
            return self._native(self._buf, start, end)  # type: ignore[misc]
        except Exception:  # noqa: BLE001 - logged with its traceback; the client sees the connection close
            return self._native_failed()

    def _native_failed(self, error: BaseException | None = None) -> bytes:
        """After `native` raised (in an `except` block, or `error` from the I/O thread): log it, end the connection,
        answer nothing."""
        logger.error("closing connection of client at %s: the native Produce path failed", self.peername(),
                     exc_info=error if error is not None else True)
        self._native = None
        self._eof = True  # nothing after it is handled; connection_lost releases what is left
        self.transport.abort()
        return b""

    def _lend(self) -> None:
        """Lend the socket to the node's I/O thread (io_thread.py) after a native answer, if nothing is pending: no
        frame, nothing unwritten, reading not paused. The loop stops reading it until `_returned`."""
        if self._reading_paused or self._lost or self.transport.get_write_buffer_size():
            return
        sock = self.transport.get_extra_info("socket")
        if sock is None:
            return
        self._lent = True
        self._set_reading()
        try:
            self._ticket = self._io.lend(sock.fileno(), self, self._native)  # type: ignore[union-attr]
        except (OSError, RuntimeError) as exc:  # no descriptor to duplicate (EMFILE), or the broker is closing
            logger.warning("client at %s stays on the event loop: its socket cannot be lent to the I/O thread: %s",
                           self.peername(), exc)
            self._io, self._lent = None, False
            self._set_reading()

    def _returned(self, received: bytes, declined: bool, unsent: bytes, error: BaseException | None) -> None:
        """The I/O thread gave the socket back (io_thread.py; called on the loop): write `unsent`, the rest of its
        last answer, then go on as if `received` had been read here. `declined`: `received` is one frame `native`
        already declined, so it goes to the decoder. `error`: the native call failed after its append."""
        if not self._lent:  # reclaimed since: the connection is closing
            return
        self._lent = False
        if error is not None:
            self._native_failed(error)
            return
        if unsent:
            self.transport.write(unsent)
        if received:
            view = self.get_buffer(len(received))  # nothing is pending while lent: MIN_READ >= IO_READ_BYTES free
            view[:len(received)] = received
            view.release()
            self._received(len(received), not declined and self._native is not None)
        self._set_reading()

    def _reclaim(self) -> None:
        """The connection is closing: take a lent socket back from the I/O thread."""
        if self._lent:
            self._lent = False
            self._io.reclaim(self._ticket)  # type: ignore[union-attr]

    def _set_reading(self, *, queue_full: bool | None = None, memory_spent: bool | None = None) -> None:
        """Pause or resume the transport for the reasons to stop reading: frames not taken, memory spent, the
        connection refused, the socket lent to the I/O thread."""
        if queue_full is not None:
            self._queue_full = queue_full
        if memory_spent is not None:
            self._memory.paused(self, memory_spent)
            self._memory_spent = memory_spent
        paused = self._queue_full or self._memory_spent or self._refused or self._lent
        if paused != self._reading_paused and not self._lost:
            self._reading_paused = paused
            if paused:
                self.transport.pause_reading()
            elif not self._eof:
                self.transport.resume_reading()

    def _refuse(self, verdict: Verdict) -> None:
        """End the connection as the channel says: read nothing more, and after the delay write its answer and
        end the frames (the broker's task then writes what it still owes and closes)."""
        self._refused = True
        self._set_reading()

        def end() -> None:
            if verdict.answer is not None and not self._lost:
                self.transport.write(verdict.answer)
            self._finish()

        asyncio.get_running_loop().call_later(verdict.delay_ms / 1000, end)

    def set_memory_spent(self, spent: bool) -> None:
        """RequestMemory's call: stop reading until the bytes in flight fall below the limit, or read again."""
        self._set_reading(memory_spent=spent)

    @property
    def writing_paused(self) -> bool:
        """The transport's write buffer is above its high-water mark: the next answer waits for `drain()`."""
        return self._writing_paused

    def pause_writing(self) -> None:
        self._writing_paused = True

    def resume_writing(self) -> None:
        self._writing_paused = False
        for w in self._drain_waiters:
            if not w.done():
                w.set_result(None)
        self._drain_waiters.clear()

    # -- for the connection's task ---------------------------------------------------------------

    def _push(self, frame: Frame) -> None:
        self._frames.append(frame)
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def _finish(self) -> None:
        """No more frames: the bytes of an incomplete frame are dropped and their memory released."""
        self._eof = True
        self._reclaim()
        self._memory.release(self._end - self._start)
        self._start = self._end = 0
        self._set_reading(memory_spent=False)
        self._memory.forget(self)
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    async def next_frame(self) -> Frame | None:
        """The next frame in arrival order; None at the end of the stream. Hand it back with `done()`."""
        while not self._frames:
            if self._eof:
                return None
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        frame = self._frames.popleft()
        if self._queue_full and len(self._frames) <= self.MAX_QUEUED // 2 and not self._eof:
            self._set_reading(queue_full=False)
        return frame

    def done(self, frame: Frame) -> None:
        """The frame's request is handled (or dropped): its bytes no longer count as in flight."""
        self._memory.release(frame.charge)

    def stop_reading(self) -> None:
        """Take no more frames (the connection is being closed)."""
        self._finish()
        self._memory.release(sum(f.charge for f in self._frames))
        self._frames.clear()

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.transport.write(data)

    def sendfile_socket(self) -> socket.socket | None:
        """The socket `os.sendfile` may write to: None on a TLS connection, whose bytes must pass the TLS layer."""
        if self.transport.get_extra_info("ssl_object") is not None:
            return None
        return self.transport.get_extra_info("socket")

    def cork(self, on: bool) -> None:
        """TCP_CORK: hold partial segments while a response goes out in pieces, so its header, records and
        trailer leave as full segments and wake the client once (Linux; elsewhere a no-op)."""
        sock = self.transport.get_extra_info("socket")
        if sock is not None and hasattr(socket, "TCP_CORK") and not self.transport.is_closing():
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_CORK, 1 if on else 0)
            except OSError:
                pass  # the peer is gone; the write path reports it

    async def drain(self) -> None:
        """Wait while the transport's write buffer is above its high-water mark."""
        if self._lost:
            raise ConnectionResetError("connection lost")
        if self._writing_paused:
            waiter = asyncio.get_running_loop().create_future()
            self._drain_waiters.append(waiter)
            await waiter

    async def close(self) -> None:
        self._reclaim()
        self.transport.close()
        await asyncio.shield(self._closed)

    def peername(self):
        return self.transport.get_extra_info("peername")


class FileRange:
    """A fetched record set still in its segment file, sent with sendfile (an external record set for the codec).

    It holds its own duplicate of the segment's descriptor, taken under the log's lock, so a segment that
    is deleted or closed before the response is written still reads the bytes it held at fetch time
    (Kafka's FileRecords slice does the same by keeping its FileChannel).
    """

    __slots__ = ("fd", "position", "size", "where")
    mode = "rb"  # loop.sendfile checks that the "file" is binary

    def __init__(self, fd: int, position: int, size: int, where: str) -> None:
        self.fd, self.position, self.size, self.where = fd, position, size, where

    def fileno(self) -> int:
        return self.fd

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __del__(self) -> None:  # a response that is never written (connection gone) still releases the fd
        self.close()
