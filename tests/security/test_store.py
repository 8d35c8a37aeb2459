"""The security file: the CreateAcls / DescribeAcls / DeleteAcls and Describe/AlterUserScramCredentials
semantics on a real file, surviving a reopen, refusing bad files and failed writes without losing
anything, and never holding a password."""

from __future__ import annotations

import base64
import json
import os
import stat

import pytest
from kafka.admin._users import UserScramCredentialUpsertion
from kafka.net.sasl.scram import ScramClient

from shale.sidecar.protocol import error_codes as E
from shale.sidecar.security.acl import ANY_FILTER, AclBinding, AclBindingFilter, InvalidAclError
from shale.sidecar.security.authorizer import Authorizer
from shale.sidecar.security.principal import KafkaPrincipal
from shale.sidecar.security.scram import ScramMechanism, ScramServer
from shale.sidecar.security.store import FILE_NAME, Deletion, SecurityStore, SecurityStoreError, Upsertion

TOPIC, LITERAL, PREFIXED, READ, WRITE, ALLOW, DENY = 2, 3, 4, 3, 4, 3, 2


def creation(*codes):
    try:
        return AclBinding.from_codes(*codes)
    except InvalidAclError as e:
        return e


def upsertion(user: str, mechanism: str, password: str, iterations: int = 4096) -> Upsertion:
    """What kafka-python's admin client sends (it salts the password itself)."""
    u = UserScramCredentialUpsertion(user, mechanism, password, iterations=iterations)
    return Upsertion(u.user, int(u.mechanism), u.iterations, u.salt, u.salted_password)


def test_acls_survive_a_reopen_in_a_private_file(tmp_path):
    store = SecurityStore.open(str(tmp_path), Authorizer())
    outcomes = store.create_acls([
        creation(TOPIC, "payments", LITERAL, "User:alice", "*", READ, ALLOW),
        creation(TOPIC, "pay", PREFIXED, "User:*", "10.0.0.1", WRITE, DENY),
        creation(TOPIC, "", LITERAL, "User:alice", "*", READ, ALLOW),
        creation(TOPIC, "payments", LITERAL, "User:alice", "*", READ, ALLOW),  # again: a success, stored once
    ])
    assert [(o.error_code, o.error_message) for o in outcomes] == [
        (0, None), (0, None), (E.INVALID_REQUEST, "Resource name should not be empty"), (0, None)]
    path = tmp_path / FILE_NAME
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    again = SecurityStore.open(str(tmp_path), Authorizer())
    assert again.describe_acls(ANY_FILTER) == store.describe_acls(ANY_FILTER) and len(store.describe_acls(ANY_FILTER)) == 2
    assert again.authorizer.authorize(KafkaPrincipal.user("alice"), "10.0.0.2", READ, TOPIC, "payments")

    deleted = again.delete_acls([AclBindingFilter.from_codes(TOPIC, "payments-x", 2, None, None, 1, 1),
                                 creation_filter_error()])
    assert [len(d.deleted) for d in deleted] == [1, 0] and deleted[1].error_message == "Unknown entryFilter."
    assert deleted[0].deleted[0].pattern.name == "pay"  # MATCH: the prefix that applies to payments-x
    assert [b.pattern.name for b in SecurityStore.open(str(tmp_path), Authorizer()).describe_acls(ANY_FILTER)] == \
        ["payments"]


def creation_filter_error() -> InvalidAclError:
    try:
        AclBindingFilter.from_codes(TOPIC, None, 1, None, None, 0, 1)
    except InvalidAclError as e:
        return e
    raise AssertionError("an UNKNOWN operation is an invalid filter")


