"""The ACL model and the authorizer: Kafka's validation messages and filter matching, and the decision
rules (deny wins, implied operations, wildcards, prefixes, super users, no-ACL default) against a naive
reference written from Kafka's documentation."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shale.sidecar.protocol import error_codes
from shale.sidecar.security.acl import (
    ANY_FILTER,
    AUTHORIZATION_ERRORS,
    SUPPORTED_OPERATIONS,
    AccessControlEntry,
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    InvalidAclError,
    PatternType,
    ResourcePattern,
    ResourceType,
)
from shale.sidecar.security.authorizer import Authorizer
from shale.sidecar.security.principal import KafkaPrincipal

O, P, R, T = AclOperation, AclPermissionType, ResourceType, PatternType
ALICE, BOB = KafkaPrincipal.user("alice"), KafkaPrincipal.user("bob")


def acl(name: str, op: AclOperation, perm: AclPermissionType = P.ALLOW, principal: str = "User:alice",
        host: str = "*", pattern: PatternType = T.LITERAL, rtype: ResourceType = R.TOPIC) -> AclBinding:
    return AclBinding(ResourcePattern(rtype, name, pattern), AccessControlEntry(principal, host, op, perm))


def authorizer(*bindings: AclBinding, **kw) -> Authorizer:
    a = Authorizer(**kw)
    for b in bindings:
        a.add(b)
    return a


@pytest.mark.parametrize("codes, message", [
    ((0, "t", 3, "User:a", "*", 3, 3), "Invalid resourceType UNKNOWN"),
    ((1, "t", 3, "User:a", "*", 3, 3), "Invalid resourceType ANY"),
    ((2, "t", 2, "User:a", "*", 3, 3), "Invalid patternType MATCH"),
    ((2, "t", 1, "User:a", "*", 3, 3), "Invalid patternType ANY"),
    ((2, "t", 3, "User:a", "*", 1, 3), "Invalid operation ANY"),
    ((2, "t", 3, "User:a", "*", 99, 3), "Invalid operation UNKNOWN"),
    ((2, "t", 3, "User:a", "*", 3, 1), "Invalid permissionType ANY"),
    ((2, "", 3, "User:a", "*", 3, 3), "Resource name should not be empty"),
    ((4, "cluster", 3, "User:a", "*", 7, 3), "The only valid name for the CLUSTER resource is kafka-cluster"),
    ((2, "t", 3, "alice", "*", 3, 3), "Could not parse principal from `alice`"),
])
def test_create_acls_validation(codes, message):
    with pytest.raises(InvalidAclError, match=message) as e:
        AclBinding.from_codes(*codes)
    assert e.value.error_code == error_codes.INVALID_REQUEST


def test_filter_validation_and_matching():
    with pytest.raises(InvalidAclError, match="Unknown patternFilter."):
        AclBindingFilter.from_codes(0, None, 1, None, None, 1, 1)
    with pytest.raises(InvalidAclError, match="Unknown entryFilter."):
        AclBindingFilter.from_codes(1, None, 1, None, None, 0, 1)
    literal, wildcard = acl("payments", O.READ), acl("*", O.READ)
    prefixed, other = acl("pay", O.READ, pattern=T.PREFIXED), acl("orders", O.READ)
    group = acl("payments", O.READ, rtype=R.GROUP)
    a = authorizer(literal, wildcard, prefixed, other, group)

    def select(rtype, name, ptype, principal=None, op=O.ANY):
        return set(a.acls(AclBindingFilter.from_codes(rtype, name, ptype, principal, None, op, P.ANY)))

    assert select(R.TOPIC, "payments", T.MATCH) == {literal, wildcard, prefixed}  # what applies to the name
    assert select(R.TOPIC, "payments", T.ANY) == {literal}  # ANY: the name itself, any pattern type
    assert select(R.TOPIC, "pay", T.PREFIXED) == {prefixed}
    assert select(R.TOPIC, None, T.LITERAL) == {literal, wildcard, other}
    assert select(R.ANY, None, T.ANY) == {literal, wildcard, prefixed, other, group} == set(a.acls(ANY_FILTER))
    assert select(R.TOPIC, None, T.ANY, principal="User:bob") == set()
    assert select(R.TOPIC, None, T.ANY, op=O.WRITE) == set()


def test_supported_operations_and_errors_are_kafkas():
    assert SUPPORTED_OPERATIONS[R.TRANSACTIONAL_ID] == {O.DESCRIBE, O.WRITE}
    assert SUPPORTED_OPERATIONS[R.USER] == {O.CREATE_TOKENS, O.DESCRIBE_TOKENS}
    assert {AUTHORIZATION_ERRORS[t] for t in (R.TOPIC, R.GROUP, R.CLUSTER)} == {29, 30, 31}


def test_decision_rules_by_example():
    a = authorizer(acl("payments", O.READ), acl("payments", O.READ, P.DENY, host="10.0.0.9"),
                   acl("pay", O.WRITE, pattern=T.PREFIXED), acl("payments", O.ALTER_CONFIGS, principal="User:*"),
                   acl("logs", O.ALL, P.DENY), acl("logs", O.ALL))
    assert a.authorize(ALICE, "10.0.0.1", O.READ, R.TOPIC, "payments")
    assert not a.authorize(ALICE, "10.0.0.9", O.READ, R.TOPIC, "payments")  # deny from that host wins
    assert a.authorize(ALICE, "10.0.0.9", O.DESCRIBE, R.TOPIC, "payments")  # DENY READ does not deny DESCRIBE
    assert a.authorize(ALICE, "10.0.0.1", O.WRITE, R.TOPIC, "payments-eu")  # prefixed
    assert not a.authorize(ALICE, "10.0.0.1", O.WRITE, R.TOPIC, "pa")
    assert a.authorize(BOB, "1.1.1.1", O.DESCRIBE_CONFIGS, R.TOPIC, "payments")  # User:*, implied by ALTER_CONFIGS
    assert not a.authorize(BOB, "1.1.1.1", O.READ, R.TOPIC, "payments")  # ACLs exist, none for bob: no
    assert not a.authorize(ALICE, "10.0.0.1", O.DESCRIBE, R.TOPIC, "logs")  # DENY ALL
    assert not a.authorize(ALICE, "10.0.0.1", O.READ, R.TOPIC, "no-acl-topic")
    assert authorizer(acl("x", O.READ), allow_everyone_if_no_acl_found=True).authorize(
        BOB, "h", O.DELETE, R.TOPIC, "no-acl-topic")
    assert authorizer(acl("logs", O.ALL, P.DENY, principal="User:*"), super_users=frozenset({BOB})).authorize(
        BOB, "h", O.READ, R.TOPIC, "logs")
    assert a.authorized_operations(ALICE, "10.0.0.9", R.TOPIC, "payments") == {
        O.DESCRIBE, O.WRITE, O.ALTER_CONFIGS, O.DESCRIBE_CONFIGS}  # not READ: denied from that host


def test_authorize_by_resource_type():
    """InitProducerId's "WRITE on any topic" (Kafka's default `authorizeByResourceType`)."""
    def any_write(*bindings: AclBinding, **kw) -> bool:
        return authorizer(*bindings, **kw).authorize_by_resource_type(ALICE, "h", O.WRITE, R.TOPIC)

    assert not any_write()
    assert any_write(allow_everyone_if_no_acl_found=True)
    assert any_write(acl("t", O.WRITE))
    assert any_write(acl("*", O.ALL))
    assert not any_write(acl("t", O.WRITE), acl("t", O.WRITE, P.DENY))
    assert not any_write(acl("team-a", O.WRITE, pattern=T.PREFIXED), acl("team", O.WRITE, P.DENY, pattern=T.PREFIXED))
    assert any_write(acl("team-a", O.WRITE), acl("team-ab", O.WRITE, P.DENY, pattern=T.PREFIXED))
    assert not any_write(acl("t", O.WRITE), acl("*", O.WRITE, P.DENY))
    assert not any_write(acl("t", O.WRITE, principal="User:bob"))
    assert any_write(acl("t", O.WRITE, P.DENY, principal="User:*"), super_users=frozenset({ALICE}))


# --- the decision rules against a naive reference ---------------------------------------------------

NAMES = ["a", "ab", "abc", "b", "*"]
OPS = [O.ALL, O.READ, O.WRITE, O.DELETE, O.ALTER, O.DESCRIBE, O.ALTER_CONFIGS, O.DESCRIBE_CONFIGS, O.CREATE]
bindings = st.builds(acl, st.sampled_from(NAMES), st.sampled_from(OPS), st.sampled_from([P.ALLOW, P.DENY]),
                     st.sampled_from(["User:alice", "User:bob", "User:*"]), st.sampled_from(["*", "10.0.0.1"]),
                     st.sampled_from([T.LITERAL, T.PREFIXED]), st.sampled_from([R.TOPIC, R.GROUP]))


def reference(acls: list[AclBinding], super_users: set[str], allow_everyone: bool, principal: str, host: str,
              op: AclOperation, rtype: ResourceType, name: str) -> bool:
    """Kafka's documented rules, spelled out one by one."""
    if principal in super_users:
        return True

    def applies(b: AclBinding) -> bool:
        if b.pattern.resource_type != rtype:
            return False
        if b.pattern.pattern_type == T.LITERAL:
            return b.pattern.name in (name, "*")
        return name.startswith(b.pattern.name)

    relevant = [b for b in acls if applies(b)]
    if not relevant:
        return allow_everyone
    mine = [b.entry for b in relevant if b.entry.principal in (principal, "User:*") and b.entry.host in (host, "*")]
    for e in mine:
        if e.permission_type == P.DENY and (e.operation == op or e.operation == O.ALL):
            return False
    for e in mine:
        if e.permission_type != P.ALLOW:
            continue
        if e.operation == op or e.operation == O.ALL:
            return True
        if op == O.DESCRIBE and e.operation in (O.READ, O.WRITE, O.DELETE, O.ALTER):
            return True
        if op == O.DESCRIBE_CONFIGS and e.operation == O.ALTER_CONFIGS:
            return True
    return False


