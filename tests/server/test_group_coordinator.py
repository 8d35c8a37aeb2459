"""The group coordinator driven directly: requests encoded and decoded as on the wire, time from a fake clock.

Every request goes through kafka-python's encoder and our decoder, every answer through our encoder and
kafka-python's decoder, so each test also checks the version-specific layout. The logs are real
(`__consumer_offsets` in a temporary directory); only the clock is fake, so timeouts are exact.
"""

from __future__ import annotations

import asyncio
import functools
import heapq
import inspect
from dataclasses import dataclass
from typing import Callable

import pytest
from kafka.protocol.consumer.metadata import ConsumerProtocolAssignment, ConsumerProtocolSubscription

from shale.sidecar.log.log_dir import LogDir
from shale.sidecar.log.records import Record, decode_batch, encode_batch
from shale.sidecar.log.topic_partition import TopicPartition
from shale.sidecar.protocol import codec
from shale.sidecar.server.apis.listener_addresses import ListenerAddresses
from shale.sidecar.server.coordinator.find_coordinator import FindCoordinator
from shale.sidecar.server.coordinator.group.coordinator import OFFSETS_TOPIC_CONFIG, GroupCoordinator
from shale.sidecar.server.coordinator.group.model import GroupState
from shale.sidecar.server.coordinator.group.offset_records import (
    OFFSETS_TOPIC,
    GroupMetadataKey,
    OffsetCommitKey,
    OffsetRecordError,
    decode_group_metadata_value,
    decode_key,
    decode_offset_commit_value,
    encode_key,
    partition_for,
)
from shale.sidecar.server.coordinator.runtime import LocalPartitionWriter
from shale.sidecar.server.network.handler import ConnectionInfo
from shale.sidecar.topic_config import TopicConfig
from shale.sidecar.topics.registry import NodeAddress, TopicRegistry, TopicSpec
from support.clients_util import build, request_frame

COMMIT, FETCH, FIND, JOIN, HEARTBEAT, LEAVE, SYNC = 8, 9, 10, 11, 12, 13, 14
START_MS = 1_700_000_000_000
DELAY = 100  # group.initial.rebalance.delay.ms


# -- a fake clock ----------------------------------------------------------------------------------------------


@dataclass(eq=False)
class _FakeTimer:
    due: int
    callback: Callable[[], None]
    cancelled: bool = False

    def cancel(self) -> None:
        self.cancelled = True


class FakeClock:
    """Milliseconds that only move when the test says so; due timers fire in order, synchronously."""

    def __init__(self, now: int = START_MS) -> None:
        self.now = now
        self._timers: list[tuple[int, int, _FakeTimer]] = []
        self._seq = 0

    def now_ms(self) -> int:
        return self.now

    def call_later(self, delay_ms: int, callback: Callable[[], None]) -> _FakeTimer:
        timer = _FakeTimer(self.now + max(delay_ms, 0), callback)
        self._seq += 1
        heapq.heappush(self._timers, (timer.due, self._seq, timer))
        return timer

    def advance(self, ms: int) -> None:
        end = self.now + ms
        while self._timers and self._timers[0][0] <= end:
            due, _, timer = heapq.heappop(self._timers)
            if not timer.cancelled:
                self.now = due
                timer.callback()
        self.now = end


# -- harness ---------------------------------------------------------------------------------------------------


def subscription(*topics: str) -> bytes:
    return bytes(ConsumerProtocolSubscription(version=0, topics=list(topics), user_data=None).encode(version=0))


def assignment(**topics: list[int]) -> bytes:
    return bytes(ConsumerProtocolAssignment(version=0, assigned_partitions=list(topics.items()),
                                            user_data=None).encode(version=0))


RANGE = [{"name": "range", "metadata": subscription("t")}]


