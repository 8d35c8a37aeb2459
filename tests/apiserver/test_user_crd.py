"""The User CRD on a real kube-apiserver (1.20): accepted and served, defaulting, pruning and OpenAPI
validation with the server's own messages. Its CEL rules are stripped for 1.20 (apiserver_util.crd_for_1_20);
tests/operator/test_user_spec.py runs them in cel-python.
"""

from __future__ import annotations

import itertools
import json

import kubernetes
import pytest

from support.apiserver_util import USER_CRD_FILE, crd_for_1_20
from support.kube_apiserver import ApiServer

GROUP, VERSION, PLURAL = "shale.dev", "v1alpha1", "users"
_namespaces = itertools.count(1)


@pytest.fixture
def namespace(apiserver: ApiServer) -> str:
    name = f"users-{next(_namespaces)}"
    kubernetes.client.CoreV1Api(apiserver.client()).create_namespace({"metadata": {"name": name}})
    return name


def user(name: str, spec: dict) -> dict:
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "User", "metadata": {"name": name}, "spec": spec}


def test_the_crd_is_served_with_its_status_subresource(apiserver: ApiServer):
    served = kubernetes.client.ApiextensionsV1Api(apiserver.client()).read_custom_resource_definition("users.shale.dev")
    conditions = {c.type: c.status for c in served.status.conditions}
    assert conditions["Established"] == conditions["NamesAccepted"] == "True"
    assert conditions.get("NonStructuralSchema") is None
    assert served.status.accepted_names.kind == "User" and served.status.accepted_names.short_names == ["su"]
    [version] = served.spec.versions
    assert version.subresources.status == {}
    assert [c.name for c in version.additional_printer_columns] == [
        c["name"] for c in crd_for_1_20(USER_CRD_FILE)["spec"]["versions"][0]["additionalPrinterColumns"]]


def test_the_server_defaults_acl_rules_and_prunes_unknown_fields(apiserver: ApiServer, namespace: str):
    objects = kubernetes.client.CustomObjectsApi(apiserver.client())
    spec = {"authentication": {"type": "scram-sha-512", "password": "never-stored"},
            "authorization": {"type": "simple", "acls": [
                {"resource": {"type": "topic", "name": "orders"}, "operations": ["Read", "Describe"]},
                {"resource": {"type": "cluster"}, "operations": ["IdempotentWrite"], "type": "deny", "host": "10.0.0.1"},
            ]}}
    created = objects.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, user("alice", spec))
    assert created["spec"]["authentication"] == {"type": "scram-sha-512"}  # pruned: no password in a spec
    first, second = created["spec"]["authorization"]["acls"]
    assert first == {"resource": {"type": "topic", "name": "orders", "patternType": "literal"},
                     "operations": ["Read", "Describe"], "host": "*", "type": "allow"}
    assert second == {"resource": {"type": "cluster", "patternType": "literal"}, "operations": ["IdempotentWrite"],
                      "host": "10.0.0.1", "type": "deny"}
    status = {"username": "User:alice", "secret": "alice",
              "conditions": [{"type": "Ready", "status": "True", "reason": "Reconciled", "message": "ok",
                              "lastTransitionTime": "2026-01-01T00:00:00Z"}]}
    patched = objects.patch_namespaced_custom_object_status(GROUP, VERSION, namespace, PLURAL, "alice",
                                                           {"status": status})
    assert patched["status"] == status and patched["spec"] == created["spec"]


@pytest.mark.parametrize("spec, message", [
    ({}, "spec.authentication: Required value"),
    ({"authentication": {"type": "scram-sha-256"}},
     'spec.authentication.type: Unsupported value: "scram-sha-256": supported values: "scram-sha-512", "tls"'),
    ({"authentication": {"type": "tls"}, "authorization": {"type": "simple", "acls": [
        {"resource": {"type": "user", "name": "x"}, "operations": ["Read"]}]}},
     'spec.authorization.acls.resource.type: Unsupported value: "user"'),  # 1.20 names no index here
    ({"authentication": {"type": "tls"}, "authorization": {"type": "simple", "acls": [
        {"resource": {"type": "topic", "name": "x"}, "operations": []}]}},
     "spec.authorization.acls.operations: Invalid value: 0: spec.authorization.acls.operations in body "
     "should have at least 1 items"),
    ({"authentication": {"type": "tls"}, "authorization": {"type": "simple", "acls": [
        {"resource": {"type": "topic", "name": "x", "patternType": "match"}, "operations": ["Read"]}]}},
     'spec.authorization.acls.resource.patternType: Unsupported value: "match"'),
    ({"authentication": {"type": "tls"}, "authorization": {"type": "simple", "acls": [
        {"resource": {"type": "topic", "name": "x"}, "operations": ["Read", "Read"]}]}},
     "spec.authorization.acls[0].operations[1]: Duplicate value"),
    ({"authentication": {"type": "tls"}, "authorization": {"type": "acl"}},
     'spec.authorization.type: Unsupported value: "acl"'),
])  # fmt: skip
def test_the_server_refuses_what_the_schema_says(apiserver: ApiServer, namespace: str, spec, message):
    objects = kubernetes.client.CustomObjectsApi(apiserver.client())
    with pytest.raises(kubernetes.client.ApiException) as refused:
        objects.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, user("bad", spec))
    assert refused.value.status == 422
    assert message in json.loads(refused.value.body)["message"]
