"""Each API's ACL check, as Kafka's broker makes it (`KafkaApis`; the table is `api_permissions.API_PERMISSIONS`):
a guard is `async (access, request, handler) -> response body`, which answers the API's error response, or calls
the handler with the items the principal may touch and adds the refused ones to its answer.
"""

from __future__ import annotations

import copy
import dataclasses
import uuid
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping

from ...protocol import codec
from ...protocol.error_codes import (
    CLUSTER_AUTHORIZATION_FAILED,
    GROUP_AUTHORIZATION_FAILED,
    NONE,
    OPERATION_NOT_ATTEMPTED,
    TOPIC_AUTHORIZATION_FAILED,
    TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
    UNKNOWN_TOPIC_ID,
)
from ...security.acl import AUTHORIZATION_ERRORS, CLUSTER_NAME, AclOperation, ResourceType
from ..network.handler import ConnectionInfo, Handler
from .access import MESSAGES, Access, Guard

_O, _R = AclOperation, ResourceType

# DescribeConfigs / AlterConfigs resource types (`ConfigResource.Type`) and what they are checked on.
_CONFIG_TOPIC, _CONFIG_BROKER, _CONFIG_BROKER_LOGGER = 2, 4, 8


def _with(request: codec.Request, handler: Handler, conn: ConnectionInfo, **fields: Any):
    """The handler's answer to a copy of the request with some of its body's fields replaced."""
    body = copy.copy(request.body)
    for name, value in fields.items():
        setattr(body, name, value)
    return handler(dataclasses.replace(request, body=body), conn)


# --- whole-request checks --------------------------------------------------------------------------------

def _whole(operation: AclOperation, resource_type: ResourceType, name_of_resource: Callable[[Any], str],
           refusal: Callable[[codec.Request, int], dict]) -> Guard:
    """A check on one resource for the whole request; refused: `refusal(request, error)` answers it."""
    error = AUTHORIZATION_ERRORS[resource_type]

    async def guard(access: Access, request: codec.Request, handler: Handler) -> Any:
        name = name_of_resource(request.body)
        if access.allows(operation, resource_type, name):
            return await handler(request, access.conn)
        access.refused(operation, resource_type, [name])
        return refusal(request, error)
    return guard


def _top_error(request: codec.Request, error: int) -> dict:
    return {"error_code": error}


def _top_error_message(request: codec.Request, error: int) -> dict:
    return {"error_code": error, "error_message": MESSAGES[error]}


def _cluster(_body: Any) -> str:
    return CLUSTER_NAME


def _group_id(body: Any) -> str:
    return body.group_id


# --- topics with partitions --------------------------------------------------------------------------------

@dataclass(frozen=True)
class TopicParts:
    """Where a request keeps its topics and partitions, and where its response answers them."""

    topics: str  # request: list of topics
    name: str  # request topic: its name
    parts: str  # request topic: its partitions
    index: str | None  # request partition: its index (None: the partitions are plain ints)
    r_topics: str  # response: list of topics
    r_name: str
    r_parts: str
    r_index: str
    extra: Mapping[str, Any] = dataclasses.field(default_factory=dict)  # fields of a refused partition's answer

    def indexes(self, topic: Any) -> list[int]:
        return [p if self.index is None else getattr(p, self.index) for p in getattr(topic, self.parts)]

    def answer(self, name: str, indexes: Iterable[int], error: int) -> dict:
        return {self.r_name: name, self.r_parts: [{self.r_index: i, "error_code": error, **self.extra}
                                                  for i in indexes]}


def split_topics(shape: TopicParts, topics: list, allowed: Callable[[str], bool], error: int) -> tuple[list, list]:
    """(topics to hand on, answers of the refused ones); a topic is allowed or refused whole."""
    kept, refused = [], []
    for t in topics:
        name = getattr(t, shape.name)
        if allowed(name):
            kept.append(t)
        else:
            refused.append(shape.answer(name, shape.indexes(t), error))
    return kept, refused


