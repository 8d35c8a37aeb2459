"""Sans-I/O Kafka wire-protocol codec for the storage sidecar (server side).

Pure functions, bytes <-> values; no sockets, no asyncio, no global mutable
state beyond import-time lookup tables.

* ``decode_request(frame)`` takes ONE request frame **without** the 4-byte
  size prefix (i.e. exactly the ``size`` bytes that follow it on the wire) and
  returns a :class:`Request`.
* ``encode_response(api_key, api_version, correlation_id, body)`` returns the
  response **without** the 4-byte size prefix by default (symmetric with
  ``decode_request``); pass ``framed=True`` to get the prefix included.
* ``encode_response_parts(...)`` is the same encoding as a list of pieces in
  which record sets given as :class:`ExternalRecords` (bytes still in a file)
  stay separate, so a server can send them with ``sendfile`` uncopied.

Encoding is schema-driven: the message classes are kafka-python 3.0.x's
``kafka.protocol`` classes, which are generated at import time from Apache
Kafka's own JSON message definitions (``kafka/protocol/schemas/resources``).
Nothing here is written per API version.  Record sets (Produce/Fetch
``records``) are carried as raw ``bytes`` and never decoded.

Three paths, the same bytes and values: frames and dict bodies go through the
C interpreter of the programs `compiled_codec` builds from those schemas per API
and version, then through the functions `generated_codec` writes from them (one
pass, no intermediate objects); whatever both leave (a value of an unexpected
type, an unknown field, a malformed frame) goes to kafka-python's own codec,
the reference (``reference_decode_request``, ``reference_encode_response``,
``reference_encode_response_parts``), which also names every error.

Header rules (KIP-482 / KIP-511):
* request header v1 (non-flexible API version) or v2 (flexible: adds a tagged
  field buffer); ``client_id`` is always a legacy int16-length nullable string;
* response header v0 or v1 (flexible) -- except ApiVersions, whose response
  header is always v0.

Body values are kafka-python data objects (snake_case attributes, e.g.
``body.topic_data[0].partition_data[0].records``).  ``encode_response``
accepts either such an object or a plain ``dict`` (nested dicts / lists of
dicts are converted to the schema's struct classes; missing fields take the
schema default).
"""

from __future__ import annotations

import io
import struct
from dataclasses import dataclass
from typing import Any, Callable, Mapping, cast

from kafka.protocol.admin.acl import (
    CreateAclsRequest,
    CreateAclsResponse,
    DeleteAclsRequest,
    DeleteAclsResponse,
    DescribeAclsRequest,
    DescribeAclsResponse,
)
from kafka.protocol.admin.cluster import (
    AlterReplicaLogDirsRequest,
    AlterReplicaLogDirsResponse,
    DescribeClusterRequest,
    DescribeClusterResponse,
    DescribeLogDirsRequest,
    DescribeLogDirsResponse,
)
from kafka.protocol.admin.configs import (
    AlterConfigsRequest,
    AlterConfigsResponse,
    DescribeConfigsRequest,
    DescribeConfigsResponse,
    IncrementalAlterConfigsRequest,
    IncrementalAlterConfigsResponse,
)
from kafka.protocol.admin.groups import (
    DeleteGroupsRequest,
    DeleteGroupsResponse,
    DescribeGroupsRequest,
    DescribeGroupsResponse,
    ListGroupsRequest,
    ListGroupsResponse,
)
from kafka.protocol.admin.topics import (
    AlterPartitionReassignmentsRequest,
    AlterPartitionReassignmentsResponse,
    CreatePartitionsRequest,
    CreatePartitionsResponse,
    CreateTopicsRequest,
    CreateTopicsResponse,
    DeleteTopicsRequest,
    DeleteTopicsResponse,
    ListPartitionReassignmentsRequest,
    ListPartitionReassignmentsResponse,
)
from kafka.protocol.admin.transactions import (
    DescribeTransactionsRequest,
    DescribeTransactionsResponse,
    ListTransactionsRequest,
    ListTransactionsResponse,
)
from kafka.protocol.admin.users import (
    AlterUserScramCredentialsRequest,
    AlterUserScramCredentialsResponse,
    DescribeUserScramCredentialsRequest,
    DescribeUserScramCredentialsResponse,
)
from kafka.protocol.api_header import RequestHeader
from kafka.protocol.api_message import ApiMessage
from kafka.protocol.consumer.fetch import FetchRequest, FetchResponse
from kafka.protocol.consumer.group import (
    HeartbeatRequest,
    HeartbeatResponse,
    JoinGroupRequest,
    JoinGroupResponse,
    LeaveGroupRequest,
    LeaveGroupResponse,
    OffsetCommitRequest,
    OffsetCommitResponse,
    OffsetDeleteRequest,
    OffsetDeleteResponse,
    OffsetFetchRequest,
    OffsetFetchResponse,
    SyncGroupRequest,
    SyncGroupResponse,
)
from kafka.protocol.consumer.offsets import (
    ListOffsetsRequest,
    ListOffsetsResponse,
    OffsetForLeaderEpochRequest,
    OffsetForLeaderEpochResponse,
)
from kafka.protocol.data_container import DataContainer
from kafka.protocol.metadata.api_versions import ApiVersionsRequest, ApiVersionsResponse
from kafka.protocol.metadata.find_coordinator import (
    FindCoordinatorRequest,
    FindCoordinatorResponse,
)
from kafka.protocol.metadata.metadata import MetadataRequest, MetadataResponse
from kafka.protocol.producer.produce import ProduceRequest, ProduceResponse
from kafka.protocol.producer.transaction import (
    AddOffsetsToTxnRequest,
    AddOffsetsToTxnResponse,
    AddPartitionsToTxnRequest,
    AddPartitionsToTxnResponse,
    EndTxnRequest,
    EndTxnResponse,
    InitProducerIdRequest,
    InitProducerIdResponse,
    TxnOffsetCommitRequest,
    TxnOffsetCommitResponse,
    WriteTxnMarkersRequest,
    WriteTxnMarkersResponse,
)
from kafka.protocol.sasl import (
    SaslAuthenticateRequest,
    SaslAuthenticateResponse,
    SaslHandshakeRequest,
    SaslHandshakeResponse,
)