class Harness:
    def __init__(self, path, **options) -> None:
        self.path = path
        self.options = {"offsets_partitions": 5, "initial_rebalance_delay_ms": DELAY, **options}
        self.clock = FakeClock()
        self._open()

    def _open(self) -> None:
        self.log_dir = LogDir(str(self.path / "data"), lambda t: self.registry.config_for(t)
                              if hasattr(self, "registry") else TopicConfig.from_mapping({}))
        self.registry = TopicRegistry(self.log_dir, NodeAddress(0, "broker0", 9092))
        self.registry.put(TopicSpec("t", 4, TopicConfig.from_mapping({})))
        self.registry.put(TopicSpec("u", 2, TopicConfig.from_mapping({})))
        self.coord = GroupCoordinator(self.registry, clock=self.clock, **self.options)
        self.handlers = {**self.coord.handlers(), **FindCoordinator(self.coord, None, ListenerAddresses(0)).handlers()}

    async def restart(self) -> None:
        """A new coordinator (and log directory) over the same files, as after a node restart."""
        self.close()
        self._open()
        await self.coord.start()

    def close(self) -> None:
        self.coord.close()
        self.log_dir.close()

    async def call(self, api_key: int, version: int, *, client_id: str = "client-1", **values):
        request = build(codec.request_class(api_key), values, version)
        decoded = codec.decode_request(request_frame(request, 7, client_id)[4:])
        body = await self.handlers[api_key](decoded, ConnectionInfo(client_id, "10.0.0.9"))
        raw = codec.encode_response(api_key, version, 7, body)
        return codec.response_class(api_key).decode(raw, version=version, header=True)

    def start(self, api_key: int, version: int, **values) -> asyncio.Task:
        return asyncio.ensure_future(self.call(api_key, version, **values))

    def join(self, member_id: str = "", *, version: int = 9, group: str = "g", protocols=None, session: int = 10000,
             rebalance: int = 30000, instance: str | None = None, protocol_type: str = "consumer",
             client_id: str = "client-1") -> asyncio.Task:
        return self.start(JOIN, version, client_id=client_id, group_id=group, session_timeout_ms=session,
                          rebalance_timeout_ms=rebalance, member_id=member_id, group_instance_id=instance,
                          protocol_type=protocol_type, protocols=RANGE if protocols is None else protocols,
                          reason=None)

    async def member_id(self, group: str = "g", client_id: str = "client-1") -> str:
        """The first JoinGroup of a v4+ client: the coordinator hands out a member id (KIP-394)."""
        resp = await self.join(group=group, client_id=client_id)
        assert resp.error_code == 79 and resp.member_id.startswith(client_id + "-")
        return resp.member_id

    def sync(self, member_id: str, generation: int, assignments: dict[str, bytes] | None = None, *,
             version: int = 5, group: str = "g") -> asyncio.Task:
        return self.start(SYNC, version, group_id=group, generation_id=generation, member_id=member_id,
                          group_instance_id=None, protocol_type="consumer" if version >= 5 else None,
                          protocol_name="range" if version >= 5 else None,
                          assignments=[{"member_id": m, "assignment": a} for m, a in (assignments or {}).items()])

    async def heartbeat(self, member_id: str, generation: int, group: str = "g", instance: str | None = None) -> int:
        resp = await self.call(HEARTBEAT, 4, group_id=group, generation_id=generation, member_id=member_id,
                               group_instance_id=instance)
        return resp.error_code

    async def commit(self, offsets: dict[tuple[str, int], int], *, member_id: str = "", generation: int = -1,
                     group: str = "g", version: int = 8, metadata: str | None = "") -> dict[tuple[str, int], int]:
        by_topic: dict[str, list] = {}
        for (topic, p), offset in offsets.items():
            by_topic.setdefault(topic, []).append({"partition_index": p, "committed_offset": offset,
                                                   "committed_leader_epoch": 3, "committed_metadata": metadata})
        resp = await self.call(COMMIT, version, group_id=group, generation_id_or_member_epoch=generation,
                               member_id=member_id, group_instance_id=None, retention_time_ms=-1,
                               topics=[{"name": t, "partitions": ps} for t, ps in by_topic.items()])
        return {(t.name, p.partition_index): p.error_code for t in resp.topics for p in t.partitions}

    async def committed(self, group: str = "g", topics=None, version: int = 7) -> dict[tuple[str, int], int]:
        resp = await self.call(FETCH, version, group_id=group, topics=topics, require_stable=True)
        assert resp.error_code == 0
        return {(t.name, p.partition_index): p.committed_offset for t in resp.topics for p in t.partitions}

    def records(self, group: str = "g") -> list[tuple[object, object]]:
        """Every (key, value) in the group's __consumer_offsets partition, decoded (value None = tombstone)."""
        log = self.registry.local_log(OFFSETS_TOPIC, partition_for(group, self.options["offsets_partitions"]))
        out, offset = [], log.log_start_offset
        while (found := log.read(offset, 1 << 20)) is not None:
            data = found.read()
            batch = decode_batch(data[:int.from_bytes(data[8:12], "big") + 12])
            for r in batch.records:
                key = decode_key(r.key)
                if r.value is None:
                    value = None
                elif isinstance(key, OffsetCommitKey):
                    value = decode_offset_commit_value(r.value)
                else:
                    value = decode_group_metadata_value(r.value)
                out.append((key, value))
            offset = batch.header.next_offset
        return out


async def settle() -> None:
    """Let every runnable task reach its next await (the handlers are waiting on futures)."""
    for _ in range(10):
        await asyncio.sleep(0)


