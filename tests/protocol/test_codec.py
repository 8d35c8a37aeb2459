"""Tests for the sans-I/O Kafka wire codec (shale.sidecar.protocol.codec).

Request frames are produced by the real clients' own encoders:
* kafka-python 3.0.12: ``req.with_header(...); req.encode(framed=True, header=True)``
  exactly as ``kafka/protocol/parser.py::KafkaProtocol.send_request`` does;
* aiokafka 0.14.0: ``Request.prepare(versions)`` + ``build_request_header`` +
  ``header.encode() + struct.encode()`` exactly as ``aiokafka/conn.py`` does.
aiokafka's protocol classes are hand-written (independent of Kafka's JSON), so
they also serve as an independent oracle for our encoded responses, parsed the
way ``aiokafka/conn.py::_handle_frame`` does.
"""

from __future__ import annotations

import io
import struct
import uuid

import pytest
from aiokafka.protocol.admin import ApiVersionRequest as AioApiVersionRequest
from aiokafka.protocol.fetch import FetchRequest as AioFetchRequest
from aiokafka.protocol.metadata import MetadataRequest as AioMetadataRequest
from aiokafka.protocol.produce import ProduceRequest as AioProduceRequest
from aiokafka.record.default_records import DefaultRecordBatchBuilder as AioBatchBuilder
from kafka.protocol.consumer.fetch import FetchRequest, FetchResponse
from kafka.protocol.metadata.api_versions import ApiVersionsRequest, ApiVersionsResponse
from kafka.protocol.metadata.metadata import MetadataRequest, MetadataResponse
from kafka.protocol.producer.produce import ProduceRequest, ProduceResponse
from kafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder

from shale.sidecar.protocol.codec import (
    SUPPORTED_VERSIONS,
    MalformedFrameError,
    ProtocolError,
    UnsupportedApiError,
    UnsupportedVersionError,
    decode_request,
    encode_response,
    request_class,
    response_class,
)

# The subset and ranges the broker must serve (kafka-protocol.md, "Protocol subset v1"),
# plus AlterConfigs / IncrementalAlterConfigs.
SPEC_RANGES = {
    18: (0, 4), 3: (0, 12), 0: (0, 11), 1: (4, 12), 2: (1, 7), 10: (0, 6), 11: (0, 9),
    14: (0, 5), 12: (0, 4), 13: (0, 5), 8: (2, 9), 9: (1, 9), 22: (0, 5), 19: (2, 7),
    32: (1, 4), 33: (0, 2), 44: (0, 1),
}
FLEXIBLE_FROM = {18: 3, 3: 9, 0: 9, 1: 12, 2: 6, 10: 3, 11: 6, 14: 4, 12: 4, 13: 4, 8: 8,
                 9: 6, 22: 2, 23: 4, 19: 5, 32: 4, 33: 2, 44: 1,
                 15: 5, 16: 3, 20: 4, 35: 2, 37: 2, 42: 2, 47: 1 << 15, 60: 0,
                 29: 2, 30: 2, 31: 2, 50: 0, 51: 0, 45: 0, 46: 0,
                 17: 1 << 15, 36: 2, 34: 2, 24: 3, 25: 3, 26: 3, 27: 1, 28: 3, 65: 0, 66: 0}  # OffsetDelete, SaslHandshake: never flexible


# --------------------------------------------------------------------------- helpers

def kp_frame(req, correlation_id: int = 17, client_id: str | None = "kp-client") -> bytes:
    """Exactly what kafka-python writes to the socket, minus the 4-byte size."""
    req.with_header(correlation_id=correlation_id, client_id=client_id)
    framed = bytes(req.encode(framed=True, header=True))
    (size,) = struct.unpack_from(">i", framed, 0)
    assert size == len(framed) - 4
    return framed[4:]


