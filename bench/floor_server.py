"""The event loop's floor under a one-record Produce (bench/broker.py's "asyncio floor" baseline).

`bench/floor_server.c` does what `shale serve` asks of the kernel per request and nothing else; this does the
same through what `shale serve` runs on: asyncio's default event loop and a `BufferedProtocol` that receives
each frame into one reused buffer, `pwrite`s its bytes to a file and writes a canned 44-byte answer carrying
the request's correlation id through the transport. Its CPU time per request above the C floor is what the
Python event loop costs before any request handling; Shale's above it is the handling itself.

    python bench/floor_server.py PORT FILE     (on 127.0.0.1:PORT, until killed)
"""

from __future__ import annotations

import asyncio
import os
import struct
import sys

_SIZE = struct.Struct(">i")
_ANSWER_SIZE = 44  # as floor_server.c's: size prefix, correlation id, zeros


class FloorProtocol(asyncio.BufferedProtocol):
    """One connection: whole frames out of a reused buffer, each written to the file and answered."""

    def __init__(self, fd: int, written: list[int]) -> None:
        self.fd, self.written = fd, written  # the file and its length, shared by the connections
        self.buf = bytearray(1 << 20)
        self.view = memoryview(self.buf)
        self.have = 0
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.view[self.have:]

    def buffer_updated(self, nbytes: int) -> None:
        self.have += nbytes
        start = 0
        while self.have - start >= 4:
            size = _SIZE.unpack_from(self.buf, start)[0]
            if not 0 <= size <= len(self.buf) - 4:
                self.transport.abort()
                return
            if self.have - start < 4 + size:
                break
            os.pwrite(self.fd, self.view[start + 4:start + 4 + size], self.written[0])
            self.written[0] += size
            answer = bytearray(_ANSWER_SIZE)
            _SIZE.pack_into(answer, 0, _ANSWER_SIZE - 4)
            answer[4:8] = self.buf[start + 8:start + 12]  # the request's correlation id
            self.transport.write(answer)
            start += 4 + size
        if start:
            self.buf[:self.have - start] = self.buf[start:self.have]
            self.have -= start


async def serve(port: int, path: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    written = [0]
    server = await asyncio.get_running_loop().create_server(lambda: FloorProtocol(fd, written), "127.0.0.1", port)
    await server.serve_forever()


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: floor_server.py PORT FILE", file=sys.stderr)
        return 2
    asyncio.run(serve(int(argv[0]), argv[1]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
