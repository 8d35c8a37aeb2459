"""The node's I/O thread (io_thread.py, `_io_thread.c`): lent sockets are served from a C thread, and come back to
the event loop with every byte read and not yet sent, in order.

The first tests drive the C thread alone over socket pairs, with a plain function as the native call: each way a
socket comes back (docs/native-request-path.md, "The I/O thread"). The others run it inside a broker
(native_util.py) against raw Kafka clients: the answers and files are the handler broker's, byte for byte, and
each failure case of a lent connection ends as it would on the loop.
"""

from __future__ import annotations

import asyncio
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest
from native_util import Brokers, batch, brokers, exchange, fetch, produce, read_frame

from shale.sidecar.log.topic_partition import TopicPartition
from shale.sidecar.protocol.client_codec import decode_response, encode_request
from shale.sidecar.server.coordinator.coordinator_log import loaded_batches
from shale.sidecar.server.network._io_thread import READ_BYTES, IoThread
from shale.sidecar.server.network.connection import Connection
from shale.sidecar.server.network.native_produce import appended
from shale.sidecar.server.ops.metrics import _io_thread_families
from support.fault_proxy import FREEZE, RESET, FaultProxy


def frame(body: bytes) -> bytes:
    return struct.pack(">i", len(body)) + body


REQUEST = frame(b"\x00\x00\x00\x09\x00\x00\x00\x07" + b"request body")  # api key 0, v9, correlation id 7


class Handbacks:
    """The thread's hand-backs, as (conn, received, declined, unsent, error), and a wait for the next one."""

    def __init__(self) -> None:
        self.got: list[tuple] = []
        self._arrived = threading.Semaphore(0)

    def __call__(self, conn, received, declined, unsent, error) -> None:
        self.got.append((conn, received, declined, unsent, error))
        self._arrived.release()

    def next(self) -> tuple:
        assert self._arrived.acquire(timeout=10), "no socket came back"
        return self.got[-1]


@contextmanager
def lent(native: Callable) -> Iterator[tuple[IoThread, socket.socket, socket.socket, Handbacks, int]]:
    """A socket pair whose server end is lent to a new I/O thread with `native`: (thread, server end, client
    end, hand-backs, ticket)."""
    server, client = socket.socketpair()
    server.setblocking(False)
    handbacks = Handbacks()
    io = IoThread(handbacks)
    try:
        yield io, server, client, handbacks, io.lend(server.fileno(), "conn", native)
    finally:
        io.stop()
        server.close()
        client.close()


def until(condition: Callable[[], bool]) -> None:
    for _ in range(200):
        if condition():
            return
        time.sleep(0.05)
    raise AssertionError("the condition never held")


def test_a_whole_frame_is_answered_from_the_thread_with_the_frame_in_the_buffer():
    seen = []

    def native(buf, start, end):
        seen.append((threading.get_ident(), bytes(buf[start:end])))
        return frame(b"answer")
    with lent(native) as (io, _server, client, handbacks, _ticket):
        client.sendall(REQUEST)
        assert client.recv(100) == frame(b"answer")
        assert seen == [(seen[0][0], REQUEST[4:])] and seen[0][0] != threading.get_ident()
        client.sendall(REQUEST)
        assert client.recv(100) == frame(b"answer")
        assert (io.answered, io.returned, io.lent) == (2, 0, 1)
        assert handbacks.got == []


def test_an_empty_answer_sends_nothing_and_keeps_the_socket():
    """acks=0: the native call appends and answers nothing."""
    with lent(lambda buf, start, end: b"") as (io, _server, client, handbacks, _ticket):
        client.sendall(REQUEST)
        until(lambda: io.answered == 1)
        client.setblocking(False)
        with pytest.raises(BlockingIOError):
            client.recv(100)
        assert io.lent == 1 and handbacks.got == []


def test_a_declined_frame_comes_back_with_its_bytes():
    with lent(lambda buf, start, end: None) as (io, _server, client, handbacks, _ticket):
        client.sendall(REQUEST)
        assert handbacks.next() == ("conn", REQUEST, True, b"", None)
        assert (io.answered, io.returned, io.lent) == (0, 1, 0)


@pytest.mark.parametrize("sent", [REQUEST[:6], REQUEST + REQUEST, REQUEST[:4] + REQUEST[4:-1]],
                         ids=["part of a frame", "two frames", "shorter than its size"])
def test_a_read_that_is_not_one_whole_frame_comes_back_without_the_native_call(sent):
    called = []
    with lent(lambda *args: called.append(args)) as (io, _server, client, handbacks, _ticket):
        client.sendall(sent)
        assert handbacks.next() == ("conn", sent, False, b"", None)
        assert called == [] and io.lent == 0


