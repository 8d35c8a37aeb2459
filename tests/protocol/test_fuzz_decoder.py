"""Fuzzing `codec.decode_request`: whatever bytes a peer sends, it returns a Request or raises ProtocolError.

The server closes a connection on ProtocolError; any other exception would escape its connection task,
and a hang would stall the connection's event loop. Valid frames come from kafka-python's request classes
(the bytes its client writes), with field values drawn from each message's own schema, for every API and
version the codec supports; an unmutated frame must decode and re-encode to the same bytes. The C decoder
(`compiled_codec`) is also held to the generated Python one on the same damaged frames.
"""

from __future__ import annotations

import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schema_values import ALL_VERSIONS, SCALARS, assert_same_value, valid_frames

from shale.sidecar.protocol import codec, compiled_codec, generated_codec

FUZZ = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def _decode_or_protocol_error(frame: bytes) -> codec.Request | None:
    """The property: a Request, or ProtocolError (returned as None); any other exception fails the test."""
    try:
        request = codec.decode_request(frame)
    except codec.ProtocolError:
        return None
    assert isinstance(request, codec.Request)
    assert (request.api_key, request.api_version) == struct.unpack_from(">hh", frame)
    return request


@st.composite
def mutated(draw, frame: bytes) -> bytes:
    """One to three mutations: bit flips, truncation, insertion, deletion, or a length-like field set to an extreme."""
    data = bytearray(frame)
    for _ in range(draw(st.integers(1, 3))):
        op = draw(st.sampled_from(["flip", "truncate", "insert", "delete", "length"]))
        # Mostly behind the api key, version and correlation id, so the mutation reaches a body decoder.
        lo = 0 if draw(st.integers(0, 9)) == 0 else min(8, len(data))
        at = draw(st.integers(lo, max(len(data) - 1, lo)))
        if op == "flip" and at < len(data):
            data[at] ^= 1 << draw(st.integers(0, 7))
        elif op == "truncate":
            del data[at:]
        elif op == "insert":
            data[at:at] = draw(st.binary(min_size=1, max_size=16))
        elif op == "delete" and at < len(data):
            del data[at:at + draw(st.integers(1, 8))]
        elif op == "length":
            value = draw(st.sampled_from([-1, -2, 0, 1, 0x7F, 0x80, 0x7FFF, 0x8000, 0xFFFF, 0x7FFFFFFF, -(2**31)]))
            fmt = draw(st.sampled_from([">h", ">i", ">b", "varint"]))
            if fmt == "varint":  # compact lengths in flexible versions are unsigned varints
                encoded = bytes([0xFF, 0xFF, 0xFF, 0xFF, 0x0F]) if value < 0 else _uvarint(value)
            else:
                encoded = struct.pack(fmt, max(min(value, 2 ** (8 * struct.calcsize(fmt) - 1) - 1),
                                               -(2 ** (8 * struct.calcsize(fmt) - 1))))
            data[at:at + len(encoded)] = encoded
    return bytes(data)


def _uvarint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


# -- properties --------------------------------------------------------------------------------------


@pytest.mark.timeout(300)
@pytest.mark.parametrize("api_key,version", ALL_VERSIONS)
@settings(FUZZ, max_examples=8)
@given(data=st.data())
def test_valid_frames_roundtrip(api_key, version, data):
    """Every API/version the codec supports: kafka-python's bytes decode, and re-encode identically."""
    key, ver, correlation_id, client_id, frame = data.draw(valid_frames(api_key, version))
    request = _decode_or_protocol_error(frame)
    assert request is not None, f"a valid {codec.API_NAMES[key]} v{ver} frame did not decode"
    assert (request.correlation_id, request.client_id) == (correlation_id, client_id)
    body = request.body
    body.with_header(correlation_id=correlation_id, client_id=client_id)
    assert bytes(body.encode(version=ver, header=True)) == frame


@pytest.mark.timeout(300)
@pytest.mark.parametrize("api_key", sorted(codec.SUPPORTED_VERSIONS))
@settings(FUZZ, max_examples=120)
@given(data=st.data())
def test_mutated_frames_decode_or_raise_protocol_error(api_key, data):
    *_, frame = data.draw(valid_frames(api_key))
    _decode_or_protocol_error(data.draw(mutated(frame)))


@pytest.mark.timeout(300)
@pytest.mark.parametrize("api_key", sorted(codec.SUPPORTED_VERSIONS))
@settings(FUZZ, max_examples=120)
@given(data=st.data())
def test_mutated_frames_decode_in_c_as_in_the_generated_python(api_key, data):
    """The C decoder against the generated one on the same damaged frame: what the generated decoder reads, the C
    one reads to equal values or leaves to it (raises); what the generated one refuses, the C one refuses too."""
    key, version, *_, frame = data.draw(valid_frames(api_key))
    frame = data.draw(mutated(frame))
    cls = codec.request_class(key)
    try:
        expected = generated_codec.request_decoder(cls, version)(frame)
    except Exception:  # noqa: BLE001 - any refusal: the C decoder must refuse as well
        expected = None
    try:
        got = compiled_codec.request_decoder(cls, version)(frame)
    except Exception:  # noqa: BLE001
        got = None
    if expected is None:
        assert got is None, "the C decoder read a frame the generated one refuses"
    elif got is not None:
        assert_same_value(got[0], expected[0])
        assert_same_value(got[1], expected[1], "header")


@pytest.mark.timeout(300)
@settings(FUZZ, max_examples=800)
@given(frame=st.binary(max_size=300))
def test_arbitrary_bytes_decode_or_raise_protocol_error(frame):
    _decode_or_protocol_error(frame)


@pytest.mark.timeout(300)
@settings(FUZZ, max_examples=800)
@given(key_version=st.sampled_from(ALL_VERSIONS), correlation_id=SCALARS["int32"], rest=st.binary(max_size=300))
def test_known_header_then_arbitrary_bytes(key_version, correlation_id, rest):
    """A valid api key/version prefix sends the random rest into that version's generated decoder."""
    _decode_or_protocol_error(struct.pack(">hhi", *key_version, correlation_id) + rest)


@pytest.mark.timeout(300)
@settings(FUZZ, max_examples=300)
@given(api_key=st.integers(-(2**15), 2**15 - 1), version=st.integers(-(2**15), 2**15 - 1),
       rest=st.binary(max_size=40))
def test_unknown_keys_and_versions_raise_the_errors_that_name_them(api_key, version, rest):
    """An unknown key or an unsupported version is reported as such, with the correlation id the reply needs."""
    frame = struct.pack(">hhi", api_key, version, 4242) + rest
    supported = codec.SUPPORTED_VERSIONS.get(api_key)
    if supported is not None and supported[0] <= version <= supported[1]:
        _decode_or_protocol_error(frame)
        return
    expected = codec.UnsupportedApiError if supported is None else codec.UnsupportedVersionError
    with pytest.raises(expected) as err:
        codec.decode_request(frame)
    assert (err.value.api_key, err.value.api_version, err.value.correlation_id) == (api_key, version, 4242)
