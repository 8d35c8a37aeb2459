"""DescribeUserScramCredentials / AlterUserScramCredentials on a real `shale serve`, through kafka-python's and
confluent-kafka's admin clients: the salted credential the client sends is what the node keeps (and what a
password check finds), Kafka's per-user errors, and, with an authorizer, the cluster checks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import (
    AdminClient,
    ScramCredentialInfo,
    UserScramCredentialDeletion,
    UserScramCredentialUpsertion,
)
from confluent_kafka.admin import (
    ScramMechanism as CkMechanism,
)
from kafka.admin import KafkaAdminClient, ScramMechanism
from kafka.admin import UserScramCredentialDeletion as KpDeletion
from kafka.admin import UserScramCredentialUpsertion as KpUpsertion

from shale.sidecar.security.authorizer import Authorizer
from shale.sidecar.security.scram import ScramMechanism as Mechanism
from shale.sidecar.security.store import SecurityStore
from support.node_util import ServeProcess, topic_manifest, write_manifests


def stored(data_dir: Path, user: str, mechanism: Mechanism):
    return SecurityStore.open(str(data_dir), Authorizer()).scram_credential(user, mechanism)


@pytest.fixture
def node(tmp_path):
    topics = write_manifests(tmp_path / "topics" / "t.yaml", topic_manifest("orders"))
    with ServeProcess(tmp_path / "data", topics.parent) as server:
        yield server


def test_kafka_python_upserts_describes_and_deletes(node):
    data = Path(node.data_dir)
    admin = KafkaAdminClient(bootstrap_servers=node.bootstrap, request_timeout_ms=10000)
    try:
        result = admin.alter_user_scram_credentials([
            KpUpsertion("alice", ScramMechanism.SCRAM_SHA_512, "alice-secret", iterations=8192),
            KpUpsertion("bob", ScramMechanism.SCRAM_SHA_256, "bob-secret", iterations=4096)])
        assert result == {"alice": None, "bob": None} or all(v in (None, "None") for v in result.values()), result
        credential = stored(data, "alice", Mechanism.SCRAM_SHA_512)
        assert credential.iterations == 8192
        assert credential.verify_password(Mechanism.SCRAM_SHA_512, "alice-secret")
        assert not credential.verify_password(Mechanism.SCRAM_SHA_512, "wrong")
        raw = (data / "shale-security.json").read_text()
        assert "alice-secret" not in raw and "bob-secret" not in raw  # salted keys only
        assert (data / "shale-security.json").stat().st_mode & 0o777 == 0o600

        described = admin.describe_user_scram_credentials()
        assert {u: [(c["mechanism"], c["iterations"]) for c in d["credential_infos"]] for u, d in described.items()} \
            == {"alice": [(ScramMechanism.SCRAM_SHA_512, 8192)], "bob": [(ScramMechanism.SCRAM_SHA_256, 4096)]}

        admin.alter_user_scram_credentials([KpDeletion("bob", ScramMechanism.SCRAM_SHA_256)])
        assert stored(data, "bob", Mechanism.SCRAM_SHA_256) is None
        missing = admin.describe_user_scram_credentials(["bob"])
        assert "does not exist" in str(missing["bob"]["error"])
    finally:
        admin.close()


def test_confluent_upserts_and_refusals_are_per_user(node):
    data = Path(node.data_dir)
    admin = AdminClient({"bootstrap.servers": node.bootstrap})
    good = UserScramCredentialUpsertion("carol", ScramCredentialInfo(CkMechanism.SCRAM_SHA_256, 4096), b"carol-pw",
                                        b"0123456789abcdef")
    weak = UserScramCredentialUpsertion("dave", ScramCredentialInfo(CkMechanism.SCRAM_SHA_512, 100), b"dave-pw")
    futures = admin.alter_user_scram_credentials([good, weak])
    assert futures["carol"].result(10) is None
    with pytest.raises(KafkaException) as refused:
        futures["dave"].result(10)
    assert refused.value.args[0].code() == KafkaError.UNACCEPTABLE_CREDENTIAL
    assert "Too few iterations" in refused.value.args[0].str()
    credential = stored(data, "carol", Mechanism.SCRAM_SHA_256)
    assert credential.salt == b"0123456789abcdef" and credential.verify_password(Mechanism.SCRAM_SHA_256, "carol-pw")
    assert stored(data, "dave", Mechanism.SCRAM_SHA_512) is None

    description = admin.describe_user_scram_credentials(["carol"])["carol"].result(10)
    assert [(i.mechanism, i.iterations) for i in description.scram_credential_infos] == \
        [(CkMechanism.SCRAM_SHA_256, 4096)]
    deletion = UserScramCredentialDeletion("carol", CkMechanism.SCRAM_SHA_512)  # carol has no SHA-512
    with pytest.raises(KafkaException) as refused:
        admin.alter_user_scram_credentials([deletion])["carol"].result(10)
    assert refused.value.args[0].code() == KafkaError.RESOURCE_NOT_FOUND
    assert stored(data, "carol", Mechanism.SCRAM_SHA_256) is not None


def test_with_an_authorizer_scram_apis_need_the_cluster(tmp_path):
    topics = write_manifests(tmp_path / "topics" / "t.yaml", topic_manifest("orders"))
    with ServeProcess(tmp_path / "data", topics.parent, "--override", "authorizer.class.name=shale") as server:
        admin = AdminClient({"bootstrap.servers": server.bootstrap})
        upsert = UserScramCredentialUpsertion("eve", ScramCredentialInfo(CkMechanism.SCRAM_SHA_512, 4096), b"pw")
        with pytest.raises(KafkaException) as refused:
            admin.alter_user_scram_credentials([upsert])["eve"].result(10)
        assert refused.value.args[0].code() == KafkaError.CLUSTER_AUTHORIZATION_FAILED
        # librdkafka 2.16 aborts the process on any top-level error of DescribeUserScramCredentials (Kafka's
        # answer here too), so the describe refusal is read with kafka-python
        kp = KafkaAdminClient(bootstrap_servers=server.bootstrap, request_timeout_ms=10000)
        try:
            with pytest.raises(Exception, match="ClusterAuthorizationFailed"):
                kp.describe_user_scram_credentials()
        finally:
            kp.close()
    assert not (tmp_path / "data" / "shale-security.json").exists()
    with ServeProcess(tmp_path / "data", topics.parent, "--override", "authorizer.class.name=shale",
                      "--override", "super.users=User:ANONYMOUS") as server:
        admin = AdminClient({"bootstrap.servers": server.bootstrap})
        assert admin.alter_user_scram_credentials([upsert])["eve"].result(10) is None
    doc = json.loads((tmp_path / "data" / "shale-security.json").read_text())
    assert list(doc["scram"]) == ["eve"] and "SCRAM-SHA-512" in doc["scram"]["eve"]