async def _split_answer(access: Access, request: codec.Request, handler: Handler, field: str, kept: list,
                        response_list: str, refused: list) -> Any:
    """The handler's answer to the request with only `kept` in `field`, the `refused` answers added to its
    `response_list`. With nothing refused the request goes on unchanged; with nothing kept the handler is not
    called (the answer's other fields take the schema's defaults)."""
    if not refused:
        return await handler(request, access.conn)
    response = await _with(request, handler, access.conn, **{field: kept}) if kept else {}
    return _merge(response, response_list, refused)


def _merge(response: dict, key: str, refused: list) -> dict:
    if refused:
        response[key] = [*response.get(key, []), *refused]
    return response


def _per_topic(shape: TopicParts, operation: AclOperation,
               first: Callable[[Access, codec.Request], int] | None = None) -> Guard:
    """Each topic checked for `operation`; `first` is a whole-request check before (its error, or NONE)
    that fails every partition."""

    async def guard(access: Access, request: codec.Request, handler: Handler) -> Any:
        topics = getattr(request.body, shape.topics) or []
        error = NONE if first is None else first(access, request)
        if error != NONE:
            kept, refused = [], [shape.answer(getattr(t, shape.name), shape.indexes(t), error) for t in topics]
        else:
            kept, refused = split_topics(shape, topics, lambda n: access.allows(operation, _R.TOPIC, n),
                                         TOPIC_AUTHORIZATION_FAILED)
            if refused:
                access.refused(operation, _R.TOPIC, (r[shape.r_name] for r in refused))
        return await _split_answer(access, request, handler, shape.topics, kept, shape.r_topics, refused)
    return guard


PRODUCE = TopicParts("topic_data", "name", "partition_data", "index", "responses", "name", "partition_responses",
                     "index", {"base_offset": -1})
FETCH = TopicParts("topics", "topic", "partitions", "partition", "responses", "topic", "partitions",
                   "partition_index", {"high_watermark": -1, "records": b""})
LIST_OFFSETS = TopicParts("topics", "name", "partitions", "partition_index", "topics", "name", "partitions",
                          "partition_index", {"offset": -1, "timestamp": -1})
EPOCHS = TopicParts("topics", "topic", "partitions", "partition", "topics", "topic", "partitions", "partition",
                    {"leader_epoch": -1, "end_offset": -1})
COMMIT = TopicParts("topics", "name", "partitions", "partition_index", "topics", "name", "partitions",
                    "partition_index")
OFFSET_DELETE = COMMIT
OFFSET_FETCH = TopicParts("topics", "name", "partition_indexes", None, "topics", "name", "partitions",
                          "partition_index", {"committed_offset": -1, "committed_leader_epoch": -1, "metadata": ""})


def _produce_first(access: Access, request: codec.Request) -> int:
    txn = request.body.transactional_id
    if txn is not None and not access.allows(_O.WRITE, _R.TRANSACTIONAL_ID, txn):
        access.refused(_O.WRITE, _R.TRANSACTIONAL_ID, [txn])
        return TRANSACTIONAL_ID_AUTHORIZATION_FAILED
    return NONE


def _follower_first(access: Access, request: codec.Request) -> int:
    """A follower's fetch (replica id >= 0) needs CLUSTER_ACTION; refused, every partition answers
    TOPIC_AUTHORIZATION_FAILED."""
    if request.body.replica_id < 0 or access.allows(_O.CLUSTER_ACTION, _R.CLUSTER):
        return NONE
    access.refused(_O.CLUSTER_ACTION, _R.CLUSTER, [CLUSTER_NAME])
    return TOPIC_AUTHORIZATION_FAILED


async def _offset_for_leader_epoch(access: Access, request: codec.Request, handler: Handler) -> Any:
    """CLUSTER_ACTION allows every partition (followers); otherwise DESCRIBE per topic."""
    if access.allows(_O.CLUSTER_ACTION, _R.CLUSTER):
        return await handler(request, access.conn)
    return await _per_topic(EPOCHS, _O.DESCRIBE)(access, request, handler)


