"""Topic-level configuration: Kafka's table of topic configs, and everything derived from it.

`CONFIG_KEYS` is the single source of truth. Parsing and validation (`TopicConfig`), the CRD schema
(`json_schema_for_config`) and docs/topic-config.md (`render_markdown`) all read it, so a key, default
or rule is changed in one place. Names, types, defaults and validators are Kafka 3.x's (`LogConfig` at
the trunk commit of spec section 9); where 4.x differs, the key's doc says so.

Values arrive as Kafka strings (wire protocol, quoted YAML) or as YAML natives and are read the way
`ConfigDef.parseType` reads them: strings are trimmed, booleans are true/false in any case, lists are
split at commas with the whitespace around them dropped, numbers use Java's grammar and must fit the type.
Deliberate differences, all about odd input: NaN is refused (Kafka takes it, and it turns off compaction by
ratio without a word), only ASCII digits and decimal doubles are read, and list elements are trimmed
whether the list came as a string or as a YAML sequence.
"""

from __future__ import annotations

import copy
import math
import re
from dataclasses import dataclass
from decimal import Decimal
from types import MappingProxyType
from typing import Any, Callable, Mapping, Protocol

INT_MIN, INT_MAX = -(2**31), 2**31 - 1
LONG_MIN, LONG_MAX = -(2**63), 2**63 - 1

_JAVA_TRIMMED = "".join(map(chr, range(0x21)))  # String.trim() drops every char up to U+0020
# Java's \s spelled out, so that CRD patterns (ECMA-262, RE2) mean the same as the parser.
_LIST_SEPARATOR = re.compile(r"[ \t\n\x0b\f\r]*,[ \t\n\x0b\f\r]*")
_INTEGER = re.compile(r"([+-]?)0*([0-9]+)")
# The string form of a double as Java's Double.valueOf (and so ConfigDef) reads it, after trimming.
# Public because the Topic CRD's pattern for double values is built from it (operator/crd.py): one
# grammar, so the API server and this parser accept the same strings. RE2- and ECMA-262-compatible.
JAVA_DOUBLE = re.compile(r"[+-]?(?:Infinity|(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?[fFdD]?)")


class InvalidConfigError(ValueError):
    """A topic config Kafka would refuse. The message is worded as Kafka's, so operators can search for it."""

    def __init__(self, key: str, value: object, rule: str, message: str | None = None) -> None:
        super().__init__(message or f"Invalid value {_show(value)} for configuration {key}: {rule}")
        self.key, self.value, self.rule = key, value, rule


def _trim(text: str) -> str:
    return text.strip(_JAVA_TRIMMED)


