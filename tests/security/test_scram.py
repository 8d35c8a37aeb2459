"""SCRAM: RFC 7677's test vector, exchanges with kafka-python's independent SCRAM client, Kafka's
credential text form, and fuzzed tokens (only clean refusals)."""

from __future__ import annotations

import base64
import hashlib
import hmac

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kafka.net.sasl.scram import ScramClient

from shale.sidecar.security.errors import AuthenticationFailed
from shale.sidecar.security.scram import ScramCredential, ScramMechanism, ScramServer, sasl_name, username

SHA256, SHA512 = ScramMechanism.SCRAM_SHA_256, ScramMechanism.SCRAM_SHA_512


def test_rfc7677_vector():
    """RFC 7677 §3: user "user", password "pencil" — every message byte for byte."""
    salt = base64.b64decode("W22ZaJ0SNY7soEsUEjb6gQ==")
    cred = ScramCredential.from_password(SHA256, "pencil", 4096, salt=salt)
    server = ScramServer(SHA256, lambda u, m: cred if (u, m) == ("user", SHA256) else None,
                         server_nonce="%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0")
    assert server.evaluate(b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO") == \
        b"r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096"
    assert server.evaluate(b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,"
                           b"p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=") == \
        b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4="
    assert server.complete and server.authorization_id == "user"


def test_mechanisms_are_kafkas():
    assert [(m.mechanism_name, m.type, m.min_iterations, m.max_iterations) for m in ScramMechanism] == [
        ("SCRAM-SHA-256", 1, 4096, 16384), ("SCRAM-SHA-512", 2, 4096, 16384)]
    assert ScramMechanism.from_name("SCRAM-SHA-1") is None and ScramMechanism.from_type(2) is SHA512


def run_kafka_python_client(mechanism: ScramMechanism, user: str, password: str, cred: ScramCredential) -> ScramServer:
    server = ScramServer(mechanism, lambda u, m: cred if (u, m) == (user, mechanism) else None)
    client = ScramClient(user, password, mechanism.mechanism_name)
    client.process_server_first_message(server.evaluate(client.first_message()))
    client.process_server_final_message(server.evaluate(client.final_message()))  # raises on a bad signature
    return server


@pytest.mark.parametrize("mechanism", list(ScramMechanism))
def test_exchange_with_kafka_python_client(mechanism):
    cred = ScramCredential.from_password(mechanism, "s3cret-ü", 4096)
    server = run_kafka_python_client(mechanism, "alice", "s3cret-ü", cred)
    assert server.complete and server.authorization_id == "alice"
    with pytest.raises(AuthenticationFailed) as refused:
        run_kafka_python_client(mechanism, "alice", "wrong", cred)
    assert refused.value.reason == "Invalid client credentials (user 'alice')" and refused.value.client_message is None


def client_messages(mechanism: ScramMechanism, user: str, password: str, authzid: str = "",
                    extensions: str = "", salt: bytes | None = None, iterations: int = 0):
    """An RFC 5802 client built here from hashlib, for what kafka-python does not send (escaped names,
    authzid, extensions)."""
    gs2 = f"n,{'a=' + sasl_name(authzid) if authzid else ''},"
    bare = f"n={sasl_name(user)},r=clientnonce{extensions}"

    def final(server_first: bytes) -> bytes:
        fields = dict(f.split("=", 1) for f in server_first.decode().split(","))
        s, i = base64.b64decode(fields["s"]), int(fields["i"])
        salted = hashlib.pbkdf2_hmac(mechanism.hash_name, password.encode(), s, i)
        client_key = hmac.new(salted, b"Client Key", mechanism.hash_name).digest()
        without_proof = f"c={base64.b64encode(gs2.encode()).decode()},r={fields['r']}"
        auth = f"{bare},{server_first.decode()},{without_proof}".encode()
        sig = hmac.new(hashlib.new(mechanism.hash_name, client_key).digest(), auth, mechanism.hash_name).digest()
        return f"{without_proof},p={base64.b64encode(bytes(a ^ b for a, b in zip(client_key, sig))).decode()}".encode()

    return (gs2 + bare).encode(), final


@settings(max_examples=25, deadline=None)
@given(mechanism=st.sampled_from(list(ScramMechanism)),
       user=st.text(st.characters(min_codepoint=1, max_codepoint=127), min_size=1, max_size=20),
       password=st.text(min_size=1, max_size=20))
def test_exchange_round_trip_any_name_and_password(mechanism, user, password):
    """Names with `=` and `,` travel escaped; passwords are any Unicode, UTF-8 without SASLprep (Kafka)."""
    cred = ScramCredential.from_password(mechanism, password, 4096)
    server = ScramServer(mechanism, lambda u, m: cred if u == user else None)
    first, final = client_messages(mechanism, user, password)
    server_final = server.evaluate(final(server.evaluate(first)))
    assert server.complete and server.authorization_id == user and server_final.startswith(b"v=")
    assert username(sasl_name(user)) == user


def test_authzid_must_be_the_user_and_is_told_to_the_client():
    cred = ScramCredential.from_password(SHA512, "pw", 4096)
    lookup = lambda u, m: cred  # noqa: E731
    first, final = client_messages(SHA512, "alice", "pw", authzid="alice")
    server = ScramServer(SHA512, lookup)
    server.evaluate(final(server.evaluate(first)))
    assert server.authorization_id == "alice"
    first, _ = client_messages(SHA512, "alice", "pw", authzid="admin")
    with pytest.raises(AuthenticationFailed) as refused:
        ScramServer(SHA512, lookup).evaluate(first)
    assert refused.value.client_message == \
        "Authentication failed: Client requested an authorization id that is different from username"


def test_extensions_unknown_ignored_tokenauth_refused():
    cred = ScramCredential.from_password(SHA256, "pw", 4096)
    server = ScramServer(SHA256, lambda u, m: cred)
    first, final = client_messages(SHA256, "bob", "pw", extensions=",foo=bar")
    server.evaluate(final(server.evaluate(first)))
    assert server.complete
    first, _ = client_messages(SHA256, "bob", "pw", extensions=",tokenauth=true")
    with pytest.raises(AuthenticationFailed, match="Token Authentication failed"):
        ScramServer(SHA256, lambda u, m: cred).evaluate(first)


@pytest.mark.parametrize("case", ["unknown user", "too few iterations", "bad nonce", "bad format", "after the end"])
def test_refusals_are_generic_for_the_client(case):
    weak = ScramCredential.from_password(SHA256, "pw", 1024)
    good = ScramCredential.from_password(SHA256, "pw", 4096)
    server = ScramServer(SHA256, lambda u, m: {"weak": weak, "good": good}.get(u))
    first, final = client_messages(SHA256, "weak" if case == "too few iterations" else "good", "pw")
    with pytest.raises(AuthenticationFailed) as refused:
        if case == "unknown user":
            ScramServer(SHA256, lambda u, m: None).evaluate(first)
        elif case == "bad format":
            server.evaluate(b"y,,n=good,r=abc")
        else:
            reply = server.evaluate(first)
            if case == "bad nonce":
                server.evaluate(final(reply.replace(b"r=clientnonce", b"r=othernonce")))
            server.evaluate(final(reply))
            server.evaluate(final(reply))
    assert refused.value.client_message is None


def test_credential_text_form_is_kafkas():
    cred = ScramCredential(b"salt", b"stored", b"server", 4096)
    assert cred.to_text() == "salt=c2FsdA==,stored_key=c3RvcmVk,server_key=c2VydmVy,iterations=4096"
    assert "salt" not in repr(cred).replace("ScramCredential", "") and "4096" in repr(cred)
    for bad in ("salt=c2FsdA==,stored_key=c3RvcmVk,server_key=c2VydmVy", "nonsense",
                "salt=!!,stored_key=c3RvcmVk,server_key=c2VydmVy,iterations=4096",
                "salt=c2FsdA==,stored_key=c3RvcmVk,server_key=c2VydmVy,iterations=x"):
        with pytest.raises(ValueError, match="Credentials not valid") as e:
            ScramCredential.from_text(bad)
        assert "c3RvcmVk" not in str(e.value)  # key material is never repeated in an error


@given(salt=st.binary(min_size=1, max_size=64), stored=st.binary(min_size=1, max_size=64),
       server=st.binary(min_size=1, max_size=64), iterations=st.integers(1, 2**31 - 1))
def test_credential_text_round_trip(salt, stored, server, iterations):
    cred = ScramCredential(salt, stored, server, iterations)
    assert ScramCredential.from_text(cred.to_text()) == cred


def test_salted_password_upsertion_gives_the_same_keys_as_the_password():
    salt = b"0123456789"
    salted = SHA512.salted_password("pw", salt, 8192)
    assert ScramCredential.from_salted_password(SHA512, salt, salted, 8192) == \
        ScramCredential.from_password(SHA512, "pw", 8192, salt=salt)
    assert ScramCredential.from_password(SHA512, "pw", 4096).verify_password(SHA512, "pw")


@settings(max_examples=200)
@given(tokens=st.lists(st.one_of(st.binary(max_size=200), st.sampled_from([
    b"n,,n=good,r=abc", b"c=biws,r=abc,p=AAAA", b"n,,n=good,r=", b"n,a=good,n=good,r=x,ext=1", b"\xff\xfe",
    b"n,,n=go=od,r=abc", b"c=biws,r=abcXYZ,p=" + b"A" * 44])), max_size=4))
def test_fuzzed_tokens_only_refuse_cleanly(tokens):
    cred = ScramCredential.from_password(SHA256, "pw", 4096, salt=b"s")
    server = ScramServer(SHA256, lambda u, m: cred if u == "good" else None, server_nonce="XYZ")
    for token in tokens:
        try:
            server.evaluate(token)
        except AuthenticationFailed:
            break
    assert not server.complete