def test_scram_credentials_alter_describe_and_authenticate(tmp_path):
    store = SecurityStore.open(str(tmp_path), Authorizer())
    results = store.alter_scram_credentials(
        [Deletion("ghost", 2), Deletion("", 1)],
        [upsertion("alice", "SCRAM-SHA-512", "alice-pw", 8192), upsertion("bob", "SCRAM-SHA-256", "pw", 1000),
         upsertion("carol", "SCRAM-SHA-256", "pw", 20000), Upsertion("dave", 3, 4096, b"s", b"x"),
         upsertion("erin", "SCRAM-SHA-256", "pw"), Upsertion("erin", 2, 4096, b"s", b"x" * 64),
         Upsertion("frank", 1, 4096, b"", b"x" * 32), Upsertion("gus", 1, 4096, b"s", b"short")])
    assert [(u, o.error_code, o.error_message) for u, o in results] == [
        ("ghost", E.RESOURCE_NOT_FOUND, "Attempt to delete a user credential that does not exist"),
        ("", E.UNACCEPTABLE_CREDENTIAL, "Username must not be empty"),
        ("alice", 0, None),
        ("bob", E.UNACCEPTABLE_CREDENTIAL, "Too few iterations"),
        ("carol", E.UNACCEPTABLE_CREDENTIAL, "Too many iterations"),
        ("dave", E.UNSUPPORTED_SASL_MECHANISM, "Unknown SCRAM mechanism"),
        ("erin", E.DUPLICATE_RESOURCE, "A user credential cannot be altered twice in the same request"),
        ("frank", E.UNACCEPTABLE_CREDENTIAL, "Salt must not be empty"),
        ("gus", E.UNACCEPTABLE_CREDENTIAL, "SaltedPassword must be 32 bytes for SCRAM-SHA-256"),
    ]
    described = SecurityStore.open(str(tmp_path), Authorizer()).describe_scram_credentials(None)
    assert [(d.user, d.credentials) for d in described] == [("alice", ((ScramMechanism.SCRAM_SHA_512, 8192),))]
    assert [(d.user, d.error_code, d.error_message) for d in store.describe_scram_credentials(["alice", "x", "x"])] == [
        ("alice", 0, None),
        ("x", E.DUPLICATE_RESOURCE, "Cannot describe SCRAM credentials for the same user twice in a single request")]
    assert store.describe_scram_credentials(["nobody"])[0].error_code == E.RESOURCE_NOT_FOUND

    # the stored credential authenticates the password the admin client salted, after a reopen
    reopened = SecurityStore.open(str(tmp_path), Authorizer())
    server = ScramServer(ScramMechanism.SCRAM_SHA_512, reopened.scram_credential)
    client = ScramClient("alice", "alice-pw", "SCRAM-SHA-512")
    client.process_server_first_message(server.evaluate(client.first_message()))
    client.process_server_final_message(server.evaluate(client.final_message()))
    assert server.complete

    raw = (tmp_path / FILE_NAME).read_bytes()
    salted = UserScramCredentialUpsertion("alice", "SCRAM-SHA-512", "alice-pw", iterations=8192,
                                          salt=reopened.scram_credential("alice", ScramMechanism.SCRAM_SHA_512).salt)
    assert b"alice-pw" not in raw and base64.b64encode(salted.salted_password) not in raw
    assert "salt=" in json.loads(raw)["scram"]["alice"]["SCRAM-SHA-512"]

    assert reopened.alter_scram_credentials([Deletion("alice", 2)], [])[0][1].error_code == 0
    assert SecurityStore.open(str(tmp_path), Authorizer()).describe_scram_credentials(None) == []


def test_upsertion_repr_holds_no_credential():
    u = upsertion("alice", "SCRAM-SHA-256", "pw")
    assert repr(u) == "Upsertion(user='alice', mechanism=1, iterations=4096)"


@pytest.mark.parametrize("content, message", [
    (b"{not json", "is not a valid security file"),
    (b'{"version": 7}', "unknown format version 7"),
    (b'{"version": 1, "acls": [{"resource_type": "TOPIC"}]}', "ACL entry 0"),
    (b'{"version": 1, "acls": [{"resource_type": "TOPIC", "name": "t", "pattern_type": "MATCH", "principal": "User:a",'
     b' "host": "*", "operation": "READ", "permission_type": "ALLOW"}]}', "ACL entry 0: Invalid patternType MATCH"),
    (b'{"version": 1, "scram": {"a": {"SCRAM-SHA-1": "x"}}}', "unknown mechanism 'SCRAM-SHA-1'"),
    (b'{"version": 1, "scram": {"a": {"SCRAM-SHA-256": "salt=AA=="}}}', "SCRAM credential of user 'a'"),
])
def test_a_bad_file_is_refused_by_name_and_kept(tmp_path, content, message):
    path = tmp_path / FILE_NAME
    path.write_bytes(content)
    with pytest.raises(SecurityStoreError, match=message) as e:
        SecurityStore.open(str(tmp_path), Authorizer())
    assert str(path) in str(e.value) and path.read_bytes() == content


def test_a_failed_write_changes_nothing(tmp_path):
    store = SecurityStore.open(str(tmp_path), Authorizer())
    store.create_acls([creation(TOPIC, "t", LITERAL, "User:a", "*", READ, ALLOW)])
    store.alter_scram_credentials([], [upsertion("alice", "SCRAM-SHA-256", "pw")])
    before = (tmp_path / FILE_NAME).read_bytes()
    broken = SecurityStore.open(str(tmp_path), Authorizer())
    broken.path = str(tmp_path / "gone" / FILE_NAME)  # its directory does not exist: every write fails
    created = broken.create_acls([creation(TOPIC, "u", LITERAL, "User:a", "*", READ, ALLOW)])
    assert created[0].error_code == E.UNKNOWN_SERVER_ERROR and broken.path in created[0].error_message
    deleted = broken.delete_acls([ANY_FILTER])
    assert deleted[0].error_code == E.UNKNOWN_SERVER_ERROR
    altered = broken.alter_scram_credentials([Deletion("alice", 1)], [upsertion("bob", "SCRAM-SHA-256", "pw")])
    assert [o.error_code for _, o in altered] == [E.UNKNOWN_SERVER_ERROR] * 2
    assert [b.pattern.name for b in broken.describe_acls(ANY_FILTER)] == ["t"]
    assert [d.user for d in broken.describe_scram_credentials(None)] == ["alice"]
    assert (tmp_path / FILE_NAME).read_bytes() == before
