"""The authorized operations a node reports: Kafka's answer when it runs without an authorizer.

Without an authorizer Kafka allows everything, and a client that asks for a resource's authorized
operations (Metadata v8+, DescribeGroups v3+, DescribeCluster) gets every operation the resource type
supports (`AclEntry.supportedOperations`, kept in `shale.sidecar.security.acl`). Values are AclOperation
codes, as bit positions of the response's 32-bit field; a request that does not ask gets Kafka's
"omitted" value instead.
"""

from ...security.acl import SUPPORTED_OPERATIONS, ResourceType

TOPIC_OPERATIONS = SUPPORTED_OPERATIONS[ResourceType.TOPIC]
GROUP_OPERATIONS = SUPPORTED_OPERATIONS[ResourceType.GROUP]
CLUSTER_OPERATIONS = SUPPORTED_OPERATIONS[ResourceType.CLUSTER]
