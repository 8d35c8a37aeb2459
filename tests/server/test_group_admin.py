"""ListGroups, DescribeGroups, DeleteGroups, OffsetDelete and FindCoordinator's null key, driven directly.

The harness of test_group_coordinator: every request goes through kafka-python's encoder and our decoder,
every answer through our encoder and kafka-python's decoder, so each version's layout is checked too; the
logs are real and only the clock is fake.
"""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_group_coordinator import (
    DELAY,
    FIND,
    LEAVE,
    Harness,
    coordinator_test,
    settle,
    stable_group,
    subscription,
)

from shale.sidecar.server.apis.authorized_operations import GROUP_OPERATIONS
from shale.sidecar.server.coordinator.group.model import CommitPartition, GroupState
from shale.sidecar.server.coordinator.group.offset_records import (
    OFFSETS_TOPIC,
    GroupMetadataKey,
    OffsetCommitKey,
    partition_for,
)
from shale.sidecar.topic_config import TopicConfig
from shale.sidecar.topics.registry import TopicSpec

DESCRIBE, LIST, DELETE, OFFSET_DELETE = 15, 16, 42, 47


async def listed(h: Harness, version: int = 5, states=(), types=()) -> tuple[int, list[tuple]]:
    values = {}
    if version >= 4:
        values["states_filter"] = list(states)
    if version >= 5:
        values["types_filter"] = list(types)
    resp = await h.call(LIST, version, **values)
    rows = [(g.group_id, g.protocol_type) + ((g.group_state,) if version >= 4 else ())
            + ((g.group_type,) if version >= 5 else ()) for g in resp.groups]
    return resp.error_code, sorted(rows)


async def delete_offsets(h: Harness, group: str, **topics: list[int]):
    resp = await h.call(OFFSET_DELETE, 0, group_id=group, topics=[
        {"name": t, "partitions": [{"partition_index": p} for p in ps]} for t, ps in topics.items()])
    return resp.error_code, {(t.name, p.partition_index): p.error_code for t in resp.topics for p in t.partitions}


# -- ListGroups ---------------------------------------------------------------------------------------------------


@coordinator_test
async def test_list_groups_shows_every_group_with_its_state_and_filters_like_kafka(h):
    await stable_group(h, 2)  # "g": Stable, consumer protocol
    assert await h.commit({("u", 0): 3}, group="solo") == {("u", 0): 0}  # offsets only: Empty, no protocol
    assert await listed(h) == (0, [("g", "consumer", "Stable", "classic"), ("solo", "", "Empty", "classic")])
    assert await listed(h, 0) == (0, [("g", "consumer"), ("solo", "")])
    # States match case-insensitively and trimmed; types case-insensitively; an unknown type matches nothing.
    assert (await listed(h, 4, states=[" stable"]))[1] == [("g", "consumer", "Stable")]
    assert (await listed(h, 5, states=["Empty", "Dead"]))[1] == [("solo", "", "Empty", "classic")]
    assert (await listed(h, 5, types=["CLASSIC"]))[1] == [("g", "consumer", "Stable", "classic"),
                                                           ("solo", "", "Empty", "classic")]
    assert await listed(h, 5, types=["consumer"]) == (0, [])
    assert await listed(h, 5, states=["PreparingRebalance"]) == (0, [])
    assert await listed(h, 5, states=[None], types=[None]) == (0, [])  # null entries no client sends: no match
    h.coord.close()
    assert await listed(h) == (15, [])  # COORDINATOR_NOT_AVAILABLE


@coordinator_test
async def test_list_groups_leaves_out_groups_another_node_coordinates(h):
    others = [g for g in (f"group-{i}" for i in range(40)) if partition_for(g, 5) == 1]
    mine = [g for g in (f"group-{i}" for i in range(40)) if partition_for(g, 5) != 1]
    for g in others[:2] + mine[:2]:
        assert await h.commit({("t", 0): 1}, group=g) == {("t", 0): 0}
    spec = h.registry.topics[OFFSETS_TOPIC]
    h.registry.put(TopicSpec(OFFSETS_TOPIC, 5, spec.config, origin="internal", internal=True,
                             assignment=((0,), (1,), (0,), (0,), (0,)), nodes={1: ("broker1", 9093)}))
    assert [row[0] for row in (await listed(h))[1]] == sorted(mine[:2])


