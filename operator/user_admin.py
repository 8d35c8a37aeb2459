"""The operator as a Kafka admin client of one storage node: SCRAM credentials and ACLs of one principal.

Each storage node keeps its own `shale-security.json` (docs/security.md), so the operator — the writer of
record on Kubernetes — must reach every node itself; an admin client (librdkafka's, kafka-python's) sends
each request to whichever broker it picks. This one opens a connection to one address, asks ApiVersions,
and speaks Kafka's own admin APIs through the node's client codec (`client_codec`): CreateAcls (30),
DescribeAcls (29), DeleteAcls (31), DescribeUserScramCredentials (50), AlterUserScramCredentials (51), at
the highest version both sides know. With `ssl_context` the connection is TLS (the chart's operator
certificate, a super user on the nodes' internal listener). Passwords never leave this module: only the
salt and the salted password (RFC 5802's SaltedPassword) are sent, as Kafka's own admin client does.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import ssl
import struct
from typing import Any, Iterable

from shale.sidecar.protocol import error_codes
from shale.sidecar.protocol.client_codec import decode_response, encode_request
from shale.sidecar.protocol.codec import SUPPORTED_VERSIONS
from shale.sidecar.security.acl import (
    AccessControlEntry,
    AclBinding,
    AclOperation,
    AclPermissionType,
    PatternType,
    ResourcePattern,
    ResourceType,
)
from shale.sidecar.security.scram import ScramMechanism

API_VERSIONS, DESCRIBE_ACLS, CREATE_ACLS, DELETE_ACLS = 18, 29, 30, 31
DESCRIBE_SCRAM, ALTER_SCRAM = 50, 51
MECHANISM = ScramMechanism.SCRAM_SHA_512
ITERATIONS = 4096  # Kafka's kafka-configs default and Strimzi's
SALT_BYTES = 32
_SIZE = struct.Struct(">i")
CLIENT_ID = "shale-operator"


class NodeAdminError(Exception):
    """A node that cannot be reached or refused a change; the message names the node and Kafka's error."""


class AclsDisabled(NodeAdminError):
    """The node runs without an authorizer (SECURITY_DISABLED): it keeps no ACLs."""

    def __init__(self, address: str) -> None:
        super().__init__(f"{address} has no authorizer (authorizer.class.name): it cannot keep ACLs")


