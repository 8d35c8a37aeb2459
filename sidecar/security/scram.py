"""SCRAM-SHA-256 and SCRAM-SHA-512 (RFC 5802, RFC 7677) as Kafka's broker speaks them (KIP-84).

Written here rather than taken from `scramp`: scramp refuses the client-first messages Kafka accepts
(multi-letter extensions such as `tokenauth=true`, a non-empty authzid in the GS2 header), applies
SASLprep to names and passwords where Kafka does not, and refuses salts shorter than 12 bytes that
Kafka's AlterUserScramCredentials accepts. The messages follow Kafka's `ScramMessages` grammar; the
keys follow `ScramFormatter` (SaltedPassword = Hi(UTF-8 password, salt, i), no SASLprep).

Only `ScramCredential` is ever stored: salt, StoredKey, ServerKey and iterations, never the password.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import re
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum

from .errors import AuthenticationFailed

TOKEN_AUTH = "tokenauth"


class ScramMechanism(Enum):
    """Kafka's SCRAM mechanisms: (wire type, hash name, min iterations, max iterations)."""

    SCRAM_SHA_256 = (1, "sha256", 4096, 16384)
    SCRAM_SHA_512 = (2, "sha512", 4096, 16384)

    @property
    def type(self) -> int:
        return self.value[0]

    @property
    def hash_name(self) -> str:
        return self.value[1]

    @property
    def min_iterations(self) -> int:
        return self.value[2]

    @property
    def max_iterations(self) -> int:
        return self.value[3]

    @property
    def mechanism_name(self) -> str:
        return self.name.replace("_", "-")

    @property
    def digest_size(self) -> int:
        return hashlib.new(self.hash_name).digest_size

    @classmethod
    def from_name(cls, name: str) -> ScramMechanism | None:
        return next((m for m in cls if m.mechanism_name == name), None)

    @classmethod
    def from_type(cls, type_code: int) -> ScramMechanism | None:
        return next((m for m in cls if m.type == type_code), None)

    # --- ScramFormatter -----------------------------------------------------------------------------

    def hmac(self, key: bytes, data: bytes) -> bytes:
        return hmac.new(key, data, self.hash_name).digest()

    def hash(self, data: bytes) -> bytes:
        return hashlib.new(self.hash_name, data).digest()

    def salted_password(self, password: str, salt: bytes, iterations: int) -> bytes:
        """Hi() of RFC 5802 is PBKDF2 with the mechanism's HMAC and one block."""
        return hashlib.pbkdf2_hmac(self.hash_name, password.encode("utf-8"), salt, iterations)

    def client_key(self, salted_password: bytes) -> bytes:
        return self.hmac(salted_password, b"Client Key")

    def server_key(self, salted_password: bytes) -> bytes:
        return self.hmac(salted_password, b"Server Key")


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.b64decode(text.encode("ascii"), validate=True)


