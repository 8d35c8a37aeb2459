"""Sans-I/O codec for the records of `__consumer_offsets`, in Apache Kafka's own byte layout.

Kafka's group coordinator keeps committed offsets and group metadata as keyed records in the compacted
`__consumer_offsets` topic; the layouts are the `*Key.json` / `*Value.json` message definitions in
`group-coordinator/src/main/resources/common/message/`. Writing the same bytes keeps our offsets topic
readable by Kafka's tooling (`kafka-console-consumer --formatter ...OffsetsMessageFormatter`,
`kafka-dump-log --offsets-decoder`) and lets a Kafka broker load it.

* key   = int16 key version + body: 0/1 = OffsetCommitKey{group, topic, partition} (Kafka writes 1),
          2 = GroupMetadataKey{group}; other versions (KIP-848/share-group records) decode to `UnknownKey`.
* value = int16 value version + body: OffsetCommitValue v0-4 or GroupMetadataValue v0-4; v4 is a
          "flexible" version (compact strings/arrays and tagged fields). A null value is a tombstone.

Strings are Kafka "string" fields: UTF-8, int16 length (-1 = null) in v0-3, unsigned-varint length+1 in
v4. Like Kafka's generated readers, decoding refuses truncated input but ignores trailing bytes.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

from ....log.message_reader import MessageReader
from ....log.varint import encode_uvarint

OFFSETS_TOPIC = "__consumer_offsets"

OFFSET_COMMIT_KEY_VERSION = 1  # what Kafka writes (0 is the pre-0.10 key with the same body)
GROUP_METADATA_KEY_VERSION = 2
OFFSET_COMMIT_VALUE_VERSION = 3  # Kafka 2.1+ without an explicit expire timestamp
OFFSET_COMMIT_VALUE_VERSION_WITH_EXPIRY = 1  # the only version carrying expireTimestamp (OffsetCommit v2-4 retention)
GROUP_METADATA_VALUE_VERSION = 3  # Kafka 2.3+ (groupInstanceId per member)
MAX_VALUE_VERSION = 4

_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")


class OffsetRecordError(ValueError):
    """Bytes that are not a valid `__consumer_offsets` key or value."""


# -- values ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class OffsetCommitKey:
    group: str
    topic: str
    partition: int


@dataclass(frozen=True, slots=True)
class GroupMetadataKey:
    group: str


@dataclass(frozen=True, slots=True)
class UnknownKey:
    """A record type this coordinator does not keep (e.g. KIP-848 consumer-group records): skipped on load."""

    version: int


@dataclass(frozen=True, slots=True)
class OffsetCommitValue:
    offset: int
    metadata: str
    commit_timestamp: int
    leader_epoch: int = -1  # v3+
    expire_timestamp: int = -1  # v1 only


@dataclass(frozen=True, slots=True)
class MemberMetadata:
    member_id: str
    client_id: str
    client_host: str
    session_timeout: int
    subscription: bytes
    assignment: bytes
    rebalance_timeout: int = -1  # v1+; Kafka reads a v0 member's rebalance timeout as its session timeout
    group_instance_id: str | None = None  # v3+


@dataclass(frozen=True, slots=True)
class GroupMetadataValue:
    protocol_type: str
    generation: int
    protocol: str | None
    leader: str | None
    members: tuple[MemberMetadata, ...] = field(default=())
    current_state_timestamp: int = -1  # v2+


# -- partitioning ---------------------------------------------------------------------------------------------


def java_string_hash(s: str) -> int:
    """Java's `String.hashCode()`: s[0]*31^(n-1) + ... over UTF-16 code units, in int32 arithmetic."""
    h = 0
    data = s.encode("utf-16-be", "surrogatepass")
    for i in range(0, len(data), 2):
        h = (31 * h + ((data[i] << 8) | data[i + 1])) & 0xFFFFFFFF
    return h - (1 << 32) if h >= 1 << 31 else h


