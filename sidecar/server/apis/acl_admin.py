"""The ACL and SCRAM admin APIs: CreateAcls, DescribeAcls, DeleteAcls, DescribeUserScramCredentials and
AlterUserScramCredentials, their fields mapped onto `SecurityStore` (which holds Kafka's semantics).

The ACL APIs answer SECURITY_DISABLED without an authorizer, as Kafka's broker does; the SCRAM APIs work
either way (a node may authenticate before it authorizes). Whether the caller may use them at all is
`authorization.py`'s check (DESCRIBE or ALTER on the cluster). Each change is written to this node's
`shale-security.json` before it is answered; with `--store etcd://` to the cluster's state in etcd first
(`security_sync.py`), so every node has it.
"""

from __future__ import annotations

import logging
from itertools import groupby
from typing import Callable, TypeVar

from ...protocol import codec
from ...protocol.error_codes import NONE, SECURITY_DISABLED
from ...security.acl import AclBinding, AclBindingFilter, InvalidAclError
from ...security.store import Deletion, SecurityStore, Upsertion
from ..network.handler import ConnectionInfo, Handler
from ..ops.security_sync import SharedSecurity

logger = logging.getLogger(__name__)

API_DESCRIBE_ACLS, API_CREATE_ACLS, API_DELETE_ACLS = 29, 30, 31
API_DESCRIBE_USER_SCRAM_CREDENTIALS, API_ALTER_USER_SCRAM_CREDENTIALS = 50, 51

_T = TypeVar("_T")

NO_AUTHORIZER = "No Authorizer is configured on the broker"  # Kafka's SecurityDisabledException message


