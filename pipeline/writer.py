"""The sink of `format("shale")`: a DataFrame's rows produced to a topic, in batch and streaming queries.

Columns as Spark's Kafka sink takes them: `value` (string or binary, null = a tombstone) is
required; `key`, `headers` (array<struct<key:string,value:binary>>), `partition` (int) and `topic`
are optional, and the `topic` option wins over the column. Other columns are ignored.

Delivery is at least once, as with Spark's Kafka sink: each task produces with an idempotent
producer (no duplicates within a task, acks=all), but a retried task or a replayed micro-batch
produces its rows again. For a compacted topic keyed by id that is harmless: the latest record
per key is the same.

Rows without a partition go where Kafka's Java producer would put them (murmur2 of the key),
so a key lands in the same partition whether Spark or a Java service writes it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Iterator

import pyarrow as pa
from confluent_kafka import KafkaException, Producer
from pyspark.sql.datasource import DataSourceArrowWriter, DataSourceStreamArrowWriter, WriterCommitMessage
from pyspark.sql.types import ArrayType, BinaryType, IntegerType, StringType, StructType

from .options import OptionError, SourceOptions

log = logging.getLogger(__name__)

PRODUCER_DEFAULTS = {
    "acks": "all",
    "enable.idempotence": True,
    "partitioner": "murmur2_random",  # the Java client's default partitioner
    "linger.ms": 5,
    "batch.size": 1 << 20,
    "queue.buffering.max.messages": 1_000_000,
    "queue.buffering.max.kbytes": 1 << 20,
}
FLUSH_TIMEOUT_S = 300.0


@dataclass
class WriteResult(WriterCommitMessage):
    """Records delivered by one task, per topic partition."""

    delivered: dict = field(default_factory=dict)

    @property
    def total(self) -> int:
        return sum(self.delivered.values())


def check_schema(schema: StructType, opts: SourceOptions) -> None:
    """Refuse, while the query is planned, a DataFrame the sink cannot write."""
    types = {f.name: f.dataType for f in schema.fields}
    if "value" not in types:
        raise OptionError(f"the shale sink needs a value column (string or binary); the DataFrame has {list(types)}")
    for name in ("key", "value"):
        if name in types and not isinstance(types[name], (StringType, BinaryType)):
            raise OptionError(f"column {name} must be string or binary, not {types[name].simpleString()}")
    if "partition" in types and not isinstance(types["partition"], IntegerType):
        raise OptionError(f"column partition must be int, not {types['partition'].simpleString()}")
    if "topic" in types and not isinstance(types["topic"], StringType):
        raise OptionError(f"column topic must be string, not {types['topic'].simpleString()}")
    if "headers" in types:
        h = types["headers"]
        ok = (isinstance(h, ArrayType) and isinstance(h.elementType, StructType)
              and [f.name for f in h.elementType.fields] == ["key", "value"]
              and isinstance(h.elementType["key"].dataType, StringType)
              and isinstance(h.elementType["value"].dataType, BinaryType))
        if not ok:
            raise OptionError(f"column headers must be array<struct<key:string,value:binary>>, not {h.simpleString()}")
    if not opts.topic and "topic" not in types:
        raise OptionError("say which topic to write: option topic, or a topic column")


def produce_batches(opts: SourceOptions, batches: Iterator[pa.RecordBatch]) -> WriteResult:
    """Produce every row and wait until all are acknowledged; raise naming the topic partition if any fails."""
    conf = dict(PRODUCER_DEFAULTS)
    conf["bootstrap.servers"] = opts.bootstrap_servers
    conf.update(opts.kafka_conf)
    producer = Producer(conf)
    result = WriteResult()
    errors: list[str] = []

    def delivered(err, msg) -> None:
        if err is not None:
            if len(errors) < 5:
                errors.append(f"{msg.topic()}-{msg.partition()}: {err}")
            return
        tp = (msg.topic(), msg.partition())
        result.delivered[tp] = result.delivered.get(tp, 0) + 1

    produce = producer.produce
    for batch in batches:
        n = batch.num_rows
        names = batch.schema.names
        values = batch.column("value").to_pylist()
        keys = batch.column("key").to_pylist() if "key" in names else [None] * n
        if opts.topic:
            topics = [opts.topic] * n
        else:
            topics = batch.column("topic").to_pylist()
        partitions = batch.column("partition").to_pylist() if "partition" in names else None
        headers = batch.column("headers").to_pylist() if "headers" in names else None
        for i in range(n):
            kwargs = {}
            if partitions is not None and partitions[i] is not None:
                kwargs["partition"] = partitions[i]
            if headers is not None and headers[i]:
                kwargs["headers"] = [(h["key"], h["value"]) for h in headers[i]]
            if topics[i] is None:
                raise OptionError("a row has a null topic and no topic option is set")
            while True:
                try:
                    produce(topics[i], values[i], keys[i], on_delivery=delivered, **kwargs)
                    break
                except BufferError:
                    producer.poll(0.05)  # the local queue is full: let deliveries drain it
                except KafkaException as e:
                    raise RuntimeError(f"{topics[i]}-{kwargs.get('partition', '?')}: produce failed: {e}") from None
        producer.poll(0)
        if errors:
            break
    left = producer.flush(FLUSH_TIMEOUT_S)
    if errors:
        raise RuntimeError(f"producing to {opts.bootstrap_servers} failed: " + "; ".join(errors))
    if left:
        raise RuntimeError(f"{left} records were not acknowledged by {opts.bootstrap_servers} "
                           f"within {FLUSH_TIMEOUT_S:.0f} s")
    return result


class ShaleWriter(DataSourceArrowWriter):
    def __init__(self, opts: SourceOptions) -> None:
        self.opts = opts

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriteResult:
        return produce_batches(self.opts, iterator)

    def commit(self, messages: list[WriteResult | None]) -> None:
        log.info("produced %d records to %s", sum(m.total for m in messages if m), self.opts.bootstrap_servers)

    def abort(self, messages: list[WriteResult | None]) -> None:
        done = sum(m.total for m in messages if m)
        log.warning("write to %s aborted after %d records were produced (they stay: Kafka has no rollback "
                    "outside transactions)", self.opts.bootstrap_servers, done)


class ShaleStreamWriter(DataSourceStreamArrowWriter):
    def __init__(self, opts: SourceOptions) -> None:
        self.opts = opts

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriteResult:
        return produce_batches(self.opts, iterator)

    def commit(self, messages: list[WriteResult | None], batchId: int) -> None:
        log.info("micro-batch %d: produced %d records", batchId, sum(m.total for m in messages if m))

    def abort(self, messages: list[WriteResult | None], batchId: int) -> None:
        log.warning("micro-batch %d aborted; it is produced again when Spark retries it", batchId)