from ..log.varint import encode_uvarint
from . import compiled_codec, generated_codec

__all__ = [
    "API_NAMES", "SUPPORTED_VERSIONS", "Request",
    "ProtocolError", "MalformedFrameError", "UnsupportedApiError", "UnsupportedVersionError",
    "decode_request", "encode_response", "encode_response_parts", "ExternalRecords",
    "request_class", "response_class",
    "reference_decode_request", "reference_encode_response", "reference_encode_response_parts",
]

# The largest frame either side reads: Kafka's socket.request.max.bytes default (a server's requests, a fetcher's responses).
MAX_FRAME_BYTES = 100 * 1024 * 1024

_PAIRS: tuple[tuple[type[ApiMessage], type[ApiMessage]], ...] = (
    (ProduceRequest, ProduceResponse),                      # 0
    (FetchRequest, FetchResponse),                          # 1
    (ListOffsetsRequest, ListOffsetsResponse),              # 2
    (MetadataRequest, MetadataResponse),                    # 3
    (OffsetCommitRequest, OffsetCommitResponse),            # 8
    (OffsetFetchRequest, OffsetFetchResponse),              # 9
    (FindCoordinatorRequest, FindCoordinatorResponse),      # 10
    (JoinGroupRequest, JoinGroupResponse),                  # 11
    (HeartbeatRequest, HeartbeatResponse),                  # 12
    (LeaveGroupRequest, LeaveGroupResponse),                # 13
    (SyncGroupRequest, SyncGroupResponse),                  # 14
    (DescribeGroupsRequest, DescribeGroupsResponse),        # 15
    (ListGroupsRequest, ListGroupsResponse),                # 16
    (SaslHandshakeRequest, SaslHandshakeResponse),          # 17
    (ApiVersionsRequest, ApiVersionsResponse),              # 18
    (CreateTopicsRequest, CreateTopicsResponse),            # 19
    (DeleteTopicsRequest, DeleteTopicsResponse),            # 20
    (InitProducerIdRequest, InitProducerIdResponse),        # 22
    (OffsetForLeaderEpochRequest, OffsetForLeaderEpochResponse),  # 23
    (AddPartitionsToTxnRequest, AddPartitionsToTxnResponse),  # 24
    (AddOffsetsToTxnRequest, AddOffsetsToTxnResponse),      # 25
    (EndTxnRequest, EndTxnResponse),                        # 26
    (WriteTxnMarkersRequest, WriteTxnMarkersResponse),      # 27
    (TxnOffsetCommitRequest, TxnOffsetCommitResponse),      # 28
    (DescribeAclsRequest, DescribeAclsResponse),            # 29
    (CreateAclsRequest, CreateAclsResponse),                # 30
    (DeleteAclsRequest, DeleteAclsResponse),                # 31
    (DescribeConfigsRequest, DescribeConfigsResponse),      # 32
    (AlterConfigsRequest, AlterConfigsResponse),            # 33
    (AlterReplicaLogDirsRequest, AlterReplicaLogDirsResponse),  # 34
    (DescribeLogDirsRequest, DescribeLogDirsResponse),      # 35
    (SaslAuthenticateRequest, SaslAuthenticateResponse),    # 36
    (CreatePartitionsRequest, CreatePartitionsResponse),    # 37
    (DeleteGroupsRequest, DeleteGroupsResponse),            # 42
    (IncrementalAlterConfigsRequest, IncrementalAlterConfigsResponse),  # 44
    (AlterPartitionReassignmentsRequest, AlterPartitionReassignmentsResponse),  # 45
    (ListPartitionReassignmentsRequest, ListPartitionReassignmentsResponse),  # 46
    (OffsetDeleteRequest, OffsetDeleteResponse),            # 47
    (DescribeUserScramCredentialsRequest, DescribeUserScramCredentialsResponse),  # 50
    (AlterUserScramCredentialsRequest, AlterUserScramCredentialsResponse),  # 51
    (DescribeClusterRequest, DescribeClusterResponse),      # 60
    (DescribeTransactionsRequest, DescribeTransactionsResponse),  # 65
    (ListTransactionsRequest, ListTransactionsResponse),    # 66
)

