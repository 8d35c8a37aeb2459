"""Topic-level config table: Kafka's keys and defaults, ConfigDef-style parsing and errors, schema and docs.

Expected values are written out literally from spec section 9 (not read back from the table under test).
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import jsonschema
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from shale.sidecar.topic_config import (
    CONFIG_KEYS,
    CONFIG_KEYS_BY_NAME,
    InvalidConfigError,
    TopicConfig,
    json_schema_for_config,
    render_markdown,
)

INT_MIN, INT_MAX = -2147483648, 2147483647
LONG_MIN, LONG_MAX = -9223372036854775808, 9223372036854775807
TYPE_BOUNDS = {"int": (INT_MIN, INT_MAX), "long": (LONG_MIN, LONG_MAX)}

# Spec section 9: every topic-level key, its Kafka type and its 3.x default as Kafka writes it.
KAFKA_TABLE = {
    "cleanup.policy": ("list", "delete"),
    "retention.ms": ("long", "604800000"),
    "retention.bytes": ("long", "-1"),
    "segment.bytes": ("int", "1073741824"),
    "segment.ms": ("long", "604800000"),
    "segment.jitter.ms": ("long", "0"),
    "segment.index.bytes": ("int", "10485760"),
    "index.interval.bytes": ("int", "4096"),
    "flush.messages": ("long", "9223372036854775807"),
    "flush.ms": ("long", "9223372036854775807"),
    "min.cleanable.dirty.ratio": ("double", "0.5"),
    "min.compaction.lag.ms": ("long", "0"),
    "max.compaction.lag.ms": ("long", "9223372036854775807"),
    "delete.retention.ms": ("long", "86400000"),
    "file.delete.delay.ms": ("long", "60000"),
    "max.message.bytes": ("int", "1048588"),
    "message.timestamp.type": ("string", "CreateTime"),
    "message.timestamp.before.max.ms": ("long", "9223372036854775807"),
    "message.timestamp.after.max.ms": ("long", "9223372036854775807"),
    "message.timestamp.difference.max.ms": ("long", "9223372036854775807"),
    "message.format.version": ("string", "3.0-IV1"),
    "compression.type": ("string", "producer"),
    "compression.gzip.level": ("int", "-1"),
    "compression.lz4.level": ("int", "9"),
    "compression.zstd.level": ("int", "3"),
    "preallocate": ("boolean", "false"),
    "min.insync.replicas": ("int", "1"),
    "unclean.leader.election.enable": ("boolean", "false"),
    "message.downconversion.enable": ("boolean", "true"),
    "local.retention.ms": ("long", "-2"),
    "local.retention.bytes": ("long", "-2"),
    "remote.storage.enable": ("boolean", "false"),
    "remote.log.copy.disable": ("boolean", "false"),
    "remote.log.delete.on.disable": ("boolean", "false"),
    "leader.replication.throttled.replicas": ("list", ""),
    "follower.replication.throttled.replicas": ("list", ""),
}

# Valid inclusive range of every int/long key (validator and type bounds together), except gzip's level.
NUMERIC_RANGES = {
    "retention.ms": (-1, LONG_MAX),
    "retention.bytes": (LONG_MIN, LONG_MAX),
    "segment.bytes": (14, INT_MAX),
    "segment.ms": (1, LONG_MAX),
    "segment.jitter.ms": (0, LONG_MAX),
    "segment.index.bytes": (4, INT_MAX),
    "index.interval.bytes": (0, INT_MAX),
    "flush.messages": (1, LONG_MAX),
    "flush.ms": (0, LONG_MAX),
    "min.compaction.lag.ms": (0, LONG_MAX),
    "max.compaction.lag.ms": (1, LONG_MAX),
    "delete.retention.ms": (0, LONG_MAX),
    "file.delete.delay.ms": (0, LONG_MAX),
    "max.message.bytes": (0, INT_MAX),
    "message.timestamp.before.max.ms": (0, LONG_MAX),
    "message.timestamp.after.max.ms": (0, LONG_MAX),
    "message.timestamp.difference.max.ms": (0, LONG_MAX),
    "compression.lz4.level": (1, 17),
    "compression.zstd.level": (-131072, 22),
    "min.insync.replicas": (1, INT_MAX),
    "local.retention.ms": (-2, LONG_MAX),
    "local.retention.bytes": (-2, LONG_MAX),
}
BOOLEAN_KEYS = sorted(name for name, (kind, _) in KAFKA_TABLE.items() if kind == "boolean")
COMPRESSION_TYPES = ("uncompressed", "zstd", "lz4", "snappy", "gzip", "producer")
THROTTLED_RULE = (
    "{} must be the literal '*' or a list of replicas in the following format: "
    "[partitionId]:[brokerId],[partitionId]:[brokerId],..."
)
SCHEMA = jsonschema.Draft4Validator(json_schema_for_config())


def parse_error(overrides: dict[str, object]) -> InvalidConfigError:
    with pytest.raises(InvalidConfigError) as caught:
        TopicConfig.from_mapping(overrides)
    return caught.value


def assert_refused(name: str, raw: object, shown: str, rule: str) -> None:
    error = parse_error({name: raw})
    assert str(error) == f"Invalid value {shown} for configuration {name}: {rule}"
    assert (error.key, error.rule) == (name, rule)


# --- the table ---------------------------------------------------------------------------------------------


def test_table_has_every_key_of_section_9_with_kafkas_type_and_default() -> None:
    assert len(CONFIG_KEYS) == len(KAFKA_TABLE) == 36
    assert {key.name: (key.type.name, key.to_string(key.default)) for key in CONFIG_KEYS} == KAFKA_TABLE


def test_topic_config_fields_follow_the_table() -> None:
    assert [field.name for field in dataclasses.fields(TopicConfig)] == [key.attr for key in CONFIG_KEYS]
    assert list(CONFIG_KEYS_BY_NAME) == [key.name for key in CONFIG_KEYS]


def test_defaults_spot_checked_by_literal_value() -> None:
    cfg = TopicConfig.from_mapping({})
    assert cfg.cleanup_policy == ("delete",)
    assert (cfg.delete, cfg.compact) == (True, False)
    assert cfg.retention_ms == 604800000
    assert cfg.retention_bytes == -1
    assert cfg.segment_bytes == 1073741824
    assert cfg.segment_ms == 604800000
    assert cfg.segment_index_bytes == 10485760
    assert cfg.index_interval_bytes == 4096
    assert cfg.min_cleanable_dirty_ratio == 0.5
    assert cfg.min_compaction_lag_ms == 0
    assert cfg.max_compaction_lag_ms == 9223372036854775807
    assert cfg.delete_retention_ms == 86400000
    assert cfg.file_delete_delay_ms == 60000
    assert cfg.max_message_bytes == 1048588
    assert cfg.message_timestamp_after_max_ms == 9223372036854775807
    assert cfg.compression_type == "producer"
    assert (cfg.compression_gzip_level, cfg.compression_lz4_level, cfg.compression_zstd_level) == (-1, 9, 3)
    assert cfg.preallocate is False and cfg.message_downconversion_enable is True
    assert (cfg.local_retention_ms, cfg.local_retention_bytes) == (-2, -2)
    assert cfg.leader_replication_throttled_replicas == ()
    assert cfg.overrides() == {}
    assert cfg.as_kafka_strings() == {name: default for name, (_, default) in KAFKA_TABLE.items()}


def test_docs_note_what_kafka_4_changed() -> None:
    assert "1048576" in CONFIG_KEYS_BY_NAME["segment.bytes"].doc
    assert "3600000" in CONFIG_KEYS_BY_NAME["message.timestamp.after.max.ms"].doc
    for gone in ("message.timestamp.difference.max.ms", "message.format.version"):
        assert "Removed in Kafka 4.x" in CONFIG_KEYS_BY_NAME[gone].doc


# --- validators: the boundary passes, one step past it fails ---------------------------------------------


def test_numeric_ranges_cover_every_int_and_long_key() -> None:
    numeric = {name for name, (kind, _) in KAFKA_TABLE.items() if kind in TYPE_BOUNDS}
    assert numeric - {"compression.gzip.level"} == set(NUMERIC_RANGES)


@pytest.mark.parametrize("form", [int, str], ids=["native", "string"])
@pytest.mark.parametrize("name", sorted(NUMERIC_RANGES))
def test_numeric_boundaries(name: str, form: type) -> None:
    lo, hi = NUMERIC_RANGES[name]
    kind = KAFKA_TABLE[name][0]
    type_lo, type_hi = TYPE_BOUNDS[kind]
    for boundary in (lo, hi):
        assert TopicConfig.from_mapping({name: form(boundary)}).value_of(name) == boundary
    not_a_number = f"Not a number of type {kind.upper()}"
    assert_refused(name, form(lo - 1), str(lo - 1), not_a_number if lo == type_lo else f"Value must be at least {lo}")
    assert_refused(name, form(hi + 1), str(hi + 1), not_a_number if hi == type_hi else f"Value must be no more than {hi}")


def test_kafkas_own_example_message() -> None:
    error = parse_error({"segment.ms": -5})
    assert str(error) == "Invalid value -5 for configuration segment.ms: Value must be at least 1"
    assert (error.key, error.value, error.rule) == ("segment.ms", -5, "Value must be at least 1")
    assert isinstance(error, ValueError)


@pytest.mark.parametrize("level", [-1, 1, 9, "-1", " 5 "])
def test_gzip_level_accepts_its_range_and_the_default_sentinel(level: object) -> None:
    assert TopicConfig.from_mapping({"compression.gzip.level": level}).compression_gzip_level == int(level)


@pytest.mark.parametrize("level", [-2, 0, 10])
def test_gzip_level_refuses_just_outside(level: int) -> None:
    assert_refused("compression.gzip.level", level, str(level), "Value must be between 1 and 9 or equal to -1")


@pytest.mark.parametrize("ratio", [0, 1, 0.0, 1.0, "0", "1.0", "0.01", "1e-2", ".5", "0.25d", "1F"])
def test_dirty_ratio_accepts_its_closed_range(ratio: object) -> None:
    text = str(ratio).rstrip("dF")
    assert TopicConfig.from_mapping({"min.cleanable.dirty.ratio": ratio}).min_cleanable_dirty_ratio == float(text)


@pytest.mark.parametrize(
    "ratio, shown, rule",
    [
        (math.nextafter(1.0, 2.0), "1.0000000000000002", "Value must be no more than 1"),
        ("1.0000000000000002", "1.0000000000000002", "Value must be no more than 1"),
        (math.nextafter(0.0, -1.0), "-4.9E-324", "Value must be at least 0"),
        ("-0.0001", "-1.0E-4", "Value must be at least 0"),
        ("Infinity", "Infinity", "Value must be no more than 1"),
        (1e7, "1.0E7", "Value must be no more than 1"),
        (12345678.9, "1.23456789E7", "Value must be no more than 1"),
        (1234567.0, "1234567.0", "Value must be no more than 1"),
        pytest.param(10**400, "Infinity", "Value must be no more than 1", id="int-beyond-double"),
    ],
)
def test_dirty_ratio_refuses_just_outside_with_java_rendering(ratio: object, shown: str, rule: str) -> None:
    assert_refused("min.cleanable.dirty.ratio", ratio, shown, rule)


@pytest.mark.parametrize("name", ["cleanup.policy", "compression.type", "message.timestamp.type"])
def test_enumerations_accept_each_member(name: str) -> None:
    members = {
        "cleanup.policy": ("compact", "delete"),
        "compression.type": COMPRESSION_TYPES,
        "message.timestamp.type": ("CreateTime", "LogAppendTime"),
    }[name]
    for member in members:
        value = TopicConfig.from_mapping({name: member}).value_of(name)
        assert value == ((member,) if name == "cleanup.policy" else member)


@pytest.mark.parametrize(
    "name, raw, shown, rule",
    [
        ("cleanup.policy", "Compact", "Compact", "String must be one of: compact, delete"),
        ("cleanup.policy", "compact,", "", "String must be one of: compact, delete"),
        ("cleanup.policy", "compact,none", "none", "String must be one of: compact, delete"),
        ("compression.type", "GZIP", "GZIP", f"String must be one of: {', '.join(COMPRESSION_TYPES)}"),
        ("compression.type", "brotli", "brotli", f"String must be one of: {', '.join(COMPRESSION_TYPES)}"),
        ("message.timestamp.type", "createtime", "createtime", "String must be one of: CreateTime, LogAppendTime"),
    ],
)
def test_enumerations_refuse_near_misses(name: str, raw: str, shown: str, rule: str) -> None:
    assert_refused(name, raw, shown, rule)


@pytest.mark.parametrize(
    "policy, compact, delete",
    [("compact", True, False), ("delete", False, True), ("compact,delete", True, True), ("", False, False)],
)
def test_compact_and_delete_follow_cleanup_policy(policy: str, compact: bool, delete: bool) -> None:
    cfg = TopicConfig.from_mapping({"cleanup.policy": policy})
    assert (cfg.compact, cfg.delete) == (compact, delete)


@pytest.mark.parametrize("version", ["3.0-IV1", "3.0", "3.0.1", "3.0..x", "0.10.2", "0.10.0-IV1", "0.10.2.1",
                                     "0.8.0", "2.8-IV1", "3.3-IV3", "3.7-IV4", "3.9-IV0", "4.0-IV3", " 3.6 "])
def test_message_format_version_accepts_metadata_versions(version: str) -> None:
    assert TopicConfig.from_mapping({"message.format.version": version}).message_format_version == version.strip()


@pytest.mark.parametrize("version", ["3.0.", "3", "0.10", "9.9", "3.0-IV2", "3.0-iv1", "3.10", "", "4.1"])
def test_message_format_version_refuses_unknown_versions(version: str) -> None:
    assert_refused("message.format.version", version, version, f"Version {version} is not a valid version")


@pytest.mark.parametrize("name", ["leader.replication.throttled.replicas", "follower.replication.throttled.replicas"])
@pytest.mark.parametrize("replicas", ["*", "", "0:1", "0:1, 12:345", "0:1,,1:2", "*,"])
def test_throttled_replicas_accept_kafkas_forms(name: str, replicas: str) -> None:
    TopicConfig.from_mapping({name: replicas})


@pytest.mark.parametrize(
    "replicas, shown", [("x", "[x]"), ("0:1,*", "[0:1, *]"), ("0:", "[0:]"), ("0:1:2", "[0:1:2]"), ("**", "[**]")]
)
def test_throttled_replicas_refuse_other_lists(replicas: str, shown: str) -> None:
    name = "leader.replication.throttled.replicas"
    assert_refused(name, replicas, shown, THROTTLED_RULE.format(name))


# --- parsing: strings and YAML values ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name, text, native, expected",
    [
        ("segment.ms", " 100 ", 100, 100),
        ("segment.ms", "+100", 100, 100),
        ("segment.ms", "0" * 5000 + "100", 100, 100),
        ("retention.bytes", "-0", 0, 0),
        ("preallocate", "TRUE", True, True),
        ("preallocate", " False\t", False, False),
        ("min.cleanable.dirty.ratio", "0.01", 0.01, 0.01),
        ("min.cleanable.dirty.ratio", "1", 1, 1.0),
        ("cleanup.policy", "compact , delete", ["compact", "delete"], ("compact", "delete")),
        ("cleanup.policy", "  ", [], ()),
        ("compression.type", " zstd", "zstd", "zstd"),
        ("leader.replication.throttled.replicas", "0:1,\t1:2", ["0:1", " 1:2"], ("0:1", "1:2")),
    ],
)
def test_strings_and_native_values_parse_the_same(name: str, text: str, native: object, expected: object) -> None:
    from_text = TopicConfig.from_mapping({name: text})
    assert from_text == TopicConfig.from_mapping({name: native})
    assert from_text.value_of(name) == expected


@given(st.sampled_from(sorted(NUMERIC_RANGES)).flatmap(lambda n: st.tuples(st.just(n), st.integers(*NUMERIC_RANGES[n]))))
def test_any_integer_parses_the_same_as_its_string(case: tuple[str, int]) -> None:
    name, number = case
    native = TopicConfig.from_mapping({name: number})
    assert native.value_of(name) == number
    assert TopicConfig.from_mapping({name: str(number)}) == native == TopicConfig.from_mapping({name: f"\t{number} "})


@given(st.floats(0.0, 1.0))
def test_any_ratio_parses_the_same_from_python_and_java_strings(ratio: float) -> None:
    native = TopicConfig.from_mapping({"min.cleanable.dirty.ratio": ratio})
    java = native.as_kafka_strings()["min.cleanable.dirty.ratio"]
    assert TopicConfig.from_mapping({"min.cleanable.dirty.ratio": repr(ratio)}) == native
    assert TopicConfig.from_mapping({"min.cleanable.dirty.ratio": java}).min_cleanable_dirty_ratio == ratio


@pytest.mark.parametrize(
    "ratio, java",
    [(0.0001, "1.0E-4"), (0.001, "0.001"), (0.1 + 0.2, "0.30000000000000004"), (1, "1.0"), (0, "0.0"),
     (-0.0, "-0.0"), (5e-324, "4.9E-324"), (1.5e-10, "1.5E-10"), (0.25, "0.25")],
)
def test_doubles_are_written_as_java_does(ratio: float, java: str) -> None:
    assert TopicConfig.from_mapping({"min.cleanable.dirty.ratio": ratio}).as_kafka_strings()[
        "min.cleanable.dirty.ratio"
    ] == java


@pytest.mark.parametrize(
    "name, raw, shown, rule",
    [
        ("segment.ms", "abc", "abc", "Not a number of type LONG"),
        ("segment.ms", "1_000", "1_000", "Not a number of type LONG"),
        ("segment.ms", "1.0", "1.0", "Not a number of type LONG"),
        ("segment.ms", "", "", "Not a number of type LONG"),
        ("segment.ms", "١٢", "١٢", "Not a number of type LONG"),
        ("segment.ms", 1.5, "1.5", "Expected value to be a 64-bit integer, but it was a float"),
        ("segment.ms", True, "true", "Expected value to be a 64-bit integer, but it was a bool"),
        ("segment.bytes", [1], "[1]", "Expected value to be a 32-bit integer, but it was a list"),
        ("segment.ms", None, "null", "Value must be non-null"),
        ("preallocate", "yes", "yes", "Expected value to be either true or false"),
        ("preallocate", 1, "1", "Expected value to be either true or false"),
        ("min.cleanable.dirty.ratio", "NaN", "NaN", "Not a number of type DOUBLE"),
        ("min.cleanable.dirty.ratio", math.nan, "NaN", "Not a number of type DOUBLE"),
        ("min.cleanable.dirty.ratio", "0,5", "0,5", "Not a number of type DOUBLE"),
        ("min.cleanable.dirty.ratio", False, "false", "Expected value to be a double, but it was a bool"),
        ("compression.type", 3, "3", "Expected value to be a string, but it was a int"),
        ("message.format.version", 3.0, "3.0", "Expected value to be a string, but it was a float"),
        ("cleanup.policy", 3, "3", "Expected a comma separated list."),
        ("cleanup.policy", ["compact", 1], "[compact, 1]", "Expected a comma separated list."),
    ],
)
def test_values_of_the_wrong_type_are_refused(name: str, raw: object, shown: str, rule: str) -> None:
    assert_refused(name, raw, shown, rule)


def test_constructor_and_replace_validate_too() -> None:
    cfg = TopicConfig.from_mapping({})
    assert dataclasses.replace(cfg, segment_ms="5").segment_ms == 5
    with pytest.raises(InvalidConfigError, match="segment.ms: Value must be at least 1"):
        dataclasses.replace(cfg, segment_ms=0)


# --- names and rules across keys -----------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["foo.bar", "log.retention.ms", "segment_ms", "Segment.ms"])
def test_unknown_names_are_refused(name: str) -> None:
    error = parse_error({"segment.ms": "100", name: "1"})
    assert str(error) == f"Unknown topic config name: {name}"
    assert error.key == name


@pytest.mark.parametrize("low, high", [(10, 5), ("10", "5"), (LONG_MAX, 1)])
def test_min_compaction_lag_above_max_conflicts(low: object, high: object) -> None:
    error = parse_error({"min.compaction.lag.ms": low, "max.compaction.lag.ms": high})
    assert str(error) == (
        f"conflict topic config setting min.compaction.lag.ms ({low}) > max.compaction.lag.ms ({high})"
    )
    assert (error.key, error.value) == ("min.compaction.lag.ms", int(low))


def test_equal_compaction_lags_are_fine() -> None:
    cfg = TopicConfig.from_mapping({"min.compaction.lag.ms": 7, "max.compaction.lag.ms": 7})
    assert (cfg.min_compaction_lag_ms, cfg.max_compaction_lag_ms) == (7, 7)


COPY_DISABLED_BYTES = (
    "When `remote.log.copy.disable` is set to true, the `local.retention.bytes` and `retention.bytes` must be "
    "set to the identical value because there will be no more logs copied to the remote storage."
)
COPY_DISABLED_MS = COPY_DISABLED_BYTES.replace("bytes", "ms")
TIERED_CASES = [
    ({"cleanup.policy": "compact"}, "Remote log storage is unsupported for the compacted topics"),
    ({"cleanup.policy": "delete,compact"}, "Remote log storage is unsupported for the compacted topics"),
    (
        {"retention.bytes": 100, "local.retention.bytes": -1},
        "Invalid value -1 for configuration local.retention.bytes: "
        "Value must not be -1 as retention.bytes value is set as 100.",
    ),
    (
        {"retention.bytes": "100", "local.retention.bytes": "101"},
        "Invalid value 101 for configuration local.retention.bytes: "
        "Value must not be more than retention.bytes property value: 100",
    ),
    (
        {"local.retention.ms": -1},
        "Invalid value -1 for configuration local.retention.ms: "
        "Value must not be -1 as retention.ms value is set as 604800000.",
    ),
    (
        {"local.retention.ms": 604800001},
        "Invalid value 604800001 for configuration local.retention.ms: "
        "Value must not be more than retention.ms property value: 604800000",
    ),
    ({"remote.log.copy.disable": True, "retention.bytes": 100, "local.retention.bytes": 50}, COPY_DISABLED_BYTES),
    ({"remote.log.copy.disable": "true", "local.retention.ms": 1000}, COPY_DISABLED_MS),
]


@pytest.mark.parametrize("overrides, message", TIERED_CASES)
def test_tiered_storage_rules_apply_when_remote_storage_is_on(overrides: dict[str, object], message: str) -> None:
    assert str(parse_error({"remote.storage.enable": "true", **overrides})) == message
    TopicConfig.from_mapping({"remote.storage.enable": False, **overrides})


@pytest.mark.parametrize(
    "overrides",
    [
        {"retention.bytes": 100, "local.retention.bytes": 100},
        {"retention.bytes": -1, "local.retention.bytes": -1},
        {"retention.ms": -1, "local.retention.ms": -1},
        {"local.retention.ms": 604800000, "local.retention.bytes": -2},
        {"remote.log.copy.disable": True, "retention.bytes": 100, "local.retention.bytes": 100},
        {"remote.log.copy.disable": True, "local.retention.ms": -2},
        {"cleanup.policy": ""},
    ],
)
def test_tiered_storage_boundaries_pass(overrides: dict[str, object]) -> None:
    assert TopicConfig.from_mapping({"remote.storage.enable": True, **overrides}).remote_storage_enable


# --- overrides() round trip -----------------------------------------------------------------------------------


def _native_or_string(values: st.SearchStrategy[object]) -> st.SearchStrategy[object]:
    return st.one_of(values, values.map(str))


def _valid_value(name: str) -> st.SearchStrategy[object]:
    if name in NUMERIC_RANGES:
        return _native_or_string(st.integers(*NUMERIC_RANGES[name]))
    if name in BOOLEAN_KEYS:
        return st.one_of(st.booleans(), st.sampled_from(["true", "false", "TRUE", " False"]))
    pairs = st.tuples(st.integers(0, 999), st.integers(0, 999)).map(lambda p: f"{p[0]}:{p[1]}")
    policies = st.lists(st.sampled_from(["compact", "delete"]), max_size=3)
    return {
        "compression.gzip.level": _native_or_string(st.sampled_from([-1, *range(1, 10)])),
        "min.cleanable.dirty.ratio": st.one_of(st.floats(0.0, 1.0), st.floats(0.0, 1.0).map(repr)),
        "cleanup.policy": st.one_of(policies, policies.map(", ".join)),
        "compression.type": st.sampled_from(COMPRESSION_TYPES),
        "message.timestamp.type": st.sampled_from(["CreateTime", "LogAppendTime"]),
        "message.format.version": st.sampled_from(["3.0-IV1", "2.8", "0.10.2", "3.9-IV0", "1.0-IV0", "3.5.2"]),
        "leader.replication.throttled.replicas": st.one_of(st.just("*"), st.lists(pairs, max_size=4).map(",".join)),
        "follower.replication.throttled.replicas": st.lists(pairs, max_size=4),
    }[name]


# remote.storage.enable stays off so that the tiered rules (tested above) do not refuse random draws.
VALID_OVERRIDES = st.fixed_dictionaries(
    {}, optional={name: _valid_value(name) for name in KAFKA_TABLE if name != "remote.storage.enable"}
)


def _lags_agree(raw: dict[str, object]) -> bool:
    return int(str(raw.get("min.compaction.lag.ms", 0))) <= int(str(raw.get("max.compaction.lag.ms", LONG_MAX)))


@given(VALID_OVERRIDES)
def test_overrides_round_trip_through_from_mapping(raw: dict[str, object]) -> None:
    assume(_lags_agree(raw))
    cfg = TopicConfig.from_mapping(raw)
    overrides = cfg.overrides()
    assert all(isinstance(value, str) for value in overrides.values())
    assert TopicConfig.from_mapping(overrides) == cfg
    assert TopicConfig.from_mapping(cfg.as_kafka_strings()) == cfg
    defaults = TopicConfig.from_mapping({})
    assert set(overrides) == {name for name in raw if cfg.value_of(name) != defaults.value_of(name)}


def test_overrides_are_kafka_strings_of_changed_keys_only() -> None:
    cfg = TopicConfig.from_mapping(
        {
            "segment.ms": 100,
            "retention.ms": "604800000",
            "preallocate": "TRUE",
            "cleanup.policy": [" compact", "delete "],
            "min.cleanable.dirty.ratio": "1e-4",
        }
    )
    assert cfg.overrides() == {
        "segment.ms": "100",
        "preallocate": "true",
        "cleanup.policy": "compact,delete",
        "min.cleanable.dirty.ratio": "1.0E-4",
    }


# --- CRD schema -------------------------------------------------------------------------------------------------


def test_schema_is_a_closed_object_schema_with_a_property_per_key() -> None:
    schema = json_schema_for_config()
    jsonschema.Draft4Validator.check_schema(schema)
    assert (schema["type"], schema["additionalProperties"]) == ("object", False)
    assert set(schema["properties"]) == set(KAFKA_TABLE)
    assert all(prop["description"] for prop in schema["properties"].values())


def test_schema_properties_are_structural() -> None:
    """Kubernetes: a type on every property, except int-or-string whose only junctor is its own anyOf."""
    expected_type = {"boolean": "boolean", "double": "number", "string": "string", "list": "string"}
    for name, prop in json_schema_for_config()["properties"].items():
        kind = KAFKA_TABLE[name][0]
        if kind in TYPE_BOUNDS:
            assert prop["x-kubernetes-int-or-string"] is True and "type" not in prop
            assert prop["anyOf"] == [{"type": "integer"}, {"type": "string"}]
        else:
            assert prop["type"] == expected_type[kind] and "anyOf" not in prop


GOOD_CONFIG = {
    "cleanup.policy": "compact,delete",
    "retention.ms": -1,
    "retention.bytes": "-1",
    "segment.bytes": 14,
    "segment.ms": "100",
    "min.cleanable.dirty.ratio": 0.01,
    "max.compaction.lag.ms": LONG_MAX,
    "compression.type": "zstd",
    "compression.gzip.level": -1,
    "compression.zstd.level": -131072,
    "message.timestamp.type": "LogAppendTime",
    "message.format.version": "3.0-IV1",
    "preallocate": True,
    "leader.replication.throttled.replicas": "*",
    "follower.replication.throttled.replicas": "0:1, 2:3",
}


def test_schema_and_parser_accept_a_good_config() -> None:
    SCHEMA.validate(GOOD_CONFIG)
    TopicConfig.from_mapping(GOOD_CONFIG)


@pytest.mark.parametrize(
    "bad",
    [
        {"foo.bar": "1"},
        {"segment.ms": 0},
        {"segment.ms": "abc"},
        {"segment.ms": 1.5},
        {"segment.bytes": INT_MAX + 1},
        {"compression.gzip.level": 0},
        {"compression.lz4.level": 18},
        {"min.cleanable.dirty.ratio": 1.5},
        {"min.cleanable.dirty.ratio": -0.1},
        {"preallocate": "maybe"},
        {"preallocate": 1},
        {"cleanup.policy": "compact,foo"},
        {"cleanup.policy": "compact,"},
        {"compression.type": "brotli"},
        {"message.timestamp.type": "createtime"},
        {"message.format.version": "9.9"},
        {"message.format.version": "3.0."},
        {"leader.replication.throttled.replicas": "0:1,*"},
        {"segment.ms": None},
    ],
)
def test_schema_and_parser_refuse_bad_configs(bad: dict[str, object]) -> None:
    assert not SCHEMA.is_valid(bad)
    with pytest.raises(InvalidConfigError):
        TopicConfig.from_mapping(bad)


@pytest.mark.parametrize("value", [LONG_MIN - 1, LONG_MAX + 1])
def test_a_long_past_64_bits_is_left_to_the_parser(value: int) -> None:
    # kube-apiserver holds a schema's bounds as float64, where 2^63-1 becomes 2^63 and overflows its int64
    # check (every integer refused); so a long's schema carries no bounds of its own and the parser refuses.
    assert SCHEMA.is_valid({"retention.bytes": value})
    assert_refused("retention.bytes", value, str(value), "Not a number of type LONG")


@given(VALID_OVERRIDES)
def test_schema_accepts_every_valid_config_in_its_yaml_form(raw: dict[str, object]) -> None:
    assume(_lags_agree(raw))
    cfg = TopicConfig.from_mapping(raw)
    strings = cfg.as_kafka_strings()
    natural = {name: cfg.value_of(name) if kind in ("boolean", "double") else strings[name]
               for name, (kind, _) in KAFKA_TABLE.items()}
    SCHEMA.validate(natural)
    SCHEMA.validate({**natural, **{name: cfg.value_of(name) for name in NUMERIC_RANGES}})


ANY_VALUE = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=False),  # JSON has no NaN; the parser refuses it anyway
    st.text(alphabet="0123456789:,.*- \tIVcompatdelzsrunfgyhCTLA", max_size=12),
)


@given(st.sampled_from(sorted(KAFKA_TABLE)), ANY_VALUE)
def test_schema_is_never_looser_than_the_parser(name: str, value: object) -> None:
    # A structural schema cannot range-check an int-or-string given as a string; the parser does.
    assume(not (isinstance(value, str) and KAFKA_TABLE[name][0] in TYPE_BOUNDS))
    # Nor a long's own 64-bit bounds (test_a_long_past_64_bits_is_left_to_the_parser).
    assume(not (KAFKA_TABLE[name][0] == "long" and isinstance(value, int) and not LONG_MIN <= value <= LONG_MAX))
    if SCHEMA.is_valid({name: value}):
        TopicConfig.from_mapping({name: value})


# --- docs -------------------------------------------------------------------------------------------------------


def test_committed_docs_equal_the_generated_markdown() -> None:
    committed = Path(__file__).resolve().parents[1] / "docs" / "topic-config.md"
    assert committed.read_text(encoding="utf-8") == render_markdown()


def test_markdown_has_a_row_per_key() -> None:
    rows = [line for line in render_markdown().splitlines() if line.startswith("| `")]
    assert [row.split("`")[1] for row in rows] == list(KAFKA_TABLE)
    assert "| `segment.ms` | long | `604800000` | `[1,...]` |" in render_markdown()
    assert "| `leader.replication.throttled.replicas` | list | `\"\"` |" in render_markdown()
    assert "| `compression.gzip.level` | int | `-1` | `[1,...,9] or -1` |" in render_markdown()
