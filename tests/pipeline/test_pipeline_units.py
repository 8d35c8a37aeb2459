"""The data source's pure parts without Spark running: options, pushdown, range arithmetic, the Arrow
layout and the Arrow latest view, checked against models (hypothesis where the space is large)."""

from __future__ import annotations

import datetime as dt
import os
import select

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pyspark.sql.datasource import (
    EqualTo,
    GreaterThan,
    GreaterThanOrEqual,
    In,
    IsNotNull,
    LessThan,
    LessThanOrEqual,
    Not,
    StringStartsWith,
)
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import _parse_datatype_string

from shale.pipeline.latest import reduce_latest
from shale.pipeline.options import OptionError, SourceOptions
from shale.pipeline.pushdown import epoch_micros, push_filters
from shale.pipeline.ranges import OffsetRange, rate_limit, split_for_min_partitions, split_ranges
from shale.pipeline.read_plan import check_specs_cover
from shale.pipeline.schema import BatchBuilder, arrow_schema, spark_ddl
from shale.pipeline.wire import consumer_config

# -- options --------------------------------------------------------------------------------------


def test_options_follow_spark_kafka_names_and_defaults():
    o = SourceOptions.parse({"bootstrap.servers": "h:1", "subscribe": "a, b", "minPartitions": "8",
                             "kafka.fetch.wait.max.ms": "5", "endingOffsets": '{"a": {"0": 10, "1": -1}}'})
    assert o.subscription.topics == ("a", "b") and o.min_partitions == 8
    assert o.starting_offsets == "earliest" and o.ending_offsets == {"a": {0: 10, 1: -1}}
    assert o.kafka_conf == {"fetch.wait.max.ms": "5"} and not o.include_headers and not o.latest
    s = SourceOptions.parse({"path": "/d", "assign": '{"t": [1, 0]}', "MAXOFFSETSPERTRIGGER": "5"}, streaming=True)
    assert s.starting_offsets == "latest" and s.subscription.assigned == (("t", 0), ("t", 1))
    assert s.max_offsets_per_trigger == 5 and s.path == "/d"
    assert SourceOptions.parse({"kafka.bootstrap.servers": "h:1", "subscribePattern": "p.*"}).subscription.matches("px")
    assert not SourceOptions.parse({"path": "/d", "subscribePattern": ".*"}).subscription.matches("__consumer_offsets")


@pytest.mark.parametrize("options, streaming, message", [
    ({"subscribe": "t"}, False, "exactly one of bootstrap.servers"),
    ({"path": "/d", "bootstrap.servers": "h:1", "subscribe": "t"}, False, "exactly one of bootstrap.servers"),
    ({"path": "/d"}, False, "exactly one of assign, subscribe"),
    ({"path": "/d", "subscribe": "t", "assign": '{"t":[0]}'}, False, "exactly one of assign, subscribe"),
    ({"path": "/d", "subscribe": "t", "startingOffsets": "latest"}, False, "streaming queries only"),
    ({"path": "/d", "subscribe": "t", "endingOffsets": "earliest"}, False, "cannot be earliest"),
    ({"path": "/d", "subscribe": "t", "endingOffsets": "latest"}, True, "batch queries only"),
    ({"path": "/d", "subscribe": "t", "startingOffsets": "{oops"}, False, "not valid JSON"),
    ({"path": "/d", "subscribe": "t", "minPartitions": "0"}, False, "must be positive"),
    ({"path": "/d", "subscribe": "t", "latest": "yes"}, False, "true or false"),
    ({"path": "/d", "subscribe": "t", "latest": "true"}, True, "batch view"),
    ({"path": "/d", "subscribePattern": "("}, False, "not a regular expression"),
])
def test_bad_options_are_refused_naming_the_option(options, streaming, message):
    with pytest.raises(OptionError, match=message):
        SourceOptions.parse(options, streaming=streaming)