def _show(value: object) -> str:
    """A value as Java's string concatenation writes it, which is what Kafka's messages and strings show."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return _java_double(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(map(_show, value)) + "]"
    return str(value)


def _java_double(x: float) -> str:
    """Double.toString (JDK 19+): plain notation in [1e-3, 1e7), otherwise d.dddE<n>."""
    if not math.isfinite(x):
        return "NaN" if math.isnan(x) else ("Infinity" if x > 0 else "-Infinity")
    sign = "-" if math.copysign(1.0, x) < 0 else ""
    x = abs(x)
    if x == 0:
        return sign + "0.0"
    digits, point = _java_digits(x)
    if 1e-3 <= x < 1e7:
        if point <= 0:
            body = "0." + "0" * -point + digits
        elif point >= len(digits):
            body = digits + "0" * (point - len(digits)) + ".0"
        else:
            body = digits[:point] + "." + digits[point:]
    else:
        body = f"{digits[0]}.{digits[1:] or '0'}E{point - 1}"
    return sign + body


def _java_digits(x: float) -> tuple[str, int]:
    """Significant digits of the decimal Java prints for x > 0, and where its decimal point goes.

    Python's repr has the shortest digits that read back as x; when that is a single digit, Java takes a
    2-digit decimal instead if one is closer to x (4.9E-324, not 5E-324).
    """
    chosen, exact = Decimal(repr(x)), Decimal(x)
    two_digits = Decimal(f"{x:.1e}")
    if len(chosen.normalize().as_tuple().digits) == 1 and float(two_digits) == x:
        chosen = min(chosen, two_digits, key=lambda d: abs(d - exact))
    _, digits, exponent = chosen.normalize().as_tuple()
    text = "".join(map(str, digits))
    return text, len(text) + int(exponent)


@dataclass(frozen=True)
class ConfigType:
    """A ConfigDef type: how a raw value is read, written back the way Kafka writes it, and admitted by the CRD."""

    name: str
    parse: Callable[[str, Any], Any]
    schema: Mapping[str, object]
    to_string: Callable[[Any], str] = _show


def _parse_boolean(key: str, raw: object) -> bool:
    if isinstance(raw, bool):
        return raw
    text = _trim(raw).casefold() if isinstance(raw, str) else None
    if text not in ("true", "false"):
        raise InvalidConfigError(key, raw, "Expected value to be either true or false")
    return text == "true"


def _integer_type(name: str, bits: int) -> ConfigType:
    lo, hi = -(1 << (bits - 1)), (1 << (bits - 1)) - 1

    def parse(key: str, raw: object) -> int:
        if isinstance(raw, str):
            match = _INTEGER.fullmatch(_trim(raw))
            # Java reads any number of leading zeros but Python's int() caps the length of its input.
            value = int(match[1] + match[2]) if match and len(match[2]) <= 19 else None
        elif isinstance(raw, int) and not isinstance(raw, bool):
            value = raw
        else:
            raise InvalidConfigError(
                key, raw, f"Expected value to be a {bits}-bit integer, but it was a {type(raw).__name__}"
            )
        if value is None or not lo <= value <= hi:
            raise InvalidConfigError(key, raw, f"Not a number of type {name.upper()}")
        return value

    schema: dict[str, object] = {
        "x-kubernetes-int-or-string": True,
        "anyOf": [{"type": "integer"}, {"type": "string"}],
        "pattern": f"^{_INTEGER.pattern}$",
    }
    if bits < 64:
        # A long's own bounds are left to `parse`: kube-apiserver keeps a schema's bounds as float64, where
        # 2^63-1 rounds up to 2^63, and its int64 conversion of that overflows to -2^63, so `maximum: 2^63-1`
        # refuses every integer (seen on v1.20 in tests/cluster).
        schema.update(minimum=lo, maximum=hi)
    return ConfigType(name, parse, schema)


def _parse_double(key: str, raw: object) -> float:
    if isinstance(raw, str):
        text = _trim(raw)
        value = float(text.rstrip("fFdD")) if JAVA_DOUBLE.fullmatch(text) else math.nan
    elif isinstance(raw, (int, float)) and not isinstance(raw, bool):
        try:
            value = float(raw)
        except OverflowError:  # an int beyond any double: Java's doubleValue() gives an infinity
            value = math.inf if raw > 0 else -math.inf
    else:
        raise InvalidConfigError(key, raw, f"Expected value to be a double, but it was a {type(raw).__name__}")
    if math.isnan(value):
        raise InvalidConfigError(key, raw, "Not a number of type DOUBLE")
    return value


def _parse_string(key: str, raw: object) -> str:
    if not isinstance(raw, str):
        raise InvalidConfigError(key, raw, f"Expected value to be a string, but it was a {type(raw).__name__}")
    return _trim(raw)


def _parse_list(key: str, raw: object) -> tuple[str, ...]:
    if isinstance(raw, str):
        text = _trim(raw)
        items = _LIST_SEPARATOR.split(text) if text else []
    elif isinstance(raw, (list, tuple)) and all(isinstance(item, str) for item in raw):
        items = list(raw)
    else:
        raise InvalidConfigError(key, raw, "Expected a comma separated list.")
    return tuple(_trim(item) for item in items)


BOOLEAN = ConfigType("boolean", _parse_boolean, {"type": "boolean"})
INT = _integer_type("int", 32)
LONG = _integer_type("long", 64)
# A structural schema has no number-or-string; manifests write the ratio as a YAML number.
DOUBLE = ConfigType("double", _parse_double, {"type": "number"})
STRING = ConfigType("string", _parse_string, {"type": "string"})
LIST = ConfigType("list", _parse_list, {"type": "string"}, ",".join)


class Validator(Protocol):
    """A ConfigDef validator of a parsed value; `describe` is Kafka's "Valid Values" text."""

    def check(self, key: str, value: Any) -> None: ...

    def describe(self) -> str: ...

    def schema(self) -> dict[str, object]: ...