# -- DescribeGroups -----------------------------------------------------------------------------------------------


@coordinator_test
async def test_describe_a_stable_group_shows_members_subscriptions_and_assignments(h):
    (a, b), generation = await stable_group(h, 2)
    resp = await h.call(DESCRIBE, 5, groups=["g"], include_authorized_operations=True)
    (g,) = resp.groups
    assert (g.error_code, g.group_id, g.group_state, g.protocol_type, g.protocol_data) == (
        0, "g", "Stable", "consumer", "range")
    assert g.authorized_operations == set(GROUP_OPERATIONS)  # no authorizer: everything a group supports
    group = h.coord.groups["g"]
    assert [(m.member_id, m.group_instance_id, m.client_id, m.client_host, bytes(m.member_metadata),
             bytes(m.member_assignment)) for m in g.members] == [
        (mid, None, f"client-{i}", "/10.0.0.9", subscription("t"), group.members[mid].assignment)
        for i, mid in enumerate((a, b))]
    assert all(m.member_assignment for m in g.members)
    # Without the flag (or before v3) the operations are left out (Kafka's INT32_MIN, decoded as None).
    resp = await h.call(DESCRIBE, 2, groups=["g"])
    assert resp.groups[0].group_state == "Stable" and len(resp.groups[0].members) == 2
    assert (await h.call(DESCRIBE, 4, groups=["g"], include_authorized_operations=False)
            ).groups[0].authorized_operations is None


@coordinator_test
async def test_describe_a_rebalancing_group_hides_metadata_and_unknown_groups_are_dead_or_not_found(h):
    (a, b), generation = await stable_group(h, 2)
    resp = await h.call(LEAVE, 0, group_id="g", member_id=b)
    assert resp.error_code == 0
    resp = await h.call(DESCRIBE, 6, groups=["g", "nobody", ""])
    g, nobody, empty = resp.groups
    assert (g.group_state, g.protocol_data, [m.member_id for m in g.members]) == ("PreparingRebalance", "", [a])
    assert (bytes(g.members[0].member_metadata), bytes(g.members[0].member_assignment)) == (b"", b"")
    # v6 (KIP-1043): GROUP_ID_NOT_FOUND with a message; the empty group id is a group id like any other.
    assert (nobody.error_code, nobody.error_message, nobody.group_state) == (69, "Group nobody not found.", "Dead")
    assert (empty.error_code, empty.group_id) == (69, "")
    resp = await h.call(DESCRIBE, 5, groups=["nobody", None])
    assert [(g.error_code, g.group_state) for g in resp.groups] == [(0, "Dead"), (24, "")]  # null: INVALID_GROUP_ID


@coordinator_test
async def test_describe_groups_another_node_coordinates_answers_not_coordinator(h):
    spec = h.registry.topics[OFFSETS_TOPIC]
    h.registry.put(TopicSpec(OFFSETS_TOPIC, 5, spec.config, origin="internal", internal=True,
                             assignment=((1,),) * 5, nodes={1: ("broker1", 9093)}))
    resp = await h.call(DESCRIBE, 6, groups=["g"])
    assert (resp.groups[0].error_code, resp.groups[0].group_state) == (16, "")


# -- DeleteGroups -------------------------------------------------------------------------------------------------


