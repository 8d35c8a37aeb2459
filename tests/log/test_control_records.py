"""KRaft control record values: golden bytes laid out by hand from Kafka's JSON schemas, and round trips.

The encoder here is written from the schemas (LeaderChangeMessage.json, SnapshotHeaderRecord.json,
SnapshotFooterRecord.json, KRaftVersionRecord.json, VotersRecord.json), independently of the decoder:
flexible version 0, so compact arrays and strings (length + 1 as an unsigned varint) and a tagged-field
count after every struct.
"""

from __future__ import annotations

import base64
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shale.sidecar.log.control_records import KRAFT_CONTROL_TYPES, ControlRecordError, decode_value, describe, to_json
from shale.sidecar.log.records import ControlType
from shale.sidecar.log.varint import encode_uvarint

# (control type, value hex, the JSON Kafka's DumpLogSegments prints after the record's metadata)
GOLDEN = [
    (ControlType.SNAPSHOT_HEADER, "0000" "0000018bcfe56800" "00",
     'SnapshotHeader {"version":0,"lastContainedLogTimestamp":1700000000000}'),
    (ControlType.SNAPSHOT_FOOTER, "0000" "00", 'SnapshotFooter {"version":0}'),
    (ControlType.KRAFT_VERSION, "0000" "0001" "00", 'KRaftVersion {"version":0,"kRaftVersion":1}'),
    (ControlType.KRAFT_VOTERS,
     "0000" "02"  # version 0, one voter
     "00000001" "0102030405060708090a0b0c0d0e0f10"  # voter id 1, directory id
     "02" "0b" + b"CONTROLLER".hex() + "0a" + b"localhost".hex() + "2385" "00"  # one endpoint, port 9093
     "0000" "0001" "00"  # kRaftVersionFeature 0..1
     "00" "00",  # the voter's and the record's tagged fields
     'KRaftVoters {"version":0,"voters":[{"voterId":1,"voterDirectoryId":"AQIDBAUGBwgJCgsMDQ4PEA",'
     '"endpoints":[{"name":"CONTROLLER","host":"localhost","port":9093}],'
     '"kRaftVersionFeature":{"minSupportedVersion":0,"maxSupportedVersion":1}}]}'),
    (ControlType.LEADER_CHANGE,
     "0000" "00000001" "04" "0000000100" "0000000200" "0000000300" "03" "0000000100" "0000000200" "00",
     'LeaderChange: {"version":0,"leaderId":1,"voters":[{"voterId":1},{"voterId":2},{"voterId":3}],'
     '"grantingVoters":[{"voterId":1},{"voterId":2}]}'),
    # Version 1 of LeaderChangeMessage is read at version 0 (ControlRecordUtils) and written at 1: the
    # voters' directory ids are then the default, Uuid.ZERO.
    (ControlType.LEADER_CHANGE, "0001" "00000002" "02" "0000000200" "01" "00",
     'LeaderChange: {"version":1,"leaderId":2,"voters":[{"voterId":2,"voterDirectoryId":"AAAAAAAAAAAAAAAAAAAAAA"}],'
     '"grantingVoters":[]}'),
    # An unknown tagged field (tag 5, two bytes) is skipped, as Kafka keeps it aside and never prints it.
    (ControlType.SNAPSHOT_FOOTER, "0000" "01" "05" "02" "abcd", 'SnapshotFooter {"version":0}'),
]


@pytest.mark.parametrize("ctype,value,text", GOLDEN)
def test_golden_values_print_as_kafka_prints_them(ctype, value, text) -> None:
    assert describe(ctype, bytes.fromhex(value)) == text


