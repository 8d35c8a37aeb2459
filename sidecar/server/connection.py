"""The socket edge of the Kafka server: request frames in, response bytes and file ranges out.

`Connection` is an asyncio protocol that receives size-prefixed request frames into one reused buffer
and decodes each as it completes (the broker's connection task takes them in order); `FileRange` is a
fetched record set still in its segment file, which the broker sends with `sendfile`; `tune_malloc`
keeps request-sized buffers on glibc's heap. Nothing here knows what a request means.
"""

from __future__ import annotations

import asyncio
import collections
import os
import socket
from dataclasses import dataclass
from typing import Callable

from shale.sidecar.protocol import codec

MAX_FRAME_BYTES = 100 * 1024 * 1024  # Kafka's socket.request.max.bytes default


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


@dataclass(frozen=True, slots=True)
class Frame:
    """One received request frame: decoded, or why not (`size` alone: a size outside 0..MAX_FRAME_BYTES)."""

    size: int
    request: codec.Request | None = None
    error: Exception | None = None
    head: bytes = b""  # the frame's first bytes, to name the client of a frame that did not decode


class Connection(asyncio.BufferedProtocol):
    """One client connection: frames are received in place into one reused buffer and decoded as they complete.

    asyncio's StreamReader copied every byte twice (into its buffer, then out as the frame) and paused and
    resumed the socket every 128 KiB of a large Produce. Here the socket reads straight into the free end
    of the buffer (grown to hold the largest frame, so a frame is never reassembled), and each complete
    frame is decoded from a view of it; decoded values own their bytes, so the space is reused at once.
    The connection's task takes the decoded frames in order with `next_frame()`.
    """

    MIN_READ = 64 * 1024  # free space offered to each recv_into
    KEEP_BYTES = 4 * 1024 * 1024  # a buffer grown beyond this for one huge frame is dropped once it is empty
    MAX_QUEUED = 64  # decoded frames the task has not taken yet before reading pauses (backpressure)
    HEAD_BYTES = 10 + 32767  # request header v1/v2 up to the end of the longest client_id

    def __init__(self, on_connect: Callable[["Connection"], None]) -> None:
        self._on_connect = on_connect
        self.transport: asyncio.Transport | None = None
        self._buf = bytearray(self.MIN_READ)
        self._start = 0  # first byte not consumed yet
        self._end = 0  # end of the bytes received
        self._frames: collections.deque[Frame] = collections.deque()
        self._waiter: asyncio.Future | None = None
        self._eof = False  # no more frames: end of stream, connection lost, or a frame that ends the connection
        self._reading_paused = False
        self._writing_paused = False
        self._drain_waiters: list[asyncio.Future] = []
        self._lost = False
        self._closed: asyncio.Future | None = None

    # -- asyncio protocol callbacks --------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self._closed = asyncio.get_running_loop().create_future()
        self._on_connect(self)

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
        return True  # half-closed: the responses to what was received are still written, then the task closes

    def get_buffer(self, sizehint: int) -> memoryview:
        buf, start, end = self._buf, self._start, self._end
        pending = end - start
        frame = 4
        if pending >= 4:
            size = int.from_bytes(buf[start:start + 4], "big", signed=True)
            if 0 <= size <= MAX_FRAME_BYTES:
                frame = 4 + size
        # The whole current frame must fit from `start`, with room to read on.
        wanted = max(frame, pending + self.MIN_READ)
        if len(buf) - start < wanted:
            if wanted <= len(buf):
                buf[:pending] = buf[start:end]  # same length: moves the partial frame to the front in place
            else:
                new = bytearray(max(wanted, min(2 * len(buf), self.KEEP_BYTES)))
                new[:pending] = buf[start:end]
                self._buf = buf = new
            self._start, self._end = start, end = 0, pending
        if frame - pending >= self.MIN_READ:
            # A large frame is read up to its end and no further, so the next one starts at the front of
            # the emptied buffer and is never moved.
            return memoryview(buf)[end:start + frame]
        return memoryview(buf)[end:]

    def buffer_updated(self, nbytes: int) -> None:
        self._end += nbytes
        buf, start, end = self._buf, self._start, self._end
        with memoryview(buf) as view:
            while end - start >= 4 and not self._eof:
                size = int.from_bytes(buf[start:start + 4], "big", signed=True)
                if size < 0 or size > MAX_FRAME_BYTES:
                    self._push(Frame(size))
                    self._finish()
                    break
                if end - start - 4 < size:
                    break
                frame = view[start + 4:start + 4 + size]
                try:
                    self._push(Frame(size, codec.decode_request(frame)))
                except Exception as exc:  # noqa: BLE001 - handed to the connection's task, which logs and decides
                    self._push(Frame(size, error=exc, head=bytes(frame[:self.HEAD_BYTES])))
                    if not isinstance(exc, codec.UnsupportedVersionError):
                        self._finish()
                finally:
                    frame.release()
                start += 4 + size
        if start == end:
            start = end = 0
            if len(buf) > self.KEEP_BYTES:
                self._buf = bytearray(self.MIN_READ)
        self._start, self._end = start, end
        if len(self._frames) >= self.MAX_QUEUED and not self._reading_paused and not self._eof:
            self._reading_paused = True
            self.transport.pause_reading()

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
        self._eof = True
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    async def next_frame(self) -> Frame | None:
        """The next frame in arrival order; None at the end of the stream."""
        while not self._frames:
            if self._eof:
                return None
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        frame = self._frames.popleft()
        if self._reading_paused and len(self._frames) <= self.MAX_QUEUED // 2 and not self._eof:
            self._reading_paused = False
            self.transport.resume_reading()
        return frame

    def stop_reading(self) -> None:
        """Take no more frames (the connection is being closed after an error)."""
        self._eof = True
        self._frames.clear()

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.transport.write(data)

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
