"""Scheduled maintenance and the cleaner threads of a real node, on real files, fed by a real Kafka client."""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

import pytest
from kafka import KafkaConsumer, KafkaProducer
from kafka import TopicPartition as KTP

from shale.sidecar.log.checkpoint import (
    CLEANER_OFFSET_CHECKPOINT,
    LOG_START_OFFSET_CHECKPOINT,
    RECOVERY_POINT_CHECKPOINT,
    read_offsets,
)
from shale.sidecar.log.cleaner_manager import CleaningState
from shale.sidecar.log.topic_partition import TopicPartition
from shale.sidecar.server_config import (
    SERVER_CONFIG_KEYS,
    ServerConfig,
    ServerConfigError,
    parse_overrides,
)
from support.node_util import NodeThread, topic_manifest, wait_for, write_manifests

FAST = {"log.initial.task.delay.ms": "0"}
HOUR_MS = 3_600_000


def produce_each(bootstrap: str, topic: str, records, *, partition: int = 0, timestamp_ms: int | None = None):
    """One request per record, so each batch is small enough for tiny segments; returns the offsets."""
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks=1, enable_idempotence=False, linger_ms=0)
    try:
        return [producer.send(topic, key=k, value=v, partition=partition, timestamp_ms=timestamp_ms).get(10).offset
                for k, v in records]
    finally:
        producer.close()


def consume_all(bootstrap: str, topic: str, partition: int, end: int) -> list[tuple[int, bytes, bytes]]:
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, auto_offset_reset="earliest")
    try:
        tp = KTP(topic, partition)
        consumer.assign([tp])
        consumer.seek_to_beginning(tp)
        out = []
        deadline = time.monotonic() + 20
        while consumer.position(tp) < end and time.monotonic() < deadline:
            for records in consumer.poll(timeout_ms=200).values():
                out += [(r.offset, r.key, r.value) for r in records]
        return out
    finally:
        consumer.close()


def log_of(node: NodeThread, topic: str, partition: int = 0):
    return node.node.log_dir.logs[TopicPartition(topic, partition)]


def segment_files(directory) -> list[str]:
    return sorted(n for n in os.listdir(directory) if ".log" in n)


# -- server config ------------------------------------------------------------------------------


def test_server_config_has_kafkas_defaults_and_feeds_the_cleaner():
    defaults = ServerConfig.from_mapping({})
    assert defaults.log_retention_check_interval_ms == 300000
    assert defaults.log_flush_scheduler_interval_ms == 2**63 - 1
    assert defaults.log_flush_offset_checkpoint_interval_ms == 60000
    assert defaults.log_flush_start_offset_checkpoint_interval_ms == 60000
    assert defaults.producer_id_expiration_check_interval_ms == 600000
    assert defaults.group_initial_rebalance_delay_ms == 3000
    assert defaults.offsets_topic_num_partitions == 50
    assert defaults.overrides() == {}
    assert {k.name for k in SERVER_CONFIG_KEYS} >= {"log.cleaner.enable", "log.cleaner.threads",
                                                    "log.cleaner.dedupe.buffer.size", "log.cleaner.backoff.ms",
                                                    "log.cleaner.io.buffer.load.factor",
                                                    "log.cleaner.io.max.bytes.per.second",
                                                    "producer.id.expiration.ms"}

    cfg = ServerConfig.from_mapping(parse_overrides(["log.cleaner.threads=3", "log.cleaner.backoff.ms= 250",
                                                     "producer.id.expiration.ms=1000",
                                                     "log.cleaner.io.max.bytes.per.second=1e6"]))
    cleaner = cfg.cleaner_config()
    assert (cleaner.threads, cleaner.backoff_ms, cleaner.producer_id_expiration_ms) == (3, 250, 1000)
    assert cleaner.io_max_bytes_per_second == 1e6
    assert cfg.overrides() == {"log.cleaner.threads": "3", "log.cleaner.backoff.ms": "250",
                               "producer.id.expiration.ms": "1000", "log.cleaner.io.max.bytes.per.second": "1000000.0"}


