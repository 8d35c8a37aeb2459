"""The server side of Kafka's SASL handshake (KIP-43, KIP-152, KIP-368), sans-I/O.

One `SaslSession` per connection on a SASL listener. The connection layer reports each request frame
(`admit`), hands SaslHandshake (17) and SaslAuthenticate (36) bodies to `handshake` / `authenticate`,
and sends what they return; the session never touches a socket or a clock of its own. It follows
Kafka's `SaslServerAuthenticator`:

    INITIAL ──ApiVersions──▶ HANDSHAKE_REQUEST ──SaslHandshake──▶ AUTHENTICATE ──ok──▶ COMPLETE
       └──────────SaslHandshake──────────────────────┘                 └──fail──▶ FAILED (close)

Before authentication only ApiVersions, SaslHandshake and SaslAuthenticate are served; anything else
closes the connection (answered with ILLEGAL_SASL_STATE once a handshake has chosen a mechanism, as
Kafka does). SaslHandshake v0 (tokens as raw length-prefixed frames, before KIP-152) is refused with
UNSUPPORTED_VERSION: every client since Kafka 1.0 uses v1 when the broker offers it. With
`connections.max.reauth.ms` set, a session has a lifetime (sent as SessionLifetimeMs); a client that
re-authenticates must keep its mechanism and principal, and an expired session serves nothing else.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import Enum

from ..protocol import error_codes
from ..protocol.codec import API_NAMES
from .errors import AuthenticationFailed
from .principal import KafkaPrincipal
from .scram import CredentialLookup, ScramMechanism, ScramServer

SASL_HANDSHAKE = 17
API_VERSIONS = 18
SASL_AUTHENTICATE = 36
PRE_AUTHENTICATION_APIS = frozenset({SASL_HANDSHAKE, API_VERSIONS, SASL_AUTHENTICATE})

PLAIN = "PLAIN"
SUPPORTED_MECHANISMS = (PLAIN, *(m.mechanism_name for m in ScramMechanism))
# `sasl.server.max.receive.size`: the largest frame read before a connection has authenticated.
MAX_RECEIVE_SIZE = 524288


class SaslState(Enum):
    INITIAL_REQUEST = "INITIAL_REQUEST"
    HANDSHAKE_REQUEST = "HANDSHAKE_REQUEST"
    AUTHENTICATE = "AUTHENTICATE"
    COMPLETE = "COMPLETE"
    FAILED = "FAILED"
    REAUTH_BAD_MECHANISM = "REAUTH_BAD_MECHANISM"


@dataclass(frozen=True)
class SaslConfig:
    """A SASL listener's settings: `sasl.enabled.mechanisms`, `connections.max.reauth.ms`, and the
    credential lookup (SCRAM credentials by user and mechanism; PLAIN is checked against them)."""

    enabled_mechanisms: tuple[str, ...]
    credentials: CredentialLookup
    max_reauth_ms: int = 0

    def __post_init__(self) -> None:
        if not self.enabled_mechanisms:
            raise ValueError("No SASL mechanisms are enabled")
        unsupported = [m for m in self.enabled_mechanisms if m not in SUPPORTED_MECHANISMS]
        if unsupported:
            raise ValueError(f"sasl.enabled.mechanisms: {', '.join(unsupported)} not supported; "
                             f"supported: {', '.join(SUPPORTED_MECHANISMS)}")
        if self.max_reauth_ms < 0:
            raise ValueError(f"connections.max.reauth.ms must be >= 0, got {self.max_reauth_ms}")


@dataclass(frozen=True)
class Refusal:
    """A request this connection may not make now: answer it with `error_code` if `respond`, then close.
    `message` is for the log (and the response's message field where it has one)."""

    error_code: int
    message: str
    respond: bool


@dataclass(frozen=True)
class HandshakeReply:
    error_code: int
    mechanisms: tuple[str, ...]
    close: bool


@dataclass(frozen=True)
class AuthenticateReply:
    error_code: int
    error_message: str | None
    auth_bytes: bytes
    session_lifetime_ms: int
    close: bool


def _kafka_api_name(api_key: int) -> str:
    """Kafka's `ApiKeys` enum name, as its messages print it: METADATA, LIST_OFFSETS."""
    name = {SASL_HANDSHAKE: "SaslHandshake", SASL_AUTHENTICATE: "SaslAuthenticate"}.get(api_key,
                                                                                       API_NAMES.get(api_key))
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).upper() if name else f"api key {api_key}"