@dataclass(frozen=True)
class Range:
    """ConfigDef.Range: at least `lo` and, if given, at most `hi`."""

    lo: int
    hi: int | None = None

    def check(self, key: str, value: float) -> None:
        if value < self.lo:
            raise InvalidConfigError(key, value, f"Value must be at least {self.lo}")
        if self.hi is not None and value > self.hi:
            raise InvalidConfigError(key, value, f"Value must be no more than {self.hi}")

    def describe(self) -> str:
        return f"[{self.lo},...]" if self.hi is None else f"[{self.lo},...,{self.hi}]"

    def schema(self) -> dict[str, object]:
        return {"minimum": self.lo} if self.hi is None else {"minimum": self.lo, "maximum": self.hi}


@dataclass(frozen=True)
class LevelOrDefault:
    """A codec level range plus one sentinel below it meaning "the codec's default" (gzip's -1)."""

    lo: int
    hi: int
    default: int

    def check(self, key: str, value: int) -> None:
        if value > self.hi or (value < self.lo and value != self.default):
            rule = f"Value must be between {self.lo} and {self.hi} or equal to {self.default}"
            raise InvalidConfigError(key, value, rule)

    def describe(self) -> str:
        return f"[{self.lo},...,{self.hi}] or {self.default}"

    def schema(self) -> dict[str, object]:
        return {"minimum": self.default, "maximum": self.hi, "not": {"enum": list(range(self.default + 1, self.lo))}}


@dataclass(frozen=True)
class OneOf:
    """ConfigDef.ValidString: one of `choices`, case-sensitive as in Kafka."""

    choices: tuple[str, ...]

    def check(self, key: str, value: str) -> None:
        if value not in self.choices:
            raise InvalidConfigError(key, value, f"String must be one of: {', '.join(self.choices)}")

    def describe(self) -> str:
        return f"[{', '.join(self.choices)}]"

    def schema(self) -> dict[str, object]:
        return {"enum": list(self.choices)}


class EachOneOf(OneOf):
    """ConfigDef.ValidList: every element is one of `choices`; the empty list passes, as in 3.x."""

    def check(self, key: str, value: tuple[str, ...]) -> None:
        for item in value:
            super().check(key, item)

    def schema(self) -> dict[str, object]:
        item = "(?:" + "|".join(self.choices) + ")"
        return {"pattern": f"^(?:{item}(?:{_LIST_SEPARATOR.pattern}{item})*)?$"}


_REPLICA = "(?:[0-9]+:[0-9]+)?"


@dataclass(frozen=True)
class ThrottledReplicas:
    """ThrottledReplicaListValidator: `*`, or partitionId:brokerId pairs (empty elements pass, as in 3.x)."""

    def check(self, key: str, value: tuple[str, ...]) -> None:
        if not ("".join(value) == "*" or all(re.fullmatch(_REPLICA, item) for item in value)):
            rule = f"{key} must be the literal '*' or a list of replicas in the following format: {self.describe()}"
            raise InvalidConfigError(key, value, rule)

    def describe(self) -> str:
        return "[partitionId]:[brokerId],[partitionId]:[brokerId],..."

    def schema(self) -> dict[str, object]:
        return {"pattern": rf"^(?:\*|{_REPLICA}(?:{_LIST_SEPARATOR.pattern}{_REPLICA})*)$"}


# MetadataVersion's releases and how many -IVn versions each has (0: the release is itself the version).
_RELEASES = {
    "0.8.0": 0, "0.8.1": 0, "0.8.2": 0, "0.9.0": 0, "0.10.0": 2, "0.10.1": 3, "0.10.2": 1, "0.11.0": 3,
    "1.0": 1, "1.1": 1, "2.0": 2, "2.1": 3, "2.2": 2, "2.3": 2, "2.4": 2, "2.5": 1, "2.6": 1, "2.7": 3,
    "2.8": 2, "3.0": 2, "3.1": 1, "3.2": 1, "3.3": 4, "3.4": 1, "3.5": 3, "3.6": 3, "3.7": 5, "3.8": 1,
    "3.9": 1, "4.0": 4,
}  # fmt: skip
_VERSIONS = tuple(v for release, ivs in _RELEASES.items() for v in (release, *(f"{release}-IV{n}" for n in range(ivs))))
# fromVersionString keeps the first two dot-separated parts (three for 0.x) and ignores the rest; Java's
# split() drops trailing empty parts, so the rest must hold something other than dots.
_VERSION = "(?:" + "|".join(v.replace(".", r"\.") for v in _VERSIONS) + r")(?:\.[\s\S]*[^.][\s\S]*)?"


