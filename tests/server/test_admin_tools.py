"""What Kafka's admin tools and lag monitors use, against a real `shale serve`: DeleteTopics, CreatePartitions,
ListGroups, DescribeGroups, DeleteGroups, OffsetDelete, DescribeCluster and DescribeLogDirs through
confluent-kafka's AdminClient and kafka-python's KafkaAdminClient, the error cases, a consumer-lag computation
checked against what was produced and committed, and the API table of docs/kafka-apis.md checked against
the node's ApiVersions.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import socket
import threading
import uuid
from pathlib import Path

import confluent_kafka
import pytest
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.admin import NewPartitions as AioNewPartitions
from aiokafka.admin import NewTopic as AioNewTopic
from aiokafka.errors import PolicyViolationError
from confluent_kafka import ConsumerGroupState, ConsumerGroupTopicPartitions, KafkaException
from confluent_kafka.admin import AdminClient, OffsetSpec
from confluent_kafka.admin import NewPartitions as CNewPartitions
from confluent_kafka.admin import NewTopic as CNewTopic
from kafka import KafkaConsumer
from kafka import TopicPartition as KTP
from kafka.admin import KafkaAdminClient, NewPartitions, NewTopic
from kafka.admin import OffsetSpec as KOffsetSpec
from kafka.errors import GroupSubscribedToTopicError, NoError
from kafka.protocol.admin.cluster import (
    DescribeClusterRequest,
    DescribeClusterResponse,
    DescribeLogDirsRequest,
    DescribeLogDirsResponse,
)
from kafka.protocol.admin.groups import ListGroupsRequest, ListGroupsResponse
from kafka.protocol.admin.topics import DeleteTopicsRequest, DeleteTopicsResponse
from kafka.protocol.consumer.fetch import FetchRequest, FetchResponse
from kafka.protocol.metadata.api_versions import ApiVersionsRequest, ApiVersionsResponse
from kafka.protocol.metadata.find_coordinator import FindCoordinatorRequest, FindCoordinatorResponse
from kafka.structs import OffsetAndMetadata

from shale.sidecar.log.topic_partition import TopicPartition
from shale.sidecar.protocol.codec import API_NAMES
from shale.sidecar.topics.registry import API_TOPICS_FILE
from support.clients_util import build, call, partition_dir, read_frame, request_frame
from support.node_util import NodeThread, ServeProcess, start_cluster, topic_manifest, wait_for, write_manifests

DECLARED = "declared"  # declared by a manifest in every node of this file
FAST = ("--override", "group.initial.rebalance.delay.ms=0")
DOC = Path(__file__).resolve().parents[2] / "docs" / "kafka-apis.md"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    base = tmp_path_factory.mktemp("admin-tools")
    write_manifests(base / "topics" / "declared.yaml", topic_manifest(DECLARED, 2))
    proc = ServeProcess(base / "data", base / "topics", *FAST).start()
    yield proc
    assert proc.proc.poll() is None, f"shale serve died during the admin tests:\n{proc.log()[-5000:]}"
    assert proc.terminate() == 0, proc.log()[-5000:]


@pytest.fixture
def kp_admin(server):
    admin = KafkaAdminClient(bootstrap_servers=server.bootstrap, client_id="kp-admin-tools")
    yield admin
    admin.close()


def codes(futures: dict) -> dict:
    """confluent-kafka's per-resource futures as {resource: Kafka error code, or None for success}."""
    out = {}
    for key, future in futures.items():
        try:
            future.result(timeout=30)
            out[key] = None
        except KafkaException as exc:
            out[key] = exc.args[0].code()
    return out


def produce(bootstrap: str, topic: str, counts: dict[int, int]) -> None:
    """`counts[p]` records to each partition p, acknowledged."""
    producer = confluent_kafka.Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    errors: list = []
    for p, n in counts.items():
        for i in range(n):
            producer.produce(topic, key=b"k%d" % i, value=b"%s-%d-%d" % (topic.encode(), p, i), partition=p,
                             on_delivery=lambda err, _msg: err and errors.append(err))
    assert producer.flush(30) == 0 and errors == []


def partition_counts(admin: AdminClient) -> dict[str, int]:
    return {name: len(t.partitions) for name, t in admin.list_topics(timeout=10).topics.items()}


