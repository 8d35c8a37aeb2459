"""Three `shale serve --store etcd://…` processes replicate every partition: what a client and the disks see
when nothing fails (docs/replication.md)."""

from __future__ import annotations

import subprocess
import time

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from shale.sidecar.log.records import decode_batch
from support.fault_util import check_acknowledged
from support.node_util import (
    TEST_OVERRIDES,
    NodeThread,
    ReplicatedCluster,
    ServeProcess,
    fetch_sessions,
    scrape_metrics,
    start_replicated_cluster,
    topic_manifest,
    wait_for,
    write_manifests,
)


def test_three_replicas_hold_every_acknowledged_record_byte_for_byte(tmp_path, etcd):
    cluster = start_replicated_cluster(tmp_path, etcd, 3, topic_manifest("orders", 2, replicas=3,
                                                                          config={"min.insync.replicas": 2}))
    try:
        producer = Producer({"bootstrap.servers": cluster.bootstrap, "acks": "all", "linger.ms": 5})
        acked = []
        for i in range(200):
            producer.produce("orders", key=b"k%d" % i, value=b"v%d" % i, partition=i % 2,
                             on_delivery=lambda err, msg: acked.append((err, msg.partition(), msg.offset(),
                                                                        msg.value())))
        assert producer.flush(30) == 0
        assert [a for a in acked if a[0] is not None] == []
        metadata = cluster.metadata("orders")
        for p in (0, 1):
            state = metadata[p]
            assert sorted(state.replicas) == [0, 1, 2] and sorted(state.isr) == [0, 1, 2]
            assert state.leader == state.replicas[0] or state.leader_epoch > 0  # the first live replica leads
            hw = check_acknowledged(cluster, "orders", p, [(q, o, v) for _, q, o, v in acked])
            assert hw == 100
            # Each batch carries the epoch it was written in, on every replica (they are the same bytes).
            assert {h.partition_leader_epoch for h, _ in cluster.batches(state.replicas[2], "orders", p)} == {
                state.leader_epoch}
        # The two partitions are led by different nodes: the first live replica, Kafka's round robin.
        assert metadata[0].leader != metadata[1].leader

        # A consumer reads everything, from whichever node it bootstraps on.
        consumer = Consumer({"bootstrap.servers": cluster.servers[2].bootstrap, "group.id": "g",
                             "auto.offset.reset": "earliest", "enable.auto.commit": False})
        try:
            consumer.assign([TopicPartition("orders", p, 0) for p in (0, 1)])
            got = set()
            deadline = time.monotonic() + 30
            while len(got) < 200 and time.monotonic() < deadline:
                msg = consumer.poll(0.5)
                if msg is not None and msg.error() is None:
                    got.add((msg.partition(), msg.offset(), msg.value()))
        finally:
            consumer.close()
        assert got == {(p, o, v) for _, p, o, v in acked}
    finally:
        cluster.stop()


def test_the_assignment_names_the_replicas_and_their_order(tmp_path, etcd):
    cluster = start_replicated_cluster(
        tmp_path, etcd, 3,
        topic_manifest("placed", 2, assignment={"partitions": [[1, 2], [2, 0]]}),
        topic_manifest("chosen", 3, replicas=2))
    try:
        placed = cluster.metadata("placed")
        assert [s.replicas for s in placed.values()] == [(1, 2), (2, 0)]
        # The first replica that was live when the record was created leads (Kafka's rule; the nodes start in
        # id order, so node 0 may be up before node 2).
        assert all(s.leader in s.replicas for s in placed.values())
        chosen = cluster.metadata("chosen")
        assert all(len(set(s.replicas)) == 2 and s.leader == s.replicas[0] for s in chosen.values())
        # Only the named replicas hold a log of the partition.
        for p, state in placed.items():
            holders = {n for n in range(3) if (cluster.data_dir(n) / f"placed-{p}").is_dir()}
            assert holders == set(state.replicas)
    finally:
        cluster.stop()


