"""The ControlStore contract, run against both real engines: EtcdStore on etcd (tests/support/etcd_util.py) and
KubeStore on a real kube-apiserver (tests/support/kube_apiserver.py, a fresh namespace per test).

"Another node" is a second store object with its own connections, as another `shale serve` process would
be. Waits on the engines' timers (lease expiry) poll with a generous deadline and fail loudly; nothing
asserts on elapsed time.
"""

from __future__ import annotations

import dataclasses
import itertools
import threading
import time
from dataclasses import dataclass
from typing import Callable, Iterator

import kubernetes
import pytest
from store_util import RECORD, TP, assert_unavailable, node

from shale.sidecar.log.topic_partition import TopicPartition
from shale.sidecar.replication.control_store import ControlStore, SessionLost
from shale.sidecar.replication.store.etcd_store import EtcdStore
from shale.sidecar.replication.store.kube_store import KubeStore
from shale.sidecar.replication.topic_record import TopicRecord
from support.node_util import wait_for

_namespaces = itertools.count(1)


@dataclass
class Engine:
    """One consensus engine under test: stores on it (one per simulated process), and stopping it."""

    name: str
    store: Callable[..., ControlStore]  # store(cluster_id="c1")
    stop: Callable[[], None]
    start: Callable[[], None]


@pytest.fixture(params=["etcd", "kubernetes"])
def engine(request) -> Iterator[Engine]:
    made: list[ControlStore] = []
    if request.param == "etcd":
        etcd = request.getfixturevalue("etcd")

        def make(cluster_id: str = "c1") -> ControlStore:
            made.append(EtcdStore([etcd.endpoint], cluster_id))
            return made[-1]
        stop, start = etcd.stop, etcd.start
    else:
        api_server = request.getfixturevalue("kube_api")
        namespace = f"stores{next(_namespaces)}"
        kubernetes.client.CoreV1Api(api_server.client()).create_namespace({"metadata": {"name": namespace}})

        def make(cluster_id: str = "c1") -> ControlStore:
            made.append(KubeStore(api_server.client(), namespace, cluster_id))
            return made[-1]
        stop, start = api_server.kill_apiserver, api_server.start_apiserver
    yield Engine(request.param, make, stop, start)
    for store in made:
        store.close()


# Sessions.
def test_session_registers_the_node(engine):
    me = node(1, "a")
    engine.store().open_session(me, 5000)
    assert engine.store().view().nodes == {1: me}


def test_session_expiry_is_seen_by_another_client(engine):
    mine, other = engine.store(), engine.store()
    mine.open_session(node(1, "a"), 1000)
    assert other.view().is_live(1, "a")
    wait_for(lambda: not other.view().is_live(1), what="node 1's session expired without keepalives")
    with pytest.raises(SessionLost, match="node 1 incarnation a"):
        mine.keepalive()


def test_keepalive_keeps_a_session_alive_past_its_ttl(engine):
    mine, other = engine.store(), engine.store()
    mine.open_session(node(2, "a"), 1000)
    stop = time.monotonic() + 3.0  # three TTLs
    while time.monotonic() < stop:
        mine.keepalive()
        assert other.view().is_live(2, "a")
        time.sleep(0.2)


def test_restarted_node_replaces_its_previous_session_at_once(engine):
    old, new, other = engine.store(), engine.store(), engine.store()
    old.open_session(node(1, "old"), 30_000)
    assert other.view().is_live(1, "old")
    new.open_session(node(1, "new"), 30_000)
    assert other.view().nodes[1].incarnation == "new"
    with pytest.raises(SessionLost):  # the old process learns now, not after its 30 s session
        old.keepalive()
    old.close_session()  # the old process shutting down late must not remove its successor
    new.keepalive()
    assert other.view().is_live(1, "new")


def test_reopening_after_a_lost_session_registers_a_new_incarnation(engine):
    mine, other = engine.store(), engine.store()
    mine.open_session(node(1, "a"), 1000)
    wait_for(lambda: not other.view().is_live(1), what="node 1 expired")
    with pytest.raises(SessionLost):
        mine.keepalive()
    mine.open_session(node(1, "b"), 5000)
    mine.keepalive()
    assert other.view().is_live(1, "b")


def test_close_session_removes_the_node_without_waiting_for_the_ttl(engine):
    mine, other = engine.store(), engine.store()
    mine.open_session(node(4, "a"), 60_000)
    assert other.view().is_live(4)
    mine.close_session()
    assert not other.view().is_live(4)
    with pytest.raises(SessionLost):
        mine.keepalive()


