"""Replication throttles with Kafka's names (sidecar/replication/throttle.py): the rate over windows and which
replicas a `*.replication.throttled.replicas` value names, pure; then a real move under `acks=all` load with
both throttles set low (the leader's on its command line, the new follower's live through kafka-python's
admin client, as kafka-reassign-partitions --throttle sets it): the throttle is in force while the new replica
copies, in-sync replication (and so the producers' acknowledgements) goes on meanwhile, the move completes,
nothing acknowledged is lost, and /status and /metrics show the move, its bytes and the throttle."""

from __future__ import annotations

import json
import os
import re
import urllib.request

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry
from confluent_kafka.admin import ConfigResource as ConfluentResource
from confluent_kafka.admin import ResourceType as ConfluentResourceType
from hypothesis import given
from hypothesis import strategies as st
from kafka import KafkaAdminClient
from kafka.admin import ConfigResource, ConfigResourceType

from shale.sidecar.replication.throttle import ReplicationQuota, names_replica
from shale.sidecar.server.ops.dynamic_broker_configs import FILE
from shale.sidecar.topic_config import LONG_MAX
from support.fault_util import AckedLoad, check_acknowledged
from support.node_util import start_replicated_cluster, topic_manifest, wait_for, write_manifests


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_the_quota_lets_a_first_burst_of_all_windows_but_one_through_then_holds_to_the_rate():
    clock = Clock()
    quota = ReplicationQuota(rate=1000, window_num=11, window_s=1.0, clock=clock)
    quota.record(10_000)  # 10 windows' worth at once: exactly the rate over the minimum elapsed time
    assert not quota.exceeded()
    quota.record(1)
    assert quota.exceeded()
    clock.now += 10.5  # time passes, nothing moves: below the rate again
    assert not quota.exceeded() and quota.recorded_bytes == 10_001
    clock.now += 11.0  # every window expired
    assert quota.measured() == 0.0


def test_no_throttle_is_never_exceeded():
    quota = ReplicationQuota(clock=Clock())
    quota.record(10**12)
    assert not quota.enabled and not quota.exceeded() and quota.rate == LONG_MAX


@given(st.lists(st.tuples(st.integers(0, 20), st.integers(0, 5)), max_size=6), st.integers(0, 20), st.integers(0, 5))
def test_throttled_replicas_name_partition_node_pairs_or_all(pairs, partition, node):
    value = tuple(f"{p}:{n}" for p, n in pairs)
    assert names_replica(value, partition, node) == ((partition, node) in pairs)
    assert names_replica(("*",), partition, node)
    assert not names_replica((), partition, node)


def metric(port: int, name: str, labels: str) -> float | None:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    selector = re.escape(name) + (rf"\{{{re.escape(labels)}\}}" if labels else "")
    found = re.search(rf"^{selector} (\S+)$", text, re.M)
    return None if found is None else float(found.group(1))


def status(port: int) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/status", timeout=10) as response:
        return json.loads(response.read())


RATE = 200_000  # bytes per second: with 11 one-second windows, a first 2 MB pass at once, the rest at this rate
THROTTLES = ("--override", f"leader.replication.throttled.rate={RATE}")
FOLLOWER_RATE = "follower.replication.throttled.rate"
THROTTLED = {"leader.replication.throttled.replicas": "*", "follower.replication.throttled.replicas": "*"}


def test_a_throttled_move_does_not_hold_back_in_sync_replication(tmp_path, etcd):
    cluster = start_replicated_cluster(tmp_path, etcd, 3, topic_manifest(
        "big", 1, assignment={"partitions": [[0, 1]]}, config=THROTTLED), extra=THROTTLES)
    load = AckedLoad("confluent", cluster.bootstrap, "big")
    admin = KafkaAdminClient(bootstrap_servers=cluster.bootstrap.split(","))
    node2 = ConfigResource(ConfigResourceType.BROKER, "2")
    try:
        # The new replica's node gets its follower throttle live (Kafka's per-broker dynamic config).
        admin.alter_configs([ConfigResource(ConfigResourceType.BROKER, "2", configs={FOLLOWER_RATE: str(RATE)})])
        described = admin.describe_configs([node2], config_filter="all")
        assert described["broker"]["2"][FOLLOWER_RATE]["value"] == str(RATE)
        assert described["broker"]["2"][FOLLOWER_RATE]["config_source"] == "DYNAMIC_BROKER_CONFIG"
        assert metric(cluster.servers[2].http_port, "shale_replication_throttled_rate_bytes", 'side="follower"') == RATE
        producer = Producer({"bootstrap.servers": cluster.bootstrap, "acks": "all", "linger.ms": 20,
                             "compression.type": "none"})
        for _ in range(4000):  # 4 MB the new replica must copy: twice the first burst the throttle allows
            producer.produce("big", os.urandom(1000), partition=0)
            producer.poll(0)
        assert producer.flush(60) == 0
        load.start().wait_for_acks(50)
        write_manifests(cluster.topics_dir / "topics.yaml", topic_manifest(
            "big", 1, assignment={"partitions": [[0, 2]]}, config=THROTTLED))
        leader = cluster.servers[0]
        wait_for(lambda: metric(leader.http_port, "shale_replication_throttle_in_force", 'side="leader"') == 1.0,
                 60, interval=0.1, what="the leader's throttle to be in force")
        during = status(leader.http_port)["topics"]["big"]["partitions"][0]["replica"]
        assert (during["replicas"], during["adding_replicas"], during["removing_replicas"]) == ([0, 2, 1], [2], [1])
        acked_before = len(load.acked)
        # In-sync replication is never throttled: acks=all goes on while the new replica is held back.
        load.wait_for_acks(acked_before + 100)
        assert metric(leader.http_port, "shale_reassigning_partitions", "") == 1.0
        wait_for(lambda: cluster.metadata("big").get(0).replicas == (0, 2)
                 and set(cluster.metadata("big")[0].isr) == {0, 2}, 120, interval=0.3, what="the move to finish")
        acked = load.stop()
        assert load.failed == [], load.failed[:3]
        check_acknowledged(cluster, "big", 0, acked)
        moved_in = metric(cluster.servers[2].http_port, "shale_reassignment_bytes_total", 'direction="in"')
        assert moved_in is not None and moved_in >= 4_000_000
        assert metric(leader.http_port, "shale_reassignment_bytes_total", 'direction="out"') >= 4_000_000
        assert metric(leader.http_port, "shale_replication_throttled_rate_bytes", 'side="leader"') == RATE
        assert metric(leader.http_port, "shale_replication_throttled_bytes_total", 'side="leader"') >= 4_000_000
        assert status(leader.http_port)["replication_throttles"]["leader"]["rate"] == RATE
        wait_for(lambda: not (cluster.data_dir(1) / "big-0").exists(), 60, what="node 1's replica deleted")
        assert metric(cluster.servers[2].http_port, "shale_replication_throttled_bytes_total",
                      'side="follower"') > 0  # node 2 counted its throttled fetches
        admin.reset_configs([ConfigResource(ConfigResourceType.BROKER, "2", configs={FOLLOWER_RATE: None})])
        assert metric(cluster.servers[2].http_port, "shale_replication_throttled_rate_bytes", 'side="follower"') is None
    finally:
        load.close()
        admin.close()
        cluster.stop()