def test_consumer_groups_commit_to_the_replicated_offsets_topic(tmp_path, etcd):
    cluster = start_replicated_cluster(tmp_path, etcd, 3, topic_manifest("events", 1, replicas=3),
                                       extra=("--override", "group.initial.rebalance.delay.ms=0"))
    try:
        producer = Producer({"bootstrap.servers": cluster.bootstrap, "acks": "all"})
        for i in range(10):
            producer.produce("events", value=b"e%d" % i)
        assert producer.flush(30) == 0
        consumer = Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": "readers",
                             "auto.offset.reset": "earliest", "enable.auto.commit": False})
        try:
            consumer.subscribe(["events"])
            seen = []
            deadline = time.monotonic() + 30
            while len(seen) < 10 and time.monotonic() < deadline:
                msg = consumer.poll(0.5)
                if msg is not None and msg.error() is None:
                    seen.append(msg.offset())
            assert seen == list(range(10))
            consumer.commit(asynchronous=False)
            committed = consumer.committed([TopicPartition("events", 0)], timeout=10)
            assert committed[0].offset == 10
        finally:
            consumer.close()
        offsets = cluster.metadata("__consumer_offsets")
        assert len(offsets) == 5 and all(sorted(s.replicas) == [0, 1, 2] for s in offsets.values())
        # The commit is replicated: some partition of __consumer_offsets holds a record on all three nodes.
        holding = [p for p in offsets
                   if all(cluster.batches(n, "__consumer_offsets", p) for n in range(3))]
        assert holding, "no __consumer_offsets partition holds the commit on every replica"
        p = holding[0]
        hw = cluster.high_watermark("__consumer_offsets", p)
        cluster.wait_identical_below("__consumer_offsets", p, hw, (0, 1, 2))
        assert any(b"readers" in r.key for _, raw in cluster.batches(0, "__consumer_offsets", p)
                   for r in decode_batch(raw).records)
    finally:
        cluster.stop()


def test_more_than_one_replica_without_a_store_is_refused_with_the_reason(tmp_path):
    write_manifests(tmp_path / "topics" / "t.yaml", topic_manifest("solo", 1, replicas=3),
                    topic_manifest("spread", 1, assignment={"partitions": [[0, 1]]}),
                    topic_manifest("fine", 1))
    with NodeThread(tmp_path / "data", tmp_path / "topics") as node:
        errors = node.node.topic_errors
        assert set(errors) == {"solo", "spread"}
        assert "needs a control store (shale serve --store etcd://HOST:PORT)" in errors["solo"]
        assert "fine" in node.node.registry.topics and "solo" not in node.node.registry.topics


@pytest.mark.parametrize("store, fragment", [
    ("zookeeper://127.0.0.1:2181", "expected etcd://HOST:PORT[,HOST:PORT...] or kubernetes"),
    ("etcd://", "no etcd endpoint"),
    ("kubernetes", "--store kubernetes: not in a pod"),  # and no kubeconfig either
])
def test_a_wrong_store_is_one_line_and_exit_1(tmp_path, store, fragment):
    (tmp_path / "topics").mkdir()
    server = ServeProcess(tmp_path / "data", tmp_path / "topics", "--store", store,
                          env={"KUBECONFIG": str(tmp_path / "no-kubeconfig"), "KUBERNETES_SERVICE_HOST": ""})
    result = subprocess.run(server.args, capture_output=True, text=True, timeout=60, env=server.env)
    assert result.returncode == 1
    assert "cannot start" in result.stderr and fragment in result.stderr, result.stderr
    assert not (tmp_path / "data").exists() or not any((tmp_path / "data").iterdir())


def test_admin_clients_see_the_live_nodes_and_create_topics_within_them(tmp_path, etcd):
    from confluent_kafka import KafkaError
    from confluent_kafka.admin import AdminClient, NewTopic

    cluster = start_replicated_cluster(tmp_path, etcd, 3)
    try:
        admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
        described = admin.describe_cluster(request_timeout=10).result()
        assert sorted(n.id for n in described.nodes) == [0, 1, 2]
        assert sorted(n.port for n in described.nodes) == sorted(s.port for s in cluster.servers.values())
        cluster.kill(2)
        wait_for(lambda: sorted(n.id for n in admin.describe_cluster(request_timeout=10).result().nodes) == [0, 1],
                 timeout=30, what="node 2 to leave the cluster's live nodes")
        future = admin.create_topics([NewTopic("made-by-api", 1, 3)])["made-by-api"]
        with pytest.raises(Exception) as info:
            future.result(10)
        error = info.value.args[0]  # Kafka's refusal: fewer live nodes than the replication factor
        assert error.code() == KafkaError.INVALID_REPLICATION_FACTOR and "only 2 broker(s)" in error.str()
        admin.create_topics([NewTopic("made-by-api", 1, 2)])["made-by-api"].result(30)
        assert sorted(cluster.wait_for_isr("made-by-api", 0).replicas) == [0, 1]
    finally:
        cluster.stop()


def _status(server) -> dict:
    import json
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{server.http_port}/status", timeout=10) as response:
        return json.load(response)