def _group_first(operation: AclOperation) -> Callable[[Access, codec.Request], int]:
    def first(access: Access, request: codec.Request) -> int:
        group = request.body.group_id
        if access.allows(operation, _R.GROUP, group):
            return NONE
        access.refused(operation, _R.GROUP, [group])
        return GROUP_AUTHORIZATION_FAILED
    return first


def _txn_offset_commit_first(access: Access, request: codec.Request) -> int:
    """TxnOffsetCommit: WRITE on the transactional id, then READ on the group, before READ per topic."""
    txn = request.body.transactional_id
    if not access.allows(_O.WRITE, _R.TRANSACTIONAL_ID, txn):
        access.refused(_O.WRITE, _R.TRANSACTIONAL_ID, [txn])
        return TRANSACTIONAL_ID_AUTHORIZATION_FAILED
    return _group_first(_O.READ)(access, request)


async def _offset_delete(access: Access, request: codec.Request, handler: Handler) -> Any:
    """DELETE on the group for the whole request (its top-level error), then READ per topic."""
    if _group_first(_O.DELETE)(access, request) != NONE:
        return {"error_code": GROUP_AUTHORIZATION_FAILED}
    return await _per_topic(OFFSET_DELETE, _O.READ)(access, request, handler)


# --- Metadata ------------------------------------------------------------------------------------------------

async def _metadata(access: Access, request: codec.Request, handler: Handler) -> Any:
    """Named topics the principal may not DESCRIBE answer TOPIC_AUTHORIZATION_FAILED; a listing of every topic
    leaves them out. Authorized operations, when asked, are the authorizer's."""
    body, version = request.body, request.api_version
    every = body.topics is None or (version == 0 and not body.topics)
    refused: list[dict] = []
    if every:
        response = await handler(request, access.conn)
        response["topics"] = [t for t in response["topics"] if t["name"] is None
                              or access.allows(_O.DESCRIBE, _R.TOPIC, t["name"])]
    else:
        kept = []
        for t in body.topics:
            if t.name is None or access.allows(_O.DESCRIBE, _R.TOPIC, t.name):
                kept.append(t)
            else:
                refused.append({"error_code": TOPIC_AUTHORIZATION_FAILED, "name": t.name, "partitions": [],
                                "is_internal": False})
        access.refused(_O.DESCRIBE, _R.TOPIC, (r["name"] for r in refused))
        response = await (handler(request, access.conn) if not refused else
                          _with(request, handler, access.conn, topics=kept))
        if refused:  # only what was asked and allowed: v0 reads an emptied list as "every topic"
            asked = {t.name for t in kept}
            response["topics"] = [t for t in response["topics"] if t["name"] in asked]
        response["topics"] = [*response["topics"], *refused]
    for t in response["topics"]:
        if t.get("authorized_operations") is not None and t["error_code"] == NONE:
            t["authorized_operations"] = access.operations(_R.TOPIC, t["name"])
    if response.get("authorized_operations") is not None:
        response["authorized_operations"] = _cluster_operations(access)
    return response


def _cluster_operations(access: Access) -> frozenset[AclOperation]:
    """What Metadata and DescribeCluster report for the cluster: nothing unless DESCRIBE is allowed (Kafka's rule)."""
    return access.operations(_R.CLUSTER) if access.allows(_O.DESCRIBE, _R.CLUSTER) else frozenset()


async def _describe_cluster(access: Access, request: codec.Request, handler: Handler) -> Any:
    response = await handler(request, access.conn)
    if response.get("authorized_operations") is not None:
        response["authorized_operations"] = _cluster_operations(access)
    return response


# --- groups --------------------------------------------------------------------------------------------------

def _offset_fetch_topics(access: Access, topics: list | None) -> tuple[list | None, list]:
    if topics is None:
        return None, []
    kept, refused = split_topics(OFFSET_FETCH, topics, lambda n: access.allows(_O.DESCRIBE, _R.TOPIC, n),
                                 TOPIC_AUTHORIZATION_FAILED)
    access.refused(_O.DESCRIBE, _R.TOPIC, (r["name"] for r in refused))
    return kept, refused