@dataclass(frozen=True)
class MetadataVersionString:
    """MetadataVersionValidator: a version MetadataVersion.fromVersionString knows, e.g. 3.0-IV1, 3.0 or 3.0.1."""

    def check(self, key: str, value: str) -> None:
        if not re.fullmatch(_VERSION, value):
            raise InvalidConfigError(key, value, f"Version {value} is not a valid version")

    def describe(self) -> str:
        return f"[{_VERSIONS[0]}, ..., {_VERSIONS[-1]}]"

    def schema(self) -> dict[str, object]:
        return {"pattern": f"^{_VERSION}$"}


@dataclass(frozen=True)
class ConfigKey:
    """One topic config as Kafka defines it; `default` is in parsed form."""

    name: str
    type: ConfigType
    default: Any
    validator: Validator | None
    doc: str

    @property
    def attr(self) -> str:
        """The TopicConfig attribute holding this key."""
        return self.name.replace(".", "_")

    def parse(self, raw: object) -> Any:
        """Read and validate one value, raising InvalidConfigError as Kafka's ConfigDef would."""
        if raw is None:
            raise InvalidConfigError(self.name, raw, "Value must be non-null")
        value = self.type.parse(self.name, raw)
        if self.validator is not None:
            self.validator.check(self.name, value)
        return value

    def to_string(self, value: Any) -> str:
        """A parsed value as Kafka writes it (DescribeConfigs, overrides)."""
        return self.type.to_string(value)

    def schema(self) -> dict[str, object]:
        """The CRD property: the type's schema narrowed by the validator's."""
        fragment = {"description": self.doc, **copy.deepcopy(dict(self.type.schema))}
        fragment.update(self.validator.schema() if self.validator else {})
        return fragment


_THROTTLED_DOC = (
    "Replicas whose replication is throttled on the {0} side while out of the ISR (a reassignment's new "
    "replicas): `*` for all, or partitionId:brokerId pairs; the rate is the node's "
    "{0}.replication.throttled.rate (docs/moves.md)."
)
_TIERED_ONLY = "Only checked when remote.storage.enable is true"