def test_spark_kafka_options_beyond_the_basics():
    o = SourceOptions.parse({"path": "/d", "subscribe": "t", "minOffsetsPerTrigger": "500", "maxTriggerDelay": "30s",
                             "maxRecordsPerPartition": "1000", "includeHeaders": "TRUE"}, streaming=True)
    assert (o.min_offsets_per_trigger, o.max_trigger_delay_ms, o.max_records_per_partition) == (500, 30_000, 1000)
    assert o.include_headers
    delays = {"15m": 900_000, "2h": 7_200_000, "250ms": 250, "1500": 1500, " 3 s ": 3000, "1d": 86_400_000}
    for text, ms in delays.items():
        assert SourceOptions.parse({"path": "/d", "subscribe": "t", "maxTriggerDelay": text}).max_trigger_delay_ms == ms
    assert SourceOptions.parse({"path": "/d", "subscribe": "t"}).max_trigger_delay_ms == 15 * 60_000  # Spark's default

    wire = {"bootstrap.servers": "h:1", "subscribe": "t"}
    default = consumer_config(SourceOptions.parse(wire))
    assert default["group.id"].startswith("spark-kafka-source-") and default["auto.offset.reset"] == "error"
    prefixed = consumer_config(SourceOptions.parse({**wire, "groupIdPrefix": "team-a", "failOnDataLoss": "false"}))
    assert prefixed["group.id"].startswith("team-a-") and prefixed["auto.offset.reset"] == "earliest"
    assert consumer_config(SourceOptions.parse({**wire, "kafka.group.id": "acl-group", "groupIdPrefix": "x"}))[
        "group.id"] == "acl-group"  # kafka.group.id wins, as in Spark
    assert SourceOptions.parse({**wire, "kafkaConsumer.pollTimeoutMs": "5000"}).poll_timeout_ms == 5000


@pytest.mark.parametrize("options, streaming, message", [
    ({"bootstrap.servers": "h:1", "fetchOffset.numRetries": "3"}, False, "fetchOffset.numRetries is not supported"),
    ({"bootstrap.servers": "h:1", "fetchOffset.retryIntervalMs": "10"}, True, "fetchOffset.retryIntervalMs is not"),
    ({"bootstrap.servers": "h:1", "kafka.auto.offset.reset": "earliest"}, False, "set startingOffsets"),
    ({"bootstrap.servers": "h:1", "kafka.enable.auto.commit": "true"}, True, "never commits offsets"),
    ({"bootstrap.servers": "h:1", "kafka.value.deserializer": "x"}, False, "values are always binary"),
    ({"bootstrap.servers": "h:1", "kafka.enable.partition.eof": "false"}, False, "where a partition ends"),
    ({"path": "/d", "kafka.security.protocol": "SSL"}, False, "kafka.security.protocol configures the Kafka client"),
    ({"path": "/d", "groupIdPrefix": "x"}, False, "groupIdPrefix configures the Kafka client"),
    ({"path": "/d", "kafkaConsumer.pollTimeoutMs": "9"}, True, "kafkaConsumer.pollTimeoutMs configures"),
    ({"path": "/d", "endingTimestamp": "5"}, True, "endingTimestamp is for batch queries only"),
    ({"path": "/d", "endingOffsetsByTimestamp": '{"t":{"0":5}}'}, True, "endingOffsetsByTimestamp is for batch"),
    ({"path": "/d", "maxTriggerDelay": "soon"}, True, "must be a duration"),
    ({"path": "/d", "maxRecordsPerPartition": "-1"}, False, "must be positive"),
    ({"path": "/d", "latest": "true", "minPartitions": "4"}, False, "minPartitions cannot split it"),
    ({"path": "/d", "latest": "true", "maxRecordsPerPartition": "9"}, False, "maxRecordsPerPartition cannot split"),
])
def test_options_the_source_does_not_take_are_refused(options, streaming, message):
    with pytest.raises(OptionError, match=message):
        SourceOptions.parse({"subscribe": "t", **options}, streaming=streaming)


def test_the_sink_refuses_serializers():
    with pytest.raises(OptionError, match="write the value column as string or binary"):
        SourceOptions.parse({"bootstrap.servers": "h:1", "topic": "t", "kafka.value.serializer": "x"}, for_write=True)