def coordinator_test(fn=None, **options):
    """Run an async test body with a started Harness (built with `options`) in a fresh event loop."""
    if fn is None:
        return functools.partial(coordinator_test, **options)

    @functools.wraps(fn)
    def wrapper(tmp_path, **kwargs):
        async def main():
            h = Harness(tmp_path, **options)
            await h.coord.start()
            try:
                # A handler that never answers would hang the test: fail it instead (a safety net only;
                # the coordinator's own time is the fake clock).
                await asyncio.wait_for(fn(h, **kwargs), 20)
            finally:
                h.close()
        asyncio.run(main())

    params = [p for name, p in inspect.signature(fn).parameters.items() if name != "h"]
    wrapper.__signature__ = inspect.Signature(
        [inspect.Parameter("tmp_path", inspect.Parameter.POSITIONAL_OR_KEYWORD), *params])
    return wrapper


async def stable_group(h: Harness, n: int = 2) -> tuple[list[str], int]:
    """n members through the first rebalance and the leader's sync; returns their ids and the generation."""
    ids = [await h.member_id(client_id=f"client-{i}") for i in range(n)]
    joins = [h.join(mid, client_id=f"client-{i}") for i, mid in enumerate(ids)]
    await settle()
    h.clock.advance(2 * DELAY)  # the second member extended the initial delay once
    await settle()
    results = [await j for j in joins]
    generation = results[0].generation_id
    syncs = [h.sync(mid, generation, {m: assignment(t=[i]) for i, m in enumerate(ids)} if mid == ids[0] else None)
             for mid in ids]
    for s in syncs:
        assert (await s).error_code == 0
    assert h.coord.groups["g"].state is GroupState.STABLE
    return ids, generation


# -- FindCoordinator ----------------------------------------------------------------------------------------------


@coordinator_test
async def test_find_coordinator_answers_this_node_and_refuses_transactions(h):
    resp = await h.call(FIND, 0, key="g")
    assert (resp.error_code, resp.node_id, resp.host, resp.port) == (0, 0, "broker0", 9092)
    resp = await h.call(FIND, 3, key="tx", key_type=1)
    assert (resp.error_code, resp.node_id) == (15, -1)  # COORDINATOR_NOT_AVAILABLE: no transactions here
    resp = await h.call(FIND, 4, key_type=0, coordinator_keys=["a", "b"])
    assert [(c.key, c.error_code, c.node_id, c.host, c.port) for c in resp.coordinators] == [
        ("a", 0, 0, "broker0", 9092), ("b", 0, 0, "broker0", 9092)]
    resp = await h.call(FIND, 6, key_type=1, coordinator_keys=["tx"])
    assert [(c.key, c.error_code) for c in resp.coordinators] == [("tx", 15)]


@coordinator_test
async def test_groups_whose_offsets_partition_another_node_leads_get_not_coordinator(h):
    # __consumer_offsets partition 1 moves to node 1: its groups are coordinated there.
    spec = h.registry.topics[OFFSETS_TOPIC]
    h.registry.put(TopicSpec(OFFSETS_TOPIC, 5, spec.config, origin="internal", internal=True,
                             assignment=((0,), (1,), (0,), (0,), (0,)), nodes={1: ("broker1", 9093)}))
    remote = next(g for g in (f"group-{i}" for i in range(100)) if partition_for(g, 5) == 1)
    local = next(g for g in (f"group-{i}" for i in range(100)) if partition_for(g, 5) == 0)
    resp = await h.call(FIND, 4, key_type=0, coordinator_keys=[remote, local])
    assert [(c.node_id, c.host, c.port) for c in resp.coordinators] == [(1, "broker1", 9093), (0, "broker0", 9092)]
    assert (await h.join(group=remote)).error_code == 16
    assert await h.heartbeat("m", 1, group=remote) == 16
    assert await h.commit({("t", 0): 5}, group=remote) == {("t", 0): 16}
    resp = await h.call(FETCH, 8, groups=[{"group_id": remote, "topics": None}, {"group_id": local, "topics": None}],
                        require_stable=False)
    assert [(g.group_id, g.error_code) for g in resp.groups] == [(remote, 16), (local, 0)]
    assert (await h.join(group=local)).error_code == 79  # the local one is served


# -- JoinGroup ----------------------------------------------------------------------------------------------------


@coordinator_test
async def test_join_validation_errors(h):
    assert (await h.join(group="")).error_code == 24  # INVALID_GROUP_ID
    assert (await h.join(session=5999)).error_code == 26  # below group.min.session.timeout.ms
    assert (await h.join(session=1_800_001)).error_code == 26
    assert (await h.join("nobody")).error_code == 25  # a member id for a group that does not exist
    assert (await h.join(protocols=[])).error_code == 23  # nothing to agree on
    resp = await h.join(version=6)
    assert (resp.error_code, resp.protocol_name, resp.leader) == (79, "", "")  # not nullable before v7