def test_a_dynamic_throttle_survives_a_restart_and_a_broken_file_is_reported(tmp_path, etcd):
    """Kafka keeps per-broker dynamic configs in its metadata: a node SIGKILLed and restarted comes back with the
    follower throttle set through the admin API (a move in progress stays throttled), and without it once it
    was deleted. A file that cannot be parsed is named in an ERROR line and left as it is; the node starts
    with its command line's values."""
    cluster = start_replicated_cluster(tmp_path, etcd, 1)
    node = cluster.servers[0]
    kept = cluster.data_dir(0) / FILE

    def follower_rate() -> tuple[str | None, float | None]:
        admin = KafkaAdminClient(bootstrap_servers=node.bootstrap)
        try:
            shown = admin.describe_configs([ConfigResource(ConfigResourceType.BROKER, "0")],
                                           config_filter="all")["broker"]["0"][FOLLOWER_RATE]
        finally:
            admin.close()
        return shown["config_source"], metric(node.http_port, "shale_replication_throttled_rate_bytes",
                                              'side="follower"')
    try:
        admin = KafkaAdminClient(bootstrap_servers=node.bootstrap)
        admin.alter_configs([ConfigResource(ConfigResourceType.BROKER, "0", configs={FOLLOWER_RATE: str(RATE)})])
        admin.close()
        assert json.loads(kept.read_text())["configs"] == {FOLLOWER_RATE: str(RATE)}
        cluster.restart(0)  # SIGKILL, then start on the same data
        assert follower_rate() == ("DYNAMIC_BROKER_CONFIG", RATE)

        confluent_admin = AdminClient({"bootstrap.servers": node.bootstrap})  # kept alive until its answer
        # A legacy AlterConfigs replaces the node's whole set: with no configs, it removes them all.
        with pytest.warns(DeprecationWarning, match="alter_configs has been deprecated"):  # the legacy API, on purpose
            legacy = confluent_admin.alter_configs([ConfluentResource(ConfluentResourceType.BROKER, "0", set_config={})])
        [done.result(30) for done in legacy.values()]
        assert follower_rate()[0] == "DEFAULT_CONFIG" and json.loads(kept.read_text())["configs"] == {}
        admin = KafkaAdminClient(bootstrap_servers=node.bootstrap)
        admin.alter_configs([ConfigResource(ConfigResourceType.BROKER, "0", configs={FOLLOWER_RATE: str(RATE)})])
        admin.close()
        assert follower_rate() == ("DYNAMIC_BROKER_CONFIG", RATE)

        deleted = confluent_admin.incremental_alter_configs([ConfluentResource(
            ConfluentResourceType.BROKER, "0", incremental_configs=[ConfigEntry(
                FOLLOWER_RATE, None, incremental_operation=AlterConfigOpType.DELETE)])])
        [done.result(30) for done in deleted.values()]
        cluster.restart(0)
        assert follower_rate()[0] == "DEFAULT_CONFIG" and json.loads(kept.read_text())["configs"] == {}

        kept.write_text('{"configs": {"follower.replication.throttled.rate": ')  # torn by hand
        cluster.restart(0)
        assert follower_rate()[0] == "DEFAULT_CONFIG"
        assert f"ERROR shale.sidecar.server.ops.dynamic_broker_configs: {kept} cannot be read" in node.log()
        assert kept.read_text() == '{"configs": {"follower.replication.throttled.rate": '  # left for a person
    finally:
        cluster.stop()
