"""SASL_SSL with SCRAM-SHA-512 on a real `shale serve`: the four clients (confluent-kafka, kafka-python, aiokafka,
kcat) produce, consume in a group and use the admin API; wrong passwords, unknown users, requests before
authentication, plaintext on the TLS port and SASL on a PLAINTEXT listener are refused with Kafka's errors, the
connection closed, nothing served, and the node keeps serving. No password reaches the node's log."""

from __future__ import annotations

import asyncio
import os
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
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kafka import KafkaConsumer, KafkaProducer
from kafka.admin import KafkaAdminClient
from kafka.errors import KafkaError

from support.clients_util import read_frame
from support.node_util import ServeProcess, free_port, topic_manifest, wait_for, write_manifests
from support.tls_util import (
    RawClient,
    client_context,
    kafka_python_round_trip,
    kcat_env,
    make_pki,
    seed_user,
    tls_overrides,
)

PASSWORD = "alice-Secret-4711"
NODE_PASSWORD = "node-Secret-0815"
SASL_AUTHENTICATION_FAILED, ILLEGAL_SASL_STATE = 58, 34
METADATA, API_VERSIONS = 3, 18


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    d = tmp_path_factory.mktemp("sasl-ssl")
    pki = make_pki(d / "pki")
    data = d / "data"
    seed_user(data, "alice", PASSWORD)
    seed_user(data, "node", NODE_PASSWORD)
    (d / "node.password").write_text(NODE_PASSWORD)
    topics = write_manifests(d / "topics" / "t.yaml", topic_manifest("orders", 2))
    plain = free_port()
    server = ServeProcess(data, topics.parent, "--override", "offsets.topic.num.partitions=3")
    server.args += ["--override", f"listeners=SASL_SSL://127.0.0.1:{server.port},PLAINTEXT://127.0.0.1:{plain}",
                    "--override", "inter.broker.listener.name=SASL_SSL",
                    "--override", "sasl.mechanism.inter.broker.protocol=SCRAM-SHA-512",
                    "--override", "listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config=org.apache.kafka.common."
                                  f'security.scram.ScramLoginModule required username="node" '
                                  f'passwordFile="{d / "node.password"}";',
                    *tls_overrides(pki, "SASL_SSL")]
    with server:
        server.plain_port = plain
        server.pki = pki
        server.kcat_env = kcat_env(d / "librdkafka")
        yield server
    assert PASSWORD not in server.log() and NODE_PASSWORD not in server.log()


def confluent_config(node, password: str = PASSWORD, user: str = "alice") -> dict:
    return {"bootstrap.servers": node.bootstrap, "security.protocol": "SASL_SSL", "sasl.mechanisms": "SCRAM-SHA-512",
            "sasl.username": user, "sasl.password": password, "ssl.ca.location": node.pki.ca}


def kafka_python_config(node) -> dict:
    return {"bootstrap_servers": node.bootstrap, "security_protocol": "SASL_SSL", "sasl_mechanism": "SCRAM-SHA-512",
            "sasl_plain_username": "alice", "sasl_plain_password": PASSWORD, "ssl_cafile": node.pki.ca}


def test_confluent_kafka_produces_consumes_in_a_group_and_administers(node):
    topic = f"ck-{uuid.uuid4().hex[:6]}"
    admin = AdminClient(confluent_config(node))
    admin.create_topics([NewTopic(topic, 2, 1)])[topic].result(30)
    assert topic in admin.list_topics(timeout=30).topics
    producer = Producer(confluent_config(node))
    for i in range(10):
        producer.produce(topic, key=str(i).encode(), value=f"v{i}".encode())
    assert producer.flush(30) == 0
    consumer = Consumer({**confluent_config(node), "group.id": "ck-group", "auto.offset.reset": "earliest"})
    consumer.subscribe([topic])
    seen = set()
    wait_for(lambda: _poll_into(consumer, seen) and len(seen) == 10, 60, what="10 records over SASL_SSL")
    consumer.commit(asynchronous=False)
    consumer.close()
    assert seen == {f"v{i}".encode() for i in range(10)}
    assert "authenticated as User:alice with SCRAM-SHA-512" in node.log()


def _poll_into(consumer, seen: set) -> bool:
    msg = consumer.poll(0.5)
    if msg is not None and msg.error() is None:
        seen.add(msg.value())
    return True


def test_kafka_python_produces_consumes_in_a_group_and_administers(node):
    values = [f"k{i}".encode() for i in range(5)]
    topic = f"kp-{uuid.uuid4().hex[:6]}"
    assert kafka_python_round_trip(kafka_python_config(node), topic, values, "kp-group") == values


