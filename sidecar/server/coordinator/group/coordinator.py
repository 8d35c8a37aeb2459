"""The consumer-group coordinator (Kafka's classic group protocol): every group whose `__consumer_offsets`
partition this node leads, composed of its parts — `model` (a group), `membership` (JoinGroup, SyncGroup,
Heartbeat, LeaveGroup and rebalances), `offsets` (commits, fetches, expiry), `group_log` (its records) and
`handlers` (the wire) — with what spans them here: start and close, loading a partition's groups from the log
and unloading them (docs/coordinator-runtime.md), which node coordinates a group, and the operations over all
groups (ListGroups, DescribeGroups, DeleteGroups).

Committed offsets and group metadata are appended to the group's partition of the compacted internal topic
`__consumer_offsets` before a commit or an assignment is acknowledged, and are replayed from those logs when the
partition is loaded. Time comes from a `Clock`, so tests drive timeouts with a fake one.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Iterable

from ....log.log import Log
from ....log.records import ControlType, parse_control_key
from ....log.topic_partition import TopicPartition
from ....plural import plural
from ....protocol.error_codes import (
    COORDINATOR_NOT_AVAILABLE,
    GROUP_ID_NOT_FOUND,
    INVALID_GROUP_ID,
    NON_EMPTY_GROUP,
    NONE,
    NOT_COORDINATOR,
)
from ....topics.registry import TopicRegistry
from ..coordinator_log import declare_internal_topic, loaded_batches
from ..runtime import Clock, LedPartitions, LocalPartitionWriter, LoopClock, PartitionWriter
from .group_log import GroupLog
from .handlers import GroupApis
from .membership import Membership
from .model import CLASSIC_GROUP_TYPE, CommitPartition, Group, GroupState, Member, answer_waiting, cancel_timers
from .offset_records import (
    OFFSETS_TOPIC,
    GroupMetadataKey,
    GroupMetadataValue,
    OffsetCommitKey,
    OffsetCommitValue,
    OffsetRecordError,
    UnknownKey,
    decode_group_metadata_value,
    decode_key,
    decode_offset_commit_value,
    encode_key,
)
from .offsets import Offsets

logger = logging.getLogger(__name__)

OFFSETS_SEGMENT_BYTES = 100 * 1024 * 1024  # offsets.topic.segment.bytes
# GroupCoordinatorService.groupMetadataTopicConfigs(): what Kafka gives `__consumer_offsets`.
OFFSETS_TOPIC_CONFIG = {"cleanup.policy": "compact", "compression.type": "producer",
                        "segment.bytes": str(OFFSETS_SEGMENT_BYTES)}


class GroupCoordinator:
    """Every classic consumer group whose `__consumer_offsets` partition this node leads."""

    def __init__(
        self,
        registry: TopicRegistry,
        *,
        offsets_partitions: int = 50,
        initial_rebalance_delay_ms: int = 3000,
        min_session_timeout_ms: int = 6000,
        max_session_timeout_ms: int = 1_800_000,
        offsets_retention_ms: int = 7 * 24 * 3600 * 1000,
        offsets_retention_check_interval_ms: int = 600_000,
        offset_metadata_max_bytes: int = 4096,
        new_member_join_timeout_ms: int = 300_000,
        clock: Clock | None = None,
        writer: PartitionWriter | None = None,
        replication_factor: int | None = None,
    ) -> None:
        self.registry = registry
        self.replication_factor = replication_factor  # offsets.topic.replication.factor, with a control store
        clock = clock or LoopClock()
        self.groups: dict[str, Group] = {}
        self.active = False
        self.log = GroupLog(registry, writer or LocalPartitionWriter(), clock, offsets_partitions)
        self.membership = Membership(self.groups, self.log, clock, self.group_error,
                                     initial_rebalance_delay_ms=initial_rebalance_delay_ms,
                                     min_session_timeout_ms=min_session_timeout_ms,
                                     max_session_timeout_ms=max_session_timeout_ms,
                                     new_member_join_timeout_ms=new_member_join_timeout_ms)
        self.offsets = Offsets(self.groups, registry, self.log, self.membership, clock, self.group_error,
                               lambda: self.active, offsets_retention_ms=offsets_retention_ms,
                               offsets_retention_check_interval_ms=offsets_retention_check_interval_ms,
                               offset_metadata_max_bytes=offset_metadata_max_bytes)
        # With a control store: the partitions loaded here, each in the leader epoch it was loaded in.
        self.led = LedPartitions(OFFSETS_TOPIC, "group", registry.log_dir.logs, load=self._load_led,
                                 unload=self._unload)

    def handlers(self) -> dict[int, Any]:
        return GroupApis(self).handlers()

    @property
    def offsets_partitions(self) -> int:
        """`__consumer_offsets`' partition count: offsets.topic.num.partitions, or the count on disk once started."""
        return self.log.partitions

    def partition_for(self, group_id: str) -> int:
        return self.log.partition_for(group_id)

    # -- lifecycle --------------------------------------------------------------------------------------------

    async def start(self) -> None:
        """Declare `__consumer_offsets` and load every group and committed offset from its local partitions."""
        self.log.partitions = declare_internal_topic(self.registry, OFFSETS_TOPIC, self.log.partitions,
                                                     OFFSETS_TOPIC_CONFIG, "offsets.topic.num.partitions",
                                                     self.replication_factor)
        started = time.monotonic()
        records = 0
        for p in range(self.log.partitions):
            log = self.registry.local_log(OFFSETS_TOPIC, p)
            if log is not None:
                records += self._load_partition(log)
        for group in list(self.groups.values()):
            self._finish_loading(group)
        self.active = True
        self.offsets.schedule_expiry()
        logger.info("group coordinator loaded %s (%s) from %s in %.0f ms", plural(len(self.groups), "group"),
                    plural(records, "record"), OFFSETS_TOPIC, (time.monotonic() - started) * 1000)

    def close(self) -> None:
        """Stop all timers and answer waiting JoinGroup/SyncGroup requests with NOT_COORDINATOR."""
        self.active = False
        self.offsets.stop_expiry()
        for group in self.groups.values():
            cancel_timers(group)
            for m in group.members.values():
                answer_waiting(m, NOT_COORDINATOR)

    def leadership_changed(self, led: dict[int, int]) -> None:
        """With a control store: `led` is {partition: leader epoch} of the `__consumer_offsets` partitions this
        node leads now (`LedPartitions.follow`)."""
        if self.active:
            self.led.follow(led)

    def _unload(self, partition: int) -> int:
        """Forget the groups of a partition no longer led here; their waiting members are answered NOT_COORDINATOR."""
        unloaded = [g for g in self.groups.values() if self.partition_for(g.group_id) == partition]
        for group in unloaded:
            cancel_timers(group)
            for m in group.members.values():
                answer_waiting(m, NOT_COORDINATOR)
            del self.groups[group.group_id]
        return len(unloaded)

    def _load_led(self, partition: int) -> tuple[int, int]:
        """Load a partition led here: (groups loaded, records read)."""
        records = self._load_partition(self.registry.log_dir.logs[TopicPartition(OFFSETS_TOPIC, partition)])
        loaded = [g for g in self.groups.values() if self.partition_for(g.group_id) == partition]
        for group in loaded:
            self._finish_loading(group)
        return sum(g.group_id in self.groups for g in loaded), records

    # -- loading ----------------------------------------------------------------------------------------------

    def _load_partition(self, log: Log) -> int:
        """Replay one partition of `__consumer_offsets`; returns the number of records read."""
        count = 0
        for batch in loaded_batches(log):
            header = batch.header
            if header.is_control:  # a transaction's end: its pending offsets are committed or dropped
                for record in batch.records():
                    control = parse_control_key(record.key)
                    if control in (ControlType.COMMIT, ControlType.ABORT):
                        self.offsets.complete_txn_offsets(log.topic_partition.partition, header.producer_id,
                                                          control is ControlType.COMMIT)
            else:
                pending = header.producer_id if header.is_transactional else None
                for record in batch.records():
                    self._replay(record.key, record.value, batch.where(record), pending)
                    count += 1
        return count

    def _replay(self, key_bytes: bytes | None, value: bytes | None, where: str, producer_id: int | None = None
                ) -> None:
        if key_bytes is None:
            logger.warning("ignoring a record without key at %s", where)
            return
        try:
            key = decode_key(key_bytes)
            if producer_id is not None and isinstance(key, OffsetCommitKey) and value is not None:
                self.offsets.pending_txn_offsets.setdefault(producer_id, {}).setdefault(key.group, {})[
                    (key.topic, key.partition)] = decode_offset_commit_value(value)
                return
            self._apply_record(key, value)
        except OffsetRecordError as exc:
            raise OffsetRecordError(f"cannot load {where}: {exc}") from None

    def _apply_record(self, key: OffsetCommitKey | GroupMetadataKey | UnknownKey, value: bytes | None) -> None:
        if isinstance(key, OffsetCommitKey):
            group = self.groups.setdefault(key.group, Group(key.group))
            if value is None:
                group.offsets.pop((key.topic, key.partition), None)
            else:
                group.offsets[(key.topic, key.partition)] = decode_offset_commit_value(value)
        elif isinstance(key, GroupMetadataKey):
            group = self.groups.setdefault(key.group, Group(key.group))
            if value is None:
                group.generation, group.protocol_type, group.protocol_name, group.leader_id = 0, None, None, None
                group.members.clear()
                group.static_members.clear()
                group.current_state_timestamp = None
            else:
                self._apply_group_metadata(group, decode_group_metadata_value(value))
        else:
            logger.debug("skipping a record of key version %d (not a classic group record)", key.version)

    @staticmethod
    def _apply_group_metadata(group: Group, v: GroupMetadataValue) -> None:
        group.protocol_type = v.protocol_type or None
        group.generation = v.generation
        group.protocol_name = v.protocol
        group.leader_id = v.leader
        group.current_state_timestamp = v.current_state_timestamp if v.current_state_timestamp >= 0 else None
        group.members = {
            m.member_id: Member(m.member_id, m.group_instance_id, m.client_id, m.client_host, m.rebalance_timeout,
                                m.session_timeout, v.protocol_type, [(v.protocol or "", m.subscription)],
                                assignment=m.assignment)
            for m in v.members
        }
        group.static_members = {m.group_instance_id: m.member_id for m in v.members if m.group_instance_id}

    def _finish_loading(self, group: Group) -> None:
        if not group.members and not group.offsets and group.generation == 0:
            del self.groups[group.group_id]  # every record of it was deleted
            return
        group.state = GroupState.STABLE if group.members else GroupState.EMPTY
        group.subscribed_topics = group.subscriptions()
        for m in group.members.values():
            self.membership.schedule_session(group, m, m.session_timeout_ms)
        logger.info("loaded group %s: %s, generation %d, %s, %s", group.group_id, group.state.value,
                    group.generation, plural(len(group.members), "member"),
                    plural(len(group.offsets), "committed offset"))

    # -- validation -------------------------------------------------------------------------------------------

    def coordinates(self, group_id: str) -> bool:
        p = self.partition_for(group_id)
        return (self.registry.leader(OFFSETS_TOPIC, p) == self.registry.node.node_id
                and self.registry.local_log(OFFSETS_TOPIC, p) is not None)

    def group_error(self, group_id: str | None, *, allow_empty: bool) -> int:
        """Kafka's validateGroupStatus; OffsetCommit/OffsetFetch accept the empty group id, the others do not."""
        if group_id is None or (group_id == "" and not allow_empty):
            return INVALID_GROUP_ID
        if not self.active:
            return COORDINATOR_NOT_AVAILABLE
        if not self.coordinates(group_id):
            return NOT_COORDINATOR
        return NONE

    # -- FindCoordinator --------------------------------------------------------------------------------------

    def find_coordinator(self, key: str | None) -> dict:
        """FindCoordinator key type 0: the leader of the group's `__consumer_offsets` partition."""
        out = {"error_code": NONE, "error_message": None, "node_id": -1, "host": "", "port": -1}
        if key is None:  # a null string where the schema has none; a null group id is INVALID_GROUP_ID everywhere
            return {**out, "error_code": INVALID_GROUP_ID, "error_message": "the coordinator key (group id) is null"}
        if not self.active:
            return {**out, "error_code": COORDINATOR_NOT_AVAILABLE, "error_message": "the coordinator is not active"}
        leader = self.registry.leader(OFFSETS_TOPIC, self.partition_for(key))
        node = self.registry.nodes().get(leader) if leader is not None else None
        if node is None:
            return {**out, "error_code": COORDINATOR_NOT_AVAILABLE,
                    "error_message": f"no leader for {OFFSETS_TOPIC}-{self.partition_for(key)}"}
        return {**out, "node_id": node.node_id, "host": node.host, "port": node.port}

    # -- ListGroups, DescribeGroups, DeleteGroups -------------------------------------------------------------

    def list_groups(self, states: Iterable[str] = (), types: Iterable[str] = ()) -> tuple[int, list[Group]]:
        """Kafka's listGroups: the groups coordinated here, filtered by state and by type (case-insensitive)."""
        if not self.active:
            return COORDINATOR_NOT_AVAILABLE, []
        wanted_states = {(s or "").strip().lower() for s in states}  # a null filter entry matches nothing
        wanted_types = {(t or "").lower() for t in types}
        return NONE, [g for g in self.groups.values() if self.coordinates(g.group_id)
                      and (not wanted_states or g.state.value.lower() in wanted_states)
                      and (not wanted_types or CLASSIC_GROUP_TYPE in wanted_types)]

    def describe_group(self, group_id: str | None, version: int) -> dict:
        """Kafka's describeGroups for one group: members with their subscription and assignment once Stable."""
        code = self.group_error(group_id, allow_empty=True)
        if code != NONE:
            return {"group_id": group_id, "error_code": code}
        group = self.groups.get(group_id)
        if group is None:  # v6 (KIP-1043) says so; older versions describe a Dead group
            if version >= 6:
                return {"group_id": group_id, "error_code": GROUP_ID_NOT_FOUND,
                        "error_message": f"Group {group_id} not found.", "group_state": GroupState.DEAD.value}
            return {"group_id": group_id, "error_code": NONE, "group_state": GroupState.DEAD.value}
        stable = group.state is GroupState.STABLE
        return {
            "group_id": group_id, "error_code": NONE, "group_state": group.state.value,
            "protocol_type": group.protocol_type or "", "protocol_data": group.protocol_name if stable else "",
            "members": [{"member_id": m.member_id, "group_instance_id": m.group_instance_id,
                         "client_id": m.client_id, "client_host": m.client_host,
                         "member_metadata": m.metadata(group.protocol_name) if stable else b"",
                         "member_assignment": m.assignment if stable else b""} for m in group.members.values()],
        }

    def delete_groups(self, group_ids: Iterable[str | None]) -> list[tuple[str | None, int]]:
        """Kafka's deleteGroups: only an Empty group goes, with its committed offsets (tombstones first)."""
        results = []
        for group_id in dict.fromkeys(group_ids):
            code = self.group_error(group_id, allow_empty=True)
            group = self.groups.get(group_id) if code == NONE else None
            if code == NONE and group is None:
                code = GROUP_ID_NOT_FOUND
            elif group is not None and group.state is not GroupState.EMPTY:
                code = NON_EMPTY_GROUP
            elif group is not None:
                offsets = len(group.offsets)
                exc = self.log.append(group.group_id, [*self.log.tombstones(group.group_id, group.offsets),
                                                       (encode_key(GroupMetadataKey(group.group_id)), None)])
                if exc is not None:
                    code = self.log.store_error(exc, commit=False)
                else:
                    self.membership.remove_group(group)
                    logger.info("group %s deleted with its %s", group_id, plural(offsets, "committed offset"))
            results.append((group_id, code))
        return results

    # -- offsets (`offsets.py`), for the node, the admin tools and the tests ------------------------------------

    def commit_offsets(self, group_id: str, generation_id: int, member_id: str, group_instance_id: str | None,
                       partitions: Iterable[CommitPartition], *, retention_ms: int = -1,
                       api_version: int = 9, producer: tuple[int, int] | None = None) -> dict[tuple[str, int], int]:
        return self.offsets.commit_offsets(group_id, generation_id, member_id, group_instance_id, partitions,
                                           retention_ms=retention_ms, api_version=api_version, producer=producer)

    def fetch_offsets(self, group_id: str, topics: list[tuple[str, list[int]]] | None
                      ) -> tuple[int, list[tuple[str, list[tuple[int, OffsetCommitValue | None]]]]]:
        return self.offsets.fetch_offsets(group_id, topics)

    def complete_txn_offsets(self, partition: int, producer_id: int, commit: bool) -> None:
        self.offsets.complete_txn_offsets(partition, producer_id, commit)

    def delete_offsets(self, group_id: str | None, topics: list[tuple[str, list[int]]]
                       ) -> tuple[int, list[tuple[str, list[tuple[int, int]]]]]:
        return self.offsets.delete_offsets(group_id, topics)

    def expire_offsets(self) -> int:
        return self.offsets.expire_offsets()

    def topic_deleted(self, topic: str) -> None:
        self.offsets.topic_deleted(topic)
