"""The compiled codec (`compiled_codec`, C) and the generated one (`generated_codec`, Python) against the
reference (kafka-python's, `codec.reference_*`).

For every API and version served: request frames as kafka-python's client writes them decode to equal values
(the same data classes, field by field, tagged and unknown tags included) and response bodies as handlers
write them (dicts, fields left out for their defaults, nulls, empty arrays, tagged fields) encode to the same
bytes. The compiled and generated functions are called directly, so a fallback to the next path cannot hide
a difference.
"""

from __future__ import annotations

import re
import struct
import uuid

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from kafka.protocol.consumer.fetch import FetchRequest
from schema_values import ALL_VERSIONS, SCALARS, assert_same_value, struct_dicts, valid_frames

from shale.sidecar.protocol import client_codec, codec, compiled_codec, generated_codec

PROPERTY = settings(deadline=None, max_examples=12,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def test_the_compiled_codec_is_built():
    assert compiled_codec.available, "the C codec is not built (pip install -e . compiles it)"


def with_header_tags(frame: bytes, client_id: str | None, tags: list[tuple[int, bytes]]) -> bytes:
    """The frame with unknown tagged fields in its request header v2 (kafka-python writes none)."""
    at = 10 + (len(client_id.encode()) if client_id is not None else 0)
    assert frame[at] == 0
    buffer = bytes([len(tags)]) + b"".join(bytes([tag, len(value)]) + value for tag, value in tags)
    return frame[:at] + buffer + frame[at + 1:]


# -- requests -------------------------------------------------------------------------------------------


@pytest.mark.timeout(600)
@pytest.mark.parametrize("api_key,version", ALL_VERSIONS)
@PROPERTY
@given(data=st.data())
def test_requests_decode_to_the_reference_values(api_key, version, data):
    key, ver, correlation_id, client_id, frame = data.draw(valid_frames(api_key, version))
    cls = codec.request_class(key)
    if cls.flexible_version_q(ver) and data.draw(st.booleans()):
        tags = data.draw(st.lists(st.tuples(st.integers(0, 120), st.binary(max_size=5)), max_size=2,
                                  unique_by=lambda t: t[0]))
        frame = with_header_tags(frame, client_id, sorted(tags))
    ref = codec.reference_decode_request(frame)
    for decoder in (generated_codec.request_decoder(cls, ver), compiled_codec.request_decoder(cls, ver)):
        body, header = decoder(memoryview(frame))
        assert_same_value(body, ref.body)
        assert_same_value(header, ref.body._header, "header")
        assert body._header is header
        assert (header.correlation_id, header.client_id) == (correlation_id, client_id)
    # and through the public entry point, which builds the Request
    fast = codec.decode_request(frame)
    assert (fast.api_key, fast.api_version, fast.correlation_id, fast.client_id, fast.header_tags) == (
        ref.api_key, ref.api_version, ref.correlation_id, ref.client_id, ref.header_tags)
    assert_same_value(fast.body, ref.body)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("api_key,version", ALL_VERSIONS)
@PROPERTY
@given(data=st.data())
def test_requests_encode_to_the_reference_bytes(api_key, version, data):
    """The client side (`client_codec`, a follower's requests): a dict body, the same frame as kafka-python's."""
    body = data.draw(struct_dicts(codec.request_class(api_key), version))
    correlation_id = data.draw(SCALARS["int32"])
    client_id = data.draw(st.none() | st.text(max_size=20))
    try:
        ref = client_codec.reference_encode_request(api_key, version, correlation_id, client_id, body)
    except codec.ProtocolError:
        ref = None
    parts = generated_codec.request_encoder(codec.request_class(api_key), version)(body, correlation_id, client_id)
    assert parts[0] == b""
    assert struct.pack(">i", sum(map(len, parts))) + b"".join(parts) == ref
    assert client_codec.encode_request(api_key, version, correlation_id, client_id, body) == ref


def test_known_tagged_fields_of_a_request_decode_into_their_fields():
    """Fetch v12+ carries tagged fields (ClusterId, ReplicaState): decoded into the fields, named in `tags`."""
    req = FetchRequest(version=15, cluster_id="c1", replica_state=FetchRequest.ReplicaState(replica_id=3,
                                                                                             replica_epoch=7),
                       max_wait_ms=5, min_bytes=1, topics=[])
    req.with_header(correlation_id=5, client_id="t")
    frame = bytes(req.encode(header=True))
    for decoder in (generated_codec.request_decoder(FetchRequest, 15), compiled_codec.request_decoder(FetchRequest, 15)):
        body, _ = decoder(frame)
        assert body.cluster_id == "c1" and body.replica_state.replica_id == 3 and body.tags == {"cluster_id",
                                                                                                "replica_state"}
        assert_same_value(body, codec.reference_decode_request(frame).body)


@pytest.mark.parametrize("cut", [1, 3, 11, 25])
def test_a_truncated_frame_is_left_to_the_reference(cut):
    req = FetchRequest(version=12, max_wait_ms=5, min_bytes=1, topics=[
        FetchRequest.FetchTopic(topic="t", partitions=[FetchRequest.FetchTopic.FetchPartition(partition=0)])])
    req.with_header(correlation_id=5, client_id="t")
    frame = bytes(req.encode(header=True))[:-cut]
    with pytest.raises(Exception):
        generated_codec.request_decoder(FetchRequest, 12)(frame)
    with pytest.raises(compiled_codec.Unhandled, match="truncated"):
        compiled_codec.request_decoder(FetchRequest, 12)(frame)
    with pytest.raises(codec.MalformedFrameError, match="correlation_id=5"):
        codec.decode_request(frame)


# -- responses ------------------------------------------------------------------------------------------


@pytest.mark.timeout(600)
@pytest.mark.parametrize("api_key,version", ALL_VERSIONS)
@PROPERTY
@given(data=st.data())
def test_responses_encode_to_the_reference_bytes(api_key, version, data):
    body = data.draw(struct_dicts(codec.response_class(api_key), version))
    correlation_id = data.draw(SCALARS["int32"])
    try:
        ref = codec.reference_encode_response(api_key, version, correlation_id, body)
    except codec.ProtocolError:
        ref = None
    parts = generated_codec.response_encoder(codec.response_class(api_key), version)(body, correlation_id)
    assert parts[0] == b""
    assert b"".join(parts) == ref
    compiled = compiled_codec.response_encoder(codec.response_class(api_key), version)
    assert compiled(body, correlation_id, False) == ref
    assert compiled(body, correlation_id, True) == struct.pack(">i", len(ref)) + ref
    framed = codec.encode_response(api_key, version, correlation_id, body, framed=True)
    assert framed == struct.pack(">i", len(ref)) + ref


def body_start(api_key: int, version: int) -> int:
    """Where a response body starts: past the correlation id and (flexible, but not ApiVersions) the empty
    header tags the encoders write."""
    flexible = codec.response_class(api_key).flexible_version_q(version)
    return 5 if flexible and api_key not in generated_codec.KIP511_HEADER_APIS else 4


@pytest.mark.timeout(600)
@pytest.mark.parametrize("api_key,version", ALL_VERSIONS)
@PROPERTY
@given(data=st.data())
def test_responses_decode_to_the_reference_values(api_key, version, data):
    """The client side (`client_codec.decode_response`): a response frame decodes to the reference's values, bytes
    fields as copies or, with `views`, as views of the same bytes; the generated decoder is called directly."""
    cls = codec.response_class(api_key)
    body = data.draw(struct_dicts(cls, version))
    try:
        frame = codec.reference_encode_response(api_key, version, data.draw(SCALARS["int32"]), body)
    except codec.ProtocolError:
        assume(False)  # a body the reference cannot encode (a value out of its range) is no frame to decode
    flexible = cls.flexible_version_q(version)
    data_view = memoryview(bytearray(frame))
    ref, ref_end = cls._struct.compiled_decode_from(version, compact=flexible, tagged=flexible, data_class=cls)(
        memoryview(frame), body_start(api_key, version))
    assert ref_end == len(frame)
    views = data.draw(st.booleans())
    for decoder in (generated_codec.response_decoder(cls, version, views),
                    compiled_codec.response_decoder(cls, version, views)):
        fast, end = decoder(data_view, body_start(api_key, version))
        assert end == len(frame)
        assert_same_value(fast, ref, views=views)


def test_a_response_decoded_with_views_holds_no_copy_of_its_records():
    """With `views`, a Fetch answer's records are a slice of the frame's own buffer: what the buffer holds
    later is what they read (so a caller that reuses the buffer must be done with them first)."""
    frame = bytearray(codec.encode_response(1, 12, 3, {"responses": [{"topic": "t", "partitions": [
        {"partition_index": 0, "records": b"abc"}, {"partition_index": 1, "records": None}]}]}))
    cls = codec.response_class(1)
    for module in (generated_codec, compiled_codec):
        data = bytearray(frame)
        copied, _ = module.response_decoder(cls, 12)(memoryview(data), 5)
        viewed, _ = module.response_decoder(cls, 12, True)(memoryview(data), 5)
        a, b = viewed.responses[0].partitions
        assert a.records.obj is data and bytes(a.records) == b"abc" and b.records is None
        at = data.index(b"abc")
        data[at:at + 3] = b"xyz"
        assert bytes(a.records) == b"xyz"
        kept = copied.responses[0].partitions[0].records
        assert type(kept) is bytes and kept == b"abc"


@pytest.mark.parametrize("version", [9, 10, 11])
def test_tagged_fields_nulls_and_empty_arrays_of_a_produce_response(version):
    """Produce v10+ answers NOT_LEADER with the leader in tagged fields (CurrentLeader, NodeEndpoints)."""
    body = {"responses": [{"name": "t", "partition_responses": [
        {"index": 0, "error_code": 6, "base_offset": -1, "error_message": None, "record_errors": [],
         "current_leader": {"leader_id": 2, "leader_epoch": 4}},
        {"index": 1, "error_code": 0, "base_offset": 7, "error_message": "", "record_errors": [
            {"batch_index": 0, "batch_index_error_message": None}]}]}],
        "throttle_time_ms": 0, "node_endpoints": [{"node_id": 2, "host": "h", "port": 9092, "rack": None}]}
    ref = codec.reference_encode_response(0, version, 77, body)
    assert b"".join(generated_codec.response_encoder(codec.response_class(0), version)(body, 77)) == ref
    assert compiled_codec.response_encoder(codec.response_class(0), version)(body, 77) == ref
    back = codec.response_class(0).decode(ref, version=version, header=True)
    first, second = back.responses[0].partition_responses
    assert first.error_message is None and second.error_message == "" and first.record_errors == []
    assert second.record_errors[0].batch_index_error_message is None
    if version >= 10:  # tagged fields: written because they differ from their defaults
        assert (first.current_leader.leader_id, first.current_leader.leader_epoch) == (2, 4)
        assert second.current_leader is None  # left out: the default (a tagged struct is null)
        assert [(n.node_id, n.host, n.port) for n in back.node_endpoints] == [(2, "h", 9092)]


def test_api_versions_response_header_is_v0_in_flexible_versions():
    body = {"error_code": 0, "api_keys": [{"api_key": 0, "min_version": 0, "max_version": 11}]}
    out = codec.encode_response(18, 3, 9, body)
    assert out == codec.reference_encode_response(18, 3, 9, body)
    assert out[:6] == struct.pack(">ih", 9, 0)  # correlation id, then the body's error code: no header tag buffer


def test_metadata_omitted_authorized_operations_and_topic_ids():
    body = {"throttle_time_ms": 0, "brokers": [], "cluster_id": None, "controller_id": 1, "topics": [
        {"error_code": 0, "name": "t", "topic_id": uuid.uuid4(), "partitions": [], "authorized_operations": None},
        {"error_code": 3, "name": None, "partitions": [], "authorized_operations": {3, 4}}],
        "authorized_operations": None}
    for version in range(0, 13):
        assert codec.encode_response(3, version, 1, body) == codec.reference_encode_response(3, version, 1, body)


@pytest.mark.parametrize("body", [
    {"responses": [], "no_such_field": 1},                                    # unknown field
    {"responses": [{"name": 5, "partition_responses": []}]},                 # a number where a string goes
    {"responses": [("t", [])]},                                              # tuples: the reference's shapes
    {"responses": None, "throttle_time_ms": None},                           # None for an int32
])
def test_bodies_the_generated_encoder_leaves_get_the_reference_answer(body):
    with pytest.raises(Exception):
        generated_codec.response_encoder(codec.response_class(0), 9)(body, 1)
    with pytest.raises(Exception):
        compiled_codec.response_encoder(codec.response_class(0), 9)(body, 1)
    try:
        expected = codec.reference_encode_response(0, 9, 1, body)
    except codec.ProtocolError as exc:
        with pytest.raises(codec.ProtocolError, match=re.escape(exc.reason)):
            codec.encode_response(0, 9, 1, body)
    else:
        assert codec.encode_response(0, 9, 1, body) == expected


class External:
    def __init__(self, data: bytes) -> None:
        self.data, self.size = data, len(data)


@pytest.mark.parametrize("version", [4, 11, 12, 16])
@given(sizes=st.lists(st.integers(0, 300), min_size=1, max_size=3), framed=st.booleans())
@settings(deadline=None, max_examples=20)
def test_fetch_parts_are_cut_as_the_reference_cuts_them(version, sizes, framed):
    datas = [bytes([i]) * n for i, n in enumerate(sizes)]
    body = {"responses": [{"topic": "t", "partitions": [
        {"partition_index": i, "high_watermark": 9, "records": External(d)} for i, d in enumerate(datas)]}]}
    ref = codec.reference_encode_response_parts(1, version, 3, body, framed=framed)
    fast = codec.encode_response_parts(1, version, 3, body, framed=framed)
    shape = lambda parts: [p if isinstance(p, bytes) else ("external", p.data) for p in parts]  # noqa: E731
    assert shape(fast) == shape(ref)
    compiled = compiled_codec.response_encoder(codec.response_class(1), version)(body, 3, framed)
    assert shape(codec._pieces(compiled, framed)) == shape(ref)
