"""Incremental fetch sessions (KIP-227) as pure state machines: the leader's cache and the fetcher's handler.

Named after the failure cases of docs/fetch-sessions.md; the property test drives both sides through random
rounds (records, high watermark moves, partitions added and dropped, lost answers, leader restarts) and checks
that the fetcher sees every change a full fetch would have shown it.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from hypothesis import given, settings
from hypothesis import strategies as st

from shale.sidecar.protocol.error_codes import (
    FETCH_SESSION_ID_NOT_FOUND,
    INVALID_FETCH_SESSION_EPOCH,
    NONE,
    NOT_LEADER_OR_FOLLOWER,
)
from shale.sidecar.replication.fetch_session import (
    EVICTION_MS,
    FINAL_EPOCH,
    INITIAL_EPOCH,
    FetchSessionCache,
    next_epoch,
)
from shale.sidecar.replication.fetch_session_handler import FetchSessionHandler


@dataclass(frozen=True)
class Req:
    """A request's partition, as the codec gives it (attributes)."""

    partition: int
    fetch_offset: int = 0


def _out(partition: int, hw: int, *, records: bytes = b"", error: int = NONE, log_start: int = 0,
         diverging: int = -1) -> dict:
    return {"partition_index": partition, "error_code": error, "high_watermark": hw, "last_stable_offset": hw,
            "log_start_offset": log_start, "records": records, "diverging_epoch": {"epoch": diverging, "end_offset": 0}}


def _open(cache: FetchSessionCache, parts: dict[int, int], now: int = 0, follower: bool = True) -> int:
    """A full fetch of partitions (index → HW) of topic "t"; the new session's id."""
    ctx = cache.context(0, INITIAL_EPOCH, [("t", [Req(p) for p in parts])], [], follower, now)
    error, session_id, responses = ctx.answer([{"topic": "t", "partitions": [_out(p, hw) for p, hw in parts.items()]}],
                                              now)
    assert error == NONE and len(responses[0]["partitions"]) == len(parts)
    return session_id


def _answered(responses: list[dict]) -> list[tuple[str, int]]:
    return [(t["topic"], p["partition_index"]) for t in responses for p in t["partitions"]]


def test_full_fetch_opens_a_session_and_the_next_fetch_reads_every_partition_of_it():
    cache = FetchSessionCache()
    session_id = _open(cache, {0: 5, 1: 5, 2: 5})
    assert session_id > 0 and cache.get(session_id).epoch == 1
    ctx = cache.context(session_id, 1, [], [], True, 1)
    assert ctx.error == NONE and [(t, [p.partition for p in ps]) for t, ps in ctx.topics] == [("t", [0, 1, 2])]
    # Nothing changed but partition 1's records: only it is answered.
    error, sid, responses = ctx.answer([{"topic": "t", "partitions": [_out(0, 5), _out(1, 5, records=b"x"),
                                                                     _out(2, 5)]}], 1)
    assert (error, sid, _answered(responses)) == (NONE, session_id, [("t", 1)])
    assert cache.get(session_id).epoch == 2


def test_high_watermark_change_alone_is_answered():
    cache = FetchSessionCache()
    session_id = _open(cache, {0: 5, 1: 5})
    ctx = cache.context(session_id, 1, [], [], True, 1)
    assert _answered(ctx.answer([{"topic": "t", "partitions": [_out(0, 6), _out(1, 5)]}], 1)[2]) == [("t", 0)]
    ctx = cache.context(session_id, 2, [], [], True, 2)  # the same HW again is not news
    assert ctx.answer([{"topic": "t", "partitions": [_out(0, 6), _out(1, 5)]}], 2)[2] == []


