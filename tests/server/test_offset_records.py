"""The `__consumer_offsets` record codec against Kafka's layout: golden bytes, round trips, an independent oracle.

The oracle is kafka-python's schema-driven encoder (the one its client uses for every request) fed with
Kafka's own message definitions from `group-coordinator/src/main/resources/common/message/`
(OffsetCommitKey.json, GroupMetadataKey.json, OffsetCommitValue.json, GroupMetadataValue.json; the
field lists below are theirs, the coordinator-key "type" is given as "data" because kafka-python only
builds "data" messages). kafka-python ships no `__consumer_offsets` parser of its own.
"""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kafka.protocol.consumer.metadata import ConsumerProtocolSubscription

from shale.sidecar.server.coordinator.group.offset_records import (
    GroupMetadataKey,
    GroupMetadataValue,
    MemberMetadata,
    OffsetCommitKey,
    OffsetCommitValue,
    OffsetRecordError,
    UnknownKey,
    decode_group_metadata_value,
    decode_key,
    decode_offset_commit_value,
    encode_group_metadata_value,
    encode_key,
    encode_offset_commit_value,
    java_string_hash,
    partition_for,
    subscribed_topics,
)
from support.kafka_schema_util import message_classes

# -- Kafka's message definitions (field lists as in the JSON files) -----------------------------------------

KAFKA_SCHEMAS = {
    "OffsetCommitKey": {"type": "data", "name": "OffsetCommitKey", "validVersions": "0", "flexibleVersions": "none",
                        "fields": [{"name": "group", "type": "string", "versions": "0"},
                                   {"name": "topic", "type": "string", "versions": "0"},
                                   {"name": "partition", "type": "int32", "versions": "0"}]},
    "GroupMetadataKey": {"type": "data", "name": "GroupMetadataKey", "validVersions": "0", "flexibleVersions": "none",
                         "fields": [{"name": "group", "type": "string", "versions": "0"}]},
    "OffsetCommitValue": {
        "type": "data", "name": "OffsetCommitValue", "validVersions": "0-4", "flexibleVersions": "4+",
        "fields": [{"name": "offset", "type": "int64", "versions": "0+"},
                   {"name": "leaderEpoch", "type": "int32", "versions": "3+", "default": -1, "ignorable": True},
                   {"name": "metadata", "type": "string", "versions": "0+"},
                   {"name": "commitTimestamp", "type": "int64", "versions": "0+"},
                   {"name": "expireTimestamp", "type": "int64", "versions": "1", "default": -1, "ignorable": True}]},
    "GroupMetadataValue": {
        "type": "data", "name": "GroupMetadataValue", "validVersions": "0-4", "flexibleVersions": "4+",
        "fields": [{"name": "protocolType", "versions": "0+", "type": "string"},
                   {"name": "generation", "versions": "0+", "type": "int32"},
                   {"name": "protocol", "versions": "0+", "type": "string", "nullableVersions": "0+"},
                   {"name": "leader", "versions": "0+", "type": "string", "nullableVersions": "0+"},
                   {"name": "currentStateTimestamp", "versions": "2+", "type": "int64", "default": -1,
                    "ignorable": True},
                   {"name": "members", "versions": "0+", "type": "[]MemberMetadata"}],
        "commonStructs": [{"name": "MemberMetadata", "versions": "0+", "fields": [
            {"name": "memberId", "versions": "0+", "type": "string"},
            {"name": "groupInstanceId", "versions": "3+", "type": "string", "default": "null",
             "nullableVersions": "3+", "ignorable": True},
            {"name": "clientId", "versions": "0+", "type": "string"},
            {"name": "clientHost", "versions": "0+", "type": "string"},
            {"name": "rebalanceTimeout", "versions": "1+", "type": "int32", "ignorable": True},
            {"name": "sessionTimeout", "versions": "0+", "type": "int32"},
            {"name": "subscription", "versions": "0+", "type": "bytes"},
            {"name": "assignment", "versions": "0+", "type": "bytes"}]}]},
}


@pytest.fixture(scope="module")
def kafka():
    return message_classes(KAFKA_SCHEMAS)


# -- golden bytes ---------------------------------------------------------------------------------------------