def topic_dirs(data_dir: str, topic: str) -> list[str]:
    return sorted(d.name for d in Path(data_dir).iterdir() if d.name.startswith(topic + "-") or
                  d.name.startswith(topic + "."))


def api_topics(data_dir: str) -> set[str]:
    return {t["name"] for t in json.loads((Path(data_dir) / API_TOPICS_FILE).read_text())}


# -- CreatePartitions and DeleteTopics ----------------------------------------------------------------------------


def test_confluent_grows_and_deletes_the_topics_it_created_and_only_those(server):
    admin = AdminClient({"bootstrap.servers": server.bootstrap})
    assert codes(admin.create_topics([CNewTopic("c-orders", 2, 1)])) == {"c-orders": None}
    produce(server.bootstrap, "c-orders", {0: 3, 1: 2})

    assert codes(admin.create_partitions([CNewPartitions("c-orders", 5)])) == {"c-orders": None}
    assert partition_counts(admin)["c-orders"] == 5
    assert topic_dirs(server.data_dir, "c-orders") == [f"c-orders-{p}" for p in range(5)]
    assert "c-orders" in api_topics(server.data_dir)
    produce(server.bootstrap, "c-orders", {4: 1})  # the new partitions take records
    # Kafka's refusals: not an increase, unknown, a manifest's topic, the node's own topic.
    assert codes(admin.create_partitions([
        CNewPartitions("c-orders", 5), CNewPartitions("nope", 3), CNewPartitions(DECLARED, 4),
        CNewPartitions("__consumer_offsets", 60)])) == {"c-orders": 37, "nope": 3, DECLARED: 44,
                                                        "__consumer_offsets": 44}
    assert codes(admin.create_partitions([CNewPartitions("c-orders", 3)])) == {"c-orders": 37}
    assert codes(admin.create_partitions([CNewPartitions("c-orders", 9)], validate_only=True)) == {"c-orders": None}
    assert partition_counts(admin)["c-orders"] == 5 and partition_counts(admin)[DECLARED] == 2

    assert codes(admin.delete_topics(["c-orders", DECLARED, "nope", "__consumer_offsets"])) == {
        "c-orders": None, DECLARED: 44, "nope": 3, "__consumer_offsets": 44}
    assert "c-orders" not in partition_counts(admin)
    wait_for(lambda: topic_dirs(server.data_dir, "c-orders") == [], what="the deleted partition directories to go")
    assert "c-orders" not in api_topics(server.data_dir)
    assert topic_dirs(server.data_dir, DECLARED) == [f"{DECLARED}-0", f"{DECLARED}-1"]
    assert "declared by the Topic manifest" in server.log() and "declared.yaml" in server.log()


def test_kafka_python_deletes_by_name_and_by_id_and_grows_with_a_manual_assignment(server, kp_admin):
    kp_admin.create_topics([NewTopic("kp-a", 1, 1), NewTopic("kp-b", 1, 1)])
    result = kp_admin.create_partitions({"kp-a": NewPartitions(3, [[0], [0]])})
    assert [(r.name, r.error_code) for r in result.results] == [("kp-a", 0)]
    refusals = {
        4: ([[1]], "includes broker 1, but no such broker is registered"),
        5: ([[0]], "Attempted to add 2 additional partition(s), but only 1 assignment(s) were specified."),
        6: ([[0, 0], [0], [0]], "gives partition 3 2 replicas"),
    }
    for count, (assignment, message) in refusals.items():
        result = kp_admin.create_partitions({"kp-a": NewPartitions(count, assignment)}, raise_errors=False)
        (r,) = result.results
        assert r.error_code == 39 and message in r.error_message  # INVALID_REPLICA_ASSIGNMENT
    assert {t["name"]: len(t["partitions"]) for t in kp_admin.describe_topics(["kp-a"])} == {"kp-a": 3}

    ids = {t["name"]: uuid.UUID(str(t["topic_id"])) for t in kp_admin.describe_topics(["kp-a", "kp-b"])}
    def deleted(result: dict) -> list[tuple]:
        return [(t["name"], uuid.UUID(t["topic_id"]), t["error_code"]) for t in result["topics"]]

    assert deleted(kp_admin.delete_topics([ids["kp-b"]])) == [("kp-b", ids["kp-b"], 0)]  # by id: DeleteTopics v6
    result = kp_admin.delete_topics([ids["kp-b"]], raise_errors=False)
    assert [(t["name"], t["error_code"], t["error_message"]) for t in result["topics"]] == [
        (None, 100, "This server does not host this topic ID.")]
    assert deleted(kp_admin.delete_topics(["kp-a"])) == [("kp-a", ids["kp-a"], 0)]
    assert not {"kp-a", "kp-b"} & set(kp_admin.list_topics())


