"""The durable security state of a node: ACL bindings and SCRAM credentials, in one file.

`shale-security.json` (mode 0600) holds the ACLs as Kafka's field names and the credentials in Kafka's
own text form (`salt=…,stored_key=…,server_key=…,iterations=N`, the ZooKeeper layout), never a
password. Every change is written whole with `atomic_write` before it is answered, so a crash keeps
the old or the new state; a write the disk refuses leaves memory and file as they were and answers
the request with an error naming the file. A file that cannot be read is an error naming it and the
entry: the node does not start over with no ACLs (which would open or close everything silently).

The methods are the semantics of CreateAcls, DescribeAcls, DeleteAcls, DescribeUserScramCredentials
and AlterUserScramCredentials (errors and messages of Kafka's `AclControlManager` and
`ScramControlManager`), on plain values, so the request handlers only map fields.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ..log.atomic_file import atomic_write
from ..protocol import error_codes
from .acl import (
    ANY_FILTER,
    AccessControlEntry,
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    InvalidAclError,
    PatternType,
    ResourcePattern,
    ResourceType,
)
from .authorizer import Authorizer
from .scram import ScramCredential, ScramMechanism

FILE_NAME = "shale-security.json"
FORMAT_VERSION = 1


class SecurityStoreError(ValueError):
    """The security file could not be read or written; the message names the file (a ValueError, so a node
    that cannot read it stops in one line, like any other refused setting)."""


@dataclass(frozen=True)
class Outcome:
    """One result of an admin request: Kafka's error code and message (None when it succeeded)."""

    error_code: int = error_codes.NONE
    error_message: str | None = None


@dataclass(frozen=True)
class DeleteOutcome(Outcome):
    deleted: tuple[AclBinding, ...] = ()


@dataclass(frozen=True)
class UserCredentials(Outcome):
    user: str = ""
    credentials: tuple[tuple[ScramMechanism, int], ...] = ()  # (mechanism, iterations)


@dataclass(frozen=True)
class Deletion:
    user: str
    mechanism: int  # wire type: 1 SCRAM-SHA-256, 2 SCRAM-SHA-512


@dataclass(frozen=True)
class Upsertion:
    user: str
    mechanism: int
    iterations: int
    salt: bytes
    salted_password: bytes

    def __repr__(self) -> str:  # the salted password is a credential: never in a log line
        return f"Upsertion(user={self.user!r}, mechanism={self.mechanism}, iterations={self.iterations})"


