"""The options of `format("shale")`, parsed and checked once, with the names and meanings of Spark's Kafka source.

Spark hands options over case-insensitively, so names are compared in lower case. Errors are raised
while Spark analyses the query (the data source is built then), naming the option and the value.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Mapping

from .unsupported import refused

EARLIEST = -2  # Spark's and Kafka's markers inside a JSON offset spec
LATEST = -1

OffsetSpec = str | dict  # "earliest" | "latest" | {topic: {partition: offset}}

DEFAULT_MAX_TRIGGER_DELAY_MS = 15 * 60 * 1000  # Spark's maxTriggerDelay default, 15m
DEFAULT_GROUP_ID_PREFIX = "spark-kafka-source"  # Spark's groupIdPrefix default
DEFAULT_POLL_TIMEOUT_MS = 120_000  # Spark's kafkaConsumer.pollTimeoutMs default
_DURATION_UNITS_MS = {"us": 0.001, "ms": 1, "s": 1000, "m": 60_000, "min": 60_000, "h": 3_600_000, "d": 86_400_000}


class OptionError(ValueError):
    """An option of the shale data source that is missing, contradictory or malformed."""


@dataclass(frozen=True)
class Subscription:
    """Which topic partitions to read: exactly one of Spark's `assign`, `subscribe`, `subscribePattern`."""

    kind: str  # "assign" | "subscribe" | "subscribePattern"
    topics: tuple[str, ...] = ()
    pattern: str | None = None
    assigned: tuple[tuple[str, int], ...] = ()

    def matches(self, topic: str) -> bool:
        if self.kind == "subscribePattern":
            return not topic.startswith("__") and re.fullmatch(self.pattern, topic) is not None
        if self.kind == "subscribe":
            return topic in self.topics
        return any(t == topic for t, _ in self.assigned)


@dataclass(frozen=True)
class SourceOptions:
    """Everything the readers need, picklable (it travels to the executors inside the reader)."""

    bootstrap_servers: str | None
    path: str | None
    subscription: Subscription | None
    starting_offsets: OffsetSpec
    ending_offsets: OffsetSpec
    starting_timestamp: int | None = None
    starting_offsets_by_timestamp: dict | None = None
    ending_timestamp: int | None = None
    ending_offsets_by_timestamp: dict | None = None
    timestamp_strategy: str = "error"  # startingOffsetsByTimestampStrategy: "error" | "latest"
    min_partitions: int | None = None
    max_records_per_partition: int | None = None
    max_offsets_per_trigger: int | None = None
    min_offsets_per_trigger: int | None = None
    max_trigger_delay_ms: int = DEFAULT_MAX_TRIGGER_DELAY_MS
    include_headers: bool = False
    latest: bool = False
    fail_on_data_loss: bool = True
    kafka_conf: dict = field(default_factory=dict)  # `kafka.*` without the prefix, for librdkafka
    group_id_prefix: str = DEFAULT_GROUP_ID_PREFIX
    poll_timeout_ms: int = DEFAULT_POLL_TIMEOUT_MS
    topic: str | None = None  # the sink's target topic
    scan_report_dir: str | None = None

    @classmethod
    def parse(cls, options: Mapping[str, str], *, streaming: bool = False, for_write: bool = False) -> "SourceOptions":
        o = {k.lower(): v for k, v in options.items()}
        bootstrap = o.get("bootstrap.servers") or o.get("kafka.bootstrap.servers")
        path = o.get("path")
        if for_write:
            if not bootstrap:
                raise OptionError("writing needs option bootstrap.servers: Shale's files are written by `shale serve` "
                                  "only, never by Spark")
        elif bool(bootstrap) == bool(path):
            raise OptionError("give exactly one of bootstrap.servers (read over the Kafka protocol) and path "
                              "(read a data directory's segment files)")
        why = refused(o, streaming=streaming, for_write=for_write, path_read=bool(path) and not bootstrap)
        if why:
            raise OptionError(why)
        kafka_conf = {k[len("kafka."):]: v for k, v in o.items()
                      if k.startswith("kafka.") and k != "kafka.bootstrap.servers"}
        starting = _offset_spec(o, "startingoffsets", "latest" if streaming else "earliest")
        ending = _offset_spec(o, "endingoffsets", "latest")
        if not streaming and starting == "latest":
            raise OptionError("startingOffsets=latest is for streaming queries only, as in Spark's Kafka source")
        if ending == "earliest" or (isinstance(ending, dict) and _has(ending, EARLIEST)):
            raise OptionError("endingOffsets cannot be earliest (-2)")
        if isinstance(starting, dict) and not streaming and _has(starting, LATEST):
            raise OptionError("startingOffsets cannot be latest (-1) in a batch query")
        strategy = o.get("startingoffsetsbytimestampstrategy", "error").lower()
        if strategy not in ("error", "latest"):
            raise OptionError(f"startingOffsetsByTimestampStrategy must be error or latest, not {strategy!r}")
        latest = _bool(o, "latest", False)
        if latest and streaming:
            raise OptionError("latest=true is a batch view; stream the topic and keep state instead")
        split = [k for k in ("minPartitions", "maxRecordsPerPartition") if k.lower() in o]
        if latest and split:
            raise OptionError(f"latest=true reduces each partition whole in one read task, so {split[0]} cannot "
                              "split it; shale.pipeline.latest.read(spark, {..., 'latest': 'true'}) builds the view with "
                              "a Spark aggregation and takes it")
        return cls(
            bootstrap_servers=bootstrap,
            path=path if not bootstrap else None,
            subscription=None if for_write else _subscription(o),
            starting_offsets=starting,
            ending_offsets=ending,
            starting_timestamp=_int(o, "startingtimestamp"),
            starting_offsets_by_timestamp=_json_map(o, "startingoffsetsbytimestamp"),
            ending_timestamp=_int(o, "endingtimestamp"),
            ending_offsets_by_timestamp=_json_map(o, "endingoffsetsbytimestamp"),
            timestamp_strategy=strategy,
            min_partitions=_positive(o, "minpartitions"),
            max_records_per_partition=_positive(o, "maxrecordsperpartition"),
            max_offsets_per_trigger=_positive(o, "maxoffsetspertrigger"),
            min_offsets_per_trigger=_positive(o, "minoffsetspertrigger"),
            max_trigger_delay_ms=_duration_ms(o, "maxtriggerdelay", DEFAULT_MAX_TRIGGER_DELAY_MS),
            include_headers=include_headers(o),
            latest=latest,
            fail_on_data_loss=_bool(o, "failondataloss", True),
            kafka_conf=kafka_conf,
            group_id_prefix=o.get("groupidprefix", DEFAULT_GROUP_ID_PREFIX),
            poll_timeout_ms=_positive(o, "kafkaconsumer.polltimeoutms") or DEFAULT_POLL_TIMEOUT_MS,
            topic=o.get("topic"),
            scan_report_dir=o.get("scanreportdir"),
        )


