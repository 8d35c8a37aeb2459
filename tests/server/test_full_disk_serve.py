"""`shale serve` on a filesystem that fills up: no signal death, KAFKA_STORAGE_ERROR, nothing acknowledged lost.

The data directory is a small tmpfs or ext4 image the test mounts (tests/support/fs_util.py). A producer writes until
the disk is full; the node must answer KAFKA_STORAGE_ERROR (code 56), keep serving, take writes again once space is
freed, stop cleanly on SIGTERM while full (exit 0, the next start skips recovery), and every record it
acknowledged must come back byte for byte after the restart.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaError, Producer
from confluent_kafka import TopicPartition as CTP

from shale.sidecar.log.log_dir import CLEAN_SHUTDOWN_FILE
from support.clients_util import stored_records
from support.fs_util import PAGE, fill, small_fs
from support.http_util import get_json, sample, scrape
from support.node_util import ServeProcess, topic_manifest, write_manifests

TOPIC = "ledger"
QUIET = ("--override", "offsets.topic.num.partitions=1",  # no scheduled checkpoint takes the last free page
         "--override", "log.initial.task.delay.ms=3600000",
         "--override", "log.dir.min.free.ratio=0")  # no floor: these fill the disk itself (the floor's: test_disk_reserve)


@pytest.fixture(params=["tmpfs", "ext4"])
def disk(tmp_path, request):
    """Both fill the same way for writes; an empty file still fits on both once their blocks are gone
    (tmpfs keeps inodes and names in memory, ext4 has free inodes and room in the directory's block)."""
    with small_fs(tmp_path, request.param, 2048 if request.param == "tmpfs" else 8192) as mnt:
        yield mnt


@pytest.fixture
def tmpfs(tmp_path):
    with small_fs(tmp_path, "tmpfs", 2048) as mnt:
        yield mnt


class Records:
    """A producer of one-record batches that remembers what was acknowledged, and where."""

    def __init__(self, bootstrap: str, **config) -> None:
        self.producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 0,
                                  "message.send.max.retries": 0, **config})
        self.acked: list[tuple[int, int, bytes, bytes]] = []  # (partition, offset, key, value)
        self.errors: list[KafkaError] = []
        self.sent = 0

    def send(self, partition: int = 0, size: int = 40) -> KafkaError | None:
        """Produce one record and wait for its answer; the error, or None when acknowledged."""
        key, value = b"key-%08d" % self.sent, bytes([self.sent % 251]) * size
        self.sent += 1
        outcome: list[KafkaError | None] = []

        def delivered(err, msg):
            outcome.append(err)
            if err is None:
                self.acked.append((msg.partition(), msg.offset(), key, value))
            else:
                self.errors.append(err)

        self.producer.produce(TOPIC, key=key, value=value, partition=partition, on_delivery=delivered)
        self.producer.flush(30)
        assert outcome, "no answer to a produce within 30 s"
        return outcome[0]

    def close(self) -> None:
        self.producer.flush(30)


def consume_all(bootstrap: str, partitions: int) -> list[tuple[int, int, bytes, bytes]]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "full-disk-check", "enable.auto.commit": False})
    ends = {p: consumer.get_watermark_offsets(CTP(TOPIC, p), timeout=10)[1] for p in range(partitions)}
    consumer.assign([CTP(TOPIC, p, 0) for p in range(partitions)])
    got: list[tuple[int, int, bytes, bytes]] = []
    deadline = time.monotonic() + 60
    while len(got) < sum(ends.values()) and time.monotonic() < deadline:
        msg = consumer.poll(0.5)
        if msg is not None and msg.error() is None:
            got.append((msg.partition(), msg.offset(), msg.key(), msg.value()))
    consumer.close()
    return sorted(got)


def log_file(data: Path) -> Path:
    return data / f"{TOPIC}-0" / f"{0:020d}.log"


