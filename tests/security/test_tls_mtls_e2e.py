"""Mutual TLS on a real `shale serve` (an SSL listener with `ssl.client.auth=required`): the four clients produce,
consume in a group and use the admin API with a client certificate, whose DN the mapping rules turn into
`User:alice`; no certificate, an expired one and one from another CA are refused in the handshake, nothing is
served, and the node keeps serving."""

from __future__ import annotations

import asyncio
import ssl
import subprocess
import uuid

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.admin import NewTopic as AioNewTopic
from aiokafka.helpers import create_ssl_context
from confluent_kafka import Consumer, KafkaException, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from support.node_util import ServeProcess, topic_manifest, wait_for, write_manifests
from support.tls_util import RawClient, client_context, kafka_python_round_trip, kcat_env, make_pki, tls_overrides

METADATA = 3
RULES = "RULE:^CN=([^,]+),OU=ServiceUsers.*$/$1/L,DEFAULT"


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    d = tmp_path_factory.mktemp("mtls")
    pki = make_pki(d / "pki")
    topics = write_manifests(d / "topics" / "t.yaml", topic_manifest("orders", 1))
    server = ServeProcess(d / "data", topics.parent, "--override", "offsets.topic.num.partitions=3")
    server.args += ["--override", f"listeners=SSL://127.0.0.1:{server.port}", "--override",
                    "inter.broker.listener.name=SSL", "--override", f"ssl.principal.mapping.rules={RULES}",
                    *tls_overrides(pki, "SSL", client_auth="required")]
    with server:
        server.pki = pki
        server.kcat_env = kcat_env(d / "librdkafka")
        yield server


def confluent_config(node, cert: str = "alice") -> dict:
    return {"bootstrap.servers": node.bootstrap, "security.protocol": "SSL", "ssl.ca.location": node.pki.ca,
            "ssl.certificate.location": node.pki.path(f"{cert}.pem"), "ssl.key.location": node.pki.path(f"{cert}.key")}


def kafka_python_config(node) -> dict:
    return {"bootstrap_servers": node.bootstrap, "security_protocol": "SSL", "ssl_cafile": node.pki.ca,
            "ssl_certfile": node.pki.path("alice.pem"), "ssl_keyfile": node.pki.path("alice.key")}


def test_confluent_kafka_with_a_client_certificate(node):
    topic = f"ck-{uuid.uuid4().hex[:6]}"
    admin = AdminClient(confluent_config(node))
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(30)
    producer = Producer(confluent_config(node))
    for i in range(5):
        producer.produce(topic, value=f"v{i}".encode())
    assert producer.flush(30) == 0
    consumer = Consumer({**confluent_config(node), "group.id": "ck-mtls", "auto.offset.reset": "earliest"})
    consumer.subscribe([topic])
    seen: list[bytes] = []

    def five() -> bool:
        msg = consumer.poll(0.5)
        if msg is not None and msg.error() is None:
            seen.append(msg.value())
        return len(seen) == 5

    wait_for(five, 60, what="5 records over mutual TLS")
    consumer.close()
    assert seen == [f"v{i}".encode() for i in range(5)]
    assert "authenticated by its certificate as User:alice" in node.log()  # the mapping rule's principal


def test_kafka_python_with_a_client_certificate(node):
    topic = f"kp-{uuid.uuid4().hex[:6]}"
    assert kafka_python_round_trip(kafka_python_config(node), topic, [b"one"], "kp-mtls") == [b"one"]


def test_aiokafka_with_a_client_certificate(node):
    topic = f"aio-{uuid.uuid4().hex[:6]}"

    async def run() -> bytes:
        context = create_ssl_context(cafile=node.pki.ca, certfile=node.pki.path("alice.pem"),
                                     keyfile=node.pki.path("alice.key"))
        common = dict(bootstrap_servers=node.bootstrap, security_protocol="SSL", ssl_context=context)
        admin = AIOKafkaAdminClient(**common)
        await admin.start()
        try:
            await admin.create_topics([AioNewTopic(topic, 1, 1)])
        finally:
            await admin.close()
        producer = AIOKafkaProducer(**common)
        await producer.start()
        try:
            await producer.send_and_wait(topic, b"aio")
        finally:
            await producer.stop()
        consumer = AIOKafkaConsumer(topic, **common, group_id="aio-mtls", auto_offset_reset="earliest")
        await consumer.start()
        try:
            async with asyncio.timeout(60):
                return (await consumer.getone()).value
        finally:
            await consumer.stop()

    assert asyncio.run(run()) == b"aio"


def kcat(node, cert: str, *args: str, stdin: str | None = None):
    return subprocess.run(["kcat", "-b", node.bootstrap, "-X", "security.protocol=SSL",
                           "-X", f"ssl.ca.location={node.pki.ca}",
                           "-X", f"ssl.certificate.location={node.pki.path(cert + '.pem')}",
                           "-X", f"ssl.key.location={node.pki.path(cert + '.key')}", *args],
                          input=stdin, capture_output=True, text=True, timeout=60, env=node.kcat_env)


def test_kcat_with_a_client_certificate(node):
    assert kcat(node, "alice", "-P", "-t", "orders", stdin="m1\nm2\n").returncode == 0
    consumed = kcat(node, "alice", "-C", "-G", "kcat-mtls", "-X", "auto.offset.reset=earliest", "-c", "2", "-e",
                    "orders")
    assert consumed.returncode == 0, consumed.stderr
    assert sorted(consumed.stdout.split()) == ["m1", "m2"]
    listed = kcat(node, "alice", "-L", "-t", "orders")
    assert listed.returncode == 0 and 'topic "orders" with 1 partitions' in listed.stdout


@pytest.mark.parametrize("cert, reason", [("expired", "certificate has expired"),
                                          ("rogue", "unable to get local issuer certificate"),
                                          (None, "peer did not return a certificate")])
def test_a_refused_certificate_ends_the_handshake_and_nothing_is_served(node, cert, reason):
    def refusals() -> list[str]:
        return [line for line in node.log().splitlines() if "TLS handshake with" in line]

    before = len(refusals())
    with pytest.raises((ssl.SSLError, ConnectionResetError, BrokenPipeError)):
        conn = RawClient(node.port, client_context(node.pki, cert))
        # TLS 1.3 finishes the client's side first: the server's refusal arrives with the first read
        assert conn.request(METADATA, 9, {"topics": None, "allow_auto_topic_creation": False}) is None
        raise ConnectionResetError("closed without an answer")
    wait_for(lambda: len(refusals()) > before, 30, what="the refusal in the log")
    assert reason in refusals()[-1] and "listener SSL 127.0.0.1" in refusals()[-1]
    _still_serves(node)


def test_confluent_kafka_with_an_expired_certificate_is_refused(node):
    admin = AdminClient({**confluent_config(node, "expired"), "socket.timeout.ms": 5000})
    with pytest.raises(KafkaException):
        admin.list_topics(timeout=10)
    _still_serves(node)


def test_plaintext_on_the_mtls_port_is_refused(node):
    assert RawClient(node.port).request(METADATA, 9, {"topics": None, "allow_auto_topic_creation": False}) is None
    _still_serves(node)


def _still_serves(node) -> None:
    conn = RawClient(node.port, client_context(node.pki, "alice"))
    metadata = conn.request(METADATA, 9, {"topics": None, "allow_auto_topic_creation": False})
    assert "orders" in {t.name for t in metadata.topics}
    conn.close()
