"""A server's TLS context from PEM files, shared by the Kafka listeners and the HTTP port.

Kafka reads keystores; Shale reads PEM (what cert-manager and Helm's genSignedCert write: `tls.crt`,
`tls.key`, `ca.crt`). `client_auth` takes Kafka's `ssl.client.auth` values: `required` (a verified client
certificate or no handshake), `requested` (verified when presented, the connection goes on without one),
`none` (never asked for). A file that cannot be read or does not hold what it should is a `ValueError`
naming the file, so `shale serve` refuses to start with one line instead of serving plaintext.
"""

from __future__ import annotations

import ssl

CLIENT_AUTH = {"required": ssl.CERT_REQUIRED, "requested": ssl.CERT_OPTIONAL, "none": ssl.CERT_NONE}


def server_context(cert: str, key: str, ca: str | None = None, client_auth: str = "none") -> ssl.SSLContext:
    """TLS 1.2 or later, the certificate chain `cert` with its private key `key`; client certificates are
    verified against the CA bundle `ca`, which `requested` and `required` need."""
    if client_auth not in CLIENT_AUTH:
        raise ValueError(f"client auth {client_auth!r}: expected one of {', '.join(CLIENT_AUTH)}")
    if client_auth != "none" and not ca:
        raise ValueError(f"client auth {client_auth!r} needs a CA file to verify client certificates against")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(cert, key)
    except (OSError, ssl.SSLError) as exc:
        raise ValueError(f"TLS certificate {cert} with key {key}: {_reason(exc)}") from None
    if ca:
        try:
            context.load_verify_locations(cafile=ca)
        except (OSError, ssl.SSLError) as exc:
            raise ValueError(f"TLS CA file {ca}: {_reason(exc)}") from None
    context.verify_mode = CLIENT_AUTH[client_auth]
    return context


def _reason(exc: Exception) -> str:
    return getattr(exc, "strerror", None) or getattr(exc, "reason", None) or str(exc)
