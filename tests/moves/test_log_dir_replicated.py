"""Log-dir moves of replicated partitions (docs/moves.md, section 3) on real `shale serve` processes with two log
dirs each, sharing a real etcd, with a real producer writing `acks=all` throughout: AlterReplicaLogDirs on the
leader (it keeps serving, the high watermark keeps moving), on a follower SIGKILLed mid-copy and restarted (its
move resumes, and after the swap it fetches into the moved log), on the leader again SIGKILLed mid-copy
(another node leads; restarted, it completes the move as a follower). Then every acknowledged record is at its
offset, the replicas are byte-identical below the high watermark, and no partition is paused on any node.
Also AlterReplicaLogDirs' per-partition errors, as Kafka's ReplicaManager.alterReplicaLogDirs answers them."""

from __future__ import annotations

import json
import os
import urllib.request
from pathlib import Path

from kafka.protocol.admin import AlterReplicaLogDirsRequest, AlterReplicaLogDirsResponse

from shale.sidecar.protocol.error_codes import (
    INVALID_TOPIC_EXCEPTION,
    KAFKA_STORAGE_ERROR,
    LOG_DIR_NOT_FOUND,
    NONE,
    REPLICA_NOT_AVAILABLE,
)
from support.clients_util import build, call
from support.fault_util import AckedLoad, preload
from support.node_util import (
    ReplicatedCluster,
    ServeProcess,
    start_replicated_cluster,
    topic_manifest,
    wait_for,
    write_manifests,
)

TOPIC = "jbod"
THROTTLED = ("--override", "replica.alter.log.dirs.io.max.bytes.per.second=300000")  # a copy takes seconds


def second_dir(server: ServeProcess) -> list[str]:
    data = Path(server.data_dir)
    return ["--data-dir", str(data.with_name(data.name + "b"))]


def status(server: ServeProcess) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{server.http_port}/status", timeout=10) as r:
        return json.loads(r.read())


def jbod_0(server: ServeProcess) -> dict:
    return status(server)["topics"][TOPIC]["partitions"][0]


def alter(port: int, dirs: dict[str, dict[str, list[int]]]) -> dict[tuple[str, int], int]:
    """AlterReplicaLogDirs {path: {topic: [partitions]}} on one node: {(topic, partition): error code}."""
    request = build(AlterReplicaLogDirsRequest, {"dirs": [
        {"path": path, "topics": [{"name": t, "partitions": ps} for t, ps in topics.items()]}
        for path, topics in dirs.items()]}, 1)
    resp = call(port, request, AlterReplicaLogDirsResponse, timeout=15)
    return {(t.topic_name, p.partition_index): p.error_code for t in resp.results for p in t.partitions}


def move_to_other_dir(cluster: ReplicatedCluster, node_id: int) -> Path:
    """AlterReplicaLogDirs of jbod-0 on `node_id` to its other log dir, accepted; returns that dir."""
    source = Path(jbod_0(cluster.servers[node_id])["log_dir"])
    target = Path(second_dir(cluster.servers[node_id])[1]) if source == cluster.data_dir(node_id) \
        else cluster.data_dir(node_id)
    assert alter(cluster.servers[node_id].port, {str(target): {TOPIC: [0]}}) == {(TOPIC, 0): NONE}
    return target


def moved(server: ServeProcess, target: Path, timeout: float = 90.0) -> dict:
    """Until the node's move of jbod-0 is done and its log is in `target`."""
    return wait_for(lambda: (p := jbod_0(server))["move"] and p["move"]["state"] == "done"
                    and p["log_dir"] == str(target) and p, timeout, interval=0.2, what=f"the move to {target}")


def no_pause_anywhere(cluster: ReplicatedCluster) -> None:
    for n, server in cluster.servers.items():
        for topic, t in status(server)["topics"].items():
            for p in t["partitions"]:
                assert p["cleaning"]["pause_owners"] == [], (n, topic, p)