def test_the_end_of_the_stream_comes_back_with_nothing_read():
    with lent(lambda *args: None) as (io, _server, client, handbacks, _ticket):
        client.close()
        assert handbacks.next() == ("conn", b"", False, b"", None)
        assert io.lent == 0


def test_a_failure_in_the_native_call_comes_back_as_its_error():
    def native(buf, start, end):
        raise ValueError("poke of t-0 failed")
    with lent(native) as (io, _server, client, handbacks, _ticket):
        client.sendall(REQUEST)
        conn, received, declined, unsent, error = handbacks.next()
        assert (conn, received, declined, unsent) == ("conn", b"", False, b"")
        assert isinstance(error, ValueError) and str(error) == "poke of t-0 failed"
        assert error.__traceback__ is not None  # logged with it by the connection
        assert io.lent == 0


def test_an_answer_the_socket_cannot_take_whole_comes_back_unsent():
    answer = frame(bytes(range(256)) * (64 * 1024))  # 16 MiB: more than the socket buffers hold
    with lent(lambda buf, start, end: answer) as (io, server, client, handbacks, _ticket):
        client.sendall(REQUEST)
        conn, received, declined, unsent, error = handbacks.next()
        assert (received, declined, error) == (b"", False, None)
        assert 0 < len(unsent) < len(answer) and answer.endswith(unsent)
        assert io.answered == 1 and io.lent == 0
        got = bytearray()
        reader = threading.Thread(target=lambda: got.extend(client.recv(len(answer), socket.MSG_WAITALL)))
        reader.start()
        server.setblocking(True)
        server.sendall(unsent)  # what the loop's transport does with it
        reader.join(30)
        assert bytes(got) == answer


def test_a_socket_reclaimed_during_the_native_call_still_gets_its_answer_and_never_comes_back():
    inside, go_on = threading.Event(), threading.Event()

    def native(buf, start, end):
        inside.set()
        go_on.wait(10)  # lets the GIL go, as the append's pwrite does
        return frame(b"answer")
    with lent(native) as (io, _server, client, handbacks, ticket):
        client.sendall(REQUEST)
        assert inside.wait(10)
        assert io.reclaim(ticket) is True
        go_on.set()
        assert client.recv(100) == frame(b"answer")
        until(lambda: io.lent == 0)
        assert handbacks.got == [] and io.returned == 0


def test_a_ticket_of_a_socket_that_came_back_reclaims_nothing():
    with lent(lambda *args: None) as (io, server, client, handbacks, ticket):
        client.sendall(REQUEST)
        handbacks.next()
        again = io.lend(server.fileno(), "conn", lambda buf, start, end: frame(b"answer"))
        assert io.reclaim(ticket) is False  # the old lending's: the new one is untouched
        client.sendall(REQUEST)
        assert client.recv(100) == frame(b"answer")
        assert io.reclaim(again) is True and io.lent == 0


def test_what_the_thread_reads_at_once_fits_a_connections_free_buffer():
    """A read handed back is copied into the connection's buffer in one piece (`Connection._returned`)."""
    assert READ_BYTES <= Connection.MIN_READ


def test_stop_gives_every_lent_socket_back():
    server2, client2 = socket.socketpair()
    try:
        with lent(lambda *args: None) as (io, _server, _client, handbacks, _ticket):
            io.lend(server2.fileno(), "conn2", lambda *args: None)
            io.stop()
            assert sorted(g[0] for g in handbacks.got) == ["conn", "conn2"]
            assert all(g[1:] == (b"", False, b"", None) for g in handbacks.got)
            assert io.lent == 0
            with pytest.raises(RuntimeError):
                io.lend(server2.fileno(), "conn2", lambda *args: None)
    finally:
        server2.close()
        client2.close()


# -- in a broker -------------------------------------------------------------------------------------------


def io_of(pair: Brokers):
    io = pair.brokers["native"].io
    assert io is not None, "the native broker started no I/O thread"
    return io


WARM = 6  # Produces before the thread serves every next one: past the segment's first batch and first index page


def warmed(pair: Brokers, sock: socket.socket) -> None:
    """WARM Produces answered on `sock`: the first (a segment's first batch) by the handler, the next natively on
    the loop, which lends the socket; one allocates the offset index's first page (Python's). Then the socket
    is lent."""
    for i in range(WARM):
        sock.sendall(produce(9, i, batch(i)))
        read_frame(sock)
    until(lambda: io_of(pair).lent >= 1)