def partition_for(group: str, partitions: int) -> int:
    """The `__consumer_offsets` partition of a group: `Utils.abs(group.hashCode()) % partitions`.

    Kafka's `Utils.abs` maps Integer.MIN_VALUE to 0 (Math.abs would leave it negative).
    """
    h = java_string_hash(group)
    return (0 if h == -(1 << 31) else abs(h)) % partitions


# -- primitive writers/readers ----------------------------------------------------------------------------------


def _string(s: str | None, flexible: bool, what: str) -> bytes:
    if s is None:
        return b"\x00" if flexible else _I16.pack(-1)
    raw = s.encode("utf-8")
    if len(raw) > 0x7FFF:
        raise OffsetRecordError(f"{what} is {len(raw)} bytes long; Kafka strings hold at most 32767")
    return (encode_uvarint(len(raw) + 1) if flexible else _I16.pack(len(raw))) + raw


def _bytes(b: bytes, flexible: bool) -> bytes:
    return (encode_uvarint(len(b) + 1) if flexible else _I32.pack(len(b))) + b


# -- keys -----------------------------------------------------------------------------------------------------


def encode_key(key: OffsetCommitKey | GroupMetadataKey, version: int | None = None) -> bytes:
    """A record key: Kafka writes offset commit keys as version 1 and group metadata keys as version 2."""
    if isinstance(key, OffsetCommitKey):
        v = OFFSET_COMMIT_KEY_VERSION if version is None else version
        if v not in (0, 1):
            raise OffsetRecordError(f"offset commit keys are versions 0 and 1, not {v}")
        return (_I16.pack(v) + _string(key.group, False, "group id") + _string(key.topic, False, "topic")
                + _I32.pack(key.partition))
    if isinstance(key, GroupMetadataKey):
        return _I16.pack(GROUP_METADATA_KEY_VERSION) + _string(key.group, False, "group id")
    raise TypeError(f"cannot encode {type(key).__name__} as a __consumer_offsets key")


def decode_key(data: bytes | memoryview) -> OffsetCommitKey | GroupMetadataKey | UnknownKey:
    r = MessageReader(data, "__consumer_offsets key", OffsetRecordError)
    version = r.int16()
    if version in (0, 1):
        return OffsetCommitKey(r.string(False, "group"), r.string(False, "topic"), r.int32())
    if version == 2:
        return GroupMetadataKey(r.string(False, "group"))
    return UnknownKey(version)


# -- offset commit values -------------------------------------------------------------------------------------


def encode_offset_commit_value(value: OffsetCommitValue, version: int | None = None) -> bytes:
    """Version 3 by default; version 1 when the commit carries an expire timestamp (as Kafka chooses)."""
    if version is None:
        expiring = value.expire_timestamp >= 0
        version = OFFSET_COMMIT_VALUE_VERSION_WITH_EXPIRY if expiring else OFFSET_COMMIT_VALUE_VERSION
    if not 0 <= version <= MAX_VALUE_VERSION:
        raise OffsetRecordError(f"offset commit values are versions 0-{MAX_VALUE_VERSION}, not {version}")
    flexible = version >= 4
    parts = [_I16.pack(version), _I64.pack(value.offset)]
    if version >= 3:
        parts.append(_I32.pack(value.leader_epoch))
    parts.append(_string(value.metadata, flexible, "offset metadata"))
    parts.append(_I64.pack(value.commit_timestamp))
    if version == 1:
        parts.append(_I64.pack(value.expire_timestamp))
    if flexible:
        parts.append(b"\x00")  # no tagged fields
    return b"".join(parts)


def decode_offset_commit_value(data: bytes | memoryview) -> OffsetCommitValue:
    r = MessageReader(data, "offset commit value", OffsetRecordError)
    version = r.int16()
    if not 0 <= version <= MAX_VALUE_VERSION:
        raise OffsetRecordError(f"unknown offset commit value version {version}")
    flexible = version >= 4
    offset = r.int64()
    leader_epoch = r.int32() if version >= 3 else -1
    metadata = r.string(flexible, "metadata")
    commit_timestamp = r.int64()
    expire_timestamp = r.int64() if version == 1 else -1
    if flexible:
        r.skip_tagged_fields()
    return OffsetCommitValue(offset, metadata, commit_timestamp, leader_epoch, expire_timestamp)


