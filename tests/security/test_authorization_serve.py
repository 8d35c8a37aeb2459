"""ACLs on a real `shale serve` with `authorizer.class.name` set, through unmodified clients.

The principal here is the PLAINTEXT listener's `User:ANONYMOUS`: the ACLs are created and removed live with
the admin clients' CreateAcls / DeleteAcls, and each step checks what Kafka's broker answers — produce and
fetch refused with TOPIC_AUTHORIZATION_FAILED, a group join with GROUP_AUTHORIZATION_FAILED, Metadata
without the topics that may not be described, deny over allow, prefixed patterns, super users, and the
refusal logged with the principal and the topic."""

from __future__ import annotations

from pathlib import Path

import confluent_kafka
import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer
from confluent_kafka.admin import (
    AclBinding as CkAclBinding,
)
from confluent_kafka.admin import (
    AclOperation as CkOp,
)
from confluent_kafka.admin import (
    AclPermissionType as CkPerm,
)
from confluent_kafka.admin import (
    AdminClient,
    ResourcePatternType,
)
from confluent_kafka.admin import (
    ResourceType as CkResource,
)
from kafka import KafkaConsumer, KafkaProducer, TopicPartition
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
from kafka.errors import TopicAuthorizationFailedError

from shale.sidecar.security.acl import (
    CLUSTER_NAME,
    AccessControlEntry,
    AclBinding,
    AclOperation,
    AclPermissionType,
    PatternType,
)
from shale.sidecar.security.acl import (
    ResourcePattern as Rp,
)
from shale.sidecar.security.acl import (
    ResourceType as Rt,
)
from shale.sidecar.security.authorizer import Authorizer
from shale.sidecar.security.store import SecurityStore
from support.node_util import ServeProcess, topic_manifest, wait_for, write_manifests

ANON = "User:ANONYMOUS"
TOPICS = ("orders", "orders-eu", "secret")


def seed_admin(data_dir: Path) -> None:
    """The first ACLs, written to the node's security file before it starts (as an operator would): the
    anonymous principal may manage ACLs (ALTER and DESCRIBE on the cluster) and nothing else."""
    data_dir.mkdir(parents=True, exist_ok=True)
    store = SecurityStore.open(str(data_dir), Authorizer())
    outcomes = store.create_acls([AclBinding(Rp(Rt.CLUSTER, CLUSTER_NAME, PatternType.LITERAL),
                                             AccessControlEntry(ANON, "*", op, AclPermissionType.ALLOW))
                                  for op in (AclOperation.ALTER, AclOperation.DESCRIBE)])
    assert all(o.error_code == 0 for o in outcomes)


@pytest.fixture
def node(tmp_path):
    topics = write_manifests(tmp_path / "topics" / "t.yaml", *(topic_manifest(t) for t in TOPICS))
    seed_admin(tmp_path / "data")
    with ServeProcess(tmp_path / "data", topics.parent, "--override",
                      "authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer") as server:
        yield server


def kp_admin(server: ServeProcess) -> KafkaAdminClient:
    return KafkaAdminClient(bootstrap_servers=server.bootstrap, request_timeout_ms=10000)


def allow(name: str, op: ACLOperation, rtype: ResourceType = ResourceType.TOPIC,
          pattern: ACLResourcePatternType = ACLResourcePatternType.LITERAL,
          perm: ACLPermissionType = ACLPermissionType.ALLOW) -> ACL:
    return ACL(ANON, "*", op, perm, ResourcePattern(rtype, name, pattern))


def produce(server: ServeProcess, topic: str) -> KafkaError | None:
    """One record with confluent-kafka; the delivery error (None when it was written)."""
    p = Producer({"bootstrap.servers": server.bootstrap, "message.timeout.ms": 10000,
                  "topic.metadata.refresh.interval.ms": 500})
    outcome: list = []
    p.produce(topic, b"v", callback=lambda err, msg: outcome.append(err))
    p.flush(15)
    assert outcome, "no delivery report"
    return outcome[0]


