"""Data written before replication (docs/replication.md, "Failures"): a single-node topic's records survive
when the topic is declared again with three replicas on `shale serve --store` processes — the node holding them
leads and the others copy them — and a holder that comes back to find an empty replica leading keeps them.

Real processes, a real etcd, real clients; the records are checked at their acknowledged offsets and on disk.
"""

from __future__ import annotations

from confluent_kafka import Consumer, Producer, TopicPartition

from support.http_util import get_json
from support.node_util import (
    TEST_OVERRIDES,
    ReplicatedCluster,
    ServeProcess,
    start_replicated_cluster,
    topic_manifest,
    wait_for,
    write_manifests,
)

TOPIC = "legacy"


def produce(bootstrap: str, values: list[bytes]) -> list[int]:
    """Acknowledged (acks=all) offsets of `values`, in order; fails on any delivery error."""
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5, "message.timeout.ms": 30000})
    acked: list[tuple[object, int, bytes]] = []
    for value in values:
        producer.produce(TOPIC, value=value, partition=0,
                         on_delivery=lambda err, msg: acked.append((err, msg.offset(), msg.value())))
    assert producer.flush(60) == 0
    assert [a for a in acked if a[0] is not None] == []
    assert [v for _, _, v in acked] == values
    return [offset for _, offset, _ in acked]


def consume_all(bootstrap: str, count: int) -> dict[int, bytes]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "check", "enable.auto.commit": False})
    consumer.assign([TopicPartition(TOPIC, 0, 0)])
    seen: dict[int, bytes] = {}
    try:
        def read() -> bool:
            msg = consumer.poll(0.5)
            if msg is not None and msg.error() is None:
                seen[msg.offset()] = msg.value()
            return len(seen) >= count
        wait_for(read, 60, interval=0, what=f"{count} records of {TOPIC}-0")
    finally:
        consumer.close()
    return seen


def write_single_node_data(tmp_path, count: int) -> list[int]:
    """Node 0 as a single-node cluster (no store): `count` acknowledged records in `legacy-0`."""
    topics = tmp_path / "single-topics"
    write_manifests(topics / "topics.yaml", topic_manifest(TOPIC, 1))
    with ServeProcess(tmp_path / "data0", topics, node_id=0) as single:
        offsets = produce(single.bootstrap, [b"before-%d" % i for i in range(count)])
    assert offsets == list(range(count))
    return offsets


def test_single_node_records_stay_readable_when_the_topic_gains_replicas_and_followers_copy_them(tmp_path, etcd):
    write_single_node_data(tmp_path, 50)
    # Node 1 is the first replica: without the held data, it would lead an empty log and node 0 would truncate.
    cluster = start_replicated_cluster(tmp_path, etcd, 3, topic_manifest(
        TOPIC, 1, assignment={"partitions": [[1, 0, 2]]}, config={"min.insync.replicas": 2}))
    try:
        assert cluster.wait_for_leader(TOPIC, 0).replicas == (1, 0, 2)
        assert "holds records written before replication in legacy-0" in cluster.servers[0].log()
        # Whichever node created the record named the holder leader, alone in the ISR. (A loaded machine may
        # fence it later and elect a follower that copied everything: that is fine too.)
        assert any("legacy-0: none -> leader 0 epoch 0 isr (0,)" in s.log() for s in cluster.servers.values())
        cluster.wait_for_isr(TOPIC, 0)  # the empty replicas copied the old records and joined
        more = produce(cluster.bootstrap, [b"after-%d" % i for i in range(10)])
        assert more == list(range(50, 60))
        seen = consume_all(cluster.bootstrap, 60)
        assert seen == {**{i: b"before-%d" % i for i in range(50)}, **{50 + i: b"after-%d" % i for i in range(10)}}
        cluster.wait_identical_below(TOPIC, 0, 60, (0, 1, 2))
        # A follower restarted with only records from before replication checks them against the leader's
        # (the same bytes) and goes on following: it rejoins the ISR.
        cluster.restart(2)
        cluster.wait_for_members()
        produce(cluster.bootstrap, [b"later"])
        cluster.wait_for_isr(TOPIC, 0)
        cluster.wait_identical_below(TOPIC, 0, 61, (0, 1, 2))
    finally:
        cluster.stop()


def test_a_holder_that_returns_to_an_empty_leader_keeps_its_records_and_refuses_to_follow(tmp_path, etcd):
    write_single_node_data(tmp_path, 20)
    cluster = ReplicatedCluster(tmp_path, etcd)
    write_manifests(cluster.topics_dir / "topics.yaml",
                    topic_manifest(TOPIC, 1, assignment={"partitions": [[0, 1, 2]]}))
    for n in range(3):
        cluster.servers[n] = ServeProcess(tmp_path / f"data{n}", cluster.topics_dir, "--store", etcd.url,
                                          *TEST_OVERRIDES, node_id=n)
    try:
        for n in (1, 2):  # the holder is not there when the record is created: an empty replica leads
            cluster.servers[n].start()
        cluster.wait_for_members()
        state = cluster.wait_for_leader(TOPIC, 0)
        assert state.leader == 1
        produce(cluster.bootstrap, [b"new-%d" % i for i in range(5)])
        holder = cluster.servers[0].start()

        def refused() -> dict | None:
            part = get_json(holder.http_port, "/status")[1]["topics"].get(TOPIC, {}).get("partitions", [None])[0]
            error = part and part.get("replica") and part["replica"].get("fetch_error")
            return part if error and error.startswith("refused:") else None

        part = wait_for(refused, 60, interval=0.2, what="node 0 to refuse to follow an empty leader")
        assert part["log_end_offset"] == 20 and part["log_start_offset"] == 0
        assert "records 0-19 written before replication" in part["replica"]["fetch_error"]
        logged = [line for line in holder.log().splitlines() if " ERROR " in line and "legacy-0" in line]
        assert logged and "node 0" in logged[0] and "node 1 in leader epoch" in logged[0], holder.log()[-3000:]
        assert cluster.metadata(TOPIC)[0].leader == 1  # the others go on; node 0 stays out of the ISR
        assert 0 not in cluster.metadata(TOPIC)[0].isr
        cluster.stop()
        kept = cluster.batches(0, TOPIC, 0)  # every old record still there, and nothing of the new leader's
        assert (kept[0][0].base_offset, kept[-1][0].last_offset) == (0, 19)
    finally:
        cluster.stop()