class _PlainServer:
    """SASL/PLAIN (RFC 4616): `authzid NUL authcid NUL password`, checked against the user's SCRAM credential."""

    def __init__(self, credentials: CredentialLookup) -> None:
        self._credentials = credentials
        self.complete = False
        self.authorization_id: str | None = None

    def evaluate(self, token: bytes) -> bytes:
        if self.complete:
            raise AuthenticationFailed("Unexpected challenge in Sasl server state COMPLETE")
        parts = token.decode("utf-8", "replace").split("\x00")
        if len(parts) != 3:
            raise AuthenticationFailed(f"Invalid SASL/PLAIN response: expected 3 tokens, got {len(parts)}")
        authzid, user, password = parts
        if not user:
            raise AuthenticationFailed("Authentication failed: username not specified")
        if not password:
            raise AuthenticationFailed("Authentication failed: password not specified")
        invalid = "Authentication failed: Invalid username or password"
        # the strongest stored credential decides; a user without any is refused like a wrong password
        for mechanism in sorted(ScramMechanism, key=lambda m: -m.type):
            credential = self._credentials(user, mechanism)
            if credential is not None:
                if not credential.verify_password(mechanism, password):
                    raise AuthenticationFailed(f"{invalid} (user {user!r})", client_message=invalid)
                break
        else:
            raise AuthenticationFailed(f"{invalid} (no credential for user {user!r})", client_message=invalid)
        if authzid and authzid != user:
            message = "Authentication failed: Client requested an authorization id that is different from username"
            raise AuthenticationFailed(message, client_message=message)
        self.authorization_id = user
        self.complete = True
        return b""


