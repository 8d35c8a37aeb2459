"""Fuzzing `codec.decode_request`: whatever bytes a peer sends, it returns a Request or raises ProtocolError.

The server closes a connection on ProtocolError; any other exception would escape its connection task,
and a hang would stall the connection's event loop. Valid frames come from kafka-python's request classes
(the bytes its client writes), with field values drawn from each message's own schema, for every API and
version the codec supports; an unmutated frame must decode and re-encode to the same bytes.
"""

from __future__ import annotations

import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shale.sidecar.protocol import codec

ALL_VERSIONS = [(k, v) for k, (lo, hi) in sorted(codec.SUPPORTED_VERSIONS.items()) for v in range(lo, hi + 1)]
FUZZ = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

_SCALARS = {
    "int8": st.integers(-(2**7), 2**7 - 1),
    "int16": st.integers(-(2**15), 2**15 - 1),
    "int32": st.integers(-(2**31), 2**31 - 1),
    "int64": st.integers(-(2**63), 2**63 - 1),
    "bool": st.booleans(),
    "string": st.text(max_size=12),
    "bytes": st.binary(max_size=40),
    "records": st.binary(max_size=80),
    "uuid": st.uuids(),
}


def _field(field, version: int) -> st.SearchStrategy:
    kind = field._type_str
    if field.is_struct_array():
        base = st.lists(_struct(field.data_class, version), max_size=3)
    elif field.is_struct():
        base = _struct(field.data_class, version)
    elif kind.startswith("[]"):
        base = st.lists(_SCALARS[kind[2:]], max_size=4)
    else:
        base = _SCALARS[kind]
    return st.one_of(st.none(), base) if field.nullable_for_version_q(version) else base


def _struct(cls, version: int, *, top: bool = False) -> st.SearchStrategy:
    fields = {name: _field(f, version) for name, f in cls._struct.fields.items() if f.for_version_q(version)}
    if top:
        return st.fixed_dictionaries(fields).map(lambda values: cls(version=version, **values))
    return st.fixed_dictionaries(fields).map(lambda values: cls(**values))


@st.composite
def valid_frames(draw, api_key: int | None = None, version: int | None = None) -> tuple[int, int, int, str | None, bytes]:
    """(api key, version, correlation id, client id, frame without the size prefix) as kafka-python writes it."""
    if api_key is None:
        api_key, version = draw(st.sampled_from(ALL_VERSIONS))
    elif version is None:
        lo, hi = codec.SUPPORTED_VERSIONS[api_key]
        version = draw(st.integers(lo, hi))
    request = draw(_struct(codec.request_class(api_key), version, top=True))
    correlation_id = draw(_SCALARS["int32"])
    client_id = draw(st.one_of(st.none(), st.text(max_size=10)))
    request.with_header(correlation_id=correlation_id, client_id=client_id)
    frame = bytes(request.encode(header=True, framed=True))
    assert struct.unpack_from(">i", frame)[0] == len(frame) - 4
    return api_key, version, correlation_id, client_id, frame[4:]


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
@settings(FUZZ, max_examples=800)
@given(frame=st.binary(max_size=300))
def test_arbitrary_bytes_decode_or_raise_protocol_error(frame):
    _decode_or_protocol_error(frame)


@pytest.mark.timeout(300)
@settings(FUZZ, max_examples=800)
@given(key_version=st.sampled_from(ALL_VERSIONS), correlation_id=_SCALARS["int32"], rest=st.binary(max_size=300))
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