def test_partition_that_moves_away_is_answered_with_its_error_then_forgotten():
    """An error is answered every round it lasts; the fetcher then drops the partition from its session."""
    cache = FetchSessionCache()
    session_id = _open(cache, {0: 5, 1: 5})
    for epoch in (1, 2):  # answered every time while the error lasts
        ctx = cache.context(session_id, epoch, [], [], True, epoch)
        _, _, responses = ctx.answer([{"topic": "t", "partitions": [
            _out(0, 5, error=NOT_LEADER_OR_FOLLOWER), _out(1, 5)]}], epoch)
        assert _answered(responses) == [("t", 0)]
    # It leads here again, at the HW it had before the error: answered once more, so the fetcher learns it.
    ctx = cache.context(session_id, 3, [], [], True, 3)
    assert _answered(ctx.answer([{"topic": "t", "partitions": [_out(0, 5), _out(1, 5)]}], 3)[2]) == [("t", 0)]
    ctx = cache.context(session_id, 4, [], [("t", 0)], True, 4)
    assert [p.partition for _, ps in ctx.topics for p in ps] == [1]


def test_diverging_epoch_is_answered_and_the_new_offset_is_sent():
    cache, handler = FetchSessionCache(), FetchSessionHandler()
    fields = {("t", 0): Req(0, 10), ("t", 1): Req(1, 10)}
    plan = handler.build(fields)
    ctx = cache.context(plan.session_id, plan.epoch, [("t", [fields[k] for k in plan.send])], [], True, 0)
    error, sid, responses = ctx.answer([{"topic": "t", "partitions": [_out(0, 10), _out(1, 10)]}], 0)
    assert handler.handle(plan, error, sid, _answered(responses))
    ctx = cache.context(sid, handler.epoch, [], [], True, 1)
    _, _, responses = ctx.answer([{"topic": "t", "partitions": [_out(0, 10, diverging=3), _out(1, 10)]}], 1)
    assert _answered(responses) == [("t", 0)]
    assert handler.handle(handler.build(fields), NONE, sid, _answered(responses))
    # The follower truncated partition 0: its new fetch offset is the only partition on the wire.
    plan = handler.build({("t", 0): Req(0, 7), ("t", 1): Req(1, 10)})
    assert (plan.send, plan.forgotten, plan.full) == ([("t", 0)], [], False)
    assert cache.context(plan.session_id, plan.epoch, [("t", [Req(0, 7)])], [], True, 2).topics == [
        ("t", [Req(0, 7), Req(1, 10)])]


def test_stale_epoch_is_refused_without_changing_the_session():
    cache = FetchSessionCache()
    session_id = _open(cache, {0: 5})
    cache.context(session_id, 1, [], [], True, 1).answer([{"topic": "t", "partitions": [_out(0, 5)]}], 1)
    ctx = cache.context(session_id, 1, [("t", [Req(0, 99)])], [], True, 2)  # a retry of epoch 1
    assert ctx.error == INVALID_FETCH_SESSION_EPOCH and ctx.topics == []
    assert ctx.answer([], 2) == (INVALID_FETCH_SESSION_EPOCH, 0, [])
    session = cache.get(session_id)
    assert session.epoch == 2 and session.partitions["t", 0].request == Req(0)
    assert cache.errors == {INVALID_FETCH_SESSION_EPOCH: 1}  # shale_fetch_session_errors_total


def test_unknown_session_is_refused_and_the_fetcher_starts_over():
    cache, handler = FetchSessionCache(), FetchSessionHandler()
    handler.session_id, handler.epoch = 12345, 7  # a session the leader lost (it restarted)
    plan = handler.build({("t", 0): Req(0)})
    assert not plan.full
    ctx = cache.context(plan.session_id, plan.epoch, [], [], True, 0)
    assert ctx.error == FETCH_SESSION_ID_NOT_FOUND and cache.errors == {FETCH_SESSION_ID_NOT_FOUND: 1}
    assert not handler.handle(plan, ctx.error, 0, [])
    assert (handler.session_id, handler.epoch) == (0, INITIAL_EPOCH)
    assert handler.build({("t", 0): Req(0)}).full