@dataclass(frozen=True)
class ScramCredential:
    """What a broker keeps of a SCRAM password; repr shows no key material (logs, /status)."""

    salt: bytes = field(repr=False)
    stored_key: bytes = field(repr=False)
    server_key: bytes = field(repr=False)
    iterations: int

    @classmethod
    def from_salted_password(cls, mechanism: ScramMechanism, salt: bytes, salted_password: bytes,
                             iterations: int) -> ScramCredential:
        """The keys a broker derives from an AlterUserScramCredentials upsertion (the client salts)."""
        return cls(salt, mechanism.hash(mechanism.client_key(salted_password)),
                   mechanism.server_key(salted_password), iterations)

    @classmethod
    def from_password(cls, mechanism: ScramMechanism, password: str, iterations: int,
                      salt: bytes | None = None) -> ScramCredential:
        """A new credential (Kafka's `generateCredential`); the salt is random unless given."""
        salt = secrets.token_bytes(32) if salt is None else salt
        return cls.from_salted_password(mechanism, salt, mechanism.salted_password(password, salt, iterations),
                                        iterations)

    def verify_password(self, mechanism: ScramMechanism, password: str) -> bool:
        """Whether `password` is this credential's: how SASL/PLAIN is checked without a stored password."""
        salted = mechanism.salted_password(password, self.salt, self.iterations)
        return hmac.compare_digest(mechanism.hash(mechanism.client_key(salted)), self.stored_key)

    def to_text(self) -> str:
        """Kafka's persisted form (`ScramCredentialUtils.credentialToString`)."""
        return (f"salt={_b64(self.salt)},stored_key={_b64(self.stored_key)},"
                f"server_key={_b64(self.server_key)},iterations={self.iterations}")

    @classmethod
    def from_text(cls, text: str) -> ScramCredential:
        """Parse Kafka's form; the error never repeats the text, which holds key material."""
        props: dict[str, str] = {}
        for token in text.split(","):
            key, eq, value = token.partition("=")
            if not eq or not key:
                raise ValueError("Credentials not valid: expected key=value pairs separated by commas")
            props[key] = value
        if set(props) != {"salt", "stored_key", "server_key", "iterations"}:
            raise ValueError("Credentials not valid: expected exactly salt, stored_key, server_key, iterations, "
                             f"got {sorted(props)}")
        try:
            iterations = int(props["iterations"])
            return cls(_unb64(props["salt"]), _unb64(props["stored_key"]), _unb64(props["server_key"]),
                       iterations)
        except (ValueError, binascii.Error):
            raise ValueError("Credentials not valid: a value is not base64, or iterations is not an integer") from None


# --- messages (Kafka's ScramMessages grammar) ------------------------------------------------------

_VALUE_SAFE = r"[\x01-\x2b\x2d-\x3c\x3e-\x7f]"  # US-ASCII except NUL, ',' and '='
_VALUE = r"[\x01-\x2b\x2d-\x7f]+"
_PRINTABLE = r"[\x21-\x2b\x2d-\x7e]+"
_SASLNAME = rf"(?:{_VALUE_SAFE}|=2C|=3D)+"
_B64 = r"(?:[a-zA-Z0-9/+]{4})*(?:[a-zA-Z0-9/+]{3}=|[a-zA-Z0-9/+]{2}==)?"
_EXTENSIONS = rf"(?:,[A-Za-z]+={_VALUE})*"
_CLIENT_FIRST = re.compile(rf"(?P<gs2>n,(?:a=(?P<authzid>{_SASLNAME}))?,)(?P<bare>(?:m={_VALUE},)?"
                           rf"n=(?P<saslname>{_SASLNAME}),r=(?P<nonce>{_PRINTABLE})(?P<extensions>{_EXTENSIONS}))")
_CLIENT_FINAL = re.compile(rf"(?P<without_proof>c=(?P<channel>{_B64}),r=(?P<nonce>{_PRINTABLE}){_EXTENSIONS}),"
                           rf"p=(?P<proof>{_B64})")


def sasl_name(username: str) -> str:
    """A username as SCRAM sends it: `=` → `=3D`, `,` → `=2C`."""
    return username.replace("=", "=3D").replace(",", "=2C")


def username(name: str) -> str:
    """The inverse of `sasl_name`; any other `=` is invalid (Kafka's `ScramFormatter.username`)."""
    unescaped = name.replace("=2C", ",")
    if "=" in unescaped.replace("=3D", ""):
        raise ValueError(f"Invalid username: {name}")
    return unescaped.replace("=3D", "=")


def _extensions(text: str) -> dict[str, str]:
    return dict(item.split("=", 1) for item in text.split(",")[1:]) if text else {}


def _server_nonce() -> str:
    """Kafka's `secureRandomString`: 130 random bits in base 36."""
    n, digits = secrets.randbits(130), []
    while True:
        n, d = divmod(n, 36)
        digits.append("0123456789abcdefghijklmnopqrstuvwxyz"[d])
        if n == 0:
            return "".join(reversed(digits))


