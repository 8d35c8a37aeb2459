"""Acknowledged data survives SIGKILL of `shale serve`.

Kafka's promise without fsync (flush.messages/flush.ms left at their defaults) is against a process
crash: an acknowledged append is in the page cache, so a restarted broker must find it — at the
offset it acknowledged, with the same key and value — and must never hand that offset out again.
Here a real producer (librdkafka, acks=all) writes to a topic with small segments while the server
is killed with SIGKILL again and again; after every restart a real consumer reads everything back,
and after the last one the files are checked with the engine itself and with `shale dump-log`.
"""

from __future__ import annotations

import random
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path

import confluent_kafka
import pytest

from shale.sidecar.log.log_dir import LogDir
from shale.sidecar.log.records import LOG_OVERHEAD, Record, decode_batch, encode_batch
from shale.sidecar.log.topic_partition import TopicPartition
from shale.sidecar.protocol.client_codec import decode_response, encode_request
from shale.sidecar.topic_config import TopicConfig
from support.node_util import ServeProcess, free_port, topic_manifest, write_manifests

TOPIC = "crash"
PARTITIONS = 2
CONFIG = {"segment.bytes": 32 * 1024, "index.interval.bytes": 1024}  # a roll every ~150 records
KILLS = 12
ACKS_PER_CYCLE = 500  # acknowledged records before the kill may come, in every cycle

Acked = dict[tuple[int, int], tuple[bytes, bytes]]  # (partition, offset) -> (key, value)


class Load:
    """A librdkafka producer that records every acknowledgement, and refuses to see an offset twice."""

    def __init__(self, bootstrap: str) -> None:
        self.producer = confluent_kafka.Producer({
            "bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": False, "linger.ms": 2,
            "message.timeout.ms": 60000, "retry.backoff.ms": 20, "retry.backoff.max.ms": 100,
            "reconnect.backoff.ms": 20, "reconnect.backoff.max.ms": 100, "log_level": 0,
            # Batches below segment.bytes (a larger append is refused, as Kafka refuses it), and a short
            # local queue so that the load is paced by the broker's acknowledgements.
            "batch.size": 16 * 1024, "queue.buffering.max.messages": 2000,
        })
        self.acked: Acked = {}
        self.reused: list[str] = []
        self.failed: dict[str, int] = {}
        self.sent = 0
        self._rng = random.Random(7)

    def _report(self, err, msg) -> None:
        if err is not None:
            self.failed[err.name()] = self.failed.get(err.name(), 0) + 1
            return
        where = (msg.partition(), msg.offset())
        if where in self.acked:  # the same offset acknowledged for two records: an offset was reused
            self.reused.append(f"{TOPIC}-{where[0]} offset {where[1]}: {self.acked[where][0]!r} and {msg.key()!r}")
        self.acked[where] = (msg.key(), msg.value())

    def send_one(self) -> None:
        n = self.sent
        self.sent += 1
        value = f"value-{n}-".encode() + self._rng.randbytes(self._rng.randrange(20, 300))
        while True:
            try:
                self.producer.produce(TOPIC, key=f"key-{n}".encode(), value=value, partition=n % PARTITIONS,
                                      on_delivery=self._report)
                break
            except BufferError:  # the local queue is full while the broker is down: wait for it
                self.producer.poll(0.05)
        self.producer.poll(0)

    def produce_until(self, acks: int, extra_s: float) -> None:
        """Keep producing until `acks` more acknowledgements, then for `extra_s` more seconds."""
        target = len(self.acked) + acks
        deadline = time.monotonic() + 30
        while len(self.acked) < target:
            assert time.monotonic() < deadline, f"only {len(self.acked)} of {target} records acknowledged in 30 s"
            self.send_one()
        end = time.monotonic() + extra_s
        while time.monotonic() < end:
            self.send_one()

    def wait_for_acks(self, timeout: float) -> None:
        """Let the producer retry what the kill interrupted, until everything sent is acknowledged."""
        deadline = time.monotonic() + timeout
        while len(self.acked) + sum(self.failed.values()) < self.sent and time.monotonic() < deadline:
            self.producer.poll(0.05)

    def drain(self) -> None:
        assert self.producer.flush(60) == 0, "the producer could not deliver its queue after the restart"