def aio_frame(builder, version: int, correlation_id: int = 23, client_id: str = "aio-client"):
    """Exactly what aiokafka writes (conn.py: header.encode() + request_struct.encode())."""
    req_struct = builder.prepare({builder.API_KEY: (version, version)})
    assert req_struct.API_VERSION == version
    header = req_struct.build_request_header(correlation_id=correlation_id, client_id=client_id)
    return header.encode() + req_struct.encode(), req_struct


def aio_parse_response(req_struct, payload: bytes):
    """Parse our response the way aiokafka.conn._handle_frame does."""
    buf = io.BytesIO(payload)
    header = req_struct.parse_response_header(buf)
    body = req_struct.RESPONSE_TYPE.decode(buf)
    assert buf.read() == b"", "aiokafka left unread bytes"
    return header, body


def kp_reencode(decoded, correlation_id, client_id) -> bytes:
    """Re-encode a decoded request with kafka-python (for byte-identical roundtrip)."""
    body = decoded.body
    body.with_header(correlation_id=correlation_id, client_id=client_id)
    return bytes(body.encode(version=decoded.api_version, header=True))


def record_batch(n: int = 3) -> bytes:
    b = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=0,
                                  producer_id=-1, producer_epoch=-1, base_sequence=-1,
                                  batch_size=1 << 20)
    for i in range(n):
        b.append(i, timestamp=1_700_000_000_000 + i, key=b"k%d" % i, value=b"v%d" % i, headers=[])
    return bytes(b.build())


def aio_record_batch(n: int = 2) -> bytes:
    b = AioBatchBuilder(magic=2, compression_type=0, is_transactional=0, producer_id=-1,
                        producer_epoch=-1, base_sequence=-1, batch_size=1 << 20)
    for i in range(n):
        b.append(i, timestamp=1_700_000_000_000 + i, key=None, value=b"aio%d" % i, headers=[])
    return bytes(b.build())


# --------------------------------------------------------------------------- coverage

def test_supported_versions_cover_spec_subset():
    for key, (lo, hi) in SPEC_RANGES.items():
        have = SUPPORTED_VERSIONS[key]
        assert have[0] <= lo and hi <= have[1], (key, have, (lo, hi))


ALL_VERSIONS = [(k, v) for k, (lo, hi) in sorted(SUPPORTED_VERSIONS.items()) for v in range(lo, hi + 1)]


@pytest.mark.parametrize("api_key,version", ALL_VERSIONS)
def test_every_api_version_roundtrips_with_defaults(api_key, version):
    """Schema-default request (kafka-python encoder) -> decode -> re-encode is byte-identical,
    header v1/v2 chosen by flexibility; default response encodes and kafka-python decodes it."""
    req = request_class(api_key)(version=version)
    frame = kp_frame(req, correlation_id=1000 + version, client_id="sweep")
    decoded = decode_request(frame)
    assert (decoded.api_key, decoded.api_version) == (api_key, version)
    assert decoded.correlation_id == 1000 + version
    assert decoded.client_id == "sweep"
    assert kp_reencode(decoded, 1000 + version, "sweep") == frame

    out = encode_response(api_key, version, 99, {})
    assert out[:4] == struct.pack(">i", 99)
    flexible = version >= FLEXIBLE_FROM[api_key]
    if flexible and api_key != 18:
        assert out[4] == 0  # response header v1: empty tag buffer
    back = response_class(api_key).decode(out, version=version, header=True)
    assert back.header.correlation_id == 99
    framed = encode_response(api_key, version, 99, {}, framed=True)
    assert framed == struct.pack(">i", len(out)) + out


def test_request_header_v2_client_id_is_legacy_string_and_null_client_id():
    req = MetadataRequest(version=12, topics=None, allow_auto_topic_creation=True)
    frame = kp_frame(req, correlation_id=5, client_id=None)
    # api_key, api_version, correlation_id, client_id int16 length -1 (NOT compact), then tag buffer
    assert frame[8:10] == b"\xff\xff" and frame[10] == 0
    decoded = decode_request(frame)
    assert decoded.client_id is None and decoded.body.topics is None