def test_aiokafka_uses_the_oldest_versions_and_gets_the_same_answers(server, kp_admin):
    """aiokafka's admin client speaks old versions (DeleteTopics v3, CreatePartitions v1, DescribeGroups v2)."""
    assert kp_admin.alter_group_offsets("aio-simple", {KTP(DECLARED, 0): OffsetAndMetadata(1, "", -1)})

    async def main() -> None:
        admin = AIOKafkaAdminClient(bootstrap_servers=server.bootstrap)
        await admin.start()
        try:
            await admin.create_topics([AioNewTopic("aio-t", 1, 1)])
            resp = await admin.create_partitions({"aio-t": AioNewPartitions(2)})
            assert [(t[0], t[1]) for t in resp.topic_errors] == [("aio-t", 0)]
            with pytest.raises(PolicyViolationError, match="declared.yaml"):
                await admin.create_partitions({DECLARED: AioNewPartitions(3)})
            assert ("aio-simple", "") in [(g[0], g[1]) for g in await admin.list_consumer_groups()]
            (described,) = await admin.describe_consumer_groups(["aio-nobody"])
            assert [(g[0], g[1], g[2]) for g in described.groups] == [(0, "aio-nobody", "Dead")]
            resp = await admin.delete_topics(["aio-t", DECLARED])
            assert sorted(resp.topic_error_codes) == [("aio-t", 0), (DECLARED, 44)]
        finally:
            await admin.close()

    asyncio.run(main())
    admin = AdminClient({"bootstrap.servers": server.bootstrap})
    assert "aio-t" not in partition_counts(admin) and partition_counts(admin)[DECLARED] == 2
    assert kp_admin.delete_groups(["aio-simple"]) == {"aio-simple": "OK"}


def test_raw_delete_topics_requests_no_client_sends(server, kp_admin):
    kp_admin.create_topics([NewTopic("raw-a", 1, 1), NewTopic("raw-b", 1, 1), NewTopic("raw-c", 1, 1)])
    ids = {t["name"]: uuid.UUID(str(t["topic_id"])) for t in kp_admin.describe_topics(["raw-a", "raw-b"])}

    def delete(version: int, **values):
        resp = call(server.port, build(DeleteTopicsRequest, {"timeout_ms": 1000, **values}, version),
                    DeleteTopicsResponse)
        return [(r.name, r.error_code) + ((r.error_message,) if version >= 5 else ()) for r in resp.responses]

    state = DeleteTopicsRequest.DeleteTopicState
    assert delete(6, topics=[state(name="raw-a", topic_id=ids["raw-a"]), state(name=None, topic_id=None)]) == [
        ("raw-a", 42, "You may not specify both topic name and topic id."),
        (None, 42, "Neither topic name nor id were specified.")]
    assert delete(6, topics=[state(name="raw-a"), state(name="raw-a")]) == [("raw-a", 42, "Duplicate topic name.")]
    assert delete(6, topics=[state(name="raw-a"), state(topic_id=ids["raw-a"])]) == [
        ("raw-a", 42, "The provided topic name maps to an ID that was already supplied.")] * 2
    assert delete(6, topics=[state(name="raw-b"), state(topic_id=ids["raw-a"])]) == [
        ("raw-b", 0, None), ("raw-a", 0, None)]
    assert delete(1, topic_names=["raw-c", "gone"]) == [("raw-c", 0), ("gone", 3)]  # oldest version, by name
    assert not {"raw-a", "raw-b", "raw-c"} & set(kp_admin.list_topics())


