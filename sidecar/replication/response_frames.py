"""Size-prefixed Kafka response frames read off a connection, each straight into a buffer of its own size.

The replica fetcher's answers are up to `replica.fetch.response.max.bytes` of records. asyncio's StreamReader
would copy each one twice on the way (every read appended to its growing buffer, then `readexactly` copying the
frame out of it): measured, that was a third of a follower's CPU per replicated MB. Here, once a frame's size
is known, the socket reads the rest of it directly into a bytearray of exactly that size (asyncio's
`BufferedProtocol`, `recv_into`), so the bytes are copied once, by the kernel. Small frames and the 4-byte
size prefixes go through a scratch buffer. The frame's buffer is used again for the next frame (one request is
in flight, and the caller is done with each answer before asking for the next: the fetcher appends the records
straight from this buffer, `client_codec.decode_response(views=True)`): a fresh megabyte per answer cost page
faults that showed in the profile as much as the copies did.
"""

from __future__ import annotations

import asyncio
import collections

from ..protocol.codec import MAX_FRAME_BYTES

_SCRATCH_BYTES = 64 * 1024  # one read of small answers (an idle partition's Fetch answer is ~100 bytes)


class ResponseFrames(asyncio.BufferedProtocol):
    """The reading side of one client connection: `await next_frame()` gives each response frame (without its
    size prefix) in order. Take over a connected transport with `take_over`: nothing may be buffered unread by
    its previous protocol (a request/response exchange, such as SASL's, leaves nothing)."""

    def __init__(self, transport: asyncio.Transport, where: str, max_frame: int = MAX_FRAME_BYTES) -> None:
        self.transport = transport
        self.where = where  # for errors: the peer
        self.max_frame = max_frame
        self._scratch = bytearray(_SCRATCH_BYTES)
        self._head = bytearray()  # the bytes of a size prefix read so far
        self._frame: bytearray | None = None  # the buffer of the frame being read, `_size` bytes of it
        self._size = 0
        self._filled = 0  # bytes of the frame read
        self._lent: bytearray | None = None  # the buffer of the frame `next_frame` returned last
        self._spare: bytearray | None = None  # a buffer free for the next frame
        self._direct = False  # the last buffer handed out was `_frame`'s tail, not the scratch
        self._ready: collections.deque[tuple[bytearray, int]] = collections.deque()
        self._error: Exception | None = None  # the connection ended (or sent a bad size): raised to the reader
        self._waiter: asyncio.Future | None = None

    @classmethod
    def take_over(cls, transport: asyncio.Transport, where: str) -> ResponseFrames:
        frames = cls(transport, where)
        transport.set_protocol(frames)
        return frames

    async def next_frame(self) -> memoryview:
        """The next whole frame, valid until the next call (its buffer is then reused); EOFError (or the
        connection's error) once the connection has ended."""
        if self._lent is not None:
            self._spare, self._lent = self._lent, None
        while not self._ready:
            if self._error is not None:
                raise self._error
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        self._lent, size = self._ready.popleft()
        return memoryview(self._lent)[:size]

    # -- asyncio.BufferedProtocol ------------------------------------------------------------------------

    def get_buffer(self, sizehint: int) -> memoryview:
        frame = self._frame
        self._direct = frame is not None and self._size - self._filled >= len(self._scratch)
        if self._direct:
            assert frame is not None
            return memoryview(frame)[self._filled:self._size]
        return memoryview(self._scratch)

    def buffer_updated(self, nbytes: int) -> None:
        if self._direct:
            self._filled += nbytes
            self._maybe_done()
        else:
            self._consume(memoryview(self._scratch)[:nbytes])

    def eof_received(self) -> bool:
        self._fail(EOFError(f"{self.where} closed the connection"))
        return False  # close the transport

    def connection_lost(self, exc: Exception | None) -> None:
        self._fail(exc if exc is not None else EOFError(f"{self.where} closed the connection"))

    # -- parsing -----------------------------------------------------------------------------------------

    def _consume(self, data: memoryview) -> None:
        pos, end = 0, len(data)
        while pos < end:
            if self._frame is None:
                take = min(4 - len(self._head), end - pos)
                self._head += data[pos:pos + take]
                pos += take
                if len(self._head) < 4:
                    return
                size = int.from_bytes(self._head, "big", signed=True)
                self._head.clear()
                if not 4 <= size <= self.max_frame:
                    self._fail(EOFError(f"{self.where}: response frame of {size} bytes (4 to {self.max_frame})"))
                    self.transport.close()
                    return
                spare, self._spare = self._spare, None
                self._frame = spare if spare is not None and len(spare) >= size else bytearray(size)
                self._size, self._filled = size, 0
            take = min(self._size - self._filled, end - pos)
            self._frame[self._filled:self._filled + take] = data[pos:pos + take]
            self._filled += take
            pos += take
            self._maybe_done()

    def _maybe_done(self) -> None:
        if self._frame is not None and self._filled == self._size:
            self._ready.append((self._frame, self._size))
            self._frame = None
            self._wake()

    def _fail(self, exc: Exception) -> None:
        if self._error is None:
            self._error = exc
        self._wake()

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)