# --------------------------------------------------------------------------- ApiVersions

@pytest.mark.parametrize("version", range(0, 5))
def test_api_versions_kafka_python(version):
    req = ApiVersionsRequest(version=version, client_software_name="kafka-python",
                             client_software_version="3.0.12")
    frame = kp_frame(req, correlation_id=1)
    decoded = decode_request(frame)
    assert decoded.api_key == 18 and decoded.api_version == version
    if version >= 3:
        assert decoded.body.client_software_name == "kafka-python"
        assert decoded.body.client_software_version == "3.0.12"
    assert kp_reencode(decoded, 1, "kp-client") == frame

    api_keys = [{"api_key": k, "min_version": lo, "max_version": hi}
                for k, (lo, hi) in sorted(SPEC_RANGES.items())]
    out = encode_response(18, version, 1, {"error_code": 0, "api_keys": api_keys,
                                           "throttle_time_ms": 0})
    # ApiVersions response header is always v0 (no tag buffer), even for v3+:
    # the body's int16 error_code follows the correlation id directly.
    assert out[:6] == struct.pack(">ih", 1, 0)
    resp = ApiVersionsResponse.decode(out, version=version, header=True)  # kafka-python client path
    assert resp.header.correlation_id == 1
    assert [(k.api_key, k.min_version, k.max_version) for k in resp.api_keys] == \
        [(a["api_key"], a["min_version"], a["max_version"]) for a in api_keys]


@pytest.mark.parametrize("version", range(0, 3))
def test_api_versions_aiokafka(version):
    frame, req_struct = aio_frame(AioApiVersionRequest(), version)
    decoded = decode_request(frame)
    assert (decoded.api_key, decoded.api_version, decoded.correlation_id, decoded.client_id) == \
        (18, version, 23, "aio-client")
    out = encode_response(18, version, 23, {
        "error_code": 0, "throttle_time_ms": 0,
        "api_keys": [{"api_key": 0, "min_version": 0, "max_version": 11},
                     {"api_key": 1, "min_version": 4, "max_version": 12}]})
    header, body = aio_parse_response(req_struct, out)
    assert header.correlation_id == 23
    obj = body.to_object()
    assert obj["error_code"] == 0
    assert [tuple(a.values()) for a in obj["api_versions"]] == [(0, 0, 11), (1, 4, 12)]


def test_api_versions_too_new_kip511_downgrade():
    """ApiVersions v5 (unknown): header is still readable; error carries the correlation id,
    and a v0 error-35 response is what clients expect (KIP-511)."""
    req = ApiVersionsRequest(version=4, client_software_name="x", client_software_version="1")
    frame = bytearray(kp_frame(req, correlation_id=77))
    frame[2:4] = struct.pack(">h", 5)
    with pytest.raises(UnsupportedVersionError) as ei:
        decode_request(bytes(frame))
    err = ei.value
    assert (err.api_key, err.api_version, err.correlation_id) == (18, 5, 77)
    assert "api_key=18 (ApiVersions) api_version=5" in str(err)
    out = encode_response(18, 0, err.correlation_id, {
        "error_code": 35, "api_keys": [{"api_key": 18, "min_version": 0, "max_version": 4}]})
    resp = ApiVersionsResponse.decode(out, version=4, header=True)  # client decodes error body as v0
    assert resp.error_code == 35 and resp.api_keys[0].max_version == 4


# --------------------------------------------------------------------------- Metadata

METADATA_RESPONSE = {
    "throttle_time_ms": 0,
    "brokers": [{"node_id": 1, "host": "127.0.0.1", "port": 9092, "rack": None}],
    "cluster_id": "shale-cluster",
    "controller_id": 1,
    "topics": [{"error_code": 0, "name": "t", "topic_id": uuid.UUID(int=7), "is_internal": False,
                "partitions": [{"error_code": 0, "partition_index": 0, "leader_id": 1,
                                "leader_epoch": -1, "replica_nodes": [1], "isr_nodes": [1],
                                "offline_replicas": []}]}],
}