CONFIG_KEYS: tuple[ConfigKey, ...] = (
    ConfigKey("cleanup.policy", LIST, ("delete",), EachOneOf(("compact", "delete")),
              "What reclaims space: `delete` drops old segments by time or size, `compact` keeps the latest "
              "record of each key; `compact,delete` does both. An empty list (accepted by 3.x) does neither."),
    ConfigKey("retention.ms", LONG, 604800000, Range(-1),
              "How long `delete` keeps a segment after its newest timestamp; -1 keeps it forever."),
    ConfigKey("retention.bytes", LONG, -1, None,
              "Size a partition may reach before `delete` drops its oldest segments; negative means no limit."),
    ConfigKey("segment.bytes", INT, 1073741824, Range(14),
              "Size at which the active segment is rolled. The 3.x minimum is 14 (one v0 record's "
              "overhead); Kafka 4.x raises it to 1048576."),
    ConfigKey("segment.ms", LONG, 604800000, Range(1),
              "Age at which the active segment is rolled even if not full, so that retention and "
              "compaction can reach its records."),
    ConfigKey("segment.jitter.ms", LONG, 0, Range(0),
              "Largest random time taken off segment.ms, so that partitions do not all roll at once."),
    ConfigKey("segment.index.bytes", INT, 10485760, Range(4),
              "Preallocated size of each offset and time index; below 8 (offset) or 12 (time) index "
              "creation fails."),
    ConfigKey("index.interval.bytes", INT, 4096, Range(0),
              "Bytes appended between offset-index entries: smaller means a bigger index and shorter scans."),
    ConfigKey("flush.messages", LONG, LONG_MAX, Range(1),
              "Records appended between forced fsyncs; the default leaves flushing to the OS."),
    ConfigKey("flush.ms", LONG, LONG_MAX, Range(0),
              "Milliseconds between forced fsyncs; the default leaves flushing to the OS."),
    ConfigKey("min.cleanable.dirty.ratio", DOUBLE, 0.5, Range(0, 1),
              "Share of the log not yet compacted above which (strictly) the cleaner compacts it."),
    ConfigKey("min.compaction.lag.ms", LONG, 0, Range(0),
              "Age a record must reach before compaction may remove it; must not exceed "
              "max.compaction.lag.ms."),
    ConfigKey("max.compaction.lag.ms", LONG, LONG_MAX, Range(1),
              "Longest a record may stay uncompacted; for compacted topics it also caps segment.ms."),
    ConfigKey("delete.retention.ms", LONG, 86400000, Range(0),
              "How long compaction keeps tombstones and transaction markers, so consumers still see deletes."),
    ConfigKey("file.delete.delay.ms", LONG, 60000, Range(0),
              "Delay between renaming a segment to `.deleted` and removing its files, for readers still on it."),
    ConfigKey("max.message.bytes", INT, 1048588, Range(0),
              "Largest record batch accepted, after compression (1 MiB plus 12 bytes of log overhead)."),
    ConfigKey("message.timestamp.type", STRING, "CreateTime", OneOf(("CreateTime", "LogAppendTime")),
              "Whether record timestamps are the producer's (CreateTime) or set on append (LogAppendTime)."),
    ConfigKey("message.timestamp.before.max.ms", LONG, LONG_MAX, Range(0),
              "How far a CreateTime timestamp may lie before the broker's clock. In 3.x, left at its "
              "default, message.timestamp.difference.max.ms applies instead."),
    ConfigKey("message.timestamp.after.max.ms", LONG, LONG_MAX, Range(0),
              "How far a CreateTime timestamp may lie after the broker's clock. Kafka 4.x defaults to "
              "3600000 (1 h). In 3.x, left at its default, message.timestamp.difference.max.ms applies instead."),
    ConfigKey("message.timestamp.difference.max.ms", LONG, LONG_MAX, Range(0),
              "Deprecated: largest difference either way between a CreateTime timestamp and the broker's "
              "clock. Removed in Kafka 4.x."),
    ConfigKey("message.format.version", STRING, "3.0-IV1", MetadataVersionString(),
              "Deprecated and ignored from inter-broker protocol 3.0 on; any MetadataVersion is accepted "
              "(which 4.0-IVn existed at the cited commit is unverified). Removed in Kafka 4.x."),
    ConfigKey("compression.type", STRING, "producer",
              OneOf(("uncompressed", "zstd", "lz4", "snappy", "gzip", "producer")),
              "Codec of the batches written to the log; `producer` keeps the producer's codec."),
    ConfigKey("compression.gzip.level", INT, -1, LevelOrDefault(1, 9, -1),
              "gzip level when compression.type is gzip; -1 is zlib's default."),
    ConfigKey("compression.lz4.level", INT, 9, Range(1, 17),
              "lz4 level when compression.type is lz4."),
    ConfigKey("compression.zstd.level", INT, 3, Range(-131072, 22),
              "zstd level when compression.type is zstd; negative levels trade ratio for speed."),
    ConfigKey("preallocate", BOOLEAN, False, None,
              "Whether a new segment file is preallocated to segment.bytes."),
    ConfigKey("min.insync.replicas", INT, 1, Range(1),
              "Replicas that must have a write with acks=all. Not a storage behaviour; kept so Kafka "
              "configs are accepted."),
    ConfigKey("unclean.leader.election.enable", BOOLEAN, False, None,
              "Whether an out-of-sync replica may become leader, losing data. Not a storage behaviour."),
    ConfigKey("message.downconversion.enable", BOOLEAN, True, None,
              "Whether fetches by old clients may be converted to older message formats. Deprecated; "
              "whether 4.x still has it is unverified."),
    ConfigKey("local.retention.ms", LONG, -2, Range(-2),
              "Tiered storage: how long segments stay on local disk; -2 means retention.ms. "
              f"{_TIERED_ONLY}: not -1 while retention.ms is limited, and at most retention.ms."),
    ConfigKey("local.retention.bytes", LONG, -2, Range(-2),
              "Tiered storage: local size limit of a partition; -2 means retention.bytes. "
              f"{_TIERED_ONLY}: not -1 while retention.bytes is limited, and at most retention.bytes."),
    ConfigKey("remote.storage.enable", BOOLEAN, False, None,
              "Tiered storage for the topic. When true, compacted topics are refused and the "
              "local.retention.* rules apply. Whether the broker has tiered storage, and that turning it "
              "off needs remote.log.delete.on.disable=true, need broker state and are checked by the "
              "caller. Kafka 4.x adds remote.copy.lag.ms and remote.copy.lag.bytes."),
    ConfigKey("remote.log.copy.disable", BOOLEAN, False, None,
              "Tiered storage: stop copying segments to remote storage. "
              f"{_TIERED_ONLY}: local.retention.* must then be -2 or equal retention.*."),
    ConfigKey("remote.log.delete.on.disable", BOOLEAN, False, None,
              "Tiered storage: delete the remote data when remote storage is turned off; Kafka refuses to "
              "turn it off otherwise."),
    ConfigKey("leader.replication.throttled.replicas", LIST, (), ThrottledReplicas(),
              _THROTTLED_DOC.format("leader")),
    ConfigKey("follower.replication.throttled.replicas", LIST, (), ThrottledReplicas(),
              _THROTTLED_DOC.format("follower")),
)  # fmt: skip

