"""Hypothesis strategies for Kafka messages, drawn from each message's own schema (kafka-python's parsed copy of
Kafka's JSON): request frames as kafka-python's client writes them, and response bodies as handlers write them
(dicts, fields left out at random so schema defaults apply)."""

from __future__ import annotations

import struct

from hypothesis import strategies as st

from shale.sidecar.protocol import codec

ALL_VERSIONS = [(k, v) for k, (lo, hi) in sorted(codec.SUPPORTED_VERSIONS.items()) for v in range(lo, hi + 1)]

SCALARS = {
    "int8": st.integers(-(2**7), 2**7 - 1),
    "int16": st.integers(-(2**15), 2**15 - 1),
    "uint16": st.integers(0, 2**16 - 1),
    "int32": st.integers(-(2**31), 2**31 - 1),
    "int64": st.integers(-(2**63), 2**63 - 1),
    "float64": st.floats(allow_nan=False),
    "bool": st.booleans(),
    "string": st.text(max_size=12),
    "bytes": st.binary(max_size=40),
    "records": st.binary(max_size=80),
    "uuid": st.uuids(),
    "bitfield": st.frozensets(st.integers(0, 31), max_size=4),
}


def _field(field, version: int, build) -> st.SearchStrategy:
    kind = field._type_str
    if field.is_struct_array():
        base = st.lists(build(field.data_class, version), max_size=3)
    elif field.is_struct():
        base = build(field.data_class, version)
    elif kind.startswith("[]"):
        base = st.lists(SCALARS[kind[2:]], max_size=4)
    else:
        base = SCALARS[kind]
    return st.one_of(st.none(), base) if field.nullable_for_version_q(version) else base


def struct_objects(cls, version: int, *, top: bool = False) -> st.SearchStrategy:
    """A message (top) or nested struct as kafka-python data objects, every field of the version set."""
    fields = {name: _field(f, version, struct_objects) for name, f in cls._struct.fields.items()
              if f.for_version_q(version)}
    if top:
        return st.fixed_dictionaries(fields).map(lambda values: cls(version=version, **values))
    return st.fixed_dictionaries(fields).map(lambda values: cls(**values))


def struct_dicts(cls, version: int) -> st.SearchStrategy:
    """A message or nested struct as a handler writes it: a dict of some of its fields (the others take their
    schema defaults), None where the schema allows it; structs without a default are always there."""
    required, optional = {}, {}
    for name, f in cls._struct.fields.items():
        if not f.for_version_q(version):
            continue
        try:
            f.default
            optional[name] = _field(f, version, struct_dicts)
        except (NotImplementedError, ValueError):
            required[name] = _field(f, version, struct_dicts)
    return st.fixed_dictionaries(required, optional=optional)


@st.composite
def valid_frames(draw, api_key: int | None = None, version: int | None = None) -> tuple[int, int, int, str | None, bytes]:
    """(api key, version, correlation id, client id, frame without the size prefix) as kafka-python writes it."""
    if api_key is None:
        api_key, version = draw(st.sampled_from(ALL_VERSIONS))
    elif version is None:
        lo, hi = codec.SUPPORTED_VERSIONS[api_key]
        version = draw(st.integers(lo, hi))
    request = draw(struct_objects(codec.request_class(api_key), version, top=True))
    correlation_id = draw(SCALARS["int32"])
    client_id = draw(st.one_of(st.none(), st.text(max_size=10)))
    request.with_header(correlation_id=correlation_id, client_id=client_id)
    frame = bytes(request.encode(header=True, framed=True))
    assert struct.unpack_from(">i", frame)[0] == len(frame) - 4
    return api_key, version, correlation_id, client_id, frame[4:]


def assert_same_value(fast, ref, where: str = "body", *, views: bool = False) -> None:
    """Equal as the handlers see them: same class and version, every field of the schema, tags and unknown tags.
    With `views`, a bytes field's value is a memoryview of the same bytes (a response decoded without copies)."""
    if isinstance(ref, list):
        assert isinstance(fast, list) and len(fast) == len(ref), where
        for i, (a, b) in enumerate(zip(fast, ref)):
            assert_same_value(a, b, f"{where}[{i}]", views=views)
        return
    if views and type(ref) is bytes:
        assert type(fast) is memoryview and fast == ref, (where, fast, ref)
        return
    if not hasattr(ref, "_struct"):
        assert type(fast) is type(ref) and fast == ref, (where, fast, ref)
        return
    assert type(fast) is type(ref), where
    assert fast._version == ref._version, where
    assert (fast.tags or set()) == (ref.tags or set()), where
    assert fast.unknown_tags == ref.unknown_tags, where
    for name in ref._struct.fields:
        assert_same_value(getattr(fast, name), getattr(ref, name), f"{where}.{name}", views=views)