@coordinator_test
async def test_delete_groups_removes_only_empty_groups_with_their_offsets_for_good(h):
    (a, b), generation = await stable_group(h, 2)
    assert await h.commit({("t", 0): 7}, member_id=a, generation=generation) == {("t", 0): 0}
    assert await h.commit({("t", 1): 4, ("u", 0): 2}, group="solo") == {("t", 1): 0, ("u", 0): 0}
    resp = await h.call(DELETE, 2, groups_names=["g", "solo", "nobody", "solo", None])
    # Duplicates are answered once; a group with members is not empty; an unknown one is not found.
    assert [(r.group_id, r.error_code) for r in resp.results] == [("g", 68), ("solo", 0), ("nobody", 69),
                                                                  (None, 24)]
    assert "solo" not in h.coord.groups and "g" in h.coord.groups
    assert sorted(h.records("solo")[-3:], key=str) == sorted(
        [(OffsetCommitKey("solo", "t", 1), None), (OffsetCommitKey("solo", "u", 0), None),
         (GroupMetadataKey("solo"), None)], key=str)
    assert await h.committed(group="solo", topics=None) == {}
    # Once its members leave, the group can go too; neither comes back after a restart.
    for m in (a, b):
        assert (await h.call(LEAVE, 0, group_id="g", member_id=m)).error_code == 0
    assert h.coord.groups["g"].state is GroupState.EMPTY
    resp = await h.call(DELETE, 0, groups_names=["g"])
    assert [(r.group_id, r.error_code) for r in resp.results] == [("g", 0)]
    await h.restart()
    assert await listed(h) == (0, [])
    assert await h.committed(group="g", topics=None) == {}


# -- OffsetDelete -------------------------------------------------------------------------------------------------


@coordinator_test
async def test_offset_delete_refuses_what_a_live_consumer_reads_and_deletes_the_rest(h):
    (a, b), generation = await stable_group(h, 2)  # the members subscribe to "t"
    assert await h.commit({("t", 0): 7, ("u", 0): 3, ("u", 1): 4}, member_id=a, generation=generation) == {
        ("t", 0): 0, ("u", 0): 0, ("u", 1): 0}
    code, parts = await delete_offsets(h, "g", t=[0], u=[0, 9], gone=[0])
    assert code == 0
    assert parts == {("t", 0): 86,  # GROUP_SUBSCRIBED_TO_TOPIC
                     ("u", 0): 0, ("u", 9): 3, ("gone", 0): 3}  # no partition 9, no topic "gone"
    assert await h.committed(topics=None) == {("t", 0): 7, ("u", 1): 4}
    assert h.records()[-1] == (OffsetCommitKey("g", "u", 0), None)
    # A partition without a committed offset is answered NONE and writes nothing.
    written = len(h.records())
    assert await delete_offsets(h, "g", u=[0]) == (0, {("u", 0): 0})
    assert len(h.records()) == written
    # Once the group is empty nothing is subscribed any more.
    for m in (a, b):
        assert (await h.call(LEAVE, 0, group_id="g", member_id=m)).error_code == 0
    assert await delete_offsets(h, "g", t=[0]) == (0, {("t", 0): 0})
    assert await h.committed(topics=None) == {("u", 1): 4}


@coordinator_test
async def test_offset_delete_group_level_errors(h):
    assert await delete_offsets(h, "", t=[0]) == (24, {})  # INVALID_GROUP_ID
    assert await delete_offsets(h, "nobody", t=[0]) == (69, {})  # GROUP_ID_NOT_FOUND
    # A group of another protocol type with members: NON_EMPTY_GROUP (only consumer groups know their topics).
    mid = (await h.join(protocol_type="connect")).member_id
    join = h.join(mid, protocol_type="connect")
    await settle()
    h.clock.advance(DELAY)
    assert (await join).error_code == 0
    assert await delete_offsets(h, "g", t=[0]) == (68, {})


# -- a deleted topic ----------------------------------------------------------------------------------------------


@coordinator_test
async def test_a_deleted_topics_offsets_go_from_every_group(h):
    assert await h.commit({("u", 0): 1, ("t", 0): 2}, group="one") == {("u", 0): 0, ("t", 0): 0}
    assert await h.commit({("u", 1): 5}, group="two") == {("u", 1): 0}
    h.registry.remove("u")
    h.coord.topic_deleted("u")
    assert await h.committed(group="one", topics=None) == {("t", 0): 2}
    assert await h.committed(group="two", topics=None) == {}
    assert h.records("one")[-1] == (OffsetCommitKey("one", "u", 0), None)
    await h.restart()
    assert await h.committed(group="one", topics=None) == {("t", 0): 2}