@coordinator_test
async def test_first_rebalance_waits_for_the_initial_delay_and_only_the_leader_gets_the_members(h):
    a = await h.member_id(client_id="client-a")
    join_a = h.join(a, client_id="client-a")
    await settle()
    h.clock.advance(DELAY - 1)
    await settle()
    assert not join_a.done()  # group.initial.rebalance.delay.ms has not passed
    b = await h.member_id(client_id="client-b")
    join_b = h.join(b, client_id="client-b", protocols=[{"name": "roundrobin", "metadata": b"rr"},
                                                        {"name": "range", "metadata": subscription("t")}])
    await settle()
    h.clock.advance(1)  # the first delay ends, but a member arrived during it: wait one more delay
    await settle()
    assert not join_a.done() and not join_b.done()
    h.clock.advance(DELAY)
    await settle()
    ra, rb = await join_a, await join_b
    assert (ra.error_code, rb.error_code) == (0, 0)
    assert ra.generation_id == rb.generation_id == 1
    assert ra.protocol_name == rb.protocol_name == "range"  # the only protocol both support
    assert ra.protocol_type == "consumer"
    assert ra.leader == rb.leader == a
    assert [(m.member_id, m.metadata) for m in ra.members] == [(a, subscription("t")), (b, subscription("t"))]
    assert rb.members == []


@coordinator_test
async def test_old_clients_get_a_member_id_at_once(h):
    join = h.join(version=3)
    await settle()
    h.clock.advance(DELAY)
    resp = await join
    assert resp.error_code == 0 and resp.member_id.startswith("client-1-") and resp.generation_id == 1


@coordinator_test
async def test_protocol_type_and_protocols_must_match_the_group(h):
    ids, generation = await stable_group(h, 1)
    assert (await h.join(protocol_type="connect")).error_code == 23
    assert (await h.join(protocols=[{"name": "sticky", "metadata": b""}])).error_code == 23


@coordinator_test
async def test_a_new_member_rebalances_a_stable_group(h):
    (a,), generation = await stable_group(h, 1)
    b = await h.member_id(client_id="client-b")
    join_b = h.join(b, client_id="client-b")
    await settle()
    assert not join_b.done()
    assert await h.heartbeat(a, generation) == 27  # REBALANCE_IN_PROGRESS: a must rejoin
    # Commits of the current generation are still accepted while the group prepares to rebalance.
    assert await h.commit({("t", 0): 7}, member_id=a, generation=generation) == {("t", 0): 0}
    join_a = h.join(a)
    await settle()
    ra, rb = await join_a, await join_b
    assert ra.generation_id == rb.generation_id == generation + 1
    assert ra.leader == a and len(ra.members) == 2 and rb.members == []
    assert (await h.sync(b, generation)).error_code == 22  # ILLEGAL_GENERATION


@coordinator_test
async def test_members_that_do_not_rejoin_before_the_rebalance_timeout_are_removed(h):
    (a, b), generation = await stable_group(h, 2)  # rebalance timeouts of 30 s
    c = await h.member_id(client_id="client-c")
    join_c = h.join(c, client_id="client-c", rebalance=20000)
    join_a = h.join(a, rebalance=20000)
    await settle()
    for _ in range(5):  # b is alive (it heartbeats and is told to rejoin) but does not rejoin
        h.clock.advance(5000)
        assert await h.heartbeat(b, generation) == 27
    h.clock.advance(4999)  # the largest rebalance timeout of the members (b's, 30 s) bounds the wait
    await settle()
    assert not join_a.done()  # b may still rejoin
    h.clock.advance(1)
    await settle()
    ra, rc = await join_a, await join_c
    assert ra.generation_id == rc.generation_id == generation + 1
    assert {m.member_id for m in ra.members} == {a, c}
    assert await h.heartbeat(b, generation) == 25  # UNKNOWN_MEMBER_ID: b was removed


@coordinator_test
async def test_a_known_member_rejoining_unchanged_in_a_stable_group_gets_the_current_generation(h):
    (a, b), generation = await stable_group(h, 2)
    resp = await h.join(b, client_id="client-1")
    assert (resp.error_code, resp.generation_id, resp.leader, resp.members) == (0, generation, a, [])
    assert h.coord.groups["g"].state is GroupState.STABLE


# -- SyncGroup ----------------------------------------------------------------------------------------------------