@pytest.mark.parametrize("version", range(0, 14))
@pytest.mark.parametrize("topics", [["t", "other"], None])
def test_metadata_kafka_python(version, topics):
    # built the way kafka/cluster.py::ClusterMetadata.metadata_request does
    req_topics = None if topics is None else [MetadataRequest.MetadataRequestTopic(name=t) for t in topics]
    req = MetadataRequest(version=version, topics=req_topics, allow_auto_topic_creation=False,
                          include_cluster_authorized_operations=False,
                          include_topic_authorized_operations=False)
    frame = kp_frame(req, correlation_id=3)
    decoded = decode_request(frame)
    got = decoded.body.topics
    if topics is None:
        assert got in (None, [])  # v0 encodes "all topics" as an empty array
    else:
        assert [t.name for t in got] == topics
    assert kp_reencode(decoded, 3, "kp-client") == frame
    out = encode_response(3, version, 3, METADATA_RESPONSE)
    resp = MetadataResponse.decode(out, version=version, header=True)
    assert resp.brokers[0].host == "127.0.0.1" and resp.topics[0].name == "t"
    assert resp.topics[0].partitions[0].leader_id == 1


@pytest.mark.parametrize("version", range(0, 6))
def test_metadata_aiokafka(version):
    frame, req_struct = aio_frame(AioMetadataRequest(["t"], allow_auto_topic_creation=False), version)
    decoded = decode_request(frame)
    assert [t.name for t in decoded.body.topics] == ["t"]
    if version >= 4:
        assert decoded.body.allow_auto_topic_creation is False
    header, body = aio_parse_response(req_struct, encode_response(3, version, 23, METADATA_RESPONSE))
    obj = body.to_object()
    assert header.correlation_id == 23
    assert obj["brokers"][0]["host"] == "127.0.0.1"
    topic = obj["topics"][0]
    assert topic.get("topic", topic.get("name")) == "t"


# --------------------------------------------------------------------------- Produce

@pytest.mark.parametrize("version", range(3, 14))
def test_produce_kafka_python_with_record_batch(version):
    batch = record_batch()
    topic = {"topic_id": uuid.UUID(int=42)} if version >= 13 else {"name": "t"}
    req = ProduceRequest(version=version, transactional_id=None, acks=-1, timeout_ms=1500, topic_data=[
        ProduceRequest.TopicProduceData(**topic, partition_data=[
            ProduceRequest.TopicProduceData.PartitionProduceData(index=0, records=batch)])])
    frame = kp_frame(req, correlation_id=9)
    decoded = decode_request(frame)
    assert decoded.expects_response
    records = decoded.body.topic_data[0].partition_data[0].records
    assert type(records) is bytes and records == batch  # raw, undecoded
    assert [r.value for r in DefaultRecordBatch(records)] == [b"v0", b"v1", b"v2"]
    assert kp_reencode(decoded, 9, "kp-client") == frame

    out = encode_response(0, version, 9, {"responses": [{**topic, "partition_responses": [
        {"index": 0, "error_code": 0, "base_offset": 100, "log_append_time_ms": -1,
         "log_start_offset": 0}]}], "throttle_time_ms": 0})
    resp = ProduceResponse.decode(out, version=version, header=True)
    assert resp.responses[0].partition_responses[0].base_offset == 100