def test_topic_deletion_can_be_disabled_as_in_kafka(tmp_path):
    write_manifests(tmp_path / "topics" / "declared.yaml", topic_manifest(DECLARED, 1))
    with ServeProcess(tmp_path / "data", tmp_path / "topics", "--override", "delete.topic.enable=false") as proc:
        admin = AdminClient({"bootstrap.servers": proc.bootstrap})
        assert codes(admin.create_topics([CNewTopic("kept", 1, 1)])) == {"kept": None}
        assert codes(admin.delete_topics(["kept", "nope"])) == {"kept": 73, "nope": 73}  # TOPIC_DELETION_DISABLED
        resp = call(proc.port, build(DeleteTopicsRequest, {"topic_names": ["kept"], "timeout_ms": 1000}, 2),
                    DeleteTopicsResponse)
        assert [(r.name, r.error_code) for r in resp.responses] == [("kept", 42)]  # before v3: INVALID_REQUEST
        assert "kept" in partition_counts(admin) and topic_dirs(proc.data_dir, "kept") == ["kept-0"]


def test_delete_topics_deletes_a_manifest_topic_whose_removal_is_only_held(tmp_path):
    """The last manifest file removed looks like an unmounted volume, so the node holds the topic; no manifest
    declares it any more, and DeleteTopics is then the explicit act that deletes it."""
    manifest = write_manifests(tmp_path / "topics" / "held.yaml", topic_manifest("held-t", 2))
    with NodeThread(tmp_path / "data", tmp_path / "topics") as node:
        admin = AdminClient({"bootstrap.servers": node.bootstrap})
        assert codes(admin.delete_topics(["held-t"])) == {"held-t": 44}  # the manifest still declares it
        manifest.unlink()
        wait_for(lambda: "held-t" in node.node.manifests.held, what="the removal to be held")
        assert topic_dirs(node.node.log_dir.path, "held-t") == ["held-t-0", "held-t-1"]
        assert codes(admin.delete_topics(["held-t"])) == {"held-t": None}
        assert "held-t" not in partition_counts(admin) and node.node.manifests.held == {}
        wait_for(lambda: topic_dirs(node.node.log_dir.path, "held-t") == [], what="the directories to go")
        write_manifests(tmp_path / "topics" / "other.yaml", topic_manifest("other"))  # a reload
        wait_for(lambda: "other" in partition_counts(admin), what="the next reload")
        assert "held-t" not in partition_counts(admin)


def test_grown_and_deleted_topics_stay_so_across_a_restart(tmp_path):
    write_manifests(tmp_path / "topics" / "declared.yaml", topic_manifest(DECLARED, 1))
    proc = ServeProcess(tmp_path / "data", tmp_path / "topics").start()
    try:
        admin = AdminClient({"bootstrap.servers": proc.bootstrap})
        assert codes(admin.create_topics([CNewTopic("grow", 1, 1), CNewTopic("gone", 1, 1)])) == {
            "grow": None, "gone": None}
        produce(proc.bootstrap, "grow", {0: 4})
        assert codes(admin.create_partitions([CNewPartitions("grow", 3)])) == {"grow": None}
        produce(proc.bootstrap, "grow", {2: 2})
        assert codes(admin.delete_topics(["gone"])) == {"gone": None}
        assert proc.terminate() == 0
        proc.start()
        admin = AdminClient({"bootstrap.servers": proc.bootstrap})
        counts = partition_counts(admin)
        assert counts["grow"] == 3 and "gone" not in counts
        ends = {p: r.result().offset for p, r in zip(range(3), admin.list_offsets(
            {confluent_kafka.TopicPartition("grow", p): OffsetSpec.latest() for p in range(3)}).values())}
        assert ends == {0: 4, 1: 0, 2: 2}
        assert topic_dirs(proc.data_dir, "gone") == []
    finally:
        if proc.proc.poll() is None:
            assert proc.terminate() == 0, proc.log()[-5000:]


