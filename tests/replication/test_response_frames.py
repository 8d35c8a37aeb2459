"""`ResponseFrames`, the replica fetcher's reader of size-prefixed answers: every frame comes out whole and in
order however the socket cuts the stream (hypothesis, driving the protocol's buffer calls as asyncio does), a
bad size or a closed connection is an error for the reader, and over a real socket a frame larger than the
scratch buffer is read into its own buffer, which the next frame reuses — in plaintext and through TLS (an
inter-broker listener may be SSL), whose transport hands its buffered protocol the decrypted bytes."""

from __future__ import annotations

import asyncio
import ssl
import struct
import subprocess

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shale.sidecar.replication.response_frames import _SCRATCH_BYTES, ResponseFrames


class _Transport(asyncio.Transport):
    """What ResponseFrames asks of a transport when it is fed by hand: closing it."""

    def __init__(self) -> None:
        super().__init__()
        self.closed = False

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed


def framed(payload: bytes) -> bytes:
    return struct.pack(">i", len(payload)) + payload


def feed(frames: ResponseFrames, stream: bytes, cuts: list[int]) -> None:
    """Deliver `stream` as asyncio's buffered read path does: ask for a buffer, fill at most the piece the
    socket has (the next cut), report how much was written."""
    pos, cuts = 0, sorted(set(c for c in cuts if 0 < c < len(stream))) + [len(stream)]
    for cut in cuts:
        while pos < cut:
            buf = frames.get_buffer(-1)
            n = min(len(buf), cut - pos)
            buf[:n] = stream[pos:pos + n]
            frames.buffer_updated(n)
            pos += n


# A response frame holds at least its correlation id.
PAYLOADS = st.lists(st.one_of(st.binary(min_size=4, max_size=64), st.integers(4, 3 * _SCRATCH_BYTES).map(
    lambda n: bytes(i % 251 for i in range(n)))), min_size=1, max_size=5)


@settings(max_examples=60, deadline=None)
@given(PAYLOADS, st.lists(st.integers(0, 4 * _SCRATCH_BYTES), max_size=12), st.booleans())
def test_every_frame_comes_out_whole_and_in_order_however_the_stream_is_cut(payloads, cuts, eager):
    """`eager`: each frame is taken as soon as it is complete (the fetcher's case: one request in flight,
    so the buffer is reused); otherwise all arrive before any is taken, each in a buffer of its own."""

    async def scenario() -> list[bytes]:
        frames = ResponseFrames(_Transport(), "leader")
        got: list[bytes] = []
        for payload in payloads if eager else [b"".join(framed(p) for p in payloads)]:
            stream = framed(payload) if eager else payload
            feed(frames, stream, cuts)
            for _ in range(1 if eager else len(payloads)):
                got.append(bytes(await frames.next_frame()))
        frames.connection_lost(None)
        with pytest.raises(EOFError, match="leader closed the connection"):
            await frames.next_frame()
        return got

    assert asyncio.run(scenario()) == payloads


@pytest.mark.parametrize("size", [3, -1, (1 << 20) + 1])
def test_a_bad_frame_size_closes_the_connection_and_fails_the_reader(size):
    async def scenario() -> None:
        transport = _Transport()
        frames = ResponseFrames(transport, "node 1 at 127.0.0.1:9", max_frame=1 << 20)
        feed(frames, struct.pack(">i", size) + b"rest", [])
        assert transport.closed
        with pytest.raises(EOFError, match=f"node 1 at 127.0.0.1:9: response frame of {size} bytes"):
            await frames.next_frame()

    asyncio.run(scenario())


def test_a_waiting_reader_is_woken_by_the_connections_end():
    async def scenario() -> None:
        frames = ResponseFrames(_Transport(), "leader")
        waiting = asyncio.ensure_future(frames.next_frame())
        await asyncio.sleep(0)
        assert not waiting.done()
        frames.connection_lost(ConnectionResetError("reset by peer"))
        with pytest.raises(ConnectionResetError, match="reset by peer"):
            await waiting

    asyncio.run(scenario())


def tls_contexts(d) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    """A self-signed certificate for 127.0.0.1: the server's context and a client's that trusts it."""
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{d}/key.pem", "-out",
                    f"{d}/cert.pem", "-days", "1", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
                   check=True, capture_output=True)
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server.load_cert_chain(f"{d}/cert.pem", f"{d}/key.pem")
    return server, ssl.create_default_context(cafile=f"{d}/cert.pem")


@pytest.mark.parametrize("tls", [False, True], ids=["plaintext", "tls"])
def test_over_a_real_socket_large_frames_are_read_into_one_reused_buffer(tls, tmp_path):
    big = [bytes([i]) * n for i, n in enumerate((5 * _SCRATCH_BYTES, 6 * _SCRATCH_BYTES, 5 * _SCRATCH_BYTES + 7))]
    server_ssl, client_ssl = tls_contexts(tmp_path) if tls else (None, None)

    async def scenario() -> None:
        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            for payload in big:
                await reader.readexactly(1)  # one request, one answer: as the fetcher asks
                writer.write(framed(payload))
                await writer.drain()
            writer.close()

        server = await asyncio.start_server(serve, "127.0.0.1", 0, ssl=server_ssl)
        port = server.sockets[0].getsockname()[1]
        _reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=client_ssl)
        frames = ResponseFrames.take_over(writer.transport, "leader")
        buffers = []
        for payload in big:
            writer.transport.write(b"?")
            frame = await frames.next_frame()
            assert frame == payload
            buffers.append(frame.obj)
        # the first buffer was too small for the larger second frame; the third fits in the second's
        assert buffers[0] is not buffers[1] and buffers[1] is buffers[2]
        with pytest.raises((EOFError, ConnectionError)):
            await frames.next_frame()
        writer.close()
        server.close()
        await server.wait_closed()

    asyncio.run(scenario())
