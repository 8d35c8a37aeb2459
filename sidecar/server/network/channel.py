"""One connection's security state on the Kafka port: its listener, its principal, its SASL session.

`Connection` asks its `Channel` about every decoded request frame before the broker sees it (`admit`): on a
SASL listener SaslHandshake (17) and SaslAuthenticate (36) are answered here by the `SaslSession`, anything
the session does not allow yet closes the connection, and a failed authentication closes it after
`connection.failed.authentication.delay.ms` (Kafka's KIP-306 delay, so a password guesser gets one try per
delay). On PLAINTEXT and SSL listeners every request goes on, and SaslHandshake/SaslAuthenticate reach the
broker's handlers (`SASL_HANDLERS`), which answer ILLEGAL_SASL_STATE as Kafka's KafkaApis does. Log lines
name the listener, the peer and the principal or user, never a credential.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any, Callable

from ...protocol import codec, error_codes
from ...security.principal import ANONYMOUS, KafkaPrincipal, ssl_principal
from ...security.sasl import MAX_RECEIVE_SIZE, SASL_AUTHENTICATE, SASL_HANDSHAKE, SaslSession
from .listener_security import ListenerSecurity

logger = logging.getLogger(__name__)

FailedAuthentication = Callable[[str, str, str], None]  # (listener, mechanism or "none", reason)


def _ignore(_listener: str, _mechanism: str, _reason: str) -> None:
    """No count kept: a channel made outside a node (tests)."""


@dataclass(frozen=True, slots=True)
class Verdict:
    """What the channel did with a frame instead of handing it on: `answer` (a framed response, or None) is
    written; with `close`, after `delay_ms`, and then the connection ends."""

    answer: bytes | None
    close: bool = False
    delay_ms: int = 0


class Channel:
    """The security side of one accepted connection (module docstring)."""

    def __init__(self, listener: ListenerSecurity, peer: str, on_failed: FailedAuthentication = _ignore) -> None:
        self.listener = listener
        self.peer = peer
        self.on_failed = on_failed  # each refused login, for /metrics
        self.principal: KafkaPrincipal = ANONYMOUS
        self.session = SaslSession(listener.sasl) if listener.sasl is not None else None

    @property
    def listener_name(self) -> str:
        return self.listener.name

    def tls_established(self, peer_certificate: dict[str, Any] | None) -> None:
        """The TLS handshake is done: on an SSL listener a verified client certificate names the principal
        (ssl.principal.mapping.rules); on SASL_SSL the SASL exchange does."""
        if self.session is None:
            subject = (peer_certificate or {}).get("subject")
            self.principal = ssl_principal(subject, self.listener.principal_mapper)
            if subject:
                logger.info("listener %s: %s authenticated by its certificate as %s", self.listener_name, self.peer,
                            self.principal)

    def frame_limit(self, max_frame: int) -> int:
        """The largest frame this connection may send now (sasl.server.max.receive.size before authentication)."""
        if self.session is not None and not self.session.authenticated:
            return min(max_frame, MAX_RECEIVE_SIZE)
        return max_frame

    def refuse_size(self, size: int) -> Verdict:
        logger.warning("listener %s: closing connection of %s: a %d-byte frame before authentication (at most %d, "
                       "sasl.server.max.receive.size)", self.listener_name, self.peer, size, MAX_RECEIVE_SIZE)
        return self._closing(None, "protocol")

    def admit(self, request: codec.Request, size: int) -> Verdict | None:
        """None: the request goes on to the broker, with this channel's principal. Otherwise what was done."""
        session = self.session
        if session is None:
            return None
        now_ms = int(time.time() * 1000)
        refusal = session.admit(request.api_key, size, now_ms)
        if refusal is not None:
            logger.warning("listener %s: closing connection of client %r at %s: %s (%s)", self.listener_name,
                           request.client_id, self.peer, refusal.message, error_codes.name_of(refusal.error_code))
            return self._closing(None, "protocol")
        if request.api_key == SASL_HANDSHAKE:
            reply = session.handshake(request.api_version, request.body.mechanism)
            if reply.close:
                logger.warning("listener %s: closing connection of client %r at %s: %s", self.listener_name,
                               request.client_id, self.peer, session.failure)
            answer = self._encode(request, {"error_code": reply.error_code, "mechanisms": list(reply.mechanisms)})
            return self._closing(answer, "mechanism") if reply.close else Verdict(answer)
        if request.api_key == SASL_AUTHENTICATE:
            reply = session.authenticate(request.api_version, request.body.auth_bytes, now_ms)
            answer = self._encode(request, {"error_code": reply.error_code, "error_message": reply.error_message,
                                            "auth_bytes": reply.auth_bytes,
                                            "session_lifetime_ms": reply.session_lifetime_ms})
            if reply.close:
                logger.warning("listener %s: authentication of client %r at %s with %s failed: %s", self.listener_name,
                               request.client_id, self.peer, session.mechanism, session.failure)
                return self._closing(answer, "credentials" if reply.error_code == error_codes.SASL_AUTHENTICATION_FAILED
                                     else "protocol")
            if session.authenticated:
                self.principal = session.principal
                logger.info("listener %s: client %r at %s authenticated as %s with %s", self.listener_name,
                            request.client_id, self.peer, session.principal, session.mechanism)
            return Verdict(answer)
        return None

    def _closing(self, answer: bytes | None, reason: str) -> Verdict:
        """A refused connection: counted by `reason` (docs/metrics.md, shale_failed_authentications)."""
        mechanism = self.session.mechanism if self.session is not None else None
        self.on_failed(self.listener_name, mechanism or "none", reason)
        self.principal = ANONYMOUS
        return Verdict(answer, close=True, delay_ms=self.listener.failed_authentication_delay_ms)

    @staticmethod
    def _encode(request: codec.Request, body: dict) -> bytes:
        return codec.encode_response(request.api_key, request.api_version, request.correlation_id, body, framed=True)


async def _handshake_outside_sasl(request: codec.Request, conn: Any) -> dict:
    """SaslHandshake on a listener without SASL: Kafka's KafkaApis answers ILLEGAL_SASL_STATE."""
    return {"error_code": error_codes.ILLEGAL_SASL_STATE, "mechanisms": []}


async def _authenticate_outside_sasl(request: codec.Request, conn: Any) -> dict:
    """SaslAuthenticate on a listener without SASL, answered as KafkaApis answers it."""
    return {"error_code": error_codes.ILLEGAL_SASL_STATE,
            "error_message": "SaslAuthenticate request received after successful authentication",
            "auth_bytes": b"", "session_lifetime_ms": 0}


# The broker's handlers for 17 and 36 (advertised by ApiVersions on every listener, as Kafka's are); on a SASL
# listener the channel answers these requests before they reach the broker.
SASL_HANDLERS = {SASL_HANDSHAKE: _handshake_outside_sasl, SASL_AUTHENTICATE: _authenticate_outside_sasl}