class SecurityStore:
    def __init__(self, path: str | None, authorizer: Authorizer,
                 credentials: dict[str, dict[ScramMechanism, ScramCredential]],
                 persist: Callable[[dict], None] | None = None) -> None:
        self.path = path
        self.authorizer = authorizer
        self._credentials = credentials
        self._persist = persist  # instead of the file: where a scratch copy's change goes (SecurityStoreError if not)

    @classmethod
    def open(cls, directory: str, authorizer: Authorizer) -> SecurityStore:
        """Load `directory/shale-security.json` into `authorizer` (an empty state if there is no file)."""
        path = os.path.join(directory, FILE_NAME)
        try:
            with open(path, "rb") as f:
                raw = f.read()
        except FileNotFoundError:
            return cls(path, authorizer, {})
        except OSError as e:
            raise SecurityStoreError(f"cannot read {path}: {e.strerror}") from None
        try:
            bindings, credentials = _parse(json.loads(raw))
        except (ValueError, AttributeError, TypeError) as e:
            raise SecurityStoreError(f"{path} is not a valid security file: {e}") from None
        for b in bindings:
            authorizer.add(b)
        return cls(path, authorizer, credentials)

    # --- the whole state, for a cluster that shares it (security_sync.py) ---------------------------------

    def document(self) -> dict:
        """The state as the file holds it."""
        return {
            "version": FORMAT_VERSION,
            "acls": [_binding_to_json(b) for b in self.authorizer.acls(ANY_FILTER)],
            "scram": {user: {m.mechanism_name: c.to_text() for m, c in sorted(by.items(), key=lambda i: i[0].type)}
                      for user, by in sorted(self._credentials.items())},
        }

    @classmethod
    def from_document(cls, doc: dict, source: str, persist: Callable[[dict], None]) -> SecurityStore:
        """A copy of a shared state, in memory, whose changes go to `persist` (security_sync.py)."""
        try:
            bindings, credentials = _parse(doc)
        except (ValueError, AttributeError, TypeError) as e:
            raise SecurityStoreError(f"{source} is not a valid security document: {e}") from None
        authorizer = Authorizer()
        for b in bindings:
            authorizer.add(b)
        return cls(None, authorizer, credentials, persist)

    def replace(self, doc: dict, source: str) -> None:
        """Take `doc` as the whole state (memory, then the file); a document that does not parse changes
        nothing and is an error naming `source`."""
        try:
            bindings, credentials = _parse(doc)
        except (ValueError, AttributeError, TypeError) as e:
            raise SecurityStoreError(f"{source} is not a valid security document: {e}") from None
        self.authorizer.reset(bindings)
        self._credentials = credentials
        self._save()

    # --- persistence ---------------------------------------------------------------------------------

    def _save(self) -> None:
        if self._persist is not None:
            self._persist(self.document())
            return
        try:
            atomic_write(self.path, json.dumps(self.document(), indent=1).encode(), mode=0o600)
        except OSError as e:
            raise SecurityStoreError(f"cannot write {self.path}: {e.strerror}") from None

    # --- ACLs ------------------------------------------------------------------------------------------

    def create_acls(self, bindings: Sequence[AclBinding | InvalidAclError]) -> list[Outcome]:
        """CreateAcls: each creation (already parsed, or the error parsing it gave) → its outcome."""
        added: list[AclBinding] = []
        outcomes: list[Outcome] = []
        for b in bindings:
            if isinstance(b, InvalidAclError):
                outcomes.append(Outcome(b.error_code, str(b)))
                continue
            if self.authorizer.add(b):
                added.append(b)
            outcomes.append(Outcome())
        if added:
            try:
                self._save()
            except SecurityStoreError as e:
                for b in added:
                    self.authorizer.remove(b)
                return [o if o.error_code else Outcome(error_codes.UNKNOWN_SERVER_ERROR, str(e)) for o in outcomes]
        return outcomes

    def describe_acls(self, acl_filter: AclBindingFilter) -> list[AclBinding]:
        return self.authorizer.acls(acl_filter)

    def delete_acls(self, filters: Sequence[AclBindingFilter | InvalidAclError]) -> list[DeleteOutcome]:
        """DeleteAcls: every binding each filter matches goes, all in one write."""
        outcomes: list[DeleteOutcome] = []
        removed: set[AclBinding] = set()
        for f in filters:
            if isinstance(f, InvalidAclError):
                outcomes.append(DeleteOutcome(f.error_code, str(f)))
                continue
            matched = tuple(self.authorizer.acls(f))
            removed.update(matched)
            outcomes.append(DeleteOutcome(deleted=matched))
        if removed:
            for b in removed:
                self.authorizer.remove(b)
            try:
                self._save()
            except SecurityStoreError as e:
                for b in removed:
                    self.authorizer.add(b)
                return [o if o.error_code else DeleteOutcome(error_codes.UNKNOWN_SERVER_ERROR, str(e))
                        for o in outcomes]
        return outcomes

    # --- SCRAM credentials --------------------------------------------------------------------------------

    def scram_credential(self, user: str, mechanism: ScramMechanism) -> ScramCredential | None:
        """The credential lookup the SASL session uses."""
        return self._credentials.get(user, {}).get(mechanism)

    def describe_scram_credentials(self, users: Sequence[str] | None) -> list[UserCredentials]:
        """DescribeUserScramCredentials: null or empty `users` lists every user that has a credential."""
        if not users:
            users = sorted(self._credentials)
        seen: dict[str, int] = {}
        for u in users:
            seen[u] = seen.get(u, 0) + 1
        results = []
        for u in dict.fromkeys(users):
            if seen[u] > 1:
                results.append(UserCredentials(error_codes.DUPLICATE_RESOURCE,
                                               "Cannot describe SCRAM credentials for the same user twice in a "
                                               "single request", user=u))
            elif u not in self._credentials:
                results.append(UserCredentials(error_codes.RESOURCE_NOT_FOUND,
                                               "Attempt to describe a user credential that does not exist", user=u))
            else:
                infos = tuple((m, c.iterations) for m, c in sorted(self._credentials[u].items(),
                                                                   key=lambda i: i[0].type))
                results.append(UserCredentials(user=u, credentials=infos))
        return results

    def alter_scram_credentials(self, deletions: Sequence[Deletion],
                                upsertions: Sequence[Upsertion]) -> list[tuple[str, Outcome]]:
        """AlterUserScramCredentials: one outcome per user named, in request order; a user named twice
        is refused whole; the valid changes are written together."""
        changes: list[Deletion | Upsertion] = [*deletions, *upsertions]
        count: dict[str, int] = {}
        for c in changes:
            count[c.user] = count.get(c.user, 0) + 1
        outcomes: dict[str, Outcome] = {}
        updated = {u: dict(by) for u, by in self._credentials.items()}
        for c in changes:
            if c.user in outcomes:
                continue
            if count[c.user] > 1:
                outcomes[c.user] = Outcome(error_codes.DUPLICATE_RESOURCE,
                                           "A user credential cannot be altered twice in the same request")
                continue
            outcome = self._check(c)
            if outcome.error_code == error_codes.NONE:
                mechanism = ScramMechanism.from_type(c.mechanism)
                assert mechanism is not None
                if isinstance(c, Deletion):
                    del updated[c.user][mechanism]
                    if not updated[c.user]:
                        del updated[c.user]
                else:
                    updated.setdefault(c.user, {})[mechanism] = ScramCredential.from_salted_password(
                        mechanism, c.salt, c.salted_password, c.iterations)
            outcomes[c.user] = outcome
        if updated != self._credentials:
            previous, self._credentials = self._credentials, updated
            try:
                self._save()
            except SecurityStoreError as e:
                self._credentials = previous
                failed = Outcome(error_codes.UNKNOWN_SERVER_ERROR, str(e))
                outcomes = {u: o if o.error_code else failed for u, o in outcomes.items()}
        return list(outcomes.items())

    def _check(self, change: Deletion | Upsertion) -> Outcome:
        if not change.user:
            return Outcome(error_codes.UNACCEPTABLE_CREDENTIAL, "Username must not be empty")
        mechanism = ScramMechanism.from_type(change.mechanism)
        if mechanism is None:
            return Outcome(error_codes.UNSUPPORTED_SASL_MECHANISM, "Unknown SCRAM mechanism")
        if isinstance(change, Deletion):
            if mechanism not in self._credentials.get(change.user, {}):
                return Outcome(error_codes.RESOURCE_NOT_FOUND,
                               "Attempt to delete a user credential that does not exist")
            return Outcome()
        if change.iterations < mechanism.min_iterations:
            return Outcome(error_codes.UNACCEPTABLE_CREDENTIAL, "Too few iterations")
        if change.iterations > mechanism.max_iterations:
            return Outcome(error_codes.UNACCEPTABLE_CREDENTIAL, "Too many iterations")
        if not change.salt:
            return Outcome(error_codes.UNACCEPTABLE_CREDENTIAL, "Salt must not be empty")
        if len(change.salted_password) != mechanism.digest_size:
            return Outcome(error_codes.UNACCEPTABLE_CREDENTIAL,
                           f"SaltedPassword must be {mechanism.digest_size} bytes for {mechanism.mechanism_name}")
        return Outcome()