def test_writing_needs_a_server():
    with pytest.raises(OptionError, match="written by `shale serve` only"):
        SourceOptions.parse({"path": "/d", "topic": "t"}, for_write=True)


# -- pushdown -------------------------------------------------------------------------------------

P, O, TS = ("partition",), ("offset",), ("timestamp",)


def test_partition_and_offset_filters_are_exact_and_handled():
    push, rest = push_filters([EqualTo(P, 1), GreaterThanOrEqual(O, 10), LessThan(O, 20), IsNotNull(O),
                               StringStartsWith(("topic",), "x")])
    assert rest == [StringStartsWith(("topic",), "x")]
    assert push.narrow(OffsetRange("t", 1, 0, 100)) == OffsetRange("t", 1, 10, 20)
    assert push.narrow(OffsetRange("t", 0, 0, 100)) is None
    assert push.narrow(OffsetRange("t", 1, 25, 100)) is None


def test_timestamp_lower_bounds_prune_but_go_back_to_spark():
    when = dt.datetime(2024, 1, 1, 0, 0, 0, 1500, tzinfo=dt.timezone.utc)  # 1.5 ms past the second
    gt, ge, lt = GreaterThan(TS, when), GreaterThanOrEqual(TS, when), LessThan(TS, when)
    push, rest = push_filters([gt, ge, lt])
    assert rest == [gt, ge, lt]
    second_ms = epoch_micros(when) // 1000 - 1
    # ts_ms * 1000 > micros  <=>  ts_ms >= floor(micros / 1000) + 1; >= rounds up: the same here
    assert push.timestamp_min == second_ms + 2
    assert push_filters([GreaterThanOrEqual(TS, when.replace(microsecond=1000))])[0].timestamp_min == second_ms + 1


def test_the_latest_view_pushes_only_partitions():
    filters = [In(P, (0, 2)), GreaterThan(O, 5), GreaterThan(TS, dt.datetime(2024, 1, 1, tzinfo=dt.timezone.utc))]
    push, rest = push_filters(filters, latest=True)
    assert rest == filters[1:]
    assert push.narrow(OffsetRange("t", 2, 0, 9)) == OffsetRange("t", 2, 0, 9)
    assert push.narrow(OffsetRange("t", 1, 0, 9)) is None


_ops = st.sampled_from(["eq", "gt", "ge", "lt", "le", "in", "ne"])


def _filter(column, op, v, vs):
    if op == "in":
        return In(column, tuple(vs))
    if op == "ne":
        return Not(EqualTo(column, v))
    return {"eq": EqualTo, "gt": GreaterThan, "ge": GreaterThanOrEqual, "lt": LessThan, "le": LessThanOrEqual}[op](column, v)


def _holds(op, x, v, vs) -> bool:
    return {"eq": x == v, "gt": x > v, "ge": x >= v, "lt": x < v, "le": x <= v, "in": x in vs, "ne": x != v}[op]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["partition", "offset"]), _ops, st.integers(0, 12),
                          st.lists(st.integers(0, 12), min_size=1, max_size=3)), max_size=4),
       st.integers(0, 3), st.integers(0, 12), st.integers(0, 12))
def test_pushdown_keeps_exactly_what_the_filters_match(conds, partition, a, b):
    """Model: the rows the filters accept, and the narrowed range must hold all of them; where
    Spark is told a filter is handled, the range must hold nothing else."""
    filters = [_filter((col,), op, v, vs) for col, op, v, vs in conds]
    push, rest = push_filters(filters)
    r = OffsetRange("t", partition, min(a, b), max(a, b))
    narrowed = push.narrow(r)
    kept = set(range(narrowed.start, narrowed.end)) if narrowed else set()
    for offset in range(r.start, r.end):
        row = {"partition": partition, "offset": offset}
        matches = all(_holds(op, row[col], v, vs) for col, op, v, vs in conds)
        handled_ok = all(_holds(op, row[col], v, vs) for (col, op, v, vs), f in zip(conds, filters) if f not in rest)
        if matches:
            assert offset in kept
        if offset in kept:
            assert handled_ok, "an offset outside a handled filter was kept"


# -- ranges ---------------------------------------------------------------------------------------