_REQUESTS: dict[int, type[ApiMessage]] = {req.API_KEY: req for req, _ in _PAIRS}
_RESPONSES: dict[int, type[ApiMessage]] = {resp.API_KEY: resp for _, resp in _PAIRS}
API_NAMES: dict[int, str] = {req.API_KEY: req.name[: -len("Request")] for req, _ in _PAIRS}

# Versions this codec can decode/encode correctly = the JSON schema's
# "validVersions".  kafka-python itself pretends every message starts at v0
# (ApiMessageData resets the minimum), which would silently mis-decode
# versions whose fields Kafka 4.0 removed from the JSON (e.g. ListOffsets v0,
# OffsetCommit v0-1), so we enforce the schema's own range here.
# Exception: Produce v0-2 are byte-compatible with the v3 schema minus
# TransactionalId (every other field is "0+"; the JSON only dropped them from
# validVersions), so they decode/encode correctly and are allowed; a broker
# should still answer them UNSUPPORTED_VERSION (they carry old message
# formats) while advertising min 0 (kafka-protocol.md gotcha G3).
_EXTRA_MIN: dict[int, int] = {ProduceRequest.API_KEY: 0}


def _schema_range(key: int) -> tuple[int, int]:
    lo = min(_REQUESTS[key].valid_versions[0], _RESPONSES[key].valid_versions[0])
    hi = min(_REQUESTS[key].valid_versions[1], _RESPONSES[key].valid_versions[1])
    return (_EXTRA_MIN.get(key, lo), hi)


SUPPORTED_VERSIONS: dict[int, tuple[int, int]] = {key: _schema_range(key) for key in _REQUESTS}


def request_class(api_key: int) -> type[ApiMessage]:
    """The (schema-generated) kafka-python request class for ``api_key``."""
    try:
        return _REQUESTS[api_key]
    except KeyError:
        raise UnsupportedApiError(api_key, None, None, "unknown or unsupported API key") from None


def response_class(api_key: int) -> type[ApiMessage]:
    """The (schema-generated) kafka-python response class for ``api_key``."""
    try:
        return _RESPONSES[api_key]
    except KeyError:
        raise UnsupportedApiError(api_key, None, None, "unknown or unsupported API key") from None


# ---------------------------------------------------------------------------
# Errors