@pytest.mark.parametrize("items, message", [
    (["log.cleaner.threads=-1"], "Invalid value -1 for configuration log.cleaner.threads: Value must be at least 0"),
    (["log.retention.check.interval.ms=soon"], "Invalid value soon for configuration log.retention.check.interval.ms"),
    (["log.cleaner.io.buffer.load.factor=1.5"], "log.cleaner.io.buffer.load.factor"),
    (["log.cleaner.enable=yes"], "Expected value to be either true or false"),
    (["no.such.config=1"], "Unknown broker config name: no.such.config"),
    (["log.cleaner.threads"], "expected key=value"),
])
def test_invalid_server_configs_are_refused_with_the_key_in_the_message(items, message):
    with pytest.raises(ServerConfigError, match=message.replace(".", r"\.")):
        ServerConfig.from_mapping(parse_overrides(items))


# -- scheduled tasks ----------------------------------------------------------------------------


def test_retention_deletes_expired_segments_of_delete_topics_on_schedule(tmp_path):
    small = {"segment.bytes": 200, "file.delete.delay.ms": 0}
    write_manifests(tmp_path / "topics" / "t.yaml",
                    topic_manifest("expiring", 1, {**small, "retention.ms": HOUR_MS}),
                    topic_manifest("held", 1, {**small, "retention.ms": HOUR_MS}),
                    topic_manifest("kept", 1, small))  # default retention.ms: 7 days
    overrides = {**FAST, "log.retention.check.interval.ms": "100"}
    node = NodeThread(tmp_path / "data", tmp_path / "topics", overrides=overrides)
    manager = node.node.maintenance.manager
    assert manager.pause(TopicPartition("held", 0)) == 1  # paused partitions get no retention (Kafka)
    with node:
        two_hours_ago = int(time.time() * 1000) - 2 * HOUR_MS
        records = [(b"k%d" % i, b"v" * 40) for i in range(10)]
        for topic in ("expiring", "held", "kept"):
            produce_each(node.bootstrap, topic, records, timestamp_ms=two_hours_ago)
        expiring, held, kept = (log_of(node, t) for t in ("expiring", "held", "kept"))

        # Every segment is past retention.ms: all go, a new empty active segment starts at the log end.
        wait_for(lambda: expiring.log_start_offset == 10, what="retention of expiring-0")
        assert [s.base_offset for s in expiring.segments] == [10]
        # file.delete.delay.ms=0: the kafka-delete-logs task removes the renamed files too.
        wait_for(lambda: segment_files(expiring.dir) == ["00000000000000000010.log"],
                 what="the .deleted files of expiring-0 to go")
        runs = node.node.maintenance.tasks["kafka-log-retention"].runs
        wait_for(lambda: node.node.maintenance.tasks["kafka-log-retention"].runs > runs + 1, what="more runs")
        assert kept.log_start_offset == 0 and len(kept.segments) > 3  # within its 7 days
        assert held.log_start_offset == 0 and len(held.segments) > 3  # paused
        consumer = KafkaConsumer(bootstrap_servers=node.bootstrap)
        try:
            assert consumer.beginning_offsets([KTP("expiring", 0), KTP("kept", 0)]) == {
                KTP("expiring", 0): 10, KTP("kept", 0): 0}
        finally:
            consumer.close()

        assert manager.resume(TopicPartition("held", 0)) == 0
        wait_for(lambda: held.log_start_offset == 10, what="retention of held-0 once resumed")
        assert node.node.maintenance.tasks["kafka-log-retention"].errors == 0