# -- FindCoordinator with a null key ------------------------------------------------------------------------------


@pytest.mark.parametrize("version", [0, 3])
@coordinator_test
async def test_find_coordinator_with_a_null_key_answers_invalid_group_id(h, version):
    resp = await h.call(FIND, version, key=None, key_type=0)
    assert (resp.error_code, resp.node_id, resp.host, resp.port) == (24, -1, "", -1)
    if version >= 1:
        assert resp.error_message == "the coordinator key (group id) is null"


@coordinator_test
async def test_find_coordinator_batched_with_a_null_key_answers_that_key_only(h):
    resp = await h.call(FIND, 4, key_type=0, coordinator_keys=[None, "g"])
    assert [(c.key, c.error_code, c.node_id) for c in resp.coordinators] == [(None, 24, -1), ("g", 0, 0)]


# -- the coordinator against a model, with restarts ---------------------------------------------------------------

GROUPS = ("g1", "g2", "g3")
PARTITIONS = [("t", p) for p in range(4)] + [("u", p) for p in range(2)]
steps = st.lists(st.one_of(
    st.tuples(st.just("commit"), st.sampled_from(GROUPS), st.sampled_from(PARTITIONS), st.integers(0, 1000)),
    st.tuples(st.just("delete_offset"), st.sampled_from(GROUPS), st.sampled_from(PARTITIONS)),
    st.tuples(st.just("delete_group"), st.sampled_from(GROUPS)),
    st.tuples(st.just("delete_topic_u")),
    st.tuples(st.just("restart")),
), max_size=25)


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=steps)
def test_commits_and_deletions_match_a_model_across_restarts(tmp_path_factory, steps):
    """Standalone commits, OffsetDelete, DeleteGroups and topic deletion, in any order: what the coordinator
    answers and what it loads back from `__consumer_offsets` after a restart is the model's."""
    model: dict[str, dict[tuple[str, int], int]] = {}

    async def check(h: Harness) -> None:
        assert sorted(g.group_id for g in h.coord.list_groups()[1]) == sorted(model)
        for g in GROUPS:
            code, found = h.coord.fetch_offsets(g, None)
            assert code == 0 and {(t, p): v.offset for t, parts in found for p, v in parts} == model.get(g, {})

    async def main(h: Harness) -> None:
        for step in steps:
            if step[0] == "commit":
                _, g, tp, offset = step
                assert h.coord.commit_offsets(g, -1, "", None, [CommitPartition(*tp, offset)]) == {tp: 0}
                model.setdefault(g, {})[tp] = offset
            elif step[0] == "delete_offset":
                _, g, tp = step
                code, parts = h.coord.delete_offsets(g, [(tp[0], [tp[1]])])
                assert (code, parts) == ((0, [(tp[0], [(tp[1], 0)])]) if g in model else (69, []))
                model.get(g, {}).pop(tp, None)
            elif step[0] == "delete_group":
                _, g = step
                assert h.coord.delete_groups([g]) == [(g, 0 if g in model else 69)]
                model.pop(g, None)
            elif step[0] == "delete_topic_u":
                h.registry.remove("u")
                h.coord.topic_deleted("u")
                h.registry.put(TopicSpec("u", 2, TopicConfig.from_mapping({})))
                for offsets in model.values():
                    for tp in [tp for tp in offsets if tp[0] == "u"]:
                        del offsets[tp]
            else:
                await h.restart()
                for g in [g for g, offsets in model.items() if not offsets]:
                    del model[g]  # a group with nothing left is not loaded back, as in Kafka
            await check(h)
        await h.restart()
        for g in [g for g, offsets in model.items() if not offsets]:
            del model[g]
        await check(h)

    async def run() -> None:
        h = Harness(tmp_path_factory.mktemp("model"))
        await h.coord.start()
        try:
            await main(h)
        finally:
            h.close()

    asyncio.run(run())