def _read_all(bootstrap: str, expected_end: dict[int, int]) -> dict[tuple[int, int], tuple[bytes, bytes]]:
    """Everything in the topic, through a real consumer (manual assignment from the beginning)."""
    consumer = confluent_kafka.Consumer({"bootstrap.servers": bootstrap, "group.id": "crash-check",
                                         "enable.auto.commit": False, "fetch.wait.max.ms": 50,
                                         "enable.partition.eof": True, "log_level": 0})
    found: dict[tuple[int, int], tuple[bytes, bytes]] = {}
    try:
        ends = {}
        for p in range(PARTITIONS):
            low, high = consumer.get_watermark_offsets(confluent_kafka.TopicPartition(TOPIC, p), timeout=10)
            assert low == 0 and high >= expected_end[p], \
                f"{TOPIC}-{p}: log end offset {high} after the restart, but offset {expected_end[p] - 1} was acknowledged"
            ends[p] = high
        consumer.assign([confluent_kafka.TopicPartition(TOPIC, p, 0) for p in range(PARTITIONS)])
        done: set[int] = {p for p, end in ends.items() if end == 0}
        deadline = time.monotonic() + 30
        while len(done) < PARTITIONS:
            assert time.monotonic() < deadline, f"reading {TOPIC} back timed out at {len(found)} records"
            for m in consumer.consume(1000, 0.2):
                if m.error() is not None:
                    assert m.error().code() == confluent_kafka.KafkaError._PARTITION_EOF, m.error()
                    if m.offset() >= ends[m.partition()]:
                        done.add(m.partition())
                    continue
                found[(m.partition(), m.offset())] = (m.key(), m.value())
    finally:
        consumer.close()
    return found


def _check_acked(acked: Acked, found: dict[tuple[int, int], tuple[bytes, bytes]], how: str) -> int:
    missing = [f"{TOPIC}-{p} offset {o}: acknowledged {kv[0]!r}, read {found.get((p, o), (None,))[0]!r}"
               for (p, o), kv in sorted(acked.items()) if found.get((p, o)) != kv]
    assert not missing, f"{len(missing)} acknowledged records lost or changed ({how}): {missing[:10]}"
    return len(acked)


def _end_offsets(acked: Acked) -> dict[int, int]:
    ends = {p: 0 for p in range(PARTITIONS)}
    for p, o in acked:
        ends[p] = max(ends[p], o + 1)
    return ends


def _read_with_engine(data_dir: Path) -> tuple[dict[tuple[int, int], tuple[bytes, bytes]], int]:
    """Open the directory with the engine (its loader and recovery) and read every batch, CRC-checked."""
    config = TopicConfig.from_mapping(CONFIG)
    log_dir = LogDir(str(data_dir), lambda topic: config)
    found: dict[tuple[int, int], tuple[bytes, bytes]] = {}
    segments = 0
    try:
        for p in range(PARTITIONS):
            log = log_dir.logs[TopicPartition(TOPIC, p)]
            segments += len(log.segments)
            offset = log.log_start_offset
            while offset < log.log_end_offset:
                data = log.read(offset, 1 << 20).read()
                pos = 0
                while pos < len(data):
                    size = LOG_OVERHEAD + int.from_bytes(data[pos + 8:pos + 12], "big")
                    batch = decode_batch(data[pos:pos + size], f"{TOPIC}-{p}")
                    for r in batch.records:
                        assert (p, r.offset) not in found, f"{TOPIC}-{p} offset {r.offset} stored twice"
                        found[(p, r.offset)] = (r.key, r.value)
                    offset = batch.header.next_offset
                    pos += size
            assert offset == log.log_end_offset
    finally:
        log_dir.close()
    return found, segments