def test_a_fetch_waiting_on_a_deleted_topic_answers_at_once_and_its_offsets_go(tmp_path):
    write_manifests(tmp_path / "topics" / "declared.yaml", topic_manifest(DECLARED, 1))
    with NodeThread(tmp_path / "data", tmp_path / "topics") as node:
        admin = KafkaAdminClient(bootstrap_servers=node.bootstrap, client_id="kp-admin-fetch")
        try:
            admin.create_topics([NewTopic("doomed", 1, 1)])
            assert admin.alter_group_offsets("watchers", {KTP("doomed", 0): OffsetAndMetadata(0, "", -1),
                                                          KTP(DECLARED, 0): OffsetAndMetadata(0, "", -1)})
            fetch = build(FetchRequest, {
                "replica_id": -1, "max_wait_ms": 2**31 - 1, "min_bytes": 1, "max_bytes": 1 << 20, "isolation_level": 0,
                "session_id": 0, "session_epoch": -1, "forgotten_topics_data": [], "rack_id": "",
                "topics": [{"topic": "doomed", "partitions": [{
                    "partition": 0, "current_leader_epoch": -1, "fetch_offset": 0, "log_start_offset": -1,
                    "partition_max_bytes": 1 << 20}]}]}, 12)
            answer: list = []
            waiter = threading.Thread(target=lambda: answer.append(call(node.node.broker.port, fetch, FetchResponse,
                                                                        timeout=100)))
            waiter.start()
            # The fetch is parked once the broker holds a wake-up event for its partition.
            wait_for(lambda: TopicPartition("doomed", 0) in node.node.broker.purgatory.events, what="the fetch to wait")
            assert [t["error_code"] for t in admin.delete_topics(["doomed"])["topics"]] == [0]
            waiter.join(60)  # a safety net: with a max wait of 24 days only the deletion can end the fetch
            assert not waiter.is_alive() and len(answer) == 1
            assert [(p.partition_index, p.error_code) for t in answer[0].responses for p in t.partitions] == [(0, 3)]
            # Kafka's onPartitionsDeleted: the group keeps only the offsets of topics that still exist.
            assert admin.list_group_offsets({"watchers": None})["watchers"] == {
                KTP(DECLARED, 0): OffsetAndMetadata(0, "", -1)}
        finally:
            admin.close()


# -- groups and consumer lag --------------------------------------------------------------------------------------


PRODUCED = {0: 10, 1: 7, 2: 4}  # records per partition of LAG_TOPIC
LAG_TOPIC = "lag-t"


def lag_with_confluent(admin: AdminClient) -> dict[str, dict[tuple[str, int], int]]:
    """What a lag exporter does: ListGroups -> DescribeGroups -> OffsetFetch -> ListOffsets."""
    listed = admin.list_consumer_groups().result(timeout=30)
    assert listed.errors == []
    groups = sorted(g.group_id for g in listed.valid)
    described = {g: f.result(timeout=30) for g, f in admin.describe_consumer_groups(groups).items()}
    assert all(d.group_id == g for g, d in described.items())
    committed = {}
    for g in groups:
        (future,) = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(g)]).values()
        committed[g] = {(tp.topic, tp.partition): tp.offset for tp in future.result(timeout=30).topic_partitions}
    wanted = {tp for offsets in committed.values() for tp in offsets}
    ends = {(tp.topic, tp.partition): f.result(timeout=30).offset for tp, f in admin.list_offsets(
        {confluent_kafka.TopicPartition(t, p): OffsetSpec.latest() for t, p in wanted}).items()}
    return {g: {tp: ends[tp] - offset for tp, offset in offsets.items()} for g, offsets in committed.items()}


def lag_with_kafka_python(admin: KafkaAdminClient) -> dict[str, dict[tuple[str, int], int]]:
    groups = sorted(g["group_id"] for g in admin.list_groups())
    described = admin.describe_groups(groups)
    assert sorted(described) == groups and all(d["error"] is None for d in described.values())
    committed = {g: {(tp.topic, tp.partition): om.offset for tp, om in offsets.items()}
                 for g, offsets in admin.list_group_offsets({g: None for g in groups}).items()}
    wanted = {tp for offsets in committed.values() for tp in offsets}
    ends = {(tp.topic, tp.partition): found.offset for tp, found in admin.list_partition_offsets(
        {KTP(t, p): KOffsetSpec.LATEST for t, p in wanted}).items()}
    return {g: {tp: ends[tp] - offset for tp, offset in offsets.items()} for g, offsets in committed.items()}