class SaslSession:
    """The authentication state of one connection (module docstring)."""

    def __init__(self, config: SaslConfig) -> None:
        self.config = config
        self.state = SaslState.INITIAL_REQUEST
        self.mechanism: str | None = None
        self.principal: KafkaPrincipal | None = None
        self.failure: str | None = None  # why authentication failed, for the log
        self.session_expiry_ms: int | None = None
        self._server: _PlainServer | ScramServer | None = None
        self._supports_reauth = False
        self._previous: tuple[str, KafkaPrincipal] | None = None  # (mechanism, principal) while re-authenticating
        self._bad_mechanism_message = ""

    @property
    def authenticated(self) -> bool:
        return self.state is SaslState.COMPLETE

    def admit(self, api_key: int, frame_size: int, now_ms: int) -> Refusal | None:
        """Whether a request may go on (to `handshake`, `authenticate` or the broker) in this state."""
        state = self.state
        if state is SaslState.COMPLETE:
            if api_key == SASL_HANDSHAKE and self._can_reauthenticate():
                self._begin_reauthentication()
                return None
            if self.session_expiry_ms is not None and now_ms >= self.session_expiry_ms:
                return Refusal(error_codes.SASL_AUTHENTICATION_FAILED,
                               f"Disconnecting expired channel: session of {self.principal} ended at "
                               f"{self.session_expiry_ms} ms", respond=False)
            return None
        if frame_size > MAX_RECEIVE_SIZE:
            return self._fail(Refusal(error_codes.SASL_AUTHENTICATION_FAILED,
                                      "Failing SASL authentication due to invalid receive size", respond=False))
        name = _kafka_api_name(api_key)
        if state is SaslState.INITIAL_REQUEST:
            if api_key == API_VERSIONS:
                self.state = SaslState.HANDSHAKE_REQUEST
                return None
            if api_key == SASL_HANDSHAKE:
                return None
            return self._fail(Refusal(error_codes.ILLEGAL_SASL_STATE,
                                      f"Unexpected Kafka request of type {name} during SASL handshake. Invalid "
                                      "request, potential reasons: kafka client configured with the wrong security "
                                      "protocol, it does not support KIP-43 or it is not a kafka client.",
                                      respond=False))
        if state is SaslState.HANDSHAKE_REQUEST:
            if api_key == SASL_HANDSHAKE:
                return None
            message = f"Unexpected Kafka request of type {name} during SASL handshake."
            if api_key == API_VERSIONS:
                message = f"Unexpected ApiVersions request received during SASL authentication state {state.value}"
            return self._fail(Refusal(error_codes.ILLEGAL_SASL_STATE, message, respond=False))
        if state in (SaslState.AUTHENTICATE, SaslState.REAUTH_BAD_MECHANISM):
            if api_key == SASL_AUTHENTICATE:
                return None
            return self._fail(Refusal(error_codes.ILLEGAL_SASL_STATE,
                                      f"Unexpected Kafka request of type {name} during SASL authentication.",
                                      respond=True))
        return Refusal(error_codes.ILLEGAL_SASL_STATE, "Authentication has failed on this connection.",
                       respond=False)

    def handshake(self, version: int, mechanism: str) -> HandshakeReply:
        """SaslHandshake: choose the mechanism (the reply lists the enabled ones either way)."""
        enabled = self.config.enabled_mechanisms
        if self.state is SaslState.COMPLETE:
            # not re-authenticating (no session lifetime): Kafka's KafkaApis answers and keeps the connection
            return HandshakeReply(error_codes.ILLEGAL_SASL_STATE, enabled, close=False)
        if version < 1:
            self._fail_with("SaslHandshake v0 (unframed SASL tokens) is not supported; use v1")
            return HandshakeReply(error_codes.UNSUPPORTED_VERSION, enabled, close=True)
        if mechanism not in enabled:
            self._fail_with(f"Unsupported SASL mechanism {mechanism}")
            return HandshakeReply(error_codes.UNSUPPORTED_SASL_MECHANISM, enabled, close=True)
        if self._previous is not None and mechanism != self._previous[0]:
            self._bad_mechanism_message = (f"SASL mechanism '{mechanism}' requested by client is not supported for "
                                           f"re-authentication of mechanism '{self._previous[0]}'")
            self.state = SaslState.REAUTH_BAD_MECHANISM
            return HandshakeReply(error_codes.NONE, enabled, close=False)
        self.mechanism = mechanism
        scram = ScramMechanism.from_name(mechanism)
        self._server = _PlainServer(self.config.credentials) if scram is None else ScramServer(
            scram, self.config.credentials)
        self.state = SaslState.AUTHENTICATE
        return HandshakeReply(error_codes.NONE, enabled, close=False)

    def authenticate(self, version: int, auth_bytes: bytes, now_ms: int) -> AuthenticateReply:
        """SaslAuthenticate: one token of the exchange, answered with the mechanism's next token."""
        if self.state is SaslState.COMPLETE:
            return AuthenticateReply(error_codes.ILLEGAL_SASL_STATE,
                                     "SaslAuthenticate request received after successful authentication",
                                     b"", 0, close=False)
        if self.state is SaslState.REAUTH_BAD_MECHANISM:
            return self._failed_reply(self._bad_mechanism_message, self._bad_mechanism_message)
        if self.state is not SaslState.AUTHENTICATE or self._server is None:
            message = f"Unexpected SaslAuthenticate request in state {self.state.value}"
            self._fail_with(message)
            return AuthenticateReply(error_codes.ILLEGAL_SASL_STATE, message, b"", 0, close=True)
        self._supports_reauth = self._supports_reauth or version > 0
        try:
            reply = self._server.evaluate(auth_bytes)
        except AuthenticationFailed as e:
            generic = (f"Authentication failed during {self._attempt} due to invalid credentials with SASL "
                       f"mechanism {self.mechanism}")
            return self._failed_reply(e.reason, e.client_message or generic)
        if not self._server.complete:
            return AuthenticateReply(error_codes.NONE, None, reply, 0, close=False)
        assert self._server.authorization_id is not None
        principal = KafkaPrincipal.user(self._server.authorization_id)
        if self._previous is not None and principal != self._previous[1]:
            old = self._previous[1]
            message = (f"Cannot change principals during re-authentication from {old.principal_type}.{old.name}: "
                       f"{principal.principal_type}.{principal.name}")
            return self._failed_reply(message, message)
        self.principal = principal
        self.state = SaslState.COMPLETE
        self._server = None
        self._previous = None
        lifetime = self.config.max_reauth_ms
        self.session_expiry_ms = now_ms + lifetime if lifetime > 0 else None
        return AuthenticateReply(error_codes.NONE, None, reply, lifetime, close=False)

    @property
    def _attempt(self) -> str:
        return "re-authentication" if self._previous is not None else "authentication"

    def _can_reauthenticate(self) -> bool:
        return self._supports_reauth and self.session_expiry_ms is not None

    def _begin_reauthentication(self) -> None:
        assert self.mechanism is not None and self.principal is not None
        self._previous = (self.mechanism, self.principal)
        self.state = SaslState.HANDSHAKE_REQUEST

    def _failed_reply(self, reason: str, client_message: str) -> AuthenticateReply:
        self._fail_with(reason)
        return AuthenticateReply(error_codes.SASL_AUTHENTICATION_FAILED, client_message, b"", 0, close=True)

    def _fail_with(self, reason: str) -> None:
        self.state = SaslState.FAILED
        self.failure = reason
        self.principal = None
        self._server = None

    def _fail(self, refusal: Refusal) -> Refusal:
        self._fail_with(refusal.message)
        return refusal
