"""Kafka's ACL authorizer (`StandardAuthorizer`): who may do what to which resource.

A check (principal, client host, operation, resource) is allowed when the principal is a super user;
otherwise the bindings that apply to the resource are those of its type whose pattern is the literal
name, the literal wildcard `*`, or a prefix of the name. Of those, the ones for this principal (or
`User:*`) and this host (or `*`) decide: any DENY of the operation (or ALL) refuses, then any ALLOW of
it (or ALL, or an operation that implies it) allows. When no binding applies to the resource at all,
`allow.everyone.if.no.acl.found` decides (false by default); when some apply but none matches, the
answer is no. DENY is never implied: denying READ does not deny DESCRIBE.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .acl import (
    IMPLIED_BY,
    SUPPORTED_OPERATIONS,
    WILDCARD_HOST,
    WILDCARD_PRINCIPAL,
    WILDCARD_RESOURCE,
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    PatternType,
    ResourcePattern,
    ResourceType,
)
from .principal import KafkaPrincipal

MAX_REMEMBERED = 100_000


@dataclass
class Authorizer:
    super_users: frozenset[KafkaPrincipal] = frozenset()
    allow_everyone_if_no_acl_found: bool = False
    _literal: dict[tuple[ResourceType, str], set[AclBinding]] = field(default_factory=dict, repr=False)
    _prefixed: dict[ResourceType, set[AclBinding]] = field(default_factory=dict, repr=False)
    # Decisions made since the ACL set last changed: every request of a producer or consumer asks the same
    # few questions, and a dict lookup is ~100 times cheaper than walking the bindings again.
    _decisions: dict[tuple, bool] = field(default_factory=dict, repr=False)

    # --- the ACL set ----------------------------------------------------------------------------------

    def add(self, binding: AclBinding) -> bool:
        """Add a validated binding; False if it was already there (CreateAcls succeeds either way)."""
        bucket = self._bucket(binding.pattern)
        if binding in bucket:
            return False
        bucket.add(binding)
        self._decisions.clear()
        return True

    def remove(self, binding: AclBinding) -> None:
        self._bucket(binding.pattern).discard(binding)
        self._decisions.clear()

    def reset(self, bindings: list[AclBinding]) -> None:
        """Replace the whole ACL set (a cluster's shared state arriving)."""
        self._literal.clear()
        self._prefixed.clear()
        self._decisions.clear()
        for b in bindings:
            self.add(b)

    def acls(self, acl_filter: AclBindingFilter) -> list[AclBinding]:
        """The bindings a DescribeAcls / DeleteAcls filter selects, in a stable order."""
        found = [b for bucket in (*self._literal.values(), *self._prefixed.values()) for b in bucket
                 if acl_filter.matches(b)]
        return sorted(found, key=_sort_key)

    def _bucket(self, pattern: ResourcePattern) -> set[AclBinding]:
        if pattern.pattern_type is PatternType.PREFIXED:
            return self._prefixed.setdefault(pattern.resource_type, set())
        return self._literal.setdefault((pattern.resource_type, pattern.name), set())

    # --- decisions -------------------------------------------------------------------------------------

    def _applying(self, resource_type: ResourceType, name: str) -> set[AclBinding]:
        found = self._literal.get((resource_type, name), set()) | self._literal.get((resource_type, WILDCARD_RESOURCE),
                                                                                   set())
        return found | {b for b in self._prefixed.get(resource_type, ()) if name.startswith(b.pattern.name)}

    def authorize(self, principal: KafkaPrincipal, host: str, operation: AclOperation,
                  resource_type: ResourceType, name: str) -> bool:
        key = (principal, host, operation, resource_type, name)
        decision = self._decisions.get(key)
        if decision is None:
            if len(self._decisions) >= MAX_REMEMBERED:  # bounded: start over rather than grow with names
                self._decisions.clear()
            decision = self._decisions[key] = self._decide(principal, host, operation, resource_type, name)
        return decision

    def _decide(self, principal: KafkaPrincipal, host: str, operation: AclOperation,
                resource_type: ResourceType, name: str) -> bool:
        if principal in self.super_users:
            return True
        applying = self._applying(resource_type, name)
        if not applying:
            return self.allow_everyone_if_no_acl_found
        principals = (str(principal), WILDCARD_PRINCIPAL)
        mine = [b.entry for b in applying if b.entry.principal in principals and b.entry.host in (host, WILDCARD_HOST)]
        if any(e.permission_type is AclPermissionType.DENY and e.operation in (operation, AclOperation.ALL)
               for e in mine):
            return False
        granting = {operation, AclOperation.ALL, *IMPLIED_BY.get(operation, ())}
        return any(e.permission_type is AclPermissionType.ALLOW and e.operation in granting for e in mine)

    def authorized_operations(self, principal: KafkaPrincipal, host: str, resource_type: ResourceType,
                              name: str) -> frozenset[AclOperation]:
        """What Metadata / DescribeGroups / DescribeCluster report as a resource's authorized operations."""
        return frozenset(op for op in SUPPORTED_OPERATIONS[resource_type]
                         if self.authorize(principal, host, op, resource_type, name))

    def authorize_by_resource_type(self, principal: KafkaPrincipal, host: str, operation: AclOperation,
                                   resource_type: ResourceType) -> bool:
        """Whether `operation` is allowed on at least one resource of the type (Kafka's default
        `Authorizer.authorizeByResourceType`; InitProducerId's "WRITE on any topic")."""
        # a name no binding names: super users, and allow.everyone.if.no.acl.found without any binding
        if self.authorize(principal, host, operation, resource_type, "hardcode"):
            return True
        deny_literal: set[str] = set()
        deny_prefixed: set[str] = set()
        allow: list[ResourcePattern] = []
        principals = (str(principal), WILDCARD_PRINCIPAL)
        for b in self.acls(AclBindingFilter.from_codes(resource_type, None, PatternType.ANY, None, None,
                                                       AclOperation.ANY, AclPermissionType.ANY)):
            e = b.entry
            if e.host not in (host, WILDCARD_HOST) or e.principal not in principals:
                continue
            if e.operation not in (operation, AclOperation.ALL):
                continue
            if e.permission_type is AclPermissionType.DENY:
                if b.pattern.pattern_type is PatternType.LITERAL:
                    if b.pattern.name == WILDCARD_RESOURCE:
                        return False
                    deny_literal.add(b.pattern.name)
                else:
                    deny_prefixed.add(b.pattern.name)
            else:
                allow.append(b.pattern)
        if any(p.pattern_type is PatternType.LITERAL and p.name == WILDCARD_RESOURCE for p in allow):
            return True
        for p in allow:
            if p.pattern_type is PatternType.LITERAL and p.name in deny_literal:
                continue
            if not any(p.name[:i] in deny_prefixed for i in range(1, len(p.name) + 1)):
                return True
        return False


def _sort_key(b: AclBinding) -> tuple:
    return (b.pattern.resource_type, b.pattern.pattern_type, b.pattern.name, b.entry.principal, b.entry.host,
            b.entry.operation, b.entry.permission_type)

