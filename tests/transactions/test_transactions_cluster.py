"""Transactions on a replicated cluster: three `shale serve --store etcd://…` processes, confluent-kafka's
transactional producer and read_committed consumers (docs/transactions.md, "Replicated like any topic",
"Markers", and the Failures table's coordinator rows). The coordinator of a transactional id is the leader of
its `__transaction_state` partition; the markers reach the other nodes' partition leaders by WriteTxnMarkers."""

from __future__ import annotations

import threading

import confluent_kafka
import pytest
from kafka.protocol.admin.transactions import DescribeTransactionsRequest, DescribeTransactionsResponse
from kafka.protocol.producer.transaction import (
    InitProducerIdRequest,
    InitProducerIdResponse,
    WriteTxnMarkersRequest,
    WriteTxnMarkersResponse,
)

from shale.sidecar.log.records import decode_batch, parse_control_key, parse_end_txn_marker
from shale.sidecar.security.acl import (
    CLUSTER_NAME,
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
from support.node_util import (
    ReplicatedCluster,
    ServeProcess,
    start_replicated_cluster,
    topic_manifest,
    wait_for,
    write_manifests,
)
from support.txn_util import read_to_end

TOPIC = "txn-out"
SOLO = "solo"  # one replica per partition, partition n on node n: a marker to it waits for that node
STATE = "__transaction_state"
OVERRIDES = ("--override", "transaction.state.log.num.partitions=1",  # every id on partition 0
             "--override", "transaction.abort.timed.out.transaction.cleanup.interval.ms=200")
TRANSACTION_COORDINATOR_FENCED = 52
NOT_COORDINATOR = 16
CLUSTER_AUTHORIZATION_FAILED = 31


def cluster_of(tmp_path, etcd, *extra: str, solo: bool = False) -> ReplicatedCluster:
    topics = [topic_manifest(TOPIC, 3, replicas=3)]
    if solo:
        topics.append(topic_manifest(SOLO, 3, assignment={"partitions": [[0], [1], [2]]}))
    return start_replicated_cluster(tmp_path, etcd, 3, *topics, extra=(*OVERRIDES, *extra))


def transactional(cluster: ReplicatedCluster, transactional_id: str) -> confluent_kafka.Producer:
    p = confluent_kafka.Producer({"bootstrap.servers": cluster.bootstrap, "transactional.id": transactional_id,
                                  "transaction.timeout.ms": 60000, "message.timeout.ms": 60000})
    p.init_transactions(60)
    return p


class Acks:
    """Delivery reports: (topic, partition, offset, value) of every acknowledged record."""

    def __init__(self) -> None:
        self.acked: list[tuple[str, int, int, bytes]] = []
        self.errors: list = []

    @classmethod
    def of(cls, *many: "Acks") -> "Acks":
        """Every acknowledgement of several producers together."""
        out = cls()
        for acks in many:
            out.acked += acks.acked
            out.errors += acks.errors
        return out

    def __call__(self, err, msg) -> None:
        if err is not None:
            self.errors.append(err)
        else:
            self.acked.append((msg.topic(), msg.partition(), msg.offset(), msg.value()))


def produce(p: confluent_kafka.Producer, acks: Acks, topic: str, values: list[bytes], partitions: list[int]) -> None:
    for i, v in enumerate(values):
        p.produce(topic, v, partition=partitions[i % len(partitions)], on_delivery=acks)
    assert p.flush(60) == 0
    assert acks.errors == []


def read(cluster: ReplicatedCluster, topic: str, partitions: int, isolation: str = "read_committed"
         ) -> dict[tuple[int, int], bytes]:
    """(partition, offset) -> value of every record up to each partition's end (the LSO for read_committed)."""
    return {at: value for at, (_, value) in read_to_end(cluster.bootstrap, topic, partitions, isolation).items()}


def committed_exactly(cluster: ReplicatedCluster, topic: str, partitions: int, acks: Acks,
                      committed: set[bytes]) -> None:
    """Every acknowledged record of a committed transaction is read_committed at its acknowledged offset, once;
    no other record of the topic (aborted ones, markers) is."""
    got = read(cluster, topic, partitions)
    want = {(p, o): v for t, p, o, v in acks.acked if t == topic and v in committed}
    assert got == want, (f"{topic}: read_committed differs from the committed acknowledgements: missing "
                         f"{sorted(set(want) - set(got))[:5]}, extra {sorted(set(got) - set(want))[:5]}")


def markers(cluster: ReplicatedCluster, node: int, topic: str, partition: int) -> list[tuple[int, str, int]]:
    """(producer id, COMMIT/ABORT, coordinator epoch) of each marker in a replica's log, in log order."""
    out = []
    for header, raw in cluster.batches(node, topic, partition):
        if header.is_control:
            (record,) = decode_batch(raw).records
            out.append((header.producer_id, parse_control_key(record.key).name, parse_end_txn_marker(record.value)))
    return out


def describe(cluster: ReplicatedCluster, node: int, transactional_id: str):
    resp = call(cluster.servers[node].port, build(DescribeTransactionsRequest,
                                                  {"transactional_ids": [transactional_id]}, 0),
                DescribeTransactionsResponse)
    (state,) = resp.transaction_states
    return state


def in_sync(cluster: ReplicatedCluster) -> None:
    """Every replica of the state partition and of TOPIC in its ISR: a node SIGKILLed next leaves an ISR member
    to elect (a node slowed past its session by a loaded machine drops out of the ISR for a while)."""
    for topic, partitions in ((STATE, 1), (TOPIC, 3)):
        for q in range(partitions):
            cluster.wait_for_isr(topic, q)


def coordinator(cluster: ReplicatedCluster, excluding: tuple[int, ...] = (), newer_than: int = -1):
    """The leader of `__transaction_state`-0 (every id's coordinator here) as every running node sees it."""
    return cluster.wait_for_leader(STATE, 0, excluding=excluding, newer_than=newer_than, timeout=60)


def test_transactions_over_leaders_on_every_node_commit_and_abort_for_read_committed_readers(tmp_path, etcd):
    cluster = cluster_of(tmp_path, etcd)
    try:
        p = transactional(cluster, "spread")
        state = coordinator(cluster)
        assert sorted(state.replicas) == [0, 1, 2]  # transaction.state.log.replication.factor 3
        leaders = {q: s.leader for q, s in cluster.metadata(TOPIC).items()}
        assert set(leaders.values()) == {0, 1, 2}, f"the partitions' leaders should be on every node: {leaders}"

        acks = Acks()
        batches = {"a": True, "b": False, "c": True, "d": False}  # commit or abort, in this order
        for name, commit in batches.items():
            p.begin_transaction()
            produce(p, acks, TOPIC, [b"%s%d" % (name.encode(), i) for i in range(9)], [0, 1, 2])
            p.commit_transaction(60) if commit else p.abort_transaction(60)
        committed = {v for _, _, _, v in acks.acked if v[:1] in (b"a", b"c")}
        assert len(committed) == 18 and len(acks.acked) == 36
        committed_exactly(cluster, TOPIC, 3, acks, committed)
        assert len(read(cluster, TOPIC, 3, "read_uncommitted")) == 36  # aborted data is in the logs, hidden

        # Every replica of every partition holds the four markers, in order, with the coordinator epoch: the
        # state partition's leader epoch. Two partitions are led by nodes other than the coordinator: their
        # markers came by WriteTxnMarkers.
        described = describe(cluster, state.leader, "spread")
        assert described.transaction_state == "CompleteAbort"
        pid = described.producer_id
        want = [(pid, "COMMIT", state.leader_epoch), (pid, "ABORT", state.leader_epoch)] * 2
        for q in range(3):
            for node in range(3):
                wait_for(lambda: markers(cluster, node, TOPIC, q) == want, 30,
                         what=f"node {node}'s replica of {TOPIC}-{q} to hold the four markers")

        # A marker from a coordinator of an older epoch is refused by the partition's leader.
        other = next(q for q, leader in leaders.items() if leader != state.leader)
        resp = call(cluster.servers[leaders[other]].port, build(WriteTxnMarkersRequest, {"markers": [
            {"producer_id": pid, "producer_epoch": described.producer_epoch, "transaction_result": True,
             "coordinator_epoch": state.leader_epoch - 1, "topics": [{"name": TOPIC, "partition_indexes": [other]}]}]},
            1), WriteTxnMarkersResponse)
        assert resp.markers[0].topics[0].partitions[0].error_code == TRANSACTION_COORDINATOR_FENCED
        assert markers(cluster, leaders[other], TOPIC, other) == want

        # Only the state partition's leader coordinates: the others send the producer there.
        for node in {0, 1, 2} - {state.leader}:
            init = call(cluster.servers[node].port, build(InitProducerIdRequest, {
                "transactional_id": "spread", "transaction_timeout_ms": 60000, "producer_id": -1,
                "producer_epoch": -1}, 4), InitProducerIdResponse)
            assert init.error_code == NOT_COORDINATOR
        p.flush(10)
    finally:
        cluster.stop()


def test_coordinator_killed_while_ongoing(tmp_path, etcd):
    """The coordinator's node is SIGKILLed with a transaction open: a state replica is elected, loads the
    Ongoing transaction, and the producer finds it and commits; read_committed readers see it exactly once."""
    cluster = cluster_of(tmp_path, etcd)
    try:
        p = transactional(cluster, "survivor")
        acks = Acks()
        p.begin_transaction()
        produce(p, acks, TOPIC, [b"before%d" % i for i in range(12)], [0, 1, 2])
        in_sync(cluster)
        old = coordinator(cluster)
        cluster.kill(old.leader)
        new = coordinator(cluster, excluding=(old.leader,), newer_than=old.leader_epoch)
        loaded = wait_for(lambda: (lambda s: s if s.error_code == 0 else None)(
            describe(cluster, new.leader, "survivor")), 30, what="the new coordinator to load the transaction")
        assert loaded.transaction_state == "Ongoing"
        assert sorted(t.topic for t in loaded.topics) == [TOPIC]
        produce(p, acks, TOPIC, [b"after%d" % i for i in range(12)], [0, 1, 2])
        p.commit_transaction(60)
        assert describe(cluster, new.leader, "survivor").transaction_state == "CompleteCommit"
        assert len(acks.acked) == 24
        committed_exactly(cluster, TOPIC, 3, acks, {v for *_, v in acks.acked})

        cluster.restart(old.leader)  # back as a follower: it replays nothing of the others' state
        p.begin_transaction()
        produce(p, acks, TOPIC, [b"later%d" % i for i in range(3)], [0, 1, 2])
        p.commit_transaction(60)
        committed_exactly(cluster, TOPIC, 3, acks, {v for *_, v in acks.acked})
    finally:
        cluster.stop()


def test_coordinator_killed_after_prepare_commit(tmp_path, etcd):
    """PrepareCommit is written and some markers are, but one partition has no leader (its only replica's node
    is SIGKILLed); the coordinator is SIGKILLed then. The state replica elected in its place loads PrepareCommit
    and sends every marker again; once the partition's node is back its marker is written, and CompleteCommit."""
    coordinator_killed_after_prepare(tmp_path, etcd, commit=True)


def test_coordinator_killed_after_prepare_abort(tmp_path, etcd):
    """As above with PrepareAbort: every partition gets its ABORT marker, read_committed readers see nothing."""
    coordinator_killed_after_prepare(tmp_path, etcd, commit=False)


def coordinator_killed_after_prepare(tmp_path, etcd, commit: bool) -> None:
    outcome, prepare = ("COMMIT", "Commit") if commit else ("ABORT", "Abort")
    cluster = cluster_of(tmp_path, etcd, "--override", "transaction.state.log.replication.factor=2",
                         "--override", "transaction.state.log.min.isr=1", solo=True)
    try:
        p = transactional(cluster, "prepared")
        first = coordinator(cluster)
        assert len(first.replicas) == 2
        (away,) = {0, 1, 2} - set(first.replicas)  # holds no state replica: Prepare* does not wait for it
        acks = Acks()
        p.begin_transaction()
        produce(p, acks, SOLO, [b"solo%d" % i for i in range(6)], [0, 1, 2])
        produce(p, acks, TOPIC, [b"out%d" % i for i in range(6)], [0, 1, 2])
        in_sync(cluster)
        cluster.kill(away)
        # Answered after Prepare* (markers still going).
        p.commit_transaction(60) if commit else p.abort_transaction(60)
        prepared = describe(cluster, first.leader, "prepared")
        assert prepared.transaction_state == f"Prepare{prepare}"
        pid = prepared.producer_id
        # The markers to the partitions with a leader are written; solo-<away> has none.
        for q in {0, 1, 2} - {away}:
            wait_for(lambda: [m[:2] for m in markers(cluster, q, SOLO, q)] == [(pid, outcome)], 30,
                     what=f"the {outcome} marker in {SOLO}-{q}")
        assert markers(cluster, away, SOLO, away) == []

        cluster.wait_for_isr(STATE, 0)
        cluster.kill(first.leader)
        second = coordinator(cluster, excluding=(first.leader, away), newer_than=first.leader_epoch)
        loaded = wait_for(lambda: (lambda s: s if s.error_code == 0 else None)(
            describe(cluster, second.leader, "prepared")), 30, what="the new coordinator to load the transaction")
        assert loaded.transaction_state == f"Prepare{prepare}"  # loaded, its markers waiting for both nodes
        cluster.restart(away)
        cluster.restart(first.leader)
        wait_for(lambda: describe(cluster, second.leader, "prepared").transaction_state == f"Complete{prepare}", 60,
                 what=f"Complete{prepare} once every partition has its marker")
        # solo-<away> has its marker now, from the second coordinator (its leader epoch); the partitions that
        # had one from the first may have a second, harmless one.
        assert markers(cluster, away, SOLO, away) == [(pid, outcome, second.leader_epoch)]
        kept = {v for *_, v in acks.acked} if commit else set()
        committed_exactly(cluster, SOLO, 3, acks, kept)
        committed_exactly(cluster, TOPIC, 3, acks, kept)
        assert len(read(cluster, SOLO, 3, "read_uncommitted")) == 6
        p.flush(10)
    finally:
        cluster.stop()


def test_coordinator_killed_while_fencing(tmp_path, etcd):
    """A new instance of a producer whose transaction is open fences it: its InitProducerId makes the coordinator
    write PrepareAbort at epoch + 1 (Kafka's PrepareEpochFence, never written as such). The ABORT marker of one
    partition cannot be written (its only replica's node is down), and the coordinator is SIGKILLed there: the
    next coordinator loads PrepareAbort at the bumped epoch and finishes the abort once the node is back; the new
    instance's InitProducerId (retried on CONCURRENT_TRANSACTIONS meanwhile) then succeeds, the old instance is
    fenced, read_committed readers see nothing of its transaction and the new instance's commit."""
    cluster = cluster_of(tmp_path, etcd, "--override", "transaction.state.log.replication.factor=2",
                         "--override", "transaction.state.log.min.isr=1", solo=True)
    try:
        old = transactional(cluster, "fenced")
        first = coordinator(cluster)
        (away,) = {0, 1, 2} - set(first.replicas)  # holds no state replica: the fence does not wait for it
        acks = Acks()
        old.begin_transaction()
        produce(old, acks, SOLO, [b"solo%d" % i for i in range(6)], [0, 1, 2])
        produce(old, acks, TOPIC, [b"old%d" % i for i in range(6)], [0, 1, 2])
        epoch = describe(cluster, first.leader, "fenced").producer_epoch
        in_sync(cluster)
        cluster.kill(away)

        new = confluent_kafka.Producer({"bootstrap.servers": cluster.bootstrap, "transactional.id": "fenced",
                                        "transaction.timeout.ms": 60000, "message.timeout.ms": 60000})
        initialised: list = []
        starting = threading.Thread(target=lambda: initialised.append(new.init_transactions(120) or "done"))
        starting.start()
        fencing = wait_for(lambda: (lambda s: s if s.transaction_state == "PrepareAbort" else None)(
            describe(cluster, first.leader, "fenced")), 30, what="the fence's PrepareAbort")
        assert fencing.producer_epoch == epoch + 1
        assert [m[:2] for m in markers(cluster, first.leader, TOPIC, 0)] in ([], [(fencing.producer_id, "ABORT")])

        cluster.wait_for_isr(STATE, 0)
        cluster.kill(first.leader)  # in the middle of the fence: a marker still owed to solo-<away>
        second = coordinator(cluster, excluding=(first.leader, away), newer_than=first.leader_epoch)
        loaded = wait_for(lambda: (lambda s: s if s.error_code == 0 else None)(
            describe(cluster, second.leader, "fenced")), 30, what="the new coordinator to load the fence")
        assert (loaded.transaction_state, loaded.producer_epoch) == ("PrepareAbort", epoch + 1)
        cluster.restart(away)
        cluster.restart(first.leader)
        starting.join(120)
        assert initialised == ["done"], "the new instance's init_transactions did not return"
        assert describe(cluster, second.leader, "fenced").transaction_state in ("CompleteAbort", "Empty")
        with pytest.raises(confluent_kafka.KafkaException):
            old.commit_transaction(30)  # fenced

        new_acks = Acks()
        new.begin_transaction()
        produce(new, new_acks, TOPIC, [b"new%d" % i for i in range(6)], [0, 1, 2])
        new.commit_transaction(60)
        committed_exactly(cluster, SOLO, 3, acks, set())
        committed_exactly(cluster, TOPIC, 3, Acks.of(acks, new_acks), {b"new%d" % i for i in range(6)})
    finally:
        cluster.stop()


def test_marker_retried_to_new_partition_leader(tmp_path, etcd):
    """The leader of a partition of the transaction is SIGKILLed before its marker: the coordinator's
    WriteTxnMarkers to it fail and are retried until the partition's new leader writes the marker."""
    cluster = cluster_of(tmp_path, etcd, "--override", "transaction.state.log.replication.factor=2",
                         "--override", "transaction.state.log.min.isr=1")
    try:
        p = transactional(cluster, "moved")
        state = coordinator(cluster)
        (away,) = {0, 1, 2} - set(state.replicas)
        led = [q for q, s in cluster.metadata(TOPIC).items() if s.leader == away]
        assert led, f"node {away} leads no partition of {TOPIC}"
        q = led[0]
        acks = Acks()
        p.begin_transaction()
        produce(p, acks, TOPIC, [b"m%d" % i for i in range(9)], [0, 1, 2])
        in_sync(cluster)
        cluster.kill(away)
        p.commit_transaction(60)
        pid = describe(cluster, state.leader, "moved").producer_id
        wait_for(lambda: describe(cluster, state.leader, "moved").transaction_state == "CompleteCommit", 60,
                 what="CompleteCommit")
        new = cluster.wait_for_leader(TOPIC, q, excluding=(away,))
        assert markers(cluster, new.leader, TOPIC, q) == [(pid, "COMMIT", state.leader_epoch)]
        log = cluster.servers[state.leader].log()
        assert f"not written to {TOPIC}-{q}" in log, "the coordinator never had to retry the marker"
        committed_exactly(cluster, TOPIC, 3, acks, {v for *_, v in acks.acked})
        cluster.restart(away)  # the old leader follows again and holds the same marker
        cluster.wait_for_isr(TOPIC, q)
        wait_for(lambda: markers(cluster, away, TOPIC, q) == [(pid, "COMMIT", state.leader_epoch)], 30,
                 what=f"node {away} to hold the marker too")
        p.flush(10)
    finally:
        cluster.stop()


def write_markers(port: int, producer_id: int, coordinator_epoch: int, topic: str, partitions: list[int]) -> list[int]:
    """A raw WriteTxnMarkers (COMMIT, producer epoch 0): each partition's error code."""
    resp = call(port, build(WriteTxnMarkersRequest, {"markers": [
        {"producer_id": producer_id, "producer_epoch": 0, "transaction_result": True,
         "coordinator_epoch": coordinator_epoch, "topics": [{"name": topic, "partition_indexes": partitions}]}]}, 1),
        WriteTxnMarkersResponse)
    ((marker,),) = [resp.markers]
    return [p.error_code for t in marker.topics for p in t.partitions]


def test_write_txn_markers_needs_cluster_action(tmp_path):
    """WriteTxnMarkers is for nodes: without CLUSTER_ACTION on the cluster every partition answers
    CLUSTER_AUTHORIZATION_FAILED and nothing is written; with it the marker is appended."""
    topics = write_manifests(tmp_path / "topics", topic_manifest(TOPIC, partitions=2))
    authorized = ("--override", "authorizer.class.name=shale")
    with ServeProcess(tmp_path / "data", topics, *authorized) as proc:
        assert write_markers(proc.port, 4242, 0, TOPIC, [0, 1]) == [CLUSTER_AUTHORIZATION_FAILED] * 2
        assert proc.terminate() == 0
    assert stored_batches(tmp_path / "data", TOPIC, 0) == stored_batches(tmp_path / "data", TOPIC, 1) == []
    store = SecurityStore.open(str(tmp_path / "data"), Authorizer())
    store.create_acls([AclBinding(ResourcePattern(ResourceType.CLUSTER, CLUSTER_NAME, PatternType.LITERAL),
                                  AccessControlEntry("User:ANONYMOUS", "*", AclOperation.CLUSTER_ACTION,
                                                     AclPermissionType.ALLOW))])
    with ServeProcess(tmp_path / "data", topics, *authorized) as proc:
        assert write_markers(proc.port, 4242, 0, TOPIC, [1]) == [0]
        assert proc.terminate() == 0
    (batch,) = stored_batches(tmp_path / "data", TOPIC, 1)
    assert batch.header.is_control and batch.header.producer_id == 4242
    assert parse_control_key(batch.records[0].key).name == "COMMIT"
