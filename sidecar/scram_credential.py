"""`shale scram-credential`: seed a SCRAM credential into a data directory's security file.

The first user of a SASL listener cannot be created through AlterUserScramCredentials: nobody can log in yet.
Kafka's answer is `kafka-storage format --add-scram` before the first start; this is Shale's. The password is
read from a file (never an argument: argv is visible to every process), salted with a random salt and only
the salted keys are written (Kafka's `ScramCredential`). It takes the data directory's `.lock` first, so it
refuses while a node serves that directory (the node would keep and later write back its own copy); on a
running node use AlterUserScramCredentials (`kafka-configs.sh --alter --add-config 'SCRAM-SHA-512=[...]'`).
"""

from __future__ import annotations

import fcntl
import os
import secrets

from .log.log_dir import LOCK_FILE
from .security.authorizer import Authorizer
from .security.scram import ScramMechanism
from .security.store import SecurityStore, Upsertion


class CredentialError(Exception):
    """The credential could not be written; the message names the file or the value."""


def read_password(path: str) -> str:
    """The password in `path`, without its trailing newline (as `echo pw > file` writes it)."""
    try:
        with open(path, encoding="utf-8") as f:
            password = f.read().rstrip("\r\n")
    except (OSError, UnicodeDecodeError) as exc:
        raise CredentialError(f"password file {path}: {getattr(exc, 'strerror', None) or exc}") from None
    if not password:
        raise CredentialError(f"password file {path} is empty")
    return password


def set_credential(data_dir: str, user: str, password: str, mechanism_name: str, iterations: int) -> str:
    """Write `user`'s credential for one mechanism into `data_dir`'s security file; returns the file's path."""
    mechanism = ScramMechanism.from_name(mechanism_name.upper())
    if mechanism is None:
        raise CredentialError(f"mechanism {mechanism_name!r}: expected SCRAM-SHA-256 or SCRAM-SHA-512")
    os.makedirs(data_dir, exist_ok=True)
    lock = os.open(os.path.join(data_dir, LOCK_FILE), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise CredentialError(f"{data_dir} is in use by a running node: change its credentials with "
                                  "AlterUserScramCredentials instead") from None
        salt = secrets.token_bytes(32)  # as Kafka's ScramFormatter.generateCredential
        salted = mechanism.salted_password(password, salt, iterations)
        store = SecurityStore.open(data_dir, Authorizer())  # the file's ACLs are kept as they are
        ((_, outcome),) = store.alter_scram_credentials(
            [], [Upsertion(user, mechanism.type, iterations, salt, salted)])
        if outcome.error_code:
            raise CredentialError(f"user {user!r}: {outcome.error_message}")
        return store.path
    finally:
        os.close(lock)
