"""A `User`'s spec as Kafka sees it: the principal, the credential kind and the ACL bindings (sans-I/O).

Strimzi's names map onto Kafka's codes (`shale.sidecar.security.acl`): `prefix` is PREFIXED, `Read` is
READ, a cluster resource is named `kafka-cluster`. Each rule with several operations becomes one binding
per operation, as Kafka stores them. Everything the CRD's schema lets through is checked again here with
Kafka's rules (`AclBinding.validate`, the operations each resource type supports), so a spec the nodes
would refuse is refused before anything is written, with a message naming the rule.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from shale.sidecar.security.acl import (
    CLUSTER_NAME,
    SUPPORTED_OPERATIONS,
    AccessControlEntry,
    AclBinding,
    AclOperation,
    AclPermissionType,
    InvalidAclError,
    PatternType,
    ResourcePattern,
    ResourceType,
)

from .manifests import SpecError
from .user_crd import AUTHENTICATION_TYPES, USER_NAME_MAX

RESOURCE_TYPES = {"topic": ResourceType.TOPIC, "group": ResourceType.GROUP, "cluster": ResourceType.CLUSTER,
                  "transactionalId": ResourceType.TRANSACTIONAL_ID}
PATTERN_TYPES = {"literal": PatternType.LITERAL, "prefix": PatternType.PREFIXED}
OPERATIONS = {"Read": AclOperation.READ, "Write": AclOperation.WRITE, "Create": AclOperation.CREATE,
              "Delete": AclOperation.DELETE, "Alter": AclOperation.ALTER, "Describe": AclOperation.DESCRIBE,
              "ClusterAction": AclOperation.CLUSTER_ACTION, "AlterConfigs": AclOperation.ALTER_CONFIGS,
              "DescribeConfigs": AclOperation.DESCRIBE_CONFIGS, "IdempotentWrite": AclOperation.IDEMPOTENT_WRITE,
              "All": AclOperation.ALL}
PERMISSIONS = {"allow": AclPermissionType.ALLOW, "deny": AclPermissionType.DENY}


@dataclass(frozen=True)
class DesiredUser:
    namespace: str
    name: str  # the Kafka user name (SCRAM) and the CN of a tls user's certificate
    authentication: str  # scram-sha-512 | tls
    acls: frozenset[AclBinding]

    @property
    def principal(self) -> str:
        return f"User:{self.name}" if self.authentication == "scram-sha-512" else f"User:CN={self.name}"

    @property
    def ref(self) -> str:
        return f"{self.namespace}/{self.name}"


def desired_user(body: Mapping[str, Any]) -> DesiredUser:
    """The User as Kafka state; SpecError (reason InvalidSpec) naming the field for anything Kafka would refuse."""
    meta, spec = body["metadata"], body.get("spec") or {}
    name = meta["name"]
    if len(name) > USER_NAME_MAX:
        raise SpecError("InvalidSpec", f"metadata.name is the Kafka user name: at most {USER_NAME_MAX} characters")
    authentication = (spec.get("authentication") or {}).get("type")
    if authentication not in AUTHENTICATION_TYPES:
        raise SpecError("InvalidSpec", f"spec.authentication.type {authentication!r}: expected one of "
                                       f"{', '.join(AUTHENTICATION_TYPES)}")
    user = DesiredUser(meta["namespace"], name, authentication, frozenset())
    authorization = spec.get("authorization") or {}
    if authorization and authorization.get("type") != "simple":
        raise SpecError("InvalidSpec", f"spec.authorization.type {authorization.get('type')!r}: expected simple")
    bindings: set[AclBinding] = set()
    for index, rule in enumerate(authorization.get("acls") or ()):
        bindings |= _bindings(user.principal, rule, f"spec.authorization.acls[{index}]")
    return DesiredUser(user.namespace, name, authentication, frozenset(bindings))


def _bindings(principal: str, rule: Any, where: str) -> set[AclBinding]:
    if not isinstance(rule, Mapping) or not isinstance(rule.get("resource"), Mapping):
        raise SpecError("InvalidSpec", f"{where}: expected a rule with a resource")
    resource = rule["resource"]
    resource_type = RESOURCE_TYPES.get(resource.get("type"))
    pattern_type = PATTERN_TYPES.get(resource.get("patternType", "literal"))
    permission = PERMISSIONS.get(rule.get("type", "allow"))
    if resource_type is None:
        raise SpecError("InvalidSpec", f"{where}.resource.type {resource.get('type')!r}: expected one of "
                                       f"{', '.join(RESOURCE_TYPES)}")
    if pattern_type is None:
        raise SpecError("InvalidSpec", f"{where}.resource.patternType {resource.get('patternType')!r}: expected "
                                       f"one of {', '.join(PATTERN_TYPES)}")
    if permission is None:
        raise SpecError("InvalidSpec", f"{where}.type {rule.get('type')!r}: expected allow or deny")
    name = CLUSTER_NAME if resource_type is ResourceType.CLUSTER else resource.get("name")
    if not isinstance(name, str) or not name:
        raise SpecError("InvalidSpec", f"{where}.resource.name is required for a {resource['type']} resource")
    operations = rule.get("operations")
    if not isinstance(operations, list) or not operations:
        raise SpecError("InvalidSpec", f"{where}.operations: expected a non-empty list")
    out = set()
    for op_name in operations:
        operation = OPERATIONS.get(op_name)
        if operation is None:
            raise SpecError("InvalidSpec", f"{where}.operations: unknown operation {op_name!r}")
        if operation is not AclOperation.ALL and operation not in SUPPORTED_OPERATIONS[resource_type]:
            raise SpecError("InvalidSpec", f"{where}: {op_name} is not an operation on a {resource['type']} "
                                           "(Kafka would never check it)")
        binding = AclBinding(ResourcePattern(resource_type, name, pattern_type),
                             AccessControlEntry(principal, str(rule.get("host", "*")), operation, permission))
        try:
            binding.validate()
        except InvalidAclError as exc:
            raise SpecError("InvalidSpec", f"{where}: {exc}") from None
        out.add(binding)
    return out