def test_offset_commit_key_golden_bytes():
    # OffsetCommitKey as Kafka writes it: int16 key version 1, then the v0 body of OffsetCommitKey.json:
    # group "g" = int16 length 1 + 'g' (0x67), topic "t" = 0001 74, partition int32 3.
    golden = bytes.fromhex("0001" "0001" "67" "0001" "74" "00000003")
    assert encode_key(OffsetCommitKey("g", "t", 3)) == golden
    assert decode_key(golden) == OffsetCommitKey("g", "t", 3)
    assert decode_key(bytes.fromhex("0000" "0001" "67" "0001" "74" "00000003")) == OffsetCommitKey("g", "t", 3)


def test_group_metadata_key_golden_bytes():
    # int16 key version 2, group "grp" = 0003 677270.
    golden = bytes.fromhex("0002" "0003" "677270")
    assert encode_key(GroupMetadataKey("grp")) == golden
    assert decode_key(golden) == GroupMetadataKey("grp")


def test_offset_commit_value_v3_golden_bytes():
    # OffsetCommitValue.json v3: int16 version 3, offset int64 42, leaderEpoch int32 5 (3+),
    # metadata string "m" (int16 length + UTF-8), commitTimestamp int64 1000; no expireTimestamp (v1 only).
    golden = bytes.fromhex("0003" "000000000000002a" "00000005" "0001" "6d" "00000000000003e8")
    value = OffsetCommitValue(offset=42, metadata="m", commit_timestamp=1000, leader_epoch=5)
    assert encode_offset_commit_value(value) == golden
    assert decode_offset_commit_value(golden) == value


def test_offset_commit_value_v1_carries_the_expire_timestamp_and_v4_is_flexible():
    # v1: offset, metadata, commitTimestamp, expireTimestamp; no leaderEpoch (3+).
    v1 = bytes.fromhex("0001" "000000000000002a" "0001" "6d" "00000000000003e8" "0000000000000bb8")
    value = OffsetCommitValue(offset=42, metadata="m", commit_timestamp=1000, expire_timestamp=3000)
    assert encode_offset_commit_value(value) == v1  # an expire timestamp makes Kafka write version 1
    assert decode_offset_commit_value(v1) == value
    # v4 (flexible): the metadata is a compact string (unsigned varint length+1 = 02) and the value ends
    # with an empty tagged-field section (00).
    v4 = bytes.fromhex("0004" "000000000000002a" "00000005" "02" "6d" "00000000000003e8" "00")
    value4 = OffsetCommitValue(offset=42, metadata="m", commit_timestamp=1000, leader_epoch=5)
    assert encode_offset_commit_value(value4, version=4) == v4
    assert decode_offset_commit_value(v4) == value4
    # A v4 value with an unknown tagged field (tag 7, 2 bytes) still reads: tags are skipped.
    tagged = v4[:-1] + bytes.fromhex("01" "07" "02" "abcd")
    assert decode_offset_commit_value(tagged) == value4


def test_group_metadata_value_v3_golden_bytes():
    # GroupMetadataValue.json v3: protocolType "consumer", generation 1, protocol "range", leader "m-1",
    # currentStateTimestamp int64 (2+), members int32 count 1; member: memberId "m-1", groupInstanceId null
    # (int16 -1, 3+), clientId "c", clientHost "/h", rebalanceTimeout 300000 (1+), sessionTimeout 10000,
    # subscription bytes (int32 length) 0102, assignment bytes 03.
    golden = bytes.fromhex(
        "0003" "0008" + b"consumer".hex() + "00000001" "0005" + b"range".hex() + "0003" + b"m-1".hex()
        + "0000000000000064" "00000001"
        "0003" + b"m-1".hex() + "ffff" "0001" "63" "0002" + b"/h".hex() + "000493e0" "00002710"
        "00000002" "0102" "00000001" "03")
    value = GroupMetadataValue("consumer", 1, "range", "m-1", (
        MemberMetadata("m-1", "c", "/h", 10000, b"\x01\x02", b"\x03", 300000, None),), 100)
    assert encode_group_metadata_value(value) == golden
    assert decode_group_metadata_value(golden) == value