def test_flush_ms_is_applied_by_the_flusher_task(tmp_path):
    write_manifests(tmp_path / "topics" / "t.yaml", topic_manifest("flushed", 1, {"flush.ms": 0}),
                    topic_manifest("unflushed", 1))
    overrides = {**FAST, "log.flush.scheduler.interval.ms": "50"}
    with NodeThread(tmp_path / "data", tmp_path / "topics", overrides=overrides) as node:
        records = [(b"k%d" % i, b"v%d" % i) for i in range(5)]
        produce_each(node.bootstrap, "flushed", records)
        produce_each(node.bootstrap, "unflushed", records)
        flushed, unflushed = log_of(node, "flushed"), log_of(node, "unflushed")
        wait_for(lambda: flushed.recovery_point == 5, what="flushed-0 to be flushed")
        runs = node.node.maintenance.tasks["kafka-log-flusher"].runs
        wait_for(lambda: node.node.maintenance.tasks["kafka-log-flusher"].runs > runs + 1, what="more flusher runs")
        # flush.ms is Long.MAX by default: the same task leaves that log to the OS.
        assert (unflushed.recovery_point, unflushed.log_end_offset) == (0, 5)


def test_checkpoints_are_written_on_schedule(tmp_path):
    write_manifests(tmp_path / "topics" / "t.yaml", topic_manifest("points", 1, {"flush.ms": 0}))
    overrides = {**FAST, "log.flush.scheduler.interval.ms": "50", "log.flush.offset.checkpoint.interval.ms": "100",
                 "log.flush.start.offset.checkpoint.interval.ms": "100",
                 "producer.id.expiration.check.interval.ms": "50"}
    data = tmp_path / "data"
    with NodeThread(data, tmp_path / "topics", overrides=overrides) as node:
        tp = TopicPartition("points", 0)
        produce_each(node.bootstrap, "points", [(b"k%d" % i, b"v") for i in range(6)])

        def recovery_point():
            try:
                return read_offsets(str(data / RECOVERY_POINT_CHECKPOINT)).get(tp)
            except FileNotFoundError:
                return None

        wait_for(lambda: recovery_point() == 6, what="the recovery point checkpoint")
        log = log_of(node, "points")
        node.call(log.increment_log_start_offset, 4)  # as DeleteRecords does: above the first segment's base
        wait_for(lambda: read_offsets(str(data / LOG_START_OFFSET_CHECKPOINT)).get(tp) == 4,
                 what="the log start offset checkpoint")
        tasks = node.node.maintenance.tasks
        assert tasks["kafka-recovery-point-checkpoint"].errors == 0
        # The producer-id expiry task calls the engine's Log.remove_expired_producers on every log.
        wait_for(lambda: tasks["PeriodicProducerExpirationCheck"].runs > 2, what="producer expiration runs")
        assert tasks["PeriodicProducerExpirationCheck"].errors == 0


def _taken(path: Path) -> bool:
    """`path` made a directory, so that writing it as a file fails; False if a file is there this moment."""
    try:
        path.mkdir()
    except FileExistsError:
        return False
    return True


