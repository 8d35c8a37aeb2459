"""ReplicaManager (sidecar/replication/replica_manager.py) applying store views to real logs, and the produce
purgatory (delayed_produce.py).

The logs, the registry and the views are real; the controller and the fetchers are the two collaborators the
manager talks to through narrow interfaces (`Leadership`, `Fetchers`), recorded here so that each transition of
docs/replication.md's state machine can be checked by what it asked of them. End to end, with the real
controller, fetchers and etcd, the same rules run in test_leader_side.py and the cluster tests.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from shale.sidecar.log.checkpoint import EpochEntry
from shale.sidecar.log.log_dir import LogDir
from shale.sidecar.log.records import Record, encode_batch
from shale.sidecar.log.topic_partition import TopicPartition
from shale.sidecar.protocol.error_codes import NONE, NOT_LEADER_OR_FOLLOWER
from shale.sidecar.replication.control_store import StoreView, Versioned
from shale.sidecar.replication.delayed_produce import DelayedProduces
from shale.sidecar.replication.partition import Role
from shale.sidecar.replication.replica_manager import ReplicaManager
from shale.sidecar.replication.store_records import NodeRegistration, PartitionRecord
from shale.sidecar.topic_config import TopicConfig
from shale.sidecar.topics.registry import NodeAddress, TopicRegistry, TopicSpec

TP = TopicPartition("t", 0)
NODES = {n: NodeRegistration(n, f"i{n}", "127.0.0.1", 9000 + n) for n in range(3)}


class Controller:
    def __init__(self) -> None:
        self.incarnation = "i0"
        self.lead = True
        self.proposals: list[tuple[TopicPartition, Versioned, PartitionRecord]] = []
        self.wakes = 0

    def may_lead(self) -> bool:
        return self.lead

    def propose(self, tp, based_on, new) -> None:
        self.proposals.append((tp, based_on, new))

    def wake(self) -> None:
        self.wakes += 1


class Fetchers:
    def __init__(self) -> None:
        self.following: dict[TopicPartition, tuple[int, int]] = {}
        self.gone: set[NodeRegistration] = set()  # leader processes whose connection is down

    def follow(self, tp, leader, leader_epoch) -> None:
        self.following[tp] = (leader.node_id, leader_epoch)

    def unfollow(self, tp) -> None:
        self.following.pop(tp, None)

    def lost(self, leader) -> bool:
        return leader in self.gone


@pytest.fixture
def manager(tmp_path: Path):
    cfg = TopicConfig.from_mapping({"min.insync.replicas": "2"})
    log_dir = LogDir(str(tmp_path), lambda topic: cfg)
    registry = TopicRegistry(log_dir, NodeAddress(0, "127.0.0.1", 9000))
    rm = ReplicaManager(registry, replica_lag_time_max_ms=10_000, clock_ms=lambda: 1_000)
    registry.replication = rm
    registry.put(TopicSpec("t", 1, cfg, assignment=((0, 1, 2),)))
    controller, fetchers = Controller(), Fetchers()
    rm.attach(controller, fetchers)
    rm.topics_changed()
    woken: list[TopicPartition] = []
    rm.wake_fetches = woken.append
    yield rm, controller, fetchers, woken
    log_dir.close()


def view(record: PartitionRecord, version: str = "1", nodes=NODES) -> StoreView:
    return StoreView(version, dict(nodes), {TP: Versioned(record, version)})


def rec(leader=0, epoch=0, isr=(0, 1, 2), inc=None, pepoch=0) -> PartitionRecord:
    return PartitionRecord((0, 1, 2), isr, leader, inc if inc is not None else f"i{leader}", epoch, pepoch)


def append(log, n: int, epoch: int) -> None:
    log.append(encode_batch([Record(i, 0, None, b"v") for i in range(n)]), leader_epoch=epoch)


def test_the_wanted_snapshot_names_every_partition_with_its_replicas_and_unclean_setting(manager):
    rm, controller, _, _ = manager
    assert rm.wanted() == {TP: ((0, 1, 2), 3, False)}
    assert controller.wakes == 1  # the controller runs at once for a new topic


def test_a_record_naming_this_process_leader_makes_a_leader_whose_epoch_starts_at_the_log_end(manager):
    rm, _, fetchers, woken = manager
    rm.apply_view(view(rec(leader=1, epoch=0)))  # first a follower of node 1 ...
    assert fetchers.following[TP] == (1, 0)
    p = rm.partitions[TP]
    append(p.log, 3, 0)  # ... that copied three records of epoch 0
    rm.apply_view(view(rec(leader=0, epoch=1, pepoch=1), "2"))
    assert p.state.role is Role.LEADER and rm.leader(TP) is p and TP not in fetchers.following
    assert p.log.replicated and p.log.leader_epoch_cache.entries[-1] == EpochEntry(1, 3)
    assert p.state.leader_epoch_start_offset == 3 and TP in woken
    assert rm.leader_id(TP) == 0 and rm.is_replica(TP)


def test_a_record_naming_a_previous_process_of_this_node_is_no_leadership(manager):
    rm, controller, fetchers, _ = manager
    rm.apply_view(view(rec(leader=0, inc="i0")))
    assert rm.leader(TP) is not None
    controller.incarnation = "i0-new-session"  # fenced, reopened: the record still names the old process
    assert rm.leader(TP) is None  # at once, before the new session's first view arrives
    rm.apply_view(view(rec(leader=0, inc="i0"), "2", {**NODES, 0: NodeRegistration(0, "i0-new-session", "h", 1)}))
    assert rm.partitions[TP].state.role is Role.NONE and rm.leader(TP) is None and TP not in fetchers.following
    assert rm.leader_id(TP) == -1  # Metadata: being re-elected


def test_metadata_names_no_leader_while_this_nodes_fetcher_has_lost_it(manager):
    rm, _, fetchers, _ = manager
    rm.apply_view(view(rec(leader=1, epoch=0)))
    record = rm.record(TP)
    assert rm.announced_leader(record) == 1
    fetchers.gone.add(NODES[1])  # its connection closed: the process is gone, its session not yet
    assert rm.announced_leader(record) == -1 and rm.valid_leader(record) == 1  # only Metadata says so
    fetchers.gone.add(NodeRegistration(1, "an-older-process", "h", 1))
    fetchers.gone.discard(NODES[1])  # reached again; a lost older process of the node is another leader
    assert rm.announced_leader(record) == 1


def test_may_lead_gates_acknowledgements_but_not_reads(manager):
    rm, controller, _, _ = manager
    rm.apply_view(view(rec()))
    controller.lead = False
    assert rm.leader(TP) is None and rm.leader_log(TP) is None
    part, code = rm.replica_for(TP, -1)  # a consumer's read of committed data
    assert code == NONE and part is rm.partitions[TP]
    assert rm.replica_for(TP, -1, acknowledging=True) == (None, NOT_LEADER_OR_FOLLOWER)


def test_a_follower_whose_session_ends_is_proposed_out_of_the_isr_at_once(manager):
    rm, controller, _, _ = manager
    rm.apply_view(view(rec()))
    assert controller.proposals == []
    live = {n: r for n, r in NODES.items() if n != 2}
    rm.apply_view(view(rec(), "1", live))
    ((tp, based_on, new),) = controller.proposals
    assert (tp, based_on.version, new.isr, new.partition_epoch) == (TP, "1", (0, 1), 1)
    rm.apply_view(view(rec(), "1", live))  # one change in flight: nothing new until a view answers it
    assert len(controller.proposals) == 1


def test_acks_all_waits_for_the_followers_and_a_new_leader_epoch_answers_not_leader(manager):
    rm, controller, fetchers, _ = manager

    async def run():
        rm.apply_view(view(rec()))
        p = rm.partitions[TP]
        append(p.log, 2, 0)
        rm.appended(p)
        waiter = rm.park(p, last_offset=1)
        for replica in (1, 2):
            rm.follower_fetched(p, replica, 1, 0, p.log.log_end_offset)
        assert not waiter.done.done() and p.log.high_watermark == 1
        rm.follower_fetched(p, 1, 2, 0, 2)
        assert not waiter.done.done()
        rm.follower_fetched(p, 2, 2, 0, 2)
        assert waiter.done.result() == NONE and p.log.high_watermark == 2

        append(p.log, 1, 0)
        parked = rm.park(p, last_offset=2)
        rm.apply_view(view(rec(leader=1, epoch=1, pepoch=1), "2"))  # deposed: follows node 1 now
        assert parked.done.result() == NOT_LEADER_OR_FOLLOWER and fetchers.following[TP] == (1, 1)

        rm.apply_view(view(rec(leader=0, epoch=2, pepoch=2), "3"))
        append(p.log, 1, 2)
        fenced = rm.park(p, last_offset=3)
        rm.on_fenced()
        assert fenced.done.result() == NOT_LEADER_OR_FOLLOWER

    asyncio.run(run())


def test_a_replica_moved_off_this_node_is_dropped_and_its_log_deleted(manager):
    rm, _, fetchers, _ = manager
    rm.apply_view(view(rec(leader=1)))
    log_path = rm.partitions[TP].log.dir
    moved = PartitionRecord((1, 2), (1, 2), 1, "i1", 1, 1)
    rm.apply_view(StoreView("2", dict(NODES), {TP: Versioned(moved, "2")}))
    assert TP not in rm.partitions and TP not in fetchers.following
    # Kafka's StopReplica with delete: the log goes as a deleted topic's does (renamed `-delete`, then removed).
    assert TP not in rm.registry.log_dir.logs and not os.path.exists(log_path)


def test_an_older_record_than_one_applied_is_ignored(manager):
    rm, _, fetchers, _ = manager
    rm.apply_view(view(rec(leader=1, epoch=4, pepoch=9), "9"))
    rm.apply_view(view(rec(leader=2, epoch=3, pepoch=8), "8"))
    assert fetchers.following[TP] == (1, 4)


def test_delayed_produces_complete_fail_and_forget():
    async def run():
        delayed = DelayedProduces()
        a = delayed.park(TP, 5, 0)
        b = delayed.park(TP, 9, 0)
        assert delayed.complete(TP, lambda w: NONE if w.required_offset <= 6 else None) == 1
        assert a.done.result() == NONE and not b.done.done() and len(delayed) == 1
        delayed.forget(b)
        assert len(delayed) == 0 and delayed.partitions() == []
        c = delayed.park(TopicPartition("u", 1), 1, 0)
        assert delayed.fail_all(NOT_LEADER_OR_FOLLOWER) == 1 and c.done.result() == NOT_LEADER_OR_FOLLOWER

    asyncio.run(run())


def test_deleting_the_topic_stops_following_before_its_log_goes(manager):
    rm, _, fetchers, _ = manager
    rm.apply_view(view(rec(leader=1)))
    seen = []
    rm.fetchers.unfollow = lambda tp: seen.append((tp, tp in rm.registry.log_dir.logs))
    rm.registry.remove("t")
    assert seen[0] == (TP, True) and TP not in rm.partitions  # unfollowed while the log still existed


def test_a_replica_that_cannot_be_created_is_logged_once_and_the_others_still_apply(tmp_path, caplog):
    cfg = TopicConfig.from_mapping({})
    log_dir = LogDir(str(tmp_path), lambda topic: cfg)
    try:
        registry = TopicRegistry(log_dir, NodeAddress(0, "127.0.0.1", 9000))
        rm = ReplicaManager(registry)
        registry.replication = rm
        registry.put(TopicSpec("t", 2, cfg))
        rm.attach(Controller(), Fetchers())
        (tmp_path / "t-0").write_text("a file where the partition directory belongs")
        records = {TopicPartition("t", p): Versioned(rec(), "1") for p in (0, 1)}
        for revision in ("1", "2"):
            rm.apply_view(StoreView(revision, dict(NODES), records))
        refusals = [r for r in caplog.records if "cannot host the replica" in r.getMessage()]
        assert len(refusals) == 1 and "t-0" in refusals[0].getMessage()
        assert list(rm.partitions) == [TopicPartition("t", 1)] and rm.leader(TopicPartition("t", 1)) is not None
    finally:
        log_dir.close()