class ProtocolError(ValueError):
    """A frame could not be decoded / a response could not be encoded.

    ``api_key``, ``api_version`` and ``correlation_id`` are set when known
    (``None`` otherwise), so a server can still answer with the right
    correlation id (e.g. UNSUPPORTED_VERSION for ApiVersions, KIP-511).
    """

    def __init__(self, api_key: int | None, api_version: int | None,
                 correlation_id: int | None, reason: str) -> None:
        self.api_key = api_key
        self.api_version = api_version
        self.correlation_id = correlation_id
        self.reason = reason
        super().__init__(self._describe())

    def _describe(self) -> str:
        if self.api_key is None:
            what = "request"
        else:
            name = API_NAMES.get(self.api_key, "unknown")
            what = f"api_key={self.api_key} ({name})"
            if self.api_version is not None:
                what += f" api_version={self.api_version}"
        if self.correlation_id is not None:
            what += f" correlation_id={self.correlation_id}"
        return f"{what}: {self.reason}"


class MalformedFrameError(ProtocolError):
    """Truncated frame, bad lengths, invalid UTF-8, ..."""


class UnsupportedApiError(ProtocolError):
    """API key not implemented by this codec."""


class UnsupportedVersionError(ProtocolError):
    """API key known, version outside :data:`SUPPORTED_VERSIONS`."""


# ---------------------------------------------------------------------------
# Requests


@dataclass(slots=True, unsafe_hash=True)
class Request:
    """One decoded request. Not frozen (nothing changes one; `dataclasses.replace` makes another): one is made
    per request, and a frozen dataclass's `__init__` costs a call per field."""

    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None
    body: Any  # kafka-python request object (e.g. ProduceRequest), attributes in snake_case
    header_tags: Mapping[str, Any] | None = None  # unknown tagged fields of header v2, if any

    @property
    def api_name(self) -> str:
        return API_NAMES[self.api_key]

    @property
    def expects_response(self) -> bool:
        """False only for Produce with acks=0 (no response frame at all)."""
        return not (self.api_key == _PRODUCE and self.body.acks == 0)


_FIXED_HEADER = struct.Struct(">hhi")  # api_key, api_version, correlation_id
_PRODUCE = ProduceRequest.API_KEY  # a plain int: the class property costs a call per request

# Exceptions kafka-python's generated decoders raise on bad input.
_DECODE_ERRORS = (struct.error, IndexError, ValueError, TypeError, UnicodeDecodeError,
                  OverflowError, AssertionError, KeyError, EOFError, MemoryError)


def _message_class(table: dict[int, type[ApiMessage]], api_key: int, api_version: int, correlation_id: int | None,
                   what: str) -> type[ApiMessage]:
    """The message class for an API key and version we serve, or the error that names them."""
    cls = table.get(api_key)
    if cls is None:
        raise UnsupportedApiError(api_key, api_version, correlation_id, "unknown or unsupported API key")
    lo, hi = SUPPORTED_VERSIONS[api_key]
    if not lo <= api_version <= hi:
        raise UnsupportedVersionError(api_key, api_version, correlation_id,
                                      f"{what}unsupported version (supported {lo}-{hi})")
    return cls


# The request header is decoded from a copy of the frame's start only: a Produce frame of
# megabytes is not copied for a header of a few bytes (client_id is at most 32767 bytes).
_HEADER_PREFIX = 64 * 1024


def _generated(built: dict[tuple[int, int], Any], table: dict[int, type[ApiMessage]],
               build: Callable[[type, int], Any], api_key: int, api_version: int) -> Any:
    """The generated decoder or encoder of a served API version (built on first use), or None."""
    found = built.get((api_key, api_version))
    if found is None:
        cls = table.get(api_key)
        if cls is None or not SUPPORTED_VERSIONS[api_key][0] <= api_version <= SUPPORTED_VERSIONS[api_key][1]:
            return None
        found = built[api_key, api_version] = build(cls, api_version)
    return found


def _request_decoders(cls: type, version: int) -> tuple[Callable[..., Any], ...]:
    """The decoders to try in turn: the compiled one (when built), then the generated Python."""
    generated = generated_codec.request_decoder(cls, version)
    return (compiled_codec.request_decoder(cls, version), generated) if compiled_codec.available else (generated,)


def _response_encoders(cls: type, version: int) -> tuple[Callable[..., Any] | None, Callable[..., Any]]:
    """(the compiled encoder or None, the generated one): see `encode_response`."""
    compiled = compiled_codec.response_encoder(cls, version) if compiled_codec.available else None
    return compiled, generated_codec.response_encoder(cls, version)


