"""The authorization layer (sidecar/server/apis/authorization.py) against the authorizer's own decisions: for random
ACL sets and requests, each item's answer is the authorizer's verdict, the handler sees exactly the allowed
items, and listings hide what may not be described. Requests go through the real codec; the handler behind
the layer is a recorder that answers every item it is given with NONE."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kafka.protocol.admin.groups import DeleteGroupsRequest, ListGroupsRequest
from kafka.protocol.consumer.fetch import FetchRequest
from kafka.protocol.consumer.group import OffsetFetchRequest
from kafka.protocol.metadata.metadata import MetadataRequest
from kafka.protocol.producer.produce import ProduceRequest

from shale.sidecar.protocol import codec
from shale.sidecar.protocol.error_codes import (
    GROUP_AUTHORIZATION_FAILED,
    NONE,
    TOPIC_AUTHORIZATION_FAILED,
    TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
)
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
from shale.sidecar.security.principal import KafkaPrincipal
from shale.sidecar.server.apis.authorization import UNCHECKED, authorize_handlers
from shale.sidecar.server.network.handler import ConnectionInfo
from support.clients_util import build, request_frame

O, P, R = AclOperation, AclPermissionType, ResourceType
ALICE = KafkaPrincipal.user("alice")
CONN = ConnectionInfo("test", "10.0.0.7", ALICE, "SASL_PLAINTEXT")
NAMES = ["orders", "orders-eu", "or", "payments", "p"]

bindings = st.builds(
    lambda rt, name, pattern, principal, host, op, perm: AclBinding(ResourcePattern(rt, name, pattern),
                                                                    AccessControlEntry(principal, host, op, perm)),
    st.sampled_from([R.TOPIC, R.GROUP, R.TRANSACTIONAL_ID]), st.sampled_from([*NAMES, "*"]),
    st.sampled_from([PatternType.LITERAL, PatternType.PREFIXED]),
    st.sampled_from(["User:alice", "User:*", "User:bob"]), st.sampled_from(["*", "10.0.0.7", "10.0.0.8"]),
    st.sampled_from([O.READ, O.WRITE, O.DESCRIBE, O.DELETE, O.ALL, O.CREATE]),
    st.sampled_from([P.ALLOW, P.DENY]))
acl_sets = st.lists(bindings, max_size=8)
topic_parts = st.dictionaries(st.sampled_from(NAMES), st.lists(st.integers(0, 3), min_size=1, max_size=3, unique=True),
                              max_size=4)


def authorizer_of(acls: list[AclBinding], allow_everyone: bool = False) -> Authorizer:
    a = Authorizer(allow_everyone_if_no_acl_found=allow_everyone)
    for b in acls:
        a.add(b)
    return a


def decoded(message) -> codec.Request:
    return codec.decode_request(request_frame(message)[4:])


class Recorder:
    """The handler behind the layer: remembers the request it got, answers each of its items with NONE."""

    def __init__(self) -> None:
        self.seen: list[codec.Request] = []

    async def produce(self, request, conn):
        self.seen.append(request)
        return {"responses": [{"name": t.name, "partition_responses": [{"index": p.index, "error_code": NONE}
                                                                       for p in t.partition_data]}
                              for t in request.body.topic_data]}

    async def fetch(self, request, conn):
        self.seen.append(request)
        return {"error_code": NONE, "responses": [
            {"topic": t.topic, "partitions": [{"partition_index": p.partition, "error_code": NONE}
                                              for p in t.partitions]} for t in request.body.topics]}

    async def metadata(self, request, conn):
        self.seen.append(request)
        every = request.body.topics is None or (request.api_version == 0 and not request.body.topics)
        names = NAMES if every else [t.name for t in request.body.topics]  # v0: an empty list is every topic
        return {"topics": [{"name": n, "error_code": NONE, "partitions": [], "authorized_operations": frozenset()}
                           for n in names], "brokers": []}

    async def list_groups(self, request, conn):
        self.seen.append(request)
        return {"error_code": NONE, "groups": [{"group_id": g, "protocol_type": "consumer"} for g in NAMES]}

    async def offset_fetch(self, request, conn):
        self.seen.append(request)
        return {"groups": [{"group_id": g.group_id, "error_code": NONE, "topics": [
            {"name": t, "partitions": [{"partition_index": 0, "committed_offset": 5, "error_code": NONE}]}
            for t in (NAMES if g.topics is None else [t.name for t in g.topics])]} for g in request.body.groups]}

    async def delete_groups(self, request, conn):
        self.seen.append(request)
        return {"results": [{"group_id": g, "error_code": NONE} for g in request.body.groups_names]}


def run(acls, key: int, handler, request: codec.Request):
    wrapped = authorize_handlers({key: handler}, authorizer_of(acls), lambda _id: None)
    return asyncio.run(wrapped[key](request, CONN))


def answers(response: dict, topics_key: str, name_key: str, parts_key: str, index_key: str) -> dict:
    return {(t[name_key], p[index_key]): p["error_code"] for t in response[topics_key] for p in t[parts_key]}


@settings(max_examples=200, deadline=None)
@given(acls=acl_sets, topics=topic_parts, txn=st.sampled_from([None, "orders", "p"]))
def test_produce_answers_each_partition_as_the_authorizer_decides(acls, topics, txn):
    recorder = Recorder()
    request = decoded(build(ProduceRequest, {"transactional_id": txn, "acks": 1, "timeout_ms": 100, "topic_data": [
        {"name": t, "partition_data": [{"index": p, "records": None} for p in parts]} for t, parts in topics.items()]},
        version=9))
    response = run(acls, 0, recorder.produce, request)
    authorizer = authorizer_of(acls)
    txn_ok = txn is None or authorizer.authorize(ALICE, CONN.host, O.WRITE, R.TRANSACTIONAL_ID, txn)
    allowed = {t for t in topics if txn_ok and authorizer.authorize(ALICE, CONN.host, O.WRITE, R.TOPIC, t)}
    expected = {(t, p): NONE if t in allowed else
                (TOPIC_AUTHORIZATION_FAILED if txn_ok else TRANSACTIONAL_ID_AUTHORIZATION_FAILED)
                for t, parts in topics.items() for p in parts}
    assert answers(response, "responses", "name", "partition_responses", "index") == expected
    handed = {t.name for r in recorder.seen for t in r.body.topic_data}
    assert handed == allowed
    assert len(recorder.seen) == (1 if allowed or not topics else 0)


@settings(max_examples=200, deadline=None)
@given(acls=acl_sets, topics=topic_parts, replica_id=st.sampled_from([-1, 2]))
def test_fetch_needs_read_and_a_follower_cluster_action(acls, topics, replica_id):
    recorder = Recorder()
    request = decoded(build(FetchRequest, {"replica_id": replica_id, "max_wait_ms": 0, "min_bytes": 1, "topics": [
        {"topic": t, "partitions": [{"partition": p} for p in parts]} for t, parts in topics.items()]}, version=12))
    response = run(acls, 1, recorder.fetch, request)
    authorizer = authorizer_of(acls)
    follower_ok = replica_id < 0  # no ACL here grants CLUSTER_ACTION
    allowed = {t for t in topics if follower_ok and authorizer.authorize(ALICE, CONN.host, O.READ, R.TOPIC, t)}
    expected = {(t, p): NONE if t in allowed else TOPIC_AUTHORIZATION_FAILED
                for t, parts in topics.items() for p in parts}
    assert answers(response, "responses", "topic", "partitions", "partition_index") == expected
    assert {t.topic for r in recorder.seen for t in r.body.topics} == allowed


@settings(max_examples=200, deadline=None)
@given(acls=acl_sets, named=st.one_of(st.none(), st.lists(st.sampled_from(NAMES), unique=True, min_size=1, max_size=4)),
       version=st.sampled_from([0, 9]))
def test_metadata_hides_or_refuses_topics_without_describe(acls, named, version):
    recorder = Recorder()
    topics = ([] if version == 0 else None) if named is None else [{"name": n} for n in named]
    values = {"topics": topics} if version == 0 else {"topics": topics, "include_topic_authorized_operations": True}
    request = decoded(build(MetadataRequest, values, version=version))
    response = run(acls, 3, recorder.metadata, request)
    authorizer = authorizer_of(acls)
    visible = {n for n in NAMES if authorizer.authorize(ALICE, CONN.host, O.DESCRIBE, R.TOPIC, n)}
    got = {t["name"]: t["error_code"] for t in response["topics"]}
    if named is None:
        assert got == {n: NONE for n in visible}
    else:
        assert got == {n: NONE if n in visible else TOPIC_AUTHORIZATION_FAILED for n in named}
    for t in response["topics"]:
        if t["error_code"] == NONE:  # the authorizer's operations, never the no-authorizer "everything"
            assert t["authorized_operations"] == authorizer.authorized_operations(ALICE, CONN.host, R.TOPIC, t["name"])


@settings(max_examples=100, deadline=None)
@given(acls=acl_sets, groups=st.lists(st.sampled_from(NAMES), unique=True, max_size=4))
def test_delete_groups_answers_each_group(acls, groups):
    recorder = Recorder()
    request = decoded(build(DeleteGroupsRequest, {"groups_names": groups}, version=2))
    response = run(acls, 42, recorder.delete_groups, request)
    authorizer = authorizer_of(acls)
    allowed = {g for g in groups if authorizer.authorize(ALICE, CONN.host, O.DELETE, R.GROUP, g)}
    assert {r["group_id"]: r["error_code"] for r in response["results"]} == {
        g: NONE if g in allowed else GROUP_AUTHORIZATION_FAILED for g in groups}
    assert {g for r in recorder.seen for g in r.body.groups_names} == allowed


@settings(max_examples=100, deadline=None)
@given(acls=st.lists(st.one_of(bindings, st.builds(
    lambda op, perm: AclBinding(ResourcePattern(R.CLUSTER, "kafka-cluster", PatternType.LITERAL),
                                AccessControlEntry("User:alice", "*", op, perm)),
    st.sampled_from([O.DESCRIBE, O.ALTER]), st.sampled_from([P.ALLOW, P.DENY]))), max_size=8))
def test_list_groups_shows_every_group_with_cluster_describe_else_the_describable(acls):
    response = run(acls, 16, Recorder().list_groups, decoded(build(ListGroupsRequest, {}, version=4)))
    authorizer = authorizer_of(acls)
    if authorizer.authorize(ALICE, CONN.host, O.DESCRIBE, R.CLUSTER, "kafka-cluster"):
        expected = set(NAMES)
    else:
        expected = {g for g in NAMES if authorizer.authorize(ALICE, CONN.host, O.DESCRIBE, R.GROUP, g)}
    assert {g["group_id"] for g in response["groups"]} == expected


@settings(max_examples=100, deadline=None)
@given(acls=acl_sets, groups=st.lists(st.tuples(st.sampled_from(NAMES), st.one_of(
    st.none(), st.lists(st.sampled_from(NAMES), unique=True, max_size=3))), unique_by=lambda g: g[0], max_size=3))
def test_offset_fetch_checks_groups_and_hides_or_refuses_topics(acls, groups):
    recorder = Recorder()
    request = decoded(build(OffsetFetchRequest, {"groups": [
        {"group_id": g, "topics": None if ts is None else [{"name": t, "partition_indexes": [0]} for t in ts]}
        for g, ts in groups]}, version=8))
    response = run(acls, 9, recorder.offset_fetch, request)
    authorizer = authorizer_of(acls)
    can = lambda op, rt, n: authorizer.authorize(ALICE, CONN.host, op, rt, n)  # noqa: E731
    got = {g["group_id"]: (g["error_code"], {t["name"]: t["partitions"][0]["error_code"] for t in g["topics"]})
           for g in response["groups"]}
    expected = {}
    for g, ts in groups:
        if not can(O.DESCRIBE, R.GROUP, g):
            expected[g] = (GROUP_AUTHORIZATION_FAILED, {})
        elif ts is None:  # every topic: the ones it may not describe are left out
            expected[g] = (NONE, {t: NONE for t in NAMES if can(O.DESCRIBE, R.TOPIC, t)})
        else:
            expected[g] = (NONE, {t: NONE if can(O.DESCRIBE, R.TOPIC, t) else TOPIC_AUTHORIZATION_FAILED for t in ts})
    assert got == expected


def test_a_super_user_passes_every_check_unchanged():
    recorder = Recorder()
    request = decoded(build(ProduceRequest, {"acks": 1, "timeout_ms": 100, "topic_data": [
        {"name": "orders", "partition_data": [{"index": 0, "records": None}]}]}, version=9))
    wrapped = authorize_handlers({0: recorder.produce}, Authorizer(super_users=frozenset({ALICE})), lambda _id: None)
    response = asyncio.run(wrapped[0](request, CONN))
    assert recorder.seen[0] is request  # not even copied
    assert response["responses"][0]["partition_responses"][0]["error_code"] == NONE


def test_an_api_without_checks_is_refused_at_start():
    """A handler added to the table later cannot go unchecked: the node would not start."""
    async def handler(request, conn):
        return {}
    with pytest.raises(ValueError, match=r"no ACL checks defined for API keys \[99\]"):
        authorize_handlers({99: handler, **{k: handler for k in UNCHECKED}}, Authorizer(), lambda _id: None)


def test_remembered_decisions_follow_every_acl_change():
    """The authorizer remembers decisions; adding, removing or replacing ACLs must be seen at the next check."""
    a = Authorizer()
    allow = AclBinding(ResourcePattern(R.TOPIC, "or", PatternType.PREFIXED),
                       AccessControlEntry("User:alice", "*", O.WRITE, P.ALLOW))
    deny = AclBinding(ResourcePattern(R.TOPIC, "orders", PatternType.LITERAL),
                      AccessControlEntry("User:*", "*", O.ALL, P.DENY))

    def writes() -> bool:
        return a.authorize(ALICE, CONN.host, O.WRITE, R.TOPIC, "orders")
    assert not writes()
    a.add(allow)
    assert writes()
    a.add(deny)
    assert not writes()
    a.remove(deny)
    assert writes()
    a.reset([])
    assert not writes()
