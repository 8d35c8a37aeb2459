"""Transactions end to end: confluent-kafka's transactional producer against a real `shale serve`, read back by
read_committed consumers; zombies, killed clients and a SIGKILLed coordinator node (docs/transactions.md)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
import time

import confluent_kafka
import pytest
from aiokafka import AIOKafkaProducer
from kafka.protocol.admin.transactions import (
    DescribeTransactionsRequest,
    DescribeTransactionsResponse,
    ListTransactionsRequest,
    ListTransactionsResponse,
)
from kafka.protocol.consumer.offsets import ListOffsetsRequest, ListOffsetsResponse
from kafka.protocol.producer.transaction import InitProducerIdRequest, InitProducerIdResponse

from shale.sidecar.security.acl import (
    AccessControlEntry,
    AclBinding,
    AclOperation,
    AclPermissionType,
    PatternType,
    ResourcePattern,
    ResourceType,
)
from shale.sidecar.security.authorizer import Authorizer
from shale.sidecar.security.store import SecurityStore
from support.clients_util import build, call, stored_batches
from support.node_util import ServeProcess, topic_manifest, wait_for, write_manifests
from support.txn_util import read_to_end

TOPIC = "txn-out"
READ_UNCOMMITTED, READ_COMMITTED = 0, 1


@pytest.fixture
def node(tmp_path):
    topics = write_manifests(tmp_path / "topics", topic_manifest(TOPIC, partitions=2))
    with ServeProcess(tmp_path / "data", topics, "--override",
                      "transaction.abort.timed.out.transaction.cleanup.interval.ms=200") as proc:
        yield proc


def producer(bootstrap: str, transactional_id: str, **extra) -> confluent_kafka.Producer:
    p = confluent_kafka.Producer({"bootstrap.servers": bootstrap, "transactional.id": transactional_id, **extra})
    p.init_transactions(30)
    return p


def transaction(p: confluent_kafka.Producer, values: list[bytes], commit: bool) -> None:
    p.begin_transaction()
    for i, v in enumerate(values):
        p.produce(TOPIC, v, partition=i % 2)
    if commit:
        p.commit_transaction(30)
    else:
        p.flush(30)  # written before the abort (librdkafka drops what it has not sent)
        p.abort_transaction(30)


def read(bootstrap: str, isolation: str = "read_committed") -> list[bytes]:
    """Every value of both partitions up to their ends (the LSO for read_committed), in offset order per partition."""
    return [value for _, value in read_to_end(bootstrap, TOPIC, 2, isolation, timeout=30).values()]


def latest(port: int, isolation: int, partition: int = 0) -> int:
    req = build(ListOffsetsRequest, {"replica_id": -1, "isolation_level": isolation, "topics": [
        {"name": TOPIC, "partitions": [{"partition_index": partition, "timestamp": -1}]}]}, 5)
    [part] = call(port, req, ListOffsetsResponse).topics[0].partitions
    assert part.error_code == 0
    return part.offset


def init_raw(port: int, transactional_id: str, timeout_ms: int = 60000) -> tuple[int, int, int]:
    resp = call(port, build(InitProducerIdRequest, {"transactional_id": transactional_id,
                                                    "transaction_timeout_ms": timeout_ms, "producer_id": -1,
                                                    "producer_epoch": -1}, 4), InitProducerIdResponse)
    return resp.error_code, resp.producer_id, resp.producer_epoch


def describe(port: int, transactional_id: str):
    resp = call(port, build(DescribeTransactionsRequest, {"transactional_ids": [transactional_id]}, 0),
                DescribeTransactionsResponse)
    return resp.transaction_states[0]


def test_committed_transactions_are_visible_and_aborted_ones_are_not(node):
    p = producer(node.bootstrap, "app-1")
    transaction(p, [b"a", b"b"], commit=True)
    transaction(p, [b"x", b"y"], commit=False)
    transaction(p, [b"c"], commit=True)
    assert sorted(read(node.bootstrap)) == [b"a", b"b", b"c"]
    assert sorted(read(node.bootstrap, "read_uncommitted")) == [b"a", b"b", b"c", b"x", b"y"]
    # Each transaction ended with a marker in both of its partitions, written by the coordinator.
    markers = [b for b in stored_batches(node.data_dir, TOPIC, 0) if b.header.is_control]
    assert len(markers) == 3
    state = describe(node.port, "app-1")
    assert (state.error_code, state.transaction_state, state.producer_epoch) == (0, "CompleteCommit", 0)
    assert init_raw(node.port, "app-x", timeout_ms=900_001) == (50, -1, -1)  # INVALID_TRANSACTION_TIMEOUT
    assert describe(node.port, "app-x").error_code == 105  # TRANSACTIONAL_ID_NOT_FOUND: nothing was created


def test_zombie_producer_is_fenced(node):
    old = producer(node.bootstrap, "app-2")
    old.begin_transaction()
    old.produce(TOPIC, b"zombie", partition=0)
    old.flush(10)
    new = producer(node.bootstrap, "app-2")  # fences the old instance and aborts its transaction
    with pytest.raises(confluent_kafka.KafkaException) as raised:
        old.commit_transaction(30)
    assert raised.value.args[0].code() in (confluent_kafka.KafkaError._FENCED, confluent_kafka.KafkaError.PRODUCER_FENCED,
                                           confluent_kafka.KafkaError.INVALID_PRODUCER_EPOCH), raised.value
    transaction(new, [b"fresh"], commit=True)
    assert read(node.bootstrap) == [b"fresh"]
    assert describe(node.port, "app-2").producer_epoch == 2  # 0, fenced at 1 (the abort), then 2


CLIENT = textwrap.dedent("""
    import sys, time, confluent_kafka
    p = confluent_kafka.Producer({"bootstrap.servers": sys.argv[1], "transactional.id": sys.argv[2],
                                  "transaction.timeout.ms": int(sys.argv[3])})
    p.init_transactions(30)
    p.begin_transaction()
    p.produce(%r, b"lost", partition=0)
    p.flush(10)
    print("sent", flush=True)
    time.sleep(600)