def test_lost_answer_resets_to_a_full_fetch_that_replaces_the_session():
    cache, handler = FetchSessionCache(), FetchSessionHandler()
    fields = {("t", 0): Req(0, 3), ("t", 1): Req(1, 3)}
    plan = handler.build(fields)
    error, sid, responses = cache.context(0, INITIAL_EPOCH, [("t", [fields[k] for k in plan.send])], [], True,
                                          0).answer([{"topic": "t", "partitions": [_out(0, 3), _out(1, 3)]}], 0)
    assert handler.handle(plan, error, sid, _answered(responses))
    handler.build(fields)
    cache.context(sid, 1, [], [], True, 1)  # the leader took epoch 1; its answer never arrives
    handler.failed()
    plan = handler.build(fields)
    assert plan.full and plan.session_id == sid and sorted(plan.send) == sorted(fields)
    ctx = cache.context(plan.session_id, plan.epoch, [("t", list(fields.values()))], [], True, 2)
    assert cache.get(sid) is None  # replaced: the full fetch closed it
    error, new_sid, responses = ctx.answer([{"topic": "t", "partitions": [_out(0, 3), _out(1, 3)]}], 2)
    assert handler.handle(plan, error, new_sid, _answered(responses))
    assert new_sid not in (0, sid) and handler.session_id == new_sid and handler.epoch == 1
    assert not cache.errors  # the fetcher started over by itself: no error answered


def test_full_cache_answers_sessionless():
    cache = FetchSessionCache(slots=2)
    first, second = _open(cache, {0: 1, 1: 1}), _open(cache, {0: 1, 1: 1})
    assert _open(cache, {0: 1}, now=1) == 0  # a smaller follower session evicts no follower session
    assert _open(cache, {0: 1}, now=1, follower=False) == 0
    assert cache.get(first) and cache.get(second)
    handler = FetchSessionHandler()
    plan = handler.build({("t", 0): Req(0)})
    assert handler.handle(plan, NONE, 0, [("t", 0)]) and handler.build({("t", 0): Req(0)}).full


def test_without_consumer_sessions_only_followers_get_one():
    """A node under an authorizer: a consumer's full fetch is answered in full with no session, as with no slot."""
    cache = FetchSessionCache(consumer_sessions=False)
    assert _open(cache, {0: 1}, follower=False) == 0 and len(cache) == 0
    assert _open(cache, {0: 1}, follower=True) > 0 and len(cache) == 1


def test_follower_session_evicts_a_consumer_session_and_idle_sessions_go():
    cache = FetchSessionCache(slots=1)
    consumer = _open(cache, {0: 1, 1: 1, 2: 1}, follower=False)
    follower = _open(cache, {0: 1}, now=1)
    assert follower and cache.get(consumer) is None
    # Idle past EVICTION_MS, even a follower's session gives way to a consumer's.
    assert _open(cache, {0: 1}, now=2 + EVICTION_MS, follower=False) and cache.get(follower) is None


def test_final_epoch_closes_the_session_and_opens_none():
    cache = FetchSessionCache()
    session_id = _open(cache, {0: 1})
    ctx = cache.context(session_id, FINAL_EPOCH, [("t", [Req(0)])], [], True, 1)
    assert ctx.answer([{"topic": "t", "partitions": [_out(0, 1)]}], 1)[1] == 0 and len(cache) == 0


def test_forgetting_every_partition_ends_the_session():
    cache = FetchSessionCache()
    session_id = _open(cache, {0: 1})
    ctx = cache.context(session_id, 1, [], [("t", 0)], True, 1)
    assert ctx.topics == [] and cache.get(session_id) is None and ctx.answer([], 1) == (NONE, 0, [])


def test_a_fetch_answered_after_a_later_one_of_its_session_is_refused():
    cache = FetchSessionCache()
    session_id = _open(cache, {0: 1})
    parked = cache.context(session_id, 1, [], [], True, 1)  # waits at the leader...
    cache.context(session_id, 2, [], [], True, 2)  # ...while the fetcher, having given up on it, sent epoch 2
    assert parked.answer([{"topic": "t", "partitions": [_out(0, 2)]}], 3) == (INVALID_FETCH_SESSION_EPOCH,
                                                                               session_id, [])


def test_epoch_wraps_to_one_not_zero():
    assert next_epoch(2**31 - 1) == 1 and next_epoch(0) == 1 and next_epoch(-1) == -1
    cache, handler = FetchSessionCache(), FetchSessionHandler()
    session_id = _open(cache, {0: 1})
    cache.get(session_id).epoch = handler.epoch = 2**31 - 1
    handler.session_id = session_id
    plan = handler.build({("t", 0): Req(0)})
    error, sid, responses = cache.context(plan.session_id, plan.epoch, [], [], True, 1).answer(
        [{"topic": "t", "partitions": [_out(0, 1)]}], 1)
    assert handler.handle(plan, error, sid, _answered(responses))
    assert handler.epoch == cache.get(session_id).epoch == 1