def test_aiokafka_produces_consumes_in_a_group_and_administers(node):
    topic = f"aio-{uuid.uuid4().hex[:6]}"

    async def run() -> list[bytes]:
        common = dict(bootstrap_servers=node.bootstrap, security_protocol="SASL_SSL", sasl_mechanism="SCRAM-SHA-512",
                      sasl_plain_username="alice", sasl_plain_password=PASSWORD,
                      ssl_context=create_ssl_context(cafile=node.pki.ca))
        admin = AIOKafkaAdminClient(**common)
        await admin.start()
        try:
            await admin.create_topics([AioNewTopic(topic, 1, 1)])
            assert topic in await admin.list_topics()
        finally:
            await admin.close()
        producer = AIOKafkaProducer(**common)
        await producer.start()
        try:
            for i in range(5):
                await producer.send_and_wait(topic, f"a{i}".encode())
        finally:
            await producer.stop()
        consumer = AIOKafkaConsumer(topic, **common, group_id="aio-group", auto_offset_reset="earliest")
        await consumer.start()
        try:
            got = []
            async with asyncio.timeout(60):
                while len(got) < 5:
                    got.append((await consumer.getone()).value)
            await consumer.commit()
            return got
        finally:
            await consumer.stop()

    assert asyncio.run(run()) == [f"a{i}".encode() for i in range(5)]


def kcat(node, *args: str, stdin: str | None = None, password: str = PASSWORD, timeout: float = 60,
         env: dict | None = None):
    return subprocess.run(["kcat", "-b", node.bootstrap, "-X", "security.protocol=SASL_SSL",
                           "-X", "sasl.mechanisms=SCRAM-SHA-512", "-X", "sasl.username=alice",
                           "-X", f"sasl.password={password}", "-X", f"ssl.ca.location={node.pki.ca}", *args],
                          input=stdin, capture_output=True, text=True, timeout=timeout,
                          env=node.kcat_env if env is None else env)


def test_kcat_produces_consumes_in_a_group_and_lists_metadata(node):
    produced = kcat(node, "-P", "-t", "orders", "-p", "0", stdin="k1\nk2\nk3\n")
    assert produced.returncode == 0, produced.stderr
    listed = kcat(node, "-L", "-t", "orders")
    assert listed.returncode == 0 and "topic \"orders\" with 2 partitions" in listed.stdout, listed.stderr
    consumed = kcat(node, "-C", "-G", "kcat-group", "-X", "auto.offset.reset=earliest", "-c", "3", "-e", "orders")
    assert consumed.returncode == 0, consumed.stderr
    assert sorted(consumed.stdout.split()) == ["k1", "k2", "k3"]


def test_a_librdkafka_repeating_its_scram_nonce_is_refused_as_kafka_4_refuses_it(node):
    """Debian's kcat (librdkafka 2.0.2) sends client nonce + server nonce + its nonce again; RFC 5802 and Kafka 4
    want the server's nonce exactly, so the right password is refused, and the reason is logged."""
    refused = kcat(node, "-L", "-m", "5", env=dict(os.environ))  # Debian's librdkafka
    assert refused.returncode != 0 and "Authentication failed" in refused.stderr, refused.stderr
    wait_for(lambda: "Invalid client nonce in the final client message." in node.log(), 30, what="the logged reason")


def test_kcat_with_a_wrong_password_is_refused(node):
    refused = kcat(node, "-L", "-m", "5", password="not-it", timeout=60)
    assert refused.returncode != 0
    assert "Authentication failed" in refused.stderr or "SASL authentication error" in refused.stderr, refused.stderr


def test_confluent_kafka_with_a_wrong_password_is_refused(node):
    admin = AdminClient({**confluent_config(node, password="wrong"), "socket.timeout.ms": 5000})
    with pytest.raises(KafkaException):
        admin.list_topics(timeout=10)
    wait_for(lambda: "authentication of client" in node.log()
             and "Invalid client credentials (user 'alice')" in node.log(),
             30, what="the refusal in the node's log")


def test_kafka_python_with_an_unknown_user_is_refused(node):
    with pytest.raises(KafkaError):
        KafkaAdminClient(**{**kafka_python_config(node), "sasl_plain_username": "mallory"},
                         request_timeout_ms=5000, api_version_auto_timeout_ms=5000).list_topics()


def test_wrong_password_answers_sasl_authentication_failed_then_closes(node):
    conn = RawClient(node.port, client_context(node.pki))
    reply = conn.scram("alice", "wrong password")
    assert reply.error_code == SASL_AUTHENTICATION_FAILED
    assert reply.error_message == ("Authentication failed during authentication due to invalid credentials with "
                                   "SASL mechanism SCRAM-SHA-512")
    assert conn.request(METADATA, 9, {"topics": None, "allow_auto_topic_creation": False}) is None
    _still_serves(node)


def test_unknown_user_answers_sasl_authentication_failed_then_closes(node):
    conn = RawClient(node.port, client_context(node.pki))
    reply = conn.scram("mallory", "anything")
    assert reply.error_code == SASL_AUTHENTICATION_FAILED
    assert conn.closed()
    assert "mallory" in node.log()  # the reason is logged, naming the user, never a password
    _still_serves(node)


def test_nothing_is_served_before_authentication(node):
    conn = RawClient(node.port, client_context(node.pki))
    assert conn.request(API_VERSIONS, 3, {"client_software_name": "raw", "client_software_version": "1"}) is not None
    assert conn.request(METADATA, 9, {"topics": None, "allow_auto_topic_creation": False}) is None
    wait_for(lambda: "Unexpected Kafka request of type METADATA during SASL handshake" in node.log(), 30,
             what="the refusal in the log")
    _still_serves(node)


