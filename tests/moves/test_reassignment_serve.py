"""Reassignment between nodes (docs/moves.md, "Reassignment between nodes") on real `shale serve` processes sharing
a real etcd, with real producers writing `acks=all` throughout: a manifest's changed assignment moves every
partition off node 0; AlterPartitionReassignments / ListPartitionReassignments with Kafka's errors, cancel
included; the source and the target SIGKILLed mid-move (a move is held mid-way by freezing the new replica's
fetches at the leader's fault proxy). After each: every acknowledged record at its offset, the replicas
byte-identical below the high watermark (`fault_util.check_acknowledged`), the removed replicas' logs deleted,
no cleaning pause left anywhere."""

from __future__ import annotations

import re
import urllib.request

from kafka import KafkaAdminClient
from kafka.admin import NewTopic
from kafka.protocol.admin.topics import (
    AlterPartitionReassignmentsRequest,
    AlterPartitionReassignmentsResponse,
    ListPartitionReassignmentsRequest,
    ListPartitionReassignmentsResponse,
)

from shale.sidecar.protocol.error_codes import (
    INVALID_REPLICA_ASSIGNMENT,
    INVALID_REPLICATION_FACTOR,
    NO_REASSIGNMENT_IN_PROGRESS,
    NONE,
    POLICY_VIOLATION,
    UNKNOWN_TOPIC_OR_PARTITION,
)
from support.clients_util import build, call, partition_dir, stored_records
from support.fault_proxy import FREEZE
from support.fault_util import AckedLoad, check_acknowledged
from support.node_util import (
    NodeThread,
    ReplicatedCluster,
    start_replicated_cluster,
    topic_manifest,
    wait_for,
    write_manifests,
)


def alter(cluster: ReplicatedCluster, via: int, moves: dict[tuple[str, int], list[int] | None], *,
          version: int = 0, allow_rf_change: bool = True) -> dict[tuple[str, int], tuple[int, str | None]]:
    """AlterPartitionReassignments through node `via`: {(topic, partition): (error code, message)}."""
    topics: dict[str, list] = {}
    for (topic, partition), replicas in moves.items():
        topics.setdefault(topic, []).append({"partition_index": partition, "replicas": replicas})
    values = {"timeout_ms": 30000, "topics": [{"name": t, "partitions": ps} for t, ps in topics.items()]}
    if version >= 1:
        values["allow_replication_factor_change"] = allow_rf_change
    resp = call(cluster.servers[via].port, build(AlterPartitionReassignmentsRequest, values, version),
                AlterPartitionReassignmentsResponse, timeout=40)
    assert resp.error_code == NONE, resp
    return {(t.name, p.partition_index): (p.error_code, p.error_message) for t in resp.responses for p in t.partitions}


def listed(cluster: ReplicatedCluster, via: int) -> dict[tuple[str, int], tuple[list, list, list]]:
    """ListPartitionReassignments (all topics) through node `via`: {(topic, partition): (replicas, adding,
    removing)}."""
    resp = call(cluster.servers[via].port, build(ListPartitionReassignmentsRequest, {"timeout_ms": 10000,
                                                                                     "topics": None}, 0),
                ListPartitionReassignmentsResponse, timeout=15)
    assert resp.error_code == NONE, resp
    return {(t.name, p.partition_index): (list(p.replicas), list(p.adding_replicas), list(p.removing_replicas))
            for t in resp.topics for p in t.partitions}


def wait_moved(cluster: ReplicatedCluster, topic: str, partition: int, target: tuple[int, ...],
               timeout: float = 90.0) -> None:
    """Until every running node shows `target` as the replicas, all in sync, and no move in progress."""
    def done() -> bool:
        state = cluster.wait_for_leader(topic, partition, timeout=timeout)
        return (state.replicas == target and set(state.isr) == set(target)
                and (topic, partition) not in listed(cluster, state.leader))

    wait_for(done, timeout, interval=0.3, what=f"{topic}-{partition} to move to {list(target)}")


def wait_log_deleted(cluster: ReplicatedCluster, node: int, topic: str, partition: int) -> None:
    wait_for(lambda: not partition_dir(cluster.data_dir(node), topic, partition).exists(), 60,
             what=f"node {node} to delete its replica of {topic}-{partition}")


PAUSES = re.compile(r'^shale_cleaning_pause_count\{([^}]*)\} (\S+)$', re.M)


def assert_no_pauses(cluster: ReplicatedCluster) -> None:
    """No partition's cleaning is paused on any running node (`/metrics`)."""
    for server in cluster.running():
        with urllib.request.urlopen(f"http://127.0.0.1:{server.http_port}/metrics", timeout=10) as response:
            text = response.read().decode()
        paused = [labels for labels, value in PAUSES.findall(text) if float(value) > 0]
        assert not paused, f"node {server.node_id}: cleaning paused for {paused}"