@pytest.mark.parametrize("version", range(0, 8))
def test_produce_aiokafka(version):
    batch = aio_record_batch()
    frame, req_struct = aio_frame(AioProduceRequest(None, 1, 3000, [("t", [(0, batch)])]), version)
    decoded = decode_request(frame)
    body = decoded.body
    assert body.acks == 1 and body.timeout_ms == 3000
    assert body.topic_data[0].name == "t"
    assert body.topic_data[0].partition_data[0].records == batch
    out = encode_response(0, version, 23, {"responses": [{"name": "t", "partition_responses": [
        {"index": 0, "error_code": 0, "base_offset": 5, "log_append_time_ms": -1,
         "log_start_offset": 0}]}]})
    header, resp = aio_parse_response(req_struct, out)
    assert header.correlation_id == 23
    part = resp.to_object()["topics"][0]["partitions"][0]
    assert part["error_code"] == 0 and part["offset"] == 5


def test_produce_acks0_expects_no_response():
    frame, _ = aio_frame(AioProduceRequest(None, 0, 3000, [("t", [(0, aio_record_batch())])]), 7)
    assert decode_request(frame).expects_response is False


# --------------------------------------------------------------------------- Fetch

@pytest.mark.parametrize("version", range(4, 19))
def test_fetch_kafka_python(version):
    topic = {"topic_id": uuid.UUID(int=42)} if version >= 13 else {"topic": "t"}
    req = FetchRequest(version=version, replica_id=-1, max_wait_ms=500, min_bytes=1,
                       max_bytes=1 << 20, isolation_level=1, session_id=0, session_epoch=-1,
                       topics=[FetchRequest.FetchTopic(**topic, partitions=[
                           FetchRequest.FetchTopic.FetchPartition(
                               partition=0, fetch_offset=10, partition_max_bytes=1 << 20)])],
                       forgotten_topics_data=[], rack_id="")
    frame = kp_frame(req, correlation_id=11)
    decoded = decode_request(frame)
    assert decoded.body.topics[0].partitions[0].fetch_offset == 10
    assert decoded.body.isolation_level == 1
    assert kp_reencode(decoded, 11, "kp-client") == frame

    batch = record_batch()
    out = encode_response(1, version, 11, {"error_code": 0, "session_id": 0, "responses": [
        {**topic, "partitions": [{"partition_index": 0, "error_code": 0, "high_watermark": 13,
                                  "last_stable_offset": 13, "log_start_offset": 0,
                                  "aborted_transactions": None, "preferred_read_replica": -1,
                                  "records": batch}]}]})
    resp = FetchResponse.decode(out, version=version, header=True)
    part = resp.responses[0].partitions[0]
    assert part.high_watermark == 13 and bytes(part.records) == batch


@pytest.mark.parametrize("version", range(4, 12))
def test_fetch_aiokafka(version):
    frame, req_struct = aio_frame(AioFetchRequest(500, 1, 1 << 20, 0, [("t", [(0, 10, 1 << 20)])]),
                                  version)
    decoded = decode_request(frame)
    assert decoded.body.topics[0].topic == "t"
    assert decoded.body.topics[0].partitions[0].fetch_offset == 10
    batch = aio_record_batch()
    out = encode_response(1, version, 23, {"responses": [{"topic": "t", "partitions": [
        {"partition_index": 0, "error_code": 0, "high_watermark": 12, "last_stable_offset": 12,
         "log_start_offset": 0, "aborted_transactions": [], "preferred_read_replica": -1,
         "records": batch}]}]})
    header, resp = aio_parse_response(req_struct, out)
    assert header.correlation_id == 23
    topics = resp.to_object()["topics"]
    part = topics[0]["partitions"][0]
    assert part["highwater_offset"] == 12 and topics[0]["topics"] == "t"
    assert bytes(part["message_set"]) == batch


# --------------------------------------------------------------------------- errors

def _produce_frames():
    kp = kp_frame(ProduceRequest(version=9, transactional_id=None, acks=-1, timeout_ms=100,
                                 topic_data=[ProduceRequest.TopicProduceData(name="t", partition_data=[
                                     ProduceRequest.TopicProduceData.PartitionProduceData(
                                         index=0, records=record_batch(1))])]))
    aio, _ = aio_frame(AioProduceRequest(None, 1, 100, [("t", [(0, aio_record_batch(1))])]), 7)
    return {"flexible-v9": kp, "v7": aio}


