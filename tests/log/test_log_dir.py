"""A log directory: clean-shutdown marker, checkpoints, the lock, partition.metadata, deletion (spec 3, 5.2)."""

from __future__ import annotations

import json
import os
import re

import pytest

from shale.sidecar.log.checkpoint import parse_offsets
from shale.sidecar.log.log_dir import LogDir, LogDirLockedError, delete_dir_name
from shale.sidecar.log.topic_partition import TopicPartition
from shale.sidecar.topic_config import TopicConfig
from support.logtest_util import T0, FakeClock, all_records, drop_unclosed, records_batch

A = TopicPartition("alpha", 0)
B = TopicPartition("beta-topic", 1)


@pytest.fixture
def cfg(make_config):
    return make_config({"segment.bytes": 300, "index.interval.bytes": 1})


def open_dir(path, cfg, clock=None) -> LogDir:
    return LogDir(str(path), lambda topic: cfg, clock=clock or FakeClock())


def append_n(log, n: int, tag: bytes = b"") -> None:
    for i in range(n):
        log.append(records_batch([(b"k%d" % i, tag + b"v%d" % i, T0 + i)]))


def crash(log_dir: LogDir) -> None:
    """The process dies: no flush, no trim, no checkpoint, no marker; the lock goes with the process."""
    for log in log_dir.logs.values():
        drop_unclosed(log)
    os.close(log_dir._lock_fd)


def test_clean_shutdown_marker_written_on_close_and_consumed_on_open(tmp_path, cfg) -> None:
    d = open_dir(tmp_path, cfg)
    assert not d.had_clean_shutdown, "a new directory had no clean shutdown"
    append_n(d.get_or_create(A), 3)
    d.close()
    marker = tmp_path / ".kafka_cleanshutdown"
    assert json.loads(marker.read_bytes()) == {"version": 0, "brokerEpoch": -1}
    again = open_dir(tmp_path, cfg)
    assert again.had_clean_shutdown
    assert not marker.exists(), "deleted at open, so a crash while loading counts as unclean"
    crash(again)
    third = open_dir(tmp_path, cfg)
    assert not third.had_clean_shutdown
    third.close()


def test_marker_is_deleted_before_logs_load(tmp_path, cfg) -> None:
    d = open_dir(tmp_path, cfg)
    d.get_or_create(A)
    d.close()

    def broken_config(topic):
        raise RuntimeError("config store unavailable")

    with pytest.raises(RuntimeError):
        LogDir(str(tmp_path), broken_config)
    assert not (tmp_path / ".kafka_cleanshutdown").exists()


def test_second_log_dir_on_the_same_path_is_refused(tmp_path, cfg) -> None:
    d = open_dir(tmp_path, cfg)
    with pytest.raises(LogDirLockedError, match=str(tmp_path)):
        open_dir(tmp_path, cfg)
    assert (tmp_path / ".lock").exists()
    d.close()
    open_dir(tmp_path, cfg).close()  # free again after close


def test_checkpoints_exact_bytes(tmp_path, cfg) -> None:
    d = open_dir(tmp_path, cfg)
    a = d.get_or_create(A)
    b = d.get_or_create(B)
    append_n(a, 5)
    append_n(b, 3)
    d.checkpoint()
    rp = parse_offsets((tmp_path / "recovery-point-offset-checkpoint").read_bytes())
    assert rp == {A: a.recovery_point, B: b.recovery_point}
    assert (tmp_path / "log-start-offset-checkpoint").read_bytes() == b"0\n0\n", \
        "only partitions whose start is above their first segment base"
    a.increment_log_start_offset(2)
    d.close()
    assert (tmp_path / "recovery-point-offset-checkpoint").read_bytes() == b"0\n2\nalpha 0 5\nbeta-topic 1 3\n"
    assert (tmp_path / "log-start-offset-checkpoint").read_bytes() == b"0\n1\nalpha 0 2\n"
    again = open_dir(tmp_path, cfg)
    assert again.logs[A].log_start_offset == 2 and again.logs[A].recovery_point == 5
    assert again.logs[B].log_end_offset == 3
    again.close()


def test_unclean_shutdown_recovers_from_the_checkpointed_recovery_point(tmp_path, cfg) -> None:
    d = open_dir(tmp_path, cfg)
    log = d.get_or_create(A)
    append_n(log, 10)
    d.checkpoint()
    rp = log.recovery_point
    active = log.active_segment.log_path
    crash(d)
    with open(active, "ab") as f:
        f.write(b"\x00" * 40)  # preallocated zeros / a torn write
    again = open_dir(tmp_path, cfg)
    log = again.logs[A]
    assert not again.had_clean_shutdown
    assert log.bytes_truncated_on_load == 40 and log.log_end_offset == 10
    assert log.recovery_point == rp
    assert [r.value for r in all_records(log)] == [b"v%d" % i for i in range(10)]
    again.close()