@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 1000), st.integers(0, 5000)), min_size=1, max_size=6),
       st.one_of(st.none(), st.integers(1, 40)))
def test_min_partitions_split_covers_each_range_exactly(spans, min_partitions):
    ranges = [OffsetRange("t", i, s, s + n) for i, (s, n) in enumerate(spans)]
    pieces = split_for_min_partitions(ranges, min_partitions)
    for r in ranges:
        mine = [p for p in pieces if p.partition == r.partition]
        assert [o for p in mine for o in range(p.start, p.end)] == list(range(r.start, r.end))
        assert all(p.size > 0 for p in mine)
    nonempty = [r for r in ranges if r.size]
    if nonempty and min_partitions and min_partitions > len(nonempty):
        # Spark's rule: each range gets round(share * minPartitions) pieces, at least one
        assert len(pieces) >= min(min_partitions, sum(r.size for r in nonempty)) - len(nonempty)
        biggest = max(nonempty, key=lambda r: r.size)
        smallest = min(nonempty, key=lambda r: r.size)
        count = lambda r: sum(1 for p in pieces if p.partition == r.partition)  # noqa: E731
        assert count(biggest) >= count(smallest)
    else:
        assert pieces == nonempty


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 1000), st.integers(0, 3000)), min_size=1, max_size=5),
       st.one_of(st.none(), st.integers(1, 12)), st.integers(1, 700))
def test_max_records_per_partition_caps_every_task(spans, min_partitions, max_records):
    ranges = [OffsetRange("t", i, s, s + n) for i, (s, n) in enumerate(spans)]
    pieces = split_ranges(ranges, min_partitions, max_records)
    for r in ranges:
        mine = [p for p in pieces if p.partition == r.partition]
        assert [o for p in mine for o in range(p.start, p.end)] == list(range(r.start, r.end))
    assert all(0 < p.size <= max_records for p in pieces)
    # no more pieces than needed: each minPartitions piece is cut into ceil(size / max) equal parts
    assert len(pieces) == sum(-(-p.size // max_records) for p in split_for_min_partitions(ranges, min_partitions))


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.integers(0, 5), st.tuples(st.integers(0, 100), st.integers(-20, 200)), min_size=1),
       st.one_of(st.none(), st.integers(1, 300)))
def test_rate_limit_shares_exactly_the_limit(parts, limit):
    start = {("t", p): s for p, (s, _) in parts.items()}
    latest = {("t", p): s + d for p, (s, d) in parts.items()}
    ends = rate_limit(start, latest, limit)
    available = {tp: max(0, latest[tp] - start[tp]) for tp in start}
    advanced = {tp: ends[tp] - start[tp] for tp in start}
    assert all(0 <= advanced[tp] <= available[tp] for tp in start)
    total = sum(available.values())
    assert sum(advanced.values()) == (total if limit is None else min(total, limit))


# -- Arrow layout and the Arrow latest view -------------------------------------------------------

@pytest.mark.parametrize("headers", [True, False])
def test_batches_have_exactly_the_arrow_schema_spark_checks(spark, headers):
    expected = to_arrow_schema(_parse_datatype_string(spark_ddl(headers)), timezone="UTC")
    assert arrow_schema(headers).equals(expected)
    b = BatchBuilder("t", 3, headers)
    b.add(b"k", b"v", 7, 1_700_000_000_123, 1, [("h1", b"x"), ("h2", None)])
    b.add(None, None, 8, -1, 0, None)
    batch = b.take()
    assert batch.schema.equals(expected) and b.take() is None
    got = batch.to_pylist()
    assert got[0]["timestamp"] == dt.datetime(2023, 11, 14, 22, 13, 20, 123000, tzinfo=dt.timezone.utc)
    assert (got[0]["partition"], got[0]["offset"], got[0]["timestampType"], got[1]["key"]) == (3, 7, 1, None)
    if headers:
        assert got[0]["headers"] == [{"key": "h1", "value": b"x"}, {"key": "h2", "value": None}]
        assert got[1]["headers"] == []


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([None, b"a", b"b", b"c", b"d"]),
                          st.one_of(st.none(), st.binary(max_size=3))), max_size=40),
       st.integers(1, 7))