@coordinator_test
async def test_sync_flow_and_errors(h):
    ids = [await h.member_id(client_id=f"client-{i}") for i in range(2)]
    joins = [h.join(m, client_id=f"client-{i}") for i, m in enumerate(ids)]
    await settle()
    h.clock.advance(2 * DELAY)  # the second member extended the initial delay once
    generation = (await joins[0]).generation_id
    await joins[1]
    assert (await h.sync("stranger", generation)).error_code == 25  # UNKNOWN_MEMBER_ID
    assert (await h.sync(ids[1], generation + 1)).error_code == 22  # ILLEGAL_GENERATION
    follower = h.sync(ids[1], generation)  # before the leader: it waits for the assignment
    await settle()
    assert not follower.done()
    parts = {ids[0]: assignment(t=[0, 1]), ids[1]: assignment(t=[2, 3])}
    leader = await h.sync(ids[0], generation, parts)
    got = await follower
    assert (leader.error_code, leader.assignment) == (0, parts[ids[0]])
    assert (got.error_code, got.assignment, got.protocol_type, got.protocol_name) == (
        0, parts[ids[1]], "consumer", "range")
    again = await h.sync(ids[1], generation, version=0)  # after the leader: answered at once
    assert (again.error_code, again.assignment) == (0, parts[ids[1]])
    # The group's metadata record went to its __consumer_offsets partition with the assignment.
    (key, value), = [r for r in h.records() if isinstance(r[0], GroupMetadataKey)]
    assert key == GroupMetadataKey("g")
    assert (value.protocol_type, value.generation, value.protocol, value.leader) == ("consumer", generation,
                                                                                     "range", ids[0])
    assert [(m.member_id, m.client_id, m.client_host, m.assignment, m.subscription) for m in value.members] == [
        (ids[0], "client-0", "/10.0.0.9", parts[ids[0]], subscription("t")),
        (ids[1], "client-1", "/10.0.0.9", parts[ids[1]], subscription("t"))]
    # A new rebalance: SyncGroup is refused until the join phase completes.
    c = await h.member_id(client_id="client-c")
    h.join(c, client_id="client-c")
    await settle()
    assert (await h.sync(ids[1], generation)).error_code == 27  # REBALANCE_IN_PROGRESS


@coordinator_test
async def test_a_rebalance_during_the_sync_phase_answers_the_waiting_members(h):
    ids = [await h.member_id(client_id=f"client-{i}") for i in range(2)]
    joins = [h.join(m) for m in ids]
    await settle()
    h.clock.advance(2 * DELAY)  # the second member extended the initial delay once
    generation = (await joins[0]).generation_id
    await joins[1]
    follower = h.sync(ids[1], generation)
    await settle()
    resp = await h.call(LEAVE, 0, group_id="g", member_id=ids[0])  # the leader leaves before syncing
    assert resp.error_code == 0
    assert (await follower).error_code == 27  # the sync it waited in is void: rejoin


@coordinator_test
async def test_members_that_never_sync_are_removed_after_the_rebalance_timeout(h):
    ids = [await h.member_id(client_id=f"client-{i}") for i in range(2)]
    joins = [h.join(m, rebalance=15000, session=30000) for m in ids]  # sync timeout < session timeout
    await settle()
    h.clock.advance(2 * DELAY)  # the second member extended the initial delay once
    generation = (await joins[0]).generation_id
    await joins[1]
    assert (await h.sync(ids[0], generation, {ids[0]: b"a", ids[1]: b"b"})).error_code == 0
    h.clock.advance(14999)
    assert ids[1] in h.coord.groups["g"].members
    h.clock.advance(1)
    group = h.coord.groups["g"]
    assert ids[1] not in group.members and group.state is GroupState.PREPARING_REBALANCE
    assert await h.heartbeat(ids[0], generation) == 27


# -- Heartbeat, session timeouts, LeaveGroup ------------------------------------------------------------------------


@coordinator_test
async def test_heartbeat_errors(h):
    assert await h.heartbeat("m", 1) == 25  # no such group
    (a, b), generation = await stable_group(h, 2)
    assert await h.heartbeat(a, generation) == 0
    assert await h.heartbeat("stranger", generation) == 25
    assert await h.heartbeat(a, generation - 1) == 22
    assert await h.heartbeat(a, generation, group="") == 24


@coordinator_test
async def test_a_member_that_stops_heartbeating_is_removed_and_the_group_rebalances(h):
    (a, b), generation = await stable_group(h, 2)
    for _ in range(4):  # a keeps heartbeating within its 10 s session timeout; b does not
        h.clock.advance(3000)
        assert await h.heartbeat(a, generation) in (0, 27)
    group = h.coord.groups["g"]
    assert b not in group.members and group.state is GroupState.PREPARING_REBALANCE
    join_a = h.join(a)
    await settle()
    resp = await join_a
    assert (resp.generation_id, [m.member_id for m in resp.members]) == (generation + 1, [a])