def include_headers(options: Mapping[str, str]) -> bool:
    """Whether the schema has the headers column (`includeHeaders`, default false as in Spark's Kafka source)."""
    return _bool({k.lower(): v for k, v in options.items()}, "includeheaders", False)


def _subscription(o: dict) -> Subscription:
    given = [k for k in ("assign", "subscribe", "subscribepattern") if o.get(k)]
    if len(given) != 1:
        raise OptionError("give exactly one of assign, subscribe and subscribePattern"
                          + (f" (got {', '.join(given)})" if given else ""))
    kind = given[0]
    value = o[kind]
    if kind == "subscribe":
        topics = tuple(t.strip() for t in value.split(",") if t.strip())
        if not topics:
            raise OptionError(f"subscribe={value!r} names no topic")
        return Subscription("subscribe", topics=topics)
    if kind == "subscribepattern":
        try:
            re.compile(value)
        except re.error as e:
            raise OptionError(f"subscribePattern={value!r} is not a regular expression: {e}") from None
        return Subscription("subscribePattern", pattern=value)
    parsed = _parse_json(value, "assign")
    if not isinstance(parsed, dict) or not all(isinstance(v, list) for v in parsed.values()):
        raise OptionError(f'assign must be JSON like {{"topicA":[0,1]}}, not {value!r}')
    assigned = tuple(sorted((t, int(p)) for t, parts in parsed.items() for p in parts))
    return Subscription("assign", topics=tuple(sorted(parsed)), assigned=assigned)


def _offset_spec(o: dict, name: str, default: str) -> OffsetSpec:
    value = o.get(name)
    if value is None:
        return default
    if value.strip().lower() in ("earliest", "latest"):
        return value.strip().lower()
    parsed = _parse_json(value, name)
    if not isinstance(parsed, dict):
        raise OptionError(f'{name} must be earliest, latest or JSON like {{"topic":{{"0":23}}}}, not {value!r}')
    return {t: {int(p): int(off) for p, off in parts.items()} for t, parts in parsed.items()}


def _json_map(o: dict, name: str) -> dict | None:
    value = o.get(name)
    if value is None:
        return None
    parsed = _parse_json(value, name)
    if not isinstance(parsed, dict):
        raise OptionError(f'{name} must be JSON like {{"topic":{{"0":1700000000000}}}}, not {value!r}')
    return {t: {int(p): int(ts) for p, ts in parts.items()} for t, parts in parsed.items()}


def _has(spec: dict, marker: int) -> bool:
    return any(off == marker for parts in spec.values() for off in parts.values())


def _parse_json(value: str, name: str):
    try:
        return json.loads(value)
    except json.JSONDecodeError as e:
        raise OptionError(f"option {name}={value!r} is not valid JSON: {e}") from None


def _bool(o: dict, name: str, default: bool) -> bool:
    value = o.get(name)
    if value is None:
        return default
    if value.strip().lower() not in ("true", "false"):
        raise OptionError(f"option {name} must be true or false, not {value!r}")
    return value.strip().lower() == "true"


def _int(o: dict, name: str) -> int | None:
    value = o.get(name)
    if value is None:
        return None
    try:
        return int(value)
    except ValueError:
        raise OptionError(f"option {name} must be an integer, not {value!r}") from None


def _duration_ms(o: dict, name: str, default: int) -> int:
    """A duration as Spark writes them ("15m", "30s", "500ms", "1h"; a bare number is milliseconds)."""
    value = o.get(name)
    if value is None:
        return default
    m = re.fullmatch(r"\s*(\d+)\s*([a-z]*)\s*", value.lower())
    if m is None or m.group(2) not in ("", *_DURATION_UNITS_MS):
        raise OptionError(f"option {name} must be a duration like 15m, 30s or 500ms, not {value!r}")
    return int(int(m.group(1)) * _DURATION_UNITS_MS.get(m.group(2) or "ms", 1))


def _positive(o: dict, name: str) -> int | None:
    n = _int(o, name)
    if n is not None and n <= 0:
        raise OptionError(f"option {name} must be positive, not {n}")
    return n
