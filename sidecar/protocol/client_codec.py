"""The client side of the wire codec: encode a request frame, decode a response frame. Sans-I/O.

A node that follows another (the replica fetcher) speaks Kafka's protocol as a client. The messages are the
same kafka-python classes, built from Kafka's JSON definitions, that `codec.py` serves with, and the same
version ranges are enforced, so a node only ever sends what a node of the same build can decode. A dict body is
encoded by `generated_codec.request_encoder` (the same bytes, a fraction of the time: a follower sends one Fetch
per leader append); whatever it leaves goes to kafka-python's encoder, which names the error. A response is
decoded by `compiled_codec.response_decoder` (C), then `generated_codec.response_decoder` (asked to, both
leave bytes fields such as a Fetch answer's records as views into the frame); a frame neither reads goes to
kafka-python's decoder, which names the error.
"""

from __future__ import annotations

import functools
import io
import struct
from dataclasses import dataclass
from typing import Any, Mapping

from . import compiled_codec, generated_codec
from .codec import (
    _DECODE_ERRORS,
    SUPPORTED_VERSIONS,
    MalformedFrameError,
    ProtocolError,
    UnsupportedVersionError,
    _build,
    request_class,
    response_class,
)
from .generated_codec import KIP511_HEADER_APIS, request_encoder

_SIZE = struct.Struct(">i")
_HEADER_PREFIX = 4096  # a response header is a correlation id and (flexible) a few tagged fields


def _check_version(api_key: int, api_version: int, correlation_id: int | None) -> None:
    lo, hi = SUPPORTED_VERSIONS[api_key]
    if not lo <= api_version <= hi:
        raise UnsupportedVersionError(api_key, api_version, correlation_id,
                                      f"unsupported version (supported {lo}-{hi})")


def encode_request(api_key: int, api_version: int, correlation_id: int, client_id: str | None,
                   body: Mapping[str, Any]) -> bytes:
    """A request frame *with* its 4-byte size prefix, ready for the socket. `body` is a dict of the request's
    snake_case fields (nested structs as dicts or lists of dicts; missing fields take the schema default)."""
    cls = request_class(api_key)
    _check_version(api_key, api_version, correlation_id)
    if body.__class__ is dict:
        try:
            parts = request_encoder(cls, api_version)(body, correlation_id, client_id)
            parts[0] = _SIZE.pack(sum(map(len, parts)))
            return b"".join(parts)
        except Exception:  # noqa: BLE001 - the reference decides, and names the error
            pass
    return reference_encode_request(api_key, api_version, correlation_id, client_id, body)


def reference_encode_request(api_key: int, api_version: int, correlation_id: int, client_id: str | None,
                             body: Mapping[str, Any]) -> bytes:
    """`encode_request` by kafka-python's encoder: the bytes the generated one must match, and its errors."""
    cls = request_class(api_key)
    _check_version(api_key, api_version, correlation_id)
    try:
        msg = _build(cls, body, api_version)
        msg.with_header(correlation_id=correlation_id, client_id=client_id)
        return bytes(msg.encode(header=True, framed=True))
    except ProtocolError:
        raise
    except Exception as exc:  # noqa: BLE001 - re-raised with api key/version context
        raise ProtocolError(api_key, api_version, correlation_id, f"cannot encode request: {exc!r}") from exc


@functools.cache
def _response_decoders(cls: type, api_version: int, views: bool) -> tuple:
    """The decoders to try in turn: the compiled one (when built), then the generated Python."""
    generated = generated_codec.response_decoder(cls, api_version, views)
    if not compiled_codec.available:
        return (generated,)
    return compiled_codec.response_decoder(cls, api_version, views), generated


@dataclass(frozen=True, slots=True)
class Response:
    correlation_id: int
    body: Any  # kafka-python response object, snake_case attributes


def decode_response(api_key: int, api_version: int, frame: bytes | bytearray | memoryview, *,
                    views: bool = False) -> Response:
    """Decode one response frame (without its size prefix) of the request `api_key`/`api_version` it answers.

    The whole frame must be one response: a short body or bytes after it are a `MalformedFrameError`. With
    `views`, bytes fields (a Fetch answer's records) are memoryviews into `frame`, not copies, so they change
    with it: a caller that reuses the frame's buffer (`ResponseFrames`) must be done with them first.
    """
    cls = response_class(api_key)
    if len(frame) < 4:
        raise MalformedFrameError(api_key, api_version, None, f"response frame too short ({len(frame)} bytes)")
    (correlation_id,) = struct.unpack_from(">i", frame, 0)
    _check_version(api_key, api_version, correlation_id)
    data = memoryview(frame).cast("B") if not isinstance(frame, bytes) else memoryview(frame)
    flexible = cls.flexible_version_q(api_version)
    try:
        tagged_header = flexible and api_key not in KIP511_HEADER_APIS
        if not tagged_header or (len(data) > 4 and data[4] == 0):
            start = 5 if tagged_header else 4  # the correlation id, and no header tags: the usual header, read here
        else:
            head = io.BytesIO(bytes(data[:_HEADER_PREFIX]))
            try:
                cls.parse_header(head, version=api_version)
            except _DECODE_ERRORS:
                if len(data) <= _HEADER_PREFIX:
                    raise
                head = io.BytesIO(bytes(data))  # header tags beyond the prefix: decode it whole
                cls.parse_header(head, version=api_version)
            start = head.tell()
        for decoder in _response_decoders(cls, api_version, views):
            try:
                body, end = decoder(data, start)
                break
            except Exception:  # noqa: BLE001 - the next decoder, and at last the reference, decides
                pass
        else:
            reference = cls._struct.compiled_decode_from(api_version, compact=flexible, tagged=flexible,
                                                         data_class=cls)
            body, end = reference(data, start)
    except _DECODE_ERRORS as exc:
        raise MalformedFrameError(api_key, api_version, correlation_id, f"malformed response: {exc!r}") from exc
    if end != len(data):
        raise MalformedFrameError(api_key, api_version, correlation_id,
                                  f"response body ends at byte {end} of a {len(data)}-byte frame")
    return Response(correlation_id, body)