def test_a_failing_task_is_logged_with_its_partition_and_the_scheduler_keeps_running(tmp_path, caplog):
    caplog.set_level(logging.INFO)
    write_manifests(tmp_path / "topics" / "t.yaml",
                    topic_manifest("broken", 1, {"segment.bytes": 200, "retention.ms": HOUR_MS}))
    overrides = {**FAST, "log.retention.check.interval.ms": "50", "log.flush.offset.checkpoint.interval.ms": "50"}
    data = tmp_path / "data"
    with NodeThread(data, tmp_path / "topics", overrides=overrides) as node:
        tasks = node.node.maintenance.tasks
        # A disk that refuses: the checkpoint's temporary file and the first segment's `.deleted` name are taken.
        # The checkpoint task writes that file every 50 ms: taken between two of its writes.
        wait_for(lambda: _taken(data / (RECOVERY_POINT_CHECKPOINT + ".tmp")), what="the checkpoint's temporary name")
        (data / "broken-0" / "00000000000000000000.log.deleted").mkdir()
        produce_each(node.bootstrap, "broken", [(b"k%d" % i, b"v" * 40) for i in range(6)],
                     timestamp_ms=int(time.time() * 1000) - 2 * HOUR_MS)

        wait_for(lambda: tasks["kafka-log-retention"].errors > 0, what="retention to fail")
        wait_for(lambda: tasks["kafka-recovery-point-checkpoint"].errors > 1, what="checkpoints to fail twice")
        failures = [r for r in caplog.records if r.levelno >= logging.ERROR and r.name.endswith("maintenance")]
        assert any("retention of broken-0 failed" in r.getMessage() for r in failures)
        assert tasks["kafka-log-retention"].last_error.startswith("broken-0: IsADirectoryError")
        assert str(data) in tasks["kafka-recovery-point-checkpoint"].last_error
        runs = {name: t.runs for name, t in tasks.items()}
        wait_for(lambda: all(tasks[n].runs > runs[n] + 1 for n in
                             ("kafka-log-retention", "kafka-recovery-point-checkpoint", "kafka-delete-logs")),
                 what="the scheduler to keep running every task")
        assert node.node.maintenance.scheduler.alive
        (data / (RECOVERY_POINT_CHECKPOINT + ".tmp")).rmdir()  # the disk recovers: the next run succeeds
        wait_for(lambda: (data / RECOVERY_POINT_CHECKPOINT).exists(), what="a checkpoint once the disk recovered")
        errors, runs = tasks["kafka-recovery-point-checkpoint"].errors, tasks["kafka-recovery-point-checkpoint"].runs
        wait_for(lambda: tasks["kafka-recovery-point-checkpoint"].runs > runs + 2, what="more checkpoints")
        assert tasks["kafka-recovery-point-checkpoint"].errors == errors
        (data / "broken-0" / "00000000000000000000.log.deleted").rmdir()


# -- the cleaner threads ------------------------------------------------------------------------


def test_cleaner_threads_compact_a_topic_produced_by_kafka_python_to_the_latest_value_per_key(tmp_path):
    write_manifests(tmp_path / "topics" / "t.yaml",
                    topic_manifest("prices", 1, {"cleanup.policy": "compact", "segment.bytes": 1024,
                                                 "min.cleanable.dirty.ratio": 0.01}))
    data = tmp_path / "data"
    with NodeThread(data, tmp_path / "topics", overrides={"log.cleaner.backoff.ms": "50"}) as node:
        records = [(b"sku-%d" % (i % 6), b"price %d " % i + b"." * 60) for i in range(80)]
        offsets = produce_each(node.bootstrap, "prices", records)
        assert offsets == list(range(80))
        log = log_of(node, "prices")
        tp = TopicPartition("prices", 0)
        active_base = log.active_segment.base_offset
        assert active_base > 0

        def cleaned_up_to_active() -> bool:
            try:
                return read_offsets(str(data / CLEANER_OFFSET_CHECKPOINT)).get(tp) == active_base
            except FileNotFoundError:
                return False

        wait_for(cleaned_up_to_active, what="prices-0 to be cleaned up to its active segment")
        # Below the active segment only each key's last record survives; the active segment is untouched.
        latest = {}
        for offset, (key, _) in enumerate(records[:active_base]):
            latest[key] = offset
        expected = sorted([(o, records[o][0], records[o][1]) for o in latest.values()]
                          + [(o, k, v) for o, (k, v) in enumerate(records) if o >= active_base])
        assert consume_all(node.bootstrap, "prices", 0, 80) == expected
        assert node.node.maintenance.cleaner.last_clean_ms[tp] > 0
        assert node.node.maintenance.cleaner.dead_threads == 0


