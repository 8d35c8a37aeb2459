"""User resources end to end: kmock's API server, the operator in a thread, two real `shale serve` pods.

The pods run Shale's authorizer with the operator's (plaintext, so ANONYMOUS) principal as a super user;
what the operator did is read back from each pod's own `shale-security.json` — the file the node wrote —
so these tests do not trust the operator's admin client to check itself.
"""

from __future__ import annotations

import asyncio
import base64
from pathlib import Path

import kubernetes
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from user_util import (
    GROUP,
    GROUP_G,
    PLURAL,
    READ_ORDERS,
    VERSION,
    create_clients_ca,
    create_user,
    secret,
    user,
    wait_ready,
)

from shale.operator.user_admin import ITERATIONS, MECHANISM, NodeAdmin
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
from shale.sidecar.security.store import SecurityStore
from support.cluster_util import Cluster
from support.node_util import wait_for

pytestmark = pytest.mark.parametrize(
    "storage_nodes", [["authorizer.class.name=shale", "super.users=User:ANONYMOUS"]], indirect=True)

def node_store(cluster: Cluster, node: int) -> SecurityStore:
    return SecurityStore.open(cluster.storage.nodes[node].data_dir, Authorizer())


def node_acls(cluster: Cluster, node: int, principal: str) -> set[AclBinding]:
    return {b for b in node_store(cluster, node).authorizer.acls(ANY_FILTER) if b.entry.principal == principal}


def acl(principal: str, kind: ResourceType, name: str, pattern: PatternType, op: AclOperation,
        permission: AclPermissionType = AclPermissionType.ALLOW) -> AclBinding:
    return AclBinding(ResourcePattern(kind, name, pattern), AccessControlEntry(principal, "*", op, permission))


def on_every_node(cluster: Cluster, check) -> None:
    for node in range(len(cluster.storage.nodes)):
        wait_for(lambda: check(node), 20, interval=0.1, what=f"node {node}")


def test_a_scram_user_gets_a_secret_a_credential_and_its_acls_on_every_pod(cluster):
    created = create_user(cluster, "alice", acls=[READ_ORDERS, GROUP_G])
    body = wait_ready(cluster, "alice", reason="Reconciled")
    assert body["status"]["username"] == "User:alice" and body["status"]["secret"] == "alice"

    s, values = secret(cluster, "alice")
    assert s["metadata"]["ownerReferences"] == [{"apiVersion": f"{GROUP}/{VERSION}", "kind": "User", "name": "alice",
                                                 "uid": created["metadata"]["uid"], "controller": True,
                                                 "blockOwnerDeletion": False}]
    password = values["password"]
    assert len(password) >= 32 and f'username="alice" password="{password}"' in values["sasl.jaas.config"]
    wanted = {acl("User:alice", ResourceType.TOPIC, "orders-", PatternType.PREFIXED, AclOperation.READ),
              acl("User:alice", ResourceType.TOPIC, "orders-", PatternType.PREFIXED, AclOperation.DESCRIBE),
              acl("User:alice", ResourceType.GROUP, "g", PatternType.LITERAL, AclOperation.READ)}
    for node in (0, 1):
        credential = node_store(cluster, node).scram_credential("alice", MECHANISM)
        assert credential is not None and credential.iterations == ITERATIONS
        salted = MECHANISM.salted_password(password, credential.salt, credential.iterations)
        assert MECHANISM.server_key(salted) == credential.server_key  # the Secret's password, salted, nothing else
        assert node_acls(cluster, node, "User:alice") == wanted
    for node in cluster.storage.nodes:  # the password is in the Secret only: never in a pod's file or log
        assert password not in node.log()
        assert password not in (Path(node.data_dir) / "shale-security.json").read_text()
    events = cluster.core.list_namespaced_event(cluster.namespace, _preload_content=False).data.decode()
    assert password not in events

    # The ACLs follow the spec: one rule removed, a deny added.
    deny = {"resource": {"type": "topic", "name": "orders-secret"}, "operations": ["Read"], "type": "deny"}
    cluster.objects.patch_namespaced_custom_object(
        GROUP, VERSION, cluster.namespace, PLURAL, "alice", {"spec": {"authorization": {"acls": [READ_ORDERS, deny]}}},
        _content_type="application/merge-patch+json")
    wait_ready(cluster, "alice", generation=2)
    wanted = (wanted - {acl("User:alice", ResourceType.GROUP, "g", PatternType.LITERAL, AclOperation.READ)}) | {
        acl("User:alice", ResourceType.TOPIC, "orders-secret", PatternType.LITERAL, AclOperation.READ,
            AclPermissionType.DENY)}
    on_every_node(cluster, lambda n: node_acls(cluster, n, "User:alice") == wanted)
    assert secret(cluster, "alice")[1]["password"] == password  # the password is kept across changes


