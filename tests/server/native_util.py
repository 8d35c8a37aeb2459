"""Two brokers side by side for the native Produce's tests (test_native_produce.py, test_io_thread.py): one as
`shale serve` runs it, whose plain connections answer a one-partition Produce natively, and one whose Produce
handler is wrapped (as an authorizer wraps it), which keeps every request on the Python path; raw frames to
send them and read their answers."""

from __future__ import annotations

import asyncio
import os
import socket
import struct
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from shale.sidecar.log.log_dir import LogDir
from shale.sidecar.log.records import Record, encode_batch
from shale.sidecar.protocol.client_codec import encode_request
from shale.sidecar.server.apis.broker import Broker
from shale.sidecar.server.network.handler import API_PRODUCE, advertised_range
from shale.sidecar.topic_config import TopicConfig
from shale.sidecar.topics.registry import NodeAddress, TopicRegistry, TopicSpec

NOW = int(time.time() * 1000)
LO, HI = advertised_range(API_PRODUCE)  # what the broker serves


class Brokers:
    """A native broker and a handler-only broker on one event loop in a thread, each with topics t (2 partitions).
    `io_thread`: whether the native broker's plain connections lend their sockets to its I/O thread."""

    io_thread = True

    def __init__(self, root: str) -> None:
        self.loop = asyncio.new_event_loop()
        self.brokers: dict[str, Broker] = {}
        self.dirs: dict[str, str] = {}
        cfg = TopicConfig.from_mapping({"index.interval.bytes": "300"})
        for kind in ("native", "handler"):
            self.dirs[kind] = os.path.join(root, kind)
            registry = TopicRegistry(LogDir(self.dirs[kind], lambda _topic: cfg), NodeAddress(0, "127.0.0.1", 0))
            registry.put(TopicSpec("t", 2, cfg))
            broker = Broker(registry, host="127.0.0.1", port=0, io_thread=self.io_thread)
            if kind == "handler":
                produce = broker.handlers[API_PRODUCE]
                broker.handlers[API_PRODUCE] = lambda request, conn, produce=produce: produce(request, conn)
            self.brokers[kind] = broker
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        for broker in self.brokers.values():
            asyncio.run_coroutine_threadsafe(broker.start(), self.loop).result(10)

    def connect(self, kind: str) -> socket.socket:
        sock = socket.create_connection(("127.0.0.1", self.brokers[kind].port), timeout=10)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return sock

    def files(self, kind: str) -> dict[str, bytes]:
        out = {}
        for parent, _, names in os.walk(self.dirs[kind]):
            for name in names:
                if name.endswith((".log", ".index", ".timeindex")):
                    with open(os.path.join(parent, name), "rb") as f:
                        out[os.path.relpath(os.path.join(parent, name), self.dirs[kind])] = f.read()
        return out

    def close(self) -> None:
        for broker in self.brokers.values():
            asyncio.run_coroutine_threadsafe(broker.close(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()



@contextmanager
def brokers(root) -> Iterator[Brokers]:
    pair = Brokers(str(root))
    try:
        yield pair
    finally:
        pair.close()


def batch(i: int, **kwargs) -> bytes:
    return encode_batch([Record(0, NOW + i, b"key-%d" % i, b"value-%d" % i * 10)], **kwargs)


def produce(version: int, correlation_id: int, records: bytes | None, *, acks: int = -1, topic: str = "t",
            partitions: tuple[int, ...] = (0,), transactional_id: str | None = None) -> bytes:
    return encode_request(API_PRODUCE, version, correlation_id, "native-test", {
        "transactional_id": transactional_id, "acks": acks, "timeout_ms": 30000,
        "topic_data": [{"name": topic, "partition_data": [{"index": p, "records": records} for p in partitions]}]})


def fetch(correlation_id: int, *, partition: int, offset: int, max_wait_ms: int) -> bytes:
    """A consumer's Fetch v12 of topic t's `partition` from `offset`, waiting up to `max_wait_ms` for a byte."""
    return encode_request(1, 12, correlation_id, "native-test", {
        "replica_id": -1, "max_wait_ms": max_wait_ms, "min_bytes": 1, "max_bytes": 1 << 20, "isolation_level": 0,
        "session_id": 0, "session_epoch": -1, "topics": [{"topic": "t", "partitions": [
            {"partition": partition, "fetch_offset": offset, "partition_max_bytes": 1 << 20,
             "current_leader_epoch": -1, "log_start_offset": -1}]}]})


def read_frame(sock: socket.socket) -> bytes:
    size = struct.unpack(">i", sock.recv(4, socket.MSG_WAITALL))[0]
    data = sock.recv(size, socket.MSG_WAITALL)
    assert len(data) == size, "the connection closed mid-answer"
    return data


def exchange(pair: Brokers, frames: list[bytes], silent: tuple[int, ...] = (),
             kinds: tuple[str, ...] = ("native", "handler")) -> dict[str, list[bytes]]:
    """Send `frames` to each broker of `kinds` on one connection, each after the answer to the one before (none
    comes for the frames numbered in `silent`, acks=0): the answers, per broker."""
    out = {}
    for kind in kinds:
        with pair.connect(kind) as sock:
            out[kind] = []
            for i, frame in enumerate(frames):
                sock.sendall(frame)
                if i not in silent:
                    out[kind].append(read_frame(sock))
    return out
