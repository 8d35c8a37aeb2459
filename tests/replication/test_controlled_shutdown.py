"""Controlled shutdown (docs/day-2-operations.md, section 2) on real `shale serve` processes sharing an etcd: a
SIGTERMed leader hands its partition over while it still serves, under an idempotent `acks=all` load, and the
same SIGTERM with `controlled.shutdown.enable=false` for comparison. The longest time no node's Metadata says
it leads the partition is printed for both; only what must hold is asserted."""

from __future__ import annotations

import threading
import time

from support.fault_util import AckedLoad, check_acknowledged
from support.node_util import ReplicatedCluster, start_replicated_cluster, topic_manifest, wait_for

TOPIC = "stopping"


class LeaderlessPoller:
    """Asks every node's Metadata, every few milliseconds, whether it leads partition 0: a round in which none
    answers that it does is leaderless (a client could write nowhere). `stop()` returns the longest leaderless
    stretch, in seconds."""

    def __init__(self, cluster: ReplicatedCluster) -> None:
        self.cluster = cluster
        self.longest = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="leaderless-poller", daemon=True)

    def start(self) -> "LeaderlessPoller":
        self._thread.start()
        return self

    def stop(self) -> float:
        self._stop.set()
        self._thread.join(30)
        return self.longest

    def _leads(self, node: int) -> bool:
        try:
            return self.cluster.metadata(TOPIC, via=node)[0].leader == node
        except (AssertionError, OSError):  # stopped: it leads nothing
            return False

    def _run(self) -> None:
        since: float | None = None
        while not self._stop.is_set():
            now = time.monotonic()
            if any(self._leads(n) for n in self.cluster.servers):
                since = None
            else:
                since = now if since is None else since
                self.longest = max(self.longest, time.monotonic() - since)
            time.sleep(0.005)


def _sigterm_the_leader(cluster: ReplicatedCluster, load: AckedLoad) -> float:
    """SIGTERM node 0 while it leads under load; the longest leaderless time the survivors showed."""
    before = cluster.wait_for_leader(TOPIC, 0)
    assert before.leader == 0
    load.wait_for_acks(len(load.acked) + 50)
    poller = LeaderlessPoller(cluster).start()
    try:
        assert cluster.servers[0].terminate(60) == 0
        cluster.wait_for_leader(TOPIC, 0, excluding=(0,), newer_than=before.leader_epoch)
        load.wait_for_acks(len(load.acked) + 50)  # acknowledged by the new leader
    finally:
        longest = poller.stop()
    return longest


def test_a_sigtermed_leader_hands_its_partition_over_and_nothing_acknowledged_is_lost(tmp_path, etcd):
    cluster = start_replicated_cluster(tmp_path, etcd, 3, topic_manifest(
        TOPIC, 1, {"min.insync.replicas": 2}, assignment={"partitions": [[0, 1, 2]]}),
        extra=("--override", "leader.imbalance.check.interval.seconds=1"))
    load = AckedLoad("confluent", cluster.bootstrap, TOPIC)
    node0 = cluster.servers[0]
    try:
        load.start()
        controlled = _sigterm_the_leader(cluster, load)
        stopped_log = node0.log()
        assert "registered as shutting down" in stopped_log
        assert f"{TOPIC}-0: stopping leader 0 moves the leadership to node 1" in stopped_log
        assert f"node 0: {TOPIC}-0: leader 0 -> 1 in leader epoch" in stopped_log  # written by node 0, still alive
        assert "no leadership left to move" in stopped_log

        # Again without controlled shutdown: node 0 is back (the preferred leader gets its partition back).
        node0.args += ["--override", "controlled.shutdown.enable=false"]
        cluster.restart(0)
        wait_for(lambda: (m := cluster.metadata(TOPIC)[0]).leader == 0 and set(m.isr) == {0, 1, 2}, 60,
                 interval=0.2, what="node 0 to lead its preferred partition again, every replica in sync")
        uncontrolled = _sigterm_the_leader(cluster, load)
        assert "moves the leadership" not in node0.log()[len(stopped_log):]

        print(f"\nlongest leaderless time after SIGTERM to the leader: {controlled * 1000:.0f} ms with controlled "
              f"shutdown, {uncontrolled * 1000:.0f} ms without")
        cluster.restart(0)
        acked = load.stop()
        assert load.failed == [], load.failed[:3]  # the producer was told of no error: only retriable ones
        check_acknowledged(cluster, TOPIC, 0, acked)
    finally:
        load.close()
        cluster.stop()