def test_groups_through_both_admin_clients_and_the_lag_they_compute(server, kp_admin):
    admin = AdminClient({"bootstrap.servers": server.bootstrap})
    assert codes(admin.create_topics([CNewTopic(LAG_TOPIC, 3, 1)])) == {LAG_TOPIC: None}
    produce(server.bootstrap, LAG_TOPIC, PRODUCED)
    model = {  # what each group commits: the expected lag is produced - committed
        "lag-live": {(LAG_TOPIC, 0): 6, (LAG_TOPIC, 1): 7, (LAG_TOPIC, 2): 1},
        "lag-simple": {(LAG_TOPIC, 0): 3},
        "lag-gone": {(LAG_TOPIC, 1): 2, (LAG_TOPIC, 2): 4},
    }
    # A live consumer group: subscribed, stable, committing exactly the model's offsets.
    consumer = confluent_kafka.Consumer({"bootstrap.servers": server.bootstrap, "group.id": "lag-live",
                                         "client.id": "lag-live-client", "enable.auto.commit": False,
                                         "auto.offset.reset": "earliest"})
    consumer.subscribe([LAG_TOPIC])
    try:
        wait_for(lambda: consumer.poll(0.2) is not None and len(consumer.assignment()) == 3, 30,
                 what="the consumer to get every partition")
        consumer.commit(offsets=[confluent_kafka.TopicPartition(t, p, o) for (t, p), o in model["lag-live"].items()],
                        asynchronous=False)
        # A standalone commit (no members) and a consumer that committed and left.
        assert kp_admin.alter_group_offsets("lag-simple", {KTP(LAG_TOPIC, 0): OffsetAndMetadata(3, "", -1)})
        gone = KafkaConsumer(LAG_TOPIC, bootstrap_servers=server.bootstrap, group_id="lag-gone",
                             enable_auto_commit=False)
        wait_for(lambda: gone.poll(timeout_ms=200) is not None and len(gone.assignment()) == 3, 30,
                 what="the second group's consumer to get every partition")
        gone.commit({KTP(t, p): OffsetAndMetadata(o, "", -1) for (t, p), o in model["lag-gone"].items()})
        gone.close()

        expected = {g: {tp: PRODUCED[tp[1]] - o for tp, o in offsets.items()} for g, offsets in model.items()}
        assert lag_with_confluent(admin) == expected
        assert lag_with_kafka_python(kp_admin) == expected

        # ListGroups with a states filter, both clients.
        stable = admin.list_consumer_groups(states={ConsumerGroupState.STABLE}).result(timeout=30)
        assert [(g.group_id, g.state) for g in stable.valid] == [("lag-live", ConsumerGroupState.STABLE)]
        empty = admin.list_consumer_groups(states={ConsumerGroupState.EMPTY}).result(timeout=30)
        assert sorted((g.group_id, g.is_simple_consumer_group) for g in empty.valid) == [
            ("lag-gone", False), ("lag-simple", True)]
        assert [g["group_id"] for g in kp_admin.list_groups(states_filter=["Stable"])] == ["lag-live"]

        # DescribeGroups: the live member, its client id and its assignment.
        live = admin.describe_consumer_groups(["lag-live"])["lag-live"].result(timeout=30)
        assert (live.state, live.partition_assignor, live.is_simple_consumer_group) == (
            ConsumerGroupState.STABLE, "range", False)
        (member,) = live.members
        assert member.client_id == "lag-live-client" and member.host.endswith("127.0.0.1")
        assert sorted(tp.partition for tp in member.assignment.topic_partitions) == [0, 1, 2]
        (kp_live,) = kp_admin.describe_groups(["lag-live"]).values()
        assert kp_live["group_state"] == "Stable" and kp_live["protocol_data"] == "range"
        assert kp_live["members"][0]["member_assignment"]["assigned_partitions"] == [
            {"topic": LAG_TOPIC, "partitions": [0, 1, 2]}]

        # A live group cannot be deleted, nor the offsets of a topic it reads.
        assert codes(admin.delete_consumer_groups(["lag-live"])) == {"lag-live": 68}  # NON_EMPTY_GROUP
        assert kp_admin.delete_group_offsets("lag-live", [KTP(LAG_TOPIC, 0)]) == {
            KTP(LAG_TOPIC, 0): GroupSubscribedToTopicError}
    finally:
        consumer.close()

    # Once the consumer has left: offsets of one partition, then the whole group, go.
    wait_for(lambda: admin.describe_consumer_groups(["lag-live"])["lag-live"].result(timeout=30).state
             == ConsumerGroupState.EMPTY, what="the group to be empty")
    assert kp_admin.delete_group_offsets("lag-live", [KTP(LAG_TOPIC, 2)]) == {
        KTP(LAG_TOPIC, 2): NoError}
    del expected["lag-live"][(LAG_TOPIC, 2)]
    assert lag_with_kafka_python(kp_admin) == expected
    assert codes(admin.delete_consumer_groups(["lag-live", "lag-gone", "no-such-group"])) == {
        "lag-live": None, "lag-gone": None, "no-such-group": 69}
    del expected["lag-live"], expected["lag-gone"]
    assert lag_with_confluent(admin) == expected
    assert kp_admin.describe_groups(["lag-gone"])["lag-gone"]["error"].startswith("[Error 69]")


