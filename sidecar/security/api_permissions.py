"""Which ACL check Kafka's broker makes for each API ("Operations and Resources on Protocols" in Kafka's
security docs, as `KafkaApis` checks them), for every API a node serves or will serve.

A row lists its checks in the order the broker makes them; each names the operation, the resource
type, whether a refusal answers per item (topic, partition, group) or fails the whole request, and
the error it answers with: the `*_AUTHORIZATION_FAILED` of the refused resource's type unless Kafka
uses another. `otherwise` is the check tried when the first is refused (CREATE on the cluster, else
CREATE on each topic); `filters` means refused items are left out of the answer instead of failed
(Metadata listing every topic, ListGroups), so a client cannot learn that they exist.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..protocol import error_codes
from .acl import AUTHORIZATION_ERRORS, AclOperation, ResourceType

_O, _R = AclOperation, ResourceType


@dataclass(frozen=True)
class Check:
    operation: AclOperation
    resource_type: ResourceType
    per_item: bool
    when: str = ""  # the requests this check applies to; empty: all
    otherwise: Check | None = None
    filters: bool = False
    any_resource: bool = False  # allowed on any resource of the type (`authorizeByResourceType`)
    error: int | None = None  # Kafka's answer when it is not the resource type's own error

    @property
    def error_code(self) -> int:
        return self.error if self.error is not None else AUTHORIZATION_ERRORS[self.resource_type]


def _per(op: AclOperation, rt: ResourceType, **kw) -> Check:
    return Check(op, rt, per_item=True, **kw)


def _whole(op: AclOperation, rt: ResourceType, **kw) -> Check:
    return Check(op, rt, per_item=False, **kw)


_CLUSTER_ACTION = _whole(_O.CLUSTER_ACTION, _R.CLUSTER)

API_PERMISSIONS: dict[int, tuple[Check, ...]] = {
    0: (_whole(_O.WRITE, _R.TRANSACTIONAL_ID, when="transactional produce"), _per(_O.WRITE, _R.TOPIC)),  # Produce
    1: (_per(_O.CLUSTER_ACTION, _R.CLUSTER, when="follower fetch", error=error_codes.TOPIC_AUTHORIZATION_FAILED),
        _per(_O.READ, _R.TOPIC, when="consumer fetch")),  # Fetch
    2: (_per(_O.DESCRIBE, _R.TOPIC),),  # ListOffsets
    3: (_per(_O.DESCRIBE, _R.TOPIC, filters=True),  # Metadata: named topics answer the error, "all" filters
        _per(_O.CREATE, _R.CLUSTER, when="auto-create", otherwise=_per(_O.CREATE, _R.TOPIC))),
    8: (_whole(_O.READ, _R.GROUP), _per(_O.READ, _R.TOPIC)),  # OffsetCommit
    9: (_per(_O.DESCRIBE, _R.GROUP), _per(_O.DESCRIBE, _R.TOPIC)),  # OffsetFetch (several groups v8+)
    10: (_per(_O.DESCRIBE, _R.GROUP, when="group key"),
         _per(_O.DESCRIBE, _R.TRANSACTIONAL_ID, when="transaction key")),  # FindCoordinator
    11: (_whole(_O.READ, _R.GROUP),),  # JoinGroup
    12: (_whole(_O.READ, _R.GROUP),),  # Heartbeat
    13: (_whole(_O.READ, _R.GROUP),),  # LeaveGroup
    14: (_whole(_O.READ, _R.GROUP),),  # SyncGroup
    15: (_per(_O.DESCRIBE, _R.GROUP),),  # DescribeGroups
    16: (_whole(_O.DESCRIBE, _R.CLUSTER, otherwise=_per(_O.DESCRIBE, _R.GROUP, filters=True)),),  # ListGroups
    17: (),  # SaslHandshake
    18: (),  # ApiVersions
    19: (_per(_O.CREATE, _R.CLUSTER, otherwise=_per(_O.CREATE, _R.TOPIC)),  # CreateTopics
         _per(_O.DESCRIBE_CONFIGS, _R.TOPIC, when="configs in the answer (v5+)", filters=True)),
    20: (_per(_O.DESCRIBE, _R.TOPIC), _per(_O.DELETE, _R.TOPIC)),  # DeleteTopics
    21: (_per(_O.DELETE, _R.TOPIC),),  # DeleteRecords
    22: (_whole(_O.WRITE, _R.TRANSACTIONAL_ID, when="transactional"),  # InitProducerId
         _whole(_O.IDEMPOTENT_WRITE, _R.CLUSTER, when="idempotent",
                otherwise=_whole(_O.WRITE, _R.TOPIC, any_resource=True,
                                 error=error_codes.CLUSTER_AUTHORIZATION_FAILED))),
    23: (_per(_O.CLUSTER_ACTION, _R.CLUSTER, otherwise=_per(_O.DESCRIBE, _R.TOPIC)),),  # OffsetForLeaderEpoch
    24: (_whole(_O.WRITE, _R.TRANSACTIONAL_ID), _whole(_O.WRITE, _R.TOPIC)),  # AddPartitionsToTxn (v0-3)
    25: (_whole(_O.WRITE, _R.TRANSACTIONAL_ID), _whole(_O.READ, _R.GROUP)),  # AddOffsetsToTxn
    26: (_whole(_O.WRITE, _R.TRANSACTIONAL_ID),),  # EndTxn
    27: (_CLUSTER_ACTION,),  # WriteTxnMarkers (from another node's transaction coordinator)
    28: (_whole(_O.WRITE, _R.TRANSACTIONAL_ID), _whole(_O.READ, _R.GROUP), _per(_O.READ, _R.TOPIC)),  # TxnOffsetCommit
    29: (_whole(_O.DESCRIBE, _R.CLUSTER),),  # DescribeAcls
    30: (_whole(_O.ALTER, _R.CLUSTER),),  # CreateAcls
    31: (_whole(_O.ALTER, _R.CLUSTER),),  # DeleteAcls
    32: (_per(_O.DESCRIBE_CONFIGS, _R.CLUSTER, when="BROKER resources"),  # DescribeConfigs
         _per(_O.DESCRIBE_CONFIGS, _R.TOPIC, when="TOPIC resources")),
    33: (_per(_O.ALTER_CONFIGS, _R.CLUSTER, when="BROKER resources"),  # AlterConfigs
         _per(_O.ALTER_CONFIGS, _R.TOPIC, when="TOPIC resources")),
    34: (_whole(_O.ALTER, _R.CLUSTER),),  # AlterReplicaLogDirs
    35: (_whole(_O.DESCRIBE, _R.CLUSTER),),  # DescribeLogDirs
    36: (),  # SaslAuthenticate
    37: (_per(_O.ALTER, _R.TOPIC),),  # CreatePartitions
    42: (_per(_O.DELETE, _R.GROUP),),  # DeleteGroups
    43: (_whole(_O.ALTER, _R.CLUSTER),),  # ElectLeaders
    44: (_per(_O.ALTER_CONFIGS, _R.CLUSTER, when="BROKER resources"),  # IncrementalAlterConfigs
         _per(_O.ALTER_CONFIGS, _R.TOPIC, when="TOPIC resources")),
    45: (_whole(_O.ALTER, _R.CLUSTER),),  # AlterPartitionReassignments
    46: (_whole(_O.DESCRIBE, _R.CLUSTER),),  # ListPartitionReassignments
    47: (_whole(_O.DELETE, _R.GROUP), _per(_O.READ, _R.TOPIC)),  # OffsetDelete
    50: (_whole(_O.DESCRIBE, _R.CLUSTER),),  # DescribeUserScramCredentials
    51: (_whole(_O.ALTER, _R.CLUSTER),),  # AlterUserScramCredentials
    56: (_CLUSTER_ACTION,),  # AlterPartition
    60: (_whole(_O.DESCRIBE, _R.CLUSTER, when="cluster authorized operations asked", filters=True),),  # DescribeCluster
    65: (_per(_O.DESCRIBE, _R.TRANSACTIONAL_ID),),  # DescribeTransactions
    66: (_per(_O.DESCRIBE, _R.TRANSACTIONAL_ID, filters=True),),  # ListTransactions
}
