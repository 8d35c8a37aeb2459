"""Kafka's JSON message definitions compiled to programs for the C codec (`_codec_kernel.c`), one per API and version.

Why: the generated Python codec (`generated_codec.py`) decodes a one-record Produce in a few µs and encodes its
answer in a few more, but on a server answering one small request at a time it runs with cold caches, and the
codec was a quarter of the instructions of such a request. Here the same schemas (kafka-python's parsed copies,
with its patches) become nested tuples that one C interpreter walks: nothing is written per API or version, in
Python or in C. The programs are built on first use, as the generated functions are.

The compiled functions do exactly what the generated ones do for the same schema and version - the same data
classes and values out of a request frame, the same bytes out of a response dict - and raise on anything the
generated ones would leave to the reference codec, plus a few rare forms they handle (an integer-like object
that is not an int, a UUID written as a string): `codec.py` then asks the generated Python, and the reference
after it. `tests/protocol/test_generated_codec.py` holds all three to the same values and bytes.

`available` is False when the extension was not built (a source checkout without `pip install -e .`): codec.py
then uses the generated Python alone.
"""

from __future__ import annotations

import functools
import struct
from typing import Any, Callable

from kafka.protocol.api_header import RequestHeader
from kafka.protocol.schemas.fields.codecs.types import (
    UUID,
    BitField,
    Boolean,
    Bytes,
    Float64,
    Int8,
    Int16,
    Int32,
    Int64,
    String,
    UnsignedInt16,
)

from .generated_codec import KIP511_HEADER_APIS, _codec_type, _kind, _tagged, _untagged, _uvarint

try:
    from . import _codec_kernel as _kernel
except ImportError:  # not built: codec.py uses the generated Python codec
    _kernel = None

available = _kernel is not None
Unhandled: type[Exception] = _kernel.Unhandled if _kernel is not None else ValueError
encode: Callable | None = _kernel.encode if _kernel is not None else None  # encode(program, flexible, head, body, framed)

__all__ = ["available", "request_decoder", "response_decoder", "response_encoder", "response_program", "Unhandled",
           "encode"]

# Field kinds, as the C interpreter numbers them (the K_* enum of _codec_kernel.c).
(KIND_INT8, KIND_INT16, KIND_UINT16, KIND_INT32, KIND_INT64, KIND_FLOAT64, KIND_BOOL, KIND_BITFIELD, KIND_UUID,
 KIND_STRING, KIND_BYTES, KIND_ARRAY, KIND_STRUCTS, KIND_STRUCT) = range(1, 15)

_SIMPLE = {Int8: KIND_INT8, Int16: KIND_INT16, UnsignedInt16: KIND_UINT16, Int32: KIND_INT32, Int64: KIND_INT64,
           Float64: KIND_FLOAT64, Boolean: KIND_BOOL, BitField: KIND_BITFIELD, UUID: KIND_UUID, Bytes: KIND_BYTES}

def _simple_kind(field) -> int:
    t = _codec_type(field)
    if isinstance(t, String):
        return KIND_STRING
    try:
        return _SIMPLE[t]
    except KeyError:
        raise TypeError(f"no compiled codec for field {field.name} of type {field.type_str}") from None


def _default(field) -> Any:
    """The schema default a missing key stands for, or the kernel's REQUIRED (a missing key is an error)."""
    try:
        return field.default
    except (NotImplementedError, ValueError):
        return _kernel.REQUIRED


def _field(field, version: int, owner: type) -> tuple:
    """(name, kind, sub, default, slot): sub is the struct program of a struct or struct array, the item's program
    of an array of simple values; slot is where instances of `owner`, the data class holding the field, keep it
    (-1: set with setattr)."""
    kind = _kind(field)
    slot = _kernel.slot_offset(owner, field.name)
    if kind == "struct":
        return field.name, KIND_STRUCT, _struct(field, field.data_class, version), _default(field), slot
    if kind == "structs":
        return field.name, KIND_STRUCTS, _struct(field.array_of, field.data_class, version), _default(field), slot
    if kind == "array":
        return field.name, KIND_ARRAY, (None, _simple_kind(field.array_of), None, None, -1), _default(field), slot
    return field.name, _simple_kind(field), None, _default(field), slot


def _struct(sf, data_class: type, version: int) -> tuple:
    """(data class, version, nullable, names, fields, tagged, single, base slots).

    `nullable`: a KIP-893 nullable struct in this version (a marker byte when nested); `names`: every field the
    schema knows (a dict key outside them is left to the reference, which names it); `tagged`: (tag, its uvarint,
    field program) of the tagged fields; `single`: the program of the only untagged field, whose value alone
    encodes an item of an array of these structs (the reference's way), else None; `base slots`: the slots of
    `_version`, `tags` and `unknown_tags`, which every decoded struct sets.
    """
    fields = tuple(_field(f, version, data_class) for f in _untagged(sf, version))
    tagged = []
    for f in _tagged(sf, version):
        program = _field(f, version, data_class)
        if program[3] is _kernel.REQUIRED:
            raise TypeError(f"tagged field {f.name} has no default")
        tagged.append((f.tag, _uvarint(f.tag), program))
    nullable = bool(sf.nullable_for_version_q(version))
    base = tuple(_kernel.slot_offset(data_class, name) for name in ("_version", "tags", "unknown_tags"))
    return (data_class, version, nullable, frozenset(sf.fields), fields, tuple(tagged),
            fields[0] if len(fields) == 1 else None, base)


@functools.cache
def request_decoder(message_class: type, version: int) -> Callable:
    """`decode(frame) -> (body, header)` for one request API version, as `generated_codec.request_decoder`."""
    flexible = bool(message_class.flexible_version_q(version))
    header = _struct(RequestHeader._struct, RequestHeader, 2 if flexible else 1)
    body = _struct(message_class._struct, message_class, version)
    return functools.partial(_kernel.decode_request, header, body, flexible)


@functools.cache
def response_decoder(message_class: type, version: int, views: bool = False) -> Callable:
    """`decode(data, pos) -> (body, end)` for one response API version, as `generated_codec.response_decoder`."""
    flexible = bool(message_class.flexible_version_q(version))
    body = _struct(message_class._struct, message_class, version)
    return functools.partial(_kernel.decode_body, body, flexible, views)


_CORRELATION = struct.Struct(">i")


@functools.cache
def response_encoder(message_class: type, version: int) -> Callable:
    """`encode(body, correlation_id, framed) -> bytes | parts` for one response API version, `body` a dict.

    The whole response (size-prefixed when `framed`) as one bytes object, or, when the body holds a record set
    still in a file (`codec.ExternalRecords`), `generated_codec.response_encoder`'s parts: [b"", bytes, the
    record set, bytes, ...], for the caller to frame.
    """
    body_program, flexible, tags = response_program(message_class, version)
    encode, head = _kernel.encode, _CORRELATION.pack

    def _encode(body: dict, correlation_id: int, framed: bool = False):
        return encode(body_program, flexible, head(correlation_id) + tags, body, framed)

    return _encode


@functools.cache
def response_program(message_class: type, version: int) -> tuple[tuple, bool, bytes]:
    """(body program, flexible, the header's bytes after the correlation id) of one response API version: what
    `_kernel.encode` takes, for a caller in C (the native Produce path) that writes the correlation id itself."""
    flexible = bool(message_class.flexible_version_q(version))
    tags = b"\x00" if flexible and message_class.API_KEY not in KIP511_HEADER_APIS else b""
    return _struct(message_class._struct, message_class, version), flexible, tags