CONFIG_KEYS_BY_NAME: Mapping[str, ConfigKey] = MappingProxyType({key.name: key for key in CONFIG_KEYS})


@dataclass(frozen=True, slots=True)
class TopicConfig:
    """A topic's configs, parsed and validated; attributes are the Kafka names with dots as underscores.

    Every way of building one (from_mapping, the constructor, dataclasses.replace) parses and checks all
    fields, so a TopicConfig always holds values Kafka would accept.
    """

    cleanup_policy: tuple[str, ...]
    retention_ms: int
    retention_bytes: int
    segment_bytes: int
    segment_ms: int
    segment_jitter_ms: int
    segment_index_bytes: int
    index_interval_bytes: int
    flush_messages: int
    flush_ms: int
    min_cleanable_dirty_ratio: float
    min_compaction_lag_ms: int
    max_compaction_lag_ms: int
    delete_retention_ms: int
    file_delete_delay_ms: int
    max_message_bytes: int
    message_timestamp_type: str
    message_timestamp_before_max_ms: int
    message_timestamp_after_max_ms: int
    message_timestamp_difference_max_ms: int
    message_format_version: str
    compression_type: str
    compression_gzip_level: int
    compression_lz4_level: int
    compression_zstd_level: int
    preallocate: bool
    min_insync_replicas: int
    unclean_leader_election_enable: bool
    message_downconversion_enable: bool
    local_retention_ms: int
    local_retention_bytes: int
    remote_storage_enable: bool
    remote_log_copy_disable: bool
    remote_log_delete_on_disable: bool
    leader_replication_throttled_replicas: tuple[str, ...]
    follower_replication_throttled_replicas: tuple[str, ...]

    def __post_init__(self) -> None:
        for key in CONFIG_KEYS:
            object.__setattr__(self, key.attr, key.parse(getattr(self, key.attr)))
        _check_across_keys(self)

    @classmethod
    def from_mapping(cls, overrides: Mapping[str, object]) -> TopicConfig:
        """Kafka's defaults overlaid with `overrides` (Kafka names; strings or YAML values), as LogConfig.validate."""
        for name, raw in overrides.items():
            if name not in CONFIG_KEYS_BY_NAME:
                message = f"Unknown topic config name: {name}"
                raise InvalidConfigError(str(name), raw, "Unknown topic config name", message)
        return cls(**{key.attr: overrides.get(key.name, key.default) for key in CONFIG_KEYS})

    def value_of(self, name: str) -> Any:
        """The parsed value of the config named `name` (a Kafka name)."""
        return getattr(self, CONFIG_KEYS_BY_NAME[name].attr)

    def overrides(self) -> dict[str, str]:
        """The keys that differ from Kafka's defaults, as Kafka strings: what a topic has to store."""
        return {k: v for k, v in self.as_kafka_strings().items() if self.value_of(k) != CONFIG_KEYS_BY_NAME[k].default}

    def as_kafka_strings(self) -> dict[str, str]:
        """Every key as Kafka writes it, for DescribeConfigs."""
        return {key.name: key.to_string(self.value_of(key.name)) for key in CONFIG_KEYS}

    @property
    def compact(self) -> bool:
        return "compact" in self.cleanup_policy

    @property
    def delete(self) -> bool:
        return "delete" in self.cleanup_policy


