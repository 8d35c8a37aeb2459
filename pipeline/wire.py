"""Reading topics over the Kafka protocol with confluent-kafka (librdkafka).

confluent-kafka rather than kafka-python for bulk reads: librdkafka fetches and decodes record
batches in C on its own threads, so the Python side only moves finished messages into Arrow columns
and fetching overlaps with that work. kafka-python decodes in Python. Against `shale serve` on 2
cores (`bench/spark_read.py`, docs/performance.md), one partition of 100-byte records: 559,000
records/s with confluent-kafka and the prefetch settings below, 151,000 with kafka-python. Both
clients are pinned already (the protocol tests use them).

The consumer only ever `assign`s partitions: no group membership, no offset commits — a Spark
query's position lives in its checkpoint, as with Spark's own Kafka source. Its `group.id` is
`kafka.group.id` if given (for group-based authorization), else `groupIdPrefix` plus a random
suffix, as Spark names its consumers.
"""

from __future__ import annotations

import time
import uuid
from typing import Iterable, Iterator

from confluent_kafka import (
    TIMESTAMP_LOG_APPEND_TIME,
    Consumer,
    KafkaError,
    KafkaException,
    TopicPartition,
)

from .options import SourceOptions
from .ranges import OffsetRange

TIMEOUT_S = 30.0
CONSUME_BATCH = 10000

# Prefetch deep queues with large fetches: the reader wants everything up to the end offset now.
CONSUMER_DEFAULTS = {
    "enable.auto.commit": False,
    "enable.auto.offset.store": False,
    "enable.partition.eof": True,
    "isolation.level": "read_uncommitted",  # what the file reader sees too (Spark's default as well)
    "queued.min.messages": 1_000_000,
    "queued.max.messages.kbytes": 262_144,
    "fetch.wait.max.ms": 10,
    "max.partition.fetch.bytes": 8 << 20,
    "fetch.max.bytes": 64 << 20,
    "receive.message.max.bytes": 100 << 20,
}


def consumer_config(opts: SourceOptions) -> dict:
    """librdkafka settings: the prefetch defaults, then `kafka.*` (the settings the source relies on are
    refused while options are parsed, see `unsupported`)."""
    conf = dict(CONSUMER_DEFAULTS)
    conf.update({"bootstrap.servers": opts.bootstrap_servers,
                 "group.id": f"{opts.group_id_prefix}-{uuid.uuid4().hex}",
                 # a start offset below the log start is data loss: fail, or go on from the earliest
                 "auto.offset.reset": "error" if opts.fail_on_data_loss else "earliest"})
    conf.update(opts.kafka_conf)  # kafka.group.id, if given, replaces the generated one
    return conf


class WireCluster:
    """Topic metadata and offset lookups (ListOffsets) for planning a read."""

    def __init__(self, opts: SourceOptions) -> None:
        self.bootstrap = opts.bootstrap_servers
        self._consumer = Consumer(consumer_config(opts))

    def topics(self, names: list[str] | None = None) -> dict[str, list[int]]:
        """Partitions of the named topics that exist (of all topics when `names` is None)."""
        if names is None:
            listed = self._consumer.list_topics(timeout=TIMEOUT_S).topics.values()
        else:  # one topic per request: the smallest Metadata request every broker answers
            listed = [self._consumer.list_topics(n, timeout=TIMEOUT_S).topics.get(n) for n in names]
        return {t.topic: sorted(t.partitions) for t in listed if t is not None and t.error is None}

    def watermarks(self, tps: Iterable[tuple[str, int]]) -> dict[tuple[str, int], tuple[int, int]]:
        """(log start offset, high watermark) of each partition."""
        out = {}
        for t, p in tps:
            try:
                out[(t, p)] = self._consumer.get_watermark_offsets(TopicPartition(t, p), timeout=TIMEOUT_S, cached=False)
            except KafkaException as e:
                raise RuntimeError(f"{t}-{p}: listing offsets at {self.bootstrap} failed: {e}") from None
        return out

    def offsets_for_timestamp(self, stamps: dict[tuple[str, int], int]) -> dict[tuple[str, int], int | None]:
        """The first offset whose timestamp is >= the given one (ms) per partition, or None if there is none."""
        if not stamps:
            return {}
        asked = [TopicPartition(t, p, ts) for (t, p), ts in stamps.items()]
        found = self._consumer.offsets_for_times(asked, timeout=TIMEOUT_S)
        out = {}
        for tp in found:
            if tp.error is not None:
                raise RuntimeError(f"{tp.topic}-{tp.partition}: offset lookup by timestamp failed: {tp.error}")
            out[(tp.topic, tp.partition)] = tp.offset if tp.offset >= 0 else None
        return out

    def close(self) -> None:
        self._consumer.close()


def read_range(opts: SourceOptions, r: OffsetRange, builder, info: dict) -> Iterator:
    """Add each record of `r` to `builder`, yielding its record batches as they fill.

    `info` receives what was read (for the scan report). A `min_timestamp` on the range moves the
    start to the first offset with a timestamp at or above it (ListOffsets by time), and older
    records after that are dropped. No record for `kafkaConsumer.pollTimeoutMs` while some are
    still due is an error, as in Spark.
    """
    consumer = Consumer(consumer_config(opts))
    bootstrap = opts.bootstrap_servers
    poll_timeout_s = opts.poll_timeout_ms / 1000
    where = f"{r.topic}-{r.partition}"
    start = r.start
    records = 0
    try:
        if r.min_timestamp is not None:
            [found] = consumer.offsets_for_times([TopicPartition(r.topic, r.partition, r.min_timestamp)],
                                                 timeout=TIMEOUT_S)
            if found.error is not None:
                raise RuntimeError(f"{where}: offset lookup by timestamp failed: {found.error}")
            start = r.end if found.offset < 0 else max(start, found.offset)
        if start >= r.end:
            info.update(fetch_start=start, records=0)
            return
        consumer.assign([TopicPartition(r.topic, r.partition, start)])
        last_progress = time.monotonic()
        min_ts = r.min_timestamp
        add = builder.add
        end = r.end
        done = False
        while not done:
            msgs = consumer.consume(CONSUME_BATCH, 0.1)  # returns early once that many are queued
            if not msgs:
                if time.monotonic() - last_progress > poll_timeout_s:
                    raise TimeoutError(f"{where}: no records for {opts.poll_timeout_ms} ms "
                                       f"(kafkaConsumer.pollTimeoutMs) while reading offsets [{start}, {end}) "
                                       f"from {bootstrap}")
                continue
            last_progress = time.monotonic()
            for m in msgs:
                err = m.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        if m.offset() >= end:  # the high watermark: nothing at or past `end` will come
                            done = True
                            break
                        continue
                    raise RuntimeError(f"{where}: reading offsets [{start}, {end}) from {bootstrap} failed: {err}")
                offset = m.offset()
                if offset >= end:
                    done = True
                    break
                ts_type, ts = m.timestamp()
                if min_ts is not None and ts < min_ts:
                    continue
                add(m.key(), m.value(), offset, ts, 1 if ts_type == TIMESTAMP_LOG_APPEND_TIME else 0, m.headers())
                records += 1
            if builder.full:
                yield builder.take()
        info.update(fetch_start=start, records=records)
    finally:
        consumer.close()