def test_a_connection_answered_natively_is_served_by_the_thread_as_the_handler_serves_it(tmp_path):
    frames = [produce(9, i, batch(i)) for i in range(30)]
    with brokers(tmp_path) as pair:
        got = exchange(pair, frames)
        assert got["native"] == got["handler"]
        assert pair.files("native") == pair.files("handler")
        io = io_of(pair)
        assert io.answered >= len(frames) - 4  # the handler's first, the loop's lending one, a rare page or roll
        assert pair.brokers["handler"].io is None
        until(lambda: io.lent == 0)  # the closed connection came back
        figures = {m.name: m.samples[0].value for m in _io_thread_families(pair.brokers["native"])}
        assert figures == {"shale_io_thread_requests": io.answered, "shale_io_thread_handbacks": io.returned,
                           "shale_io_thread_connections": 0}
        assert io.returned >= 1


def test_a_frame_the_thread_declines_comes_back_and_is_answered_in_order(tmp_path):
    """A request the native call does not take (another API, an unknown topic) goes back to the loop, whose
    handler answers it; the next native answer lends the socket again."""
    api_versions = encode_request(18, 3, 100, "io-test", {"client_software_name": "t", "client_software_version": "1"})
    frames = [produce(9, i, batch(i)) for i in range(WARM)]
    later = [api_versions, produce(9, 101, batch(WARM), topic="unknown")]
    later += [produce(9, 102 + i, batch(WARM + 1 + i)) for i in range(3)]
    with brokers(tmp_path) as pair:
        with pair.connect("native") as sock:
            warmed(pair, sock)
            io = io_of(pair)
            answered, returned = io.answered, io.returned
            native = []
            for request in later:
                sock.sendall(request)
                native.append(read_frame(sock))
            # the first came back from the thread, the second was the loop's; the loop's native answer to the next
            # lent the socket again, and the thread answered the last two (closing the socket brings it back again)
            assert io.returned == returned + 1 and io.answered == answered + 2
        assert native == exchange(pair, frames + later, kinds=("handler",))["handler"][WARM:]
        assert [struct.unpack_from(">i", a)[0] for a in native] == [100, 101, 102, 103, 104]
        assert pair.files("native") == pair.files("handler")


def test_pipelined_frames_come_back_to_the_loop_in_order(tmp_path):
    with brokers(tmp_path) as pair, pair.connect("native") as sock:
        warmed(pair, sock)
        returned = io_of(pair).returned
        sock.sendall(b"".join(produce(9, 10 + i, batch(10 + i)) for i in range(8)))
        assert [struct.unpack_from(">i", read_frame(sock))[0] for _ in range(8)] == list(range(10, 18))
        assert io_of(pair).returned > returned
        assert pair.brokers["native"].registry.local_log("t", 0).log_end_offset == WARM + 8
        assert pair.brokers["native"].memory.used == 0


def test_a_client_that_closes_a_lent_connection_ends_it(tmp_path):
    with brokers(tmp_path) as pair:
        broker = pair.brokers["native"]
        with pair.connect("native") as sock:
            warmed(pair, sock)
        until(lambda: not broker._connections)
        assert io_of(pair).lent == 0 and broker.memory.used == 0


def test_closing_the_broker_gives_lent_sockets_back_and_closes_them(tmp_path):
    pair = Brokers(str(tmp_path))
    try:
        with pair.connect("native") as sock:
            warmed(pair, sock)
            io = io_of(pair)
            asyncio.run_coroutine_threadsafe(pair.brokers["native"].close(), pair.loop).result(10)
            assert sock.recv(4) == b""
            assert io.lent == 0
    finally:
        pair.close()


def test_a_failure_after_an_append_by_the_thread_closes_the_connection_and_keeps_the_record(tmp_path, caplog):
    with brokers(tmp_path) as pair, pair.connect("native") as sock:
        warmed(pair, sock)
        broker = pair.brokers["native"]

        def broken(topic, partition):
            raise RuntimeError(f"poke of {topic}-{partition} failed")
        broker._native.poke = broken
        broker.purgatory.events[TopicPartition("t", 1)] = set()  # some fetch waits somewhere: the C call pokes
        returned = io_of(pair).returned
        sock.sendall(produce(9, WARM, batch(WARM)))
        assert sock.recv(4) == b"", "the connection is closed without an answer"
        assert broker.registry.local_log("t", 0).log_end_offset == WARM + 1
        assert io_of(pair).returned == returned + 1  # the thread's failure came back to the loop, which closed
        until(lambda: not broker._connections)
        assert broker.memory.used == 0
    assert "the native Produce path failed" in caplog.text and "poke of t-0 failed" in caplog.text