def test_empty_group_metadata_has_null_protocol_and_leader():
    value = GroupMetadataValue("consumer", 4, None, None, (), 123)
    raw = encode_group_metadata_value(value)
    assert raw == bytes.fromhex("0003" "0008" + b"consumer".hex() + "00000004" "ffff" "ffff" "000000000000007b"
                                "00000000")
    assert decode_group_metadata_value(raw) == value


def test_group_metadata_v0_reads_the_session_timeout_as_rebalance_timeout():
    value = GroupMetadataValue("consumer", 2, "range", "a", (MemberMetadata("a", "c", "h", 7000, b"s", b"x"),))
    decoded = decode_group_metadata_value(encode_group_metadata_value(value, version=0))
    assert decoded.members[0].rebalance_timeout == 7000
    assert decoded.current_state_timestamp == -1


def test_bad_input_is_refused_with_a_message():
    with pytest.raises(OffsetRecordError, match="truncated"):
        decode_offset_commit_value(bytes.fromhex("0003" "0000"))
    with pytest.raises(OffsetRecordError, match="version 9"):
        decode_offset_commit_value(bytes.fromhex("0009") + bytes(30))
    with pytest.raises(OffsetRecordError, match="truncated"):
        decode_key(bytes.fromhex("0001" "0005" "6162"))
    with pytest.raises(OffsetRecordError, match="32767"):
        encode_key(OffsetCommitKey("g" * 40000, "t", 0))
    # KIP-848 and share-group records use other key versions: recognised as not ours, not an error.
    assert decode_key(bytes.fromhex("0003" "0001" "67")) == UnknownKey(3)


# -- round trips ------------------------------------------------------------------------------------------------

names = st.text(max_size=40)
int32 = st.integers(-(2**31), 2**31 - 1)
int64 = st.integers(-(2**63), 2**63 - 1)
blobs = st.binary(max_size=64)

members = st.builds(MemberMetadata, member_id=names, client_id=names, client_host=names, session_timeout=int32,
                    subscription=blobs, assignment=blobs, rebalance_timeout=int32,
                    group_instance_id=st.none() | names)
group_values = st.builds(GroupMetadataValue, protocol_type=names, generation=int32, protocol=st.none() | names,
                         leader=st.none() | names, members=st.lists(members, max_size=4).map(tuple),
                         current_state_timestamp=int64)
commit_values = st.builds(OffsetCommitValue, offset=int64, metadata=names, commit_timestamp=int64,
                          leader_epoch=int32, expire_timestamp=int64)


def _as_of(value: OffsetCommitValue, version: int) -> OffsetCommitValue:
    """What a version keeps of a value: the fields it lacks read back as their defaults."""
    return OffsetCommitValue(value.offset, value.metadata, value.commit_timestamp,
                             value.leader_epoch if version >= 3 else -1,
                             value.expire_timestamp if version == 1 else -1)


def _group_as_of(value: GroupMetadataValue, version: int) -> GroupMetadataValue:
    return GroupMetadataValue(
        value.protocol_type, value.generation, value.protocol, value.leader,
        tuple(MemberMetadata(m.member_id, m.client_id, m.client_host, m.session_timeout, m.subscription, m.assignment,
                             m.rebalance_timeout if version >= 1 else m.session_timeout,
                             m.group_instance_id if version >= 3 else None) for m in value.members),
        value.current_state_timestamp if version >= 2 else -1)


@given(group=names, topic=names, partition=int32, version=st.sampled_from([0, 1]))
def test_offset_commit_key_round_trip(group, topic, partition, version):
    key = OffsetCommitKey(group, topic, partition)
    assert decode_key(encode_key(key, version)) == key


@given(group=names)
def test_group_metadata_key_round_trip(group):
    assert decode_key(encode_key(GroupMetadataKey(group))) == GroupMetadataKey(group)


@given(value=commit_values, version=st.integers(0, 4))
def test_offset_commit_value_round_trip(value, version):
    assert decode_offset_commit_value(encode_offset_commit_value(value, version)) == _as_of(value, version)


@given(value=group_values, version=st.integers(0, 4))
def test_group_metadata_value_round_trip(value, version):
    assert decode_group_metadata_value(encode_group_metadata_value(value, version)) == _group_as_of(value, version)


