"""The client side of the codec (shale.sidecar.protocol.client_codec): what a follower sends is what a node
decodes, and what a node answers is what a follower reads back — including record sets sent by `sendfile`."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shale.sidecar.protocol.client_codec import decode_response, encode_request
from shale.sidecar.protocol.codec import (
    MalformedFrameError,
    ProtocolError,
    UnsupportedVersionError,
    decode_request,
    encode_response,
    encode_response_parts,
)

FETCH, LIST_OFFSETS = 1, 2
INT32 = st.integers(-(2**31), 2**31 - 1)
INT64 = st.integers(-(2**63), 2**63 - 1)
NAMES = st.text(st.characters(min_codepoint=33, max_codepoint=0x2FFF), min_size=1, max_size=20)

FETCH_PARTITION = st.fixed_dictionaries({
    "partition": st.integers(0, 2**31 - 1), "current_leader_epoch": INT32, "fetch_offset": INT64,
    "last_fetched_epoch": INT32, "log_start_offset": INT64, "partition_max_bytes": INT32,
})
FETCH_REQUEST = st.fixed_dictionaries({
    "replica_id": st.integers(0, 2**31 - 1), "max_wait_ms": INT32, "min_bytes": INT32, "max_bytes": INT32,
    "isolation_level": st.integers(0, 1), "session_id": st.just(0), "session_epoch": st.just(-1),
    "topics": st.lists(st.fixed_dictionaries({"topic": NAMES, "partitions": st.lists(FETCH_PARTITION, max_size=4)}),
                       max_size=4),
    "forgotten_topics_data": st.just([]), "rack_id": st.just(""),
})


def assert_carries(decoded, want, where="body"):
    """Every field of `want` (nested dicts and lists of dicts) has its value in the decoded message."""
    if isinstance(want, dict):
        for key, value in want.items():
            assert_carries(getattr(decoded, key), value, f"{where}.{key}")
    elif isinstance(want, list):
        assert len(decoded) == len(want), where
        for i, (got, value) in enumerate(zip(decoded, want)):
            assert_carries(got, value, f"{where}[{i}]")
    else:
        assert decoded == want, where


@settings(max_examples=150, deadline=None)
@given(FETCH_REQUEST, st.integers(0, 2**31 - 1), st.text(max_size=30))
def test_a_fetch_request_decodes_on_the_node_as_sent(body, correlation_id, client_id):
    frame = encode_request(FETCH, 12, correlation_id, client_id, body)
    assert struct.unpack(">i", frame[:4])[0] == len(frame) - 4
    request = decode_request(frame[4:])
    assert (request.api_key, request.api_version, request.correlation_id, request.client_id) == (
        FETCH, 12, correlation_id, client_id)
    assert_carries(request.body, body)


RECORDS = st.one_of(st.none(), st.binary(max_size=300))
FETCH_PARTITION_DATA = st.fixed_dictionaries({
    "partition_index": st.integers(0, 2**31 - 1), "error_code": st.integers(-1, 120),
    "high_watermark": INT64, "last_stable_offset": INT64, "log_start_offset": INT64,
    "diverging_epoch": st.one_of(st.none(), st.fixed_dictionaries({"epoch": INT32, "end_offset": INT64})),
    "records": RECORDS,
})
FETCH_RESPONSE = st.fixed_dictionaries({
    "throttle_time_ms": INT32, "error_code": st.integers(-1, 120), "session_id": st.just(0),
    "responses": st.lists(st.fixed_dictionaries({"topic": NAMES,
                                                 "partitions": st.lists(FETCH_PARTITION_DATA, max_size=3)}),
                          max_size=3),
})


@settings(max_examples=150, deadline=None)
@given(FETCH_RESPONSE, st.integers(0, 2**31 - 1))
def test_a_fetch_answer_reads_back_as_the_node_wrote_it(body, correlation_id):
    response = decode_response(FETCH, 12, encode_response(FETCH, 12, correlation_id, body))
    assert response.correlation_id == correlation_id
    assert_carries(response.body, body)


class FileRange:
    """A record set the node sends from its file (`ExternalRecords` duck type): only its size is encoded."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.size = len(data)


@pytest.mark.parametrize("version", [4, 11, 12])
def test_an_answer_sent_in_pieces_around_file_ranges_reads_back_whole(version):
    records = [b"\x01" * 50, b"\x02" * 7000]
    body = {"responses": [{"topic": "t", "partitions": [
        {"partition_index": i, "high_watermark": 9, "records": FileRange(r)} for i, r in enumerate(records)]}]}
    parts = encode_response_parts(FETCH, version, 5, body, framed=True)
    wire = b"".join(p if isinstance(p, bytes) else p.data for p in parts)
    assert struct.unpack(">i", wire[:4])[0] == len(wire) - 4
    response = decode_response(FETCH, version, wire[4:])
    assert [p.records for p in response.body.responses[0].partitions] == records


