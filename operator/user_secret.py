"""The Secret a `User`'s application mounts: a generated password, or a certificate from the clients CA.

Named like the User, in its namespace, owned by it (deleted with it by Kubernetes' garbage collector),
labelled `shale.dev/user`. Keys as Strimzi's KafkaUser Secrets have them, so applications move over:
scram-sha-512 — `password`, `sasl.jaas.config` (Kafka's ScramLoginModule line); tls — `user.crt`,
`user.key`, `ca.crt` (the clients CA). A password is generated once and kept: the operator never
rewrites a Secret it finds complete, so a rotation is deleting the Secret (a new password is generated
and sent to every node). The values are never logged; this module returns them only to the caller
that writes the Secret and the salted credential.
"""

from __future__ import annotations

import base64
import datetime
import secrets
from dataclasses import dataclass
from typing import Any, Mapping

from .crd import GROUP, VERSION
from .user_crd import KIND

USER_LABEL = f"{GROUP}/user"
PASSWORD_BYTES = 24  # 32 URL-safe characters, as Strimzi's default password length
CERT_VALIDITY = datetime.timedelta(days=365)
RENEW_BEFORE = datetime.timedelta(days=30)


class SecretConflict(Exception):
    """A Secret of the User's name exists and is not the User's: it is left alone."""

    reason = "SecretConflict"


class NoClientsCA(Exception):
    """A tls User, but no clients CA to sign its certificate with."""

    reason = "NoClientsCA"


@dataclass(frozen=True)
class ClientsCA:
    cert_pem: bytes
    key_pem: bytes


def owner_reference(user: Mapping[str, Any]) -> dict[str, Any]:
    meta = user["metadata"]
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": KIND, "name": meta["name"], "uid": meta["uid"],
            "controller": True, "blockOwnerDeletion": False}  # True would need users/finalizers rights


def owned_by(secret: Mapping[str, Any], user: Mapping[str, Any]) -> bool:
    refs = (secret.get("metadata") or {}).get("ownerReferences") or ()
    return any(r.get("uid") == user["metadata"]["uid"] for r in refs)


def decoded(secret: Mapping[str, Any]) -> dict[str, str]:
    return {k: base64.b64decode(v).decode("utf-8", "replace") for k, v in (secret.get("data") or {}).items()}


def secret_body(user: Mapping[str, Any], values: Mapping[str, str]) -> dict[str, Any]:
    meta = user["metadata"]
    return {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
            "metadata": {"name": meta["name"], "namespace": meta["namespace"],
                         "labels": {USER_LABEL: meta["name"], "app.kubernetes.io/part-of": "shale"},
                         "ownerReferences": [owner_reference(user)]},
            "data": {k: base64.b64encode(v.encode()).decode() for k, v in values.items()}}


def scram_values(name: str, password: str | None = None) -> dict[str, str]:
    password = password or secrets.token_urlsafe(PASSWORD_BYTES)
    jaas = (f'org.apache.kafka.common.security.scram.ScramLoginModule required username="{name}" '
            f'password="{password}";')
    return {"password": password, "sasl.jaas.config": jaas}


def scram_complete(values: Mapping[str, str], name: str) -> bool:
    return bool(values.get("password")) and values == scram_values(name, values["password"])


def tls_values(name: str, ca: ClientsCA, now: datetime.datetime | None = None) -> dict[str, str]:
    """A new key and a certificate `CN=<name>` for client authentication, signed by the clients CA."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = now or datetime.datetime.now(datetime.timezone.utc)
    ca_cert = x509.load_pem_x509_certificate(ca.cert_pem)
    ca_key = serialization.load_pem_private_key(ca.key_pem, password=None)
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
            .issuer_name(ca_cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + CERT_VALIDITY)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
            .sign(ca_key, hashes.SHA256()))
    key_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
    return {"user.crt": cert.public_bytes(serialization.Encoding.PEM).decode(), "user.key": key_pem.decode(),
            "ca.crt": ca.cert_pem.decode()}


def tls_current(values: Mapping[str, str], name: str, ca: ClientsCA,
                now: datetime.datetime | None = None) -> bool:
    """Whether the Secret's certificate is this user's, from this CA, and not due for renewal."""
    from cryptography import x509
    from cryptography.exceptions import InvalidSignature
    from cryptography.x509.oid import NameOID

    if not values.get("user.crt") or not values.get("user.key") or values.get("ca.crt") != ca.cert_pem.decode():
        return False
    try:
        cert = x509.load_pem_x509_certificate(values["user.crt"].encode())
        ca_cert = x509.load_pem_x509_certificate(ca.cert_pem)
        cert.verify_directly_issued_by(ca_cert)
    except (ValueError, TypeError, InvalidSignature):
        return False
    cns = [a.value for a in cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)]
    now = now or datetime.datetime.now(datetime.timezone.utc)
    return cns == [name] and cert.not_valid_after_utc - RENEW_BEFORE > now