@coordinator_test
async def test_leave_group_single_and_batched(h):
    (a, b), generation = await stable_group(h, 2)
    resp = await h.call(LEAVE, 2, group_id="g", member_id="stranger")
    assert resp.error_code == 25
    resp = await h.call(LEAVE, 5, group_id="g", members=[
        {"member_id": b, "group_instance_id": None, "reason": "bye"},
        {"member_id": "stranger", "group_instance_id": None, "reason": None}])
    assert resp.error_code == 0
    assert [(m.member_id, m.error_code) for m in resp.members] == [(b, 0), ("stranger", 25)]
    group = h.coord.groups["g"]
    assert list(group.members) == [a] and group.state is GroupState.PREPARING_REBALANCE
    resp = await h.call(LEAVE, 0, group_id="g", member_id=a)
    assert resp.error_code == 0
    # The last member left: the rebalance completes at once with an empty group, recorded as such.
    assert group.state is GroupState.EMPTY and group.generation == generation + 1
    key, value = h.records()[-1]
    assert key == GroupMetadataKey("g") and (value.generation, value.protocol, value.members) == (
        generation + 1, None, ())


# -- static membership --------------------------------------------------------------------------------------------


@coordinator_test
async def test_a_restarted_static_member_takes_over_without_a_rebalance(h):
    join = h.join(instance="pod-0")
    await settle()
    h.clock.advance(DELAY)
    first = await join
    assert first.error_code == 0 and first.member_id.startswith("pod-0-")  # no MEMBER_ID_REQUIRED for static
    old, generation = first.member_id, first.generation_id
    assert (await h.sync(old, generation, {old: assignment(t=[0, 1, 2, 3])})).error_code == 0
    # The process restarts and joins with its instance id and no member id.
    again = await h.join(instance="pod-0", version=9)
    assert again.error_code == 0 and again.member_id != old
    assert again.generation_id == generation and again.skip_assignment  # leader: keep the assignment
    assert (await h.sync(again.member_id, generation)).assignment == assignment(t=[0, 1, 2, 3])
    assert await h.heartbeat(old, generation, instance="pod-0") == 82  # FENCED_INSTANCE_ID
    assert await h.heartbeat(again.member_id, generation, instance="pod-0") == 0
    # Before JoinGroup v9 the old leader id is returned, so the client does not reassign.
    third = await h.join(instance="pod-0", version=5)
    assert (third.error_code, third.leader, third.members) == (0, again.member_id, [])


# -- offsets ------------------------------------------------------------------------------------------------------


@coordinator_test
async def test_standalone_commits_and_fetches(h):
    assert await h.committed(topics=None) == {}
    assert await h.commit({("t", 0): 10, ("t", 1): 20, ("u", 1): 5}) == {("t", 0): 0, ("t", 1): 0, ("u", 1): 0}
    assert await h.committed(topics=None) == {("t", 0): 10, ("t", 1): 20, ("u", 1): 5}
    assert await h.committed(topics=[{"name": "t", "partition_indexes": [0, 3]}]) == {("t", 0): 10, ("t", 3): -1}
    resp = await h.call(FETCH, 5, group_id="g", topics=[{"name": "t", "partition_indexes": [1]}])
    p = resp.topics[0].partitions[0]
    assert (p.committed_offset, p.committed_leader_epoch, p.metadata, p.error_code) == (20, 3, "", 0)
    resp = await h.call(FETCH, 8, groups=[{"group_id": "g", "topics": [{"name": "u", "partition_indexes": [0, 1]}]},
                                          {"group_id": "other", "topics": None}], require_stable=True)
    assert [(g.group_id, g.error_code, [(t.name, [(p.partition_index, p.committed_offset) for p in t.partitions])
                                        for t in g.topics]) for g in resp.groups] == [
        ("g", 0, [("u", [(0, -1), (1, 5)])]), ("other", 0, [])]
    # The commit is in the log, in Kafka's layout, with the commit time as timestamp.
    commits = {k: v for k, v in h.records() if isinstance(k, OffsetCommitKey)}
    assert commits[OffsetCommitKey("g", "t", 1)].offset == 20
    assert commits[OffsetCommitKey("g", "t", 1)].leader_epoch == 3
    assert commits[OffsetCommitKey("g", "t", 1)].commit_timestamp == START_MS