_DECODERS: dict[tuple[int, int], Any] = {}  # (api key, version) -> the request decoders to try in turn
_ENCODERS: dict[tuple[int, int], Any] = {}  # (api key, version) -> (compiled, generated) response encoders


def decode_request(frame: bytes | bytearray | memoryview) -> Request:
    """Decode one request frame (without the 4-byte size prefix): :func:`reference_decode_request`'s result,
    from the first fast decoder (compiled, then generated) that reads the frame, from the reference otherwise
    (errors included)."""
    if isinstance(frame, bytes) or (isinstance(frame, memoryview) and frame.format == "B" and frame.c_contiguous):
        data = frame  # as received: no new view per request
    else:
        data = memoryview(frame).cast("B")
    if len(data) >= _FIXED_HEADER.size:
        api_key, api_version, correlation_id = _FIXED_HEADER.unpack_from(data, 0)
        decoders = _DECODERS.get((api_key, api_version)) or _generated(
            _DECODERS, _REQUESTS, _request_decoders, api_key, api_version)
        for decoder in decoders or ():
            try:
                body, header = decoder(data)
            except Exception:  # noqa: BLE001 - the next decoder, and at last the reference, decides
                continue
            return Request(api_key, api_version, correlation_id, header.client_id, body, header.unknown_tags)
    return reference_decode_request(frame)


def reference_decode_request(frame: bytes | bytearray | memoryview) -> Request:
    """Decode one request frame (without the 4-byte size prefix) with kafka-python's codec.

    The frame is not copied: a server may decode from its receive buffer and
    reuse the buffer afterwards (decoded values own their bytes).

    Raises :class:`MalformedFrameError`, :class:`UnsupportedApiError` or
    :class:`UnsupportedVersionError`; all are :class:`ProtocolError`.  The
    error carries api_key/api_version/correlation_id whenever the first 8
    bytes were present.
    """
    data = frame if isinstance(frame, bytes) else memoryview(frame).cast("B")
    if len(data) < _FIXED_HEADER.size:
        raise MalformedFrameError(None, None, None,
                                  f"frame too short for a request header ({len(data)} bytes)")
    api_key, api_version, correlation_id = _FIXED_HEADER.unpack_from(data, 0)
    cls = _message_class(_REQUESTS, api_key, api_version, correlation_id, "")
    flexible = cls.flexible_version_q(api_version)

    # Header: kafka-python's schema-driven RequestHeader (v1, or v2 if flexible).
    head = data if isinstance(data, bytes) and len(data) <= _HEADER_PREFIX else bytes(data[:_HEADER_PREFIX])
    buf = io.BytesIO(head)
    try:
        try:
            header = RequestHeader.decode(buf, flexible=flexible)
            cut = buf.tell() >= len(head) < len(data)  # it may have read into the cut: decode it whole
        except _DECODE_ERRORS:
            if len(head) == len(data):
                raise
            cut = True
        if cut:  # header tags beyond the prefix (never seen from real clients)
            buf = io.BytesIO(bytes(data))
            header = RequestHeader.decode(buf, flexible=flexible)
    except _DECODE_ERRORS as exc:
        raise MalformedFrameError(api_key, api_version, correlation_id,
                                  f"malformed request header v{2 if flexible else 1}: {exc!r}") from exc
    pos = buf.tell()
    if pos > len(data):
        raise MalformedFrameError(api_key, api_version, correlation_id,
                                  f"truncated request header v{2 if flexible else 1}")

    # Body: the same generated decoder ApiMessage.decode uses, but we need the
    # end position to reject truncated frames.
    decoder = cls._struct.compiled_decode_from(api_version, compact=flexible, tagged=flexible,
                                               data_class=cls)
    try:
        body, end = decoder(data if isinstance(data, memoryview) else memoryview(data), pos)
    except _DECODE_ERRORS as exc:
        raise MalformedFrameError(api_key, api_version, correlation_id,
                                  f"malformed request body: {exc!r}") from exc
    if end > len(data):
        raise MalformedFrameError(api_key, api_version, correlation_id,
                                  f"truncated request body (frame {len(data)} bytes, body ends at {end})")
    # Bytes after the body are ignored, as Kafka's request parser ignores them: librdkafka 2.16's
    # all-topics Metadata v13 request carries three (fields of older versions), and Kafka answers it.
    body._header = header
    return Request(api_key=api_key, api_version=api_version, correlation_id=correlation_id,
                   client_id=header.client_id, body=body, header_tags=header.unknown_tags)


