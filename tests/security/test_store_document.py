"""The security state as one document (what the etcd-shared state is made of): it round-trips exactly, a bad
document changes nothing and names its source, a scratch copy sends its change to `persist` and rolls back
with Kafka's error outcome when `persist` refuses, and `replace` swaps the whole state in memory and file."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shale.sidecar.protocol import error_codes as E
from shale.sidecar.security.acl import (
    ANY_FILTER,
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
from shale.sidecar.security.scram import ScramMechanism
from shale.sidecar.security.store import Deletion, SecurityStore, SecurityStoreError, Upsertion

bindings = st.builds(
    lambda rt, name, pattern, principal, op, perm: AclBinding(ResourcePattern(rt, name, pattern),
                                                              AccessControlEntry(principal, "*", op, perm)),
    st.sampled_from([ResourceType.TOPIC, ResourceType.GROUP]), st.text("abc-", min_size=1, max_size=4),
    st.sampled_from([PatternType.LITERAL, PatternType.PREFIXED]), st.sampled_from(["User:a", "User:*"]),
    st.sampled_from([AclOperation.READ, AclOperation.WRITE, AclOperation.ALL]),
    st.sampled_from([AclPermissionType.ALLOW, AclPermissionType.DENY]))


def store_with(tmp_path, acls, users=()) -> SecurityStore:
    tmp_path.mkdir(parents=True, exist_ok=True)
    store = SecurityStore.open(str(tmp_path), Authorizer())
    assert all(o.error_code == E.NONE for o in store.create_acls(list(acls)))
    m = ScramMechanism.SCRAM_SHA_512
    changes = [Upsertion(u, m.type, 4096, u.encode() * 4, m.salted_password(f"{u}-pw", u.encode() * 4, 4096))
               for u in users]
    assert all(o.error_code == E.NONE for _, o in store.alter_scram_credentials([], changes))
    return store


@settings(max_examples=50, deadline=None)
@given(acls=st.lists(bindings, max_size=6), users=st.lists(st.sampled_from(["ann", "ben"]), unique=True))
def test_a_document_round_trips(tmp_path_factory, acls, users):
    store = store_with(tmp_path_factory.mktemp("s"), acls, users)
    doc = store.document()
    copy = SecurityStore.from_document(json.loads(json.dumps(doc)), "test", persist=lambda d: None)
    assert copy.document() == doc
    assert copy.authorizer.acls(ANY_FILTER) == store.authorizer.acls(ANY_FILTER)
    for user in users:
        assert copy.scram_credential(user, ScramMechanism.SCRAM_SHA_512).verify_password(
            ScramMechanism.SCRAM_SHA_512, f"{user}-pw")


def test_replace_swaps_memory_and_file(tmp_path):
    a = AclBinding(ResourcePattern(ResourceType.TOPIC, "old", PatternType.LITERAL),
                   AccessControlEntry("User:a", "*", AclOperation.READ, AclPermissionType.ALLOW))
    b = AclBinding(ResourcePattern(ResourceType.TOPIC, "new", PatternType.PREFIXED),
                   AccessControlEntry("User:a", "*", AclOperation.WRITE, AclPermissionType.ALLOW))
    store = store_with(tmp_path, [a])
    other = store_with(tmp_path / "other", [b], ["ann"])
    store.replace(other.document(), "etcd key x")
    principal = KafkaPrincipal.user("a")
    assert not store.authorizer.authorize(principal, "h", AclOperation.READ, ResourceType.TOPIC, "old")
    assert store.authorizer.authorize(principal, "h", AclOperation.WRITE, ResourceType.TOPIC, "new-1")
    reopened = SecurityStore.open(str(tmp_path), Authorizer())
    assert reopened.document() == other.document()


@pytest.mark.parametrize("doc, message", [
    ({"version": 2}, "unknown format version 2"),
    ({"version": 1, "acls": [{"resource_type": "TOPIC"}]}, "ACL entry 0"),
    ({"version": 1, "scram": {"ann": {"SCRAM-MD5": "x"}}}, "unknown mechanism 'SCRAM-MD5'"),
])
def test_a_bad_document_changes_nothing_and_names_its_source(tmp_path, doc, message):
    a = AclBinding(ResourcePattern(ResourceType.TOPIC, "t", PatternType.LITERAL),
                   AccessControlEntry("User:a", "*", AclOperation.READ, AclPermissionType.ALLOW))
    store = store_with(tmp_path, [a])
    before, on_disk = store.document(), (tmp_path / "shale-security.json").read_bytes()
    with pytest.raises(SecurityStoreError, match=f"etcd key k .*{message}"):
        store.replace(doc, "etcd key k")
    assert store.document() == before and (tmp_path / "shale-security.json").read_bytes() == on_disk


def test_a_scratch_copy_sends_changes_to_persist_and_rolls_back_when_refused(tmp_path):
    base = store_with(tmp_path, [], ["ann"]).document()
    sent: list[dict] = []
    copy = SecurityStore.from_document(base, "etcd key k", persist=sent.append)
    [(user, outcome)] = copy.alter_scram_credentials([Deletion("ann", ScramMechanism.SCRAM_SHA_512.type)], [])
    assert (user, outcome.error_code) == ("ann", E.NONE)
    assert sent == [copy.document()] and "ann" not in sent[0]["scram"]
    assert copy.path is None and not any(p.name.endswith(".tmp") for p in tmp_path.iterdir())

    def refuse(doc: dict) -> None:
        raise SecurityStoreError("cannot write etcd key k: etcd unreachable")
    copy = SecurityStore.from_document(base, "etcd key k", persist=refuse)
    a = AclBinding(ResourcePattern(ResourceType.TOPIC, "t", PatternType.LITERAL),
                   AccessControlEntry("User:a", "*", AclOperation.READ, AclPermissionType.ALLOW))
    [outcome] = copy.create_acls([a])
    assert (outcome.error_code, outcome.error_message) == (E.UNKNOWN_SERVER_ERROR,
                                                           "cannot write etcd key k: etcd unreachable")
    assert copy.document() == base  # nothing kept
