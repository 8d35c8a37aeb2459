"""ACLs for authenticated principals: a real `shale serve` with a SASL_PLAINTEXT listener (SCRAM-SHA-512) and
an authorizer. A super user administers ACLs and credentials with the admin clients; alice, granted WRITE and
READ on one topic and READ on one group, produces and consumes in her group; bob, with no ACL, is refused
with Kafka's errors and sees no topic; a user created through AlterUserScramCredentials logs in at once."""

from __future__ import annotations

import pytest
from confluent_kafka import Consumer, KafkaError, Producer
from confluent_kafka.admin import (
    AclBinding,
    AclOperation,
    AclPermissionType,
    AdminClient,
    ResourcePatternType,
    ResourceType,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialUpsertion,
)
from kafka import KafkaAdminClient, KafkaProducer
from kafka.errors import TopicAuthorizationFailedError

from support.node_util import ServeProcess, topic_manifest, wait_for, write_manifests
from support.tls_util import seed_user

PASSWORDS = {"admin": "admin-Pw-1", "alice": "alice-Pw-2", "bob": "bob-Pw-3"}


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    d = tmp_path_factory.mktemp("acl-sasl")
    data = d / "data"
    for user, password in PASSWORDS.items():
        seed_user(data, user, password)
    topics = write_manifests(d / "topics" / "t.yaml", topic_manifest("orders"), topic_manifest("payroll"))
    server = ServeProcess(data, topics.parent, "--override", "offsets.topic.num.partitions=1",
                          "--override", "authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer",
                          "--override", "super.users=User:admin")
    password_file = d / "admin.password"
    password_file.write_text(PASSWORDS["admin"])
    server.args += ["--override", f"listeners=SASL_PLAINTEXT://127.0.0.1:{server.port}",
                    "--override", "inter.broker.listener.name=SASL_PLAINTEXT",
                    "--override", "sasl.mechanism.inter.broker.protocol=SCRAM-SHA-512",
                    "--override", "listener.name.sasl_plaintext.scram-sha-512.sasl.jaas.config=org.apache.kafka."
                                  "common.security.scram.ScramLoginModule required username=\"admin\" "
                                  f'passwordFile="{password_file}";']
    with server:
        admin = AdminClient(config(server, "admin"))
        grants = [AclBinding(ResourceType.TOPIC, "orders", ResourcePatternType.LITERAL, "User:alice", "*", op,
                             AclPermissionType.ALLOW) for op in (AclOperation.WRITE, AclOperation.READ)]
        grants.append(AclBinding(ResourceType.GROUP, "team", ResourcePatternType.LITERAL, "User:alice", "*",
                                 AclOperation.READ, AclPermissionType.ALLOW))
        for future in admin.create_acls(grants).values():
            assert future.result(15) is None
        yield server
    assert not any(p in server.log() for p in PASSWORDS.values())


def config(node: ServeProcess, user: str, password: str | None = None) -> dict:
    return {"bootstrap.servers": node.bootstrap, "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanisms": "SCRAM-SHA-512", "sasl.username": user,
            "sasl.password": PASSWORDS[user] if password is None else password}


def produce(node: ServeProcess, user: str, topic: str, password: str | None = None):
    p = Producer({**config(node, user, password), "message.timeout.ms": 10000})
    outcome: list = []
    p.produce(topic, b"from " + user.encode(), callback=lambda err, msg: outcome.append(err))
    p.flush(20)
    assert outcome, "no delivery report"
    return outcome[0]


def test_alice_writes_and_reads_in_her_group(node):
    assert produce(node, "alice", "orders") is None
    c = Consumer({**config(node, "alice"), "group.id": "team", "auto.offset.reset": "earliest"})
    try:
        c.subscribe(["orders"])
        got: list[bytes] = []

        def read() -> bool:
            msg = c.poll(0.5)
            if msg is not None:
                assert msg.error() is None, msg.error()
                got.append(msg.value())
            return bool(got)
        wait_for(read, timeout=30, what="alice's record")
        assert got[0] == b"from alice"
    finally:
        c.close()
    err = produce(node, "alice", "payroll")
    assert err is not None and err.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    # alice may describe orders (READ and WRITE imply DESCRIBE), not payroll
    assert set(AdminClient(config(node, "alice")).list_topics(timeout=15).topics) == {"orders"}


def test_bob_is_refused_and_sees_nothing(node):
    err = produce(node, "bob", "orders")
    assert err is not None and err.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    assert AdminClient(config(node, "bob")).list_topics(timeout=15).topics == {}
    c = Consumer({**config(node, "bob"), "group.id": "team", "auto.offset.reset": "earliest"})
    try:
        c.subscribe(["orders"])
        errors: list = []

        def refused() -> bool:
            msg = c.poll(0.5)
            if msg is not None and msg.error() is not None:
                errors.append(msg.error())
            return bool(errors)
        wait_for(refused, timeout=30, what="bob's group refusal")
        assert errors[0].code() == KafkaError.GROUP_AUTHORIZATION_FAILED
    finally:
        c.close()
    kp = KafkaProducer(bootstrap_servers=node.bootstrap, security_protocol="SASL_PLAINTEXT",
                       sasl_mechanism="SCRAM-SHA-512", sasl_plain_username="bob",
                       sasl_plain_password=PASSWORDS["bob"], max_block_ms=10000)
    try:
        with pytest.raises(TopicAuthorizationFailedError):
            kp.send("orders", b"x").get(15)
    finally:
        kp.close()
    kadmin = KafkaAdminClient(bootstrap_servers=node.bootstrap, security_protocol="SASL_PLAINTEXT",
                              sasl_mechanism="SCRAM-SHA-512", sasl_plain_username="bob",
                              sasl_plain_password=PASSWORDS["bob"])
    try:
        with pytest.raises(Exception, match="ClusterAuthorizationFailed"):
            kadmin.describe_user_scram_credentials()
    finally:
        kadmin.close()
    wait_for(lambda: "User:bob from 127.0.0.1 (listener SASL_PLAINTEXT) may not DESCRIBE TOPIC 'orders'" in node.log(),
             what="bob's refusal in the node's log")


def test_a_user_created_through_the_admin_api_logs_in_at_once(node):
    admin = AdminClient(config(node, "admin"))
    carol = UserScramCredentialUpsertion("carol", ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 8192),
                                         b"carol-Pw-4")
    assert admin.alter_user_scram_credentials([carol])["carol"].result(15) is None
    # authenticated (no SASL error), then refused by the ACLs: the credential and the authorizer both hold
    err = produce(node, "carol", "orders", password="carol-Pw-4")
    assert err is not None and err.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    grant = AclBinding(ResourceType.TOPIC, "ord", ResourcePatternType.PREFIXED, "User:carol", "*",
                       AclOperation.WRITE, AclPermissionType.ALLOW)
    assert admin.create_acls([grant])[grant].result(15) is None
    assert produce(node, "carol", "orders", password="carol-Pw-4") is None