@settings(max_examples=300, deadline=None)
@given(acls=st.lists(bindings, max_size=8), super_user=st.booleans(), allow_everyone=st.booleans(),
       principal=st.sampled_from(["User:alice", "User:bob", "User:carol"]), host=st.sampled_from(["10.0.0.1", "10.0.0.2"]),
       op=st.sampled_from(OPS[1:]), rtype=st.sampled_from([R.TOPIC, R.GROUP]), name=st.sampled_from(NAMES[:-1] + ["c"]))
def test_authorizer_agrees_with_the_reference(acls, super_user, allow_everyone, principal, host, op, rtype, name):
    supers = {"User:bob"} if super_user else set()
    a = authorizer(*acls, super_users=frozenset(KafkaPrincipal.parse(p) for p in supers),
                   allow_everyone_if_no_acl_found=allow_everyone)
    assert a.authorize(KafkaPrincipal.parse(principal), host, op, rtype, name) == \
        reference(acls, supers, allow_everyone, principal, host, op, rtype, name)


@settings(max_examples=100, deadline=None)
@given(acls=st.lists(bindings, max_size=8), extra=bindings)
def test_a_deny_never_grants_and_an_allow_never_refuses(acls, extra):
    """Monotonic: adding a DENY only takes permissions away, adding an ALLOW only gives (no-ACL default off)."""
    def grants(a: Authorizer) -> set[tuple]:
        return {(p, op, rt, n) for p in (ALICE, BOB) for op in OPS[1:] for rt in (R.TOPIC, R.GROUP)
                for n in NAMES[:-1] if a.authorize(p, "10.0.0.1", op, rt, n)}

    before = grants(authorizer(*acls))
    after = grants(authorizer(*acls, extra))
    assert after <= before if extra.entry.permission_type == P.DENY else after >= before
