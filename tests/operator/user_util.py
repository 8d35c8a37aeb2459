"""Users as a test drives them through the API (as kubectl would): create, read, wait for Ready, their Secret."""

from __future__ import annotations

import base64
import datetime

import kubernetes
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from support.cluster_util import CLIENTS_CA_SECRET, Cluster
from support.node_util import wait_for

GROUP, VERSION, PLURAL = "shale.dev", "v1alpha1", "users"

READ_ORDERS = {"resource": {"type": "topic", "name": "orders-", "patternType": "prefix"},
               "operations": ["Read", "Describe"]}
GROUP_G = {"resource": {"type": "group", "name": "g"}, "operations": ["Read"]}


def create_user(cluster: Cluster, name: str, authentication: str = "scram-sha-512", acls: list | None = None) -> dict:
    body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "User", "metadata": {"name": name, "namespace": cluster.namespace},
            "spec": {"authentication": {"type": authentication}}}
    if acls is not None:
        body["spec"]["authorization"] = {"type": "simple", "acls": acls}
    return cluster.objects.create_namespaced_custom_object(GROUP, VERSION, cluster.namespace, PLURAL, body)


def user(cluster: Cluster, name: str) -> dict | None:
    try:
        return cluster.objects.get_namespaced_custom_object(GROUP, VERSION, cluster.namespace, PLURAL, name)
    except kubernetes.client.ApiException as exc:
        if exc.status == 404:
            return None
        raise


def wait_ready(cluster: Cluster, name: str, status: str = "True", reason: str | None = None,
               generation: int | None = None) -> dict:
    def check() -> dict | None:
        body = user(cluster, name) or {}
        cond = next((c for c in (body.get("status") or {}).get("conditions") or () if c["type"] == "Ready"), {})
        ok = (cond.get("status") == status and (reason is None or cond.get("reason") == reason)
              and (generation is None or cond.get("observedGeneration") == generation))
        return body if ok else None
    return wait_for(check, 20, interval=0.1, what=f"Ready={status} ({reason}) on User {name}")


def secret(cluster: Cluster, name: str) -> tuple[dict, dict[str, str]]:
    s = cluster.api.sanitize_for_serialization(cluster.core.read_namespaced_secret(name, cluster.namespace))
    return s, {k: base64.b64decode(v).decode() for k, v in s["data"].items()}


def create_clients_ca(cluster: Cluster) -> tuple[x509.Certificate, bytes]:
    """The clients CA Secret (tls.crt, tls.key) in the storage namespace, as the chart makes it; (cert, PEM)."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "shale-clients-ca")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(1).not_valid_before(now - datetime.timedelta(hours=1))
            .not_valid_after(now + datetime.timedelta(days=2))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    pem = cert.public_bytes(serialization.Encoding.PEM)
    key_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
    cluster.core.create_namespaced_secret(cluster.storage_namespace, {
        "metadata": {"name": CLIENTS_CA_SECRET}, "type": "kubernetes.io/tls",
        "data": {"tls.crt": base64.b64encode(pem).decode(), "tls.key": base64.b64encode(key_pem).decode()}})
    return cert, pem
