"""Kafka's ACL model: resource patterns, access control entries, bindings and the filters of the ACL APIs.

Codes are Kafka's wire codes (`ResourceType`, `PatternType`, `AclOperation`, `AclPermissionType`), so a
CreateAcls creation or a DescribeAcls filter maps onto these types field by field. Stored bindings are
concrete (LITERAL or PREFIXED, a real type and operation, ALLOW or DENY); the ANY and MATCH values exist
only in filters. Validation answers with Kafka's INVALID_REQUEST messages (`AclControlManager`).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum

from ..protocol import error_codes

WILDCARD_RESOURCE = "*"
WILDCARD_PRINCIPAL = "User:*"
WILDCARD_HOST = "*"
CLUSTER_NAME = "kafka-cluster"


class ResourceType(IntEnum):
    UNKNOWN = 0
    ANY = 1
    TOPIC = 2
    GROUP = 3
    CLUSTER = 4
    TRANSACTIONAL_ID = 5
    DELEGATION_TOKEN = 6
    USER = 7


class PatternType(IntEnum):
    UNKNOWN = 0
    ANY = 1
    MATCH = 2
    LITERAL = 3
    PREFIXED = 4


class AclOperation(IntEnum):
    UNKNOWN = 0
    ANY = 1
    ALL = 2
    READ = 3
    WRITE = 4
    CREATE = 5
    DELETE = 6
    ALTER = 7
    DESCRIBE = 8
    CLUSTER_ACTION = 9
    DESCRIBE_CONFIGS = 10
    ALTER_CONFIGS = 11
    IDEMPOTENT_WRITE = 12
    CREATE_TOKENS = 13
    DESCRIBE_TOKENS = 14


class AclPermissionType(IntEnum):
    UNKNOWN = 0
    ANY = 1
    DENY = 2
    ALLOW = 3


def _code(enum: type[IntEnum], value: int) -> IntEnum:
    """A wire code as its enum value; codes Kafka does not know read as UNKNOWN, as Kafka's `fromCode` does."""
    try:
        return enum(value)
    except ValueError:
        return enum(0)


_O = AclOperation
# `AclEntry.supportedOperations`: what an ACL of each concrete resource type can grant.
SUPPORTED_OPERATIONS: dict[ResourceType, frozenset[AclOperation]] = {
    ResourceType.TOPIC: frozenset({_O.READ, _O.WRITE, _O.CREATE, _O.DESCRIBE, _O.DELETE, _O.ALTER,
                                   _O.DESCRIBE_CONFIGS, _O.ALTER_CONFIGS}),
    ResourceType.GROUP: frozenset({_O.READ, _O.DESCRIBE, _O.DELETE, _O.DESCRIBE_CONFIGS, _O.ALTER_CONFIGS}),
    ResourceType.CLUSTER: frozenset({_O.CREATE, _O.CLUSTER_ACTION, _O.DESCRIBE_CONFIGS, _O.ALTER_CONFIGS,
                                     _O.IDEMPOTENT_WRITE, _O.ALTER, _O.DESCRIBE}),
    ResourceType.TRANSACTIONAL_ID: frozenset({_O.DESCRIBE, _O.WRITE}),
    ResourceType.DELEGATION_TOKEN: frozenset({_O.DESCRIBE}),
    ResourceType.USER: frozenset({_O.CREATE_TOKENS, _O.DESCRIBE_TOKENS}),
}

# `AclEntry.authorizationError`: the error a refused check on a resource of this type answers with.
AUTHORIZATION_ERRORS: dict[ResourceType, int] = {
    ResourceType.TOPIC: error_codes.TOPIC_AUTHORIZATION_FAILED,
    ResourceType.GROUP: error_codes.GROUP_AUTHORIZATION_FAILED,
    ResourceType.CLUSTER: error_codes.CLUSTER_AUTHORIZATION_FAILED,
    ResourceType.TRANSACTIONAL_ID: error_codes.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
    ResourceType.DELEGATION_TOKEN: error_codes.DELEGATION_TOKEN_AUTHORIZATION_FAILED,
}

# Granting one of these (ALLOW only) grants the key too: READ/WRITE/DELETE/ALTER let a client see what
# it works on, ALTER_CONFIGS lets it read the configs it changes (`StandardAuthorizerData`).
IMPLIED_BY: dict[AclOperation, frozenset[AclOperation]] = {
    _O.DESCRIBE: frozenset({_O.READ, _O.WRITE, _O.DELETE, _O.ALTER}),
    _O.DESCRIBE_CONFIGS: frozenset({_O.ALTER_CONFIGS}),
}


class InvalidAclError(ValueError):
    """A binding or filter the ACL APIs refuse with INVALID_REQUEST; the message is Kafka's."""

    error_code = error_codes.INVALID_REQUEST


@dataclass(frozen=True)
class ResourcePattern:
    resource_type: ResourceType
    name: str
    pattern_type: PatternType


@dataclass(frozen=True)
class AccessControlEntry:
    principal: str  # "User:alice", "User:*"
    host: str  # an IP address or "*"
    operation: AclOperation
    permission_type: AclPermissionType