# -- FindCoordinator with a null key ------------------------------------------------------------------------------


def test_find_coordinator_with_a_null_key_is_answered_and_the_connection_kept(server):
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        sock.sendall(request_frame(build(FindCoordinatorRequest, {"key": None, "key_type": 0}, 3), 1))
        resp = FindCoordinatorResponse.decode(read_frame(sock), version=3, header=True)
        assert (resp.error_code, resp.node_id) == (24, -1)  # INVALID_GROUP_ID
        sock.sendall(request_frame(build(FindCoordinatorRequest, {"key": "g", "key_type": 0}, 3), 2))
        resp = FindCoordinatorResponse.decode(read_frame(sock), version=3, header=True)
        assert (resp.header.correlation_id, resp.error_code, resp.port) == (2, 0, server.port)


# -- DescribeCluster and DescribeLogDirs --------------------------------------------------------------------------


def test_describe_cluster_names_the_node_like_metadata(server, kp_admin):
    cluster = kp_admin.describe_cluster()
    assert (cluster["cluster_id"], cluster["controller_id"]) == ("shale", 0)
    assert cluster["brokers"] == [{"broker_id": 0, "host": "127.0.0.1", "port": server.port, "rack": None,
                                   "is_fenced": False}]
    admin = AdminClient({"bootstrap.servers": server.bootstrap})
    described = admin.describe_cluster(include_authorized_operations=True).result(timeout=30)
    assert (described.cluster_id, described.controller.id, [n.port for n in described.nodes]) == (
        "shale", 0, [server.port])
    # No authorizer: every operation the resource supports, as Kafka answers (DescribeCluster and Metadata).
    everything = {"CREATE", "ALTER", "DESCRIBE", "CLUSTER_ACTION", "DESCRIBE_CONFIGS", "ALTER_CONFIGS",
                  "IDEMPOTENT_WRITE"}
    assert set(cluster["authorized_operations"]) == everything
    assert {op.name for op in described.authorized_operations} == everything
    (topic,) = admin.describe_topics(confluent_kafka.TopicCollection([DECLARED]),
                                     include_authorized_operations=True).values()
    assert {op.name for op in topic.result(timeout=30).authorized_operations} == {
        "READ", "WRITE", "CREATE", "DESCRIBE", "DELETE", "ALTER", "DESCRIBE_CONFIGS", "ALTER_CONFIGS"}
    # A node is a broker endpoint: asking it for the controllers is refused as Kafka refuses it.
    resp = call(server.port, build(DescribeClusterRequest, {"include_cluster_authorized_operations": False,
                                                            "endpoint_type": 2}, 1), DescribeClusterResponse)
    assert (resp.error_code, resp.error_message) == (
        114, "The request was sent to an endpoint of type BROKER, but we wanted an endpoint of type CONTROLLER")
    resp = call(server.port, build(DescribeClusterRequest, {"include_cluster_authorized_operations": False,
                                                            "endpoint_type": 7}, 2), DescribeClusterResponse)
    assert (resp.error_code, resp.error_message) == (115, "Unsupported endpoint type 7")