""" % TOPIC)


def killed_client(bootstrap: str, transactional_id: str, timeout_ms: int = 60000) -> None:
    """A client process that opens a transaction, writes to it, and is SIGKILLed."""
    proc = subprocess.Popen([sys.executable, "-c", CLIENT, bootstrap, transactional_id, str(timeout_ms)],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "sent"
    finally:
        proc.kill()
        proc.wait()


def test_restarted_client_aborts_its_predecessors_transaction(node):
    killed_client(node.bootstrap, "app-3")
    assert latest(node.port, READ_COMMITTED) < latest(node.port, READ_UNCOMMITTED)  # the open transaction holds the LSO
    p = producer(node.bootstrap, "app-3")
    transaction(p, [b"after"], commit=True)
    assert read(node.bootstrap) == [b"after"]
    assert latest(node.port, READ_COMMITTED) == latest(node.port, READ_UNCOMMITTED)


def test_client_killed_mid_transaction_is_aborted_on_timeout(node):
    killed_client(node.bootstrap, "app-4", timeout_ms=1000)
    wait_for(lambda: latest(node.port, READ_COMMITTED) == latest(node.port, READ_UNCOMMITTED), 30,
             what="the coordinator to abort the timed-out transaction")
    assert read(node.bootstrap) == []
    state = describe(node.port, "app-4")
    assert (state.transaction_state, state.producer_epoch) == ("CompleteAbort", 1)  # fenced by the abort


def test_coordinator_state_survives_sigkill(tmp_path):
    topics = write_manifests(tmp_path / "topics", topic_manifest(TOPIC, partitions=2))
    proc = ServeProcess(tmp_path / "data", topics).start()
    try:
        p = producer(proc.bootstrap, "app-5")
        transaction(p, [b"one"], commit=True)
        killed_client(proc.bootstrap, "app-6")  # leaves an Ongoing transaction in __transaction_state
        err, pid, epoch = init_raw(proc.port, "app-5")
        assert err == 0
        proc.kill()
        proc = ServeProcess(tmp_path / "data", topics, port=proc.port).start()
        assert init_raw(proc.port, "app-5") == (0, pid, epoch + 1)  # the same id and the next epoch: loaded
        # The Ongoing transaction of app-6 is still open after the restart, and the next instance aborts it.
        assert describe(proc.port, "app-6").transaction_state == "Ongoing"
        transaction(producer(proc.bootstrap, "app-6"), [b"two"], commit=True)
        assert sorted(read(proc.bootstrap)) == [b"one", b"two"]
        listed = call(proc.port, build(ListTransactionsRequest, {"state_filters": [], "producer_id_filters": []}, 0),
                      ListTransactionsResponse)
        assert sorted((t.transactional_id, t.transaction_state) for t in listed.transaction_states) == [
            ("app-5", "Empty"), ("app-6", "CompleteCommit")]
    finally:
        proc.kill()


def test_consume_transform_produce_commits_offsets_with_the_output(tmp_path):
    topics = write_manifests(tmp_path / "topics", topic_manifest(TOPIC, partitions=2), topic_manifest("txn-in"))
    with ServeProcess(tmp_path / "data", topics) as proc:
        plain = confluent_kafka.Producer({"bootstrap.servers": proc.bootstrap})
        for i in range(10):
            plain.produce("txn-in", str(i).encode(), partition=0)
        plain.flush(30)
        consumer = confluent_kafka.Consumer({"bootstrap.servers": proc.bootstrap, "group.id": "eos",
                                             "isolation.level": "read_committed", "enable.auto.commit": False,
                                             "auto.offset.reset": "earliest"})
        consumer.subscribe(["txn-in"])
        p = producer(proc.bootstrap, "eos-1")

        def step(count: int, commit: bool) -> None:
            msgs: list = []
            deadline = time.monotonic() + 30
            while len(msgs) < count:
                assert time.monotonic() < deadline, f"read {len(msgs)} of {count} inputs"
                msgs += [m for m in consumer.consume(count - len(msgs), 0.5) if not m.error()]
            p.begin_transaction()
            for m in msgs:
                p.produce(TOPIC, b"out-" + m.value(), partition=0)
            p.send_offsets_to_transaction(consumer.position(consumer.assignment()),
                                          consumer.consumer_group_metadata(), 30)
            if commit:
                p.commit_transaction(30)
            else:
                p.flush(30)
                p.abort_transaction(30)

        def committed() -> int:
            [tp] = consumer.committed([confluent_kafka.TopicPartition("txn-in", 0)], 30)
            return tp.offset

        step(6, commit=True)
        assert committed() == 6
        step(4, commit=False)  # the offsets of an aborted transaction never become visible
        assert committed() == 6
        consumer.close()
        assert read(proc.bootstrap) == [b"out-%d" % i for i in range(6)]
        # After a SIGKILL the group coordinator replays the transactional offset batches with their markers.
        proc.kill()
        proc.start()
        fresh = confluent_kafka.Consumer({"bootstrap.servers": proc.bootstrap, "group.id": "eos"})
        try:
            [tp] = fresh.committed([confluent_kafka.TopicPartition("txn-in", 0)], 30)
            assert tp.offset == 6
        finally:
            fresh.close()


def test_list_and_describe_transactions_follow_the_acls(tmp_path):
    topics = write_manifests(tmp_path / "topics", topic_manifest(TOPIC, partitions=2))
    with ServeProcess(tmp_path / "data", topics) as proc:
        for tid in ("visible", "hidden"):
            assert init_raw(proc.port, tid)[0] == 0
        assert proc.terminate() == 0
    store = SecurityStore.open(str(tmp_path / "data"), Authorizer())
    store.create_acls([AclBinding(ResourcePattern(ResourceType.TRANSACTIONAL_ID, "visible", PatternType.LITERAL),
                                  AccessControlEntry("User:ANONYMOUS", "*", AclOperation.DESCRIBE,
                                                     AclPermissionType.ALLOW))])
    with ServeProcess(tmp_path / "data", topics, "--override", "authorizer.class.name=shale") as proc:
        listed = call(proc.port, build(ListTransactionsRequest, {"state_filters": ["Empty", "Nonsense"],
                                                                 "producer_id_filters": []}, 1),
                      ListTransactionsResponse)
        assert [(t.transactional_id, t.transaction_state) for t in listed.transaction_states] == [("visible", "Empty")]
        assert listed.unknown_state_filters == ["Nonsense"]
        assert describe(proc.port, "hidden").error_code == 53  # TRANSACTIONAL_ID_AUTHORIZATION_FAILED
        assert describe(proc.port, "visible").error_code == 0


def test_aiokafka_transactions(node):
    async def run() -> None:
        p = AIOKafkaProducer(bootstrap_servers=node.bootstrap, transactional_id="aio-1")
        await p.start()
        try:
            async with p.transaction():
                await p.send_and_wait(TOPIC, b"aio-kept", partition=1)
            await p.begin_transaction()
            await p.send_and_wait(TOPIC, b"aio-dropped", partition=1)
            await p.abort_transaction()
        finally:
            await p.stop()

    asyncio.run(run())
    assert read(node.bootstrap) == [b"aio-kept"]
    assert sorted(read(node.bootstrap, "read_uncommitted")) == [b"aio-dropped", b"aio-kept"]