@coordinator_test
async def test_commit_errors(h):
    assert await h.commit({("nope", 0): 1, ("t", 9): 1, ("t", 0): 1}) == {("nope", 0): 3, ("t", 9): 3, ("t", 0): 0}
    assert await h.commit({("t", 0): 1}, metadata="x" * 4097) == {("t", 0): 12}  # OFFSET_METADATA_TOO_LARGE
    assert await h.commit({("t", 0): 1}, group="fresh", member_id="m", generation=3) == {("t", 0): 22}
    assert await h.commit({("t", 0): 1}, group="fresh", member_id="m", generation=3, version=9) == {("t", 0): 69}
    (a, b), generation = await stable_group(h, 2)
    assert await h.commit({("t", 0): 1}, member_id=a, generation=generation) == {("t", 0): 0}
    assert await h.commit({("t", 0): 1}, member_id=a, generation=generation + 1) == {("t", 0): 22}
    assert await h.commit({("t", 0): 1}, member_id="stranger", generation=generation) == {("t", 0): 25}
    assert await h.commit({("t", 0): 1}) == {("t", 0): 25}  # standalone commits only while the group is empty
    c = await h.member_id(client_id="client-c")
    join_c = h.join(c, client_id="client-c")
    joins = [h.join(m) for m in (a, b)]
    await settle()
    await join_c
    new_generation = (await joins[0]).generation_id
    await joins[1]
    # CompletingRebalance: the member has the new generation but no assignment yet.
    assert await h.commit({("t", 0): 1}, member_id=a, generation=new_generation) == {("t", 0): 27}


@coordinator_test
async def test_a_commit_the_log_refuses_gets_kafkas_error_code(h):
    # A batch larger than the offsets topic's max.message.bytes: Kafka answers INVALID_COMMIT_OFFSET_SIZE.
    spec = h.registry.topics[OFFSETS_TOPIC]
    h.registry.put(TopicSpec(OFFSETS_TOPIC, 5, TopicConfig.from_mapping({**OFFSETS_TOPIC_CONFIG,
                                                                         "max.message.bytes": "300"}),
                             origin="internal", internal=True))
    assert spec.config != h.registry.topics[OFFSETS_TOPIC].config
    assert await h.commit({("t", 0): 1, ("t", 1): 1}, metadata="m" * 200) == {("t", 0): 28, ("t", 1): 28}
    assert await h.committed() == {}  # nothing was acknowledged, nothing is kept
    assert await h.commit({("t", 0): 1}) == {("t", 0): 0}


# -- persistence ----------------------------------------------------------------------------------------------------


@coordinator_test
async def test_offsets_and_groups_are_loaded_from_the_log_after_a_restart(h):
    (a, b), generation = await stable_group(h, 2)
    assert await h.commit({("t", 0): 11, ("t", 1): 12}, member_id=a, generation=generation) == {("t", 0): 0,
                                                                                                 ("t", 1): 0}
    assert await h.commit({("t", 0): 13}, member_id=b, generation=generation) == {("t", 0): 0}
    assert await h.commit({("u", 0): 1}, group="solo") == {("u", 0): 0}
    await h.restart()
    assert await h.committed() == {("t", 0): 13, ("t", 1): 12}
    assert await h.committed(group="solo") == {("u", 0): 1}
    group = h.coord.groups["g"]
    assert (group.state, group.generation, group.leader_id, list(group.members)) == (
        GroupState.STABLE, generation, a, [a, b])
    # The members carry on: same generation, same assignment, no rebalance.
    assert await h.heartbeat(b, generation) == 0
    assert (await h.sync(b, generation)).assignment == assignment(t=[1])
    # a never heartbeats again: its session times out after the restart too.
    h.clock.advance(10000)
    assert a not in group.members


@coordinator_test(offsets_retention_ms=60_000, offsets_retention_check_interval_ms=10_000)
async def test_expired_offsets_of_an_empty_group_become_tombstones(h):
    assert await h.commit({("t", 0): 5}) == {("t", 0): 0}
    h.clock.advance(30_000)
    assert await h.commit({("t", 1): 6}) == {("t", 1): 0}
    h.clock.advance(30_000)  # t-0 is 60 s old: the check at +60 s removes it; t-1 is 30 s old
    assert await h.committed(topics=None) == {("t", 1): 6}
    assert h.records()[-1] == (OffsetCommitKey("g", "t", 0), None)
    h.clock.advance(30_000)
    assert "g" not in h.coord.groups  # no offsets, no members: the group is gone
    await h.restart()
    assert await h.committed(topics=None) == {}