def _visible(access: Access, topics: list[dict]) -> list[dict]:
    return [t for t in topics if access.allows(_O.DESCRIBE, _R.TOPIC, t["name"])]


async def _offset_fetch(access: Access, request: codec.Request, handler: Handler) -> Any:
    """DESCRIBE on each group, then DESCRIBE per topic: named topics refused answer TOPIC_AUTHORIZATION_FAILED per
    partition, a fetch of every topic leaves them out (Kafka's `OffsetFetch` filtering)."""
    body = request.body
    if request.api_version < 8:
        group = body.group_id
        if not access.allows(_O.DESCRIBE, _R.GROUP, group):
            access.refused(_O.DESCRIBE, _R.GROUP, [group])
            parts = [OFFSET_FETCH.answer(t.name, OFFSET_FETCH.indexes(t), GROUP_AUTHORIZATION_FAILED)
                     for t in body.topics or []]
            return {"topics": parts, "error_code": GROUP_AUTHORIZATION_FAILED}
        kept, refused = _offset_fetch_topics(access, body.topics)
        if kept is None:
            response = await handler(request, access.conn)
            response["topics"] = _visible(access, response["topics"])
            return response
        return await _split_answer(access, request, handler, "topics", kept, "topics", refused)
    groups, refused_groups, refused_topics = [], [], {}
    for g in body.groups:
        if not access.allows(_O.DESCRIBE, _R.GROUP, g.group_id):
            refused_groups.append({"group_id": g.group_id, "topics": [], "error_code": GROUP_AUTHORIZATION_FAILED})
            continue
        kept, refused = _offset_fetch_topics(access, g.topics)
        refused_topics[g.group_id] = refused
        if kept is not None and refused:
            g = copy.copy(g)
            g.topics = kept
        groups.append(g)
    access.refused(_O.DESCRIBE, _R.GROUP, (r["group_id"] for r in refused_groups))
    if not groups:
        return {"groups": refused_groups}
    response = await _with(request, handler, access.conn, groups=groups)
    for g, answer in zip(groups, response["groups"]):
        if g.topics is None:
            answer["topics"] = _visible(access, answer["topics"])
        else:
            answer["topics"] = [*answer["topics"], *refused_topics.get(g.group_id, [])]
    response["groups"] = [*response["groups"], *refused_groups]
    return response


async def _find_coordinator(access: Access, request: codec.Request, handler: Handler) -> Any:
    """DESCRIBE on the group (key type 0) or transactional id (1) asked for."""
    body = request.body
    resource_type = _R.TRANSACTIONAL_ID if body.key_type == 1 else _R.GROUP
    error = AUTHORIZATION_ERRORS[resource_type]
    if request.api_version < 4:
        if body.key is None or access.allows(_O.DESCRIBE, resource_type, body.key):
            return await handler(request, access.conn)
        access.refused(_O.DESCRIBE, resource_type, [body.key])
        return {"error_code": error, "error_message": MESSAGES[error], "node_id": -1, "host": "", "port": -1}
    kept = [k for k in body.coordinator_keys if access.allows(_O.DESCRIBE, resource_type, k)]
    refused = [{"key": k, "node_id": -1, "host": "", "port": -1, "error_code": error, "error_message": MESSAGES[error]}
               for k in body.coordinator_keys if k not in kept]
    access.refused(_O.DESCRIBE, resource_type, (r["key"] for r in refused))
    return await _split_answer(access, request, handler, "coordinator_keys", kept, "coordinators", refused)


def _names(operation: AclOperation, resource_type: ResourceType, request_list: str, response_list: str,
           response_name: str, answer: Callable[[str, int], dict]) -> Guard:
    """A request whose items are plain names (groups, topics), each checked and answered on its own."""
    error = AUTHORIZATION_ERRORS[resource_type]

    async def guard(access: Access, request: codec.Request, handler: Handler) -> Any:
        names = getattr(request.body, request_list) or []
        kept = [n for n in names if access.allows(operation, resource_type, n)]
        refused = [answer(n, error) for n in names if n not in kept]
        access.refused(operation, resource_type, (r[response_name] for r in refused))
        return await _split_answer(access, request, handler, request_list, kept, response_list, refused)
    return guard


