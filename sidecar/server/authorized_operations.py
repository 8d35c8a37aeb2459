"""The authorized operations a node reports: Kafka's answer when it runs without an authorizer.

Without an authorizer Kafka allows everything, and a client that asks for a resource's authorized
operations (Metadata v8+, DescribeGroups v3+, DescribeCluster) gets every operation the resource type
supports (`AclEntry.supportedOperations`). Values are AclOperation codes, as bit positions of the
response's 32-bit field; a request that does not ask gets Kafka's "omitted" value instead.
"""

READ, WRITE, CREATE, DELETE, ALTER, DESCRIBE = 3, 4, 5, 6, 7, 8
CLUSTER_ACTION, DESCRIBE_CONFIGS, ALTER_CONFIGS, IDEMPOTENT_WRITE = 9, 10, 11, 12

TOPIC_OPERATIONS = frozenset({READ, WRITE, CREATE, DESCRIBE, DELETE, ALTER, DESCRIBE_CONFIGS, ALTER_CONFIGS})
GROUP_OPERATIONS = frozenset({READ, DESCRIBE, DELETE, DESCRIBE_CONFIGS, ALTER_CONFIGS})
CLUSTER_OPERATIONS = frozenset({CREATE, CLUSTER_ACTION, DESCRIBE_CONFIGS, ALTER_CONFIGS, IDEMPOTENT_WRITE, ALTER,
                                DESCRIBE})