@coordinator_test(offsets_retention_ms=60_000)
async def test_an_emptied_consumer_group_expires_from_when_it_became_empty(h):
    (a, b), generation = await stable_group(h, 2)
    assert await h.commit({("t", 0): 5, ("u", 0): 1}, member_id=a, generation=generation) == {("t", 0): 0,
                                                                                               ("u", 0): 0}
    for _ in range(12):  # a minute of a stable group
        h.clock.advance(5_000)
        assert await h.heartbeat(a, generation) == 0 and await h.heartbeat(b, generation) == 0
    assert h.coord.expire_offsets() == 1  # the members subscribe to t only: u's offset goes, t's stays
    assert await h.committed(topics=None) == {("t", 0): 5}
    for m in (a, b):
        assert (await h.call(LEAVE, 3, group_id="g", members=[{"member_id": m, "group_instance_id": None}])
                ).error_code == 0
    h.clock.advance(59_999)
    assert h.coord.expire_offsets() == 0  # retention counts from when the group became empty
    h.clock.advance(1)
    assert h.coord.expire_offsets() == 1
    assert "g" not in h.coord.groups
    assert h.records()[-2:] == [(OffsetCommitKey("g", "t", 0), None), (GroupMetadataKey("g"), None)]


def test_offsets_topic_is_declared_compacted_and_internal(tmp_path):
    async def main():
        h = Harness(tmp_path)
        await h.coord.start()
        try:
            spec = h.registry.topics[OFFSETS_TOPIC]
            assert (spec.partitions, spec.internal, spec.origin) == (5, True, "internal")
            assert spec.config.overrides() == {"cleanup.policy": "compact", "segment.bytes": str(100 * 1024 * 1024)}
            assert spec.config.compression_type == "producer"
            assert sum(1 for tp in h.log_dir.logs if tp.topic == OFFSETS_TOPIC) == 5
        finally:
            h.close()
        # Restarted with another partition count configured, the topic keeps the five it has (groups hash
        # onto them), as Kafka's does.
        for configured in (3, 8):
            h2 = Harness(tmp_path, offsets_partitions=configured)
            await h2.coord.start()
            try:
                assert h2.registry.topics[OFFSETS_TOPIC].partitions == 5 and h2.coord.offsets_partitions == 5
                assert h2.registry.local_log(OFFSETS_TOPIC, 4) is not None
                assert h2.coord.partition_for("foo") == 101574 % 5
            finally:
                h2.close()
    asyncio.run(main())


def test_the_poke_hook_names_the_partition_written(tmp_path):
    async def main():
        poked: list[TopicPartition] = []
        h = Harness(tmp_path, writer=LocalPartitionWriter(poked.append))
        await h.coord.start()
        try:
            assert await h.commit({("t", 0): 1}, group="poke") == {("t", 0): 0}
            assert poked == [TopicPartition(OFFSETS_TOPIC, partition_for("poke", 5))]
        finally:
            h.close()
    asyncio.run(main())


@pytest.mark.parametrize("version", [1, 3, 6])
def test_offset_fetch_of_another_nodes_group_puts_the_error_where_the_version_has_it(tmp_path, version):
    async def main():
        h = Harness(tmp_path)
        await h.coord.start()
        try:
            spec = h.registry.topics[OFFSETS_TOPIC]
            h.registry.put(TopicSpec(OFFSETS_TOPIC, 5, spec.config, origin="internal", internal=True,
                                     assignment=((1,),) * 5, nodes={1: ("broker1", 9093)}))
            resp = await h.call(FETCH, version, group_id="g", topics=[{"name": "t", "partition_indexes": [0]}],
                                require_stable=False)
            if version < 2:  # no top-level error code in v1: each partition carries it
                assert [(p.committed_offset, p.error_code) for p in resp.topics[0].partitions] == [(-1, 16)]
            else:
                assert (resp.error_code, resp.topics) == (16, [])
        finally:
            h.close()
    asyncio.run(main())


@coordinator_test
async def test_loading_skips_other_coordinators_records_and_names_a_corrupt_one(h):
    assert await h.commit({("t", 0): 4}) == {("t", 0): 0}
    log = h.registry.local_log(OFFSETS_TOPIC, partition_for("g", 5))
    # A KIP-848 consumer-group record (key version 3) is not ours: loading goes past it.
    log.append(encode_batch([Record(0, START_MS, bytes.fromhex("0003" "0001" "67"), b"\x00\x00")]))
    await h.restart()
    assert await h.committed() == {("t", 0): 4}
    log = h.registry.local_log(OFFSETS_TOPIC, partition_for("g", 5))
    bad_offset = log.log_end_offset
    log.append(encode_batch([Record(0, START_MS, encode_key(OffsetCommitKey("g", "t", 1)), b"\x00\x03\x00")]))
    with pytest.raises(OffsetRecordError, match=f"__consumer_offsets-{partition_for('g', 5)} offset {bad_offset}"):
        await h.restart()