async def _describe_groups(access: Access, request: codec.Request, handler: Handler) -> Any:
    response = await _names(_O.DESCRIBE, _R.GROUP, "groups", "groups", "group_id",
                            lambda g, e: {"group_id": g, "error_code": e, "group_state": "", "protocol_type": "",
                                          "protocol_data": "", "members": []})(access, request, handler)
    for g in response["groups"]:
        if g.get("authorized_operations") is not None and g["error_code"] == NONE:
            g["authorized_operations"] = access.operations(_R.GROUP, g["group_id"])
    return response


async def _list_groups(access: Access, request: codec.Request, handler: Handler) -> Any:
    """DESCRIBE on the cluster lists every group; otherwise only the groups the principal may DESCRIBE."""
    response = await handler(request, access.conn)
    if not access.allows(_O.DESCRIBE, _R.CLUSTER):
        response["groups"] = [g for g in response["groups"] if access.allows(_O.DESCRIBE, _R.GROUP, g["group_id"])]
    return response


# --- topics (admin) ------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class _Items:
    """A request whose items are structs named by a field, answered one struct each."""

    request_list: str
    name: str
    response_list: str
    answer: Callable[[str, int], dict]


async def _split_items(access: Access, request: codec.Request, handler: Handler, items: _Items,
                       decide: Callable[[Any], int]) -> Any:
    """`decide(item)` is NONE to hand the item on, or the error its answer gets."""
    kept, refused = [], []
    for item in getattr(request.body, items.request_list) or []:
        error = decide(item)
        if error == NONE:
            kept.append(item)
        else:
            refused.append(items.answer(getattr(item, items.name), error))
    return await _split_answer(access, request, handler, items.request_list, kept, items.response_list, refused)


def _topic_check(access: Access, operation: AclOperation) -> Callable[[Any], int]:
    def decide(item: Any) -> int:
        if access.allows(operation, _R.TOPIC, item.name):
            return NONE
        access.refused(operation, _R.TOPIC, [item.name])
        return TOPIC_AUTHORIZATION_FAILED
    return decide


_AUTH_FAILED = "Authorization failed."  # Kafka's message on a topic CreateTopics or CreatePartitions refuses

CREATE_TOPICS = _Items("topics", "name", "topics",
                       lambda n, e: {"name": n, "error_code": e, "error_message": _AUTH_FAILED,
                                     "topic_config_error_code": e, "num_partitions": -1, "replication_factor": -1})
CREATE_PARTITIONS = _Items("topics", "name", "results",
                           lambda n, e: {"name": n, "error_code": e, "error_message": _AUTH_FAILED})


async def _create_topics(access: Access, request: codec.Request, handler: Handler) -> Any:
    """CREATE on the cluster, else on each topic; the configs in the answer (v5+) need DESCRIBE_CONFIGS."""
    if access.allows(_O.CREATE, _R.CLUSTER):
        response = await handler(request, access.conn)
    else:
        response = await _split_items(access, request, handler, CREATE_TOPICS, _topic_check(access, _O.CREATE))
    if request.api_version >= 5:
        for t in response["topics"]:
            if t["error_code"] == NONE and not access.allows(_O.DESCRIBE_CONFIGS, _R.TOPIC, t["name"]):
                t.update(topic_config_error_code=TOPIC_AUTHORIZATION_FAILED, configs=[], num_partitions=-1,
                         replication_factor=-1)
    return response


async def _create_partitions(access: Access, request: codec.Request, handler: Handler) -> Any:
    return await _split_items(access, request, handler, CREATE_PARTITIONS, _topic_check(access, _O.ALTER))


