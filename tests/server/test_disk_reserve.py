"""`shale serve` on a small real volume that fills under load: Produce stops at the free-space floor, the cleaner
uses the reserve to bring the volume back above it, writes are accepted again, nothing acknowledged is lost.

The scene is KAFKA-9087's end state: a compacted topic whose cleaning was paused while producers kept writing.
Without a floor the volume fills to the last block and the cleaner, which writes cleaned segments before it
deletes the dirty ones, cannot free anything (tests/server/test_full_disk_serve.py is that disk). With one, the
pause's release is enough. The test prints the recovery curve: free bytes over time from the release.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

from confluent_kafka import Consumer, KafkaError, Producer
from confluent_kafka import TopicPartition as CTP

from support.fs_util import small_fs
from support.http_util import get_json, request
from support.node_util import ServeProcess, topic_manifest, wait_for, write_manifests

TOPIC = "latest-state"
VOLUME_KIB = 32 * 1024
FLOOR = 8 << 20
KEYS = 16
VALUE = 8 << 10


def free_bytes(path: Path) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


class Load:
    """An idempotent acks=all producer updating KEYS keys as fast as the node takes them, in a thread."""

    def __init__(self, bootstrap: str) -> None:
        self.producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True,
                                  "linger.ms": 5, "message.timeout.ms": 120000})
        self.acked: list[tuple[int, bytes, bytes]] = []  # (offset, key, value)
        self.errors: list[KafkaError] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _delivered(self, err, msg) -> None:
        if err is None:
            self.acked.append((msg.offset(), msg.key(), msg.value()))
        else:
            self.errors.append(err)

    def _run(self) -> None:
        sent = 0
        while not self.stop.is_set():
            if len(self.producer) >= 256:  # a bounded backlog: retried by librdkafka while refused
                self.producer.poll(0.01)
                continue
            key = b"key-%02d" % (sent % KEYS)
            value = (b"%08d:" % sent) * (VALUE // 9)
            self.producer.produce(TOPIC, key=key, value=value, partition=0, on_delivery=self._delivered)
            self.producer.poll(0)
            sent += 1

    def start(self) -> None:
        self.thread.start()

    def finish(self) -> None:
        self.stop.set()
        self.thread.join(10)
        assert self.producer.flush(120) == 0, "records still unanswered 120 s after the load stopped"


def refused_now(http_port: int) -> bool:
    return get_json(http_port, "/status")[1]["log_dirs"][0]["produce_refused"]


def latest_per_key(records) -> dict[bytes, bytes]:
    return {key: value for _, key, value in sorted(records)}


def consume_all(bootstrap: str) -> list[tuple[int, bytes, bytes]]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "reserve-check", "enable.auto.commit": False})
    end = consumer.get_watermark_offsets(CTP(TOPIC, 0), timeout=10)[1]
    consumer.assign([CTP(TOPIC, 0, 0)])
    got: list[tuple[int, bytes, bytes]] = []
    deadline = time.monotonic() + 60
    while (not got or got[-1][0] < end - 1) and time.monotonic() < deadline:
        msg = consumer.poll(0.5)
        if msg is not None and msg.error() is None:
            got.append((msg.offset(), msg.key(), msg.value()))
    consumer.close()
    return got


def test_a_full_volume_refuses_produce_at_the_floor_and_the_cleaner_brings_it_back(tmp_path):
    with small_fs(tmp_path, "tmpfs", VOLUME_KIB) as mnt:
        data = mnt / "data"
        write_manifests(tmp_path / "topics" / "t.yaml", topic_manifest(TOPIC, 1, {
            "cleanup.policy": "compact", "segment.bytes": 1 << 20, "segment.ms": 500, "max.message.bytes": 4 << 20,
            "min.cleanable.dirty.ratio": 0.01, "min.compaction.lag.ms": 0, "file.delete.delay.ms": 0}))
        node = ServeProcess(data, tmp_path / "topics",
                            "--override", f"log.dir.min.free.bytes={FLOOR}", "--override", "log.dir.min.free.ratio=0",
                            "--override", "log.cleaner.backoff.ms=100", "--override", "log.initial.task.delay.ms=0",
                            "--override", "offsets.topic.num.partitions=1")
        node.log_path = tmp_path / "node.log"
        with node:
            assert request(node.http_port, f"/partitions/{TOPIC}/0/pause?owner=stuck", "POST")[0] == 200
            load = Load(node.bootstrap)
            load.start()
            try:
                # 1. Cleaning paused (KAFKA-9087's pause nobody releases): the volume fills down to the floor.
                wait_for(lambda: refused_now(node.http_port), 60, 0.1, "produce refused at the floor")
                time.sleep(1.0)  # the load goes on against the floor: the reserve holds
                held = free_bytes(mnt)
                # Produce stops where its next request would cross the floor (librdkafka's requests are up to 1 MiB).
                assert FLOOR * 3 // 4 <= held < FLOOR + (2 << 20), f"{held} bytes free: the floor did not hold"
                acked_at_floor = len(load.acked)
                # A client without retries sees it, for a record that would leave less than the floor free.
                once = Producer({"bootstrap.servers": node.bootstrap, "acks": "all", "message.send.max.retries": 0,
                                 "message.max.bytes": 4 << 20})
                outcome: list = []
                once.produce(TOPIC, key=b"key-00", value=bytes(free_bytes(mnt) - FLOOR + (64 << 10)), partition=0,
                             on_delivery=lambda err, msg: outcome.append(err))
                once.flush(30)
                assert outcome and outcome[0] is not None and outcome[0].code() == KafkaError.KAFKA_STORAGE_ERROR
                lines = [line for line in node.log().splitlines() if "would leave less than its floor" in line]
                assert any(f"{TOPIC}-0: log dir {data} has " in line and f"floor of {FLOOR} bytes" in line
                           for line in lines), lines
                assert "ENOSPC" not in node.log()

                # 2. The pause released: the cleaner writes into the reserve and frees the dirty segments.
                curve = [(0.0, free_bytes(mnt))]
                released = time.monotonic()
                assert request(node.http_port, f"/partitions/{TOPIC}/0/resume?owner=stuck", "POST")[0] == 200
                above_at = accepted_at = None
                while time.monotonic() - released < 60 and (accepted_at is None or time.monotonic() - accepted_at < 2):
                    time.sleep(0.1)
                    t = time.monotonic() - released
                    curve.append((t, free_bytes(mnt)))
                    if above_at is None and curve[-1][1] >= 2 * FLOOR:  # the dirty segments are gone
                        above_at = t
                    if accepted_at is None and above_at is not None and len(load.acked) > acked_at_floor:
                        accepted_at = time.monotonic()
                assert above_at is not None and accepted_at is not None, curve
            finally:  # released here too when an assertion stopped the test, so that the load's backlog drains
                request(node.http_port, f"/partitions/{TOPIC}/0/resume?owner=stuck", "POST")
                load.finish()
            assert load.errors == [], load.errors[:5]
            status = get_json(node.http_port, "/status")[1]
            assert status["log_dirs"][0]["produce_refusals"] > 0
            print(f"\nthe disk-fill recovery curve (tmpfs {VOLUME_KIB >> 10} MiB, floor {FLOOR >> 20} MiB, "
                  f"{KEYS} keys x {VALUE >> 10} KiB values):")
            print(f"  held at the floor under load: {held / 2**20:.2f} MiB free; acknowledged before: "
                  f"{acked_at_floor} records; refused meanwhile: {status['log_dirs'][0]['produce_refusals']} produces")
            print(f"  twice the floor free {above_at:.2f} s after the release; first new acknowledgement "
                  f"{accepted_at - released:.2f} s after it")
            for t, free in curve[:: max(1, len(curve) // 25)]:
                print(f"  t={t:5.2f} s  free={free / 2**20:6.2f} MiB")

            # 3. Every key's latest acknowledged value, byte for byte.
            stored = latest_per_key(consume_all(node.bootstrap))
            assert stored == latest_per_key(load.acked)
        assert node.proc.returncode == 0, node.log()
