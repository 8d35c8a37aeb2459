"""Certificates made with the `openssl` CLI for the TLS tests, and the `shale serve` settings that use them.

`make_pki(d)`: a CA; a server certificate for 127.0.0.1/localhost (key and chain in one PEM file, Kafka's PEM
keystore, and also apart, as cert-manager writes them); client certificates for `alice` (signed by the CA),
`expired` (signed by the CA, valid only in 2020) and `rogue` (signed by another CA).
"""

from __future__ import annotations

import os
import socket
import ssl
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import confluent_kafka
from kafka import KafkaConsumer, KafkaProducer
from kafka.admin import KafkaAdminClient, NewTopic
from kafka.net.sasl.scram import ScramClient

from shale.sidecar.protocol.client_codec import decode_response, encode_request
from support.clients_util import read_frame

_CA_CONFIG = """\
[ca]
default_ca = ca_default
[ca_default]
database = {d}/index.txt
new_certs_dir = {d}
serial = {d}/serial
default_md = sha256
policy = anything
copy_extensions = copy
[anything]
commonName = supplied
"""


def openssl(*args: str) -> None:
    done = subprocess.run(["openssl", *args], capture_output=True, text=True)
    assert done.returncode == 0, f"openssl {' '.join(args)} failed: {done.stderr}"


@dataclass(frozen=True)
class Pki:
    d: Path

    def path(self, name: str) -> str:
        return str(self.d / name)

    @property
    def ca(self) -> str:
        return self.path("ca.pem")

    def keystore(self, name: str) -> str:
        """`name`'s private key and certificate in one PEM file (Kafka's PEM keystore)."""
        return self.path(f"{name}.keystore.pem")


def _request(d: Path, name: str, subject: str, san: str | None = None) -> None:
    extra = ["-addext", f"subjectAltName={san}"] if san else []
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{d}/{name}.key", "-out", f"{d}/{name}.csr",
            "-subj", subject, *extra)


def _keystore(d: Path, name: str) -> None:
    (d / f"{name}.keystore.pem").write_bytes((d / f"{name}.key").read_bytes() + (d / f"{name}.pem").read_bytes())


def make_pki(d: Path) -> Pki:
    d.mkdir(parents=True, exist_ok=True)
    for ca in ("ca", "rogue-ca"):
        openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{d}/{ca}.key", "-out", f"{d}/{ca}.pem",
                "-days", "2", "-subj", f"/CN=shale-test-{ca}")
    for name, subject, ca, san in (("server", "/CN=localhost", "ca", "IP:127.0.0.1,DNS:localhost"),
                                   ("alice", "/O=Shale Tests/OU=ServiceUsers/CN=alice", "ca", None),
                                   ("rogue", "/CN=alice", "rogue-ca", None)):
        _request(d, name, subject, san)
        openssl("x509", "-req", "-in", f"{d}/{name}.csr", "-CA", f"{d}/{ca}.pem", "-CAkey", f"{d}/{ca}.key",
                "-CAcreateserial", "-out", f"{d}/{name}.pem", "-days", "2", "-copy_extensions", "copy")
        _keystore(d, name)
    # An expired certificate needs dates in the past, which only `openssl ca` sets.
    _request(d, "expired", "/CN=expired")
    (d / "index.txt").write_text("")
    (d / "serial").write_text("1000\n")
    (d / "ca.cnf").write_text(_CA_CONFIG.format(d=d))
    openssl("ca", "-batch", "-notext", "-config", f"{d}/ca.cnf", "-cert", f"{d}/ca.pem", "-keyfile", f"{d}/ca.key",
            "-in", f"{d}/expired.csr", "-out", f"{d}/expired.pem", "-startdate", "20200101000000Z",
            "-enddate", "20200102000000Z")
    _keystore(d, "expired")
    return Pki(d)


def tls_overrides(pki: Pki, listener: str, client_auth: str = "none") -> list[str]:
    """`--override`s of a TLS listener named `listener` using the server certificate (Kafka's prefixed names)."""
    prefix = f"listener.name.{listener.lower()}."
    return ["--override", f"{prefix}ssl.keystore.location={pki.keystore('server')}",
            "--override", f"{prefix}ssl.truststore.location={pki.ca}",
            "--override", f"{prefix}ssl.client.auth={client_auth}"]


