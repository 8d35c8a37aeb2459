"""Spark data source benchmark: rows/s reading a topic through Spark (`format("shale")`) against a plain
Kafka consumer in the same run, and the time to build the latest view against the number of records.

    .venv/bin/python bench/spark_read.py                      # 10,000,000 records, updates docs/performance.md
    .venv/bin/python bench/spark_read.py --records 2000000    # a shorter run (add --no-markdown to only print)

One fresh `shale serve` (bench/out/, deleted at the end) holds one topic of P partitions (default 2, the
cores Spark gets); N records of a 16-byte key (N/10 distinct keys, so the latest view keeps a tenth)
and a 100-byte value, produced with confluent-kafka. Then, in order:

1. client choice: 500,000 records of partition 0 read by confluent-kafka and by kafka-python, each
   record's key, value, offset and timestamp touched — why the wire reader uses confluent-kafka.
2. plain consumer (the baseline): one confluent-kafka consumer `assign()`s every partition from the
   start and reads all N records, touching key, value, offset and timestamp of each.
3. Spark, wire: `spark.read.format("shale")` over the Kafka protocol, `local[2]`, one task per partition,
   aggregating every column that carries data (count, sum of key and value lengths, max offset and
   timestamp), so each row is materialised in the JVM; the sums are checked against what was produced.
4. Spark, files: the same query with `path` = the server's data directory (read-only, server running).
5. latest view: `shale.pipeline.latest.read(..., latest=true)` (Spark's max_by per key) and the source's own
   `latest=true` (Arrow, in the read task) over the first M records (`endingOffsets`) for growing M.

Each Spark query runs after a small warm-up query, so Python worker start-up is not in the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field

import yaml
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka import libversion as librdkafka_version

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT_DIR = os.path.join(ROOT, "bench", "out")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from broker import ServerProcess, free_port, wait_for_topics  # noqa: E402
from perf_doc import bullets, machine_facts, measured, paragraph, section, update_section  # noqa: E402

DOC = os.path.join(ROOT, "docs", "performance.md")
SECTION = "## Spark data source (issue: Data pipeline on PySpark)"
TOPIC = "bench"
FULL_RECORDS = 10_000_000
KEY_SIZE, VALUE_SIZE = 16, 100
CLIENT_CHOICE_RECORDS = 500_000
CONSUMER_CONFIG = {
    "group.id": "bench-spark", "enable.auto.commit": False, "enable.partition.eof": True,
    "queued.min.messages": 1_000_000, "queued.max.messages.kbytes": 262_144, "fetch.wait.max.ms": 10,
    "max.partition.fetch.bytes": 8 << 20, "fetch.max.bytes": 64 << 20,
}


@dataclass
class Timed:
    name: str
    records: int
    seconds: float

    @property
    def rate(self) -> float:
        return self.records / self.seconds if self.seconds > 0 else 0.0


@dataclass
class Results:
    records: int
    partitions: int
    produce: Timed | None = None
    client_choice: list[Timed] = field(default_factory=list)
    consumer: Timed | None = None
    spark: list[Timed] = field(default_factory=list)
    latest: list[tuple[int, float, float, int]] = field(default_factory=list)  # (records, spark s, source s, keys)
    versions: str = ""
    wall_s: float = 0.0
    load: tuple[float, float] = (0.0, 0.0)

    def spark_rate(self, name: str) -> float:
        return next(t.rate for t in self.spark if t.name == name)


def key_of(i: int, keys: int) -> bytes:
    return b"user-%011d" % (i % keys)


def value_of(i: int) -> bytes:
    return (b"%010d" % i) * (VALUE_SIZE // 10)


def start_shale(work: str, partitions: int) -> ServerProcess:
    manifests = os.path.join(work, "topics.yaml")
    with open(manifests, "w") as f:
        yaml.safe_dump({"apiVersion": "shale.dev/v1alpha1", "kind": "Topic", "metadata": {"name": TOPIC},
                        "spec": {"partitions": partitions, "config": {}}}, f)
    port = free_port()
    log_path = os.path.join(work, "shale.log")
    with open(log_path, "ab") as log:
        proc = subprocess.Popen([sys.executable, "-m", "shale.sidecar.cli", "--log-level", "WARNING", "serve",
                                 "--data-dir", os.path.join(work, "data"), "--topics", manifests,
                                 "--listen", f"127.0.0.1:{port}", "--http", f"127.0.0.1:{free_port()}"],
                                stdout=log, stderr=log, cwd=ROOT)
    server = ServerProcess("Shale", proc, port, log_path, version="shale")
    server.wait_listening()
    wait_for_topics(server, [TOPIC], partitions)
    return server


def produce(bootstrap: str, n: int, keys: int) -> Timed:
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 20, "batch.size": 1_000_000,
                         "partitioner": "murmur2_random", "queue.buffering.max.messages": 2_000_000,
                         "queue.buffering.max.kbytes": 2 << 20, "delivery.report.only.error": True})
    errors: list = []
    failed = lambda err, msg: errors.append(err)  # noqa: E731 - called for failures only (delivery.report.only.error)
    start = time.perf_counter()
    for i in range(n):
        while True:
            try:
                producer.produce(TOPIC, value_of(i), key_of(i, keys), on_delivery=failed)
                break
            except BufferError:
                producer.poll(0.01)
    left = producer.flush(300)
    seconds = time.perf_counter() - start
    if left or errors:
        raise RuntimeError(f"producing to {TOPIC} failed: {left} left, errors {errors[:3]}")
    return Timed("produce (confluent-kafka)", n, seconds)


def consume_confluent(bootstrap: str, partitions: list[int], expected: int) -> Timed:
    """The baseline: every record of the partitions, key/value/offset/timestamp touched."""
    consumer = Consumer({"bootstrap.servers": bootstrap, **CONSUMER_CONFIG})
    consumer.assign([TopicPartition(TOPIC, p, 0) for p in partitions])
    n, eof, value_bytes = 0, set(), 0
    start = time.perf_counter()
    while len(eof) < len(partitions):
        for m in consumer.consume(10000, 0.1):
            if m.error():
                eof.add(m.partition())
                continue
            m.key()
            value_bytes += len(m.value())
            m.offset()
            m.timestamp()
            n += 1
    seconds = time.perf_counter() - start
    consumer.close()
    assert n == expected and value_bytes == n * VALUE_SIZE, f"consumed {n} records, expected {expected}"
    return Timed(f"confluent-kafka consumer, {len(partitions)} partition(s)", n, seconds)


def consume_kafka_python(bootstrap: str, partition: int, count: int) -> Timed:
    from kafka import KafkaConsumer
    from kafka import TopicPartition as KTP

    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False,
                             fetch_max_bytes=64 << 20, max_partition_fetch_bytes=8 << 20)
    tp = KTP(TOPIC, partition)
    consumer.assign([tp])
    consumer.seek(tp, 0)
    n = 0
    start = time.perf_counter()
    while n < count:
        for msgs in consumer.poll(1000, max_records=10000).values():
            for m in msgs:
                if n >= count:
                    break
                m.key, m.value, m.offset, m.timestamp
                n += 1
    seconds = time.perf_counter() - start
    consumer.close()
    return Timed("kafka-python consumer, 1 partition", n, seconds)


def consume_confluent_first(bootstrap: str, partition: int, count: int) -> Timed:
    consumer = Consumer({"bootstrap.servers": bootstrap, **CONSUMER_CONFIG})
    consumer.assign([TopicPartition(TOPIC, partition, 0)])
    n = 0
    start = time.perf_counter()
    while n < count:
        for m in consumer.consume(10000, 0.1):
            if m.error() or n >= count:
                continue
            m.key(), m.value(), m.offset(), m.timestamp()
            n += 1
    seconds = time.perf_counter() - start
    consumer.close()
    return Timed("confluent-kafka consumer, 1 partition", n, seconds)


def spark_scan(spark, options: dict, expected: int, name: str) -> Timed:
    from pyspark.sql import functions as F

    reader = spark.read.format("shale")
    for k, v in options.items():
        reader = reader.option(k, v)
    df = reader.load()
    start = time.perf_counter()
    row = df.agg(F.count("*").alias("n"), F.sum(F.length("key")).alias("k"), F.sum(F.length("value")).alias("v"),
                 F.max("offset").alias("o"), F.max("timestamp").alias("t")).collect()[0]
    seconds = time.perf_counter() - start
    assert (row.n, row.k, row.v) == (expected, expected * KEY_SIZE, expected * VALUE_SIZE), f"{name}: {row}"
    return Timed(name, expected, seconds)


def latest_build(spark, source: dict, ends: dict, keys: int) -> tuple[float, float, int]:
    """Seconds to build the latest view of the first records (to `ends`), by Spark and by the source."""
    from pyspark.sql import functions as F

    from shale.pipeline.latest import read

    options = {**source, "subscribe": TOPIC, "endingOffsets": json.dumps({TOPIC: ends})}
    timings, counts = [], []
    for latest_df in (read(spark, {**options, "latest": "true"}),
                      spark.read.format("shale").options(**options).option("latest", "true").load()):
        start = time.perf_counter()
        row = latest_df.agg(F.count("*").alias("n"), F.sum(F.length("value")).alias("v")).collect()[0]
        timings.append(time.perf_counter() - start)
        counts.append(row.n)
    assert counts[0] == counts[1] <= keys, f"latest view sizes {counts} (keys {keys})"
    return timings[0], timings[1], counts[0]


def run(records: int, partitions: int = 2, out_dir: str = OUT_DIR, latest_steps: int = 4,
        client_choice: int = CLIENT_CHOICE_RECORDS, say=print) -> Results:
    from pyspark.sql import SparkSession

    from shale.pipeline.session import local_session

    load_before = os.getloadavg()[0]
    wall = time.perf_counter()
    keys = max(1, records // 10)
    res = Results(records, partitions)
    work = os.path.join(out_dir, f"spark-{os.getpid()}")
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    own_session = SparkSession.getActiveSession() is None
    spark = local_session("bench-spark", cores=2, shuffle_partitions=4, conf={"spark.driver.memory": "4g"})
    server = start_shale(work, partitions)
    try:
        import pyspark
        res.versions = (f"pyspark {pyspark.__version__}, Java {_java_version()}, confluent-kafka "
                        f"(librdkafka {librdkafka_version()[0]})")
        res.produce = produce(server.bootstrap, records, keys)
        say(f"produced {records:,} records in {res.produce.seconds:.1f} s ({res.produce.rate:,.0f}/s)")
        bootstrap = {"bootstrap.servers": server.bootstrap}
        first = min(client_choice, _end_offset(server.bootstrap, 0))
        if first:
            res.client_choice = [consume_confluent_first(server.bootstrap, 0, first),
                                 consume_kafka_python(server.bootstrap, 0, first)]
            for t in res.client_choice:
                say(f"client choice: {t.name}: {t.rate:,.0f} records/s")
        res.consumer = consume_confluent(server.bootstrap, list(range(partitions)), records)
        say(f"baseline: {res.consumer.name}: {res.consumer.rate:,.0f} records/s")
        files = {"path": os.path.join(work, "data")}
        warm = {"subscribe": TOPIC, "endingOffsets": json.dumps({TOPIC: {str(p): 1 for p in range(partitions)}})}
        spark_scan(spark, {**bootstrap, **warm}, min(records, partitions), "warm-up")
        latest_build(spark, bootstrap, {str(p): 1 for p in range(partitions)}, keys)  # the shuffle's warm-up
        for name, source in (("Spark, wire (bootstrap.servers)", bootstrap), ("Spark, files (path)", files)):
            t = spark_scan(spark, {**source, "subscribe": TOPIC}, records, name)
            res.spark.append(t)
            say(f"{name}: {t.rate:,.0f} rows/s ({t.seconds:.1f} s)")
        ends_full = {str(p): _end_offset(server.bootstrap, p) for p in range(partitions)}
        for step in range(1, latest_steps + 1):
            ends = {p: max(1, e * step // latest_steps) for p, e in ends_full.items()}
            n = sum(ends.values())
            by_spark, by_source, kept = latest_build(spark, bootstrap, ends, keys)
            res.latest.append((n, by_spark, by_source, kept))
            assert step < latest_steps or kept == keys, f"the latest view of the whole topic has {kept} keys, not {keys}"
            say(f"latest view of {n:,} records ({kept:,} keys): Spark {by_spark:.1f} s, source {by_source:.1f} s")
    finally:
        server.stop()
        if own_session:
            spark.stop()
        shutil.rmtree(work, ignore_errors=True)
    res.wall_s = time.perf_counter() - wall
    res.load = (load_before, os.getloadavg()[0])
    return res


def _end_offset(bootstrap: str, partition: int) -> int:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench-spark-offsets"})
    try:
        return consumer.get_watermark_offsets(TopicPartition(TOPIC, partition), timeout=30, cached=False)[1]
    finally:
        consumer.close()


def _java_version() -> str:
    out = subprocess.run(["java", "-version"], capture_output=True, text=True).stderr
    return out.split('"')[1] if '"' in out else out.strip().split("\n")[0]


def table(res: Results) -> str:
    base = res.consumer.rate
    lines = ["| Read | records | seconds | records/s | vs the plain consumer |", "|---|---:|---:|---:|---:|",
             f"| {res.consumer.name} (baseline) | {res.consumer.records:,} | {res.consumer.seconds:.1f} | "
             f"{base:,.0f} | 100% |"]
    for t in res.spark:
        lines.append(f"| {t.name}, `local[2]` | {t.records:,} | {t.seconds:.1f} | {t.rate:,.0f} | {t.rate / base:.0%} |")
    lines += ["", "| Latest view over | keys kept | Spark `max_by` s | records/s | source `latest=true` s | records/s |",
              "|---:|---:|---:|---:|---:|---:|"]
    for n, by_spark, by_source, kept in res.latest:
        lines.append(f"| {n:,} records | {kept:,} | {by_spark:.1f} | {n / by_spark:,.0f} | {by_source:.1f} | "
                     f"{n / by_source:,.0f} |")
    if res.client_choice:
        lines += ["", "| Client choice (partition 0) | records | records/s |", "|---|---:|---:|"]
        lines += [f"| {t.name} | {t.records:,} | {t.rate:,.0f} |" for t in res.client_choice]
    return "\n".join(lines)


def summary(res: Results) -> str:
    wire, files = res.spark_rate("Spark, wire (bootstrap.servers)"), res.spark_rate("Spark, files (path)")
    return (f"Spark reads {wire:,.0f} rows/s over the wire ({wire / res.consumer.rate:.0%} of a plain consumer's "
            f"{res.consumer.rate:,.0f}/s) and {files:,.0f} rows/s from the files; the latest view of "
            f"{res.latest[-1][0]:,} records takes {res.latest[-1][1]:.1f} s in Spark.")


def interpretation(res: Results) -> str:
    """The section's bullets, from the run's ratios."""
    base = res.consumer.rate
    wire, files = res.spark_rate("Spark, wire (bootstrap.servers)"), res.spark_rate("Spark, files (path)")
    ahead = all(by_source < by_spark for _, by_spark, by_source, _ in res.latest)
    out = [
        f"**Wire: {wire / base:.0%} of the plain consumer.** A plain consumer only hands records to Python; through "
        "Spark each record also becomes Arrow columns in a Python worker and a row in the JVM, and the two read tasks "
        "share the 2 cores with `shale serve` and the JVM. librdkafka decodes in C; the reader adds each message with "
        "a Python call.",
        f"**Files: {files / base:.0%}.** No server is in the way: each batch's CRC is checked and its records are "
        "decoded into lists in one C pass (`records.decode_columns`), appended to the Arrow columns whole.",
        "**Latest view**: a read plus a shuffle of every record (Spark) or an Arrow group-by per partition (the "
        "source's option)" + (", hence the source's lead at every size." if ahead else "."),
    ]
    if len(res.client_choice) == 2:
        confluent, kafka_python = (t.rate for t in res.client_choice)
        load = (f" The load average reached {max(res.load):.1f} on 2 cores, so every figure, the baseline's "
                "included, is lower than on an idle machine." if max(res.load) >= 1.0 else "")
        out.append(f"**Client choice**: confluent-kafka reads {confluent / kafka_python:.0f}× as fast as kafka-python "
                   f"from one partition, which is why the wire reader uses it.{load}")
    return bullets(out)


def markdown(res: Results, facts: str, command: str) -> str:
    """This benchmark's section of docs/performance.md."""
    what = [
        "**Plain consumer** (the baseline): confluent-kafka reads every record, touching key, value, offset and "
        "timestamp.",
        "**Spark queries**: aggregate every data column (count, sums of key and value lengths, max offset and "
        "timestamp; the sums checked), so each row is built in the JVM; each runs after a warm-up query.",
        "**Latest view**: timed over the first M records (`endingOffsets`), built by Spark (`max_by` over the offset "
        "per key, a shuffle) and by the source's `latest=true` (Arrow, in each partition's read task).",
    ]
    return section(
        SECTION,
        measured(command, res.wall_s, res.load, "`--records 2000000` is a shorter run; `--no-markdown` only prints."),
        paragraph(f"Machine: {facts}; {res.versions}. `shale serve`, Spark (`local[2]`, driver memory 4g) and the "
                  "consumer share the 2 cores."),
        paragraph(f"What is measured: one topic of {res.partitions} partitions holding {res.records:,} records "
                  f"(16-byte keys, {max(1, res.records // 10):,} distinct; 100-byte values), produced at "
                  f"{res.produce.rate:,.0f} records/s."),
        bullets(what), table(res), paragraph(summary(res)), "Interpretation:", interpretation(res))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--records", type=int, default=FULL_RECORDS, help=f"records in the topic (default {FULL_RECORDS:,})")
    ap.add_argument("--partitions", type=int, default=2)
    ap.add_argument("--latest-steps", type=int, default=4, help="sizes at which the latest view is timed")
    ap.add_argument("--no-markdown", action="store_true", help="do not write docs/performance.md")
    args = ap.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # run the cleanup: stop the server, delete its data
    command = ".venv/bin/python bench/spark_read.py" + (
        f" --records {args.records}" if args.records != FULL_RECORDS else "") + (
        f" --partitions {args.partitions}" if args.partitions != 2 else "")
    facts = machine_facts()
    print(facts)
    res = run(args.records, args.partitions, latest_steps=args.latest_steps)
    print()
    print(table(res))
    print()
    print(summary(res))
    print(f"\nwall time {res.wall_s:.0f} s, load average {res.load[0]:.2f} before, {res.load[1]:.2f} after")
    if not args.no_markdown:
        update_section(SECTION, markdown(res, facts, command), DOC)
        print(f"wrote {os.path.relpath(DOC, ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
