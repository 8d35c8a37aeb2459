"""The authenticated principal reaches the authorizer: on a SASL_PLAINTEXT listener with `authorizer.class.name`
set and `super.users=User:alice`, alice (SCRAM-SHA-256) produces and reads, bob (authenticated, no ACL) is refused
with TOPIC_AUTHORIZATION_FAILED, and PLAIN (opt-in) checks its password against the same salted credential."""

from __future__ import annotations

import pytest
from kafka import KafkaConsumer, KafkaProducer
from kafka.errors import TopicAuthorizationFailedError

from support.node_util import ServeProcess, topic_manifest, write_manifests
from support.tls_util import seed_user


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    d = tmp_path_factory.mktemp("sasl-principal")
    for user in ("alice", "bob"):
        seed_user(d / "data", user, f"{user}-pw", mechanism="SCRAM-SHA-256")
    topics = write_manifests(d / "topics" / "t.yaml", topic_manifest("ledger", 1))
    server = ServeProcess(d / "data", topics.parent, "--override", "offsets.topic.num.partitions=3")
    server.args += ["--override", f"listeners=SASL_PLAINTEXT://127.0.0.1:{server.port}",
                    "--override", "inter.broker.listener.name=SASL_PLAINTEXT",
                    "--override", "sasl.enabled.mechanisms=SCRAM-SHA-256,PLAIN",
                    "--override", "sasl.mechanism.inter.broker.protocol=SCRAM-SHA-256",
                    "--override", 'sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required '
                                  'username="alice" password="alice-pw";',
                    "--override", "authorizer.class.name=shale", "--override", "super.users=User:alice"]
    with server:
        yield server
    assert "alice-pw" not in server.log() and "bob-pw" not in server.log()


def client(node, user: str, mechanism: str = "SCRAM-SHA-256") -> dict:
    return {"bootstrap_servers": node.bootstrap, "security_protocol": "SASL_PLAINTEXT", "sasl_mechanism": mechanism,
            "sasl_plain_username": user, "sasl_plain_password": f"{user}-pw"}


def test_a_super_user_produces_and_reads(node):
    producer = KafkaProducer(**client(node, "alice"))
    producer.send("ledger", b"by alice").get(30)
    producer.close()
    consumer = KafkaConsumer("ledger", **client(node, "alice", "PLAIN"), auto_offset_reset="earliest",
                             consumer_timeout_ms=20000)
    assert next(iter(consumer)).value == b"by alice"
    consumer.close()
    assert "authenticated as User:alice with PLAIN" in node.log()


def test_an_authenticated_user_without_acls_is_refused_by_the_authorizer(node):
    producer = KafkaProducer(**client(node, "bob"), max_block_ms=10000)
    with pytest.raises(TopicAuthorizationFailedError):
        producer.send("ledger", b"by bob").get(30)
    producer.close()
    assert "authenticated as User:bob with SCRAM-SHA-256" in node.log()