def test_replicated_partition_moves_between_log_dirs_under_load(tmp_path, etcd):
    cluster = start_replicated_cluster(tmp_path, etcd, 3, topic_manifest(TOPIC, 1, {"segment.bytes": "131072"},
                                                                        replicas=3),
                                       extra=THROTTLED, node_args=second_dir)
    load = AckedLoad("confluent", cluster.bootstrap, TOPIC)
    try:
        preload(cluster.bootstrap, TOPIC)
        state = cluster.wait_for_isr(TOPIC, 0)
        leader, follower = state.leader, next(n for n in state.replicas if n != state.leader)
        load.start()
        load.wait_for_acks(50)

        # On the leader: it keeps leading and acknowledging throughout, and after the swap from the moved log.
        target = move_to_other_dir(cluster, leader)
        wait_for(lambda: jbod_0(cluster.servers[leader])["move"]["bytes_copied"] > 0, what="the leader's copy")
        moved(cluster.servers[leader], target)
        assert cluster.wait_for_leader(TOPIC, 0).leader == leader
        hw = cluster.high_watermark(TOPIC, 0)
        load.wait_for_acks(len(load.acked) + 200)
        wait_for(lambda: cluster.high_watermark(TOPIC, 0) > hw, what="the high watermark to move after the swap")

        # On a follower: SIGKILLed mid-copy, restarted; the move resumes, and it follows into the moved log.
        target = move_to_other_dir(cluster, follower)
        wait_for(lambda: (m := jbod_0(cluster.servers[follower])["move"])["state"] == "copying"
                 and m["bytes_copied"] > 0, what="the follower's copy")
        cluster.kill(follower)
        assert [n for n in os.listdir(target) if n.endswith("-future")], "the kill came after the copy"
        cluster.restart(follower)
        moved(cluster.servers[follower], target)
        load.wait_for_acks(len(load.acked) + 200)
        cluster.wait_for_isr(TOPIC, 0)

        # The leader again, back to its first dir, SIGKILLed mid-copy: another node leads meanwhile; restarted,
        # it finishes its move as a follower and catches up into the moved log.
        epoch = cluster.wait_for_leader(TOPIC, 0).leader_epoch
        back = move_to_other_dir(cluster, leader)
        wait_for(lambda: (m := jbod_0(cluster.servers[leader])["move"])["state"] == "copying"
                 and m["bytes_copied"] > 0, what="the leader's second copy")
        cluster.kill(leader)
        cluster.wait_for_leader(TOPIC, 0, excluding=(leader,), newer_than=epoch)
        cluster.restart(leader)
        moved(cluster.servers[leader], back)
        acked = len(load.acked)
        load.wait_for_acks(acked + 200)
        cluster.wait_for_isr(TOPIC, 0)

        acks, hw = load.finish(cluster)  # every ack at its offset, replicas identical below the HW
        assert len(acks) > acked
        # The bytes load.finish compared came from the moved logs.
        assert (cluster.log_dir_of(follower, TOPIC, 0), cluster.log_dir_of(leader, TOPIC, 0)) == (target, back)
        for n in (leader, follower):  # one copy per node, where /status says: no future or swapped-out dir left
            homes = [d for d in (cluster.data_dir(n), Path(second_dir(cluster.servers[n])[1]))
                     if any(name.startswith(f"{TOPIC}-0") for name in os.listdir(d))]
            assert homes == [Path(jbod_0(cluster.servers[n])["log_dir"])], (n, homes)
        no_pause_anywhere(cluster)
    finally:
        load.close()
        cluster.stop()


def test_alter_replica_log_dirs_answers_kafkas_errors(tmp_path):
    topics = tmp_path / "topics"
    write_manifests(topics / "t.yaml", topic_manifest("plain", 1))
    a, b = tmp_path / "a", tmp_path / "b"
    with ServeProcess(a, topics, "--data-dir", str(b)) as node:
        home = Path(wait_for(lambda: status(node)["topics"].get("plain") and
                             status(node)["topics"]["plain"]["partitions"][0]["log_dir"], what="plain-0"))
        other = b if home == a else a
        answers = alter(node.port, {
            str(tmp_path / "elsewhere"): {"plain": [0]},  # not a log dir of the node
            "b": {"plain": [0]},  # a log dir, but not as an absolute path (Kafka compares absolute paths)
            str(other): {"plain": [1], "absent": [0], "x" * 249: [0]},
        })
        assert answers == {
            ("plain", 0): LOG_DIR_NOT_FOUND, ("plain", 1): REPLICA_NOT_AVAILABLE, ("absent", 0): REPLICA_NOT_AVAILABLE,
            ("x" * 249, 0): INVALID_TOPIC_EXCEPTION}  # its future directory name would pass 255 bytes
        assert status(node)["topics"]["plain"]["partitions"][0]["move"] is None  # nothing started

        other.rename(other.with_name("gone"))  # the volume is gone: Kafka's offline log dir
        try:
            assert alter(node.port, {str(other): {"plain": [0]}}) == {("plain", 0): KAFKA_STORAGE_ERROR}
            assert status(node)["topics"]["plain"]["partitions"][0]["move"] is None
        finally:
            other.with_name("gone").rename(other)
        assert alter(node.port, {str(other): {"plain": [0]}}) == {("plain", 0): NONE}
        wait_for(lambda: status(node)["topics"]["plain"]["partitions"][0]["log_dir"] == str(other),
                 what="the move once the dir is back")