def seed_user(data_dir: Path, user: str, password: str, mechanism: str = "SCRAM-SHA-512") -> None:
    """`shale scram-credential`, as an operator seeds the first users before the node starts."""
    pw = data_dir.with_name(f"{user}.password")
    pw.write_text(password + "\n")
    done = subprocess.run([sys.executable, "-m", "shale.sidecar.cli", "scram-credential", "--data-dir", str(data_dir),
                           "--user", user, "--password-file", str(pw), "--mechanism", mechanism],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert password not in done.stderr


class RawClient:
    """One connection speaking the Kafka protocol by hand (Shale's client codec), TLS when given a context:
    to see each answer and error code, and whether the server closed, where a real client would only retry."""

    def __init__(self, port: int, context=None, timeout: float = 10.0) -> None:
        raw = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.sock = context.wrap_socket(raw, server_hostname="127.0.0.1") if context is not None else raw
        self.correlation_id = 0

    def request(self, api_key: int, version: int, body: dict):
        """The response body, or None when the server closed the connection instead of answering."""
        self.correlation_id += 1
        try:
            self.sock.sendall(encode_request(api_key, version, self.correlation_id, "raw-test", body))
            frame = read_frame(self.sock)
        except (BrokenPipeError, ConnectionResetError, ssl.SSLEOFError):
            return None
        if frame is None:
            return None
        response = decode_response(api_key, version, frame)
        assert response.correlation_id == self.correlation_id
        return response.body

    def scram(self, user: str, password: str, mechanism: str = "SCRAM-SHA-512"):
        """SaslHandshake + SaslAuthenticate (SCRAM, kafka-python's client): the last SaslAuthenticate answer."""
        handshake = self.request(17, 1, {"mechanism": mechanism})
        assert handshake is not None and handshake.error_code == 0, handshake
        client = ScramClient(user, password, mechanism)
        first = self.request(36, 2, {"auth_bytes": client.first_message()})
        if first is None or first.error_code:
            return first
        client.process_server_first_message(first.auth_bytes)
        final = self.request(36, 2, {"auth_bytes": client.final_message()})
        if final is not None and not final.error_code:
            client.process_server_final_message(final.auth_bytes)  # the server proved it knows the credential
        return final

    def closed(self) -> bool:
        """Whether the server has closed the connection (nothing more arrives)."""
        try:
            return self.sock.recv(1) == b""
        except (ConnectionResetError, ssl.SSLEOFError, ssl.SSLZeroReturnError):
            return True

    def close(self) -> None:
        self.sock.close()


def client_context(pki: Pki, cert: str | None = None):
    """A TLS client context trusting the test CA, presenting `cert`'s keystore when given."""
    context = ssl.create_default_context(cafile=pki.ca)
    if cert is not None:
        context.load_cert_chain(pki.keystore(cert))
    return context


def kcat_env(d: Path) -> dict[str, str]:
    """The environment that runs kcat on a librdkafka with RFC 5802's SCRAM nonce (2.6.1+: the one bundled with
    confluent-kafka). Up to 2.6.0 librdkafka repeats its own nonce in the client-final message, which Kafka 4
    refuses (librdkafka#4895, kcat#462) and Shale too; Debian's kcat links 2.0.2."""
    libs = Path(confluent_kafka.__file__).resolve().parents[1] / "confluent_kafka.libs"
    (bundled,) = libs.glob("librdkafka*.so*")
    d.mkdir(parents=True, exist_ok=True)
    link = d / "librdkafka.so.1"
    if not link.exists():
        link.symlink_to(bundled)
    return {**os.environ, "LD_LIBRARY_PATH": str(d)}


def kafka_python_round_trip(config: dict, topic: str, values: list[bytes], group: str) -> list[bytes]:
    """With kafka-python over `config`'s secured listener: create `topic` (checked listed), produce `values`,
    read as many back in consumer group `group` and commit; returns what was read, for the caller to compare."""
    admin = KafkaAdminClient(**config)
    admin.create_topics([NewTopic(topic, 1, 1)])
    assert topic in admin.list_topics()
    admin.close()
    producer = KafkaProducer(**config)
    for value in values:
        producer.send(topic, value).get(30)
    producer.close()
    consumer = KafkaConsumer(topic, **config, group_id=group, auto_offset_reset="earliest", consumer_timeout_ms=20000)
    read = [m.value for _, m in zip(range(len(values)), consumer)]
    consumer.commit()
    consumer.close()
    return read