def test_a_peer_ends_the_session_of_the_incarnation_it_names_and_no_other(engine):
    mine, peer = engine.store(), engine.store()
    mine.open_session(node(1, "a"), 60_000)
    assert not peer.end_session(node(1, "b"))  # not the incarnation that holds it
    assert peer.view().is_live(1, "a")
    assert peer.end_session(node(1, "a"))
    assert not peer.view().is_live(1)  # at once, not after the 60 s session
    with pytest.raises(SessionLost):  # the ended process learns at its next renewal
        mine.keepalive()
    assert not peer.end_session(node(1, "a"))  # gone already
    mine.open_session(node(1, "c"), 60_000)
    assert not peer.end_session(node(1, "a"))  # a successor's session is another one and stays
    mine.keepalive()
    assert peer.view().is_live(1, "c")


def test_keepalive_without_a_session_is_session_lost(engine):
    with pytest.raises(SessionLost):
        engine.store().keepalive()


# Partition records.
def test_partition_record_create_read_update(engine):
    store = engine.store()
    assert store.create_partition(TP, RECORD)
    assert not store.create_partition(TP, RECORD.changed(isr=(1,)))  # exists: the first creator's stands
    current = store.view().partitions[TP]
    assert current.record == RECORD
    shrunk = current.record.changed(isr=(1, 2))
    assert store.update_partition(TP, shrunk, current.version)
    after = store.view().partitions[TP]
    assert after.record == shrunk and after.version != current.version
    assert not store.update_partition(TP, shrunk.changed(isr=(1,)), current.version)  # stale version
    assert store.view().partitions[TP].record == shrunk


def test_several_records_are_written_together_only_at_their_versions(engine):
    store = engine.store()
    other = TopicPartition(TP.topic, TP.partition + 1)
    assert store.create_partition(TP, RECORD) and store.create_partition(other, RECORD)
    before = store.view().partitions
    shrunk = RECORD.changed(isr=(1, 2))
    assert store.update_partitions([(TP, shrunk, before[TP].version), (other, shrunk, before[other].version)])
    after = store.view().partitions
    assert after[TP].record == shrunk and after[other].record == shrunk
    # One version has moved on (TP's): the batch misses. On etcd it is one transaction and nothing of it lands;
    # on Kubernetes the writes stop at the miss, which comes first here.
    assert not store.update_partitions([(TP, shrunk.changed(isr=(1,)), before[TP].version),
                                        (other, shrunk.changed(isr=(1,)), after[other].version)])
    assert store.view().partitions[TP].record == shrunk and store.view().partitions[other].record == shrunk


def test_concurrent_creators_exactly_one_wins(engine):
    writers = [engine.store() for _ in range(6)]
    records = [RECORD.changed(leader=(i % 3) + 1, leader_incarnation=str(i)) for i in range(len(writers))]
    results = race([lambda w=w, r=r: w.create_partition(TP, r) for w, r in zip(writers, records)])
    assert sum(results) == 1
    assert engine.store().view().partitions[TP].record == records[results.index(True)]


def test_concurrent_cas_writers_from_one_version_exactly_one_wins(engine):
    store = engine.store()
    assert store.create_partition(TP, RECORD)
    base = store.view().partitions[TP]
    writers = [engine.store() for _ in range(6)]
    records = [base.record.changed(isr=(1,) + (() if i % 2 else (2,)), recovering=bool(i % 3), leader_epoch=i)
               for i in range(len(writers))]
    results = race([lambda w=w, r=r: w.update_partition(TP, r, base.version) for w, r in zip(writers, records)])
    assert sum(results) == 1
    assert store.view().partitions[TP].record == records[results.index(True)]


def race(actions: list[Callable[[], bool]]) -> list[bool]:
    """Run `actions` in threads released together; their results in order."""
    barrier, results = threading.Barrier(len(actions)), [False] * len(actions)

    def run(i: int) -> None:
        barrier.wait()
        results[i] = actions[i]()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(actions))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def test_delete_partition_and_create_again(engine):
    store = engine.store()
    assert store.create_partition(TP, RECORD)
    old = store.view().partitions[TP]
    store.delete_partition(TP)
    store.delete_partition(TP)  # already gone: nothing to do, no error
    assert TP not in store.view().partitions
    assert not store.update_partition(TP, RECORD.changed(isr=(1,)), old.version)  # deleted: no resurrection
    assert store.create_partition(TP, RECORD)
    assert store.view().partitions[TP].record == RECORD


def test_view_holds_nodes_and_partitions(engine):
    store = engine.store()
    store.open_session(node(1, "a"), 5000)
    other_topic = TopicPartition("A.b_c-d", 0)  # a topic name no Kubernetes object name could be
    assert store.create_partition(TP, RECORD) and store.create_partition(other_topic, RECORD.changed(isr=(1,)))
    view = store.view()
    assert view.nodes == {1: node(1, "a")}
    assert {tp: v.record for tp, v in view.partitions.items()} == {TP: RECORD, other_topic: RECORD.changed(isr=(1,))}