def test_acls_decide_produce_fetch_groups_and_metadata(node):
    admin = kp_admin(node)
    try:
        # no ACL on any topic yet: everything refused (allow.everyone.if.no.acl.found defaults to false)
        err = produce(node, "orders")
        assert err is not None and err.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
        assert "Topic authorization failed" in err.str() or err.code() == 29
        assert set(admin.list_topics()) == set()  # Metadata hides every topic

        # prefixed WRITE on "orders…", READ on "orders", READ on the group "readers"; DENY WRITE on orders-eu
        created = admin.create_acls([allow("orders", ACLOperation.WRITE, pattern=ACLResourcePatternType.PREFIXED),
                                     allow("orders", ACLOperation.READ),
                                     allow("readers", ACLOperation.READ, ResourceType.GROUP),
                                     allow("orders-eu", ACLOperation.WRITE, perm=ACLPermissionType.DENY)])
        assert not created["failed"], created["failed"]

        assert produce(node, "orders") is None
        err = produce(node, "orders-eu")  # deny wins over the prefixed allow
        assert err is not None and err.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
        err = produce(node, "secret")
        assert err is not None and err.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
        # WRITE implies DESCRIBE: both orders topics are listed, secret is not
        assert set(admin.list_topics()) == {"orders", "orders-eu"}

        consumer = KafkaConsumer("orders", bootstrap_servers=node.bootstrap, group_id="readers",
                                 auto_offset_reset="earliest", consumer_timeout_ms=10000)
        try:
            got = [m.value for m in consumer]
        finally:
            consumer.close()
        assert got == [b"v"]

        kp = KafkaProducer(bootstrap_servers=node.bootstrap, max_block_ms=10000)
        try:
            with pytest.raises(TopicAuthorizationFailedError):
                kp.send("orders-eu", b"x").get(10)
        finally:
            kp.close()

        # a group without READ: the join is refused
        c = Consumer({"bootstrap.servers": node.bootstrap, "group.id": "strangers", "auto.offset.reset": "earliest"})
        try:
            c.subscribe(["orders"])
            errors: list[KafkaError] = []
            wait_for(lambda: _poll_error(c, errors), timeout=20, what="a group authorization error")
            assert errors[0].code() == KafkaError.GROUP_AUTHORIZATION_FAILED
        finally:
            c.close()

        # fetch of a topic without READ: kafka-python raises the topic's error
        consumer = KafkaConsumer(bootstrap_servers=node.bootstrap, consumer_timeout_ms=5000)
        consumer.assign([TopicPartition("orders-eu", 0)])
        try:
            with pytest.raises(TopicAuthorizationFailedError):
                for _ in range(50):
                    consumer.poll(200)
        finally:
            consumer.close()

        # the refusals name the principal and the topic
        wait_for(lambda: "refused Produce: User:ANONYMOUS" in node.log() and "'secret'" in node.log(),
                 what="the refusal in the node's log")

        # DeleteAcls takes the prefixed WRITE away: produce to orders refused again
        deleted = admin.delete_acls([ACLFilter(ANON, "*", ACLOperation.WRITE, ACLPermissionType.ALLOW,
                                               ResourcePatternFilter(ResourceType.TOPIC, "orders",
                                                                     ACLResourcePatternType.PREFIXED))])
        (_filter, matched, error), = deleted
        assert error.errno == 0 and [m.resource_pattern.resource_name for m in matched] == ["orders"]
        err = produce(node, "orders")
        assert err is not None and err.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    finally:
        admin.close()


def _poll_error(consumer: Consumer, errors: list) -> bool:
    msg = consumer.poll(0.5)
    if msg is not None and msg.error() is not None and msg.error().code() != KafkaError._PARTITION_EOF:
        errors.append(msg.error())
    return bool(errors)


def test_confluent_admin_creates_describes_and_deletes_acls(node):
    admin = AdminClient({"bootstrap.servers": node.bootstrap})
    bindings = [CkAclBinding(CkResource.TOPIC, "pay", ResourcePatternType.PREFIXED, ANON, "*", CkOp.READ,
                             CkPerm.ALLOW),
                CkAclBinding(CkResource.GROUP, "g1", ResourcePatternType.LITERAL, "User:bob", "10.0.0.1", CkOp.DELETE,
                             CkPerm.DENY)]
    for future in admin.create_acls(bindings).values():
        assert future.result(10) is None
    described = admin.describe_acls(confluent_kafka.admin.AclBindingFilter(
        CkResource.ANY, None, ResourcePatternType.ANY, None, None, CkOp.ANY, CkPerm.ANY)).result(10)
    assert set(bindings) <= set(described)
    assert {(b.restype, b.name) for b in described} == {(CkResource.TOPIC, "pay"), (CkResource.GROUP, "g1"),
                                                        (CkResource.BROKER, CLUSTER_NAME)}
    # an invalid creation is refused by itself with Kafka's message, the others still made
    bad = CkAclBinding(CkResource.BROKER, "not-the-cluster",  # librdkafka calls the cluster resource BROKER
                       ResourcePatternType.LITERAL, ANON, "*", CkOp.ALTER, CkPerm.ALLOW)
    with pytest.raises(KafkaException, match="The only valid name for the CLUSTER resource is kafka-cluster"):
        admin.create_acls([bad])[bad].result(10)
    matching = admin.delete_acls([confluent_kafka.admin.AclBindingFilter(
        CkResource.TOPIC, None, ResourcePatternType.ANY, None, None, CkOp.ANY, CkPerm.ANY)])
    (deleted,) = [f.result(10) for f in matching.values()]
    assert deleted == [bindings[0]]
    # the change is on disk: a restart keeps the remaining group ACL
    node.terminate()
    node.start()
    admin = AdminClient({"bootstrap.servers": node.bootstrap})
    described = admin.describe_acls(
        confluent_kafka.admin.AclBindingFilter(CkResource.GROUP, None, ResourcePatternType.ANY, None, None, CkOp.ANY,
                                               CkPerm.ANY)).result(10)
    assert described == [bindings[1]]