CredentialLookup = Callable[[str, ScramMechanism], ScramCredential | None]


class ScramServer:
    """One SCRAM exchange, server side: client-first → server-first, client-final → server-final.

    `evaluate` raises `AuthenticationFailed` for anything but a correct proof; after a failure or the
    end of the exchange every further token fails (Kafka's FAILED/COMPLETE states).
    """

    def __init__(self, mechanism: ScramMechanism, lookup: CredentialLookup, server_nonce: str | None = None) -> None:
        self.mechanism = mechanism
        self._lookup = lookup
        self._server_nonce = server_nonce or _server_nonce()
        self._state = "client_first"
        self._credential: ScramCredential | None = None
        self._client_first_bare = ""
        self._server_first = ""
        self._nonce = ""
        self.authorization_id: str | None = None

    @property
    def complete(self) -> bool:
        return self._state == "complete"

    def evaluate(self, token: bytes) -> bytes:
        try:
            if self._state == "client_first":
                reply = self._client_first(token)
                self._state = "client_final"
                return reply
            if self._state == "client_final":
                reply = self._client_final(token)
                self._state = "complete"
                return reply
            raise AuthenticationFailed(f"Unexpected challenge in Sasl server state {self._state.upper()}")
        except AuthenticationFailed:
            self._state = "failed"
            self._credential = None
            raise

    def _client_first(self, token: bytes) -> bytes:
        m = _CLIENT_FIRST.fullmatch(token.decode("utf-8", "replace"))
        if m is None:
            raise AuthenticationFailed("Invalid SCRAM client first message format")
        try:
            user = username(m["saslname"])
        except ValueError:
            raise AuthenticationFailed("Authentication failed: Credentials could not be obtained") from None
        if _extensions(m["extensions"]).get(TOKEN_AUTH, "").lower() == "true":
            raise AuthenticationFailed(f"Token Authentication failed: Invalid tokenId : {user} "
                                       "(delegation tokens are not supported)")
        credential = self._lookup(user, self.mechanism)
        if credential is None:
            raise AuthenticationFailed(f"Authentication failed: Invalid user credentials (user {user!r})")
        authzid = m["authzid"] or ""
        if authzid and authzid != user:
            message = "Authentication failed: Client requested an authorization id that is different from username"
            raise AuthenticationFailed(message, client_message=message)
        if credential.iterations < self.mechanism.min_iterations:
            raise AuthenticationFailed(f"Iterations {credential.iterations} is less than the minimum "
                                       f"{self.mechanism.min_iterations} for {self.mechanism.mechanism_name}")
        self._credential = credential
        self.authorization_id = user
        self._client_first_bare = m["bare"]
        self._nonce = m["nonce"] + self._server_nonce
        self._server_first = f"r={self._nonce},s={_b64(credential.salt)},i={credential.iterations}"
        return self._server_first.encode("ascii")

    def _client_final(self, token: bytes) -> bytes:
        m = _CLIENT_FINAL.fullmatch(token.decode("utf-8", "replace"))
        if m is None:
            raise AuthenticationFailed("Invalid SCRAM client final message format")
        if m["nonce"] != self._nonce:
            raise AuthenticationFailed("Invalid client nonce in the final client message.")
        credential = self._credential
        assert credential is not None
        auth_message = f"{self._client_first_bare},{self._server_first},{m['without_proof']}".encode()
        proof = _unb64(m["proof"])
        client_signature = self.mechanism.hmac(credential.stored_key, auth_message)
        client_key = bytes(a ^ b for a, b in zip(client_signature, proof))
        if len(proof) != len(client_signature) or \
                not hmac.compare_digest(self.mechanism.hash(client_key), credential.stored_key):
            # The user names the account an operator must look at (a wrong password, or a client's stale one).
            raise AuthenticationFailed(f"Invalid client credentials (user {self.authorization_id!r})")
        self._credential = None
        return f"v={_b64(self.mechanism.hmac(credential.server_key, auth_message))}".encode("ascii")
