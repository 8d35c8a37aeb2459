"""The real-cluster tests' Kafka client, run inside a pod of the client image (librdkafka through
confluent-kafka), where the storage pods' advertised DNS names resolve: `kubectl exec -i POD -- python -
COMMAND …` with this file on standard input. Each command prints one JSON document on standard output.

- `produce`: KEYS keys × UPDATES values with an idempotent `acks=all` producer; every acknowledgement
  (key, value, partition, offset) and every delivery error.
- `fill`: MIB mebibytes of random values in records of RECORD_KIB, with the same producer: the count and
  bytes acknowledged and every delivery error.
- `load`: the same producer, one record in flight at a time, for SECONDS; every acknowledgement with its
  time, every error, and the longest wait between two acknowledgements.
- `consume`: every record of the topic from the beginning up to the high watermarks as they were when it
  started; with GROUP it commits the offsets after the first COMMIT records of each partition.
- `describe`: each partition's leader, replicas and in-sync replicas (Metadata), or the topic's error.
- `lag`: each partition's committed offset of GROUP and log end offset, by Kafka's admin APIs
  (ListConsumerGroupOffsets / ListOffsets), and lag = end - committed.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from confluent_kafka import Consumer, ConsumerGroupTopicPartitions, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec


def _producer(bootstrap: str) -> Producer:
    return Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all",
                     "linger.ms": 0, "message.timeout.ms": 120000, "topic.metadata.refresh.interval.ms": 1000})


def produce(args: argparse.Namespace) -> dict:
    producer, acked, errors = _producer(args.bootstrap), [], []

    def report(err, msg):
        if err is not None:
            errors.append(str(err))
        else:
            acked.append([msg.key().decode(), msg.value().decode(), msg.partition(), msg.offset()])

    for update in range(args.updates):
        for key in range(args.keys):
            producer.produce(args.topic, key=f"key-{key}".encode(), value=f"value-{key}-{update}".encode(),
                             on_delivery=report)
            producer.poll(0)
    left = producer.flush(120)
    return {"acked": acked, "errors": errors, "unflushed": left}


def fill(args: argparse.Namespace) -> dict:
    """MIB mebibytes of random values in records of RECORD_KIB, with the same producer: how many were
    acknowledged, and every delivery error (a full disk is one: KAFKA_STORAGE_ERROR)."""
    producer, acked, errors = _producer(args.bootstrap), [0, 0], []

    def report(err, msg):
        if err is not None:
            errors.append(str(err))
        else:
            acked[0] += 1
            acked[1] += len(msg.value())

    for n in range(args.mib * 1024 // args.record_kib):
        producer.produce(args.topic, key=f"fill-{n}".encode(), value=os.urandom(args.record_kib * 1024),
                         on_delivery=report)
        producer.poll(0)
    left = producer.flush(120)
    return {"acked": acked[0], "acked_bytes": acked[1], "errors": errors, "unflushed": left}


def load(args: argparse.Namespace) -> dict:
    """One record in flight: an acknowledgement's time is the time the cluster took to commit it."""
    producer, acked, errors = _producer(args.bootstrap), [], []
    start = time.monotonic()
    n = 0
    while time.monotonic() - start < args.seconds:
        outcome: list = []
        producer.produce(args.topic, key=f"key-{n % args.keys}".encode(), value=f"load-{n}".encode(),
                         on_delivery=lambda err, msg: outcome.append((err, msg)))
        while not outcome:
            producer.poll(0.05)
        err, msg = outcome[0]
        now = time.monotonic() - start
        if err is not None:
            errors.append([now, str(err), err.retriable() if hasattr(err, "retriable") else None])
        else:
            acked.append([now, msg.key().decode(), msg.value().decode(), msg.partition(), msg.offset()])
        n += 1
    producer.flush(60)
    times = [a[0] for a in acked]
    gaps = [b - a for a, b in zip(times, times[1:])]
    return {"acked": acked, "errors": errors, "longest_gap": max(gaps, default=0.0)}


def consume(args: argparse.Namespace) -> dict:
    config = {"bootstrap.servers": args.bootstrap, "group.id": args.group or "pod-client-reader",
              "enable.auto.commit": False, "auto.offset.reset": "earliest", "enable.partition.eof": True}
    consumer = Consumer(config)
    metadata = consumer.list_topics(args.topic, timeout=30).topics[args.topic]
    partitions = [TopicPartition(args.topic, p, 0) for p in sorted(metadata.partitions)]
    ends = {tp.partition: consumer.get_watermark_offsets(tp, timeout=30)[1] for tp in partitions}
    consumer.assign(partitions)
    records, done, taken = [], {p for p, end in ends.items() if end == 0}, {p: 0 for p in ends}
    deadline = time.monotonic() + 60
    while len(done) < len(ends) and time.monotonic() < deadline:
        msg = consumer.poll(1.0)
        if msg is None:
            continue
        if msg.error():
            if msg.error().code() == KafkaError._PARTITION_EOF:
                if msg.offset() >= ends[msg.partition()]:
                    done.add(msg.partition())
                continue
            raise KafkaException(msg.error())
        if msg.offset() < ends[msg.partition()]:
            records.append([msg.key().decode(), msg.value().decode(), msg.partition(), msg.offset()])
            taken[msg.partition()] += 1
            if args.group and taken[msg.partition()] == args.commit:
                consumer.commit(offsets=[TopicPartition(args.topic, msg.partition(), msg.offset() + 1)],
                                asynchronous=False)
        if msg.offset() + 1 >= ends[msg.partition()]:
            done.add(msg.partition())
    consumer.close()
    return {"records": records, "ends": ends, "complete": len(done) == len(ends)}


def lag(args: argparse.Namespace) -> dict:
    admin = AdminClient({"bootstrap.servers": args.bootstrap})
    committed = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(args.group)])[args.group].result()
    offsets = {tp.partition: tp.offset for tp in committed.topic_partitions if tp.topic == args.topic}
    ends = admin.list_offsets({TopicPartition(args.topic, p): OffsetSpec.latest() for p in offsets})
    result = {}
    for tp, future in ends.items():
        end = future.result().offset
        result[tp.partition] = {"committed": offsets[tp.partition], "end": end, "lag": end - offsets[tp.partition]}
    return {"partitions": result, "total": sum(p["lag"] for p in result.values())}


def describe(args: argparse.Namespace) -> dict:
    """Each partition's leader and in-sync replicas (node ids), from Metadata; {"error": …} while the topic has
    an error (UNKNOWN_TOPIC_OR_PART until the nodes have its manifest)."""
    admin = AdminClient({"bootstrap.servers": args.bootstrap})
    topic = admin.list_topics(args.topic, timeout=30).topics[args.topic]
    if topic.error is not None:
        return {"error": str(topic.error)}
    return {"partitions": {str(p.id): {"leader": p.leader, "replicas": p.replicas, "isr": p.isrs}
                           for p in topic.partitions.values()}}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("command", choices=["produce", "fill", "load", "consume", "lag", "describe"])
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--keys", type=int, default=10)
    parser.add_argument("--updates", type=int, default=10)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--group", default="")
    parser.add_argument("--commit", type=int, default=0)
    parser.add_argument("--mib", type=int, default=1)
    parser.add_argument("--record-kib", type=int, default=256)
    args = parser.parse_args()
    commands = {"produce": produce, "fill": fill, "load": load, "consume": consume, "lag": lag, "describe": describe}
    json.dump(commands[args.command](args), sys.stdout)


if __name__ == "__main__":
    main()
