"""The listener settings of `shale serve` (Kafka's names through `--override`): which keys are read as listener
settings, per-listener prefixes, the inter-broker client's JAAS line, refusals with one line and exit 1 before
anything is created, and `shale scram-credential`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shale.sidecar.security.listeners import ListenerConfigError, SecurityProtocol
from shale.sidecar.server.network.inter_broker import InterBrokerClient, parse_jaas_options
from shale.sidecar.server.network.listener_security import listener_securities, listener_setting, split_settings
from support.node_util import ServeProcess, free_port, topic_manifest, write_manifests
from support.tls_util import make_pki


def test_listener_settings_are_split_from_the_broker_settings():
    overrides = {"listeners": "SSL://:9093", "listener.name.ssl.ssl.client.auth": "required",
                 "listener.name.client.scram-sha-512.sasl.jaas.config": "x required;", "ssl.truststore.location": "/ca",
                 "log.cleaner.threads": "2", "listener.name.ssl.log.cleaner.threads": "3"}
    security, rest = split_settings(overrides)
    assert set(rest) == {"log.cleaner.threads", "listener.name.ssl.log.cleaner.threads"}  # the latter: refused later
    assert set(security) == set(overrides) - set(rest)


def test_a_listener_prefix_wins_over_the_plain_name_and_the_default():
    settings = {"ssl.client.auth": "requested", "listener.name.internal.ssl.client.auth": "required"}
    assert listener_setting(settings, "INTERNAL", "ssl.client.auth") == "required"
    assert listener_setting(settings, "EXTERNAL", "ssl.client.auth") == "requested"
    assert listener_setting({}, "EXTERNAL", "ssl.client.auth") == "none"
    assert listener_setting({}, "EXTERNAL", "sasl.enabled.mechanisms") == "SCRAM-SHA-512,SCRAM-SHA-256"


def test_without_listeners_the_one_listener_is_listen_as_plaintext():
    config, listeners = listener_securities({}, ("127.0.0.1", 9092), None, lambda u, m: None)
    assert config is None and [(s.name, s.protocol, s.endpoint.port, s.advertised) for s in listeners] == [
        ("PLAINTEXT", SecurityProtocol.PLAINTEXT, 9092, None)]


def test_listeners_are_built_with_the_inter_broker_one_first(tmp_path):
    pki = make_pki(tmp_path)
    settings = {"listeners": "CLIENT://:9093,REPLICATION://127.0.0.1:9094",
                "listener.security.protocol.map": "CLIENT:SASL_SSL,REPLICATION:SSL",
                "inter.broker.listener.name": "REPLICATION", "ssl.keystore.location": pki.keystore("server"),
                "ssl.truststore.location": pki.ca, "listener.name.replication.ssl.client.auth": "required",
                "listener.name.client.sasl.enabled.mechanisms": "PLAIN,SCRAM-SHA-512"}
    config, listeners = listener_securities(settings, ("127.0.0.1", 1), "node-0.example", lambda u, m: None)
    assert [s.name for s in listeners] == ["REPLICATION", "CLIENT"]
    replication, client = listeners
    assert replication.sasl is None and replication.ssl_context is not None
    assert client.sasl.enabled_mechanisms == ("PLAIN", "SCRAM-SHA-512")
    assert (client.advertised.host, client.advertised.port) == ("node-0.example", 9093)  # empty host: --advertised-host
    assert config.inter_broker_listener == "REPLICATION"


@pytest.mark.parametrize("settings, message", [
    ({"listeners": "SSL://:1"}, "has no ssl.keystore.location"),
    ({"listeners": "SSL://:1", "ssl.keystore.location": "/nonexistent.pem"}, "/nonexistent.pem"),
    ({"listeners": "SSL://:1", "ssl.keystore.location": "k", "ssl.key.password": "pw"},
     "encrypted private keys are not supported"),
    ({"listeners": "SSL://:1", "ssl.keystore.location": "k", "ssl.keystore.type": "JKS"}, "only PEM files"),
    ({"listeners": "SASL_PLAINTEXT://:1", "sasl.enabled.mechanisms": "GSSAPI"}, "GSSAPI not supported"),
    ({"listeners": "SSL://:1", "ssl.keystore.location": "k", "ssl.client.auth": "maybe"},
     "String must be one of"),
    ({"listeners": "PLAINTEXT://:1", "connection.failed.authentication.delay.ms": "soon"}, "Not a number"),
])
def test_bad_listener_settings_are_refused_naming_the_setting(settings, message):
    inter_broker = settings["listeners"].split(":")[0]
    with pytest.raises(ValueError, match=message):
        listener_securities({**settings, "inter.broker.listener.name": inter_broker}, ("127.0.0.1", 1), None,
                            lambda u, m: None)


def test_the_inter_broker_client_reads_kafkas_jaas_line(tmp_path):
    password = tmp_path / "pw"
    password.write_text("s3cret\n")
    base = {"listeners": "SASL_PLAINTEXT://:1", "inter.broker.listener.name": "SASL_PLAINTEXT",
            "sasl.mechanism.inter.broker.protocol": "SCRAM-SHA-256"}
    config = listener_securities(base, ("h", 1), None, lambda u, m: None)[0]
    jaas = 'org.apache.kafka.common.security.scram.ScramLoginModule required username="node" passwordFile="%s";'
    client = InterBrokerClient.from_settings(
        {**base, "listener.name.sasl_plaintext.scram-sha-256.sasl.jaas.config": jaas % password}, config)
    assert (client.mechanism, client.username, client.password) == ("SCRAM-SHA-256", "node", "s3cret")
    assert "s3cret" not in repr(client)
    with pytest.raises(ListenerConfigError, match="sasl.mechanism.inter.broker.protocol must be one of"):
        InterBrokerClient.from_settings({**base, "sasl.mechanism.inter.broker.protocol": "GSSAPI"}, config)
    with pytest.raises(ListenerConfigError, match="set listener.name.sasl_plaintext.scram-sha-256.sasl.jaas.config"):
        InterBrokerClient.from_settings(base, config)


_value = st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=20)


@given(st.dictionaries(st.from_regex(r"[A-Za-z][\w.-]{0,10}", fullmatch=True), _value, max_size=4))
def test_jaas_options_read_back_what_was_quoted(options):
    quoted = " ".join(f'{k}="{v.replace(chr(92), chr(92) * 2).replace(chr(34), chr(92) + chr(34))}"'
                      for k, v in options.items())
    assert parse_jaas_options(f"org.example.Module required {quoted};", "sasl.jaas.config") == options


def test_a_bad_listener_setting_stops_shale_serve_with_one_line_and_nothing_created(tmp_path):
    topics = write_manifests(tmp_path / "topics" / "t.yaml", topic_manifest("orders", 1))
    server = ServeProcess(tmp_path / "data", topics.parent, "--override", "listeners=SSL://127.0.0.1:0",
                          "--override", "inter.broker.listener.name=SSL", "--override", "ssl.key.password=hunter2")
    done = subprocess.run(server.args, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    errors = [line for line in done.stderr.splitlines() if "ERROR" in line]
    assert len(errors) == 1 and "ssl.key.password for listener SSL" in errors[0], done.stderr
    assert "hunter2" not in done.stderr
    assert not (tmp_path / "data").exists()


def test_a_taken_listener_port_is_reported_by_listener(tmp_path):
    import socket

    topics = write_manifests(tmp_path / "topics" / "t.yaml", topic_manifest("orders", 1))
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        server = ServeProcess(tmp_path / "data", topics.parent, "--override",
                              f"listeners=PLAINTEXT://127.0.0.1:{free_port()},OTHER://127.0.0.1:{port}",
                              "--override", "listener.security.protocol.map=PLAINTEXT:PLAINTEXT,OTHER:PLAINTEXT")
        done = subprocess.run(server.args, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and f"the Kafka listener OTHER 127.0.0.1:{port} (listeners)" in done.stderr


def scram_credential(data_dir: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "shale.sidecar.cli", "scram-credential", "--data-dir", str(data_dir),
                           *args], capture_output=True, text=True, timeout=60)


def test_scram_credential_writes_only_the_salted_keys(tmp_path):
    (tmp_path / "pw").write_text("correct horse\n")
    done = scram_credential(tmp_path / "data", "--user", "alice", "--password-file", str(tmp_path / "pw"))
    assert done.returncode == 0, done.stderr
    path = tmp_path / "data" / "shale-security.json"
    assert os.stat(path).st_mode & 0o777 == 0o600
    text = path.read_text()
    assert "correct horse" not in text and "correct horse" not in done.stderr
    (credential,) = json.loads(text)["scram"]["alice"].values()
    assert credential.startswith("salt=") and credential.endswith("iterations=4096")


@pytest.mark.parametrize("args, message", [
    (("--iterations", "100"), "Too few iterations"),
    (("--password-file", "/nonexistent"), "password file /nonexistent"),
])
def test_scram_credential_refuses_bad_input_and_writes_nothing(tmp_path, args, message):
    (tmp_path / "pw").write_text("pw")
    done = scram_credential(tmp_path / "data", "--user", "bob", "--password-file", str(tmp_path / "pw"), *args)
    assert done.returncode == 1 and message in done.stderr
    assert not (tmp_path / "data" / "shale-security.json").exists()


def test_scram_credential_refuses_while_a_node_serves_the_directory(tmp_path):
    topics = write_manifests(tmp_path / "topics" / "t.yaml", topic_manifest("orders", 1))
    (tmp_path / "pw").write_text("pw-for-carol")
    with ServeProcess(tmp_path / "data", topics.parent):
        done = scram_credential(tmp_path / "data", "--user", "carol", "--password-file", str(tmp_path / "pw"))
    assert done.returncode == 1 and "in use by a running node" in done.stderr
    assert not (tmp_path / "data" / "shale-security.json").exists()