def test_drift_on_a_pod_is_repaired_and_deletion_removes_everything(cluster):
    create_user(cluster, "bob", acls=[GROUP_G])
    wait_ready(cluster, "bob", reason="Reconciled")
    password = secret(cluster, "bob")[1]["password"]
    # Someone changes pod 1 behind the operator's back: an extra ACL, the credential removed.
    extra = acl("User:bob", ResourceType.CLUSTER, "kafka-cluster", PatternType.LITERAL, AclOperation.ALTER)

    async def tamper() -> None:
        async with await NodeAdmin.connect(cluster.storage.nodes[1].bootstrap, None, 5) as admin:
            await admin.create_acls([extra])
            await admin.delete_credential("bob")
    asyncio.run(tamper())
    assert extra in node_acls(cluster, 1, "User:bob")
    wait_for(lambda: extra not in node_acls(cluster, 1, "User:bob")
             and node_store(cluster, 1).scram_credential("bob", MECHANISM) is not None, 20, what="drift repaired")
    credential = node_store(cluster, 1).scram_credential("bob", MECHANISM)
    assert MECHANISM.server_key(MECHANISM.salted_password(password, credential.salt, ITERATIONS)) == credential.server_key

    cluster.objects.delete_namespaced_custom_object(GROUP, VERSION, cluster.namespace, PLURAL, "bob")
    wait_for(lambda: user(cluster, "bob") is None, 20, what="the User's finalizer to go")
    for node in (0, 1):
        assert node_store(cluster, node).scram_credential("bob", MECHANISM) is None
        assert node_acls(cluster, node, "User:bob") == set()


def test_refusals_write_nothing(cluster):
    create_user(cluster, "carl", acls=[{"resource": {"type": "group", "name": "g"}, "operations": ["Write"]}])
    body = wait_ready(cluster, "carl", "False", "InvalidSpec")
    message = next(c for c in body["status"]["conditions"] if c["type"] == "Ready")["message"]
    assert message == ("spec.authorization.acls[0]: Write is not an operation on a group (Kafka would never check "
                       "it)")
    with pytest.raises(kubernetes.client.ApiException) as missing:
        cluster.core.read_namespaced_secret("carl", cluster.namespace)
    assert missing.value.status == 404
    for node in (0, 1):
        assert node_store(cluster, node).scram_credential("carl", MECHANISM) is None

    # A Secret of the User's name that someone else owns is left exactly as it is.
    cluster.core.create_namespaced_secret(cluster.namespace, {"metadata": {"name": "dora"},
                                                              "data": {"password": base64.b64encode(b"x").decode()}})
    create_user(cluster, "dora")
    wait_ready(cluster, "dora", "False", "SecretConflict")
    s, values = secret(cluster, "dora")
    assert values == {"password": "x"} and not s["metadata"].get("ownerReferences")
    for node in (0, 1):
        assert node_store(cluster, node).scram_credential("dora", MECHANISM) is None


def test_a_tls_user_gets_a_certificate_from_the_clients_ca(cluster):
    rule = {"resource": {"type": "topic", "name": "*"}, "operations": ["Describe"]}
    create_user(cluster, "erin", "tls", acls=[rule])
    wait_ready(cluster, "erin", "False", "NoClientsCA")

    ca, ca_pem = create_clients_ca(cluster)
    body = wait_ready(cluster, "erin", reason="Reconciled")
    assert body["status"]["username"] == "User:CN=erin"
    _, values = secret(cluster, "erin")
    cert = x509.load_pem_x509_certificate(values["user.crt"].encode())
    cert.verify_directly_issued_by(ca)
    assert cert.subject.rfc4514_string() == "CN=erin" and values["ca.crt"] == ca_pem.decode()
    key = serialization.load_pem_private_key(values["user.key"].encode(), None)
    assert key.public_key().public_numbers() == cert.public_key().public_numbers()
    wanted = {acl("User:CN=erin", ResourceType.TOPIC, "*", PatternType.LITERAL, AclOperation.DESCRIBE)}
    for node in (0, 1):
        assert node_acls(cluster, node, "User:CN=erin") == wanted
        assert node_store(cluster, node).scram_credential("erin", MECHANISM) is None  # tls: no password anywhere