def test_an_index_page_on_a_full_disk_is_a_storage_error_not_sigbus(tmpfs, tmp_path):
    """The SIGBUS of issue 12: every append writes an index entry; the next one needs a new index page while
    the log's own page still has room. Before the index reserved its pages, the node died of SIGBUS here
    (tmpfs: its free pages are exact, so the test controls which write meets the full disk)."""
    disk = tmpfs
    data = disk / "data"
    write_manifests(tmp_path / "topics" / "t.yaml",
                    topic_manifest(TOPIC, 1, {"segment.bytes": 1 << 20, "index.interval.bytes": 0}))
    node = ServeProcess(data, tmp_path / "topics", *QUIET)
    node.log_path = tmp_path / "node.log"
    node.start()
    records = Records(node.bootstrap)
    try:
        # Every append but the first adds an 8-byte offset-index entry: after 1 + 512 appends (one page of
        # entries) the next entry opens a new page of the index.
        while not (records.sent > 1 and (records.sent - 1) % (PAGE // 8) == 0):
            assert records.send() is None
        size = log_file(data).stat().st_size
        batch = size // records.sent
        assert size == batch * records.sent  # one-record batches of one size
        log_needs_a_page = size % PAGE == 0 or size % PAGE + batch > PAGE
        filler = fill(disk)
        filler.release(PAGE if log_needs_a_page else 0)  # the log's next write fits; the index page does not

        err = records.send()
        assert node.proc.poll() is None, f"the node died ({node.proc.returncode}):\n{node.log()}"
        assert err is not None and err.code() == KafkaError.KAFKA_STORAGE_ERROR, err
        end = len(records.acked)
        status = get_json(node.http_port, "/status")[1]
        part = status["topics"][TOPIC]["partitions"][0]
        assert part["log_end_offset"] == end and part["storage_error"]["errno"] == 28
        assert status["data_dir"]["storage_failing_partitions"] == 1
        assert sample(scrape(node.http_port), "shale_log_storage_failing", topic=TOPIC, partition=0) == 1
        logged = [line for line in node.log().splitlines() if " ERROR " in line and "ENOSPC" in line]
        assert logged and all(s in logged[0] for s in (f"{TOPIC}-0", f"offset {end}", str(data)))
        assert log_file(data).stat().st_size == size  # nothing of the refused batch stays in the file

        filler.release()
        assert records.send() is None  # space freed: acknowledged again, at the next offset
        assert records.acked[-1][1] == end
        assert get_json(node.http_port, "/status")[1]["topics"][TOPIC]["partitions"][0]["storage_error"] is None
        assert sample(scrape(node.http_port), "shale_log_storage_failing", topic=TOPIC, partition=0) == 0
        records.close()
    finally:
        code = node.terminate()
    assert code == 0, node.log()
    assert [(0, r.offset, r.key, r.value) for r in stored_records(data, TOPIC, 0)] == records.acked


def test_a_node_filled_up_keeps_every_acknowledged_record_and_stops_cleanly(disk, tmp_path):
    """Small segments (many rolls) on three partitions, records of varied sizes, produced until the disk is full."""
    data = disk / "data"
    write_manifests(tmp_path / "topics" / "t.yaml",
                    topic_manifest(TOPIC, 3, {"segment.bytes": 16 * 1024, "index.interval.bytes": 0}))
    node = ServeProcess(data, tmp_path / "topics", *QUIET)
    node.log_path = tmp_path / "node.log"
    try:
        node.start()
        records = Records(node.bootstrap)
        filler = fill(disk, "filler")
        filler.release(400 * 1024)
        refused = 0
        while refused < 30:  # every partition meets the full disk, several times
            err = records.send(partition=records.sent % 3, size=100 + records.sent % 200)
            assert node.proc.poll() is None, f"the node died ({node.proc.returncode}):\n{node.log()}"
            if err is not None:
                assert err.code() == KafkaError.KAFKA_STORAGE_ERROR, err
                refused += 1
        records.close()
        assert len(records.acked) > 500
        assert get_json(node.http_port, "/status")[1]["data_dir"]["storage_failing_partitions"] >= 1

        code = node.terminate()  # SIGTERM on the full disk
        assert code == 0, node.log()
        assert "stopped cleanly" in node.log()
        assert (data / CLEAN_SHUTDOWN_FILE).exists()
        for p in range(3):
            assert [(p, r.offset, r.key, r.value) for r in stored_records(data, TOPIC, p)] == \
                [a for a in records.acked if a[0] == p]

        logged = len(node.log())
        node.start()  # still full: the node starts on its own data directory, without recovery
        assert "clean shutdown: recovery skipped" in node.log()[logged:]
        filler.release()
        again = Records(node.bootstrap)
        again.sent = records.sent
        for p in range(3):
            assert again.send(partition=p) is None
        again.close()
        assert consume_all(node.bootstrap, 3) == sorted(records.acked + again.acked)
        code = node.terminate()
        assert code == 0, node.log()
    finally:
        if node.proc is not None and node.proc.poll() is None:
            node.kill()


def test_sigterm_on_a_full_disk_is_unclean_only_when_the_producers_would_be_lost(tmp_path):
    """An idempotent producer's state lives in memory until a roll or a shutdown writes its snapshot. On a
    full disk that snapshot cannot be written and no older one exists: the node says so, leaves no marker,
    exits 1, and the next start recovers them from the log, with every acknowledged record."""
    with small_fs(tmp_path, "tmpfs", 2048) as disk:
        data = disk / "data"
        write_manifests(tmp_path / "topics" / "t.yaml", topic_manifest(TOPIC, 1))
        node = ServeProcess(data, tmp_path / "topics", *QUIET)
        node.log_path = tmp_path / "node.log"
        try:
            node.start()
            records = Records(node.bootstrap, **{"enable.idempotence": True, "message.send.max.retries": 5})
            for _ in range(5):
                assert records.send() is None
            records.close()
            filler = fill(disk)
            assert node.terminate() == 1, node.log()
            assert "its producers are in no snapshot, so the next start must recover" in node.log()
            assert not (data / CLEAN_SHUTDOWN_FILE).exists()
            logged = len(node.log())
            node.start()
            assert "no clean-shutdown marker: recovered from the recovery points" in node.log()[logged:]
            assert consume_all(node.bootstrap, 1) == records.acked
            filler.release()  # room for the snapshot now: clean
            assert node.terminate() == 0, node.log()
        finally:
            if node.proc is not None and node.proc.poll() is None:
                node.kill()