def test_list_offsets_as_a_follower_asks_it():
    body = {"replica_id": 3, "isolation_level": 0, "topics": [{"name": "orders", "partitions": [
        {"partition_index": 2, "current_leader_epoch": 7, "timestamp": -1}]}]}
    request = decode_request(encode_request(LIST_OFFSETS, 7, 11, "shale-replica-3", body)[4:])
    assert request.body.replica_id == 3
    assert request.body.topics[0].partitions[0].current_leader_epoch == 7
    answer = {"topics": [{"name": "orders", "partitions": [
        {"partition_index": 2, "error_code": 0, "timestamp": -1, "offset": 42, "leader_epoch": 7}]}]}
    decoded = decode_response(LIST_OFFSETS, 7, encode_response(LIST_OFFSETS, 7, 11, answer))
    assert decoded.body.topics[0].partitions[0].offset == 42


def fetch_answer_frame() -> bytes:
    return encode_response(FETCH, 12, 9, {"responses": [{"topic": "t", "partitions": [
        {"partition_index": 0, "high_watermark": 3, "records": b"x" * 40}]}]})


@pytest.mark.parametrize("views", [False, True])
def test_a_cut_answer_is_refused_naming_the_api(views):
    frame = fetch_answer_frame()
    for cut in (3, 10, len(frame) - 1):
        with pytest.raises(MalformedFrameError) as info:
            decode_response(FETCH, 12, bytearray(frame[:cut]), views=views)
        assert "Fetch" in str(info.value)


def test_records_are_views_into_the_frame_only_when_asked():
    """A follower asks for views (its records are appended from the frame's buffer); every other caller gets
    bytes, which it may keep or `.decode()` (SCRAM's server messages are SaslAuthenticate bytes)."""
    frame = bytearray(fetch_answer_frame())
    viewed = decode_response(FETCH, 12, frame, views=True).body.responses[0].partitions[0].records
    copied = decode_response(FETCH, 12, frame).body.responses[0].partitions[0].records
    assert type(viewed) is memoryview and viewed.obj is frame and viewed == b"x" * 40
    assert type(copied) is bytes and copied == b"x" * 40
    auth = decode_response(36, 2, encode_response(36, 2, 4, {"auth_bytes": b"r=abc,s=c2FsdA==,i=4096"})).body
    assert auth.auth_bytes.decode() == "r=abc,s=c2FsdA==,i=4096"


def test_bytes_after_the_answer_are_refused():
    with pytest.raises(MalformedFrameError, match="ends at byte"):
        decode_response(FETCH, 12, fetch_answer_frame() + b"\x00")


def test_versions_outside_the_served_range_are_refused_both_ways():
    with pytest.raises(UnsupportedVersionError):
        encode_request(FETCH, 3, 1, None, {})
    with pytest.raises(UnsupportedVersionError):
        decode_response(FETCH, 99, fetch_answer_frame())


def test_an_unknown_field_is_a_protocol_error_not_a_silent_default():
    with pytest.raises(ProtocolError, match="fetch_ofset"):
        encode_request(FETCH, 12, 1, None, {"topics": [{"topic": "t", "partitions": [{"fetch_ofset": 3}]}]})


@settings(max_examples=50, deadline=None)
@given(FETCH_RESPONSE, st.integers(0, 2**31 - 1),
       st.lists(st.tuples(st.integers(0, 120), st.binary(max_size=300)), min_size=1, max_size=20,
                unique_by=lambda t: t[0]))
def test_an_answer_whose_header_carries_tagged_fields_reads_as_one_without(body, correlation_id, tags):
    """Flexible headers end with tagged fields; a node writes none (read without the reference), another
    writer may (read by the reference, even past its 4 KiB header prefix)."""
    plain = encode_response(FETCH, 12, correlation_id, body)
    assert plain[4] == 0  # no header tags, as a node writes it
    buffer = bytes([len(tags)])
    for tag, value in sorted(tags):
        buffer += bytes([tag]) + _uvarint(len(value)) + value
    tagged = plain[:4] + buffer + plain[5:]
    response = decode_response(FETCH, 12, tagged)
    assert response.correlation_id == correlation_id
    assert_carries(response.body, body)
    assert_carries(decode_response(FETCH, 12, plain).body, body)


def _uvarint(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def test_an_api_versions_answer_has_an_untagged_header_in_flexible_versions():
    """KIP-511: the ApiVersions response header is v0 in every version, so its body starts after the id."""
    frame = encode_response(18, 3, 7, {"error_code": 0, "api_keys": [
        {"api_key": 1, "min_version": 4, "max_version": 12}], "throttle_time_ms": 0})
    response = decode_response(18, 3, frame)
    assert response.correlation_id == 7 and response.body.error_code == 0
    assert [(k.api_key, k.min_version, k.max_version) for k in response.body.api_keys] == [(1, 4, 12)]