def test_status_and_metrics_show_each_replicas_role_isr_and_lag(tmp_path, etcd):
    cluster = start_replicated_cluster(tmp_path, etcd, 3, topic_manifest("watched", 1, replicas=3,
                                                                          config={"min.insync.replicas": 3}))
    try:
        producer = Producer({"bootstrap.servers": cluster.bootstrap, "acks": "all"})
        for i in range(30):
            producer.produce("watched", value=b"w%d" % i)
        assert producer.flush(30) == 0
        state = cluster.wait_for_isr("watched", 0)
        labels = frozenset({("topic", "watched"), ("partition", "0")})
        for n, server in cluster.servers.items():
            doc = _status(server)
            (replica_doc,) = doc["topics"]["watched"]["partitions"]
            replica = replica_doc["replica"]
            assert doc["session_valid"] is True and replica_doc["served"] is True
            assert replica["role"] == ("leader" if n == state.leader else "follower")
            assert (replica["leader"], replica["leader_epoch"]) == (state.leader, state.leader_epoch)
            assert sorted(replica["isr"]) == [0, 1, 2] and replica["in_sync"] is True
            assert replica["under_replicated"] is False and replica["under_min_isr"] is False
            metrics = wait_for(lambda: (lambda m: m if m[("shale_log_high_watermark", labels)] == 30 else None)(
                scrape_metrics(server.http_port)), what=f"node {n}'s high watermark to reach 30")
            assert metrics[("shale_replica_leader", labels)] == (1.0 if n == state.leader else 0.0)
            assert metrics[("shale_replica_in_sync", labels)] == 1.0
            assert metrics[("shale_node_session_valid", frozenset())] == 1.0
            if n != state.leader:
                assert metrics[("shale_replica_lag_offsets", labels)] == 0.0
        follower = next(r for r in state.replicas if r != state.leader)
        cluster.kill(follower)
        leader = cluster.servers[state.leader]
        shrunk = wait_for(lambda: (lambda r: r if r["under_replicated"] else None)(
            _status(leader)["topics"]["watched"]["partitions"][0]["replica"]), timeout=30,
            what="the leader to report the partition under-replicated")
        assert follower not in shrunk["isr"] and shrunk["under_min_isr"] is True  # min.insync.replicas=3
        metrics = scrape_metrics(leader.http_port)
        assert metrics[("shale_partition_under_replicated", labels)] == 1.0
        assert metrics[("shale_partition_under_min_isr", labels)] == 1.0
    finally:
        cluster.stop()


def test_followers_fetch_through_one_session_per_leader_and_stay_byte_identical(tmp_path, etcd):
    """Each follower keeps one incremental fetch session (KIP-227) with each leader it fetches from, holding
    every partition it follows there; records produced through the sessions reach every replica unchanged."""
    cluster = start_replicated_cluster(tmp_path, etcd, 3, topic_manifest("sessions", 6, replicas=3,
                                                                          config={"min.insync.replicas": 3}))
    try:
        producer = Producer({"bootstrap.servers": cluster.bootstrap, "acks": "all", "linger.ms": 0})
        acked: list = []
        for wave in range(3):  # several rounds: each answer carries only the partitions that changed
            for i in range(60):
                producer.produce("sessions", value=b"s%d-%d" % (wave, i), partition=(i * 7 + wave) % 6,
                                 on_delivery=lambda err, msg: acked.append((err, msg.partition(), msg.offset(),
                                                                            msg.value())))
            assert producer.flush(30) == 0
        assert [a for a in acked if a[0] is not None] == []
        for p in range(6):
            check_acknowledged(cluster, "sessions", p, [(q, o, v) for _, q, o, v in acked if q == p])
        for n, server in cluster.servers.items():
            # Every partition this node leads, __consumer_offsets' included: its two followers fetch it here.
            led = [(topic, d["partition"]) for topic, doc in _status(server)["topics"].items()
                   for d in doc["partitions"] if (d.get("replica") or {}).get("role") == "leader"]
            want = (2 if led else 0, 2 * len(led))  # both followers' sessions, each with every partition led here
            deadline = time.monotonic() + 30  # a follower opens its session with its first fetch after a change
            while (got := fetch_sessions(server.http_port)) != want and time.monotonic() < deadline:
                time.sleep(0.1)
            assert got == want, f"node {n} leads {led}: (fetch sessions, their partitions)"
    finally:
        cluster.stop()


def test_five_nodes_spread_three_replicas_and_survive_a_node_lost(tmp_path, etcd):
    from support.fault_util import AckedLoad

    # The topic is declared once all five nodes are live: replicas are chosen from the nodes live when a
    # partition's record is created (as Kafka's controller chooses from the registered brokers).
    cluster = start_replicated_cluster(tmp_path, etcd, 5)
    load = AckedLoad("confluent", cluster.bootstrap, "wide", partitions=5)
    try:
        write_manifests(cluster.topics_dir / "wide.yaml",
                        topic_manifest("wide", 5, replicas=3, config={"min.insync.replicas": 2}))
        states = {p: cluster.wait_for_leader("wide", p) for p in range(5)}
        assert all(len(set(s.replicas)) == 3 for s in states.values())
        assert len({s.leader for s in states.values()}) == 5  # Kafka's round robin: each node leads one
        held = {n: sum(n in s.replicas for s in states.values()) for n in range(5)}
        assert set(held.values()) == {3}  # and holds three replicas
        load.start().wait_for_acks(200)
        victim = states[0].leader
        cluster.kill(victim)
        for p, s in states.items():
            if victim in s.replicas:
                cluster.wait_for_leader("wide", p, excluding=(victim,),
                                        newer_than=s.leader_epoch if s.leader == victim else -1)
        load.wait_for_acks(len(load.acked) + 200)
        cluster.restart(victim)
        acked = load.stop()
        assert load.failed == []
        for p in range(5):
            check_acknowledged(cluster, "wide", p, acked)
    finally:
        load.close()
        cluster.stop()


