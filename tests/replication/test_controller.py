"""The controller (each node's control loop) against a real etcd (tests/support/etcd_util.py).

Nodes are either controllers in this process, each with its own EtcdStore and event loop (for proposals,
deletes, store outages), or `controller_node.py` processes, for the failures that need a real process:
SIGKILL, SIGSTOP past the session, a restart under the same node id. The store is read by the test through
a store of its own, as another node would. Waits poll with generous deadlines; nothing asserts elapsed time.
"""

from __future__ import annotations

import asyncio
import json
import logging
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

import pytest

from shale.sidecar.log.topic_partition import TopicPartition
from shale.sidecar.replication.control_store import StoreView
from shale.sidecar.replication.controller import Controller, Wanted, alter_partition_error, new_incarnation
from shale.sidecar.replication.election import choose_replicas
from shale.sidecar.replication.store.etcd_store import EtcdStore
from shale.sidecar.replication.store_records import NodeRegistration, PartitionRecord
from shale.sidecar.server_config import ServerConfig, ServerConfigError
from support import stop_util
from support.node_util import wait_for

# Two-second sessions: a loaded test machine (two cores, many processes) can stall a process for most of a
# second, and a node that misses its deadline is fenced and comes back under a new incarnation.
SESSION_MS, HEARTBEAT_MS = 2000, 500
TP = TopicPartition("orders", 0)
DRIVER = Path(__file__).with_name("controller_node.py")