def test_describe_log_dirs_reports_each_partitions_size_on_disk(server, kp_admin):
    kp_admin.create_topics([NewTopic("sized", 2, 1)])
    produce(server.bootstrap, "sized", {0: 5, 1: 1})
    (broker,) = kp_admin.describe_log_dirs()
    (log_dir,) = broker["log_dirs"]
    assert (log_dir["error_code"], log_dir["log_dir"]) == (0, os.path.abspath(server.data_dir))
    assert 0 < log_dir["usable_bytes"] <= log_dir["total_bytes"]
    sizes = {(t["name"], p["partition_index"]): (p["partition_size"], p["offset_lag"], p["is_future_key"])
             for t in log_dir["topics"] for p in t["partitions"]}
    for p in (0, 1):
        on_disk = sum(f.stat().st_size for f in partition_dir(server.data_dir, "sized", p).glob("*.log"))
        assert on_disk > 0 and sizes[("sized", p)] == (on_disk, 0, False)
    assert ("__consumer_offsets", 0) in sizes and (DECLARED, 1) in sizes
    # Only what was asked for.
    (broker,) = kp_admin.describe_log_dirs({"sized": [1]})
    assert [(t["name"], [p["partition_index"] for p in t["partitions"]]) for t in broker["log_dirs"][0]["topics"]] == [
        ("sized", [1])]


def test_a_two_node_cluster_describes_itself_alike_and_changes_topics_on_the_controller(tmp_path):
    servers = start_cluster(tmp_path, "spread", [0, 1, 1, 0])
    ports = {n: s.port for n, s in enumerate(servers)}
    admin = KafkaAdminClient(bootstrap_servers=servers[1].bootstrap, client_id="kp-admin-cluster")
    try:
        for s in servers:  # every node names both nodes and the same controller, as Metadata does
            resp = call(s.port, build(DescribeClusterRequest, {"include_cluster_authorized_operations": False,
                                                               "endpoint_type": 1}, 1), DescribeClusterResponse)
            assert (resp.error_code, resp.controller_id) == (0, 0)
            assert [(b.broker_id, b.port) for b in resp.brokers] == [(0, ports[0]), (1, ports[1])]
            resp = call(s.port, build(DescribeLogDirsRequest, {"topics": [{"topic": "spread",
                                                                         "partitions": [0, 1, 2, 3]}]}, 4),
                        DescribeLogDirsResponse)
            held = [p.partition_index for r in resp.results for t in r.topics for p in t.partitions]
            assert held == ([0, 3] if s is servers[0] else [1, 2])  # each node describes its own partitions

        # kafka-python sends topic changes to the controller (node 0), whichever node it was given.
        admin.create_topics([NewTopic("made", 1, 1)])
        assert [r.error_code for r in admin.create_partitions({"made": NewPartitions(2)}).results] == [0]
        assert topic_dirs(str(tmp_path / "data0"), "made") == ["made-0", "made-1"]
        assert topic_dirs(str(tmp_path / "data1"), "made") == []
        result = admin.delete_topics(["spread", "made"], raise_errors=False)
        assert sorted((t["name"], t["error_code"]) for t in result["topics"]) == [("made", 0), ("spread", 44)]
        assert topic_dirs(str(tmp_path / "data0"), "made") == []

        # Groups live on the coordinator (node 0): the other node lists none.
        assert admin.alter_group_offsets("spread-readers", {KTP("spread", 1): OffsetAndMetadata(0, "", -1)})
        listed = {n: [g.group_id for g in call(s.port, build(ListGroupsRequest, {"states_filter": []}, 4),
                                                ListGroupsResponse).groups] for n, s in zip(ports, servers)}
        assert listed == {0: ["spread-readers"], 1: []}
    finally:
        admin.close()
        for s in servers:
            assert s.terminate() == 0


# -- the API table of docs/kafka-apis.md --------------------------------------------------------------------------


def test_the_api_table_is_what_the_node_advertises(server):
    resp = call(server.port, ApiVersionsRequest(version=3, client_software_name="doc-check",
                                                client_software_version="1"), ApiVersionsResponse)
    advertised = {k.api_key: (k.min_version, k.max_version) for k in resp.api_keys}
    documented = {}
    for key, name, lo, hi in re.findall(r"^\| (\d+) \| (\w+) \| (\d+)(?:-(\d+))? \|", DOC.read_text(), re.M):
        documented[int(key)] = (int(lo), int(hi or lo))
        assert API_NAMES[int(key)] == name, f"docs/kafka-apis.md names API key {key} {name}"
    assert documented == advertised, "docs/kafka-apis.md's table differs from the node's ApiVersions"