def _delete_topics(topic_name: Callable[[uuid.UUID], str | None]) -> Guard:
    """DESCRIBE then DELETE on each topic; a topic id the principal may not DESCRIBE is UNKNOWN_TOPIC_ID, as if
    it did not exist (Kafka's answer), and an id no topic has is left to the handler."""

    def answer(name: str | None, error: int, topic_id: Any = None) -> dict:
        out = {"name": name, "error_code": error, "error_message": MESSAGES.get(error)}
        if topic_id is not None:
            out["topic_id"] = topic_id
        return out

    async def guard(access: Access, request: codec.Request, handler: Handler) -> Any:
        by_struct = request.api_version >= 6
        items = (request.body.topics if by_struct else request.body.topic_names) or []
        kept, refused = [], []
        for item in items:
            name = item.name if by_struct else item
            by_id = by_struct and name is None
            if by_id:
                name = topic_name(item.topic_id)
                if name is None:
                    kept.append(item)
                    continue
            if not access.allows(_O.DESCRIBE, _R.TOPIC, name):
                access.refused(_O.DESCRIBE, _R.TOPIC, [name])
                refused.append(answer(None if by_id else name, UNKNOWN_TOPIC_ID if by_id else
                                      TOPIC_AUTHORIZATION_FAILED, item.topic_id if by_struct else None))
            elif not access.allows(_O.DELETE, _R.TOPIC, name):
                access.refused(_O.DELETE, _R.TOPIC, [name])
                refused.append(answer(name, TOPIC_AUTHORIZATION_FAILED, item.topic_id if by_struct else None))
            else:
                kept.append(item)
        return await _split_answer(access, request, handler, "topics" if by_struct else "topic_names", kept,
                                   "responses", refused)
    return guard


# --- configs ---------------------------------------------------------------------------------------------------

def _configs(operation: AclOperation, response_list: str, answer_configs: bool) -> Guard:
    """DescribeConfigs / AlterConfigs / IncrementalAlterConfigs: a TOPIC resource is checked on its topic, a
    BROKER or BROKER_LOGGER resource on the cluster; other types are left to the handler's own answer."""

    def answer(resource: Any, error: int) -> dict:
        out = {"error_code": error, "error_message": None, "resource_type": resource.resource_type,
               "resource_name": resource.resource_name}
        if answer_configs:
            out["configs"] = []
        return out

    async def guard(access: Access, request: codec.Request, handler: Handler) -> Any:
        kept, refused = [], []
        for r in request.body.resources or []:
            if r.resource_type == _CONFIG_TOPIC:
                resource_type, name = _R.TOPIC, r.resource_name
            elif r.resource_type in (_CONFIG_BROKER, _CONFIG_BROKER_LOGGER):
                resource_type, name = _R.CLUSTER, CLUSTER_NAME
            else:
                kept.append(r)
                continue
            if access.allows(operation, resource_type, name):
                kept.append(r)
            else:
                access.refused(operation, resource_type, [name])
                refused.append(answer(r, AUTHORIZATION_ERRORS[resource_type]))
        return await _split_answer(access, request, handler, "resources", kept, response_list, refused)
    return guard


# --- producer ids ------------------------------------------------------------------------------------------------

async def _init_producer_id(access: Access, request: codec.Request, handler: Handler) -> Any:
    """A transactional id needs WRITE on it; an idempotent producer IDEMPOTENT_WRITE on the cluster or WRITE on
    some topic (Kafka's `authorizeByResourceType`), else CLUSTER_AUTHORIZATION_FAILED."""
    txn = request.body.transactional_id
    refused = {"producer_id": -1, "producer_epoch": -1}
    if txn is not None:
        if access.allows(_O.WRITE, _R.TRANSACTIONAL_ID, txn):
            return await handler(request, access.conn)
        access.refused(_O.WRITE, _R.TRANSACTIONAL_ID, [txn])
        return {**refused, "error_code": TRANSACTIONAL_ID_AUTHORIZATION_FAILED}
    conn = access.conn
    if access.allows(_O.IDEMPOTENT_WRITE, _R.CLUSTER) or access.authorizer.authorize_by_resource_type(
            conn.principal, conn.host, _O.WRITE, _R.TOPIC):
        return await handler(request, conn)
    access.refused(_O.IDEMPOTENT_WRITE, _R.CLUSTER, [CLUSTER_NAME])
    return {**refused, "error_code": CLUSTER_AUTHORIZATION_FAILED}


