"""The ACL matrix on a real `shale serve`: every API the node serves, sent raw (kafka-python's encoders and
decoders), by a principal with no ACL and by one granted exactly the operations Kafka's broker checks for it.

Without: each answer carries the authorization error Kafka's broker answers, where Kafka puts it (per
partition, per topic, per group, per resource, or for the whole request), and decodes with the client's
own decoder. With: no answer carries any authorization error. The principal is the PLAINTEXT listener's
`User:ANONYMOUS`; the two nodes differ only in their ACL files."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import pytest
from kafka.protocol.admin.acl import (
    CreateAclsRequest,
    CreateAclsResponse,
    DeleteAclsRequest,
    DeleteAclsResponse,
    DescribeAclsRequest,
    DescribeAclsResponse,
)
from kafka.protocol.admin.cluster import (
    AlterReplicaLogDirsRequest,
    AlterReplicaLogDirsResponse,
    DescribeClusterRequest,
    DescribeClusterResponse,
    DescribeLogDirsRequest,
    DescribeLogDirsResponse,
)
from kafka.protocol.admin.configs import (
    AlterConfigsRequest,
    AlterConfigsResponse,
    DescribeConfigsRequest,
    DescribeConfigsResponse,
    IncrementalAlterConfigsRequest,
    IncrementalAlterConfigsResponse,
)
from kafka.protocol.admin.groups import (
    DeleteGroupsRequest,
    DeleteGroupsResponse,
    DescribeGroupsRequest,
    DescribeGroupsResponse,
    ListGroupsRequest,
    ListGroupsResponse,
)
from kafka.protocol.admin.topics import (
    AlterPartitionReassignmentsRequest,
    AlterPartitionReassignmentsResponse,
    CreatePartitionsRequest,
    CreatePartitionsResponse,
    CreateTopicsRequest,
    CreateTopicsResponse,
    DeleteTopicsRequest,
    DeleteTopicsResponse,
    ListPartitionReassignmentsRequest,
    ListPartitionReassignmentsResponse,
)
from kafka.protocol.admin.transactions import DescribeTransactionsRequest, DescribeTransactionsResponse
from kafka.protocol.admin.users import (
    AlterUserScramCredentialsRequest,
    AlterUserScramCredentialsResponse,
    DescribeUserScramCredentialsRequest,
    DescribeUserScramCredentialsResponse,
)
from kafka.protocol.consumer.fetch import FetchRequest, FetchResponse
from kafka.protocol.consumer.group import (
    HeartbeatRequest,
    HeartbeatResponse,
    JoinGroupRequest,
    JoinGroupResponse,
    LeaveGroupRequest,
    LeaveGroupResponse,
    OffsetCommitRequest,
    OffsetCommitResponse,
    OffsetDeleteRequest,
    OffsetDeleteResponse,
    OffsetFetchRequest,
    OffsetFetchResponse,
    SyncGroupRequest,
    SyncGroupResponse,
)
from kafka.protocol.consumer.offsets import (
    ListOffsetsRequest,
    ListOffsetsResponse,
    OffsetForLeaderEpochRequest,
    OffsetForLeaderEpochResponse,
)
from kafka.protocol.metadata.find_coordinator import FindCoordinatorRequest, FindCoordinatorResponse
from kafka.protocol.metadata.metadata import MetadataRequest, MetadataResponse
from kafka.protocol.producer.produce import ProduceRequest, ProduceResponse
from kafka.protocol.producer.transaction import (
    AddOffsetsToTxnRequest,
    AddOffsetsToTxnResponse,
    AddPartitionsToTxnRequest,
    AddPartitionsToTxnResponse,
    EndTxnRequest,
    EndTxnResponse,
    InitProducerIdRequest,
    InitProducerIdResponse,
    TxnOffsetCommitRequest,
    TxnOffsetCommitResponse,
    WriteTxnMarkersRequest,
    WriteTxnMarkersResponse,
)

from shale.sidecar.protocol import codec
from shale.sidecar.security.acl import (
    CLUSTER_NAME,
    AccessControlEntry,
    AclBinding,
    AclOperation,
    AclPermissionType,
    PatternType,
    ResourcePattern,
    ResourceType,
)
from shale.sidecar.security.api_permissions import API_PERMISSIONS
from shale.sidecar.security.authorizer import Authorizer
from shale.sidecar.security.store import SecurityStore
from support.clients_util import build, call
from support.node_util import ServeProcess, topic_manifest, write_manifests

O, R = AclOperation, ResourceType
TOPIC_AUTH, GROUP_AUTH, CLUSTER_AUTH, TXN_AUTH = 29, 30, 31, 53
AUTH_ERRORS = {TOPIC_AUTH, GROUP_AUTH, CLUSTER_AUTH, TXN_AUTH}
GROUP = "g"

# Exactly what the requests below need (Kafka's checks per API), granted to User:ANONYMOUS on the "with" node.
GRANTS = [
    *((R.TOPIC, "orders", op) for op in (O.WRITE, O.READ, O.DELETE, O.ALTER, O.DESCRIBE_CONFIGS, O.ALTER_CONFIGS)),
    (R.TOPIC, "new-topic", O.CREATE),
    *((R.GROUP, GROUP, op) for op in (O.READ, O.DESCRIBE, O.DELETE)),
    *((R.CLUSTER, CLUSTER_NAME, op) for op in (O.DESCRIBE, O.ALTER, O.DESCRIBE_CONFIGS, O.ALTER_CONFIGS,
                                               O.IDEMPOTENT_WRITE, O.CLUSTER_ACTION)),
    (R.TRANSACTIONAL_ID, "txn", O.WRITE),
]


@dataclass(frozen=True)
class Case:
    request: Any
    response: type
    errors: Callable[[Any], set[int]]  # the error codes of the answer, where Kafka puts them
    refused: set[int]  # what the principal without ACLs gets there


def parts(topics_attr: str, parts_attr: str) -> Callable[[Any], set[int]]:
    return lambda r: {p.error_code for t in getattr(r, topics_attr) for p in getattr(t, parts_attr)}


def top(r: Any) -> set[int]:
    return {r.error_code}


def each(attr: str) -> Callable[[Any], set[int]]:
    return lambda r: {x.error_code for x in getattr(r, attr)}


def cases() -> dict[str, Case]:
    member = {"group_id": GROUP, "generation_id": 1, "member_id": "m"}
    return {
        "Produce": Case(build(ProduceRequest, {"acks": 1, "timeout_ms": 1000, "topic_data": [
            {"name": "orders", "partition_data": [{"index": 0, "records": None}]}]}, version=9), ProduceResponse,
            parts("responses", "partition_responses"), {TOPIC_AUTH}),
        "Fetch": Case(build(FetchRequest, {"replica_id": -1, "max_wait_ms": 0, "min_bytes": 1, "max_bytes": 1 << 20,
                                           "topics": [{"topic": "orders", "partitions": [
                                               {"partition": 0, "fetch_offset": 0, "partition_max_bytes": 1 << 20}]}]},
                            version=11), FetchResponse, parts("responses", "partitions"), {TOPIC_AUTH}),
        "ListOffsets": Case(build(ListOffsetsRequest, {"replica_id": -1, "topics": [
            {"name": "orders", "partitions": [{"partition_index": 0, "timestamp": -1}]}]}, version=7),
            ListOffsetsResponse, parts("topics", "partitions"), {TOPIC_AUTH}),
        "Metadata": Case(build(MetadataRequest, {"topics": [{"name": "orders"}]}, version=9), MetadataResponse,
                         each("topics"), {TOPIC_AUTH}),
        "OffsetCommit": Case(build(OffsetCommitRequest, {"group_id": GROUP, "generation_id_or_member_epoch": 1,
                                                          "member_id": "m", "topics": [
            {"name": "orders", "partitions": [{"partition_index": 0, "committed_offset": 1}]}]}, version=8),
            OffsetCommitResponse, parts("topics", "partitions"), {GROUP_AUTH}),
        "OffsetFetch": Case(build(OffsetFetchRequest, {"group_id": GROUP, "topics": [
            {"name": "orders", "partition_indexes": [0]}]}, version=7), OffsetFetchResponse, top, {GROUP_AUTH}),
        "OffsetFetch v8": Case(build(OffsetFetchRequest, {"groups": [{"group_id": GROUP, "topics": None}]}, version=8),
                               OffsetFetchResponse, each("groups"), {GROUP_AUTH}),
        "FindCoordinator": Case(build(FindCoordinatorRequest, {"key": GROUP, "key_type": 0}, version=3),
                                FindCoordinatorResponse, top, {GROUP_AUTH}),
        "FindCoordinator v4": Case(build(FindCoordinatorRequest, {"key_type": 0, "coordinator_keys": [GROUP]},
                                         version=4), FindCoordinatorResponse, each("coordinators"), {GROUP_AUTH}),
        "JoinGroup": Case(build(JoinGroupRequest, {"group_id": GROUP, "session_timeout_ms": 10000,
                                                   "rebalance_timeout_ms": 10000, "member_id": "",
                                                   "protocol_type": "consumer", "protocols": [
                                                       {"name": "range", "metadata": b""}]}, version=5),
                          JoinGroupResponse, top, {GROUP_AUTH}),
        "Heartbeat": Case(build(HeartbeatRequest, member, version=4), HeartbeatResponse, top, {GROUP_AUTH}),
        "LeaveGroup": Case(build(LeaveGroupRequest, {"group_id": GROUP, "members": [{"member_id": "m"}]}, version=4),
                           LeaveGroupResponse, top, {GROUP_AUTH}),
        "SyncGroup": Case(build(SyncGroupRequest, {**member, "assignments": []}, version=4), SyncGroupResponse, top,
                          {GROUP_AUTH}),
        "DescribeGroups": Case(build(DescribeGroupsRequest, {"groups": [GROUP]}, version=5), DescribeGroupsResponse,
                               each("groups"), {GROUP_AUTH}),
        "CreateTopics": Case(build(CreateTopicsRequest, {"topics": [
            {"name": "new-topic", "num_partitions": 1, "replication_factor": 1, "assignments": [], "configs": []}],
            "timeout_ms": 10000, "validate_only": True}, version=5), CreateTopicsResponse, each("topics"),
            {TOPIC_AUTH}),
        "DeleteTopics": Case(build(DeleteTopicsRequest, {"topic_names": ["orders"], "timeout_ms": 1000}, version=5),
                             DeleteTopicsResponse, each("responses"), {TOPIC_AUTH}),
        "InitProducerId": Case(build(InitProducerIdRequest, {"transactional_id": None, "transaction_timeout_ms": 1000},
                                     version=4), InitProducerIdResponse, top, {CLUSTER_AUTH}),
        "InitProducerId txn": Case(build(InitProducerIdRequest, {"transactional_id": "txn",
                                                                 "transaction_timeout_ms": 1000}, version=4),
                                   InitProducerIdResponse, top, {TXN_AUTH}),
        "AddPartitionsToTxn": Case(build(AddPartitionsToTxnRequest, {
            "v3_and_below_transactional_id": "txn", "v3_and_below_producer_id": 1, "v3_and_below_producer_epoch": 0,
            "v3_and_below_topics": [{"name": "orders", "partitions": [0]}]}, version=3), AddPartitionsToTxnResponse,
            lambda r: {p.partition_error_code for t in r.results_by_topic_v3_and_below for p in t.results_by_partition},
            {TXN_AUTH}),
        "AddOffsetsToTxn": Case(build(AddOffsetsToTxnRequest, {"transactional_id": "txn", "producer_id": 1,
                                                               "producer_epoch": 0, "group_id": GROUP}, version=3),
                                AddOffsetsToTxnResponse, top, {TXN_AUTH}),
        "EndTxn": Case(build(EndTxnRequest, {"transactional_id": "txn", "producer_id": 1, "producer_epoch": 0,
                                             "committed": True}, version=3), EndTxnResponse, top, {TXN_AUTH}),
        "TxnOffsetCommit": Case(build(TxnOffsetCommitRequest, {
            "transactional_id": "txn", "group_id": GROUP, "producer_id": 1, "producer_epoch": 0, "generation_id": -1,
            "member_id": "", "topics": [{"name": "orders", "partitions": [
                {"partition_index": 0, "committed_offset": 1}]}]}, version=3), TxnOffsetCommitResponse,
            parts("topics", "partitions"), {TXN_AUTH}),
        "WriteTxnMarkers": Case(build(WriteTxnMarkersRequest, {"markers": [
            {"producer_id": 987654, "producer_epoch": 0, "transaction_result": False, "coordinator_epoch": 0,
             "topics": [{"name": "orders", "partition_indexes": [0]}]}]}, version=1), WriteTxnMarkersResponse,
            lambda r: {p.error_code for m in r.markers for t in m.topics for p in t.partitions}, {CLUSTER_AUTH}),
        "DescribeTransactions": Case(build(DescribeTransactionsRequest, {"transactional_ids": ["txn"]}, version=0),
                                     DescribeTransactionsResponse, each("transaction_states"), {TXN_AUTH}),
        "OffsetForLeaderEpoch": Case(build(OffsetForLeaderEpochRequest, {"replica_id": -1, "topics": [
            {"topic": "orders", "partitions": [{"partition": 0, "current_leader_epoch": -1, "leader_epoch": 0}]}]},
            version=3), OffsetForLeaderEpochResponse, parts("topics", "partitions"), {TOPIC_AUTH}),
        "DescribeAcls": Case(build(DescribeAclsRequest, {"resource_type_filter": 1, "pattern_type_filter": 1,
                                                         "operation": 1, "permission_type": 1}, version=2),
                             DescribeAclsResponse, top, {CLUSTER_AUTH}),
        "CreateAcls": Case(build(CreateAclsRequest, {"creations": [
            {"resource_type": 2, "resource_name": "elsewhere", "resource_pattern_type": 3,
             "principal": "User:nobody", "host": "*", "operation": 3, "permission_type": 3}]}, version=2),
            CreateAclsResponse, each("results"), {CLUSTER_AUTH}),
        "DeleteAcls": Case(build(DeleteAclsRequest, {"filters": [
            {"resource_type_filter": 2, "resource_name_filter": "elsewhere", "pattern_type_filter": 3,
             "principal_filter": None, "host_filter": None, "operation": 1, "permission_type": 1}]}, version=2),
            DeleteAclsResponse, each("filter_results"), {CLUSTER_AUTH}),
        "DescribeConfigs": Case(build(DescribeConfigsRequest, {"resources": [
            {"resource_type": 2, "resource_name": "orders", "configuration_keys": None},
            {"resource_type": 4, "resource_name": "0", "configuration_keys": None}]}, version=4),
            DescribeConfigsResponse, each("results"), {TOPIC_AUTH, CLUSTER_AUTH}),
        "AlterConfigs": Case(build(AlterConfigsRequest, {"resources": [
            {"resource_type": 2, "resource_name": "orders", "configs": [{"name": "retention.ms", "value": "1"}]}],
            "validate_only": True}, version=1), AlterConfigsResponse, each("responses"), {TOPIC_AUTH}),
        "AlterReplicaLogDirs": Case(build(AlterReplicaLogDirsRequest, {"dirs": [
            {"path": "/elsewhere", "topics": [{"name": "orders", "partitions": [0]}]}]}, version=1),
            AlterReplicaLogDirsResponse, parts("results", "partitions"), {CLUSTER_AUTH}),
        "DescribeLogDirs": Case(build(DescribeLogDirsRequest, {"topics": None}, version=4), DescribeLogDirsResponse,
                                top, {CLUSTER_AUTH}),
        "CreatePartitions": Case(build(CreatePartitionsRequest, {"topics": [
            {"name": "orders", "count": 2, "assignments": None}], "timeout_ms": 1000, "validate_only": True},
            version=2), CreatePartitionsResponse, each("results"), {TOPIC_AUTH}),
        "DeleteGroups": Case(build(DeleteGroupsRequest, {"groups_names": [GROUP]}, version=2), DeleteGroupsResponse,
                             each("results"), {GROUP_AUTH}),
        "IncrementalAlterConfigs": Case(build(IncrementalAlterConfigsRequest, {"resources": [
            {"resource_type": 4, "resource_name": "0", "configs": [
                {"name": "log.cleaner.threads", "config_operation": 0, "value": "2"}]}], "validate_only": True},
            version=1), IncrementalAlterConfigsResponse, each("responses"), {CLUSTER_AUTH}),
        "AlterPartitionReassignments": Case(build(AlterPartitionReassignmentsRequest,
                                                  {"timeout_ms": 1000, "topics": []}, version=0),
                                            AlterPartitionReassignmentsResponse, top, {CLUSTER_AUTH}),
        "ListPartitionReassignments": Case(build(ListPartitionReassignmentsRequest, {"timeout_ms": 1000,
                                                                                    "topics": None}, version=0),
                                           ListPartitionReassignmentsResponse, top, {CLUSTER_AUTH}),
        "OffsetDelete": Case(build(OffsetDeleteRequest, {"group_id": GROUP, "topics": [
            {"name": "orders", "partitions": [{"partition_index": 0}]}]}, version=0), OffsetDeleteResponse, top,
            {GROUP_AUTH}),
        "DescribeUserScramCredentials": Case(build(DescribeUserScramCredentialsRequest, {"users": [{"name": "a"}]},
                                                   version=0), DescribeUserScramCredentialsResponse, top,
                                             {CLUSTER_AUTH}),
        "AlterUserScramCredentials": Case(build(AlterUserScramCredentialsRequest, {"deletions": [
            {"name": "a", "mechanism": 1}], "upsertions": []}, version=0), AlterUserScramCredentialsResponse,
            each("results"), {CLUSTER_AUTH}),
    }


CASES = cases()


def test_every_served_api_is_in_the_matrix():
    served = {codec.API_NAMES[k] for k in codec.SUPPORTED_VERSIONS} - {"ApiVersions", "SaslHandshake",
                                                                       "SaslAuthenticate"}
    covered = {name.split(" ")[0] for name in CASES} | {"ListGroups", "DescribeCluster",  # (filters: below)
                                                        "ListTransactions"}  # (filters: tests/transactions)
    assert served <= covered, f"APIs without a matrix row: {sorted(served - covered)}"


def checks_errors(checks) -> set[int]:
    out = set()
    for c in checks:
        while c is not None:
            out.add(c.error_code)
            c = c.otherwise
    return out


@pytest.mark.parametrize("name", sorted(CASES))
def test_each_refusal_is_one_api_permissions_names(name):
    """The matrix and sidecar/security/api_permissions.py (Kafka's table) agree on what a refusal answers."""
    key = CASES[name].request.API_KEY
    assert CASES[name].refused <= checks_errors(API_PERMISSIONS[key]), API_PERMISSIONS[key]


def start(tmp_path: Path, name: str, grants: list) -> ServeProcess:
    data = tmp_path / name
    data.mkdir()
    store = SecurityStore.open(str(data), Authorizer())
    store.create_acls([AclBinding(ResourcePattern(rt, n, PatternType.LITERAL),
                                  AccessControlEntry("User:ANONYMOUS", "*", op, AclPermissionType.ALLOW))
                       for rt, n, op in grants])
    topics = write_manifests(tmp_path / "topics" / "t.yaml", topic_manifest("orders"))
    return ServeProcess(data, topics.parent, "--override", "authorizer.class.name=shale",
                        "--override", "offsets.topic.num.partitions=1").start()


@pytest.fixture(scope="module")
def nodes(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("matrix")
    without, with_ = start(tmp, "without", []), start(tmp, "with", GRANTS)
    try:
        yield without, with_
    finally:
        for n in (without, with_):
            assert n.terminate() == 0


@pytest.mark.parametrize("name", sorted(CASES))
def test_refused_without_and_allowed_with_the_operation(nodes, name):
    case = CASES[name]
    without, with_ = nodes
    refused = case.errors(call(without.port, case.request, case.response))
    assert refused == case.refused
    allowed = case.errors(call(with_.port, case.request, case.response))
    assert not allowed & AUTH_ERRORS, f"{name} with the operation granted answered {allowed}"


def test_listings_and_authorized_operations_follow_the_acls(nodes):
    without, with_ = nodes
    everything = build(MetadataRequest, {"topics": None, "include_topic_authorized_operations": True}, version=9)
    assert call(without.port, everything, MetadataResponse).topics == []
    (orders,) = [t for t in call(with_.port, everything, MetadataResponse).topics if t.name == "orders"]
    granted = {O.WRITE, O.READ, O.DELETE, O.ALTER, O.DESCRIBE_CONFIGS, O.ALTER_CONFIGS, O.DESCRIBE}  # DESCRIBE implied
    assert orders.authorized_operations == set(granted)  # kafka-python decodes the bit field as a set
    cluster = build(DescribeClusterRequest, {"include_cluster_authorized_operations": True}, version=0)
    assert call(without.port, cluster, DescribeClusterResponse).authorized_operations == set()
    granted = {O.DESCRIBE, O.ALTER, O.DESCRIBE_CONFIGS, O.ALTER_CONFIGS, O.IDEMPOTENT_WRITE, O.CLUSTER_ACTION}
    assert call(with_.port, cluster, DescribeClusterResponse).authorized_operations == set(granted)
    groups = build(ListGroupsRequest, {}, version=4)
    assert call(without.port, groups, ListGroupsResponse).error_code == 0
