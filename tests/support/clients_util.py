"""Helpers shared by the client, crash and bad-input tests: raw Kafka requests and the files a node wrote.

Raw requests are built with kafka-python's schema-generated request classes (the same bytes its client
sends) so a test can send what no well-behaved client would: a duplicate idempotent batch, a corrupt
batch, acks=5. The file helpers read a partition's `.log` files directly, which is what a crash or a
bad request must leave intact.
"""

from __future__ import annotations

import hashlib
import os
import socket
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from kafka.protocol.api_message import ApiMessage

from shale.sidecar.log.file_records import iter_batches
from shale.sidecar.log.records import Record, RecordBatch, decode_batch

# Files that change on a schedule (checkpoints) or are the process's own lock, not data.
VOLATILE_NAMES = {".lock", ".kafka_cleanshutdown"}


def build(cls: type, values: Mapping[str, Any], version: int | None = None) -> Any:
    """A kafka-python message (request or nested struct) from plain dicts, recursively.

    kafka-python wants nested structs as instances of their generated classes (kafka-protocol.md G10).
    """
    fields = cls._struct.fields
    kwargs: dict[str, Any] = {}
    for name, value in values.items():
        field = fields[name]
        if field.is_struct() and isinstance(value, Mapping):
            value = build(field.data_class, value)
        elif field.is_struct_array() and value is not None:
            value = [build(field.data_class, v) if isinstance(v, Mapping) else v for v in value]
        kwargs[name] = value
    return cls(**kwargs) if version is None else cls(version=version, **kwargs)


def request_frame(request: ApiMessage, correlation_id: int = 1, client_id: str | None = "raw-test") -> bytes:
    """The size-prefixed frame kafka-python's client writes for `request`."""
    request.with_header(correlation_id=correlation_id, client_id=client_id)
    return bytes(request.encode(header=True, framed=True))


def read_frame(sock: socket.socket) -> bytes | None:
    """One size-prefixed response frame (without the prefix), or None if the peer closed first."""
    head = _read_exactly(sock, 4)
    if head is None:
        return None
    (size,) = struct.unpack(">i", head)
    body = _read_exactly(sock, size)
    if body is None:
        raise AssertionError(f"connection closed inside a {size}-byte response frame")
    return body


def _read_exactly(sock: socket.socket, n: int) -> bytes | None:
    buf = b""
    while len(buf) < n:
        try:
            chunk = sock.recv(n - len(buf))
        except ConnectionResetError:
            chunk = b""
        if not chunk:
            return None if not buf else buf if len(buf) == n else None
        buf += chunk
    return buf


def call(port: int, request: ApiMessage, response_cls: type, *, correlation_id: int = 1,
         client_id: str = "raw-test", timeout: float = 10.0) -> Any:
    """Send one request on a fresh connection and decode the answer."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(request_frame(request, correlation_id, client_id))
        reply = read_frame(sock)
    assert reply is not None, f"the server closed the connection instead of answering {type(request).__name__}"
    resp = response_cls.decode(reply, version=request.API_VERSION, header=True)
    assert resp.header.correlation_id == correlation_id
    return resp


def exchange(port: int, payload: bytes, *, timeout: float = 10.0) -> tuple[bytes, bool]:
    """Write raw bytes, half-close, read until the server closes; (what came back, closed by the server)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        try:
            sock.sendall(payload)
            sock.shutdown(socket.SHUT_WR)
        except (BrokenPipeError, ConnectionResetError):
            return b"", True  # the server closed while we were still writing
        chunks = []
        while True:
            try:
                data = sock.recv(65536)
            except ConnectionResetError:
                return b"".join(chunks), True
            if not data:
                return b"".join(chunks), True
            chunks.append(data)


def closes_without_reply(port: int, payload: bytes, *, timeout: float = 10.0) -> bool:
    """True if the server hangs up on `payload` without writing a byte (with our side still open).

    The write side stays open, so a server that merely waits for more bytes would time out here
    instead of looking like it closed.
    """
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        try:
            sock.sendall(payload)
        except (BrokenPipeError, ConnectionResetError):
            return True
        try:
            data = sock.recv(65536)
        except ConnectionResetError:
            return True
        except socket.timeout:
            raise AssertionError(f"the server neither answered nor closed within {timeout}s") from None
        return data == b""


# -- files -------------------------------------------------------------------------------------------


def partition_dir(data_dir: str | Path, topic: str, partition: int) -> Path:
    return Path(data_dir) / f"{topic}-{partition}"


def raw_batches(data_dir: str | Path, topic: str, partition: int) -> list[tuple[bytes, str]]:
    """Every whole batch in the partition's `.log` files as stored, with where it is, in offset order.

    Reads the files directly (the running server holds the directory lock); a partial batch at the
    end of the active segment — an append in progress — is not returned.
    """
    out: list[tuple[bytes, str]] = []
    d = partition_dir(data_dir, topic, partition)
    for name in sorted(n for n in os.listdir(d) if n.endswith(".log")):
        path = d / name
        fd = os.open(path, os.O_RDONLY)
        try:
            for pos in iter_batches(fd, 0, os.fstat(fd).st_size, str(path)):
                out.append((os.pread(fd, pos.size, pos.position), f"{path} position {pos.position}"))
        finally:
            os.close(fd)
    return out


def stored_batches(data_dir: str | Path, topic: str, partition: int) -> list[RecordBatch]:
    """Every whole batch in the partition's `.log` files, CRC-checked and decoded, in offset order."""
    return [decode_batch(raw, where) for raw, where in raw_batches(data_dir, topic, partition)]


def stored_records(data_dir: str | Path, topic: str, partition: int) -> list[Record]:
    return [r for b in stored_batches(data_dir, topic, partition) for r in b.records]


@dataclass(frozen=True)
class FileState:
    """Size and digest of every data file under a directory."""

    files: dict[str, tuple[int, str]]

    def diff(self, other: "FileState") -> list[str]:
        changed = []
        for name in sorted(set(self.files) | set(other.files)):
            if self.files.get(name) != other.files.get(name):
                changed.append(f"{name}: {self.files.get(name)} -> {other.files.get(name)}")
        return changed


def file_state(root: str | Path) -> FileState:
    """Digest every file except the checkpoints that change on a schedule and the lock."""
    files: dict[str, tuple[int, str]] = {}
    for dirpath, _dirs, names in os.walk(root):
        for name in names:
            if name in VOLATILE_NAMES or "checkpoint" in name:
                continue
            path = os.path.join(dirpath, name)
            files[os.path.relpath(path, root)] = _digest(path)
    return FileState(files)


def _digest(path: str) -> tuple[int, str]:
    """(size, sha256 over the data regions and where they are): equal digests mean equal bytes.

    Preallocated indexes are sparse 10 MiB files; the holes read as zeros, so hashing only the data
    regions and their positions is exact and does not read gigabytes of zeros for `__consumer_offsets`.
    """
    digest = hashlib.sha256()
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        pos = 0
        while pos < size:
            try:
                start = os.lseek(fd, pos, os.SEEK_DATA)
            except OSError:  # ENXIO: only a hole from here to the end
                break
            end = os.lseek(fd, start, os.SEEK_HOLE)
            digest.update(struct.pack(">qq", start, end))
            while start < end:
                chunk = os.pread(fd, min(end - start, 1 << 20), start)
                if not chunk:
                    break
                digest.update(chunk)
                start += len(chunk)
            pos = end
    finally:
        os.close(fd)
    return size, digest.hexdigest()