@pytest.mark.parametrize("ctype,value,error", [
    (ControlType.SNAPSHOT_HEADER, "0001" "0000018bcfe56800" "00", "Can't write version 1 of SnapshotHeaderRecord"),
    (ControlType.LEADER_CHANGE, "0002" "00000001" "01" "01" "00", "Can't write version 2 of LeaderChangeMessage"),
    (ControlType.SNAPSHOT_HEADER, "0000" "0000018b", "SnapshotHeaderRecord: value ends at byte 6"),
    (ControlType.KRAFT_VOTERS, "0000" "00" "00", "non-nullable field voters was serialized as null"),
    (ControlType.KRAFT_VERSION, None, "KRaftVersionRecord: the control record has no value"),
])
def test_values_kafka_would_refuse_are_errors(ctype, value, error) -> None:
    with pytest.raises(ControlRecordError, match=error):
        decode_value(ctype, None if value is None else bytes.fromhex(value))


def test_json_escapes_as_jackson() -> None:
    assert (to_json({"host": 'a"b\\c\n\x01é', "ok": True, "n": -1})
            == '{"host":"a\\"b\\\\c\\n\\u0001é","ok":true,"n":-1}')


# -- round trips through an encoder written from the schemas ---------------------------------------

def _string(s: str) -> bytes:
    raw = s.encode()
    return encode_uvarint(len(raw) + 1) + raw


def _array(items: list[bytes]) -> bytes:
    return encode_uvarint(len(items) + 1) + b"".join(items)


def _encode_voters(voters: list[dict]) -> bytes:
    def voter(v: dict) -> bytes:
        endpoints = [_string(e["name"]) + _string(e["host"]) + struct.pack(">H", e["port"]) + b"\x00"
                     for e in v["endpoints"]]
        feature = v["kRaftVersionFeature"]
        return (struct.pack(">i", v["voterId"]) + base64.urlsafe_b64decode(v["voterDirectoryId"] + "==")
                + _array(endpoints) + struct.pack(">hh", feature["minSupportedVersion"],
                                                  feature["maxSupportedVersion"]) + b"\x00" + b"\x00")

    return struct.pack(">h", 0) + _array([voter(v) for v in voters]) + b"\x00"


names = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=20)
int16 = st.integers(-(2**15), 2**15 - 1)
endpoint = st.fixed_dictionaries({"name": names, "host": names, "port": st.integers(0, 65535)})
voter = st.fixed_dictionaries({
    "voterId": st.integers(-(2**31), 2**31 - 1),
    "voterDirectoryId": st.binary(min_size=16, max_size=16).map(
        lambda b: base64.urlsafe_b64encode(b).rstrip(b"=").decode()),
    "endpoints": st.lists(endpoint, max_size=3),
    "kRaftVersionFeature": st.fixed_dictionaries({"minSupportedVersion": int16, "maxSupportedVersion": int16}),
})


@settings(max_examples=200, deadline=None)
@given(st.lists(voter, max_size=4))
def test_voters_record_round_trip(voters) -> None:
    assert decode_value(ControlType.KRAFT_VOTERS, _encode_voters(voters)) == {"version": 0, "voters": voters}


@settings(max_examples=200, deadline=None)
@given(st.integers(-(2**31), 2**31 - 1), st.lists(st.integers(-(2**31), 2**31 - 1), max_size=5),
       st.lists(st.integers(-(2**31), 2**31 - 1), max_size=5))
def test_leader_change_round_trip(leader, voters, granting) -> None:
    def ids(xs: list[int]) -> bytes:
        return _array([struct.pack(">i", x) + b"\x00" for x in xs])

    value = struct.pack(">hi", 0, leader) + ids(voters) + ids(granting) + b"\x00"
    assert decode_value(ControlType.LEADER_CHANGE, value) == {
        "version": 0, "leaderId": leader, "voters": [{"voterId": x} for x in voters],
        "grantingVoters": [{"voterId": x} for x in granting]}


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(sorted(KRAFT_CONTROL_TYPES)), st.binary(max_size=64))
def test_any_bytes_decode_or_raise_a_control_record_error(ctype, value) -> None:
    try:
        describe(ctype, value)
    except ControlRecordError:
        pass