def test_without_acl_admin_rights_the_acl_apis_answer_cluster_authorization_failed(tmp_path):
    topics = write_manifests(tmp_path / "topics" / "t.yaml", topic_manifest("orders"))
    with ServeProcess(tmp_path / "data", topics.parent, "--override", "authorizer.class.name=shale") as server:
        admin = kp_admin(server)
        try:
            with pytest.raises(Exception, match="ClusterAuthorizationFailed"):
                admin.describe_acls(ACLFilter(None, None, ACLOperation.ANY, ACLPermissionType.ANY,
                                              ResourcePatternFilter(ResourceType.ANY, None,
                                                                    ACLResourcePatternType.ANY)))
            result = admin.create_acls([allow("orders", ACLOperation.READ)])
            assert not result["succeeded"] and "ClusterAuthorizationFailed" in repr(result["failed"])
        finally:
            admin.close()
        assert not (tmp_path / "data" / "shale-security.json").exists()  # nothing was written


def test_super_users_and_allow_everyone(tmp_path):
    topics = write_manifests(tmp_path / "topics" / "t.yaml", topic_manifest("orders"), topic_manifest("audit"))
    data = tmp_path / "data"
    data.mkdir()
    store = SecurityStore.open(str(data), Authorizer())  # one ACL, on audit only: deny everyone READ
    store.create_acls([AclBinding(Rp(Rt.TOPIC, "audit", PatternType.LITERAL),
                                  AccessControlEntry("User:*", "*", AclOperation.READ, AclPermissionType.DENY))])
    with ServeProcess(data, topics.parent,
                      "--override", "authorizer.class.name=kafka.security.authorizer.AclAuthorizer",
                      "--override", "allow.everyone.if.no.acl.found=true") as server:
        assert produce(server, "orders") is None  # no ACL names orders: open to everyone
        err = produce(server, "audit")  # an ACL names audit, none allows WRITE
        assert err is not None and err.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    with ServeProcess(data, topics.parent, "--override", "authorizer.class.name=shale",
                      "--override", f"super.users=User:admin;{ANON}") as server:
        assert produce(server, "audit") is None  # a super user passes even a DENY


def test_without_an_authorizer_acl_apis_answer_security_disabled(tmp_path):
    topics = write_manifests(tmp_path / "topics" / "t.yaml", topic_manifest("orders"))
    with ServeProcess(tmp_path / "data", topics.parent) as server:
        admin = AdminClient({"bootstrap.servers": server.bootstrap})
        binding = CkAclBinding(CkResource.TOPIC, "orders", ResourcePatternType.LITERAL, ANON, "*", CkOp.READ,
                               CkPerm.ALLOW)
        with pytest.raises(KafkaException) as refused:
            admin.create_acls([binding])[binding].result(10)
        assert refused.value.args[0].code() == KafkaError.SECURITY_DISABLED
        assert produce(server, "orders") is None  # and nothing is checked


def test_an_unknown_authorizer_class_is_refused_at_start(tmp_path):
    topics = write_manifests(tmp_path / "topics" / "t.yaml", topic_manifest("orders"))
    server = ServeProcess(tmp_path / "data", topics.parent, "--override", "authorizer.class.name=com.example.Mine")
    with pytest.raises(AssertionError, match="exited with 1"):
        server.start(timeout=20)
    assert "authorizer.class.name" in server.log() and "com.example.Mine" in server.log()


def test_an_unreadable_security_file_stops_the_start_and_is_kept(tmp_path):
    topics = write_manifests(tmp_path / "topics" / "t.yaml", topic_manifest("orders"))
    data = tmp_path / "data"
    data.mkdir()
    bad = data / "shale-security.json"
    bad.write_text('{"version": 1, "acls": [{"resource_type": "TOPIC"}]}')
    server = ServeProcess(data, topics.parent, "--override", "authorizer.class.name=shale")
    with pytest.raises(AssertionError, match="exited with 1"):
        server.start(timeout=20)
    assert f"{bad} is not a valid security file: ACL entry 0" in server.log()
    assert bad.read_text() == '{"version": 1, "acls": [{"resource_type": "TOPIC"}]}'