def test_clusters_do_not_see_each_other(engine):
    one, two = engine.store("one"), engine.store("one-two")  # one's name is a prefix of the other's
    one.open_session(node(1, "a"), 5000)
    assert one.create_partition(TP, RECORD)
    assert two.view().nodes == {} and two.view().partitions == {}
    assert two.create_partition(TP, RECORD.changed(isr=(1,)))
    assert one.view().partitions[TP].record == RECORD


# Topic records (CreateTopics on a replicated cluster).
TOPIC = TopicRecord("A.b_c-d", "dGhpcyBpcyBhIHRvcGljIQ", ((1, 2, 3), (2, 3, 1)), {"retention.ms": "60000"})


def test_topic_record_create_is_create_if_absent_and_seen_by_another_node(engine):
    store, other = engine.store(), engine.store()
    assert store.create_topic(TOPIC)
    assert not other.create_topic(dataclasses.replace(TOPIC, topic_id="b3RoZXIgdG9waWMgaWQhIQ"))  # name taken
    view = other.view()
    assert {name: v.record for name, v in view.topics.items()} == {TOPIC.name: TOPIC}
    assert view.partitions == {}  # topic records are no partition records


def test_topic_record_update_and_delete_are_compare_and_set(engine):
    store = engine.store()
    assert store.create_topic(TOPIC)
    created = store.view().topics[TOPIC.name]
    grown = dataclasses.replace(TOPIC, assignment=TOPIC.assignment + ((3, 1, 2),), config={})
    assert store.update_topic(grown, created.version)
    current = store.view().topics[TOPIC.name]
    assert current.record == grown and current.version != created.version
    assert not store.update_topic(TOPIC, created.version)  # stale: the growth stands
    assert not store.delete_topic(TOPIC.name, created.version)  # a deletion never undoes a change it did not see
    assert store.view().topics[TOPIC.name].record == grown
    assert store.delete_topic(TOPIC.name, current.version)
    assert TOPIC.name not in store.view().topics
    assert not store.delete_topic(TOPIC.name, current.version)  # gone already
    assert not store.update_topic(grown, current.version)  # deleted: no resurrection
    assert TOPIC.name not in store.view().topics
    assert store.create_topic(TOPIC)


def test_concurrent_topic_creators_exactly_one_wins(engine):
    writers = [engine.store() for _ in range(6)]
    records = [dataclasses.replace(TOPIC, topic_id=f"id{i}") for i in range(len(writers))]
    results = race([lambda w=w, r=r: w.create_topic(r) for w, r in zip(writers, records)])
    assert sum(results) == 1
    assert engine.store().view().topics[TOPIC.name].record == records[results.index(True)]


def test_wait_for_change_wakes_on_a_topic_write(engine):
    store, writer = engine.store(), engine.store()
    revision = store.view().revision
    timer = threading.Timer(0.3, lambda: writer.create_topic(TOPIC))
    timer.start()
    store.wait_for_change(revision, 30.0)
    timer.join()
    assert TOPIC.name in store.view().topics


# Waiting for changes.
def test_wait_for_change_wakes_on_a_partition_write(engine):
    store, writer = engine.store(), engine.store()
    revision = store.view().revision
    timer = threading.Timer(0.3, lambda: writer.create_partition(TP, RECORD))
    timer.start()
    store.wait_for_change(revision, 30.0)
    timer.join()
    assert TP in store.view().partitions


def test_wait_for_change_wakes_on_a_session_expiry(engine):
    watcher, mine = engine.store(), engine.store()
    mine.open_session(node(1, "a"), 1000)
    view = watcher.view()
    assert view.is_live(1)
    watcher.wait_for_change(view.revision, 30.0)
    wait_for(lambda: not watcher.view().is_live(1), what="node 1 gone after the wake-up")


@pytest.mark.timeout(50)
def test_wait_for_change_returns_at_once_for_a_change_already_past_the_revision(engine):
    store = engine.store()
    revision = store.view().revision
    assert store.create_partition(TP, RECORD)
    store.wait_for_change(revision, 60.0)  # a 60 s wait would trip the test's timeout
    assert store.view().revision != revision


@pytest.mark.timeout(30)
def test_wait_for_change_returns_after_its_timeout_without_a_change(engine):
    store = engine.store()
    assert store.create_partition(TP, RECORD)
    view = store.view()
    store.wait_for_change(view.revision, 0.5)
    assert store.view().revision == view.revision


# Outages.
@pytest.mark.timeout(120)
def test_store_stopped_every_call_is_store_unavailable_then_works_after_restart(engine):
    store = engine.store()
    store.open_session(node(1, "a"), 30_000)
    assert store.create_partition(TP, RECORD)
    version = store.view().partitions[TP].version
    engine.stop()
    try:
        assert_unavailable(store, version)
    finally:
        engine.start()  # same data, same address: the same store object carries on
    store.keepalive()  # the session outlived the outage (shorter than its TTL)
    view = store.view()
    assert view.is_live(1, "a") and view.partitions[TP].record == RECORD
    assert store.update_partition(TP, RECORD.changed(isr=(1,)), version)
