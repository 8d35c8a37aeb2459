"""The node's I/O thread: idle plain connections lend their sockets to a C thread that answers a one-record Produce
without the event loop (`_io_thread.c`), and takes them back for anything else.

Why (issue 18, docs/native-request-path.md): on a server woken for each request, asyncio's own iteration (the
selector, the handle, the transport's read callback, the protocol's Python) cost about as much as everything the
native Produce does. A connection whose last request was answered natively and that has nothing pending lends
its socket (`Connection._lend`): the loop stops reading it, and the thread's epoll serves it. A read that is one
whole frame goes to the connection's `native` call, the same C call the loop would make, with the GIL taken for
it; the answer is sent from the thread. Whatever the call declines, any other read, the end of the stream or an
answer the socket cannot take whole is handed back to the loop (`Connection._returned`) with the bytes read and
not yet sent, and the connection goes on there exactly as if it had read them itself, in order.
"""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:
    import asyncio

    from .connection import Connection

try:
    from ._io_thread import READ_BYTES
    from ._io_thread import IoThread as _IoThread
except ImportError:  # pragma: no cover - a checkout without the compiled extension
    _IoThread, READ_BYTES = None, 0

logger = logging.getLogger(__name__)

available = _IoThread is not None


class IoThread:
    """One node's I/O thread; its C thread starts with the first socket lent and ends with `stop()`."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        """Made on `loop`'s thread, where sockets come back and where the thread's calls into the node must run."""
        self._loop = loop
        self._loop_thread = threading.get_ident()
        self._thread = _IoThread(self._handback)

    def lend(self, fd: int, conn: Connection, native: Callable[[bytearray, int, int], bytes | None]) -> int:
        """Serve the socket `fd` from the thread until it comes back through `conn._returned`; a ticket for
        `reclaim`."""
        return self._thread.lend(fd, conn, native)

    def reclaim(self, ticket: int) -> bool:
        """Take a lent socket back without a hand-back (its connection is closing); False if it already came back."""
        return self._thread.reclaim(ticket)

    def stop(self) -> None:
        """End the thread; every socket still lent comes back to its connection with nothing read."""
        self._thread.stop()

    @property
    def answered(self) -> int:
        """Requests the thread has answered."""
        return self._thread.answered

    @property
    def returned(self) -> int:
        """Sockets handed back to the loop."""
        return self._thread.returned

    @property
    def lent(self) -> int:
        """Sockets the thread serves now."""
        return self._thread.lent

    def on_loop(self, fn: Callable[..., Any], *args: Any) -> None:
        """`fn(*args)` on the event loop: now if called there, else at its next iteration (from the I/O thread)."""
        if threading.get_ident() == self._loop_thread:
            fn(*args)
            return
        try:
            self._loop.call_soon_threadsafe(fn, *args)
        except RuntimeError:  # the loop is closed: the process is ending and the connection with it
            logger.debug("a call from the I/O thread came after its event loop closed: %s", fn)

    def _handback(self, conn: Connection, received: bytes, declined: bool, unsent: bytes, error: Any) -> None:
        """The thread's call (with the GIL, off the loop) when it gives a socket back; from `stop()`, on the loop."""
        self.on_loop(conn._returned, received, declined, unsent, error)