@dataclass(frozen=True)
class AclBinding:
    pattern: ResourcePattern
    entry: AccessControlEntry

    @classmethod
    def from_codes(cls, resource_type: int, name: str | None, pattern_type: int, principal: str | None,
                   host: str | None, operation: int, permission_type: int) -> AclBinding:
        """A CreateAcls creation as a binding, validated as Kafka validates a new ACL."""
        binding = cls(ResourcePattern(_code(ResourceType, resource_type), name or "", _code(PatternType, pattern_type)),
                      AccessControlEntry(principal or "", host or "", _code(AclOperation, operation),
                                         _code(AclPermissionType, permission_type)))
        binding.validate()
        return binding

    def validate(self) -> None:
        """Kafka's rules for a binding that is to be stored (`AclControlManager.validateNewAcl`, `AclApis`)."""
        p, e = self.pattern, self.entry
        if p.resource_type in (ResourceType.UNKNOWN, ResourceType.ANY):
            raise InvalidAclError(f"Invalid resourceType {p.resource_type.name}")
        if p.pattern_type not in (PatternType.LITERAL, PatternType.PREFIXED):
            raise InvalidAclError(f"Invalid patternType {p.pattern_type.name}")
        if e.operation in (AclOperation.UNKNOWN, AclOperation.ANY):
            raise InvalidAclError(f"Invalid operation {e.operation.name}")
        if e.permission_type not in (AclPermissionType.ALLOW, AclPermissionType.DENY):
            raise InvalidAclError(f"Invalid permissionType {e.permission_type.name}")
        if not p.name:
            raise InvalidAclError("Resource name should not be empty")
        if p.resource_type is ResourceType.CLUSTER and p.name != CLUSTER_NAME:
            raise InvalidAclError(f"The only valid name for the CLUSTER resource is {CLUSTER_NAME}")
        if ":" not in e.principal:
            raise InvalidAclError(f"Could not parse principal from `{e.principal}` (no colon is present "
                                  "separating the principal type from the principal name)")


@dataclass(frozen=True)
class ResourcePatternFilter:
    resource_type: ResourceType
    name: str | None  # None matches every name
    pattern_type: PatternType

    def is_unknown(self) -> bool:
        return self.resource_type is ResourceType.UNKNOWN or self.pattern_type is PatternType.UNKNOWN

    def matches(self, pattern: ResourcePattern) -> bool:
        """Kafka's `ResourcePatternFilter.matches`: MATCH selects every binding that applies to the name."""
        if self.resource_type is not ResourceType.ANY and self.resource_type is not pattern.resource_type:
            return False
        if self.pattern_type not in (PatternType.ANY, PatternType.MATCH, pattern.pattern_type):
            return False
        if self.name is None:
            return True
        if self.pattern_type in (PatternType.ANY, pattern.pattern_type):
            return self.name == pattern.name
        if pattern.pattern_type is PatternType.LITERAL:
            return self.name == pattern.name or pattern.name == WILDCARD_RESOURCE
        return self.name.startswith(pattern.name)  # PREFIXED


@dataclass(frozen=True)
class AccessControlEntryFilter:
    principal: str | None
    host: str | None
    operation: AclOperation
    permission_type: AclPermissionType

    def is_unknown(self) -> bool:
        return self.operation is AclOperation.UNKNOWN or self.permission_type is AclPermissionType.UNKNOWN

    def matches(self, entry: AccessControlEntry) -> bool:
        return ((self.principal is None or self.principal == entry.principal)
                and (self.host is None or self.host == entry.host)
                and self.operation in (AclOperation.ANY, entry.operation)
                and self.permission_type in (AclPermissionType.ANY, entry.permission_type))


@dataclass(frozen=True)
class AclBindingFilter:
    pattern: ResourcePatternFilter
    entry: AccessControlEntryFilter

    @classmethod
    def from_codes(cls, resource_type: int, name: str | None, pattern_type: int, principal: str | None,
                   host: str | None, operation: int, permission_type: int) -> AclBindingFilter:
        """A DescribeAcls / DeleteAcls filter, validated as Kafka validates one (`AclControlManager.validateFilter`)."""
        f = cls(ResourcePatternFilter(_code(ResourceType, resource_type), name, _code(PatternType, pattern_type)),
                AccessControlEntryFilter(principal, host, _code(AclOperation, operation),
                                         _code(AclPermissionType, permission_type)))
        if f.pattern.is_unknown():
            raise InvalidAclError("Unknown patternFilter.")
        if f.entry.is_unknown():
            raise InvalidAclError("Unknown entryFilter.")
        return f

    def matches(self, binding: AclBinding) -> bool:
        return self.pattern.matches(binding.pattern) and self.entry.matches(binding.entry)


ANY_FILTER = AclBindingFilter(ResourcePatternFilter(ResourceType.ANY, None, PatternType.ANY),
                              AccessControlEntryFilter(None, None, AclOperation.ANY, AclPermissionType.ANY))