def test_arrow_latest_view_equals_the_model(writes, rows):
    b = BatchBuilder("t", 0, True, rows=rows)
    batches = []
    model: dict = {}
    for offset, (key, value) in enumerate(writes):
        b.add(key, value, offset * 2, 1000 + offset, 0, None)  # offsets with gaps, as after compaction
        if b.full:
            batches.append(b.take())
        if key is not None:
            model[key] = (offset * 2, value)
    if len(b):
        batches.append(b.take())
    got = [r for batch in reduce_latest(batches, arrow_schema(True)) for r in batch.to_pylist()]
    assert {r["key"]: (r["offset"], r["value"]) for r in got} == {k: v for k, v in model.items() if v[1] is not None}
    assert len(got) == len({r["key"] for r in got})
    assert [r["offset"] for r in got] == sorted(r["offset"] for r in got)


def test_arrow_latest_view_of_nothing_is_nothing():
    assert list(reduce_latest([], arrow_schema(False))) == []
    assert pa.Table.from_batches([], schema=arrow_schema(False)).num_rows == 0


# -- the py4j callback server in a process with many open files --------------------------------------

def test_callback_server_accepts_on_descriptors_above_1023(spark):
    """py4j's accept loop uses select(), which refuses fds > 1023 and silently kills the thread that
    runs foreachBatch callbacks; the session uses poll() instead (a test process easily holds that many)."""
    import socket

    import py4j.java_gateway

    from shale.pipeline.session import _PollSelect

    assert py4j.java_gateway.select is _PollSelect
    held = [os.open(os.devnull, os.O_RDONLY) for _ in range(1100)]
    try:
        server = socket.create_server(("127.0.0.1", 0))
        assert server.fileno() > 1023
        with pytest.raises(ValueError, match="filedescriptor out of range"):
            select.select([server], [], [], 0)
        assert _PollSelect.select([server], [], [], 0.05) == ([], [], [])
        client = socket.create_connection(server.getsockname())
        assert _PollSelect.select([server], [], [], 5) == ([server], [], [])
        client.close()
        server.close()
    finally:
        for fd in held:
            os.close(fd)


# -- registration ---------------------------------------------------------------------------------

def test_register_sees_what_the_session_has_registered(spark):
    """`register` skips a session that has the source (statically, or from an earlier call): the check asks
    the JVM's DataSourceManager, so it must tell a registered name from an unknown one."""
    from shale.pipeline.session import _registered, register

    assert _registered(spark, "shale") and not _registered(spark, "no-such-source")
    register(spark)  # a second call is a no-op, and the source still reads
    assert spark.read.format("shale").option("path", "/nonexistent").option("subscribe", "t").load().columns[:2] == [
        "key", "value"]


def test_json_offsets_must_name_every_partition_read_unless_a_higher_option_wins():
    tps = [("t", 0), ("t", 1)]

    def check(**options):
        check_specs_cover(SourceOptions.parse({"path": "/d", "subscribe": "t", **options}), tps)

    check(startingOffsets='{"t": {"0": 1, "1": -2}}', endingOffsets='{"t": {"0": 5, "1": -1}}')
    for option in ("startingOffsets", "endingOffsets", "startingOffsetsByTimestamp", "endingOffsetsByTimestamp"):
        with pytest.raises(OptionError, match=f"If {option} contains specific offsets.*Specified: t-0, t-2. "
                                              "Assigned: t-0, t-1"):
            check(**{option: '{"t": {"0": 1, "2": 1}}'})
    # Spark's precedence: a timestamp beats the by-timestamp JSON, which beats the offsets JSON; the losers are ignored.
    check(startingTimestamp="1700000000000", startingOffsetsByTimestamp='{"t": {"0": 1}}', startingOffsets='{"t": {"0": 1}}')
    check(startingOffsetsByTimestamp='{"t": {"0": 1, "1": 1}}', startingOffsets='{"t": {"0": 1}}')
    check(endingTimestamp="1700000000000", endingOffsets='{"t": {"0": 1}}')