@dataclass
class Member:
    """One in-process node: its controller and what its event loop was told."""

    controller: Controller
    views: list[StoreView] = field(default_factory=list)
    fenced: list[str] = field(default_factory=list)

    @property
    def node_id(self) -> int:
        return self.controller.node.node_id

    def record(self, tp: TopicPartition = TP) -> PartitionRecord | None:
        versioned = self.views[-1].partitions.get(tp) if self.views else None
        return None if versioned is None else versioned.record

    def leads(self, tp: TopicPartition = TP) -> bool:
        """What a replica manager checks before acknowledging: the record names this session, still valid."""
        r = self.record(tp)
        return (r is not None and (r.leader, r.leader_incarnation) == (self.node_id, self.controller.incarnation)
                and self.controller.may_lead())


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    """An event loop running in a thread of its own, as the node's loop runs beside the controller thread."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    yield loop
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)
    loop.close()


@pytest.fixture
def observer(etcd) -> Iterator[EtcdStore]:
    store = EtcdStore([etcd.endpoint], "c1")
    yield store
    store.close()


@pytest.fixture
def members(etcd, loop) -> Iterator[Callable[..., Member]]:
    """Start in-process nodes: members(node_id, wanted=…) → Member; all stopped at the end."""
    started: list[Member] = []

    def start(node_id: int, wanted: Callable[[], dict] | dict | None = None, session_ms: int = SESSION_MS,
              heartbeat_ms: int = HEARTBEAT_MS) -> Member:
        table = {TP: Wanted((1, 2, 3), 3)} if wanted is None else wanted
        me = NodeRegistration(node_id, new_incarnation(), "127.0.0.1", 9000 + node_id)
        member: Member
        member = Member(Controller(EtcdStore([etcd.endpoint], "c1"), me, session_ms=session_ms,
                                   heartbeat_ms=heartbeat_ms, loop=loop,
                                   on_view=lambda view: member.views.append(view),
                                   on_fenced=lambda: member.fenced.append(member.controller.incarnation),
                                   wanted=table if callable(table) else lambda: table))
        member.controller.start()
        started.append(member)
        return member

    yield start
    for member in started:
        member.controller.stop()


def start_together(members, observer, ids: tuple[int, ...], **session) -> list[Member]:
    """Nodes that want TP only once all of them are live, so that its record is created with all in sync."""
    go = threading.Event()
    wanted = lambda: {TP: Wanted(ids, len(ids))} if go.is_set() else {}  # noqa: E731
    nodes = [members(i, wanted, **session) for i in ids]
    wait_for(lambda: all_live(observer, *ids), what=f"sessions of {ids}")
    go.set()
    for m in nodes:
        m.controller.wake()
    return nodes


def record_in(store: EtcdStore, tp: TopicPartition = TP) -> PartitionRecord | None:
    versioned = store.view().partitions.get(tp)
    return None if versioned is None else versioned.record


def all_live(store: EtcdStore, *ids: int) -> bool:
    return all(store.view().is_live(i) for i in ids)


# -- in-process nodes ---------------------------------------------------------------------------------------

def test_first_live_replica_creates_the_record_once_and_every_node_sees_it(members, observer):
    nodes = start_together(members, observer, (1, 2, 3))
    expected = PartitionRecord((1, 2, 3), (1, 2, 3), 1, nodes[0].controller.incarnation, 0, 0,
                               isr_incarnations=tuple(m.controller.incarnation for m in nodes))
    wait_for(lambda: all(m.record() == expected for m in nodes), what="every node to see the record")
    assert record_in(observer).partition_epoch == 0  # one write: the other electors saw a valid leader
    assert [m.leads() for m in nodes] == [True, False, False]


def test_partition_without_assignment_waits_for_enough_live_nodes_then_uses_kafkas_placement(members, observer):
    wanted = {TP: Wanted(None, 2)}
    first = members(4, wanted)
    wait_for(lambda: first.views, what="a view")
    assert record_in(observer) is None  # RF 2 with one live node: Kafka refuses; the record waits
    second = members(7, wanted)
    wait_for(lambda: record_in(observer) is not None, what="the record")
    live = observer.view().nodes
    assert record_in(observer).replicas == choose_replicas(live, 2, TP.partition, TP.topic)
    wait_for(lambda: first.record() == second.record() == record_in(observer), what="both nodes to see it")


def test_leader_proposal_changes_the_isr_in_the_same_leader_epoch(members, observer, caplog):
    caplog.set_level(logging.INFO, "shale.sidecar.replication.controller")
    leader = members(1)
    wait_for(lambda: leader.leads(), what="node 1 to lead")
    based_on = observer.view().partitions[TP]
    assert based_on.record.isr == (1,)  # alone at creation: 2 and 3 are not live
    follower = members(2)
    wait_for(lambda: follower.record() is not None, what="node 2's view")

    # a follower cannot change the ISR: it is not the leader the record names
    follower.controller.propose(TP, based_on, based_on.record.changed(isr=(1, 2)))
    wait_for(lambda: any("node 2: orders-0: ISR change (1,) -> (1, 2) dropped" in r.getMessage()
                         for r in caplog.records), what="node 2 to drop its proposal")
    assert record_in(observer) == based_on.record

    leader.controller.propose(TP, based_on, based_on.record.changed(isr=(1, 2)))
    wait_for(lambda: record_in(observer).isr == (1, 2), what="the expanded ISR")
    after = record_in(observer)
    assert (after.leader_epoch, after.partition_epoch) == (based_on.record.leader_epoch,
                                                           based_on.record.partition_epoch + 1)
    wait_for(lambda: leader.record() == after, what="the leader to see its ISR")

    # a proposal decided on an older record misses: the leader decides again from the new one
    leader.controller.propose(TP, based_on, based_on.record.changed(isr=(1,)))
    wait_for(lambda: any("node 1: orders-0: ISR change (1,) -> (1,) dropped" in r.getMessage()
                         for r in caplog.records), what="node 1 to drop the stale proposal")
    assert record_in(observer) == after


def test_proposals_that_are_not_isr_changes_are_refused_at_once():
    record = PartitionRecord((1, 2, 3), (1, 2), 1, "a", 3, 8)
    assert alter_partition_error(record, record.changed(isr=(1, 2, 3))) is None
    assert "leader" in alter_partition_error(record, record.changed(leader=2, isr=(2,)))
    assert "partition epoch" in alter_partition_error(record, record.changed(isr=(1,)).changed(isr=(1, 2)))
    recovering = PartitionRecord((1, 2, 3), (1,), 1, "a", 3, 8, recovering=True)
    assert "KIP-704" in alter_partition_error(recovering, recovering.changed(isr=(1, 2)))
    assert alter_partition_error(recovering, recovering.changed(recovering=False, isr=(1, 2))) is None
    assert "recovering again" in alter_partition_error(record, record.changed(recovering=True, isr=(1,)))


def test_an_assignment_no_record_can_hold_is_logged_and_the_other_partitions_go_on(members, observer, caplog):
    bad = TopicPartition("orders", 1)
    node = members(1, {bad: Wanted((1, 1), 2), TP: Wanted((1,), 1)})
    wait_for(lambda: record_in(observer) is not None, what="the good partition's record")
    assert record_in(observer, bad) is None
    assert any("node 1: orders-1: not creating its record (fix its assignment)" in r.getMessage()
               and "replicas must be distinct" in r.getMessage() for r in caplog.records)
    wait_for(lambda: node.leads(), what="node 1 to act on the good partition's record")  # its next view


def test_delete_removes_the_record(members, observer):
    wanted = {TP: Wanted((1,), 1)}
    node = members(1, lambda: dict(wanted))
    wait_for(lambda: record_in(observer) is not None, what="the record")
    wanted.clear()  # the topic is gone from the node's registry, then its record is deleted
    node.controller.delete(TP)
    wait_for(lambda: record_in(observer) is None, what="the record to be deleted")
    wait_for(lambda: node.views and TP not in node.views[-1].partitions, what="the node to see it gone")


def test_stop_ends_the_session_at_once_without_waiting_for_the_ttl(members, observer):
    node = members(5, {}, session_ms=60_000, heartbeat_ms=1000)
    wait_for(lambda: all_live(observer, 5), what="node 5's session")
    node.controller.stop()
    assert not observer.view().is_live(5)
    assert not node.controller.may_lead()


def test_store_stopped_leaders_stop_leading_then_reopen_sessions_under_new_incarnations(etcd, members, observer):
    nodes = start_together(members, observer, (1, 2))
    wait_for(lambda: nodes[0].leads(), what="node 1 to lead")
    before = {m.node_id: m.controller.incarnation for m in nodes}
    etcd.sigstop()
    try:
        wait_for(lambda: not any(m.controller.may_lead() for m in nodes), what="both nodes to stop leading")
        wait_for(lambda: all(m.fenced for m in nodes), what="both nodes to be told they are fenced")
        assert not nodes[0].leads()
    finally:
        etcd.sigcont()
    wait_for(lambda: all(m.controller.may_lead() for m in nodes), what="new sessions")
    assert all(m.controller.incarnation != before[m.node_id] for m in nodes)
    # Node 1's old leadership is void: the record is re-elected to a current session. Which node wins
    # depends on which reopened first (node 1 alone would be the last ISR member standing); the first node back
    # may find the other still away and take the partition offline until it returns (leader -1 meanwhile).
    after = wait_for(lambda: (r := record_in(observer)) is not None and r.leader != -1
                     and r.leader_incarnation not in before.values() and r, what="a new election")
    leader = {m.node_id: m for m in nodes}[after.leader]
    assert after.leader_incarnation == leader.controller.incarnation and after.leader_epoch >= 1
    wait_for(lambda: leader.leads(), what="the new leader to act on the record")
    assert [m.node_id for m in nodes if m.leads()] == [after.leader]


def test_a_follower_whose_leader_refuses_connections_ends_its_session_and_the_isr_elects_at_once(members, observer):
    # Sessions far longer than any wait below: only the early end can move the partition.
    nodes = start_together(members, observer, (1, 2, 3), session_ms=120_000, heartbeat_ms=500)
    wait_for(lambda: nodes[0].leads(), what="node 1 to lead")
    before = record_in(observer)
    # Nothing listens at node 1's registered port (9001): what node 2's fetcher would have found.
    nodes[1].controller.leader_refused(nodes[0].controller.node)
    after = wait_for(lambda: (r := record_in(observer)) is not None and r.leader_epoch > before.leader_epoch and r,
                     what="an election without waiting for node 1's session to expire")
    assert after.leader == 2 and after.isr == (2, 3)
    # Node 1 was alive all along: its next renewal finds the session gone and it stops leading (the election
    # was the ISR's clean one, so whatever node 1 acknowledged before is on node 2 too).
    wait_for(lambda: nodes[0].fenced, what="node 1 to learn that its session was ended")
    wait_for(lambda: nodes[1].leads(), what="node 2 to lead")
    assert not nodes[0].leads()


def test_a_refusing_leader_is_left_to_expire_by_a_node_not_in_its_isr(members, observer, caplog):
    caplog.set_level(logging.INFO, logger="shale.sidecar.replication.controller")
    go = threading.Event()
    wanted = lambda: {TP: Wanted((1, 2, 3), 3)} if go.is_set() else {}  # noqa: E731
    nodes = [members(i, wanted, session_ms=120_000, heartbeat_ms=500) for i in (1, 2, 3)]
    wait_for(lambda: all_live(observer, 1, 2, 3), what="sessions of 1, 2, 3")
    inc = {m.node_id: m.controller.incarnation for m in nodes}
    assert observer.create_partition(TP, PartitionRecord(replicas=(1, 2, 3), isr=(1, 2), leader=1,
                                                         leader_incarnation=inc[1], isr_incarnations=(inc[1], inc[2])))
    go.set()
    wait_for(lambda: nodes[0].leads(), what="node 1 to lead")
    nodes[2].controller.leader_refused(nodes[0].controller.node)  # node 3 is out of the ISR
    wait_for(lambda: "its session is left to expire" in caplog.text, what="node 3 to decline")
    assert observer.view().is_live(1, inc[1]) and nodes[0].leads() and not nodes[0].fenced


def test_a_control_loop_stuck_longer_than_the_session_keeps_its_session(members, observer):
    stuck, release = threading.Event(), threading.Event()
    table = {TP: Wanted((1,), 1)}

    def wanted() -> dict:
        if stuck.is_set():  # a slow store call or a long pause on the control loop, not on the renewal
            stuck.clear()
            release.wait(60)
        return dict(table)
    member = members(1, wanted)
    wait_for(lambda: member.leads(), what="node 1 to lead")
    incarnation = member.controller.incarnation
    stuck.set()
    wait_for(lambda: not stuck.is_set(), what="the control loop to be stuck")
    time.sleep(3 * SESSION_MS / 1000)  # three sessions without a view read
    try:
        assert observer.view().is_live(1, incarnation)  # renewed all along by the session thread
        assert member.controller.may_lead()
    finally:
        release.set()
    other = TopicPartition("orders", 1)
    table[other] = Wanted((1,), 1)
    member.controller.wake()
    wait_for(lambda: record_in(observer, other) is not None, what="the control loop to run again")
    assert member.fenced == [] and member.controller.incarnation == incarnation and member.leads()


def test_an_unexpected_error_in_the_control_loop_is_logged_and_the_loop_goes_on(members, observer, caplog):
    fail = threading.Event()
    table = {TP: Wanted((1,), 1)}

    def wanted() -> dict:
        if fail.is_set():
            fail.clear()
            raise RuntimeError("a bug behind wanted()")
        return dict(table)
    member = members(1, wanted)
    wait_for(lambda: member.leads(), what="node 1 to lead")
    fail.set()
    member.controller.wake()
    wait_for(lambda: "a bug behind wanted()" in caplog.text, what="the error to be logged")
    other = TopicPartition("orders", 1)
    table[other] = Wanted((1,), 1)
    member.controller.wake()
    wait_for(lambda: record_in(observer, other) is not None, what="the loop to go on after the error")
    assert member.leads() and member.fenced == []


def test_after_a_storm_of_store_stalls_every_node_reopens_its_session_and_one_leads(etcd, members, observer):
    nodes = start_together(members, observer, (1, 2))
    wait_for(lambda: nodes[0].leads(), what="node 1 to lead")
    for _ in range(4):  # each stall outlasts the session: every node fences, reopens, and is stalled again
        etcd.sigstop()
        time.sleep(SESSION_MS / 1000 + 0.5)
        etcd.sigcont()
        time.sleep(0.3)
    wait_for(lambda: all(observer.view().is_live(m.node_id, m.controller.incarnation) and m.controller.may_lead()
                         for m in nodes), timeout=60, what="every node to hold a session again")
    assert all(m.fenced for m in nodes)
    current = {m.controller.incarnation for m in nodes}
    after = wait_for(lambda: (r := record_in(observer)) is not None and r.leader != -1
                     and r.leader_incarnation in current and r, timeout=60, what="an election among the sessions")
    wait_for(lambda: [m.node_id for m in nodes if m.leads()] == [after.leader], what="one node to lead")


def test_replication_broker_settings_have_their_defaults_and_the_heartbeat_rule():
    defaults = ServerConfig.from_mapping({})
    assert (defaults.broker_session_timeout_ms, defaults.broker_heartbeat_interval_ms,
            defaults.replica_lag_time_max_ms, defaults.unclean_leader_election_enable,
            defaults.default_replication_factor, defaults.offsets_topic_replication_factor) == (
        2000, 500, 30000, False, 1, 3)
    fast = ServerConfig.from_mapping({"broker.session.timeout.ms": "1000", "broker.heartbeat.interval.ms": "250"})
    assert fast.overrides() == {"broker.session.timeout.ms": "1000", "broker.heartbeat.interval.ms": "250"}
    with pytest.raises(ServerConfigError, match=r"broker\.heartbeat\.interval\.ms: Value must be at most a third "
                                                r"of broker\.session\.timeout\.ms \(1000\)"):
        ServerConfig.from_mapping({"broker.session.timeout.ms": "1000"})
    with pytest.raises(ServerConfigError, match="offsets.topic.replication.factor: Value must be at least 1"):
        ServerConfig.from_mapping({"offsets.topic.replication.factor": "0"})


def test_constructor_refuses_a_heartbeat_too_long_for_the_session(etcd, loop):
    store = EtcdStore([etcd.endpoint], "c1")
    with pytest.raises(ValueError, match="heartbeat 400 ms is more than a third of the session 1000 ms"):
        Controller(store, NodeRegistration(1, "a", "h", 1), session_ms=1000, heartbeat_ms=400, loop=loop,
                   on_view=print, on_fenced=print, wanted=dict)
    store.close()


# -- node processes -----------------------------------------------------------------------------------------

class NodeProcess:
    """controller_node.py as a real process; its JSON events collected as they come."""

    def __init__(self, etcd, node_id: int, wanted: list, log_path: Path) -> None:
        spec = {"endpoint": etcd.endpoint, "cluster": "c1", "node_id": node_id, "session_ms": SESSION_MS,
                "heartbeat_ms": HEARTBEAT_MS, "quorum": 3, "wanted": wanted}
        self.node_id = node_id
        with open(log_path, "a") as log:  # the controller's own log lines, for a failure's post-mortem
            self.proc = subprocess.Popen([sys.executable, str(DRIVER), json.dumps(spec)], stdout=subprocess.PIPE,
                                         stderr=log, text=True)
        self.events: list[dict] = []
        threading.Thread(target=self._read, daemon=True).start()
        self.incarnation = wait_for(lambda: next((e["started"] for e in self.events if "started" in e), None),
                                    what=f"node {node_id} to start")

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.events.append(json.loads(line))

    def incarnations(self) -> set[str]:
        """Every incarnation this process has had (a stalled process is fenced and comes back under a new one)."""
        return {e["incarnation"] for e in self.events if "incarnation" in e}

    def views(self, since: int = 0) -> list[dict]:
        return [e for e in self.events[since:] if "view" in e]

    def leads(self) -> bool:
        views = self.views()
        return bool(views) and views[-1]["leads"] == [str(TP)] and views[-1]["may_lead"]

    def signal(self, sig: signal.Signals) -> None:
        self.proc.send_signal(sig)

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGCONT)
        self.proc.kill()
        self.proc.wait(10)


@pytest.fixture
def processes(etcd, tmp_path) -> Iterator[Callable[[int], NodeProcess]]:
    started: list[NodeProcess] = []

    def start(node_id: int) -> NodeProcess:
        log = tmp_path / f"node{node_id}.log"
        started.append(NodeProcess(etcd, node_id, [[TP.topic, TP.partition, [1, 2, 3], 3]], log))
        return started[-1]

    yield start
    for p in started:
        p.kill()


def start_three(processes, observer) -> list[NodeProcess]:
    nodes = [processes(i) for i in (1, 2, 3)]
    wait_for(lambda: (r := record_in(observer)) is not None and r.isr == (1, 2, 3) and r, what="a record")
    wait_for(lambda: nodes[0].leads(), what="node 1 to lead")
    return nodes


def test_leader_sigkill_the_next_isr_replica_is_elected_once(processes, observer):
    nodes = start_three(processes, observer)
    first = record_in(observer)
    nodes[0].kill()
    after = wait_for(lambda: (r := record_in(observer)).leader != 1 and r, what="a new leader")
    assert (after.leader, after.isr) == (2, (2, 3)) and after.leader_incarnation in nodes[1].incarnations()
    assert (after.leader_epoch, after.partition_epoch) == (first.leader_epoch + 1, first.partition_epoch + 1)
    wait_for(lambda: nodes[1].leads(), what="node 2 to act as leader")
    assert not nodes[2].leads()


def test_leader_restarted_before_its_session_expires_loses_the_lead_and_the_isr(processes, observer):
    nodes = start_three(processes, observer)
    first = record_in(observer)
    nodes[0].kill()
    again = processes(1)  # the same node id, a new process: it replaces the old session at once
    after = wait_for(lambda: (r := record_in(observer)).leader_epoch > first.leader_epoch and r,
                     what="the deposed leader's lead to be taken")
    assert (after.leader, after.isr) == (2, (2, 3))
    wait_for(lambda: again.views() and again.views()[-1]["view"][str(TP)]["leader"] == 2, what="node 1's view")
    assert not again.leads()


def test_leader_paused_past_its_session_stops_leading_at_once_and_returns_as_a_follower(processes, observer):
    nodes = start_three(processes, observer)
    paused = nodes[0]
    old = next(e["incarnation"] for e in reversed(paused.events) if "incarnation" in e)  # the leading session
    stop_util.sigstop(paused.proc.pid)
    try:
        wait_for(lambda: record_in(observer).leader == 2, what="node 2 to be elected while node 1 is paused")
        elected_by = time.monotonic()  # CLOCK_MONOTONIC is one clock for every process of the machine
        mark = len(paused.events)  # all it printed so far was printed before the pause
    finally:
        paused.signal(signal.SIGCONT)
    # Its own deadline had passed before the store let anyone else lead ...
    last_deadline = max(e["until"] for e in paused.events[:mark] if e.get("incarnation") == old
                        and "until" in e)
    assert 0 < last_deadline < elected_by
    wait_for(lambda: any(e.get("may_lead") for e in paused.events[mark:]), what="node 1's new session")
    woke = paused.events[mark:]
    # ... so the first thing its event loop sees on waking is that it may not lead, whatever the store says
    first = next(e for e in woke if e.get("resumed"))
    assert first["may_lead"] is False
    assert not any(e.get("may_lead") and e["incarnation"] == old for e in woke)
    assert any("fenced" in e for e in woke)
    assert not any(v["leads"] for v in woke if "view" in v)  # no view after the wake-up made it leader
    renewed = next(e for e in woke if e.get("may_lead"))
    assert renewed["incarnation"] != old
    assert observer.view().nodes[1].incarnation == renewed["incarnation"]
    assert record_in(observer).leader == 2 and record_in(observer).isr == (2, 3)