@pytest.mark.parametrize("name", ["flexible-v9", "v7"])
def test_every_truncation_is_a_clear_error(name):
    frame = _produce_frames()[name]
    for cut in range(len(frame)):
        with pytest.raises(MalformedFrameError) as ei:
            decode_request(frame[:cut])
        if cut >= 8:
            assert ei.value.api_key == 0 and "api_key=0 (Produce)" in str(ei.value)
            assert ei.value.api_version in (7, 9)


@pytest.mark.parametrize("name", ["flexible-v9", "v7"])
def test_trailing_bytes_are_ignored_as_kafka_does(name):
    """Kafka's parser reads the body and ignores what follows; librdkafka's Metadata v13 relies on it."""
    frame = _produce_frames()[name]
    plain, padded = decode_request(frame), decode_request(frame + b"\x00\x01\x00")
    assert padded.body == plain.body and padded.correlation_id == plain.correlation_id


def test_bad_length_and_utf8_are_errors():
    base = kp_frame(MetadataRequest(version=4, topics=["t"], allow_auto_topic_creation=True))
    # client_id length says 0x7fff bytes
    bad = base[:8] + b"\x7f\xff" + base[10:]
    with pytest.raises(MalformedFrameError, match="api_key=3 \\(Metadata\\) api_version=4"):
        decode_request(bad)
    # topic name with invalid UTF-8 (same length)
    idx = base.rindex(b"t")
    with pytest.raises(MalformedFrameError):
        decode_request(base[:idx] + b"\xff" + base[idx + 1:])


def test_unknown_api_key_and_unsupported_versions():
    with pytest.raises(UnsupportedApiError, match="api_key=999") as ei:
        decode_request(struct.pack(">hhih", 999, 0, 5, -1))
    assert ei.value.correlation_id == 5
    # aiokafka can build Fetch v1-3; the schema starts at v4
    frame, _ = aio_frame(AioFetchRequest(500, 1, 1 << 20, 0, [("t", [(0, 0, 100)])]), 3)
    with pytest.raises(UnsupportedVersionError, match=r"api_key=1 \(Fetch\) api_version=3"):
        decode_request(frame)
    with pytest.raises(UnsupportedVersionError, match=r"api_key=3 \(Metadata\) api_version=14"):
        encode_response(3, 14, 1, {})
    with pytest.raises(UnsupportedApiError):
        encode_response(1000, 0, 1, {})


def test_bad_response_bodies_are_clear_errors():
    with pytest.raises(ProtocolError, match=r"api_key=0 \(Produce\) api_version=9"):
        encode_response(0, 9, 1, {"no_such_field": 1})
    with pytest.raises(ProtocolError, match=r"api_key=12 \(Heartbeat\) api_version=4"):
        encode_response(12, 4, 1, {"error_code": "not-an-int"})
    with pytest.raises(ProtocolError, match="body must be a dict"):
        encode_response(12, 4, 1, MetadataResponse(version=4))
    # typed objects of the right class are accepted too
    out = encode_response(12, 4, 1, response_class(12)(error_code=27))
    assert response_class(12).decode(out, version=4, header=True).error_code == 27


def test_unknown_header_tagged_fields_are_skipped_and_kept():
    # ApiVersions v3: header v2 with one unknown tag (5 -> b"x"), then the compact body
    frame = (struct.pack(">hhih", 18, 3, 9, 2) + b"ab" + bytes([1, 5, 1]) + b"x"
             + bytes([2]) + b"n" + bytes([2]) + b"v" + bytes([0]))
    decoded = decode_request(frame)
    assert decoded.client_id == "ab" and decoded.header_tags == {"_5": b"x"}
    assert decoded.body.client_software_name == "n" and decoded.body.client_software_version == "v"