# Tiered storage pairs each local limit with the total one it must stay within.
_LOCAL_RETENTION = (("local.retention.bytes", "retention.bytes"), ("local.retention.ms", "retention.ms"))


def _check_across_keys(cfg: TopicConfig) -> None:
    """LogConfig.validateValues and the topic-only tiered-storage checks of validateTopicLogConfigValues."""
    low, high = cfg.min_compaction_lag_ms, cfg.max_compaction_lag_ms
    if low > high:
        message = f"conflict topic config setting min.compaction.lag.ms ({low}) > max.compaction.lag.ms ({high})"
        rule = f"Value must not be more than max.compaction.lag.ms ({high})"
        raise InvalidConfigError("min.compaction.lag.ms", low, rule, message)
    if not cfg.remote_storage_enable:
        return
    if cfg.compact:
        message = "Remote log storage is unsupported for the compacted topics"
        raise InvalidConfigError("remote.storage.enable", True, "Value must be false for compacted topics", message)
    for local_key, total_key in _LOCAL_RETENTION:
        local, total = cfg.value_of(local_key), cfg.value_of(total_key)
        if total > -1 and local == -1:
            raise InvalidConfigError(local_key, local, f"Value must not be -1 as {total_key} value is set as {total}.")
        if total > -1 and local > total:
            rule = f"Value must not be more than {total_key} property value: {total}"
            raise InvalidConfigError(local_key, local, rule)
    if not cfg.remote_log_copy_disable:
        return
    for local_key, total_key in _LOCAL_RETENTION:
        local, total = cfg.value_of(local_key), cfg.value_of(total_key)
        if local not in (-2, total):
            message = (
                f"When `remote.log.copy.disable` is set to true, the `{local_key}` and `{total_key}` must be set "
                "to the identical value because there will be no more logs copied to the remote storage."
            )
            raise InvalidConfigError(local_key, local, f"Value must be -2 or equal to {total_key} ({total})", message)


def json_schema_for_config() -> dict[str, object]:
    """The OpenAPI v3 schema of a `Topic`'s `spec.config`, for the CRD.

    Integer keys are int-or-string as Kafka-style manifests quote them; their range is only checked
    for numbers (a string's range is checked by TopicConfig). Note: kube-apiserver refuses
    `additionalProperties: false` next to `properties` (kubernetes/kubernetes#94593), so a CRD must drop
    that key and leave unknown keys to pruning, strict field validation and `from_mapping`.
    """
    return {
        "type": "object",
        "description": "Kafka topic-level configs by Kafka name; see docs/topic-config.md.",
        "additionalProperties": False,
        "properties": {key.name: key.schema() for key in CONFIG_KEYS},
    }


def render_markdown() -> str:
    """docs/topic-config.md, generated from CONFIG_KEYS (a test keeps the committed file equal to this)."""
    lines = [
        "# Topic configuration",
        "",
        "<!-- Generated by render_markdown() in sidecar/topic_config.py: edit the table there, not this file. -->",
        "",
        "The topic-level configs Shale accepts: Kafka's names, types, defaults (Kafka 3.x) and valid values.",
        "In a `Topic`'s `spec.config`, `int` and `long` keys take a YAML integer or a string (`segment.ms: 100`",
        'or `segment.ms: "100"`), `double` and `boolean` keys take YAML numbers and booleans, and `string` and',
        "`list` keys take strings, lists comma-separated (`cleanup.policy: compact,delete`). Values set through",
        "Kafka's protocol are strings and are read as Kafka reads them.",
        "",
        "| Key | Type | Default | Valid values | Description |",
        "|---|---|---|---|---|",
    ]
    for key in CONFIG_KEYS:
        default = f"`{key.to_string(key.default)}`" if key.to_string(key.default) else '`""`'
        valid = f"`{key.validator.describe()}`" if key.validator else ""
        doc = key.doc.replace("|", r"\|")
        lines.append(f"| `{key.name}` | {key.type.name} | {default} | {valid} | {doc} |")
    return "\n".join(lines) + "\n"
