"""Helpers of the data source tests: a real `shale serve`, producing, an independent consumer, row shapes."""

from __future__ import annotations

import calendar
import json
import os
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from confluent_kafka import Producer
from kafka import KafkaConsumer, TopicPartition

from support.node_util import ServeProcess, wait_for, write_manifests


@dataclass(frozen=True, order=True)
class Rec:
    """A record as a comparable tuple: the source schema with the timestamp in ms."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    timestamp: int
    timestamp_type: int
    headers: tuple = ()


def start_serve(workdir: Path, topics: list[dict], *extra: str) -> ServeProcess:
    manifests = write_manifests(workdir / "topics.yaml", *topics)
    node = ServeProcess(workdir / "data", manifests, *extra).start()
    try:
        wait_for(lambda: all(_partitions(node, t["metadata"]["name"]) == t["spec"]["partitions"] for t in topics),
                 30, what="the topics to exist")
    except BaseException:
        node.terminate()
        raise
    return node


def status(node: ServeProcess) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{node.http_port}/status", timeout=5) as r:
        return json.load(r)


def _partitions(node: ServeProcess, topic: str) -> int:
    try:
        return len(status(node)["topics"].get(topic, {}).get("partitions", []))
    except OSError:
        return 0


def produce(bootstrap: str, topic: str, records: list[dict], **conf) -> list[tuple[int, int]]:
    """Produce dicts of key/value/partition/headers/timestamp; return (partition, offset) of each, in order."""
    producer = Producer({"bootstrap.servers": bootstrap, "partitioner": "murmur2_random", "linger.ms": 5, **conf})
    results: list = [None] * len(records)

    def done(i):
        def cb(err, msg):
            results[i] = err if err is not None else (msg.partition(), msg.offset())
        return cb

    for i, r in enumerate(records):
        kwargs = {k: r[k] for k in ("partition", "headers", "timestamp") if r.get(k) is not None}
        producer.produce(topic, r.get("value"), r.get("key"), on_delivery=done(i), **kwargs)
        if i % 1000 == 999:
            producer.poll(0)
    assert producer.flush(60) == 0
    bad = [r for r in results if not isinstance(r, tuple)]
    assert not bad, f"produce to {topic} failed: {bad[:3]}"
    return results


def consume_all(bootstrap: str, topic: str) -> list[Rec]:
    """Every record of the topic as kafka-python (an independent client) delivers it."""
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, consumer_timeout_ms=5000)
    parts = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic))]
    consumer.assign(parts)
    consumer.seek_to_beginning()
    ends = consumer.end_offsets(parts)
    out: list[Rec] = []
    while any(consumer.position(tp) < ends[tp] for tp in parts):
        for tp, msgs in consumer.poll(1000).items():
            for m in msgs:
                out.append(Rec(m.topic, m.partition, m.offset, m.key, m.value, m.timestamp, m.timestamp_type,
                               tuple((k, v) for k, v in m.headers)))
    consumer.close()
    return sorted(out)


def rows(df) -> list[Rec]:
    """A DataFrame of the source schema as sorted Recs (the session time zone is UTC)."""
    out = []
    for r in df.collect():
        ts = calendar.timegm(r.timestamp.timetuple()) * 1000 + r.timestamp.microsecond // 1000
        headers = tuple((h.key, bytes(h.value) if h.value is not None else None) for h in r.headers) \
            if "headers" in r.__fields__ else ()
        out.append(Rec(r.topic, r.partition, r.offset, _b(r.key), _b(r.value), ts, r.timestampType, headers))
    return sorted(out)


def _b(v):
    return None if v is None else bytes(v)


def scan_reports(directory: Path) -> list[dict]:
    if not directory.exists():
        return []
    return [json.loads((directory / n).read_text()) for n in sorted(os.listdir(directory)) if n.endswith(".json")]


def set_cleaning(node: ServeProcess, topic: str, partitions: int, action: str) -> None:
    """POST pause or resume for every partition of `topic` (Kafka's abortAndPauseCleaning / resumeCleaning)."""
    for p in range(partitions):
        req = urllib.request.Request(f"http://127.0.0.1:{node.http_port}/partitions/{topic}/{p}/{action}",
                                     method="POST", data=b"")
        with urllib.request.urlopen(req, timeout=30) as r:
            assert r.status == 200, f"{action} {topic}-{p}: HTTP {r.status}"


def wait_for_clean(node: ServeProcess, topic: str, after_ms: int, timeout: float = 60) -> None:
    """Until every partition of `topic` reports a cleaning pass that finished after `after_ms`."""
    def cleaned() -> bool:
        parts = status(node)["topics"][topic]["partitions"]
        return all((p.get("last_clean_ms") or 0) > after_ms for p in parts)

    wait_for(cleaned, timeout, interval=0.1, what=f"a cleaning pass over {topic}")