def test_partition_metadata_written_on_create(tmp_path, cfg) -> None:
    d = open_dir(tmp_path, cfg)
    d.get_or_create(A, topic_id="B3_HiNPgSQ6oxG9ZZ6ED5A")
    d.get_or_create(B)
    path = tmp_path / "alpha-0" / "partition.metadata"
    assert path.read_bytes() == b"version: 0\ntopic_id: B3_HiNPgSQ6oxG9ZZ6ED5A"
    assert os.path.getsize(tmp_path / "beta-topic-1" / "partition.metadata") == 43
    assert d.topic_id(A) == "B3_HiNPgSQ6oxG9ZZ6ED5A"
    assert d.get_or_create(A) is d.logs[A]
    d.close()
    again = open_dir(tmp_path, cfg)
    assert again.topic_id(A) == "B3_HiNPgSQ6oxG9ZZ6ED5A"
    again.close()


def test_delete_removes_the_partition_and_its_checkpoint_entry(tmp_path, cfg) -> None:
    d = open_dir(tmp_path, cfg)
    append_n(d.get_or_create(A), 3)
    append_n(d.get_or_create(B), 3)
    d.delete(A)
    assert A not in d.logs
    assert sorted(n for n in os.listdir(tmp_path) if os.path.isdir(tmp_path / n)) == ["beta-topic-1"]
    assert parse_offsets((tmp_path / "recovery-point-offset-checkpoint").read_bytes()).keys() == {B}
    d.close()


def test_delete_dirs_and_non_partition_dirs_at_load(tmp_path, cfg) -> None:
    (tmp_path / "alpha-0.0123456789abcdef0123456789abcdef-delete").mkdir()
    (tmp_path / "alpha-0.0123456789abcdef0123456789abcdef-delete" / "00000000000000000000.log").write_bytes(b"")
    (tmp_path / "not_a_partition").mkdir()
    d = open_dir(tmp_path, cfg)
    assert not (tmp_path / "alpha-0.0123456789abcdef0123456789abcdef-delete").exists()
    assert (tmp_path / "not_a_partition").exists() and d.logs == {}
    d.close()


LONGEST = TopicPartition("n" + "o" * 248, 5)  # Kafka's longest topic name: 249 characters


def test_delete_dir_name_is_cut_to_255_characters_as_kafka_does() -> None:
    """Kafka's LocalLogTest.testLogDeleteDirName: the topic is cut, the partition, uuid and suffix kept."""
    assert re.fullmatch(r"foo-3\.[0-9a-f]{32}-delete", delete_dir_name(TopicPartition("foo", 3)))
    name = delete_dir_name(LONGEST)
    assert len(name.encode()) == 255
    assert re.fullmatch(r"no{212}-5\.[0-9a-f]{32}-delete", name)


def test_deleting_a_topic_with_the_longest_name_removes_it_for_good(tmp_path, cfg) -> None:
    """Uncut, the `-delete` rename passed 255 bytes: ENAMETOOLONG, and the topic came back at the next start."""
    d = open_dir(tmp_path, cfg)
    append_n(d.get_or_create(LONGEST), 3)
    append_n(d.get_or_create(A), 1)
    d.delete(LONGEST)
    assert LONGEST not in d.logs
    assert sorted(n for n in os.listdir(tmp_path) if os.path.isdir(tmp_path / n)) == ["alpha-0"]
    d.close()
    again = open_dir(tmp_path, cfg)
    assert set(again.logs) == {A}
    again.close()


def test_a_cut_delete_dir_left_by_a_crash_is_removed_at_load(tmp_path, cfg) -> None:
    """A crash between the rename and the removal leaves the cut name: the next start removes it, data and all."""
    d = open_dir(tmp_path, cfg)
    append_n(d.get_or_create(LONGEST), 3)
    crash(d)
    doomed = tmp_path / delete_dir_name(LONGEST)
    os.rename(tmp_path / str(LONGEST), doomed)
    again = open_dir(tmp_path, cfg)
    assert again.logs == {} and not doomed.exists()
    again.close()


def test_failed_open_releases_the_lock(tmp_path) -> None:
    """A LogDir whose loading fails must not keep the directory locked for the rest of the process."""
    def broken_config(topic: str):
        raise ValueError(f"no config for {topic}")

    data = tmp_path / "data"
    (data / "t-0").mkdir(parents=True)
    with pytest.raises(ValueError, match="no config for t"):
        LogDir(str(data), broken_config)
    ok = LogDir(str(data), lambda topic: TopicConfig.from_mapping({}))
    assert list(ok.logs) and ok.logs[next(iter(ok.logs))].log_end_offset == 0
    ok.close()


def test_a_directory_with_nothing_in_it_is_new_not_recovered(tmp_path, cfg) -> None:
    # Missing, empty, or holding only the `.lock` of a start that wrote nothing: new (the node says so).
    missing = open_dir(tmp_path / "missing", cfg)
    assert missing.is_new and not missing.had_clean_shutdown
    missing.close()  # writes the checkpoints and the marker: from now on it has a history
    (tmp_path / "empty").mkdir()
    empty = open_dir(tmp_path / "empty", cfg)
    assert empty.is_new
    crash(empty)  # leaves its `.lock` behind
    assert os.listdir(tmp_path / "empty") == [".lock"]
    assert open_dir(tmp_path / "empty", cfg).is_new

    reopened = open_dir(tmp_path / "missing", cfg)
    assert not reopened.is_new and reopened.had_clean_shutdown
    append_n(reopened.get_or_create(A), 3)
    crash(reopened)
    after_crash = open_dir(tmp_path / "missing", cfg)  # a partition and no marker: a recovery
    assert not after_crash.is_new and not after_crash.had_clean_shutdown