class NodeAdmin:
    """One connection to one storage node; use as `async with NodeAdmin.connect(...) as admin`."""

    def __init__(self, address: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                 timeout: float) -> None:
        self.address, self._reader, self._writer, self._timeout = address, reader, writer, timeout
        self._correlation = itertools.count(1)
        self._versions: dict[int, int] = {}

    @classmethod
    async def connect(cls, address: str, ssl_context: ssl.SSLContext | None, timeout: float) -> NodeAdmin:
        host, _, port = address.rpartition(":")
        try:
            reader, writer = await asyncio.wait_for(
                asyncio.open_connection(host, int(port), ssl=ssl_context,
                                        server_hostname=host if ssl_context is not None else None), timeout)
        except (OSError, asyncio.TimeoutError, ValueError) as exc:
            raise NodeAdminError(f"{address}: cannot connect: {exc or type(exc).__name__}") from None
        admin = cls(address, reader, writer, timeout)
        try:
            answer = await admin._call(API_VERSIONS, 0, {})
            theirs = {k.api_key: k.max_version for k in answer.api_keys}
        except BaseException:
            await admin.close()
            raise
        for key in (DESCRIBE_ACLS, CREATE_ACLS, DELETE_ACLS, DESCRIBE_SCRAM, ALTER_SCRAM):
            if key in theirs and key in SUPPORTED_VERSIONS:
                admin._versions[key] = min(theirs[key], SUPPORTED_VERSIONS[key][1])
        return admin

    async def __aenter__(self) -> NodeAdmin:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    async def close(self) -> None:
        self._writer.close()
        try:
            await self._writer.wait_closed()
        except (OSError, ssl.SSLError):
            pass

    async def _call(self, api_key: int, version: int, body: dict[str, Any]) -> Any:
        try:
            self._writer.write(encode_request(api_key, version, next(self._correlation), CLIENT_ID, body))
            await asyncio.wait_for(self._writer.drain(), self._timeout)
            (size,) = _SIZE.unpack(await asyncio.wait_for(self._reader.readexactly(4), self._timeout))
            frame = await asyncio.wait_for(self._reader.readexactly(size), self._timeout)
        except (OSError, asyncio.TimeoutError, asyncio.IncompleteReadError) as exc:
            raise NodeAdminError(f"{self.address}: no answer to API {api_key}: {exc or type(exc).__name__}") from None
        return decode_response(api_key, version, frame).body

    async def _admin(self, api_key: int, body: dict[str, Any]) -> Any:
        if api_key not in self._versions:
            raise NodeAdminError(f"{self.address} does not serve API {api_key} (the ACL and SCRAM admin APIs)")
        return await self._call(api_key, self._versions[api_key], body)

    # -- SCRAM -------------------------------------------------------------------------------------

    async def has_credential(self, user: str) -> bool:
        """Whether the node holds a SCRAM-SHA-512 credential of `user` (which password, no node can say)."""
        answer = await self._admin(DESCRIBE_SCRAM, {"users": [{"name": user}]})
        _raise_for(self.address, "DescribeUserScramCredentials", answer.error_code, answer.error_message)
        for result in answer.results:
            if result.error_code == error_codes.RESOURCE_NOT_FOUND:
                return False
            _raise_for(self.address, "DescribeUserScramCredentials", result.error_code, result.error_message)
            return any(info.mechanism == MECHANISM.type for info in result.credential_infos)
        return False

    async def upsert_credential(self, user: str, password: str) -> None:
        salt = os.urandom(SALT_BYTES)
        upsertion = {"name": user, "mechanism": MECHANISM.type, "iterations": ITERATIONS, "salt": salt,
                     "salted_password": MECHANISM.salted_password(password, salt, ITERATIONS)}
        answer = await self._admin(ALTER_SCRAM, {"deletions": [], "upsertions": [upsertion]})
        for result in answer.results:
            _raise_for(self.address, f"AlterUserScramCredentials of {user}", result.error_code, result.error_message)

    async def delete_credential(self, user: str) -> None:
        answer = await self._admin(ALTER_SCRAM, {"deletions": [{"name": user, "mechanism": MECHANISM.type}],
                                                 "upsertions": []})
        for result in answer.results:
            if result.error_code != error_codes.RESOURCE_NOT_FOUND:  # already gone
                _raise_for(self.address, f"AlterUserScramCredentials of {user}", result.error_code,
                           result.error_message)

    # -- ACLs --------------------------------------------------------------------------------------

    async def acls_of(self, principal: str) -> set[AclBinding]:
        answer = await self._admin(DESCRIBE_ACLS, _filter(principal))
        if answer.error_code == error_codes.SECURITY_DISABLED:
            raise AclsDisabled(self.address)
        _raise_for(self.address, "DescribeAcls", answer.error_code, answer.error_message)
        return {AclBinding(ResourcePattern(ResourceType(r.resource_type), r.resource_name, PatternType(r.pattern_type)),
                           AccessControlEntry(a.principal, a.host, AclOperation(a.operation),
                                              AclPermissionType(a.permission_type)))
                for r in answer.resources for a in r.acls}

    async def create_acls(self, bindings: Iterable[AclBinding]) -> None:
        creations = [_fields(_CREATION_FIELDS, b) for b in sorted(bindings, key=str)]
        if not creations:
            return
        answer = await self._admin(CREATE_ACLS, {"creations": creations})
        for result in answer.results:
            _raise_for(self.address, "CreateAcls", result.error_code, result.error_message)

    async def delete_acls(self, bindings: Iterable[AclBinding] | None, principal: str) -> None:
        """Delete exactly `bindings`, or (None) every ACL of `principal`."""
        filters = [_filter(principal)] if bindings is None else [
            _fields(_FILTER_FIELDS, b) for b in sorted(bindings, key=str)]
        if not filters:
            return
        answer = await self._admin(DELETE_ACLS, {"filters": filters})
        for result in answer.filter_results:
            if result.error_code == error_codes.SECURITY_DISABLED and bindings is None:
                return  # no authorizer, no ACLs to remove
            _raise_for(self.address, "DeleteAcls", result.error_code, result.error_message)


# CreateAcls creations and DeleteAcls filters carry the same seven fields of a binding under different names.
_CREATION_FIELDS = ("resource_type", "resource_name", "resource_pattern_type", "principal", "host", "operation",
                    "permission_type")
_FILTER_FIELDS = ("resource_type_filter", "resource_name_filter", "pattern_type_filter", "principal_filter",
                  "host_filter", "operation", "permission_type")


def _fields(names: tuple[str, ...], binding: AclBinding) -> dict[str, Any]:
    """`binding` as one entry of a CreateAcls (`_CREATION_FIELDS`) or DeleteAcls (`_FILTER_FIELDS`) request."""
    p, e = binding.pattern, binding.entry
    return dict(zip(names, (p.resource_type, p.name, p.pattern_type, e.principal, e.host, e.operation,
                            e.permission_type), strict=True))


def _filter(principal: str) -> dict[str, Any]:
    """Every ACL of one principal, whatever its resource, pattern, host, operation or permission."""
    return {"resource_type_filter": ResourceType.ANY, "resource_name_filter": None,
            "pattern_type_filter": PatternType.ANY, "principal_filter": principal, "host_filter": None,
            "operation": AclOperation.ANY, "permission_type": AclPermissionType.ANY}


def _raise_for(address: str, what: str, code: int, message: str | None) -> None:
    if code != error_codes.NONE:
        raise NodeAdminError(f"{address}: {what}: {error_codes.name_of(code)}" + (f" ({message})" if message else ""))