def test_a_changed_manifest_moves_every_partition_from_node_0_to_nodes_1_and_2_under_load(tmp_path, etcd):
    cluster = start_replicated_cluster(tmp_path, etcd, 3, topic_manifest("moved", 2, assignment={"partitions": [0, 0]}))
    load = AckedLoad("confluent", cluster.bootstrap, "moved", partitions=2)
    try:
        load.start().wait_for_acks(200)
        # The operator's path: the manifest's assignment is rewritten; partitions may name different counts.
        write_manifests(cluster.topics_dir / "topics.yaml",
                        topic_manifest("moved", 2, assignment={"partitions": [[1, 2], [2, 1]]}))
        wait_moved(cluster, "moved", 0, (1, 2))
        wait_moved(cluster, "moved", 1, (2, 1))
        load.wait_for_acks(len(load.acked) + 200)
        acked = load.stop()
        assert load.failed == [], load.failed[:3]
        assert {p for p, _, _ in acked} == {0, 1}
        for p in (0, 1):
            check_acknowledged(cluster, "moved", p, acked)
            wait_log_deleted(cluster, 0, "moved", p)
        # The leader was on node 0, which the move removed: the leadership went to a target replica.
        assert {cluster.wait_for_leader("moved", p).leader for p in (0, 1)} <= {1, 2}
        # A topic whose manifest names its replicas is moved by its manifest, not over the wire.
        assert alter(cluster, 1, {("moved", 0): [0]})[("moved", 0)][0] == POLICY_VIOLATION
        assert_no_pauses(cluster)
    finally:
        load.close()
        cluster.stop()


def test_alter_and_list_partition_reassignments_with_kafkas_errors_and_cancel(tmp_path, etcd):
    cluster = start_replicated_cluster(tmp_path, etcd, 3, topic_manifest("plain", 1, replicas=1),
                                       extra=("--override", "replica.lag.time.max.ms=3000"), proxies=True)
    admin = KafkaAdminClient(bootstrap_servers=cluster.bootstrap.split(","))
    load = AckedLoad("kafka-python", cluster.bootstrap, "api")
    try:
        admin.create_topics([NewTopic("api", -1, replica_assignments={0: [0]})])
        cluster.wait_for_leader("api", 0)
        load.start().wait_for_acks(100)
        # Node 2's fetches from the leader (node 0) are frozen: the move stays in progress until healed.
        cluster.proxies[0].cut_replica(2, FREEZE)
        assert alter(cluster, 1, {("api", 0): [1, 2]}) == {("api", 0): (NONE, None)}
        wait_for(lambda: listed(cluster, 2).get(("api", 0)) == ([1, 2, 0], [1, 2], [0]), 30,
                 what="the move listed by every node")
        assert listed(cluster, 0) == listed(cluster, 1) == {("api", 0): ([1, 2, 0], [1, 2], [0])}

        errors = alter(cluster, 0, {("api", 0): [1, 1], ("api", 7): [1], ("nope", 0): [1]})
        assert errors[("api", 0)][0] == INVALID_REPLICA_ASSIGNMENT and "twice" in errors[("api", 0)][1]
        assert errors[("api", 7)][0] == errors[("nope", 0)][0] == UNKNOWN_TOPIC_OR_PARTITION
        (code, message), = alter(cluster, 0, {("api", 0): [1, 9]}).values()
        assert code == INVALID_REPLICA_ASSIGNMENT and "[9]" in message
        (code, message), = alter(cluster, 0, {("api", 0): [1, 2, 0]}, version=1, allow_rf_change=False).values()
        assert code == INVALID_REPLICATION_FACTOR and "from 2 to 3" in message

        # Cancel: back to node 0 alone, nothing listed; a second cancel finds nothing to cancel.
        assert alter(cluster, 2, {("api", 0): None}) == {("api", 0): (NONE, None)}
        assert listed(cluster, 1) == {}
        wait_moved(cluster, "api", 0, (0,))
        for node in (1, 2):
            wait_log_deleted(cluster, node, "api", 0)
        assert alter(cluster, 2, {("api", 0): None})[("api", 0)][0] == NO_REASSIGNMENT_IN_PROGRESS

        # Again, and let it finish this time.
        assert alter(cluster, 0, {("api", 0): [2, 1]}) == {("api", 0): (NONE, None)}
        assert ("api", 0) in listed(cluster, 0)
        cluster.proxies[0].heal()
        wait_moved(cluster, "api", 0, (2, 1))
        load.wait_for_acks(len(load.acked) + 100)
        acked = load.stop()
        assert load.failed == [], load.failed[:3]
        check_acknowledged(cluster, "api", 0, acked)
        wait_log_deleted(cluster, 0, "api", 0)
        # The topic record was rewritten with the move (it declares the API's topics): no node moves it back.
        assert listed(cluster, 1) == {} and cluster.metadata("api")[0].replicas == (2, 1)

        # A manifest with `spec.replicas` alone places nothing itself: the partition record moves directly.
        (source,) = cluster.metadata("plain")[0].replicas
        target = tuple(n for n in range(3) if n != source)
        assert alter(cluster, source, {("plain", 0): list(target)}) == {("plain", 0): (NONE, None)}
        wait_moved(cluster, "plain", 0, target)
        wait_log_deleted(cluster, source, "plain", 0)
        assert_no_pauses(cluster)
    finally:
        load.close()
        admin.close()
        cluster.stop()


