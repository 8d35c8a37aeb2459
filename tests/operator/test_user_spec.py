"""The User CRD (generated, structural, its CEL rules in cel-python) and a User's spec as Kafka state.

What the schema lets through and Kafka would refuse is the operator's to refuse (user_spec.desired_user),
with a message naming the rule; a hypothesis test checks the mapping of any valid spec onto bindings.
"""

from __future__ import annotations

import jsonschema
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shale.operator import user_crd
from shale.operator.manifests import SpecError
from shale.operator.user_spec import OPERATIONS, PATTERN_TYPES, PERMISSIONS, RESOURCE_TYPES, desired_user
from shale.sidecar.cli import main as shale_main
from shale.sidecar.security.acl import CLUSTER_NAME, SUPPORTED_OPERATIONS, AclOperation, ResourceType
from support.chart_util import ROOT, as_json_schema, cel, structural_violations

CRD_FILES = (ROOT / "crds" / "users.shale.dev.yaml", ROOT / "helm" / "shale" / "crds" / "users.shale.dev.yaml")
SCHEMA = user_crd.crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
VALIDATOR = jsonschema.Draft4Validator(as_json_schema(SCHEMA))
RESOURCE_SCHEMA = SCHEMA["properties"]["spec"]["properties"]["authorization"]["properties"]["acls"]["items"][
    "properties"]["resource"]


def user(spec: dict, name: str = "alice") -> dict:
    return {"apiVersion": "shale.dev/v1alpha1", "kind": "User",
            "metadata": {"name": name, "namespace": "shop", "uid": "u-1"}, "spec": spec}


def scram(*acls: dict) -> dict:
    return {"authentication": {"type": "scram-sha-512"}, "authorization": {"type": "simple", "acls": list(acls)}}


