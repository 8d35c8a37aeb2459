"""The group coordinator's Kafka APIs: each request decoded into a call on the coordinator or one of its parts,
each result encoded as the request's version has it."""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any, Callable

from ....protocol import codec
from ....protocol.error_codes import (
    COORDINATOR_NOT_AVAILABLE,
    KAFKA_STORAGE_ERROR,
    NONE,
    NOT_COORDINATOR,
    NOT_LEADER_OR_FOLLOWER,
    UNSTABLE_OFFSET_COMMIT,
)
from ...apis.authorized_operations import GROUP_OPERATIONS
from .model import CLASSIC_GROUP_TYPE, CommitPartition, JoinRequest, Respond, SyncRequest

if TYPE_CHECKING:
    from .coordinator import GroupCoordinator

logger = logging.getLogger(__name__)


API_OFFSET_COMMIT, API_OFFSET_FETCH = 8, 9
API_JOIN_GROUP, API_HEARTBEAT, API_LEAVE_GROUP, API_SYNC_GROUP = 11, 12, 13, 14
API_DESCRIBE_GROUPS, API_LIST_GROUPS, API_DELETE_GROUPS, API_OFFSET_DELETE = 15, 16, 42, 47
API_TXN_OFFSET_COMMIT = 28


class GroupApis:
    """The wire side of a `GroupCoordinator`."""

    def __init__(self, coordinator: GroupCoordinator) -> None:
        self.coordinator = coordinator
        self.membership = coordinator.membership
        self.offsets = coordinator.offsets
        self.log = coordinator.log

    def handlers(self) -> dict[int, Any]:
        return {
            API_OFFSET_COMMIT: self._handle_offset_commit,
            API_OFFSET_FETCH: self._handle_offset_fetch,
            API_JOIN_GROUP: self._handle_join_group,
            API_HEARTBEAT: self._handle_heartbeat,
            API_LEAVE_GROUP: self._handle_leave_group,
            API_SYNC_GROUP: self._handle_sync_group,
            API_DESCRIBE_GROUPS: self._handle_describe_groups,
            API_LIST_GROUPS: self._handle_list_groups,
            API_DELETE_GROUPS: self._handle_delete_groups,
            API_OFFSET_DELETE: self._handle_offset_delete,
            API_TXN_OFFSET_COMMIT: self._handle_txn_offset_commit,
        }

    async def _handle_join_group(self, request: codec.Request, conn) -> dict:
        v, b = request.api_version, request.body
        req = JoinRequest(
            group_id=b.group_id, member_id=b.member_id or "",
            group_instance_id=b.group_instance_id if v >= 5 else None,
            protocol_type=b.protocol_type, protocols=[(p.name, bytes(p.metadata)) for p in b.protocols],
            session_timeout_ms=b.session_timeout_ms,
            rebalance_timeout_ms=b.rebalance_timeout_ms if v >= 1 else b.session_timeout_ms,
            client_id=conn.client_id or "", client_host=f"/{conn.host}",
            require_known_member_id=v >= 4, supports_skip_assignment=v >= 9,
            reason=b.reason if v >= 8 else None)
        result = await self._wait(lambda respond: self.membership.join_group(req, respond))
        if v < 7 and result["protocol_name"] is None:
            result = {**result, "protocol_name": ""}  # not nullable before v7
        return {"throttle_time_ms": 0, **result}

    async def _handle_sync_group(self, request: codec.Request, conn) -> dict:
        v, b = request.api_version, request.body
        req = SyncRequest(
            group_id=b.group_id, generation_id=b.generation_id, member_id=b.member_id,
            group_instance_id=b.group_instance_id if v >= 3 else None,
            protocol_type=b.protocol_type if v >= 5 else None, protocol_name=b.protocol_name if v >= 5 else None,
            assignments={a.member_id: bytes(a.assignment) for a in (b.assignments or [])})
        result = await self._wait(lambda respond: self.membership.sync_group(req, respond))
        return {"throttle_time_ms": 0, **result}

    async def _handle_heartbeat(self, request: codec.Request, conn) -> dict:
        v, b = request.api_version, request.body
        code = self.membership.heartbeat(b.group_id, b.generation_id, b.member_id, b.group_instance_id if v >= 3 else None)
        return {"throttle_time_ms": 0, "error_code": code}

    async def _handle_leave_group(self, request: codec.Request, conn) -> dict:
        v, b = request.api_version, request.body
        if v < 3:
            code, errors = self.membership.leave_group(b.group_id, [(b.member_id, None)])
            return {"throttle_time_ms": 0, "error_code": code or next((e for e in errors if e != NONE), NONE)}
        leaving = [(m.member_id, m.group_instance_id) for m in b.members]
        code, errors = self.membership.leave_group(b.group_id, leaving)
        members = [] if code != NONE else [
            {"member_id": mid, "group_instance_id": iid, "error_code": e} for (mid, iid), e in zip(leaving, errors)]
        return {"throttle_time_ms": 0, "error_code": code, "members": members}

    async def _handle_offset_commit(self, request: codec.Request, conn) -> dict:
        v, b = request.api_version, request.body
        partitions = [CommitPartition(t.name, p.partition_index, p.committed_offset,
                                      p.committed_leader_epoch if v >= 6 else -1, p.committed_metadata)
                      for t in b.topics for p in t.partitions]
        retention = b.retention_time_ms if 2 <= v <= 4 else -1
        self.log.last_append = None
        results = self.offsets.commit_offsets(b.group_id, b.generation_id_or_member_epoch, b.member_id or "",
                                              b.group_instance_id if v >= 7 else None, partitions,
                                              retention_ms=retention, api_version=v)
        appended = self.log.last_append
        if appended is not None:
            code = await self.log.writer.replicated(*appended)
            if code != NONE:  # Kafka's appendForGroup error mapping: not the leader any more, or not replicated
                code = NOT_COORDINATOR if code in (NOT_LEADER_OR_FOLLOWER, KAFKA_STORAGE_ERROR) \
                    else COORDINATOR_NOT_AVAILABLE
                logger.warning("offset commit of group %s to %s-%d up to offset %d not replicated (error %d)",
                               b.group_id, appended[0].topic, appended[0].partition, appended[1], code)
                results = {tp: code if c == NONE else c for tp, c in results.items()}
        topics = [{"name": t.name, "partitions": [{"partition_index": p.partition_index,
                                                   "error_code": results[(t.name, p.partition_index)]}
                                                  for p in t.partitions]} for t in b.topics]
        return {"throttle_time_ms": 0, "topics": topics}

    async def _handle_txn_offset_commit(self, request: codec.Request, conn) -> dict:
        """TxnOffsetCommit: the offsets as the producer's transactional batch, pending until its marker."""
        v, b = request.api_version, request.body
        partitions = [CommitPartition(t.name, p.partition_index, p.committed_offset,
                                      p.committed_leader_epoch if v >= 2 else -1, p.committed_metadata)
                      for t in b.topics for p in t.partitions]
        results = self.offsets.commit_offsets(b.group_id, b.generation_id if v >= 3 else -1,
                                              (b.member_id or "") if v >= 3 else "",
                                              b.group_instance_id if v >= 3 else None, partitions,
                                              producer=(b.producer_id, b.producer_epoch))
        return {"throttle_time_ms": 0, "topics": [
            {"name": t.name, "partitions": [{"partition_index": p.partition_index,
                                             "error_code": results[(t.name, p.partition_index)]}
                                            for p in t.partitions]} for t in b.topics]}

    def _fetch_topics(self, group_id: str, topics, v: int, per_partition_error: bool,
                      require_stable: bool = False) -> tuple[int, list[dict]]:
        """OffsetFetch of one group; with `require_stable` (v7+) a partition asked for by name whose offset an
        open transaction has committed answers UNSTABLE_OFFSET_COMMIT (Kafka's getOffsets), which clients retry
        until the transaction ends."""
        wanted = None if topics is None else [(t.name, list(t.partition_indexes)) for t in topics]
        code, found = self.offsets.fetch_offsets(group_id, wanted)
        if code != NONE:
            if not per_partition_error:
                return code, []
            found = [(name, [(p, None) for p in parts]) for name, parts in (wanted or [])]
        unstable = {(name, p) for name, parts in found for p, _ in parts
                    if require_stable and wanted is not None and self.offsets.has_pending_txn_offsets(group_id, (name, p))}
        out = []
        for name, parts in found:
            out.append({"name": name, "partitions": [
                {"partition_index": p, "committed_offset": -1, "committed_leader_epoch": -1, "metadata": "",
                 "error_code": UNSTABLE_OFFSET_COMMIT} if (name, p) in unstable else
                {"partition_index": p, "committed_offset": -1 if val is None else val.offset,
                 "committed_leader_epoch": -1 if val is None else val.leader_epoch,
                 "metadata": "" if val is None else val.metadata,
                 "error_code": code if per_partition_error else NONE} for p, val in parts]})
        return code, out

    async def _handle_offset_fetch(self, request: codec.Request, conn) -> dict:
        v, b = request.api_version, request.body
        if v >= 8:
            groups = []
            for g in b.groups:
                code, topics = self._fetch_topics(g.group_id, g.topics, v, per_partition_error=False,
                                                  require_stable=b.require_stable)
                groups.append({"group_id": g.group_id, "topics": topics, "error_code": code})
            return {"throttle_time_ms": 0, "groups": groups}
        # v1: no top-level error code, so a group error goes in every partition (Kafka's getErrorResponse).
        code, topics = self._fetch_topics(b.group_id, b.topics, v, per_partition_error=v < 2,
                                          require_stable=v >= 7 and b.require_stable)
        return {"throttle_time_ms": 0, "topics": topics, "error_code": code}

    async def _handle_list_groups(self, request: codec.Request, conn) -> dict:
        v, b = request.api_version, request.body
        code, groups = self.coordinator.list_groups(b.states_filter if v >= 4 else (), b.types_filter if v >= 5 else ())
        return {"throttle_time_ms": 0, "error_code": code,
                "groups": [{"group_id": g.group_id, "protocol_type": g.protocol_type or "",
                            "group_state": g.state.value, "group_type": CLASSIC_GROUP_TYPE} for g in groups]}

    async def _handle_describe_groups(self, request: codec.Request, conn) -> dict:
        v, b = request.api_version, request.body
        groups = [self.coordinator.describe_group(group_id, v) for group_id in b.groups]
        if v >= 3 and b.include_authorized_operations:
            for g in groups:
                if g["error_code"] == NONE:
                    g["authorized_operations"] = GROUP_OPERATIONS
        return {"throttle_time_ms": 0, "groups": groups}

    async def _handle_delete_groups(self, request: codec.Request, conn) -> dict:
        results = self.coordinator.delete_groups(request.body.groups_names)
        for group_id, code in results:
            if code != NONE:
                logger.info("DeleteGroups from client %r at %s refused for group %s with error %d", conn.client_id,
                            conn.host, group_id, code)
        return {"throttle_time_ms": 0, "results": [{"group_id": g, "error_code": c} for g, c in results]}

    async def _handle_offset_delete(self, request: codec.Request, conn) -> dict:
        b = request.body
        code, topics = self.offsets.delete_offsets(b.group_id, [(t.name, [p.partition_index for p in t.partitions])
                                                                for t in b.topics])
        return {"error_code": code, "throttle_time_ms": 0,
                "topics": [{"name": name, "partitions": [{"partition_index": p, "error_code": c} for p, c in parts]}
                           for name, parts in topics]}

    @staticmethod
    async def _wait(start: Callable[[Respond], None]) -> dict:
        future = asyncio.get_running_loop().create_future()

        def respond(result: dict) -> None:
            if not future.done():
                future.set_result(result)

        start(respond)
        return await future