def test_a_topic_removed_from_the_manifests_leaves_no_partition_record_in_the_store(tmp_path, etcd):
    import etcd3gw

    cluster = start_replicated_cluster(tmp_path, etcd, 3, topic_manifest("kept", 1, replicas=3))
    client = etcd3gw.Etcd3Client("127.0.0.1", etcd.port, api_path="/v3/")
    doomed = write_manifests(cluster.topics_dir / "doomed.yaml", topic_manifest("doomed", 2, replicas=3))

    def records(topic: str) -> list[str]:
        return sorted(meta["key"].decode() for _, meta in
                      client.get_prefix(f"/shale/shale/partitions/{topic}/"))

    try:
        for p in (0, 1):
            cluster.wait_for_leader("doomed", p)
        assert records("doomed") == ["/shale/shale/partitions/doomed/0", "/shale/shale/partitions/doomed/1"]
        doomed.unlink()
        wait_for(lambda: records("doomed") == [], timeout=30, what="the deleted topic's records to go")
        wait_for(lambda: all(not (cluster.data_dir(n) / "doomed-0").exists() for n in range(3)), timeout=30,
                 what="every replica of the deleted topic to go")
        time.sleep(2)  # several controller rounds: no node brings the records back
        assert records("doomed") == [] and records("kept") == ["/shale/shale/partitions/kept/0"]
        assert cluster.metadata("doomed") == {}
    finally:
        cluster.stop()


def test_a_restarted_replica_takes_its_topics_config_again(tmp_path, etcd):
    """Logs loaded at start open with Kafka's defaults; a replica gets its topic's config when the store names it
    (not only a log the registry creates): a compacted topic stays compacted on every replica."""
    cluster = start_replicated_cluster(tmp_path, etcd, 3, topic_manifest("table", 1, replicas=3,
                                                                          config={"cleanup.policy": "compact"}))
    try:
        producer = Producer({"bootstrap.servers": cluster.bootstrap, "acks": "all"})
        producer.produce("table", key=b"k", value=b"v")
        assert producer.flush(30) == 0
        for n in range(3):
            assert cluster.servers[n].terminate() == 0
            cluster.servers[n].start()
            cluster.wait_for_isr("table", 0)
        for n, server in cluster.servers.items():
            (replica,) = _status(server)["topics"]["table"]["partitions"]
            assert replica["cleanup_policy"] == ["compact"], f"node {n}"
    finally:
        cluster.stop()


def test_a_node_that_reads_a_topic_after_its_records_exist_serves_it_in_a_quiet_store(tmp_path, etcd):
    # Each node reads its own topics directory, as each pod gets the ConfigMap on its own kubelet's schedule: node
    # 2 learns of the topic after nodes 0 and 1 created its record, and no store change follows (the ISR lag time
    # is too long for the leader to shrink node 2 out). Found on the real cluster (tests/cluster): such a node
    # served nothing until some other record changed.
    cluster = ReplicatedCluster(tmp_path, etcd)
    dirs = [tmp_path / f"topics{n}" for n in range(3)]
    for n, topics in enumerate(dirs):
        topics.mkdir()
        cluster.servers[n] = ServeProcess(tmp_path / f"data{n}", topics, "--store", etcd.url, *TEST_OVERRIDES,
                                          "--override", "replica.lag.time.max.ms=600000", node_id=n)
    try:
        for server in cluster.servers.values():
            server.start()
        cluster.wait_for_members()
        manifest = topic_manifest("late", 1, assignment={"partitions": [[0, 1, 2]]})
        for topics in dirs[:2]:
            write_manifests(topics / "topics.yaml", manifest)
        wait_for(lambda: all(getattr(cluster.metadata("late", via=n).get(0), "leader", None) == 0 for n in (0, 1)),
                 what="nodes 0 and 1 to see late-0 led by node 0")
        time.sleep(1)  # the store settles: node 2 has applied every view there is

        write_manifests(dirs[2] / "topics.yaml", manifest)
        wait_for(lambda: [(p["replica"] or {}).get("role") for p in _status(cluster.servers[2])["topics"].get(
            "late", {}).get("partitions", [])] == ["follower"], what="node 2 to follow late-0")
    finally:
        cluster.stop()