def test_plaintext_on_the_tls_port_is_refused(node):
    conn = RawClient(node.port)  # no TLS
    answer = conn.request(API_VERSIONS, 3, {"client_software_name": "raw", "client_software_version": "1"})
    assert answer is None
    wait_for(lambda: "TLS handshake with" in node.log(), 30, what="the handshake failure in the log")
    _still_serves(node)


def test_sasl_on_a_plaintext_listener_answers_illegal_sasl_state(node):
    conn = RawClient(node.plain_port)
    versions = conn.request(API_VERSIONS, 3, {"client_software_name": "raw", "client_software_version": "1"})
    assert {17, 36} <= {k.api_key for k in versions.api_keys}  # advertised on every listener, as Kafka does
    assert conn.request(17, 1, {"mechanism": "SCRAM-SHA-512"}).error_code == ILLEGAL_SASL_STATE
    refused = subprocess.run(["kcat", "-b", f"127.0.0.1:{node.plain_port}", "-X", "security.protocol=SASL_PLAINTEXT",
                              "-X", "sasl.mechanisms=SCRAM-SHA-512", "-X", "sasl.username=alice",
                              "-X", f"sasl.password={PASSWORD}", "-L", "-m", "5"],
                             capture_output=True, text=True, timeout=60, env=node.kcat_env)
    assert refused.returncode != 0
    _still_serves(node)


def _still_serves(node) -> None:
    conn = RawClient(node.port, client_context(node.pki))
    assert conn.scram("alice", PASSWORD).error_code == 0
    metadata = conn.request(METADATA, 9, {"topics": None, "allow_auto_topic_creation": False})
    assert "orders" in {t.name for t in metadata.topics}
    ((broker),) = metadata.brokers
    assert (broker.host, broker.port) == ("127.0.0.1", node.port)  # the listener's own address
    conn.close()


def test_a_frame_above_sasl_server_max_receive_size_before_authentication_closes(node):
    conn = RawClient(node.port, client_context(node.pki))
    size = 600 * 1024  # above Kafka's sasl.server.max.receive.size (512 KiB), below socket.request.max.bytes
    conn.sock.sendall(size.to_bytes(4, "big") + bytes(1024))
    assert conn.closed()
    wait_for(lambda: f"a {size}-byte frame before authentication" in node.log(), 30, what="the refusal in the log")
    _still_serves(node)


def test_each_listener_names_this_node_by_its_own_address(node):
    """Metadata and FindCoordinator on the PLAINTEXT listener send a client back to that listener, not to the
    SASL_SSL one the node is registered with (a consumer group then works on either)."""
    conn = RawClient(node.plain_port)
    ((broker),) = conn.request(METADATA, 9, {"topics": None, "allow_auto_topic_creation": False}).brokers
    assert (broker.host, broker.port) == ("127.0.0.1", node.plain_port)
    coordinator = conn.request(10, 3, {"key": "plain-group", "key_type": 0})
    assert (coordinator.error_code, coordinator.host, coordinator.port) == (0, "127.0.0.1", node.plain_port)
    (found,) = conn.request(10, 4, {"key_type": 0, "coordinator_keys": ["plain-group"]}).coordinators
    assert (found.error_code, found.port) == (0, node.plain_port)
    producer = KafkaProducer(bootstrap_servers=f"127.0.0.1:{node.plain_port}")
    producer.send("orders", b"plain", partition=1).get(30)
    producer.close()
    consumer = KafkaConsumer("orders", bootstrap_servers=f"127.0.0.1:{node.plain_port}", group_id="plain-group",
                             auto_offset_reset="earliest", consumer_timeout_ms=20000)
    assert next(iter(consumer)).topic == "orders"
    consumer.close()


_frames = st.lists(st.one_of(
    st.tuples(st.sampled_from([17, 36, 18, 3, 0, 99]), st.integers(-1, 5), st.binary(max_size=64)),
    st.tuples(st.just(36), st.just(2), st.binary(min_size=1, max_size=3000))), min_size=1, max_size=4)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(_frames)
def test_fuzzed_frames_before_authentication_get_only_clean_refusals(node, frames):
    """Request headers with any API key and version and arbitrary bodies, in any order, before authenticating:
    answered (a handshake's own answer) or the connection closed; never served, never a dead node."""
    conn = RawClient(node.port, client_context(node.pki), timeout=30)
    try:
        for correlation_id, (api_key, version, body) in enumerate(frames):
            header = api_key.to_bytes(2, "big", signed=True) + version.to_bytes(2, "big", signed=True)
            frame = header + correlation_id.to_bytes(4, "big") + (4).to_bytes(2, "big") + b"fuzz" + body
            try:
                conn.sock.sendall(len(frame).to_bytes(4, "big") + frame)
                answer = read_frame(conn.sock)
            except (ConnectionResetError, BrokenPipeError, ssl.SSLError):
                break
            if answer is None:
                break
            assert api_key in (17, 18, 36), f"API {api_key} answered before authentication"
    finally:
        conn.close()
    _still_serves(node)