# -- group metadata values ------------------------------------------------------------------------------------


def encode_group_metadata_value(value: GroupMetadataValue, version: int = GROUP_METADATA_VALUE_VERSION) -> bytes:
    if not 0 <= version <= MAX_VALUE_VERSION:
        raise OffsetRecordError(f"group metadata values are versions 0-{MAX_VALUE_VERSION}, not {version}")
    flexible = version >= 4
    parts = [_I16.pack(version), _string(value.protocol_type, flexible, "protocol type"),
             _I32.pack(value.generation), _string(value.protocol, flexible, "protocol"),
             _string(value.leader, flexible, "leader")]
    if version >= 2:
        parts.append(_I64.pack(value.current_state_timestamp))
    parts.append(encode_uvarint(len(value.members) + 1) if flexible else _I32.pack(len(value.members)))
    for m in value.members:
        parts.append(_string(m.member_id, flexible, "member id"))
        if version >= 3:
            parts.append(_string(m.group_instance_id, flexible, "group instance id"))
        parts.append(_string(m.client_id, flexible, "client id"))
        parts.append(_string(m.client_host, flexible, "client host"))
        if version >= 1:
            parts.append(_I32.pack(m.rebalance_timeout))
        parts.append(_I32.pack(m.session_timeout))
        parts.append(_bytes(m.subscription, flexible))
        parts.append(_bytes(m.assignment, flexible))
        if flexible:
            parts.append(b"\x00")
    if flexible:
        parts.append(b"\x00")
    return b"".join(parts)


def decode_group_metadata_value(data: bytes | memoryview) -> GroupMetadataValue:
    r = MessageReader(data, "group metadata value", OffsetRecordError)
    version = r.int16()
    if not 0 <= version <= MAX_VALUE_VERSION:
        raise OffsetRecordError(f"unknown group metadata value version {version}")
    flexible = version >= 4
    protocol_type = r.string(flexible, "protocolType")
    generation = r.int32()
    protocol = r.string(flexible, "protocol", nullable=True)
    leader = r.string(flexible, "leader", nullable=True)
    current_state_timestamp = r.int64() if version >= 2 else -1
    members = []
    for _ in range(r.array_length(flexible, "members")):
        member_id = r.string(flexible, "memberId")
        instance_id = r.string(flexible, "groupInstanceId", nullable=True) if version >= 3 else None
        client_id = r.string(flexible, "clientId")
        client_host = r.string(flexible, "clientHost")
        rebalance_timeout = r.int32() if version >= 1 else None
        session_timeout = r.int32()
        subscription = r.bytes_(flexible, "subscription")
        assignment = r.bytes_(flexible, "assignment")
        if flexible:
            r.skip_tagged_fields()
        members.append(MemberMetadata(member_id, client_id, client_host, session_timeout, subscription, assignment,
                                      session_timeout if rebalance_timeout is None else rebalance_timeout,
                                      instance_id))
    if flexible:
        r.skip_tagged_fields()
    return GroupMetadataValue(protocol_type, generation, protocol, leader, tuple(members), current_state_timestamp)


def value_version(data: bytes | memoryview) -> int:
    if len(data) < 2:
        raise OffsetRecordError(f"value of {len(data)} bytes has no version")
    version: int = _I16.unpack_from(data, 0)[0]
    return version


# -- consumer protocol ----------------------------------------------------------------------------------------


def subscribed_topics(subscription: bytes) -> frozenset[str] | None:
    """The topics of a ConsumerProtocolSubscription (any version: v0 prefix = version, topics), or None.

    Kafka reads them to expire the offsets of topics a stable consumer group no longer subscribes to.
    """
    try:
        r = MessageReader(subscription, "consumer protocol subscription", OffsetRecordError)
        if r.int16() < 0:
            return None
        return frozenset(r.string(False, "topics") for _ in range(r.array_length(False, "topics")))
    except OffsetRecordError:
        return None