def test_deleting_a_topic_whose_cleaning_is_paused_forgets_the_pause(tmp_path):
    manifests = tmp_path / "topics" / "t.yaml"
    doomed = topic_manifest("doomed", 1, {"cleanup.policy": "compact", "segment.bytes": 1024,
                                          "min.cleanable.dirty.ratio": 0.01})
    write_manifests(manifests, doomed, topic_manifest("other", 1))
    data = tmp_path / "data"
    tp = TopicPartition("doomed", 0)
    records = [(b"k%d" % (i % 3), b"x" * 80) for i in range(40)]
    with NodeThread(data, tmp_path / "topics", overrides={"log.cleaner.backoff.ms": "50"}) as node:
        manager = node.node.maintenance.manager
        assert manager.pause(tp) == 1
        produce_each(node.bootstrap, "doomed", records)
        assert manager.state(tp).state is CleaningState.PAUSED

        write_manifests(manifests, topic_manifest("other", 1))  # the topic is deleted
        wait_for(lambda: not any(n.startswith("doomed-") for n in os.listdir(data)), what="doomed-0 to be deleted")
        assert tp not in node.node.log_dir.logs
        # Forgotten once the topic is gone (TopicRegistry's on_change), not left paused.
        wait_for(lambda: manager.state(tp).state is CleaningState.IDLE, what="the pause of doomed-0 to be forgotten")
        assert manager.state(tp).pause_count == 0

        # Re-created under the same name, the partition is cleaned again: no pause leaked.
        write_manifests(manifests, doomed, topic_manifest("other", 1))
        wait_for(lambda: tp in node.node.log_dir.logs, what="doomed-0 to be re-created")
        produce_each(node.bootstrap, "doomed", records)
        active_base = node.node.log_dir.logs[tp].active_segment.base_offset
        wait_for(lambda: read_offsets(str(data / CLEANER_OFFSET_CHECKPOINT)).get(tp) == active_base,
                 what="the re-created doomed-0 to be cleaned")
        assert node.node.maintenance.cleaner.live_threads == 1


def test_deleting_a_topic_while_it_is_being_cleaned_aborts_the_pass_first(tmp_path, caplog):
    caplog.set_level(logging.INFO)
    manifests = tmp_path / "topics" / "t.yaml"
    write_manifests(manifests, topic_manifest("busy", 1, {"cleanup.policy": "compact", "segment.bytes": 65536,
                                                          "min.cleanable.dirty.ratio": 0.01}),
                    topic_manifest("other", 1))
    data = tmp_path / "data"
    tp = TopicPartition("busy", 0)
    # The cleaner sleeps until woken (it found nothing to do at startup).
    with NodeThread(data, tmp_path / "topics", overrides={"log.cleaner.backoff.ms": "600000"}) as node:
        maintenance = node.node.maintenance
        producer = KafkaProducer(bootstrap_servers=node.bootstrap, acks=1, enable_idempotence=False, linger_ms=20,
                                 batch_size=16384)
        try:
            futures = [producer.send("busy", key=b"k%d" % (i % 4), value=b"y" * 1000) for i in range(3000)]
            assert [f.get(20).offset for f in futures] == list(range(3000))
        finally:
            producer.close()

        # Choreography with the log's own lock: the woken cleaner stops while it selects busy-0 (it reads the
        # log's offsets under the lock), the deletion starts and waits for the cleaner, then the lock is let
        # go: the cleaner takes busy-0, the deletion's abort reaches the running pass, the pass stops, and
        # only then the log is deleted.
        log = log_of(node, "busy")
        looked = maintenance.manager.last_run_ms
        with log.lock:
            maintenance.cleaner.wake()
            wait_for(lambda: maintenance.manager.last_run_ms != looked, what="the cleaner to look for work")
            write_manifests(manifests, topic_manifest("other", 1))
            wait_for(lambda: "busy" not in node.node.registry.topics, what="the deletion of busy to begin")
        wait_for(lambda: not any(n.startswith("busy-") for n in os.listdir(data)), what="busy-0 to be deleted")
        wait_for(lambda: maintenance.manager.state(tp).state is CleaningState.IDLE, what="busy-0 to be forgotten")
        messages = [r.getMessage() for r in caplog.records]
        began = messages.index("Beginning cleaning of log busy-0")
        aborted = messages.index("Cleaning of busy-0 was aborted")
        deleted = messages.index("topic busy deleted")
        assert began < aborted < deleted  # the pass started, then stopped before the log went
        assert (maintenance.cleaner.live_threads, maintenance.cleaner.dead_threads) == (1, 0)
        assert maintenance.manager.uncleanable() == {}
        assert not list(data.glob("*/*.cleaned"))
        checkpoint = data / CLEANER_OFFSET_CHECKPOINT
        assert tp not in (read_offsets(str(checkpoint)) if checkpoint.exists() else {})
        assert produce_each(node.bootstrap, "other", [(b"a", b"b")]) == [0]