def _dump_log_checks(data_dir: Path) -> None:
    """`shale dump-log`: every batch's CRC, consecutive offsets, and indexes that agree with their logs."""
    files = sorted(str(f) for f in data_dir.glob(f"{TOPIC}-*/*") if f.suffix in (".log", ".index", ".timeindex"))
    assert files
    run = subprocess.run([sys.executable, "-m", "shale.sidecar.cli", "dump-log", "--deep-iteration", *files],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, f"dump-log found problems:\n{run.stderr[-3000:]}\n{run.stdout[-3000:]}"
    assert "isvalid: false" not in run.stdout
    assert "Non-consecutive" not in run.stderr and "Mismatches" not in run.stderr, run.stderr[-3000:]
    run = subprocess.run([sys.executable, "-m", "shale.sidecar.cli", "dump-log", "--verify-index-only",
                          *[f for f in files if not f.endswith(".log")]], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0 and not run.stderr.strip(), run.stderr[-3000:]


@pytest.mark.timeout(300)
def test_acknowledged_records_survive_sigkill(tmp_path):
    data_dir = tmp_path / "data"
    write_manifests(tmp_path / "topics" / "crash.yaml", topic_manifest(TOPIC, PARTITIONS, CONFIG))
    port = free_port()
    load: Load | None = None
    rng = random.Random(11)
    kills = 0
    checked = 0
    in_flight: list[int] = []  # records sent but not yet acknowledged at each kill
    server = ServeProcess(data_dir, tmp_path / "topics", port=port).start()
    try:
        load = Load(server.bootstrap)
        for cycle in range(KILLS):
            load.produce_until(ACKS_PER_CYCLE, rng.uniform(0.0, 0.15))
            server.kill()  # SIGKILL, with the producer's requests in flight
            kills += 1
            in_flight.append(load.sent - len(load.acked))
            server = ServeProcess(data_dir, tmp_path / "topics", port=port).start()
            # Acknowledged before the kill or after it (a retry on the new process): all must be there.
            load.wait_for_acks(10.0)
            checked += _check_acked(load.acked, _read_all(server.bootstrap, _end_offsets(load.acked)),
                                    f"after kill {kills}")
            assert not load.reused, load.reused[:10]
        load.drain()
        found = _read_all(server.bootstrap, _end_offsets(load.acked))
        checked += _check_acked(load.acked, found, "after the producer drained")
        assert not load.reused, load.reused[:10]
        assert server.terminate() == 0, server.log()[-5000:]
    finally:
        if server.proc.poll() is None:
            server.kill()
    log = server.log()
    assert "Traceback" not in log, log[-5000:]

    found, segments = _read_with_engine(data_dir)
    _check_acked(load.acked, found, "read with the engine after the final stop")
    assert segments > 2 * KILLS, f"only {segments} segments: the load should have rolled many"
    _dump_log_checks(data_dir)
    assert kills >= 10
    assert sum(1 for n in in_flight if n > 0) >= kills // 2, f"most kills should hit records in flight: {in_flight}"
    print(f"\n{kills} SIGKILLs, {len(load.acked)} acknowledged records, {checked} record checks, "
          f"{load.sent} sent, in flight at the kills {in_flight}, delivery failures {load.failed}, {segments} segments")


def _native_produce(sock, correlation_id: int, partition: int, key: bytes, value: bytes) -> bytes:
    """A one-record Produce v9 (acks=1, no producer id) to one partition: the shape `shale serve` answers
    natively (tests/server/test_native_produce.py)."""
    records = encode_batch([Record(0, int(time.time() * 1000), key, value)])
    frame = encode_request(0, 9, correlation_id, "crash-native", {
        "transactional_id": None, "acks": 1, "timeout_ms": 30000,
        "topic_data": [{"name": TOPIC, "partition_data": [{"index": partition, "records": records}]}]})
    sock.sendall(frame)
    return frame


def test_records_acknowledged_by_the_native_path_survive_sigkill(tmp_path):
    """One record per request, each answered by the C call that appends it, and SIGKILL with a request in flight:
    every acknowledged record comes back at its offset, byte for byte, and no offset is handed out twice."""
    data_dir = tmp_path / "data"
    write_manifests(tmp_path / "topics" / "crash.yaml", topic_manifest(TOPIC, PARTITIONS, CONFIG))
    port = free_port()
    rng = random.Random(5)
    acked: Acked = {}
    seq = 0
    server = ServeProcess(data_dir, tmp_path / "topics", port=port).start()
    try:
        for cycle in range(4):
            with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
                for _ in range(rng.randint(300, 900)):
                    key, value = b"key-%d" % seq, rng.randbytes(rng.randint(1, 300))
                    partition = seq % PARTITIONS
                    _native_produce(sock, seq, partition, key, value)
                    answer = decode_response(0, 9, _read_answer(sock)).body
                    part = answer.responses[0].partition_responses[0]
                    assert part.error_code == 0, part
                    assert (partition, part.base_offset) not in acked, f"offset {part.base_offset} handed out twice"
                    acked[partition, part.base_offset] = (key, value)
                    seq += 1
                _native_produce(sock, seq, seq % PARTITIONS, b"in flight", b"x")  # not acknowledged: may or may not stay
                server.kill()
            server = ServeProcess(data_dir, tmp_path / "topics", port=port).start()
        assert server.terminate() == 0, server.log()[-5000:]
    finally:
        if server.proc.poll() is None:
            server.kill()
    assert "Traceback" not in server.log(), server.log()[-5000:]
    found, segments = _read_with_engine(data_dir)
    assert _check_acked(acked, found, "read with the engine after four SIGKILLs") > 1000
    assert segments > 4


def _read_answer(sock) -> bytes:
    size = struct.unpack(">i", sock.recv(4, socket.MSG_WAITALL))[0]
    data = sock.recv(size, socket.MSG_WAITALL)
    assert len(data) == size, "the connection closed mid-answer"
    return data