def test_the_source_killed_mid_move_and_restarted_deletes_its_replica(tmp_path, etcd):
    cluster = start_replicated_cluster(tmp_path, etcd, 3, topic_manifest("m", 1, assignment={"partitions": [[0, 1]]}),
                                       proxies=True)
    load = AckedLoad("confluent", cluster.bootstrap, "m")
    try:
        load.start().wait_for_acks(100)
        assert cluster.wait_for_isr("m", 0).leader == 0
        cluster.proxies[0].cut_replica(2, FREEZE)  # held mid-move while node 0 leads
        write_manifests(cluster.topics_dir / "topics.yaml", topic_manifest("m", 1, assignment={"partitions": [[1, 2]]}))
        wait_for(lambda: listed(cluster, 1).get(("m", 0)) == ([1, 2, 0], [2], [0]), 30, what="the move to start")
        load.wait_for_acks(len(load.acked) + 100)
        cluster.kill(0)  # the source, and the leader
        wait_moved(cluster, "m", 0, (1, 2))  # node 1 leads, node 2 catches up from it, node 1 completes
        cluster.restart(0)
        wait_log_deleted(cluster, 0, "m", 0)  # moved while it was away: deleted at its first view
        load.wait_for_acks(len(load.acked) + 100)
        acked = load.stop()
        assert load.failed == [], load.failed[:3]
        check_acknowledged(cluster, "m", 0, acked)
        assert "moved while this node was away" in cluster.servers[0].log()
        assert_no_pauses(cluster)
    finally:
        load.close()
        cluster.stop()


def test_the_target_killed_mid_move_and_restarted_completes_the_move(tmp_path, etcd):
    cluster = start_replicated_cluster(tmp_path, etcd, 3, topic_manifest("m", 1, assignment={"partitions": [[0, 1]]}),
                                       proxies=True)
    load = AckedLoad("kafka-python", cluster.bootstrap, "m")
    try:
        load.start().wait_for_acks(100)
        assert cluster.wait_for_isr("m", 0).leader == 0
        cluster.proxies[0].cut_replica(2, FREEZE)
        write_manifests(cluster.topics_dir / "topics.yaml", topic_manifest("m", 1, assignment={"partitions": [[1, 2]]}))
        wait_for(lambda: listed(cluster, 0).get(("m", 0)) == ([1, 2, 0], [2], [0]), 30, what="the move to start")
        cluster.kill(2)  # the target, mid-move
        load.wait_for_acks(len(load.acked) + 100)
        assert listed(cluster, 0).get(("m", 0)) == ([1, 2, 0], [2], [0])  # still waiting for node 2
        cluster.proxies[0].heal()
        cluster.restart(2)
        wait_moved(cluster, "m", 0, (1, 2))
        wait_log_deleted(cluster, 0, "m", 0)
        load.wait_for_acks(len(load.acked) + 100)
        acked = load.stop()
        assert load.failed == [], load.failed[:3]
        check_acknowledged(cluster, "m", 0, acked)
        assert cluster.wait_for_leader("m", 0).leader == 1  # the removed leader handed over to the target
        assert_no_pauses(cluster)
    finally:
        load.close()
        cluster.stop()


def test_a_node_without_a_store_moves_nothing_and_lists_nothing(tmp_path):
    write_manifests(tmp_path / "topics" / "t.yaml", topic_manifest("solo", 1))
    with NodeThread(tmp_path / "data", tmp_path / "topics") as node:
        port = node.node.broker.port
        resp = call(port, build(AlterPartitionReassignmentsRequest, {"timeout_ms": 1000, "topics": [
            {"name": "solo", "partitions": [{"partition_index": 0, "replicas": [1]}]}]}, 0),
            AlterPartitionReassignmentsResponse)
        (part,) = resp.responses[0].partitions
        assert part.error_code == INVALID_REPLICA_ASSIGNMENT and "no control store" in part.error_message
        listed_here = call(port, build(ListPartitionReassignmentsRequest, {"timeout_ms": 1000, "topics": None}, 0),
                           ListPartitionReassignmentsResponse)
        assert (listed_here.error_code, listed_here.topics) == (NONE, [])
        assert stored_records(tmp_path / "data", "solo", 0) == []  # nothing moved, nothing written
