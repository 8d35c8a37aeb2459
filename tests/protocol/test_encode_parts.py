"""`codec.encode_response_parts`: a Fetch response cut around record sets that go out with sendfile."""

from __future__ import annotations

import os
from dataclasses import dataclass

import pytest
from kafka.protocol.consumer.fetch import FetchResponse

from shale.sidecar.protocol import codec


@dataclass(frozen=True)
class External:
    """Stands in for a record set still in its segment file: only its size is known to the codec."""

    data: bytes

    @property
    def size(self) -> int:
        return len(self.data)


def fetch_body(records: list) -> dict:
    def part(index: int, hw: int, recs) -> dict:
        return {"partition_index": index, "error_code": 0, "high_watermark": hw, "last_stable_offset": hw,
                "log_start_offset": 0, "records": recs}

    return {"throttle_time_ms": 0, "error_code": 0, "session_id": 0, "responses": [
        {"topic": "t", "partitions": [part(0, 10, records[0]), part(1, 5, records[1])]},
        {"topic": "u", "partitions": [part(0, 5, records[2])]}]}


@pytest.mark.parametrize("version", range(4, 19))
@pytest.mark.parametrize("framed", [False, True])
@pytest.mark.parametrize("sizes", [(0, 1, 200), (300, 0, 70000), (5, 127, 128)])
def test_parts_join_to_the_inline_encoding(version, framed, sizes):
    datas = [os.urandom(n) for n in sizes]
    inline = codec.encode_response(1, version, 42, fetch_body(datas), framed=framed)
    parts = codec.encode_response_parts(1, version, 42, fetch_body([External(d) for d in datas]), framed=framed)
    assert [type(p) for p in parts[1::2]] == [External] * 3
    joined = b"".join(p if isinstance(p, (bytes, bytearray)) else p.data for p in parts)
    assert joined == inline
    back = FetchResponse.decode(joined[4:] if framed else joined, version=version, header=True)
    assert back.responses[1].partitions[0].records == datas[2]


def test_a_body_without_external_record_sets_is_one_piece():
    body = fetch_body([b"a", None, b"c"])
    assert codec.encode_response_parts(1, 12, 1, body) == [codec.encode_response(1, 12, 1, body)]


def test_an_external_value_outside_a_bytes_field_is_an_error():
    with pytest.raises(codec.ProtocolError):
        codec.encode_response_parts(1, 12, 1, {"responses": [{"topic": External(b"xx"), "partitions": []}]})