def _txn_id(field: str) -> Callable[[Any], str]:
    return lambda body: getattr(body, field)


async def _add_partitions_to_txn(access: Access, request: codec.Request, handler: Handler) -> Any:
    """WRITE on the transactional id, then WRITE on every topic; any refusal fails the whole request, the
    refused partitions with their error and the others OPERATION_NOT_ATTEMPTED (Kafka's KafkaApis)."""
    body = request.body
    txn, topics = body.v3_and_below_transactional_id, body.v3_and_below_topics
    if not access.allows(_O.WRITE, _R.TRANSACTIONAL_ID, txn):
        access.refused(_O.WRITE, _R.TRANSACTIONAL_ID, [txn])
        errors = {t.name: TRANSACTIONAL_ID_AUTHORIZATION_FAILED for t in topics}
    else:
        denied = {t.name for t in topics if not access.allows(_O.WRITE, _R.TOPIC, t.name)}
        if not denied:
            return await handler(request, access.conn)
        access.refused(_O.WRITE, _R.TOPIC, denied)
        errors = {t.name: TOPIC_AUTHORIZATION_FAILED if t.name in denied else OPERATION_NOT_ATTEMPTED for t in topics}
    return {"results_by_topic_v3_and_below": [
        {"name": t.name, "results_by_partition": [{"partition_index": p, "partition_error_code": errors[t.name]}
                                                  for p in t.partitions]} for t in topics]}


async def _add_offsets_to_txn(access: Access, request: codec.Request, handler: Handler) -> Any:
    """WRITE on the transactional id, READ on the group."""
    body = request.body
    if not access.allows(_O.WRITE, _R.TRANSACTIONAL_ID, body.transactional_id):
        access.refused(_O.WRITE, _R.TRANSACTIONAL_ID, [body.transactional_id])
        return {"error_code": TRANSACTIONAL_ID_AUTHORIZATION_FAILED}
    if not access.allows(_O.READ, _R.GROUP, body.group_id):
        access.refused(_O.READ, _R.GROUP, [body.group_id])
        return {"error_code": GROUP_AUTHORIZATION_FAILED}
    return await handler(request, access.conn)


async def _list_transactions(access: Access, request: codec.Request, handler: Handler) -> Any:
    """Only the transactional ids the principal may DESCRIBE are listed."""
    response = await handler(request, access.conn)
    response["transaction_states"] = [t for t in response["transaction_states"]
                                      if access.allows(_O.DESCRIBE, _R.TRANSACTIONAL_ID, t["transactional_id"])]
    return response


def _every_marker_partition(request: codec.Request, error: int) -> dict:
    """WriteTxnMarkers refused: every partition of every marker answers the error (Kafka's getErrorResponse)."""
    return {"markers": [{"producer_id": m.producer_id, "topics": [
        {"name": t.name, "partitions": [{"partition_index": p, "error_code": error} for p in t.partition_indexes]}
        for t in m.topics]} for m in request.body.markers]}


def _every_log_dir_partition(request: codec.Request, error: int) -> dict:
    """AlterReplicaLogDirs refused: every partition it names answers the error (Kafka's answer)."""
    topics: dict[str, list[int]] = {}
    for d in request.body.dirs:
        for t in d.topics:
            topics.setdefault(t.name, []).extend(t.partitions)
    return {"results": [{"topic_name": name, "partitions": [{"partition_index": p, "error_code": error}
                                                            for p in parts]} for name, parts in topics.items()]}


# --- the ACL and SCRAM admin APIs -----------------------------------------------------------------------------

def _acl_refusal(key: int) -> Callable[[codec.Request, int], dict]:
    message = MESSAGES[CLUSTER_AUTHORIZATION_FAILED]

    def refusal(request: codec.Request, error: int) -> dict:
        body = request.body
        if key == 29:
            return {"error_code": error, "error_message": message, "resources": []}
        if key == 30:
            return {"results": [{"error_code": error, "error_message": message} for _ in body.creations]}
        if key == 31:
            return {"filter_results": [{"error_code": error, "error_message": message, "matching_acls": []}
                                       for _ in body.filters]}
        if key == 50:
            return {"error_code": error, "error_message": message,
                    "results": [{"user": u.name, "error_code": error, "error_message": message}
                                for u in body.users or []]}
        users = dict.fromkeys(c.name for c in [*body.deletions, *body.upsertions])
        return {"results": [{"user": u, "error_code": error, "error_message": message} for u in users]}
    return refusal


