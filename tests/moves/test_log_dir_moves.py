"""Log-dir moves (JBOD) on a real node with several log dirs, one test per way out of a move (docs/moves.md,
section 3): each proves the move's cleaning pause is released, cleaning resumes and the compacted log shrinks
again. The moves are driven by kafka-python's admin client (AlterReplicaLogDirs, DescribeLogDirs); a
`replica.alter.log.dirs.io.max.bytes.per.second` of 1 wedges a move in its copy on purpose."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import urllib.request
from pathlib import Path

import pytest
from kafka import KafkaProducer
from kafka.admin import KafkaAdminClient

from shale.sidecar.log.checkpoint import CLEANER_OFFSET_CHECKPOINT, read_offsets
from shale.sidecar.log.pause_owners import PAUSES_FILE
from shale.sidecar.log.topic_partition import TopicPartition
from shale.sidecar.server.ops import node_figures as metrics
from support.clients_util import raw_batches
from support.fs_util import small_fs
from support.node_util import NodeThread, ServeProcess, topic_manifest, wait_for, write_manifests

TP = TopicPartition("orders", 0)
COMPACTED = {"cleanup.policy": "compact", "segment.bytes": 65536, "min.cleanable.dirty.ratio": 0.01}
QUICK = {"log.cleaner.backoff.ms": "100", "offsets.topic.num.partitions": "2",
         "transaction.state.log.num.partitions": "2"}
WEDGED = {**QUICK, "replica.alter.log.dirs.io.max.bytes.per.second": "1"}


def node_with_dirs(tmp_path: Path, dirs: list[Path], overrides: dict[str, str]) -> NodeThread:
    topics = tmp_path / "topics"
    write_manifests(topics / "orders.yaml", topic_manifest("orders", 1, COMPACTED))
    write_manifests(topics / "other.yaml", topic_manifest("other", 1))  # a deletion is then not "every file gone"
    return NodeThread(",".join(map(str, dirs)), topics, overrides=overrides)


def produce_duplicates(bootstrap: str, records: int = 1500) -> None:
    """50 keys over and over, 1 KB each: a compacted log far larger than what compaction leaves."""
    producer = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=5)
    for i in range(records):
        producer.send("orders", key=b"k%d" % (i % 50), value=os.urandom(1000), partition=0)
    producer.flush()
    producer.close()


def status(node: NodeThread) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{node.node.http_port}/status", timeout=10) as r:
        return json.loads(r.read())


def partition_status(node: NodeThread) -> dict:
    return status(node)["topics"]["orders"]["partitions"][0]


def alter(node: NodeThread, target: Path) -> None:
    admin = KafkaAdminClient(bootstrap_servers=node.bootstrap)
    try:
        result = admin.alter_replica_log_dirs({("orders", 0, 0): str(target)})
    finally:
        admin.close()
    assert [e.__name__ for e in result.values()] == ["NoError"], result


def produce_held(node: NodeThread) -> None:
    """1.5 MB of duplicates kept uncompacted (a pause of the test's own), so a move has more than one chunk to copy."""
    node.node.maintenance.pause(TP, "http:setup")
    produce_duplicates(node.bootstrap)


def wait_copying(node: NodeThread) -> dict:
    """The move copies (wedged by the throttle); the test's own pause, if any, is released: the move's is then
    the partition's only one."""
    def copying():
        p = partition_status(node)
        return p if p["move"] and p["move"]["state"] == "copying" and p["move"]["bytes_copied"] > 0 else None
    p = wait_for(copying, what="the move to copy")
    if "http:setup" in p["cleaning"]["pause_owners"]:
        node.node.maintenance.resume(TP, "http:setup")
        p = partition_status(node)
    assert p["cleaning"]["state"] == "paused"
    assert p["cleaning"]["pause_owners"] == [f"move:{p['move']['id']}"]
    return p


def assert_cleaning_resumes_and_log_shrinks(node: NodeThread) -> None:
    """No pause left; 1.5 MB of duplicates written now are compacted away: the log ends at a fraction of that
    (50 keys of 1 KB, the active segment and a few uncleaned ones), which a paused cleaner would never reach."""
    assert partition_status(node)["cleaning"]["pause_count"] == 0
    size_before = node.node.log_dir.logs[TP].size_in_bytes
    produce_duplicates(node.bootstrap)
    wait_for(lambda: node.node.log_dir.logs[TP].size_in_bytes < 300_000 + size_before // 10, timeout=60,
             what="the compacted log to shrink")
    assert partition_status(node)["cleaning"]["pause_owners"] == []


def future_dirs(*dirs: Path) -> list[str]:
    return [n for d in dirs for n in os.listdir(d) if n.endswith(("-future", "-swapout"))]


def test_new_partitions_go_to_the_dir_with_the_fewest(tmp_path):
    dirs = [tmp_path / "a", tmp_path / "b", tmp_path / "c"]
    with node_with_dirs(tmp_path, dirs, QUICK) as node:
        counts = {d["path"]: d["partitions"] for d in status(node)["log_dirs"]}
        # orders-0, other-0 and __consumer_offsets' 2 (no transactional producer yet, so no __transaction_state):
        # 4 partitions over 3 dirs, never 2 apart (Kafka's rule)
        assert sorted(counts) == sorted(str(d) for d in dirs) and sum(counts.values()) == 4
        assert max(counts.values()) - min(counts.values()) <= 1
        admin = KafkaAdminClient(bootstrap_servers=node.bootstrap)
        described = admin.describe_log_dirs()
        admin.close()
        listed = {d["log_dir"]: sum(len(t["partitions"]) for t in d["topics"]) for d in described[0]["log_dirs"]}
        assert listed == counts


def test_move_is_byte_identical_and_cleaning_resumes(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    with node_with_dirs(tmp_path, [a, b], QUICK) as node:
        source = Path(node.node.log_dir.dir_of(TP))
        target = b if source == a else a
        produce_duplicates(node.bootstrap)
        wait_for(lambda: node.node.maintenance.cleaner.last_clean_ms.get(TP) is not None
                 and partition_status(node)["cleaning"]["state"] == "idle", timeout=60, what="a first cleaning")
        before = [raw for raw, _ in raw_batches(source, "orders", 0)]
        first_dirty = read_offsets(str(source / CLEANER_OFFSET_CHECKPOINT))[TP]

        alter(node, target)
        wait_for(lambda: (partition_status(node)["move"] or {}).get("state") == "done", what="the move")
        assert [raw for raw, _ in raw_batches(target, "orders", 0)] == before  # byte for byte
        assert partition_status(node)["log_dir"] == str(target) and not (source / "orders-0").exists()
        assert future_dirs(a, b) == []
        # The cleaner's checkpoint entry moved with the partition and left the old dir (KAFKA-8362).
        assert read_offsets(str(target / CLEANER_OFFSET_CHECKPOINT))[TP] == first_dirty
        assert TP not in read_offsets(str(source / CLEANER_OFFSET_CHECKPOINT))
        assert_cleaning_resumes_and_log_shrinks(node)


def test_second_alter_cancels_and_the_old_pause_is_released(tmp_path):
    """KAFKA-19458: a move replaced by another one left its pause behind."""
    dirs = [tmp_path / "a", tmp_path / "b", tmp_path / "c"]
    with node_with_dirs(tmp_path, dirs, WEDGED) as node:
        produce_held(node)
        source = Path(node.node.log_dir.dir_of(TP))
        first_target, second_target = [d for d in dirs if d != source]
        alter(node, first_target)
        first = wait_copying(node)["move"]
        alter(node, first_target)  # the same move again: nothing new, no second pause (KAFKA-16709)
        assert wait_copying(node)["move"]["id"] == first["id"]

        alter(node, second_target)
        second = wait_for(lambda: (m := wait_copying(node)["move"])["id"] != first["id"] and m, what="the new move")
        assert second["target"] == str(second_target)
        assert future_dirs(first_target) == []  # the first move's future replica is gone
        assert partition_status(node)["cleaning"]["pause_count"] == 1

        alter(node, source)  # back where it is: the running move is cancelled
        wait_for(lambda: partition_status(node)["move"]["state"] == "cancelled", what="the cancel")
        assert future_dirs(*dirs) == []
        assert_cleaning_resumes_and_log_shrinks(node)


def test_alter_back_to_current_dir_cancels(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    with node_with_dirs(tmp_path, [a, b], WEDGED) as node:
        produce_held(node)
        source = Path(node.node.log_dir.dir_of(TP))
        alter(node, b if source == a else a)
        moving = wait_copying(node)["move"]
        admin = KafkaAdminClient(bootstrap_servers=node.bootstrap)
        described = admin.describe_log_dirs()[0]["log_dirs"]
        admin.close()
        futures = [(d["log_dir"], p["is_future_key"]) for d in described for t in d["topics"] if t["name"] == "orders"
                   for p in t["partitions"]]
        assert sorted(futures) == sorted([(str(source), False), (moving["target"], True)])
        assert status(node)["log_dirs"][[str(a), str(b)].index(moving["target"])]["future_replicas"] == 1

        alter(node, source)
        wait_for(lambda: partition_status(node)["move"]["state"] == "cancelled", what="the cancel")
        assert partition_status(node)["log_dir"] == str(source) and future_dirs(a, b) == []
        assert_cleaning_resumes_and_log_shrinks(node)


def test_status_never_shows_an_ended_move_beside_the_pause_it_released(tmp_path, monkeypatch):
    """/status read while the move ends (the crash-recovery test's flake): the reader reads the partition's
    cleaning, then the move ends (pause released, state cancelled), then the reader reads the move. Moves are
    read first, so the answer is the move still copying with its pause, never an ended move still paused."""
    a, b = tmp_path / "a", tmp_path / "b"
    with node_with_dirs(tmp_path, [a, b], WEDGED) as node:
        produce_held(node)
        source = Path(node.node.log_dir.dir_of(TP))
        alter(node, b if source == a else a)
        wait_copying(node)
        moves = node.node.moves
        read_partition = metrics._partition

        # The partition's figures end with its cleaning state. Wrapping the reader's read of them, not
        # CleanerManager.state: the cleaner thread asks that too, holding the manager's lock that the ending
        # move needs to release its pause, and would wait 30 s on itself.
        def cleaning_then_the_move_ends(tp, *args, **kwargs):
            figures = read_partition(tp, *args, **kwargs)
            if tp == TP and moves.moves[TP].running:
                thread = moves.moves[TP].thread
                moves.alter(TP, str(source))  # back where it is: the move is cancelled
                thread.join(30)
            return figures
        monkeypatch.setattr(metrics, "_partition", cleaning_then_the_move_ends)
        p = partition_status(node)
        assert (p["move"]["state"], p["cleaning"]["pause_count"]) == ("copying", 1)
        monkeypatch.undo()
        p = partition_status(node)
        assert (p["move"]["state"], p["cleaning"]["pause_count"]) == ("cancelled", 0)


def test_clean_stop_mid_copy_keeps_the_move_for_the_next_start(tmp_path):
    """SIGTERM while a move sleeps in its throttle: the stop does not wait for the throttle, is clean, and keeps
    the future replica and the persisted pause; the next start (unthrottled) finishes the move."""
    a, b = tmp_path / "a", tmp_path / "b"
    node = node_with_dirs(tmp_path, [a, b], WEDGED).start()
    try:
        produce_held(node)
        source = Path(node.node.log_dir.dir_of(TP))
        target = b if source == a else a
        alter(node, target)
        move = wait_copying(node)["move"]
    finally:
        node.stop()
    assert node.node.clean_shutdown
    assert future_dirs(a, b) == [f"orders-0.{move['id']}-future"]
    assert json.loads((source / PAUSES_FILE).read_text())["pauses"] == {"orders-0": [f"move:{move['id']}"]}

    with node_with_dirs(tmp_path, [a, b], QUICK) as node:
        wait_for(lambda: (partition_status(node)["move"] or {}).get("state") == "done", what="the resumed move")
        assert partition_status(node)["move"]["id"] == move["id"] and partition_status(node)["log_dir"] == str(target)
        assert future_dirs(a, b) == []
        assert_cleaning_resumes_and_log_shrinks(node)


def test_topic_deleted_mid_move_releases_the_pause(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    with node_with_dirs(tmp_path, [a, b], WEDGED) as node:
        produce_held(node)
        source = Path(node.node.log_dir.dir_of(TP))
        alter(node, b if source == a else a)
        move = wait_copying(node)["move"]
        assert json.loads((source / PAUSES_FILE).read_text())["pauses"] == {"orders-0": [f"move:{move['id']}"]}

        (tmp_path / "topics" / "orders.yaml").unlink()
        wait_for(lambda: TP not in node.node.log_dir.logs and node.node.moves.moves[TP].state == "cancelled",
                 what="the topic's deletion to end the move")
        assert node.node.moves.moves[TP].reason == "its topic was deleted"
        wait_for(lambda: future_dirs(a, b) == [], what="the future replica to go")
        assert json.loads((source / PAUSES_FILE).read_text())["pauses"] == {}
        assert TP not in node.node.maintenance.manager.owners()
        metrics = urllib.request.urlopen(f"http://127.0.0.1:{node.node.http_port}/metrics", timeout=10).read().decode()
        assert 'shale_cleaning_pauses{kind="move"} 0.0' in metrics


def test_target_dir_failure_fails_the_move_and_resumes_cleaning(tmp_path):
    """The target volume fills up mid-copy (ENOSPC): the move fails with the reason, its partial copy goes."""
    with small_fs(tmp_path / "small", "tmpfs", 512) as small:
        big = tmp_path / "big"
        with node_with_dirs(tmp_path, [big, small], QUICK) as node:
            if node.node.log_dir.dir_of(TP) != str(big):
                pytest.fail("orders-0 was expected in the first dir (fewest partitions, ties to the first)")
            node.node.maintenance.pause(TP, "http:test")  # keep the log large until the move has failed
            produce_duplicates(node.bootstrap, 3000)  # ~3 MB, far more than the target's 512 KiB
            alter(node, small)
            wait_for(lambda: partition_status(node)["move"]["state"] == "failed", what="the move to fail")
            move = partition_status(node)["move"]
            assert "No space left on device" in move["reason"] and move["target"] == str(small)
            assert future_dirs(small) == [] and partition_status(node)["log_dir"] == str(big)
            assert partition_status(node)["cleaning"]["pause_owners"] == ["http:test"]  # the move's pause is gone
            node.node.maintenance.resume(TP, "http:test")
            assert_cleaning_resumes_and_log_shrinks(node)


CRASHING_MOVE = textwrap.dedent("""
    import os, sys
    from shale.sidecar.log.checkpoint import TopicPartition
    from shale.sidecar.log.future_replica import drop_swapped_out, swap_in, swap_out
    from shale.sidecar.log.log_dirs import LogDirs
    from shale.sidecar.topic_config import TopicConfig

    crash_at, source, target = sys.argv[1], sys.argv[2], sys.argv[3]
    tp = TopicPartition("orders", 0)
    dirs = LogDirs([source, target], lambda topic: TopicConfig.from_mapping({}))
    move_id = "0123456789abcdef0123456789abcdef"
    copy = dirs.add_future(tp, move_id, dirs.by_path(target))
    while copy.plan(dirs.logs[tp])[1]:
        copy.step(dirs.logs[tp])
    if crash_at == "mid-copy":
        os._exit(9)
    dirs.logs[tp].close()
    copy.finish()
    swap_out(source, tp, move_id)
    if crash_at == "after-swap-out":
        os._exit(9)
    swap_in(target, tp, move_id)
    os._exit(9)  # after-swap-in: the old copy is still there as the swap-out
""")


@pytest.mark.parametrize("crash_at", ["mid-copy", "after-swap-out", "after-swap-in"])
def test_crash_between_swap_steps_recovers(tmp_path, crash_at):
    """A process killed at each point of the move (os._exit, nothing flushed or closed after it); a real
    `shale serve` then starts on the dirs: the partition is whole, in one dir, byte for byte, no move dir left."""
    a, b = tmp_path / "a", tmp_path / "b"
    with node_with_dirs(tmp_path, [a, b], QUICK) as node:
        produce_duplicates(node.bootstrap, 800)
        source = Path(node.node.log_dir.dir_of(TP))
    target = b if source == a else a
    before = [raw for raw, _ in raw_batches(source, "orders", 0)]
    assert len(before) > 0
    done = subprocess.run([sys.executable, "-c", CRASHING_MOVE, crash_at, str(source), str(target)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 9, done.stderr
    assert future_dirs(a, b), "the crash left no move directory behind: it happened at the wrong point"

    with ServeProcess(a, tmp_path / "topics", "--data-dir", str(b), "--override", "offsets.topic.num.partitions=2",
                      "--override", "log.cleaner.enable=false") as serve:  # no compaction to change the bytes after
        def settled():
            with urllib.request.urlopen(f"http://127.0.0.1:{serve.http_port}/status", timeout=10) as r:
                parts = json.loads(r.read())["topics"]["orders"]["partitions"]
            if not parts:  # declared topics are listed with the partitions loaded so far: none yet
                return None
            p = parts[0]
            return p if (p["move"] is None or p["move"]["state"] == "done") and not future_dirs(a, b) else None
        p = wait_for(settled, timeout=60, what="the move to be recovered")
        # Mid-copy the move resumes and completes; after the first rename it is finished at load.
        assert p["log_dir"] == str(target), serve.log()
        assert p["cleaning"]["pause_count"] == 0 and p["log_end_offset"] == 800
        assert [raw for raw, _ in raw_batches(target, "orders", 0)] == before
        assert not (source / "orders-0").exists()


@pytest.mark.parametrize("replicated", [True, False])
def test_swap_serves_the_moved_log_as_replicated_as_before(tmp_path, replicated):
    """A replicated log keeps lagging its end by its high watermark after the swap: a leader's `acks=all` waits
    for its followers on the moved log too (the swapped-in log once read its high watermark as its log end, and
    answered every parked `acks=all` produce at once)."""
    from shale.sidecar.log.log_dirs import LogDirs
    from shale.sidecar.log.records import Record, encode_batch
    from shale.sidecar.topic_config import TopicConfig

    source, target = tmp_path / "a", tmp_path / "b"
    dirs = LogDirs([str(source), str(target)], lambda topic: TopicConfig.from_mapping({}))
    tp = TopicPartition("orders", 0)
    log = dirs.get_or_create(tp)
    log.replicated = replicated
    for i in range(5):
        log.append(encode_batch([Record(offset=i, timestamp=1_000 + i, key=b"k%d" % i, value=b"v")]))
    if replicated:
        log.update_high_watermark(3)  # the followers have the first three records
    home = Path(dirs.dir_of(tp))
    move_id = "0123456789abcdef0123456789abcdef"
    copy = dirs.add_future(tp, move_id, dirs.by_path(str(target if home == source else source)))
    while copy.plan(dirs.logs[tp])[1]:
        copy.step(dirs.logs[tp])
    moved = dirs.swap(tp, move_id, copy)
    assert (moved.replicated, moved.log_end_offset) == (replicated, 5)
    assert moved.high_watermark == (3 if replicated else 5)
    assert not moved.update_high_watermark(2) and moved.high_watermark == (3 if replicated else 5)
    dirs.close()