def test_an_append_by_the_thread_wakes_a_parked_fetch(tmp_path):
    with brokers(tmp_path) as pair, pair.connect("native") as producer, pair.connect("native") as consumer:
        warmed(pair, producer)
        io = io_of(pair)
        consumer.sendall(fetch(5, partition=0, offset=WARM, max_wait_ms=30000))
        tp = TopicPartition("t", 0)
        until(lambda: bool(pair.brokers["native"].purgatory.events.get(tp)))
        answered = io.answered
        producer.sendall(produce(9, WARM, batch(WARM)))
        read_frame(producer)
        assert io.answered == answered + 1  # appended from the thread, which pokes through the loop
        answer = decode_response(1, 12, read_frame(consumer)).body  # within the socket's 10 s, not the fetch's 30 s
        assert b"value-%d" % WARM in bytes(answer.responses[0].partitions[0].records)


def test_a_fetch_that_parks_after_an_append_it_did_not_read_reads_again_at_once(tmp_path):
    """The thread appends between a Fetch's read and its parking: it saw no fetch parked and poked none, so the
    fetch must not wait for its max wait (FetchPurgatory.park compares the count of native appends)."""
    with brokers(tmp_path) as pair, pair.connect("native") as sock:
        warmed(pair, sock)
        broker = pair.brokers["native"]
        tp = TopicPartition("t", 0)

        async def park(since: int) -> None:
            await broker.purgatory.park({tp}, asyncio.get_running_loop().time() + 30, False, since)
        asyncio.run_coroutine_threadsafe(park(appended() - 1), pair.loop).result(10)  # woken at once, not in 30 s
        waiting = asyncio.run_coroutine_threadsafe(park(appended()), pair.loop)
        with pytest.raises(TimeoutError):
            waiting.result(0.5)  # nothing appended since: it stays parked
        sock.sendall(produce(9, WARM, batch(WARM)))
        read_frame(sock)
        waiting.result(10)  # poked by the append


@contextmanager
def through_proxy(pair: Brokers) -> Iterator[tuple[FaultProxy, socket.socket]]:
    """A connection to the native broker through a fault-injecting proxy (a real TCP hop that can be cut)."""
    proxy = FaultProxy(pair.brokers["native"].port).start()
    try:
        with socket.create_connection(("127.0.0.1", proxy.port), timeout=10) as sock:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            yield proxy, sock
    finally:
        proxy.stop()


def test_a_frozen_link_holds_only_its_own_lent_socket_and_its_request_is_answered_once_healed(tmp_path):
    """A client whose link freezes (nothing forwarded either way, as while a cable is out) keeps its socket lent;
    the thread serves every other connection meanwhile, and the held request, once the link heals, is appended and
    answered once."""
    with brokers(tmp_path) as pair, through_proxy(pair) as (proxy, cut):
        warmed(pair, cut)
        broker, io = pair.brokers["native"], io_of(pair)
        proxy.cut_all(FREEZE)
        cut.sendall(produce(9, WARM, batch(WARM)))  # held in the proxy
        with pair.connect("native") as other:
            answered = io.answered
            for i in range(WARM):
                other.sendall(produce(9, 100 + i, batch(100 + i), partitions=(1,)))
                assert struct.unpack_from(">i", read_frame(other))[0] == 100 + i
            assert io.answered > answered, "the thread stopped serving while one lent socket's link was frozen"
            assert io.lent == 2
        assert broker.registry.local_log("t", 0).log_end_offset == WARM  # the held request never arrived
        answered = io.answered
        proxy.heal()
        assert struct.unpack_from(">i", read_frame(cut))[0] == WARM
        assert io.answered == answered + 1  # by the thread: the socket stayed lent throughout
        assert broker.registry.local_log("t", 0).log_end_offset == WARM + 1


def test_a_link_reset_while_lent_ends_the_connection_and_keeps_what_was_acknowledged(tmp_path):
    """A firewall's RST on a lent socket comes back to the loop, which ends the connection: no slot, buffer or
    connection left behind, and every acknowledged record still in the log."""
    with brokers(tmp_path) as pair, through_proxy(pair) as (proxy, cut):
        warmed(pair, cut)
        broker, io = pair.brokers["native"], io_of(pair)
        returned = io.returned
        proxy.cut_all(RESET)
        until(lambda: io.lent == 0 and not broker._connections)
        assert io.returned == returned + 1
        assert broker.memory.used == 0
        log = broker.registry.local_log("t", 0)
        assert log.log_end_offset == WARM
        assert [r.value for b in loaded_batches(log) for r in b.records()] == [b"value-%d" % i * 10 for i in range(WARM)]
        with pair.connect("native") as again:  # the node serves on
            again.sendall(produce(9, 200, batch(WARM)))
            assert struct.unpack_from(">i", read_frame(again))[0] == 200
