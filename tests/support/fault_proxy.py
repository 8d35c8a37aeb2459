"""A fault-injecting TCP proxy in front of a node's Kafka listener, for the replication fault tests.

A node advertises its proxy (`shale serve --advertised-port`), so clients and the other nodes reach it only
through the proxy. The proxy reads the request frames that flow to the node: a Fetch carries the replica id
of the follower that sent it, so the proxy knows which connections carry which node's replication traffic
and can cut exactly those — a network partition between two nodes — while clients carry on.

A cut either *freezes* the connections (nothing is forwarded either way and nothing is lost: what TCP does
while a link is down and retransmissions are pending; healed, they flow again) or *resets* them (both sides
closed at once with an RST, as a firewall's would). New connections that turn out to carry a cut follower's fetches
are cut as soon as their first Fetch arrives.
"""

from __future__ import annotations

import asyncio
import socket
import struct
import threading
from dataclasses import dataclass, field

API_FETCH = 1
FREEZE, RESET = "freeze", "reset"
ALL = -2  # a rule key that matches every connection, replication or not


def _uvarint(buf: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7


def fetch_replica_id(frame: bytes) -> int | None:
    """The replica id of a Fetch request frame (without its size prefix), or None for other requests and for
    consumers' fetches (replica id -1). Fetch v12+ uses the flexible request header (tagged fields after the
    client id); v15+ carries the replica in a tagged ReplicaState instead, which is not read here."""
    if len(frame) < 10:
        return None
    api_key, version = struct.unpack_from(">hh", frame, 0)
    if api_key != API_FETCH or version > 14:
        return None
    (client_len,) = struct.unpack_from(">h", frame, 8)
    pos = 10 + max(client_len, 0)
    if version >= 12:
        tags, pos = _uvarint(frame, pos)
        for _ in range(tags):
            _, pos = _uvarint(frame, pos)
            size, pos = _uvarint(frame, pos)
            pos += size
    if pos + 4 > len(frame):
        return None
    (replica,) = struct.unpack_from(">i", frame, pos)
    return replica if replica >= 0 else None


@dataclass(eq=False)
class _Link:
    """One client connection and its connection to the node."""

    client: asyncio.StreamWriter
    upstream: asyncio.StreamWriter
    flowing: asyncio.Event = field(default_factory=asyncio.Event)
    replica: int | None = None  # the follower whose fetches it carries, once seen

    def close(self) -> None:
        for writer in (self.client, self.upstream):
            writer.transport.abort()

    def reset(self) -> None:
        """Close both sides with an RST, always: a plain close sends a FIN when no unread data is left, so
        whether a peer saw a reset or an orderly end would depend on timing."""
        for writer in (self.client, self.upstream):
            sock = writer.get_extra_info("socket")
            if sock is not None:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.close()


class FaultProxy:
    """Forwards 127.0.0.1:`port` to 127.0.0.1:`target_port`, on its own event loop in a daemon thread."""

    def __init__(self, target_port: int, port: int = 0) -> None:
        self.target_port, self.port = target_port, port
        self.rules: dict[int, str] = {}  # replica id (or ALL) -> FREEZE / RESET
        self.links: set[_Link] = set()
        self.cut_count = 0  # connections cut so far: a test asserts its fault hit something
        self._loop = asyncio.new_event_loop()
        self._server: asyncio.AbstractServer | None = None
        self._thread = threading.Thread(target=self._loop.run_forever, name=f"fault-proxy-{target_port}", daemon=True)

    # -- control, from the test's thread -----------------------------------------------------------

    def start(self) -> "FaultProxy":
        self._thread.start()
        self._server = self._call(asyncio.start_server(self._accept, "127.0.0.1", self.port))
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    def cut_replica(self, replica_id: int, how: str = FREEZE) -> None:
        """Cut the replication traffic of follower `replica_id` through this proxy, now and until `heal`."""
        self._call(self._set_rule(replica_id, how))

    def cut_all(self, how: str = FREEZE) -> None:
        """Cut every connection to the node, clients' too: the node is unreachable."""
        self._call(self._set_rule(ALL, how))

    def heal(self) -> None:
        """Remove every rule; frozen connections flow again."""
        self._call(self._heal())

    def replicas_seen(self) -> set[int]:
        """The followers whose fetches currently pass through the proxy."""
        return self._call(self._replicas_seen())

    def stop(self) -> None:
        if self._server is not None:
            self._call(self._stop())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def _call(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(10)

    # -- on the proxy's loop -------------------------------------------------------------------------

    async def _set_rule(self, key: int, how: str) -> None:
        assert how in (FREEZE, RESET), how
        self.rules[key] = how
        for link in list(self.links):
            self._apply(link)

    async def _heal(self) -> None:
        self.rules.clear()
        for link in self.links:
            link.flowing.set()

    async def _replicas_seen(self) -> set[int]:
        return {link.replica for link in self.links if link.replica is not None}

    async def _stop(self) -> None:
        self._server.close()
        for link in list(self.links):
            link.close()
        self.links.clear()

    def _apply(self, link: _Link) -> None:
        how = self.rules.get(ALL) or (self.rules.get(link.replica) if link.replica is not None else None)
        if how is None:
            return
        self.cut_count += 1
        if how == RESET:
            link.reset()
            self.links.discard(link)
        else:
            link.flowing.clear()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:  # the node is down: so is the connection through its proxy
            writer.transport.abort()
            return
        link = _Link(writer, up_writer)
        link.flowing.set()
        self.links.add(link)
        self._apply(link)
        try:
            await asyncio.gather(self._requests(link, reader), self._responses(link, up_reader))
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            link.close()
            self.links.discard(link)

    async def _requests(self, link: _Link, reader: asyncio.StreamReader) -> None:
        """Client to node, frame by frame: each frame is looked at before it is forwarded."""
        while True:
            head = await reader.readexactly(4)
            (size,) = struct.unpack(">i", head)
            frame = await reader.readexactly(size)
            if link.replica is None:
                link.replica = fetch_replica_id(frame)
                if link.replica is not None:
                    self._apply(link)
            await link.flowing.wait()
            link.upstream.write(head + frame)
            await link.upstream.drain()

    async def _responses(self, link: _Link, reader: asyncio.StreamReader) -> None:
        while True:
            chunk = await reader.read(65536)
            if not chunk:
                link.client.transport.abort()
                return
            await link.flowing.wait()
            link.client.write(chunk)
            await link.client.drain()