def test_an_answer_naming_a_partition_outside_the_session_is_not_applied():
    handler = FetchSessionHandler()
    plan = handler.build({("t", 0): Req(0)})
    assert handler.handle(plan, NONE, 77, [("t", 0)])
    plan = handler.build({("t", 0): Req(0)})
    assert not handler.handle(plan, NONE, 77, [("t", 0), ("t", 9)])
    assert (handler.session_id, handler.epoch) == (77, INITIAL_EPOCH)  # the next fetch replaces the session


# -- both sides through random rounds ---------------------------------------------------------------------------


@settings(max_examples=500, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["records", "hw", "hw", "log_start", "add", "drop", "lose", "restart",
                                           "idle"]), st.integers(0, 3)), min_size=1, max_size=60),
       st.integers(0, 2**32))
def test_the_fetcher_sees_every_change_a_full_fetch_would_show(events, seed):
    """A model leader (per partition: log end, HW, log start) and a model follower (fetch offset, last HW and
    log start seen) exchange fetches through the two state machines; after every answered round the follower
    knows what a full fetch would have told it, whatever was lost or restarted before."""
    rng = random.Random(seed)
    cache, handler = FetchSessionCache(slots=rng.choice([0, 1, 4])), FetchSessionHandler()
    leader = {p: [0, 0, 0] for p in range(4)}  # partition -> [log end, hw, log start]
    follower: dict[int, list[int]] = {p: [0, -1, -1] for p in range(3)}  # partition -> [fetch offset, hw, start]
    now = 0
    for kind, p in events:
        now += 1000
        if kind == "records":
            leader[p][0] += 1
        elif kind == "hw":
            leader[p][1] = leader[p][0]
        elif kind == "log_start":
            leader[p][2] = leader[p][1]
        elif kind == "add" and p not in follower:
            follower[p] = [0, -1, -1]
        elif kind == "drop" and p in follower and len(follower) > 1:
            del follower[p]
        elif kind == "restart":
            cache = FetchSessionCache(slots=cache.slots)
        elif kind == "idle":
            now += EVICTION_MS
        fields = {("t", q): Req(q, f[0]) for q, f in follower.items()}
        plan = handler.build(fields)
        ctx = cache.context(plan.session_id, plan.epoch, [("t", [fields[k] for k in plan.send])],
                            list(plan.forgotten), True, now)
        if kind == "lose":  # the answer never arrives
            if not ctx.error:
                ctx.answer(_read(ctx, leader), now)
            handler.failed()
            continue
        error, sid, responses = ctx.answer(_read(ctx, leader), now)
        if not handler.handle(plan, error, sid, _answered(responses)):
            assert error in (FETCH_SESSION_ID_NOT_FOUND, INVALID_FETCH_SESSION_EPOCH), error
            continue
        for t in responses:
            for out in t["partitions"]:
                f = follower[out["partition_index"]]
                if out["records"]:  # read from where this follower asked, never from a stale position
                    start, end = map(int, out["records"].split(b":"))
                    assert start == f[0], (out, f)
                    f[0] = end
                f[1], f[2] = out["high_watermark"], out["log_start_offset"]
        # What a full fetch would show now, before any record arrives in between: nothing left to tell.
        for q, f in follower.items():
            end, hw, start = leader[q]
            assert f[0] == end and (f[1], f[2]) == (hw, start), (q, f, leader[q], kind)


def _read(ctx, leader: dict[int, list[int]]) -> list[dict]:
    """The leader's read of the context's partitions: records "from:to", the fetch offset to the log end."""
    return [{"topic": topic, "partitions": [
        _out(r.partition, leader[r.partition][1], log_start=leader[r.partition][2],
             records=f"{r.fetch_offset}:{leader[r.partition][0]}".encode() if r.fetch_offset < leader[r.partition][0]
             else b"")
        for r in partitions]} for topic, partitions in ctx.topics]
