"""The values of KRaft's control records, decoded as Kafka reads them and written as its JSON converters write them.

Layouts are Kafka's JSON message schemas (clients/src/main/resources/common/message/):
LeaderChangeMessage (versions 0-1), SnapshotHeaderRecord, SnapshotFooterRecord, KRaftVersionRecord and
VotersRecord (version 0), all flexible from version 0: compact arrays and strings, tagged fields after
every struct. kafka-python ships only the request, response and consumer-protocol schemas, so these
five are decoded here. As Kafka's ControlRecordUtils, a value is always *read* at version 0, whatever
its own `Version` field says, and the JSON is *written* at that field's value (the generated
`...JsonConverter.write(message, message.version())`): fields of later versions then show their
defaults, and a version outside the schema's range is an error, as Kafka's UnsupportedVersionException.
Sans-I/O: bytes in, text out.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from typing import Any, Callable

from .errors import CorruptRecordError
from .message_reader import MessageReader
from .records import ControlType

_ZERO_UUID = bytes(16)
_JSON_SHORT_ESCAPES = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t"}


class ControlRecordError(CorruptRecordError):
    """A control record value that Kafka's generated reader or JSON writer would refuse."""


@dataclass(frozen=True)
class _Schema:
    """One control record value: Kafka's message name, its valid versions, its reader and JSON writer."""

    name: str
    label: str  # what DumpLogSegments prints before the JSON
    max_version: int
    read: Callable[[MessageReader], dict[str, Any]]
    write: Callable[[dict[str, Any], int], dict[str, Any]]


def _array(r: MessageReader, field: str, element: Callable[[MessageReader], dict[str, Any]]) -> list[dict[str, Any]]:
    """A compact array of structs (every schema here is flexible from version 0)."""
    return [element(r) for _ in range(r.array_length(True, field))]


def _read_voter_id(r: MessageReader) -> dict[str, Any]:
    voter = {"voterId": r.int32()}  # LeaderChangeMessage's Voter at version 0: VoterDirectoryId is 1+
    r.skip_tagged_fields()
    return voter


def _read_leader_change(r: MessageReader) -> dict[str, Any]:
    out = {"version": r.int16(), "leaderId": r.int32(), "voters": _array(r, "voters", _read_voter_id),
           "grantingVoters": _array(r, "grantingVoters", _read_voter_id)}
    r.skip_tagged_fields()
    return out


def _write_leader_change(m: dict[str, Any], version: int) -> dict[str, Any]:
    def voter(v: dict[str, Any]) -> dict[str, Any]:
        return {"voterId": v["voterId"], "voterDirectoryId": _uuid_text(_ZERO_UUID)} if version >= 1 else dict(v)

    return {"version": m["version"], "leaderId": m["leaderId"], "voters": [voter(v) for v in m["voters"]],
            "grantingVoters": [voter(v) for v in m["grantingVoters"]]}


def _read_snapshot_header(r: MessageReader) -> dict[str, Any]:
    out = {"version": r.int16(), "lastContainedLogTimestamp": r.int64()}
    r.skip_tagged_fields()
    return out


def _read_snapshot_footer(r: MessageReader) -> dict[str, Any]:
    out = {"version": r.int16()}
    r.skip_tagged_fields()
    return out


def _read_kraft_version(r: MessageReader) -> dict[str, Any]:
    out = {"version": r.int16(), "kRaftVersion": r.int16()}
    r.skip_tagged_fields()
    return out


def _read_endpoint(r: MessageReader) -> dict[str, Any]:
    out = {"name": r.string(True, "name"), "host": r.string(True, "host"), "port": r.uint16()}
    r.skip_tagged_fields()
    return out


def _read_voter(r: MessageReader) -> dict[str, Any]:
    voter_id, directory = r.int32(), _uuid_text(r.uuid())
    endpoints = _array(r, "endpoints", _read_endpoint)
    feature = {"minSupportedVersion": r.int16(), "maxSupportedVersion": r.int16()}
    r.skip_tagged_fields()
    out = {"voterId": voter_id, "voterDirectoryId": directory, "endpoints": endpoints, "kRaftVersionFeature": feature}
    r.skip_tagged_fields()
    return out


def _read_voters(r: MessageReader) -> dict[str, Any]:
    out = {"version": r.int16(), "voters": _array(r, "voters", _read_voter)}
    r.skip_tagged_fields()
    return out


def _as_read(m: dict[str, Any], version: int) -> dict[str, Any]:
    """Every field of these version-0-only messages is in version 0: the JSON is the message as read."""
    return m


_SCHEMAS = {
    ControlType.LEADER_CHANGE: _Schema("LeaderChangeMessage", "LeaderChange:", 1, _read_leader_change,
                                       _write_leader_change),
    ControlType.SNAPSHOT_HEADER: _Schema("SnapshotHeaderRecord", "SnapshotHeader", 0, _read_snapshot_header, _as_read),
    ControlType.SNAPSHOT_FOOTER: _Schema("SnapshotFooterRecord", "SnapshotFooter", 0, _read_snapshot_footer, _as_read),
    ControlType.KRAFT_VERSION: _Schema("KRaftVersionRecord", "KRaftVersion", 0, _read_kraft_version, _as_read),
    ControlType.KRAFT_VOTERS: _Schema("VotersRecord", "KRaftVoters", 0, _read_voters, _as_read),
}
KRAFT_CONTROL_TYPES = frozenset(_SCHEMAS)


def decode_value(control_type: ControlType, value: bytes | None) -> dict[str, Any]:
    """The value of a KRaft control record as Kafka's JSON converter writes it (field names in camelCase)."""
    schema = _SCHEMAS[control_type]
    if value is None:
        raise ControlRecordError(f"{schema.name}: the control record has no value")
    message = schema.read(MessageReader(value, schema.name, ControlRecordError, utf8_errors="replace"))
    version = message["version"]
    if not 0 <= version <= schema.max_version:
        raise ControlRecordError(f"Can't write version {version} of {schema.name}")
    return schema.write(message, version)


def describe(control_type: ControlType, value: bytes | None) -> str:
    """What Kafka's DumpLogSegments prints for a KRaft control record, e.g. `SnapshotHeader {"version":0,...}`."""
    return f"{_SCHEMAS[control_type].label} {to_json(decode_value(control_type, value))}"


def _uuid_text(raw: bytes) -> str:
    """Kafka's Uuid.toString: URL-safe base64 of the 16 bytes, without padding."""
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


def to_json(value: object) -> str:
    """Compact JSON as Jackson's `JsonNode.toString` writes it (its escapes: upper-case `\\u00XX` for controls)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return '"' + "".join(_JSON_SHORT_ESCAPES.get(c) or (f"\\u{ord(c):04X}" if ord(c) < 0x20 else c)
                             for c in value) + '"'
    if isinstance(value, list):
        return "[" + ",".join(to_json(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ",".join(f"{to_json(k)}:{to_json(v)}" for k, v in value.items()) + "}"
    raise TypeError(f"no JSON form for {type(value).__name__}")