def test_deleting_a_topic_whose_cleaner_thread_died_mid_pass_does_not_hang_the_node(tmp_path):
    manifests = tmp_path / "topics" / "t.yaml"
    write_manifests(manifests, topic_manifest("orphan", 1, {"cleanup.policy": "compact", "segment.bytes": 1024,
                                                            "min.cleanable.dirty.ratio": 0.01}),
                    topic_manifest("other", 1))
    data = tmp_path / "data"
    tp = TopicPartition("orphan", 0)
    with NodeThread(data, tmp_path / "topics", overrides={"log.cleaner.backoff.ms": "50"}) as node:
        maintenance = node.node.maintenance
        blocker = data / (CLEANER_OFFSET_CHECKPOINT + ".tmp")
        blocker.mkdir()  # the first pass to finish cannot write the cleaner checkpoint: its thread dies
        produce_each(node.bootstrap, "orphan", [(b"k%d" % (i % 3), b"z" * 100) for i in range(30)])
        wait_for(lambda: maintenance.cleaner.dead_threads == 1, what="the cleaner thread to die")
        assert maintenance.manager.state(tp).state is CleaningState.IN_PROGRESS  # left so by the dead thread
        blocker.rmdir()

        write_manifests(manifests, topic_manifest("other", 1))
        wait_for(lambda: not any(n.startswith("orphan-") for n in os.listdir(data)), what="orphan-0 to be deleted")
        wait_for(lambda: maintenance.manager.state(tp).state is CleaningState.IDLE, what="orphan-0 to be forgotten")
        assert produce_each(node.bootstrap, "other", [(b"a", b"b")]) == [0]  # the event loop is not stuck


def test_a_topic_config_change_wakes_the_sleeping_cleaner(tmp_path):
    manifests = tmp_path / "topics" / "t.yaml"
    config = {"cleanup.policy": "compact", "segment.bytes": 1024, "min.cleanable.dirty.ratio": 1}
    write_manifests(manifests, topic_manifest("lazy", 1, config))
    data = tmp_path / "data"
    tp = TopicPartition("lazy", 0)
    # The cleaner backs off for 10 minutes when it finds nothing to do; this test waits at most 15 s.
    with NodeThread(data, tmp_path / "topics", overrides={"log.cleaner.backoff.ms": "600000"}) as node:
        produce_each(node.bootstrap, "lazy", [(b"k%d" % (i % 2), b"w" * 100) for i in range(30)])
        runs = node.node.maintenance.manager.last_run_ms
        active_base = log_of(node, "lazy").active_segment.base_offset
        assert not (data / CLEANER_OFFSET_CHECKPOINT).exists() or tp not in read_offsets(
            str(data / CLEANER_OFFSET_CHECKPOINT))  # a ratio of 1 is never exceeded: nothing cleaned

        write_manifests(manifests, topic_manifest("lazy", 1, {**config, "min.cleanable.dirty.ratio": 0.01}))
        wait_for(lambda: (data / CLEANER_OFFSET_CHECKPOINT).exists()
                 and read_offsets(str(data / CLEANER_OFFSET_CHECKPOINT)).get(tp) == active_base,
                 what="the woken cleaner to clean lazy-0")
        assert node.node.maintenance.manager.last_run_ms > runs
