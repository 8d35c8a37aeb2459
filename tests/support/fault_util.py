"""What every fault test does around its fault: keep real producers writing with `acks=all`, then check the
invariants of docs/replication.md on the cluster's files.

`AckedLoad` runs one real client (confluent-kafka or kafka-python) in a thread, writing unique values and
remembering each acknowledgement (partition, offset, value); the client is never restarted, whatever the
fault. `check_acknowledged` then asserts, once the cluster has settled: every acknowledged record is readable
at its acknowledged offset; the replicas' logs are byte-identical below the high watermark; no leader epoch of
the partition was led by two nodes, and the epochs in the batches never go back.
"""

from __future__ import annotations

import os
import re
import threading
import time
from dataclasses import dataclass, field

from confluent_kafka import Producer
from kafka import KafkaProducer

from shale.sidecar.log.records import decode_batch
from support.node_util import ReplicatedCluster, wait_for

CLIENTS = ("confluent", "kafka-python")
MAX_IN_FLIGHT = 50  # records sent and not yet answered: the load follows the cluster's pace


@dataclass
class AckedLoad:
    """A producer thread writing b"<client>-<n>" values round robin over `partitions` until `stop()`."""

    client: str
    bootstrap: str
    topic: str
    partitions: int = 1
    acked: list[tuple[int, int, bytes]] = field(default_factory=list)
    ack_times: list[float] = field(default_factory=list)  # time.monotonic() of each entry of `acked`
    failed: list[str] = field(default_factory=list)  # errors reported to the application (retries exhausted)
    sent: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _thread: threading.Thread | None = None

    def start(self) -> "AckedLoad":
        self._thread = threading.Thread(target=self._run, name=f"load-{self.client}", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> list[tuple[int, int, bytes]]:
        """Stop sending, wait for every answer, and return the acknowledgements."""
        self._stop.set()
        self._thread.join(120)
        assert not self._thread.is_alive(), f"the {self.client} producer did not finish"
        return list(self.acked)

    def finish(self, cluster: "ReplicatedCluster", partition: int = 0) -> tuple[list[tuple[int, int, bytes]], int]:
        """Stop, and check what every fault test checks at the end: the application was told of no failure,
        and `check_acknowledged` holds for the partition. Returns the acknowledgements and its high watermark."""
        acked = self.stop()
        assert self.failed == [], f"{self.client} was told of {len(self.failed)} failures: {self.failed[:3]}"
        return acked, check_acknowledged(cluster, self.topic, partition, acked)

    def close(self) -> None:
        """Stop if still running (for `finally` blocks: a failed test leaves no producer thread behind)."""
        if self._thread is not None and self._thread.is_alive():
            self.stop()

    def wait_for_acks(self, more_than: int, timeout: float = 60.0) -> int:
        """Until more than `more_than` records are acknowledged in all; returns the count."""
        def grown() -> int | bool:
            assert self._thread is None or self._thread.is_alive() or self._stop.is_set(), \
                f"{self.client}: the producer thread ended: {self.failed[-3:]}"
            return len(self.acked) > more_than and len(self.acked)
        return wait_for(grown, timeout,
                        what=f"{self.client}: more than {more_than} acknowledged records "
                             f"(failures so far: {self.failed[-3:]})")

    def acked_since(self, sent_before: int, partition: int) -> list[float]:
        """When each record of `partition` numbered `sent_before` or later (sent after that point) was
        acknowledged."""
        with self._lock:
            return [t for (p, _, value), t in zip(self.acked, self.ack_times)
                    if p == partition and int(value.rsplit(b"-", 1)[1]) >= sent_before]

    def _done(self, partition: int, offset: int, value: bytes, error: object) -> None:
        with self._lock:
            if error is None:
                self.acked.append((partition, offset, value))
                self.ack_times.append(time.monotonic())
            else:
                self.failed.append(f"{value!r}: {error}")

    def _run(self) -> None:
        try:
            if self.client == "confluent":
                self._run_confluent()
            else:
                self._run_kafka_python()
        except Exception as exc:  # a fatal client error (e.g. OUT_OF_ORDER_SEQUENCE_NUMBER): a failure, not a hang
            with self._lock:
                self.failed.append(f"the producer stopped: {exc}")
            raise

    def _pace(self, wait=lambda: time.sleep(0.005)) -> bool:
        """Wait (`wait()`: the client's own poll where answers are delivered by it) while too many records are in
        flight; False once stopped."""
        while self.sent - len(self.acked) - len(self.failed) >= MAX_IN_FLIGHT and not self._stop.is_set():
            wait()
        return not self._stop.is_set()

    def _run_confluent(self) -> None:
        producer = Producer({"bootstrap.servers": self.bootstrap, "acks": "all", "enable.idempotence": True,
                             "linger.ms": 2, "message.timeout.ms": 120000, "retry.backoff.ms": 50,
                             # A request to a paused (SIGSTOPped) leader is answered by nobody: given up after 10 s,
                             # as kafka-python's below, not after librdkafka's 60 s for a Metadata request sent there
                             # (measured: 58.7 s from the new leader's election to 50 more acknowledgements, within a
                             # hair of the test's 60 s wait, and beyond it in one CI run).
                             "request.timeout.ms": 10000, "socket.timeout.ms": 10000,
                             "topic.metadata.refresh.interval.ms": 1000, "log_level": 3})
        while self._pace(lambda: producer.poll(0.005)):
            value = b"confluent-%d" % self.sent
            producer.produce(self.topic, value=value, partition=self.sent % self.partitions,
                             on_delivery=lambda err, msg, v=value: self._done(msg.partition(), msg.offset(), v, err))
            self.sent += 1
            producer.poll(0.002)
        assert producer.flush(120) == 0, "confluent-kafka kept records unanswered"

    def _run_kafka_python(self) -> None:
        producer = KafkaProducer(bootstrap_servers=self.bootstrap.split(","), acks="all", enable_idempotence=True,
                                 linger_ms=2, retries=1_000_000, retry_backoff_ms=50, request_timeout_ms=10000,
                                 delivery_timeout_ms=120000, metadata_max_age_ms=1000)
        while self._pace():
            value = b"kafka-python-%d" % self.sent
            future = producer.send(self.topic, value=value, partition=self.sent % self.partitions)
            future.add_callback(lambda md, v=value: self._done(md.partition, md.offset, v, None))
            future.add_errback(lambda exc, v=value: self._done(-1, -1, v, exc))
            self.sent += 1
            time.sleep(0.002)
        producer.flush(120)
        producer.close(10)


LEADS = re.compile(r"(\S+): node (\d+) leads in epoch (\d+)")


def leaders_by_epoch(cluster: ReplicatedCluster, topic: str, partition: int) -> dict[int, set[int]]:
    """{leader epoch: nodes that became leader of the partition in it}, from every node's log (all its runs)."""
    out: dict[int, set[int]] = {}
    for server in cluster.servers.values():
        for tp, node, epoch in LEADS.findall(server.log()):
            if tp == f"{topic}-{partition}":
                out.setdefault(int(epoch), set()).add(int(node))
    return out


def check_acknowledged(cluster: ReplicatedCluster, topic: str, partition: int,
                       acked: list[tuple[int, int, bytes]], timeout: float = 90.0) -> int:
    """After the faults: the invariants on one partition. Returns its high watermark."""
    state = cluster.wait_for_isr(topic, partition, timeout=timeout)  # every replica back in sync
    mine = [(offset, value) for p, offset, value in acked if p == partition]
    hw = wait_for(lambda: (lambda h: h if h > max((o for o, _ in mine), default=-1) else None)(
        cluster.high_watermark(topic, partition)), timeout, what=f"{topic}-{partition}'s HW to pass every ack")
    cluster.wait_identical_below(topic, partition, hw, state.replicas, timeout)
    records, epochs = {}, []
    for header, raw in cluster.batches(state.leader, topic, partition):
        if header.base_offset >= hw:
            break
        epochs.append(header.partition_leader_epoch)
        for record in decode_batch(raw).records:
            records[record.offset] = record.value
    lost = [(offset, value) for offset, value in mine if records.get(offset) != value]
    assert not lost, (f"{topic}-{partition}: {len(lost)} of {len(mine)} acknowledged records are not at their "
                      f"acknowledged offset, e.g. {lost[:5]} (found {[records.get(o) for o, _ in lost[:5]]})")
    assert epochs == sorted(epochs), f"{topic}-{partition}: leader epochs go back in the log: {epochs}"
    doubled = {e: nodes for e, nodes in leaders_by_epoch(cluster, topic, partition).items() if len(nodes) > 1}
    assert not doubled, f"{topic}-{partition}: epochs led by more than one node: {doubled}"
    return hw


def preload(bootstrap: str, topic: str, partition: int = 0, records: int = 1500) -> None:
    """~1.5 MB (1 KB records) acknowledged by every in-sync replica: enough for a throttled copy to be caught in
    the middle."""
    errors: list = []
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5, "batch.size": 16384,
                         "log_level": 3})  # batches well below a small segment.bytes
    for _ in range(records):
        producer.produce(topic, value=os.urandom(1000), partition=partition,
                         on_delivery=lambda err, msg: err is not None and errors.append(err))
        producer.poll(0)
    assert producer.flush(60) == 0 and errors == [], errors[:3]
