"""With `--store etcd://`, one security state for the cluster: an ACL or a SCRAM credential changed through
one node's admin API is in force on every node (and in each node's file), a node that was down while the
state changed adopts etcd's state over its own file, and a change etcd cannot take is refused with nothing
changed anywhere. Real `shale serve` processes, a real etcd, kafka-python's and confluent-kafka's admin."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient, ScramCredentialInfo, ScramMechanism, UserScramCredentialUpsertion
from kafka.admin import (
    ACL,
    ACLFilter,
    ACLOperation,
    ACLPermissionType,
    ACLResourcePatternType,
    KafkaAdminClient,
    ResourcePattern,
    ResourcePatternFilter,
    ResourceType,
)
from kafka.protocol.admin.acl import CreateAclsRequest, CreateAclsResponse, DescribeAclsRequest, DescribeAclsResponse

from shale.sidecar.security.acl import (
    CLUSTER_NAME,
    AccessControlEntry,
    AclBinding,
    AclOperation,
    AclPermissionType,
    PatternType,
)
from shale.sidecar.security.acl import ResourcePattern as Rp
from shale.sidecar.security.acl import ResourceType as Rt
from shale.sidecar.security.authorizer import Authorizer
from shale.sidecar.security.scram import ScramMechanism as Mechanism
from shale.sidecar.security.store import SecurityStore
from support.clients_util import build, call
from support.node_util import start_replicated_cluster, topic_manifest, wait_for

ANON = "User:ANONYMOUS"
ANY = 1  # the ANY value of DescribeAcls's resource type, pattern type, operation and permission filters


def seed_admin(data_dir: Path) -> None:
    """The same first ACLs on every node's disk: the anonymous principal (the nodes' own too, on PLAINTEXT)
    may manage ACLs and credentials, replicate (CLUSTER_ACTION) and see every topic (the harness's Metadata)."""
    data_dir.mkdir(parents=True, exist_ok=True)
    SecurityStore.open(str(data_dir), Authorizer()).create_acls([
        *(AclBinding(Rp(Rt.CLUSTER, CLUSTER_NAME, PatternType.LITERAL),
                     AccessControlEntry(ANON, "*", op, AclPermissionType.ALLOW))
          for op in (AclOperation.ALTER, AclOperation.DESCRIBE, AclOperation.CLUSTER_ACTION)),
        AclBinding(Rp(Rt.TOPIC, "*", PatternType.LITERAL),
                   AccessControlEntry(ANON, "*", AclOperation.DESCRIBE, AclPermissionType.ALLOW))])


def acls_on(server) -> set[tuple[str, str]]:
    """(resource name, operation) of every ACL `server` itself holds. A raw DescribeAcls to its port: an admin
    client sends it to whichever node it likes, which could answer for the other one."""
    resp = call(server.port, build(DescribeAclsRequest, {
        "resource_type_filter": ANY, "resource_name_filter": None, "pattern_type_filter": ANY,
        "principal_filter": None, "host_filter": None, "operation": ANY, "permission_type": ANY}, version=2),
        DescribeAclsResponse)
    assert resp.error_code == 0, resp
    return {(r.resource_name, ACLOperation(a.operation).name) for r in resp.resources for a in r.acls}


def file_of(server) -> dict:
    return json.loads((Path(server.data_dir) / "shale-security.json").read_text())


@pytest.fixture
def cluster(tmp_path, etcd):
    for n in range(2):
        seed_admin(tmp_path / f"data{n}")
    c = start_replicated_cluster(tmp_path, etcd, 2, topic_manifest("orders", replicas=2),
                                 extra=("--override", "authorizer.class.name=shale",
                                        "--override", "offsets.topic.replication.factor=2"))
    try:
        yield c
    finally:
        c.stop()


def test_a_change_through_one_node_is_in_force_on_every_node(cluster, etcd):
    node0, node1 = cluster.servers[0], cluster.servers[1]
    created = call(node0.port, build(CreateAclsRequest, {"creations": [  # to node 0 itself, not a client's pick
        {"resource_type": ResourceType.TOPIC.value, "resource_name": "orders",
         "resource_pattern_type": ACLResourcePatternType.LITERAL.value, "principal": ANON, "host": "*",
         "operation": ACLOperation.WRITE.value, "permission_type": ACLPermissionType.ALLOW.value}]}, version=2),
        CreateAclsResponse)
    assert [r.error_code for r in created.results] == [0], created
    assert ("orders", "WRITE") in acls_on(node0)  # answered once applied here
    wait_for(lambda: ("orders", "WRITE") in acls_on(node1), what="node 1 to have the ACL")
    wait_for(lambda: any(a["name"] == "orders" for a in file_of(node1)["acls"]), what="node 1's file")

    # a credential made on node 1 reaches node 0
    ck = AdminClient({"bootstrap.servers": node1.bootstrap})
    upsert = UserScramCredentialUpsertion("alice", ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 4096), b"pw-1")
    assert ck.alter_user_scram_credentials([upsert])["alice"].result(15) is None
    wait_for(lambda: "alice" in file_of(node0).get("scram", {}), what="node 0 to have alice's credential")
    credential = SecurityStore.open(node0.data_dir, Authorizer())
    assert credential.scram_credential("alice", Mechanism.SCRAM_SHA_512).verify_password(Mechanism.SCRAM_SHA_512,
                                                                                         "pw-1")

    # both nodes changing at once: every change lands (compare-and-swap, retried), on both
    def create_many(server, prefix: str) -> None:
        a = KafkaAdminClient(bootstrap_servers=server.bootstrap, request_timeout_ms=20000)
        try:
            for i in range(6):
                result = a.create_acls([ACL(ANON, "*", ACLOperation.READ, ACLPermissionType.ALLOW,
                                            ResourcePattern(ResourceType.GROUP, f"{prefix}{i}",
                                                            ACLResourcePatternType.LITERAL))])
                assert not result["failed"], result["failed"]
        finally:
            a.close()
    with ThreadPoolExecutor(2) as pool:
        for done in [pool.submit(create_many, node0, "zero-"), pool.submit(create_many, node1, "one-")]:
            done.result(120)
    wanted = {(f"{p}{i}", "READ") for p in ("zero-", "one-") for i in range(6)}
    wait_for(lambda: wanted <= acls_on(node0) and wanted <= acls_on(node1), what="every group ACL on both nodes")

    # node 1 down while the ACL goes: back, it takes etcd's state over its own file
    cluster.kill(1)
    wait_for(lambda: cluster.brokers(via=0) == {0}, what="node 1's session to end")  # clients then ask node 0
    admin = KafkaAdminClient(bootstrap_servers=node0.bootstrap, request_timeout_ms=10000)
    try:
        (_f, matched, error), = admin.delete_acls([ACLFilter(ANON, "*", ACLOperation.WRITE, ACLPermissionType.ANY,
                                                             ResourcePatternFilter(ResourceType.TOPIC, "orders",
                                                                                   ACLResourcePatternType.ANY))])
        assert error.errno == 0 and len(matched) == 1
    finally:
        admin.close()
    assert any(a["name"] == "orders" for a in file_of(node1)["acls"])  # its file still has it
    node1 = cluster.restart(1)
    wait_for(lambda: ("orders", "WRITE") not in acls_on(node1), what="node 1 to drop the deleted ACL")
    assert not any(a["name"] == "orders" for a in file_of(node1)["acls"])

    # etcd gone: the change is refused, and no node has it
    etcd.kill()
    admin = KafkaAdminClient(bootstrap_servers=node0.bootstrap, request_timeout_ms=30000)
    try:
        result = admin.create_acls([ACL(ANON, "*", ACLOperation.READ, ACLPermissionType.ALLOW,
                                        ResourcePattern(ResourceType.TOPIC, "orders",
                                                        ACLResourcePatternType.LITERAL))])
    finally:
        admin.close()
    assert not result["succeeded"] and "UnknownError" in repr(result["failed"])  # UNKNOWN_SERVER_ERROR
    for server in (node0, node1):  # the client sent it to either; neither has it
        assert ("orders", "READ") not in acls_on(server)
        assert not any(a["name"] == "orders" and a["operation"] == "READ" for a in file_of(server)["acls"])
    assert "security change refused: cannot write etcd key /shale/" in node0.log() + node1.log()