# -- the oracle: Kafka's definitions through kafka-python's encoder -------------------------------------------


@settings(max_examples=60)
@given(group=names, topic=names, partition=int32)
def test_keys_match_kafkas_definitions(kafka, group, topic, partition):
    body = kafka["OffsetCommitKey"](version=0, group=group, topic=topic, partition=partition).encode(header=False)
    assert encode_key(OffsetCommitKey(group, topic, partition)) == struct.pack(">h", 1) + bytes(body)
    body = kafka["GroupMetadataKey"](version=0, group=group).encode(header=False)
    assert encode_key(GroupMetadataKey(group)) == struct.pack(">h", 2) + bytes(body)


@settings(max_examples=100)
@given(value=commit_values, version=st.integers(0, 4))
def test_offset_commit_values_match_kafkas_definitions(kafka, value, version):
    cls = kafka["OffsetCommitValue"]
    theirs = bytes(cls(version=version, offset=value.offset, leader_epoch=value.leader_epoch, metadata=value.metadata,
                       commit_timestamp=value.commit_timestamp,
                       expire_timestamp=value.expire_timestamp).encode(version=version))
    assert encode_offset_commit_value(value, version) == theirs
    back = cls.decode(encode_offset_commit_value(value, version))
    assert (back.offset, back.metadata, back.commit_timestamp) == (value.offset, value.metadata,
                                                                    value.commit_timestamp)


@settings(max_examples=100)
@given(value=group_values, version=st.integers(0, 4))
def test_group_metadata_values_match_kafkas_definitions(kafka, value, version):
    cls = kafka["GroupMetadataValue"]
    member_cls = cls._struct.fields["members"].data_class
    theirs = cls(version=version, protocol_type=value.protocol_type, generation=value.generation,
                 protocol=value.protocol, leader=value.leader,
                 current_state_timestamp=value.current_state_timestamp,
                 members=[member_cls(member_id=m.member_id, group_instance_id=m.group_instance_id,
                                     client_id=m.client_id, client_host=m.client_host,
                                     rebalance_timeout=m.rebalance_timeout, session_timeout=m.session_timeout,
                                     subscription=m.subscription, assignment=m.assignment)
                          for m in value.members])
    assert encode_group_metadata_value(value, version) == bytes(theirs.encode(version=version))


# -- partitioning -----------------------------------------------------------------------------------------------


def test_java_string_hash_matches_java():
    assert java_string_hash("") == 0
    assert java_string_hash("foo") == 101574  # Kafka's GroupCoordinatorServiceTest partitions "foo" with it
    assert java_string_hash("\U0001F600") == 0xD83D * 31 + 0xDE00  # UTF-16 surrogate pair, as Java sees it
    assert java_string_hash("polygenelubricants") == -(2**31)  # the famous Integer.MIN_VALUE hash


def test_partition_for_uses_kafkas_abs():
    # Math.abs(Integer.MIN_VALUE) is negative; Kafka's Utils.abs makes it 0, so the group lands on partition 0.
    assert partition_for("polygenelubricants", 50) == 0
    assert partition_for("foo", 50) == 101574 % 50
    assert partition_for("console-consumer-1", 50) == abs(java_string_hash("console-consumer-1")) % 50


@given(st.text(max_size=30), st.integers(1, 200))
def test_partition_for_is_java_arithmetic(group, partitions):
    h = 0
    for unit in struct.unpack(f">{len(group.encode('utf-16-be', 'surrogatepass')) // 2}H",
                              group.encode("utf-16-be", "surrogatepass")):
        h = (h * 31 + unit) % 2**32
    signed = h - 2**32 if h >= 2**31 else h
    assert partition_for(group, partitions) == (0 if signed == -(2**31) else abs(signed)) % partitions


# -- consumer protocol ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("version", [0, 1, 2, 3])
def test_subscribed_topics_of_every_subscription_version(version):
    raw = ConsumerProtocolSubscription(version=version, topics=["a", "b"], user_data=b"x", owned_partitions=[],
                                       generation_id=-1, rack_id=None).encode(version=version)
    assert subscribed_topics(bytes(raw)) == frozenset({"a", "b"})
    assert subscribed_topics(b"\x00") is None  # not a subscription: no topics known, nothing expires