@pytest.mark.parametrize("path", CRD_FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_committed_crd_is_the_generators_output(path):
    assert path.read_text(encoding="utf-8") == user_crd.render_yaml(), (
        f"{path.relative_to(ROOT)} is stale: run shale crd --kind user -o crds/users.shale.dev.yaml "
        "-o helm/shale/crds/users.shale.dev.yaml")


def test_shale_crd_kind_user_prints_it(capsys):
    assert shale_main(["crd", "--kind", "user"]) == 0
    assert capsys.readouterr().out == user_crd.render_yaml()


def test_schema_is_structural_and_its_enums_are_the_operators():
    assert structural_violations(SCHEMA) == []
    assert set(RESOURCE_SCHEMA["properties"]["type"]["enum"]) == set(RESOURCE_TYPES)
    assert set(RESOURCE_SCHEMA["properties"]["patternType"]["enum"]) == set(PATTERN_TYPES)
    rule = SCHEMA["properties"]["spec"]["properties"]["authorization"]["properties"]["acls"]["items"]
    assert set(rule["properties"]["operations"]["items"]["enum"]) == set(OPERATIONS)
    assert set(rule["properties"]["type"]["enum"]) == set(PERMISSIONS)


def test_cel_rules():
    [nameless] = RESOURCE_SCHEMA["x-kubernetes-validations"]
    assert cel(nameless["rule"], self={"type": "cluster"}) is True
    assert cel(nameless["rule"], self={"type": "topic"}) is False
    assert cel(nameless["rule"], self={"type": "topic", "name": "orders"}) is True
    [fixed] = SCHEMA["properties"]["spec"]["properties"]["authentication"]["x-kubernetes-validations"]
    assert cel(fixed["rule"], self={"type": "tls"}, oldSelf={"type": "tls"}) is True
    assert cel(fixed["rule"], self={"type": "tls"}, oldSelf={"type": "scram-sha-512"}) is False
    [long_name] = SCHEMA["x-kubernetes-validations"]
    assert cel(long_name["rule"], self={"metadata": {"name": "a" * 64}}) is True
    assert cel(long_name["rule"], self={"metadata": {"name": "a" * 65}}) is False


def test_a_scram_user_and_its_bindings():
    desired = desired_user(user(scram(
        {"resource": {"type": "topic", "name": "orders-", "patternType": "prefix"}, "operations": ["Read", "Describe"]},
        {"resource": {"type": "cluster"}, "operations": ["IdempotentWrite"], "type": "deny", "host": "10.0.0.1"},
    )))
    assert (desired.principal, desired.ref) == ("User:alice", "shop/alice")
    assert sorted((b.pattern.resource_type.name, b.pattern.name, b.pattern.pattern_type.name, b.entry.principal,
                   b.entry.host, b.entry.operation.name, b.entry.permission_type.name) for b in desired.acls) == [
        ("CLUSTER", CLUSTER_NAME, "LITERAL", "User:alice", "10.0.0.1", "IDEMPOTENT_WRITE", "DENY"),
        ("TOPIC", "orders-", "PREFIXED", "User:alice", "*", "DESCRIBE", "ALLOW"),
        ("TOPIC", "orders-", "PREFIXED", "User:alice", "*", "READ", "ALLOW"),
    ]
    tls = desired_user(user({"authentication": {"type": "tls"}}, "erin"))
    assert (tls.principal, tls.acls) == ("User:CN=erin", frozenset())


@pytest.mark.parametrize("spec, message", [
    (scram({"resource": {"type": "group", "name": "g"}, "operations": ["Write"]}),
     "spec.authorization.acls[0]: Write is not an operation on a group (Kafka would never check it)"),
    (scram({"resource": {"type": "topic"}, "operations": ["Read"]}),
     "spec.authorization.acls[0].resource.name is required for a topic resource"),
    (scram({"resource": {"type": "topic", "name": "t"}, "operations": []}),
     "spec.authorization.acls[0].operations: expected a non-empty list"),
    (scram({"resource": {"type": "topic", "name": "t"}, "operations": ["Read"]},
           {"resource": {"type": "topic", "name": "t"}, "operations": ["Fly"]}),
     "spec.authorization.acls[1].operations: unknown operation 'Fly'"),
    ({"authentication": {"type": "plain"}}, "spec.authentication.type 'plain': expected one of scram-sha-512, tls"),
    ({"authentication": {"type": "tls"}, "authorization": {"type": "opa"}},
     "spec.authorization.type 'opa': expected simple"),
])  # fmt: skip
def test_what_kafka_would_refuse_is_refused_with_the_rule_named(spec, message):
    with pytest.raises(SpecError) as refused:
        desired_user(user(spec))
    assert (refused.value.reason, str(refused.value)) == ("InvalidSpec", message)


def test_the_schema_lets_through_what_only_the_operator_refuses():
    spec = scram({"resource": {"type": "group", "name": "g"}, "operations": ["Write"]})
    assert list(VALIDATOR.iter_errors(user(spec))) == []  # structurally fine...
    with pytest.raises(SpecError):
        desired_user(user(spec))  # ...but no Kafka check ever asks for WRITE on a group


_RESOURCE_TYPES = {v: k for k, v in RESOURCE_TYPES.items()}
_OPERATION_NAMES = {v: k for k, v in OPERATIONS.items()}


@st.composite
def rules(draw) -> dict:
    resource_type = draw(st.sampled_from(sorted(RESOURCE_TYPES.values())))
    allowed = sorted(SUPPORTED_OPERATIONS[resource_type] | {AclOperation.ALL})
    ops = draw(st.lists(st.sampled_from(allowed), min_size=1, max_size=4, unique=True))
    resource = {"type": _RESOURCE_TYPES[resource_type], "patternType": draw(st.sampled_from(sorted(PATTERN_TYPES)))}
    if resource_type is not ResourceType.CLUSTER:
        resource["name"] = draw(st.sampled_from(["*", "orders", "orders-", "g.1"]))
    return {"resource": resource, "operations": [_OPERATION_NAMES[o] for o in ops],
            "host": draw(st.sampled_from(["*", "10.0.0.1"])), "type": draw(st.sampled_from(sorted(PERMISSIONS)))}


@settings(max_examples=200, deadline=None)
@given(st.lists(rules(), max_size=6), st.sampled_from(["scram-sha-512", "tls"]))
def test_any_valid_spec_is_one_binding_per_rule_and_operation(acls, authentication):
    spec = {"authentication": {"type": authentication}, "authorization": {"type": "simple", "acls": acls}}
    assert list(VALIDATOR.iter_errors(user(spec))) == []
    desired = desired_user(user(spec))
    expected = {(RESOURCE_TYPES[r["resource"]["type"]], r["resource"].get("name", CLUSTER_NAME),
                 PATTERN_TYPES[r["resource"]["patternType"]], r["host"], OPERATIONS[o], PERMISSIONS[r["type"]])
                for r in acls for o in r["operations"]}
    assert {(b.pattern.resource_type, b.pattern.name, b.pattern.pattern_type, b.entry.host, b.entry.operation,
             b.entry.permission_type) for b in desired.acls} == expected
    assert {b.entry.principal for b in desired.acls} <= {desired.principal}