def _parse(doc: dict) -> tuple[list[AclBinding], dict[str, dict[ScramMechanism, ScramCredential]]]:
    """A security document's bindings and credentials; ValueError naming the entry that is wrong."""
    if doc.get("version") != FORMAT_VERSION:
        raise ValueError(f"unknown format version {doc.get('version')!r}")
    bindings = []
    for i, acl in enumerate(doc.get("acls", [])):
        try:
            bindings.append(_binding_from_json(acl))
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"ACL entry {i}: {e}") from None
    credentials: dict[str, dict[ScramMechanism, ScramCredential]] = {}
    for user, by_mechanism in doc.get("scram", {}).items():
        for name, text in by_mechanism.items():
            mechanism = ScramMechanism.from_name(name)
            if mechanism is None:
                raise ValueError(f"SCRAM credential of user {user!r}: unknown mechanism {name!r}")
            try:
                credentials.setdefault(user, {})[mechanism] = ScramCredential.from_text(text)
            except ValueError as e:
                raise ValueError(f"SCRAM credential of user {user!r} ({name}): {e}") from None
    return bindings, credentials


def _binding_to_json(b: AclBinding) -> dict[str, str]:
    return {"resource_type": b.pattern.resource_type.name, "name": b.pattern.name,
            "pattern_type": b.pattern.pattern_type.name, "principal": b.entry.principal, "host": b.entry.host,
            "operation": b.entry.operation.name, "permission_type": b.entry.permission_type.name}


def _binding_from_json(d: dict[str, str]) -> AclBinding:
    binding = AclBinding(ResourcePattern(ResourceType[d["resource_type"]], d["name"], PatternType[d["pattern_type"]]),
                         AccessControlEntry(d["principal"], d["host"], AclOperation[d["operation"]],
                                            AclPermissionType[d["permission_type"]]))
    binding.validate()
    return binding