# ---------------------------------------------------------------------------
# Responses


def _build(data_class: type[Any], values: Mapping[str, Any], version: int | None) -> Any:
    fields = data_class._struct.fields
    kwargs: dict[str, Any] = {}
    for name, value in values.items():
        field = fields.get(name)
        if field is None:
            raise KeyError(f"unknown field {name!r} in {data_class.__name__}")
        if field.is_struct() and isinstance(value, Mapping):
            value = _build(field.data_class, value, None)
        elif field.is_struct_array() and value is not None:
            value = [_build(field.data_class, v, None) if isinstance(v, Mapping) else v
                     for v in value]
        kwargs[name] = value
    if version is None:
        return data_class(**kwargs)
    return data_class(version=version, **kwargs)


def _fast_encoding(api_key: int, api_version: int, correlation_id: int, body: Any,
                   framed: bool) -> bytes | list[Any] | None:
    """A dict body through the compiled encoder (the whole response as bytes, or parts around record sets left in
    files), else through the generated one (parts); None when both leave it to the reference. Parts start with
    an empty placeholder for the size prefix."""
    if body.__class__ is not dict:
        return None
    encoders: tuple[Callable[..., bytes | list[Any]] | None, Callable[..., list[Any]]] | None = _ENCODERS.get(
        (api_key, api_version)) or _generated(_ENCODERS, _RESPONSES, _response_encoders, api_key, api_version)
    if encoders is None:
        return None
    compiled, generated = encoders
    if compiled is not None:
        try:
            return compiled(body, correlation_id, framed)
        except Exception:  # noqa: BLE001 - the generated encoder, then the reference, decides
            pass
    try:
        return generated(body, correlation_id)
    except Exception:  # noqa: BLE001 - the reference decides, and names the error
        return None


def encode_response(api_key: int, api_version: int, correlation_id: int,
                    body: Any, *, framed: bool = False) -> bytes:
    """:func:`reference_encode_response`'s bytes: a dict body through the compiled or generated encoder when it
    takes it, anything else (and what they leave) through the reference."""
    out: Any = _fast_encoding(api_key, api_version, correlation_id, body, framed)
    if out.__class__ is bytes:
        return out
    if out is not None:
        try:
            if framed:
                out[0] = _SIZE.pack(sum(map(len, out)))  # an external record set has no len(): the reference's
            return b"".join(out)
        except TypeError:
            pass
    return reference_encode_response(api_key, api_version, correlation_id, body, framed=framed)


_SIZE = struct.Struct(">i")


def reference_encode_response(api_key: int, api_version: int, correlation_id: int,
                              body: Any, *, framed: bool = False) -> bytes:
    """Encode a response header + body for ``api_key``/``api_version`` with kafka-python's codec.

    ``body`` is a kafka-python response object of the matching class or a
    ``dict`` of snake_case field names.  Returns the bytes **without** the
    4-byte size prefix unless ``framed=True``.

    For the KIP-511 downgrade (ApiVersions request newer than supported) call
    with ``api_version=0`` and ``error_code=35``.
    """
    cls = _message_class(_RESPONSES, api_key, api_version, correlation_id, "cannot encode response: ")
    try:
        if isinstance(body, Mapping):
            msg = _build(cls, body, api_version)
        elif isinstance(body, cls):
            msg = body
        else:
            raise TypeError(f"body must be a dict or {cls.__name__}, got {type(body).__name__}")
        # Order matters: kafka-python's API_VERSION setter touches
        # header.request_api_version, which a ResponseHeader lacks, so set the
        # version before attaching the header and don't pass version= to encode.
        msg._header = None
        msg.API_VERSION = api_version
        msg.with_header(correlation_id=correlation_id)
        out = msg.encode(header=True, framed=framed)
    except ProtocolError:
        raise
    except Exception as exc:  # noqa: BLE001 - re-raised with api key/version context
        raise ProtocolError(api_key, api_version, correlation_id,
                            f"cannot encode response: {exc!r}") from exc
    return bytes(out)


# ---------------------------------------------------------------------------
# Responses whose record sets stay in files


