"""The SaslHandshake / SaslAuthenticate state machine: the flows real clients take (tokens from
kafka-python's own SASL mechanisms), Kafka's refusals and messages, re-authentication, and fuzzed
event sequences (only clean refusals)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kafka.net.sasl.plain import SaslMechanismPlain
from kafka.net.sasl.scram import SaslMechanismScram

from shale.sidecar.protocol import error_codes as E
from shale.sidecar.security.principal import KafkaPrincipal
from shale.sidecar.security.sasl import (
    API_VERSIONS,
    MAX_RECEIVE_SIZE,
    SASL_AUTHENTICATE,
    SASL_HANDSHAKE,
    SaslConfig,
    SaslSession,
    SaslState,
)
from shale.sidecar.security.scram import ScramCredential, ScramMechanism

METADATA, PRODUCE = 3, 0
MECHANISMS = ("SCRAM-SHA-512", "SCRAM-SHA-256", "PLAIN")
CREDENTIALS = {(user, m): ScramCredential.from_password(m, f"{user}-secret", 4096)
               for user in ("alice", "bob") for m in ScramMechanism}


def session(max_reauth_ms: int = 0, mechanisms: tuple[str, ...] = MECHANISMS) -> SaslSession:
    return SaslSession(SaslConfig(mechanisms, lambda u, m: CREDENTIALS.get((u, m)), max_reauth_ms))


def client(mechanism: str, user: str = "alice", password: str | None = None):
    config = dict(sasl_mechanism=mechanism, sasl_plain_username=user,
                  sasl_plain_password=f"{user}-secret" if password is None else password,
                  security_protocol="SASL_SSL")
    return SaslMechanismPlain(**config) if mechanism == "PLAIN" else SaslMechanismScram(**config)


def authenticate(s: SaslSession, mechanism: str, now_ms: int = 0, version: int = 2, **kw):
    """Drive one handshake + exchange as a client does; returns the last SaslAuthenticate reply."""
    assert s.admit(SASL_HANDSHAKE, 30, now_ms) is None
    shake = s.handshake(1, mechanism)
    if shake.error_code:
        return shake
    c = client(mechanism, **kw)
    while True:
        assert s.admit(SASL_AUTHENTICATE, 100, now_ms) is None
        reply = s.authenticate(version, c.auth_bytes(), now_ms)
        if reply.error_code or s.authenticated:
            return reply
        c.receive(reply.auth_bytes)


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_a_client_authenticates(mechanism):
    s = session()
    assert s.admit(API_VERSIONS, 30, 0) is None and s.state is SaslState.HANDSHAKE_REQUEST
    reply = authenticate(s, mechanism)
    assert (reply.error_code, reply.close, reply.session_lifetime_ms) == (E.NONE, False, 0)
    assert s.authenticated and s.principal == KafkaPrincipal.user("alice") and s.mechanism == mechanism
    assert s.admit(METADATA, 10 * MAX_RECEIVE_SIZE, 10**12) is None  # served; no size cap once authenticated


def test_handshake_lists_the_enabled_mechanisms_and_refuses_others():
    s = session(mechanisms=("SCRAM-SHA-512",))
    reply = s.handshake(1, "SCRAM-SHA-512")
    assert (reply.error_code, reply.mechanisms, reply.close) == (E.NONE, ("SCRAM-SHA-512",), False)
    s = session(mechanisms=("SCRAM-SHA-512",))
    reply = s.handshake(1, "GSSAPI")
    assert (reply.error_code, reply.mechanisms, reply.close) == (E.UNSUPPORTED_SASL_MECHANISM, ("SCRAM-SHA-512",), True)
    assert s.state is SaslState.FAILED and s.failure == "Unsupported SASL mechanism GSSAPI"


def test_unframed_v0_handshake_is_refused_cleanly():
    s = session()
    reply = s.handshake(0, "PLAIN")
    assert (reply.error_code, reply.close) == (E.UNSUPPORTED_VERSION, True) and s.state is SaslState.FAILED
    assert s.admit(SASL_AUTHENTICATE, 10, 0) is not None


def test_only_versions_and_handshake_before_authentication():
    s = session()
    r = s.admit(METADATA, 30, 0)
    assert (r.error_code, r.respond) == (E.ILLEGAL_SASL_STATE, False)
    assert r.message.startswith("Unexpected Kafka request of type METADATA during SASL handshake.")
    assert "wrong security protocol" in r.message
    assert s.state is SaslState.FAILED and s.admit(API_VERSIONS, 30, 0) is not None
    s = session()
    s.admit(API_VERSIONS, 30, 0)
    assert "Unexpected ApiVersions request received during SASL authentication state HANDSHAKE_REQUEST" \
        == s.admit(API_VERSIONS, 30, 0).message
    s = session()
    s.handshake(1, "PLAIN")
    r = s.admit(PRODUCE, 30, 0)
    assert (r.error_code, r.respond, r.message) == (
        E.ILLEGAL_SASL_STATE, True, "Unexpected Kafka request of type PRODUCE during SASL authentication.")


def test_oversized_frames_before_authentication():
    s = session()
    r = s.admit(SASL_HANDSHAKE, MAX_RECEIVE_SIZE + 1, 0)
    assert (r.error_code, r.respond, r.message) == (
        E.SASL_AUTHENTICATION_FAILED, False, "Failing SASL authentication due to invalid receive size")


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-512", "SCRAM-SHA-256"])
@pytest.mark.parametrize("user, password", [("alice", "wrong"), ("mallory", "anything")])
def test_scram_refusals_say_nothing_about_the_user(mechanism, user, password):
    s = session()
    reply = authenticate(s, mechanism, user=user, password=password)
    assert (reply.error_code, reply.close) == (E.SASL_AUTHENTICATION_FAILED, True)
    assert reply.error_message == ("Authentication failed during authentication due to invalid credentials with "
                                   f"SASL mechanism {mechanism}")
    assert s.state is SaslState.FAILED and s.principal is None and password not in (s.failure or "")


@pytest.mark.parametrize("token, message", [
    (b"\x00alice\x00wrong", "Authentication failed: Invalid username or password"),
    (b"\x00mallory\x00x", "Authentication failed: Invalid username or password"),
    (b"bob\x00alice\x00alice-secret",
     "Authentication failed: Client requested an authorization id that is different from username"),
    (b"alice\x00alice-secret", "Authentication failed during authentication due to invalid credentials with SASL "
                               "mechanism PLAIN"),
    (b"\x00\x00pw", "Authentication failed during authentication due to invalid credentials with SASL mechanism PLAIN"),
])
def test_plain_refusals(token, message):
    s = session()
    s.handshake(1, "PLAIN")
    reply = s.authenticate(1, token, 0)
    assert (reply.error_code, reply.error_message, reply.close) == (E.SASL_AUTHENTICATION_FAILED, message, True)
    assert b"wrong" not in (s.failure or "").encode()


def test_plain_accepts_its_own_authzid():
    s = session()
    s.handshake(1, "PLAIN")
    assert s.authenticate(1, b"alice\x00alice\x00alice-secret", 0).error_code == E.NONE and s.authenticated


def test_requests_after_authentication_that_are_not_a_reauthentication():
    s = session()
    authenticate(s, "PLAIN")
    assert s.admit(SASL_HANDSHAKE, 30, 0) is None
    assert (s.handshake(1, "PLAIN").error_code, s.authenticated) == (E.ILLEGAL_SASL_STATE, True)
    reply = s.authenticate(2, b"x", 0)
    assert (reply.error_code, reply.error_message, reply.close) == (
        E.ILLEGAL_SASL_STATE, "SaslAuthenticate request received after successful authentication", False)


def test_session_lifetime_and_reauthentication():
    s = session(max_reauth_ms=1000)
    assert authenticate(s, "SCRAM-SHA-512", now_ms=0).session_lifetime_ms == 1000
    assert s.admit(METADATA, 30, 999) is None
    reply = authenticate(s, "SCRAM-SHA-512", now_ms=900)  # same mechanism, same user
    assert (reply.error_code, reply.session_lifetime_ms, s.session_expiry_ms) == (E.NONE, 1000, 1900)
    assert s.admit(METADATA, 30, 1500) is None
    r = s.admit(METADATA, 30, 1900)
    assert r is not None and not r.respond and "expired" in r.message

    s = session(max_reauth_ms=1000)
    authenticate(s, "SCRAM-SHA-512")
    reply = authenticate(s, "SCRAM-SHA-512", user="bob")
    assert reply.error_message == "Cannot change principals during re-authentication from User.alice: User.bob"
    assert reply.close and s.state is SaslState.FAILED

    s = session(max_reauth_ms=1000)
    authenticate(s, "SCRAM-SHA-512")
    assert s.admit(SASL_HANDSHAKE, 30, 10) is None and s.handshake(1, "PLAIN").error_code == E.NONE
    reply = s.authenticate(2, b"\x00alice\x00alice-secret", 10)
    assert reply.error_message == ("SASL mechanism 'PLAIN' requested by client is not supported for "
                                   "re-authentication of mechanism 'SCRAM-SHA-512'") and reply.close


def test_a_v0_authenticate_client_cannot_reauthenticate():
    """Kafka re-authenticates only clients that sent SaslAuthenticate v1+ (KIP-368)."""
    s = session(max_reauth_ms=1000)
    authenticate(s, "PLAIN", version=0)
    assert s.admit(SASL_HANDSHAKE, 30, 10) is None and s.handshake(1, "PLAIN").error_code == E.ILLEGAL_SASL_STATE


def test_config_validation():
    with pytest.raises(ValueError, match="No SASL mechanisms are enabled"):
        SaslConfig((), lambda u, m: None)
    with pytest.raises(ValueError, match="GSSAPI not supported"):
        SaslConfig(("GSSAPI", "PLAIN"), lambda u, m: None)


events = st.one_of(
    st.tuples(st.just("admit"), st.sampled_from([0, 1, 3, 17, 18, 36, 60, 999]), st.integers(0, 2 * MAX_RECEIVE_SIZE)),
    st.tuples(st.just("handshake"), st.integers(-1, 3), st.sampled_from([*MECHANISMS, "GSSAPI", "", "plain"])),
    st.tuples(st.just("authenticate"), st.integers(0, 2), st.one_of(
        st.binary(max_size=64), st.sampled_from([b"n,,n=alice,r=abc", b"\x00alice\x00", b"c=biws,r=abc,p=AAAA"]))),
)


@settings(max_examples=300, deadline=None)
@given(sequence=st.lists(events, max_size=8))
def test_fuzzed_event_sequences_only_refuse_cleanly(sequence):
    s = session(max_reauth_ms=50)
    closed = False
    for kind, a, b in sequence:
        if kind == "admit":
            refusal = s.admit(a, b, 0)
            closed = refusal is not None
        elif kind == "handshake":
            closed = s.handshake(a, b).close
        else:
            reply = s.authenticate(a, b, 0)
            closed = reply.close
            assert reply.error_code != E.NONE or not reply.error_message
        if closed:
            assert s.state is SaslState.FAILED and not s.authenticated and s.principal is None
            assert s.admit(METADATA, 10, 0) is not None  # nothing more is served
            break
    assert not s.authenticated  # no random sequence authenticates