class AclAdmin:
    def __init__(self, store: SecurityStore, *, authorizer_enabled: bool, shared: SharedSecurity | None = None) -> None:
        self.store = store
        self.authorizer_enabled = authorizer_enabled
        self.shared = shared  # with `--store etcd://`: changes go to the cluster's state (security_sync.py)

    async def _change(self, fn: Callable[[SecurityStore], _T]) -> _T:
        """A change of the security state: this node's, or the cluster's when it shares one."""
        return fn(self.store) if self.shared is None else await self.shared.change(fn)

    def handlers(self) -> dict[int, Handler]:
        return {
            API_DESCRIBE_ACLS: self._describe_acls,
            API_CREATE_ACLS: self._create_acls,
            API_DELETE_ACLS: self._delete_acls,
            API_DESCRIBE_USER_SCRAM_CREDENTIALS: self._describe_scram,
            API_ALTER_USER_SCRAM_CREDENTIALS: self._alter_scram,
        }

    # -- ACLs ----------------------------------------------------------------------------------------------

    async def _describe_acls(self, request: codec.Request, conn: ConnectionInfo) -> dict:
        if not self.authorizer_enabled:
            return {"error_code": SECURITY_DISABLED, "error_message": NO_AUTHORIZER, "resources": []}
        b = request.body
        try:
            acl_filter = AclBindingFilter.from_codes(b.resource_type_filter, b.resource_name_filter,
                                                     b.pattern_type_filter,
                                                     b.principal_filter, b.host_filter, b.operation,
                                                     b.permission_type)
        except InvalidAclError as e:
            return {"error_code": e.error_code, "error_message": str(e), "resources": []}
        bindings = self.store.describe_acls(acl_filter)
        resources = []
        for pattern, group in groupby(bindings, key=lambda x: x.pattern):  # sorted by pattern first
            resources.append({"resource_type": pattern.resource_type, "resource_name": pattern.name,
                              "pattern_type": pattern.pattern_type,
                              "acls": [{"principal": x.entry.principal, "host": x.entry.host,
                                        "operation": x.entry.operation, "permission_type": x.entry.permission_type}
                                       for x in group]})
        return {"error_code": NONE, "error_message": None, "resources": resources}

    async def _create_acls(self, request: codec.Request, conn: ConnectionInfo) -> dict:
        creations = request.body.creations
        if not self.authorizer_enabled:
            return {"results": [{"error_code": SECURITY_DISABLED, "error_message": NO_AUTHORIZER} for _ in creations]}
        parsed: list[AclBinding | InvalidAclError] = []
        for c in creations:
            try:
                parsed.append(AclBinding.from_codes(c.resource_type, c.resource_name,
                                                    c.resource_pattern_type, c.principal,
                                                    c.host, c.operation, c.permission_type))
            except InvalidAclError as e:
                parsed.append(e)
        outcomes = await self._change(lambda store: store.create_acls(parsed))
        for p, o in zip(parsed, outcomes):
            if isinstance(p, AclBinding) and o.error_code == NONE:
                logger.info("%s created ACL %s", conn.principal, _describe(p))
        return {"results": [{"error_code": o.error_code, "error_message": o.error_message} for o in outcomes]}

    async def _delete_acls(self, request: codec.Request, conn: ConnectionInfo) -> dict:
        filters = request.body.filters
        if not self.authorizer_enabled:
            return {"filter_results": [{"error_code": SECURITY_DISABLED, "error_message": NO_AUTHORIZER,
                                        "matching_acls": []} for _ in filters]}
        parsed: list[AclBindingFilter | InvalidAclError] = []
        for f in filters:
            try:
                parsed.append(AclBindingFilter.from_codes(f.resource_type_filter, f.resource_name_filter,
                                                          f.pattern_type_filter,
                                                          f.principal_filter, f.host_filter, f.operation,
                                                          f.permission_type))
            except InvalidAclError as e:
                parsed.append(e)
        results = []
        for outcome in await self._change(lambda store: store.delete_acls(parsed)):
            for b in outcome.deleted:
                logger.info("%s deleted ACL %s", conn.principal, _describe(b))
            results.append({"error_code": outcome.error_code, "error_message": outcome.error_message,
                            "matching_acls": [{"error_code": NONE, "error_message": None,
                                               "resource_type": b.pattern.resource_type,
                                               "resource_name": b.pattern.name,
                                               "pattern_type": b.pattern.pattern_type,
                                               "principal": b.entry.principal, "host": b.entry.host,
                                               "operation": b.entry.operation,
                                               "permission_type": b.entry.permission_type}
                                              for b in outcome.deleted]})
        return {"filter_results": results}

    # -- SCRAM credentials ---------------------------------------------------------------------------------

    async def _describe_scram(self, request: codec.Request, conn: ConnectionInfo) -> dict:
        users = request.body.users
        results = self.store.describe_scram_credentials(None if users is None else [u.name for u in users])
        return {"error_code": NONE, "error_message": None,
                "results": [{"user": r.user, "error_code": r.error_code, "error_message": r.error_message,
                             "credential_infos": [{"mechanism": m.type, "iterations": i} for m, i in r.credentials]}
                            for r in results]}

    async def _alter_scram(self, request: codec.Request, conn: ConnectionInfo) -> dict:
        b = request.body
        deletions = [Deletion(d.name, d.mechanism) for d in b.deletions]
        upsertions = [Upsertion(u.name, u.mechanism, u.iterations, u.salt, u.salted_password) for u in b.upsertions]
        outcomes = await self._change(lambda store: store.alter_scram_credentials(deletions, upsertions))
        for user, o in outcomes:
            if o.error_code == NONE:
                logger.info("%s altered the SCRAM credentials of user %r", conn.principal, user)
        return {"results": [{"user": u, "error_code": o.error_code, "error_message": o.error_message}
                            for u, o in outcomes]}


def _describe(b: AclBinding) -> str:
    p, e = b.pattern, b.entry
    return (f"{e.permission_type.name} {e.principal} from host {e.host} {e.operation.name} on "
            f"{p.resource_type.name} {p.pattern_type.name} {p.name!r}")