class ExternalRecords:
    """A record set the caller sends itself (e.g. a log file range for ``sendfile``): only its size is encoded.

    Anything with an integer ``size`` attribute that is not ``bytes`` can stand in a ``records`` field
    given to :func:`encode_response_parts`; subclassing this class is not required.
    """

    size: int


_BYTES_LIKE = (bytes, bytearray, memoryview)
_MARKER = b"\x00shale-records\x00" + bytes(range(200, 216))  # 32 bytes no real record set starts with


def _swap_external(value: Any, found: list[Any]) -> Any:
    """`value` with every external record set replaced by a unique placeholder of the marker's length."""
    if isinstance(value, Mapping):
        return {k: _swap_external(v, found) for k, v in value.items()}
    if isinstance(value, list):
        return [_swap_external(v, found) for v in value]
    if value is None or isinstance(value, (_BYTES_LIKE, str, int, float, bool, DataContainer)):
        return value
    if isinstance(getattr(value, "size", None), int):
        found.append(value)
        return _MARKER[:-4] + struct.pack(">I", len(found) - 1)
    return value


def encode_response_parts(api_key: int, api_version: int, correlation_id: int, body: Mapping[str, Any], *,
                          framed: bool = False) -> list[Any]:
    """:func:`reference_encode_response_parts`'s pieces, from the compiled or generated encoder when it takes the
    body."""
    out = _fast_encoding(api_key, api_version, correlation_id, body, framed)
    if out.__class__ is bytes:
        return [out]
    if out is not None:
        return _pieces(cast("list[Any]", out), framed)
    return reference_encode_response_parts(api_key, api_version, correlation_id, body, framed=framed)


def _pieces(parts: list[Any], framed: bool) -> list[Any]:
    """A generated encoder's parts as the reference cuts them: runs of bytes joined, around each external set."""
    pieces: list[Any] = []
    run: list[Any] = []
    total = 0
    for part in parts:
        if isinstance(part, _BYTES_LIKE):
            run.append(part)
            total += len(part)
        else:
            pieces.append(b"".join(run))
            pieces.append(part)
            total += part.size
            run = []
    pieces.append(b"".join(run))
    if framed:
        pieces[0] = _SIZE.pack(total) + pieces[0]
    return pieces


def reference_encode_response_parts(api_key: int, api_version: int, correlation_id: int,
                                    body: Mapping[str, Any], *, framed: bool = False) -> list[Any]:
    """:func:`reference_encode_response` as a list of ``bytes`` and the body's external record sets, in wire order.

    ``body`` is a dict as for :func:`encode_response`; any value with an integer ``size`` that is not
    bytes (see :class:`ExternalRecords`) must be a nullable-bytes field such as Fetch's ``records``. The
    response is encoded with a placeholder for each of them, then cut around the placeholders and given the
    real length prefix (int32, or unsigned varint of size + 1 in flexible versions). Writing the pieces in
    order, with ``size`` bytes for each external one, gives the same bytes as :func:`encode_response` with
    the record sets inline.
    """
    found: list[Any] = []
    swapped = _swap_external(body, found)
    out = reference_encode_response(api_key, api_version, correlation_id, swapped, framed=framed)
    if not found:
        return [out]
    compact = response_class(api_key).flexible_version_q(api_version)
    placeholder_len = len(_MARKER)
    old_prefix = encode_uvarint(placeholder_len + 1) if compact else struct.pack(">i", placeholder_len)
    parts: list[Any] = []
    pos = 0
    for i, ext in enumerate(found):
        marker = _MARKER[:-4] + struct.pack(">I", i)
        at = out.find(marker, pos)
        start = at - len(old_prefix)
        if at < 0 or out[start:at] != old_prefix or out.find(marker, at + 1) >= 0:
            raise ProtocolError(api_key, api_version, correlation_id,
                                "cannot encode response: an external record set is not in a bytes field")
        if ext.size < 0:
            raise ProtocolError(api_key, api_version, correlation_id,
                                f"cannot encode response: external record set of negative size {ext.size}")
        parts.append(out[pos:start] + (encode_uvarint(ext.size + 1) if compact else struct.pack(">i", ext.size)))
        parts.append(ext)
        pos = at + placeholder_len
    parts.append(out[pos:])
    if framed:
        total = sum(len(p) if isinstance(p, _BYTES_LIKE) else p.size for p in parts) - 4
        parts[0] = struct.pack(">i", total) + parts[0][4:]
    return parts