# --- the table ---------------------------------------------------------------------------------------------------

def guards(topic_name: Callable[[uuid.UUID], str | None]) -> dict[int, Guard]:
    group_read = _whole(_O.READ, _R.GROUP, _group_id, _top_error)
    return {
        0: _per_topic(PRODUCE, _O.WRITE, _produce_first),  # acks=0: the broker sends no answer
        1: _per_topic(FETCH, _O.READ, _follower_first),  # nothing left to read: answered at once, as Kafka does
        2: _per_topic(LIST_OFFSETS, _O.DESCRIBE),
        3: _metadata,
        8: _per_topic(COMMIT, _O.READ, _group_first(_O.READ)),
        9: _offset_fetch,
        10: _find_coordinator,
        11: group_read,  # JoinGroup
        12: group_read,  # Heartbeat
        13: group_read,  # LeaveGroup
        14: group_read,  # SyncGroup
        15: _describe_groups,
        16: _list_groups,
        19: _create_topics,
        20: _delete_topics(topic_name),
        22: _init_producer_id,
        23: _offset_for_leader_epoch,
        24: _add_partitions_to_txn,
        25: _add_offsets_to_txn,
        26: _whole(_O.WRITE, _R.TRANSACTIONAL_ID, _txn_id("transactional_id"), _top_error),  # EndTxn
        27: _whole(_O.CLUSTER_ACTION, _R.CLUSTER, _cluster, _every_marker_partition),  # WriteTxnMarkers
        28: _per_topic(COMMIT, _O.READ, _txn_offset_commit_first),  # TxnOffsetCommit
        29: _whole(_O.DESCRIBE, _R.CLUSTER, _cluster, _acl_refusal(29)),
        30: _whole(_O.ALTER, _R.CLUSTER, _cluster, _acl_refusal(30)),
        31: _whole(_O.ALTER, _R.CLUSTER, _cluster, _acl_refusal(31)),
        32: _configs(_O.DESCRIBE_CONFIGS, "results", answer_configs=True),
        33: _configs(_O.ALTER_CONFIGS, "responses", answer_configs=False),
        34: _whole(_O.ALTER, _R.CLUSTER, _cluster, _every_log_dir_partition),  # AlterReplicaLogDirs
        35: _whole(_O.DESCRIBE, _R.CLUSTER, _cluster, lambda r, e: {"error_code": e, "results": []}),
        37: _create_partitions,
        42: _names(_O.DELETE, _R.GROUP, "groups_names", "results", "group_id",
                   lambda g, e: {"group_id": g, "error_code": e}),
        44: _configs(_O.ALTER_CONFIGS, "responses", answer_configs=False),
        45: _whole(_O.ALTER, _R.CLUSTER, _cluster, _top_error_message),  # AlterPartitionReassignments
        46: _whole(_O.DESCRIBE, _R.CLUSTER, _cluster, _top_error_message),  # ListPartitionReassignments
        47: _offset_delete,
        50: _whole(_O.DESCRIBE, _R.CLUSTER, _cluster, _acl_refusal(50)),
        51: _whole(_O.ALTER, _R.CLUSTER, _cluster, _acl_refusal(51)),
        60: _describe_cluster,
        65: _names(_O.DESCRIBE, _R.TRANSACTIONAL_ID, "transactional_ids", "transaction_states", "transactional_id",
                   lambda t, e: {"transactional_id": t, "error_code": e, "transaction_state": "",
                                 "transaction_timeout_ms": 0, "transaction_start_time_ms": -1, "producer_id": -1,
                                 "producer_epoch": -1, "topics": []}),
        66: _list_transactions,
    }
