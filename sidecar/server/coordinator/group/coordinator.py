"""The consumer-group coordinator (Kafka's classic group protocol) and its `__consumer_offsets` log.

Clients find the coordinator of a group (FindCoordinator), join it (JoinGroup/SyncGroup: the leader's
assignment is handed to every member), keep their membership alive (Heartbeat), leave (LeaveGroup) and
commit/fetch offsets (OffsetCommit/OffsetFetch); admin tools list, describe and delete groups (ListGroups,
DescribeGroups, DeleteGroups) and delete committed offsets (OffsetDelete). The group state machine follows
Kafka's `ClassicGroup` and `GroupMetadataManager`: Empty -> PreparingRebalance -> CompletingRebalance -> Stable, with the
initial rebalance delay, rebalance and session timeouts, MEMBER_ID_REQUIRED, pending-sync expiry and
basic static membership (KIP-345).

Committed offsets and group metadata are appended, in Kafka's record layout (`offset_records`), to the
group's partition of the compacted internal topic `__consumer_offsets` before a commit or an assignment
is acknowledged, and are replayed from those logs at start-up. Offsets of empty groups expire after
`offsets.retention.ms` (tombstones), as in Kafka.

The state machine is synchronous and runs on the event loop; blocking requests (JoinGroup, SyncGroup)
hand it a callback and await a future. Time comes from a `Clock`, so tests drive timeouts with a fake one.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

from ....log.errors import LogError, RecordTooLargeError
from ....log.log import Log
from ....log.records import (
    ControlType,
    Record,
    encode_batch,
    parse_control_key,
)
from ....log.topic_partition import TopicPartition
from ....plural import plural
from ....protocol import codec
from ....protocol.error_codes import (
    COORDINATOR_NOT_AVAILABLE,
    FENCED_INSTANCE_ID,
    GROUP_ID_NOT_FOUND,
    GROUP_SUBSCRIBED_TO_TOPIC,
    ILLEGAL_GENERATION,
    INCONSISTENT_GROUP_PROTOCOL,
    INVALID_COMMIT_OFFSET_SIZE,
    INVALID_GROUP_ID,
    INVALID_SESSION_TIMEOUT,
    KAFKA_STORAGE_ERROR,
    MEMBER_ID_REQUIRED,
    NON_EMPTY_GROUP,
    NONE,
    NOT_COORDINATOR,
    NOT_LEADER_OR_FOLLOWER,
    OFFSET_METADATA_TOO_LARGE,
    REBALANCE_IN_PROGRESS,
    UNKNOWN_MEMBER_ID,
    UNKNOWN_SERVER_ERROR,
    UNKNOWN_TOPIC_OR_PARTITION,
    UNSTABLE_OFFSET_COMMIT,
)
from ....topics.registry import TopicRegistry
from ...apis.authorized_operations import GROUP_OPERATIONS
from ..coordinator_log import declare_internal_topic, loaded_batches
from ..runtime import Clock, LedPartitions, LocalPartitionWriter, LoopClock, PartitionWriter, Timer
from .offset_records import (
    OFFSETS_TOPIC,
    GroupMetadataKey,
    GroupMetadataValue,
    MemberMetadata,
    OffsetCommitKey,
    OffsetCommitValue,
    OffsetRecordError,
    UnknownKey,
    decode_group_metadata_value,
    decode_key,
    decode_offset_commit_value,
    encode_group_metadata_value,
    encode_key,
    encode_offset_commit_value,
    partition_for,
    subscribed_topics,
)

logger = logging.getLogger(__name__)


API_OFFSET_COMMIT, API_OFFSET_FETCH = 8, 9
API_JOIN_GROUP, API_HEARTBEAT, API_LEAVE_GROUP, API_SYNC_GROUP = 11, 12, 13, 14
API_DESCRIBE_GROUPS, API_LIST_GROUPS, API_DELETE_GROUPS, API_OFFSET_DELETE = 15, 16, 42, 47
API_TXN_OFFSET_COMMIT = 28

CONSUMER_PROTOCOL_TYPE = "consumer"
CLASSIC_GROUP_TYPE = "classic"  # ListGroups v5 group type: every group here uses the classic protocol
OFFSETS_SEGMENT_BYTES = 100 * 1024 * 1024  # offsets.topic.segment.bytes
# GroupCoordinatorService.groupMetadataTopicConfigs(): what Kafka gives `__consumer_offsets`.
OFFSETS_TOPIC_CONFIG = {"cleanup.policy": "compact", "compression.type": "producer",
                        "segment.bytes": str(OFFSETS_SEGMENT_BYTES)}

Respond = Callable[[dict], None]


# -- group state --------------------------------------------------------------------------------------------------


class GroupState(enum.Enum):
    EMPTY = "Empty"
    PREPARING_REBALANCE = "PreparingRebalance"
    COMPLETING_REBALANCE = "CompletingRebalance"
    STABLE = "Stable"
    DEAD = "Dead"


@dataclass(eq=False)
class Member:
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    rebalance_timeout_ms: int
    session_timeout_ms: int
    protocol_type: str
    protocols: list[tuple[str, bytes]]
    assignment: bytes = b""
    awaiting_join: Respond | None = None  # the JoinGroup answer, while the member waits for the rebalance
    awaiting_sync: Respond | None = None  # the SyncGroup answer, while the member waits for the leader
    is_new: bool = False  # joined, but no JoinGroup answer yet
    timer: Timer | None = None  # session (or new-member join) timeout

    def metadata(self, protocol: str | None) -> bytes:
        for name, meta in self.protocols:
            if name == protocol:
                return meta
        return b""

    def vote(self, candidates: set[str]) -> str:
        """The member's most preferred protocol among those every member supports."""
        return next(name for name, _ in self.protocols if name in candidates)


@dataclass(eq=False)
class Group:
    group_id: str
    state: GroupState = GroupState.EMPTY
    generation: int = 0
    protocol_type: str | None = None
    protocol_name: str | None = None
    leader_id: str | None = None
    members: dict[str, Member] = field(default_factory=dict)  # in join order: the first is the leader
    static_members: dict[str, str] = field(default_factory=dict)  # group.instance.id -> member id
    pending_members: dict[str, Timer | None] = field(default_factory=dict)  # told MEMBER_ID_REQUIRED
    pending_sync: set[str] = field(default_factory=set)  # joined the generation, not synced yet
    offsets: dict[tuple[str, int], OffsetCommitValue] = field(default_factory=dict)
    current_state_timestamp: int | None = None
    subscribed_topics: frozenset[str] | None = None
    join_timer: Timer | None = None
    initial_delay: bool = False  # the join timer is group.initial.rebalance.delay.ms, not a rebalance timeout
    new_member_added: bool = False
    sync_timer: Timer | None = None

    def rebalance_timeout_ms(self) -> int:
        return max((m.rebalance_timeout_ms for m in self.members.values()), default=0)

    def all_joined(self) -> bool:
        return not self.pending_members and all(m.awaiting_join is not None for m in self.members.values())

    def candidate_protocols(self) -> set[str]:
        names: set[str] | None = None
        for m in self.members.values():
            mine = {n for n, _ in m.protocols}
            names = mine if names is None else names & mine
        return names or set()

    def supports(self, protocol_type: str, protocols: list[tuple[str, bytes]]) -> bool:
        if self.state is GroupState.EMPTY:
            return bool(protocol_type) and bool(protocols)
        candidates = self.candidate_protocols() if self.members else {n for n, _ in protocols}
        return protocol_type == self.protocol_type and any(n in candidates for n, _ in protocols)

    def select_protocol(self) -> str:
        """Each member votes for its preferred common protocol; the most votes win (ties: the leader's order)."""
        candidates = self.candidate_protocols()
        votes: dict[str, int] = {}
        for m in self.members.values():
            name = m.vote(candidates)
            votes[name] = votes.get(name, 0) + 1
        leader = self.members.get(self.leader_id) or next(iter(self.members.values()))
        order = {name: i for i, (name, _) in enumerate(leader.protocols)}
        return max(votes, key=lambda n: (votes[n], -order.get(n, len(order))))

    def subscribed_to(self, topic: str) -> bool:
        """Kafka's isSubscribedToTopic: OffsetDelete refuses the topics a live consumer group reads.

        Without members nothing is subscribed; with members whose subscriptions cannot be read, a consumer
        group counts as subscribed to everything (the safe answer), any other protocol to nothing.
        """
        if not self.members:
            return False
        if self.subscribed_topics is None:
            return self.protocol_type == CONSUMER_PROTOCOL_TYPE
        return topic in self.subscribed_topics

    def member_error(self, member_id: str, group_instance_id: str | None) -> int:
        """Kafka's validateCurrentMember: a fenced static member, or an unknown member id."""
        if group_instance_id is not None:
            current = self.static_members.get(group_instance_id)
            if current is not None and current != member_id:
                return FENCED_INSTANCE_ID
        if member_id not in self.members:
            return UNKNOWN_MEMBER_ID
        return NONE


@dataclass(frozen=True)
class JoinRequest:
    group_id: str
    member_id: str
    group_instance_id: str | None
    protocol_type: str
    protocols: list[tuple[str, bytes]]
    session_timeout_ms: int
    rebalance_timeout_ms: int
    client_id: str = ""
    client_host: str = ""
    require_known_member_id: bool = True  # JoinGroup v4+
    supports_skip_assignment: bool = True  # JoinGroup v9+
    reason: str | None = None


@dataclass(frozen=True)
class SyncRequest:
    group_id: str
    generation_id: int
    member_id: str
    group_instance_id: str | None = None
    protocol_type: str | None = None
    protocol_name: str | None = None
    assignments: dict[str, bytes] = field(default_factory=dict)


@dataclass(frozen=True)
class CommitPartition:
    topic: str
    partition: int
    offset: int
    leader_epoch: int = -1
    metadata: str | None = ""


def _join_error(member_id: str, code: int) -> dict:
    return {"error_code": code, "generation_id": -1, "protocol_type": None, "protocol_name": None, "leader": "",
            "skip_assignment": False, "member_id": member_id, "members": []}


def _sync_result(code: int, group: Group | None = None, assignment: bytes = b"") -> dict:
    return {"error_code": code, "protocol_type": group.protocol_type if group and code == NONE else None,
            "protocol_name": group.protocol_name if group and code == NONE else None, "assignment": assignment}


def _java_length(s: str) -> int:
    """String.length() in Java: UTF-16 code units (offset.metadata.max.bytes is checked against it)."""
    return len(s.encode("utf-16-le", "surrogatepass")) // 2


# -- the coordinator ----------------------------------------------------------------------------------------------


def _answer_waiting(member: Member, code: int) -> None:
    """Answer a member's pending JoinGroup/SyncGroup with an error (it is leaving the coordinator's care)."""
    if member.awaiting_join is not None:
        member.awaiting_join(_join_error(member.member_id, code))
        member.awaiting_join = None
    if member.awaiting_sync is not None:
        member.awaiting_sync(_sync_result(code))
        member.awaiting_sync = None


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
        self.offsets_partitions = offsets_partitions
        self.replication_factor = replication_factor  # offsets.topic.replication.factor, with a control store
        self.initial_rebalance_delay_ms = initial_rebalance_delay_ms
        self.min_session_timeout_ms = min_session_timeout_ms
        self.max_session_timeout_ms = max_session_timeout_ms
        self.offsets_retention_ms = offsets_retention_ms
        self.offsets_retention_check_interval_ms = offsets_retention_check_interval_ms
        self.offset_metadata_max_bytes = offset_metadata_max_bytes
        self.new_member_join_timeout_ms = new_member_join_timeout_ms
        self.clock: Clock = clock or LoopClock()
        # Appends to `__consumer_offsets` (waking its fetches); with a control store OffsetCommit answers only once
        # the ISR has the commit, as Kafka's appends to __consumer_offsets use acks=all.
        self.writer: PartitionWriter = writer or LocalPartitionWriter()
        self.last_append: tuple[TopicPartition, int] | None = None  # partition and last offset of the last append
        self.groups: dict[str, Group] = {}
        # TxnOffsetCommit: producer id -> group -> offsets, visible once that producer's COMMIT marker reaches the
        # group's partition, dropped on ABORT (Kafka's pendingTransactionalOffsetCommits).
        self.pending_txn_offsets: dict[int, dict[str, dict[tuple[str, int], OffsetCommitValue]]] = {}
        # With a control store: the partitions loaded here, each in the leader epoch it was loaded in.
        self.led = LedPartitions(OFFSETS_TOPIC, "group", registry.log_dir.logs, load=self._load_led,
                                 unload=self._unload)
        self.active = False
        self._expiry_timer: Timer | None = None

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

    # -- lifecycle --------------------------------------------------------------------------------------------

    async def start(self) -> None:
        """Declare `__consumer_offsets` and load every group and committed offset from its local partitions."""
        self.offsets_partitions = declare_internal_topic(self.registry, OFFSETS_TOPIC, self.offsets_partitions,
                                                         OFFSETS_TOPIC_CONFIG, "offsets.topic.num.partitions",
                                                         self.replication_factor)
        started = time.monotonic()
        records = 0
        for p in range(self.offsets_partitions):
            log = self.registry.local_log(OFFSETS_TOPIC, p)
            if log is not None:
                records += self._load_partition(log)
        for group in list(self.groups.values()):
            self._finish_loading(group)
        self.active = True
        self._schedule_expiry()
        logger.info("group coordinator loaded %s (%s) from %s in %.0f ms", plural(len(self.groups), "group"),
                    plural(records, "record"), OFFSETS_TOPIC, (time.monotonic() - started) * 1000)

    def close(self) -> None:
        """Stop all timers and answer waiting JoinGroup/SyncGroup requests with NOT_COORDINATOR."""
        self.active = False
        if self._expiry_timer is not None:
            self._expiry_timer.cancel()
            self._expiry_timer = None
        for group in self.groups.values():
            self._cancel_group_timers(group)
            for m in group.members.values():
                _answer_waiting(m, NOT_COORDINATOR)

    def _cancel_group_timers(self, group: Group) -> None:
        for t in [group.join_timer, group.sync_timer, *group.pending_members.values(),
                  *(m.timer for m in group.members.values())]:
            if t is not None:
                t.cancel()
        group.join_timer = group.sync_timer = None
        for m in group.members.values():
            m.timer = None

    def leadership_changed(self, led: dict[int, int]) -> None:
        """With a control store: `led` is {partition: leader epoch} of the `__consumer_offsets` partitions this
        node leads now (`LedPartitions.follow`)."""
        if self.active:
            self.led.follow(led)

    def _unload(self, partition: int) -> int:
        """Forget the groups of a partition no longer led here; their waiting members are answered NOT_COORDINATOR."""
        unloaded = [g for g in self.groups.values() if self.partition_for(g.group_id) == partition]
        for group in unloaded:
            self._cancel_group_timers(group)
            for m in group.members.values():
                _answer_waiting(m, NOT_COORDINATOR)
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
                        self.complete_txn_offsets(log.topic_partition.partition, header.producer_id,
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
                self.pending_txn_offsets.setdefault(producer_id, {}).setdefault(key.group, {})[
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
        group.subscribed_topics = self._subscriptions(group)
        for m in group.members.values():
            self._schedule_session(group, m, m.session_timeout_ms)
        logger.info("loaded group %s: %s, generation %d, %s, %s", group.group_id, group.state.value,
                    group.generation, plural(len(group.members), "member"),
                    plural(len(group.offsets), "committed offset"))

    # -- persistence ------------------------------------------------------------------------------------------

    def partition_for(self, group_id: str) -> int:
        return partition_for(group_id, self.offsets_partitions)

    def _append(self, group_id: str, entries: list[tuple[bytes, bytes | None]],
                now: int | None = None, producer: tuple[int, int] | None = None) -> Exception | None:
        """Append keyed records (timestamp `now`) to the group's partition; the exception if the log refused them.
        With `producer` (id, epoch) the batch is that producer's transactional batch (TxnOffsetCommit)."""
        p = self.partition_for(group_id)
        log = self.registry.local_log(OFFSETS_TOPIC, p)
        if log is None:
            return LogError(f"{OFFSETS_TOPIC}-{p} is not hosted here")
        now = self.clock.now_ms() if now is None else now
        txn = {} if producer is None else {"producer_id": producer[0], "producer_epoch": producer[1],
                                           "is_transactional": True}
        batch = encode_batch([Record(i, now, k, v) for i, (k, v) in enumerate(entries)], **txn)
        try:
            info = self.writer.append(TopicPartition(OFFSETS_TOPIC, p), log, batch)
            self.last_append = (TopicPartition(OFFSETS_TOPIC, p), info.last_offset)
        except Exception as exc:  # noqa: BLE001 - mapped to the error code Kafka would answer
            logger.error("append of %s for group %s to %s-%d failed: %s", plural(len(entries), "record"), group_id,
                         OFFSETS_TOPIC, p, exc)
            return exc
        return None

    @staticmethod
    def _store_error(exc: Exception, *, commit: bool) -> int:
        """Kafka's mapping of append errors: storage -> NOT_COORDINATOR, too large -> 28 (commits)."""
        if isinstance(exc, RecordTooLargeError):
            return INVALID_COMMIT_OFFSET_SIZE if commit else UNKNOWN_SERVER_ERROR
        if isinstance(exc, (LogError, OSError)):
            return NOT_COORDINATOR
        return UNKNOWN_SERVER_ERROR

    def _store_group(self, group: Group, assignments: dict[str, bytes]) -> int:
        """Write the group's metadata record (after a rebalance, as Kafka's storeGroup)."""
        value = GroupMetadataValue(
            protocol_type=group.protocol_type or "",
            generation=group.generation,
            protocol=group.protocol_name,
            leader=group.leader_id,
            current_state_timestamp=group.current_state_timestamp if group.current_state_timestamp is not None else -1,
            members=tuple(MemberMetadata(m.member_id, m.client_id, m.client_host, m.session_timeout_ms,
                                         m.metadata(group.protocol_name), assignments.get(m.member_id, b""),
                                         m.rebalance_timeout_ms, m.group_instance_id)
                          for m in group.members.values()),
        )
        exc = self._append(group.group_id, [(encode_key(GroupMetadataKey(group.group_id)),
                                             encode_group_metadata_value(value))])
        return NONE if exc is None else self._store_error(exc, commit=False)

    # -- validation -------------------------------------------------------------------------------------------

    def coordinates(self, group_id: str) -> bool:
        p = self.partition_for(group_id)
        return (self.registry.leader(OFFSETS_TOPIC, p) == self.registry.node.node_id
                and self.registry.local_log(OFFSETS_TOPIC, p) is not None)

    def _group_error(self, group_id: str | None, *, allow_empty: bool) -> int:
        """Kafka's validateGroupStatus; OffsetCommit/OffsetFetch accept the empty group id, the others do not."""
        if group_id is None or (group_id == "" and not allow_empty):
            return INVALID_GROUP_ID
        if not self.active:
            return COORDINATOR_NOT_AVAILABLE
        if not self.coordinates(group_id):
            return NOT_COORDINATOR
        return NONE

    # -- timers -----------------------------------------------------------------------------------------------

    def _schedule_session(self, group: Group, member: Member, timeout_ms: int) -> None:
        if member.timer is not None:
            member.timer.cancel()
        member.timer = self.clock.call_later(timeout_ms, lambda: self._session_expired(group, member))

    def _session_expired(self, group: Group, member: Member) -> None:
        member.timer = None
        if group.members.get(member.member_id) is not member:
            return
        if not member.is_new and (member.awaiting_join is not None or member.awaiting_sync is not None):
            return  # waiting for the rebalance: the rebalance/sync timeouts govern it
        logger.info("member %s of group %s has failed (no heartbeat within %d ms); removing it", member.member_id,
                    group.group_id, member.session_timeout_ms if not member.is_new else self.new_member_join_timeout_ms)
        self._remove_member_and_update(group, member, "session timeout")

    def _pending_expired(self, group: Group, member_id: str) -> None:
        if member_id not in group.pending_members:
            return
        del group.pending_members[member_id]
        logger.info("pending member %s of group %s did not rejoin in time", member_id, group.group_id)
        self._maybe_complete_join(group)

    # -- membership -------------------------------------------------------------------------------------------

    def _add_member_and_rebalance(self, group: Group, member_id: str, req: JoinRequest, respond: Respond) -> None:
        member = Member(member_id, req.group_instance_id, req.client_id, req.client_host, req.rebalance_timeout_ms,
                        req.session_timeout_ms, req.protocol_type, list(req.protocols), awaiting_join=respond,
                        is_new=True)
        if group.state is GroupState.PREPARING_REBALANCE and group.initial_delay:
            group.new_member_added = True
        if not group.members:
            group.protocol_type = req.protocol_type
        group.members[member_id] = member
        if group.leader_id is None:
            group.leader_id = member_id
        if req.group_instance_id is not None:
            group.static_members[req.group_instance_id] = member_id
        self._schedule_session(group, member, self.new_member_join_timeout_ms)
        logger.info("member %s (client %r%s) joins group %s", member_id, req.client_id,
                    f", instance {req.group_instance_id}" if req.group_instance_id else "", group.group_id)
        self._maybe_prepare_rebalance(group, f"adding new member {member_id}"
                                      + (f" with reason: {req.reason}" if req.reason else ""))

    def _update_member_and_rebalance(self, group: Group, member: Member, req: JoinRequest, respond: Respond) -> None:
        if member.awaiting_join is not None:  # a JoinGroup the client gave up on
            member.awaiting_join(_join_error(member.member_id, REBALANCE_IN_PROGRESS))
        member.protocols = list(req.protocols)
        member.rebalance_timeout_ms = req.rebalance_timeout_ms
        member.session_timeout_ms = req.session_timeout_ms
        member.awaiting_join = respond
        self._maybe_prepare_rebalance(group, f"updating metadata for member {member.member_id}"
                                      + (f" with reason: {req.reason}" if req.reason else ""))

    def _remove_member(self, group: Group, member: Member, reason: str) -> None:
        if member.timer is not None:
            member.timer.cancel()
            member.timer = None
        _answer_waiting(member, UNKNOWN_MEMBER_ID)
        del group.members[member.member_id]
        instance = member.group_instance_id
        if instance is not None and group.static_members.get(instance) == member.member_id:
            del group.static_members[instance]
        group.pending_sync.discard(member.member_id)
        if group.leader_id == member.member_id:
            group.leader_id = next(iter(group.members), None)
        logger.info("member %s left group %s (%s)", member.member_id, group.group_id, reason)

    def _remove_member_and_update(self, group: Group, member: Member, reason: str) -> None:
        self._remove_member(group, member, reason)
        if group.state in (GroupState.STABLE, GroupState.COMPLETING_REBALANCE):
            self._prepare_rebalance(group, f"removing member {member.member_id} on {reason}")
        elif group.state is GroupState.PREPARING_REBALANCE:
            self._maybe_complete_join(group)

    # -- rebalance --------------------------------------------------------------------------------------------

    def _maybe_prepare_rebalance(self, group: Group, reason: str) -> None:
        if group.state in (GroupState.STABLE, GroupState.COMPLETING_REBALANCE, GroupState.EMPTY):
            self._prepare_rebalance(group, reason)
        elif group.state is GroupState.PREPARING_REBALANCE:
            self._maybe_complete_join(group)

    def _prepare_rebalance(self, group: Group, reason: str) -> None:
        if group.state is GroupState.COMPLETING_REBALANCE:
            self._reset_and_propagate_assignment_error(group, REBALANCE_IN_PROGRESS)
        for t in (group.sync_timer, group.join_timer):
            if t is not None:
                t.cancel()
        group.sync_timer = group.join_timer = None
        group.pending_sync.clear()
        initial = group.state is GroupState.EMPTY
        logger.info("preparing to rebalance group %s in state %s with old generation %d (reason: %s)",
                    group.group_id, group.state.value, group.generation, reason)
        group.state = GroupState.PREPARING_REBALANCE
        group.initial_delay = initial
        group.new_member_added = False
        if initial:
            delay = self.initial_rebalance_delay_ms
            remaining = max(group.rebalance_timeout_ms() - delay, 0)
            group.join_timer = self.clock.call_later(
                delay, lambda: self._initial_delay_expired(group, delay, remaining))
        else:
            group.join_timer = self.clock.call_later(group.rebalance_timeout_ms(), lambda: self._complete_join(group))
            self._maybe_complete_join(group)

    def _initial_delay_expired(self, group: Group, delay: int, remaining: int) -> None:
        """group.initial.rebalance.delay.ms: wait again while new members keep arriving, up to the rebalance timeout."""
        group.join_timer = None
        if group.new_member_added and remaining > 0:
            group.new_member_added = False
            next_delay = min(self.initial_rebalance_delay_ms, remaining)
            next_remaining = max(remaining - delay, 0)
            group.join_timer = self.clock.call_later(
                next_delay, lambda: self._initial_delay_expired(group, next_delay, next_remaining))
        else:
            self._complete_join(group)

    def _maybe_complete_join(self, group: Group) -> None:
        if group.state is GroupState.PREPARING_REBALANCE and not group.initial_delay and group.all_joined():
            self._complete_join(group)

    def _complete_join(self, group: Group) -> None:
        if group.join_timer is not None:
            group.join_timer.cancel()
            group.join_timer = None
        group.initial_delay = group.new_member_added = False
        if group.state is not GroupState.PREPARING_REBALANCE:
            return
        for m in [m for m in group.members.values() if m.awaiting_join is None]:
            self._remove_member(group, m, "did not rejoin before the rebalance timeout")
        if group.leader_id not in group.members:
            group.leader_id = next(iter(group.members), None)
        group.generation += 1
        group.current_state_timestamp = self.clock.now_ms()
        if not group.members:
            group.protocol_name = None
            group.subscribed_topics = None
            group.state = GroupState.EMPTY
            logger.info("group %s with generation %d is now empty", group.group_id, group.generation)
            code = self._store_group(group, {})
            if code != NONE:
                logger.warning("failed to write the metadata of empty group %s generation %d: error %d",
                               group.group_id, group.generation, code)
            return
        group.protocol_name = group.select_protocol()
        group.subscribed_topics = self._subscriptions(group)
        group.state = GroupState.COMPLETING_REBALANCE
        logger.info("stabilized group %s generation %d (protocol %s, %s, leader %s)", group.group_id,
                    group.generation, group.protocol_name, plural(len(group.members), "member"), group.leader_id)
        for m in list(group.members.values()):
            respond, m.awaiting_join, m.is_new = m.awaiting_join, None, False
            respond(self._join_result(group, m.member_id))
            self._schedule_session(group, m, m.session_timeout_ms)
        group.pending_sync = set(group.members)
        generation = group.generation
        group.sync_timer = self.clock.call_later(group.rebalance_timeout_ms(),
                                                 lambda: self._sync_expired(group, generation))

    def _join_result(self, group: Group, member_id: str, *, members: bool | None = None,
                     leader: str | None = None, skip_assignment: bool = False) -> dict:
        send_members = group.leader_id == member_id if members is None else members
        return {
            "error_code": NONE, "generation_id": group.generation, "protocol_type": group.protocol_type,
            "protocol_name": group.protocol_name, "leader": group.leader_id if leader is None else leader,
            "skip_assignment": skip_assignment, "member_id": member_id,
            "members": [{"member_id": m.member_id, "group_instance_id": m.group_instance_id,
                         "metadata": m.metadata(group.protocol_name)} for m in group.members.values()]
            if send_members else [],
        }

    def _sync_expired(self, group: Group, generation: int) -> None:
        group.sync_timer = None
        if generation != group.generation or not group.pending_sync or group.state not in (
                GroupState.COMPLETING_REBALANCE, GroupState.STABLE):
            return
        late = sorted(group.pending_sync)
        for member_id in late:
            member = group.members.get(member_id)
            if member is not None:
                self._remove_member(group, member, "no SyncGroup before the rebalance timeout")
        group.pending_sync.clear()
        self._prepare_rebalance(group, f"members {', '.join(late)} did not sync in time")

    def _reset_and_propagate_assignment_error(self, group: Group, code: int) -> None:
        for m in group.members.values():
            m.assignment = b""
            if m.awaiting_sync is not None:
                m.awaiting_sync(_sync_result(code))
                m.awaiting_sync = None

    def _subscriptions(self, group: Group) -> frozenset[str] | None:
        """The union of the members' subscribed topics (consumer protocol only), for offset expiry."""
        if group.protocol_type != CONSUMER_PROTOCOL_TYPE or group.protocol_name is None or not group.members:
            return None
        topics: set[str] = set()
        for m in group.members.values():
            mine = subscribed_topics(m.metadata(group.protocol_name))
            if mine is None:
                return None
            topics |= mine
        return frozenset(topics)

    # -- JoinGroup --------------------------------------------------------------------------------------------

    def join_group(self, req: JoinRequest, respond: Respond) -> None:
        """Handle a JoinGroup; `respond` is called now or when the rebalance completes."""
        code = self._group_error(req.group_id, allow_empty=False)
        if code == NONE and not self.min_session_timeout_ms <= req.session_timeout_ms <= self.max_session_timeout_ms:
            code = INVALID_SESSION_TIMEOUT
        group = self.groups.get(req.group_id)
        if code == NONE and group is None:
            if req.member_id:
                code = UNKNOWN_MEMBER_ID
            else:
                group = self.groups[req.group_id] = Group(req.group_id)
        if code != NONE:
            respond(_join_error(req.member_id, code))
            return
        if group.state is GroupState.DEAD:
            respond(_join_error(req.member_id, COORDINATOR_NOT_AVAILABLE))
        elif not group.supports(req.protocol_type, req.protocols):
            respond(_join_error(req.member_id, INCONSISTENT_GROUP_PROTOCOL))
        elif not req.member_id:
            self._join_new_member(group, req, respond)
        else:
            self._join_known_member(group, req, respond)

    def _join_new_member(self, group: Group, req: JoinRequest, respond: Respond) -> None:
        member_id = f"{req.group_instance_id or req.client_id}-{uuid.uuid4()}"
        if req.group_instance_id is not None:
            self._join_static_member(group, member_id, req, respond)
        elif req.require_known_member_id:
            # KIP-394: hand out the id first, so a client that never comes back leaves no member behind.
            group.pending_members[member_id] = self.clock.call_later(
                req.session_timeout_ms, lambda: self._pending_expired(group, member_id))
            respond(_join_error(member_id, MEMBER_ID_REQUIRED))
        else:
            self._add_member_and_rebalance(group, member_id, req, respond)

    def _join_known_member(self, group: Group, req: JoinRequest, respond: Respond) -> None:
        if req.member_id in group.pending_members:
            timer = group.pending_members.pop(req.member_id)
            if timer is not None:
                timer.cancel()
            self._add_member_and_rebalance(group, req.member_id, req, respond)
            return
        code = group.member_error(req.member_id, req.group_instance_id)
        if code != NONE or group.state is GroupState.EMPTY:
            respond(_join_error(req.member_id, code or UNKNOWN_MEMBER_ID))
            return
        member = group.members[req.member_id]
        unchanged = member.protocols == list(req.protocols)
        if group.state is GroupState.PREPARING_REBALANCE:
            self._update_member_and_rebalance(group, member, req, respond)
        elif group.state is GroupState.COMPLETING_REBALANCE and unchanged:
            respond(self._join_result(group, member.member_id))  # a JoinGroup retried after a lost answer
        elif group.state is GroupState.STABLE and unchanged and group.leader_id != member.member_id:
            self._schedule_session(group, member, member.session_timeout_ms)
            respond(self._join_result(group, member.member_id))
        else:
            self._update_member_and_rebalance(group, member, req, respond)

    def _join_static_member(self, group: Group, new_id: str, req: JoinRequest, respond: Respond) -> None:
        """A static member (group.instance.id) joining without member id: new, or a restart that takes over."""
        old_id = group.static_members.get(req.group_instance_id)
        if old_id is None or old_id not in group.members:
            self._add_member_and_rebalance(group, new_id, req, respond)
            return
        member = group.members[old_id]
        old_leader, old_protocols = group.leader_id, member.protocols
        old_timeouts = (member.rebalance_timeout_ms, member.session_timeout_ms)
        self._replace_member_id(group, member, new_id)
        member.protocols = list(req.protocols)
        member.rebalance_timeout_ms, member.session_timeout_ms = req.rebalance_timeout_ms, req.session_timeout_ms
        member.client_id, member.client_host = req.client_id, req.client_host
        logger.info("static member %s of group %s rejoined: member id %s replaces %s", req.group_instance_id,
                    group.group_id, new_id, old_id)
        if group.state is GroupState.STABLE and group.select_protocol() == group.protocol_name:
            # Same protocol: keep the assignment, no rebalance; persist the new member id.
            self._schedule_session(group, member, member.session_timeout_ms)
            code = self._store_group(group, {m.member_id: m.assignment for m in group.members.values()})
            if code != NONE:
                self._replace_member_id(group, member, old_id)
                member.protocols = old_protocols
                member.rebalance_timeout_ms, member.session_timeout_ms = old_timeouts
                respond(_join_error("", code))
            elif req.supports_skip_assignment:
                is_leader = group.leader_id == new_id
                respond(self._join_result(group, new_id, members=is_leader, skip_assignment=is_leader))
            else:  # before v9 the old leader id keeps a restarted static leader from reassigning
                respond(self._join_result(group, new_id, members=False, leader=old_leader))
            return
        member.awaiting_join = respond
        if group.state is GroupState.PREPARING_REBALANCE:
            self._maybe_complete_join(group)
        else:  # CompletingRebalance (the leader may have assigned to the old id) or a changed protocol
            self._prepare_rebalance(group, f"static member {req.group_instance_id} rejoined as {new_id}")

    def _replace_member_id(self, group: Group, member: Member, new_id: str) -> None:
        old_id = member.member_id
        if member.awaiting_join is not None:
            member.awaiting_join(_join_error(old_id, FENCED_INSTANCE_ID))
            member.awaiting_join = None
        if member.awaiting_sync is not None:
            member.awaiting_sync(_sync_result(FENCED_INSTANCE_ID))
            member.awaiting_sync = None
        del group.members[old_id]
        member.member_id = new_id
        group.members[new_id] = member
        if member.group_instance_id is not None:
            group.static_members[member.group_instance_id] = new_id
        if group.leader_id == old_id:
            group.leader_id = new_id
        if old_id in group.pending_sync:
            group.pending_sync.discard(old_id)
            group.pending_sync.add(new_id)

    # -- SyncGroup --------------------------------------------------------------------------------------------

    def sync_group(self, req: SyncRequest, respond: Respond) -> None:
        """Handle a SyncGroup; `respond` is called now or when the leader's assignment arrives."""
        code = self._group_error(req.group_id, allow_empty=False)
        group = self.groups.get(req.group_id)
        if code == NONE:
            if group is None:
                code = UNKNOWN_MEMBER_ID
            elif group.state is GroupState.DEAD:
                code = COORDINATOR_NOT_AVAILABLE
            else:
                code = group.member_error(req.member_id, req.group_instance_id)
        if code == NONE:
            if req.generation_id != group.generation:
                code = ILLEGAL_GENERATION
            elif (req.protocol_type is not None and req.protocol_type != group.protocol_type) or (
                    req.protocol_name is not None and req.protocol_name != group.protocol_name):
                code = INCONSISTENT_GROUP_PROTOCOL
            elif group.state is GroupState.EMPTY:
                code = UNKNOWN_MEMBER_ID
            elif group.state is GroupState.PREPARING_REBALANCE:
                code = REBALANCE_IN_PROGRESS
        if code != NONE:
            respond(_sync_result(code))
            return
        member = group.members[req.member_id]
        group.pending_sync.discard(member.member_id)
        if group.state is GroupState.STABLE:
            self._schedule_session(group, member, member.session_timeout_ms)
            respond(_sync_result(NONE, group, member.assignment))
            return
        member.awaiting_sync = respond  # CompletingRebalance
        if member.member_id != group.leader_id:
            return
        assignments = {mid: req.assignments.get(mid, b"") for mid in group.members}
        code = self._store_group(group, assignments)
        if code != NONE:
            self._reset_and_propagate_assignment_error(group, code)
            self._maybe_prepare_rebalance(group, f"failed to store the assignment of generation {group.generation}")
            return
        for m in group.members.values():
            m.assignment = assignments[m.member_id]
            if m.awaiting_sync is not None:
                m.awaiting_sync(_sync_result(NONE, group, m.assignment))
                m.awaiting_sync = None
                self._schedule_session(group, m, m.session_timeout_ms)
        group.state = GroupState.STABLE
        logger.info("assignment received from leader %s for group %s generation %d", member.member_id,
                    group.group_id, group.generation)

    # -- Heartbeat / LeaveGroup -------------------------------------------------------------------------------

    def heartbeat(self, group_id: str, generation_id: int, member_id: str, group_instance_id: str | None = None) -> int:
        code = self._group_error(group_id, allow_empty=False)
        if code != NONE:
            return code
        group = self.groups.get(group_id)
        if group is None:
            return UNKNOWN_MEMBER_ID
        if group.state is GroupState.DEAD:
            return COORDINATOR_NOT_AVAILABLE
        code = group.member_error(member_id, group_instance_id)
        if code != NONE:
            return code
        if generation_id != group.generation:
            return ILLEGAL_GENERATION
        if group.state is GroupState.EMPTY:
            return UNKNOWN_MEMBER_ID
        member = group.members[member_id]
        self._schedule_session(group, member, member.session_timeout_ms)
        return REBALANCE_IN_PROGRESS if group.state is GroupState.PREPARING_REBALANCE else NONE

    def leave_group(self, group_id: str, leaving: list[tuple[str, str | None]]) -> tuple[int, list[int]]:
        """Remove members given as (member id, group instance id); the top-level and per-member error codes."""
        code = self._group_error(group_id, allow_empty=False)
        if code != NONE:
            return code, []
        group = self.groups.get(group_id)
        if group is None:
            return NONE, [UNKNOWN_MEMBER_ID] * len(leaving)
        if group.state is GroupState.DEAD:
            return COORDINATOR_NOT_AVAILABLE, []
        errors = []
        for member_id, instance_id in leaving:
            if not member_id:  # an admin removing a static member by instance id
                current = group.static_members.get(instance_id) if instance_id is not None else None
                if current is None or current not in group.members:
                    errors.append(UNKNOWN_MEMBER_ID)
                    continue
                member_id = current
            elif member_id in group.pending_members:
                timer = group.pending_members.pop(member_id)
                if timer is not None:
                    timer.cancel()
                self._maybe_complete_join(group)
                errors.append(NONE)
                continue
            else:
                code = group.member_error(member_id, instance_id)
                if code != NONE:
                    errors.append(code)
                    continue
            self._remove_member_and_update(group, group.members[member_id], "the member left the group (LeaveGroup)")
            errors.append(NONE)
        return NONE, errors

    # -- offsets ----------------------------------------------------------------------------------------------

    def _commit_error(self, group: Group, generation_id: int, member_id: str, instance_id: str | None) -> int:
        """Kafka's ClassicGroup.validateOffsetCommit."""
        if group.state is GroupState.DEAD:
            return COORDINATOR_NOT_AVAILABLE
        if generation_id < 0 and group.state is GroupState.EMPTY:
            return NONE  # a standalone (simple) consumer's commit
        if generation_id >= 0 or member_id or instance_id is not None:
            code = group.member_error(member_id, instance_id)
            if code != NONE:
                return code
            if generation_id != group.generation:
                return ILLEGAL_GENERATION
        elif group.state is not GroupState.EMPTY:
            return UNKNOWN_MEMBER_ID  # no member id: only allowed while the group has no members
        if group.state is GroupState.COMPLETING_REBALANCE:
            return REBALANCE_IN_PROGRESS
        return NONE

    def commit_offsets(self, group_id: str, generation_id: int, member_id: str, group_instance_id: str | None,
                       partitions: Iterable[CommitPartition], *, retention_ms: int = -1,
                       api_version: int = 9, producer: tuple[int, int] | None = None) -> dict[tuple[str, int], int]:
        """Validate and persist a commit; the error code of each (topic, partition). A transactional commit
        (`producer`: id, epoch) stays pending until its transaction ends (`complete_txn_offsets`)."""
        partitions = list(partitions)
        code = self._group_error(group_id, allow_empty=True)
        group = self.groups.get(group_id)
        if code == NONE and group is None:
            if generation_id >= 0:
                code = GROUP_ID_NOT_FOUND if api_version >= 9 else ILLEGAL_GENERATION
            else:
                group = Group(group_id)  # kept only if the commit is stored
        elif code == NONE:
            code = self._commit_error(group, generation_id, member_id, group_instance_id)
        if code != NONE:
            return {(p.topic, p.partition): code for p in partitions}
        member = group.members.get(member_id)
        if member is not None:
            self._schedule_session(group, member, member.session_timeout_ms)  # a commit is as good as a heartbeat
        now = self.clock.now_ms()
        results: dict[tuple[str, int], int] = {}
        values: dict[tuple[str, int], OffsetCommitValue] = {}
        for p in partitions:
            tp = (p.topic, p.partition)
            if self.registry.leader(p.topic, p.partition) is None:
                results[tp] = UNKNOWN_TOPIC_OR_PARTITION
                continue
            metadata = p.metadata or ""
            if _java_length(metadata) > self.offset_metadata_max_bytes:
                results[tp] = OFFSET_METADATA_TOO_LARGE
                continue
            values[tp] = OffsetCommitValue(p.offset, metadata, now, p.leader_epoch,
                                           now + retention_ms if retention_ms >= 0 else -1)
            results[tp] = NONE
        if values:
            exc = self._append(group_id, [(encode_key(OffsetCommitKey(group_id, t, p)), encode_offset_commit_value(v))
                                          for (t, p), v in values.items()], now, producer)
            if exc is not None:
                code = getattr(exc, "error_code", None) if producer is not None else None  # a fenced epoch: 47
                code = code if code is not None else self._store_error(exc, commit=True)
                for tp in values:
                    results[tp] = code
            elif producer is not None:
                self.pending_txn_offsets.setdefault(producer[0], {}).setdefault(group_id, {}).update(values)
            else:
                self.groups.setdefault(group_id, group).offsets.update(values)
        return results

    def complete_txn_offsets(self, partition: int, producer_id: int, commit: bool) -> None:
        """A COMMIT/ABORT marker of `producer_id` reached `__consumer_offsets` partition `partition`: its pending
        offsets of the groups there become committed, or are dropped (Kafka's completePendingTxnOffsetCommit)."""
        by_group = self.pending_txn_offsets.get(producer_id, {})
        for group_id in [g for g in by_group if self.partition_for(g) == partition]:
            offsets = by_group.pop(group_id)
            if commit:
                self.groups.setdefault(group_id, Group(group_id)).offsets.update(offsets)
        if not by_group:
            self.pending_txn_offsets.pop(producer_id, None)

    def fetch_offsets(self, group_id: str, topics: list[tuple[str, list[int]]] | None
                      ) -> tuple[int, list[tuple[str, list[tuple[int, OffsetCommitValue | None]]]]]:
        """Committed offsets of the given partitions (None = every partition the group committed)."""
        code = self._group_error(group_id, allow_empty=True)
        if code != NONE:
            return code, []
        group = self.groups.get(group_id)
        offsets = group.offsets if group is not None else {}
        if topics is None:
            by_topic: dict[str, list[tuple[int, OffsetCommitValue | None]]] = {}
            for (topic, partition), value in sorted(offsets.items()):
                by_topic.setdefault(topic, []).append((partition, value))
            return NONE, list(by_topic.items())
        return NONE, [(topic, [(p, offsets.get((topic, p))) for p in parts]) for topic, parts in topics]

    # -- offset expiry ----------------------------------------------------------------------------------------

    def _schedule_expiry(self) -> None:
        self._expiry_timer = self.clock.call_later(self.offsets_retention_check_interval_ms, self._expiry_tick)

    def _expiry_tick(self) -> None:
        self._expiry_timer = None
        if not self.active:
            return
        try:
            self.expire_offsets()
        finally:
            self._schedule_expiry()

    def _expired(self, group: Group, now: int) -> list[tuple[str, int]]:
        """Kafka's GroupMetadata.removeExpiredOffsets: which offsets are past offsets.retention.ms."""
        emptied_at: int | None = None  # an empty group's offsets age from when it emptied, others' from their commit
        if group.protocol_type is not None and group.state is GroupState.EMPTY:
            candidates = group.offsets.items()
            emptied_at = group.current_state_timestamp
        elif (group.protocol_type == CONSUMER_PROTOCOL_TYPE and group.state is GroupState.STABLE
              and group.subscribed_topics is not None):
            candidates = [(tp, v) for tp, v in group.offsets.items() if tp[0] not in group.subscribed_topics]
        elif group.protocol_type is None:
            candidates = group.offsets.items()
        else:
            return []
        retention = self.offsets_retention_ms
        return [tp for tp, v in candidates
                if (now >= v.expire_timestamp if v.expire_timestamp >= 0
                    else now - (v.commit_timestamp if emptied_at is None else emptied_at) >= retention)]

    def expire_offsets(self) -> int:
        """Delete expired offsets and dead empty groups (tombstones); returns the number of offsets removed."""
        now = self.clock.now_ms()
        removed = 0
        for group in list(self.groups.values()):
            expired = self._expired(group, now)
            dead = (group.state is GroupState.EMPTY and len(expired) == len(group.offsets)
                    and not group.pending_members)
            tombstones = self._tombstones(group.group_id, expired)
            if dead and group.generation > 0:
                tombstones.append((encode_key(GroupMetadataKey(group.group_id)), None))
            if tombstones and self._append(group.group_id, tombstones, now) is not None:
                continue  # logged; tried again at the next check
            for tp in expired:
                del group.offsets[tp]
            removed += len(expired)
            if expired:
                logger.info("removed %s of group %s", plural(len(expired), "expired offset"), group.group_id)
            if dead:
                self._remove_group(group)
                logger.info("group %s is empty with no offsets left; removed", group.group_id)
        return removed

    def _remove_group(self, group: Group) -> None:
        """Forget a group whose tombstones are written: Dead, no timers left."""
        self._cancel_group_timers(group)
        group.state = GroupState.DEAD
        del self.groups[group.group_id]

    @staticmethod
    def _tombstones(group_id: str, partitions: Iterable[tuple[str, int]]) -> list[tuple[bytes, bytes | None]]:
        return [(encode_key(OffsetCommitKey(group_id, topic, p)), None) for topic, p in partitions]

    def topic_deleted(self, topic: str) -> None:
        """Kafka's onPartitionsDeleted: a deleted topic's committed offsets go from every group (tombstones).

        A topic created again under the same name then starts without the old offsets, and lag tools stop
        showing a topic that is gone.
        """
        if not self.active:
            return
        for group in list(self.groups.values()):
            doomed = [tp for tp in group.offsets if tp[0] == topic]
            if not doomed or self._append(group.group_id, self._tombstones(group.group_id, doomed)) is not None:
                continue  # a failed append is logged; the offsets stay until the next deletion or expiry
            for tp in doomed:
                del group.offsets[tp]
            logger.info("removed %s of deleted topic %s from group %s", plural(len(doomed), "committed offset"),
                        topic, group.group_id)

    # -- ListGroups, DescribeGroups, DeleteGroups, OffsetDelete -----------------------------------------------

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
        code = self._group_error(group_id, allow_empty=True)
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
            code = self._group_error(group_id, allow_empty=True)
            group = self.groups.get(group_id) if code == NONE else None
            if code == NONE and group is None:
                code = GROUP_ID_NOT_FOUND
            elif group is not None and group.state is not GroupState.EMPTY:
                code = NON_EMPTY_GROUP
            elif group is not None:
                offsets = len(group.offsets)
                exc = self._append(group.group_id, [*self._tombstones(group.group_id, group.offsets),
                                                    (encode_key(GroupMetadataKey(group.group_id)), None)])
                if exc is not None:
                    code = self._store_error(exc, commit=False)
                else:
                    self._remove_group(group)
                    logger.info("group %s deleted with its %s", group_id, plural(offsets, "committed offset"))
            results.append((group_id, code))
        return results

    def delete_offsets(self, group_id: str | None, topics: list[tuple[str, list[int]]]
                       ) -> tuple[int, list[tuple[str, list[tuple[int, int]]]]]:
        """Kafka's OffsetDelete: the group's error code, or the error code of each requested partition."""
        code = INVALID_GROUP_ID if not group_id else self._group_error(group_id, allow_empty=False)
        group = self.groups.get(group_id) if code == NONE else None
        if code == NONE and group is None:
            code = GROUP_ID_NOT_FOUND
        elif (group is not None and group.state is not GroupState.EMPTY
              and group.protocol_type != CONSUMER_PROTOCOL_TYPE):
            code = NON_EMPTY_GROUP
        if code != NONE:
            return code, []
        results: list[tuple[str, list[tuple[int, int]]]] = []
        doomed: list[tuple[str, int]] = []
        for topic, partitions in topics:
            codes = []
            for p in partitions:
                if self.registry.leader(topic, p) is None:
                    codes.append((p, UNKNOWN_TOPIC_OR_PARTITION))
                elif group.subscribed_to(topic):
                    codes.append((p, GROUP_SUBSCRIBED_TO_TOPIC))
                else:
                    codes.append((p, NONE))
                    if (topic, p) in group.offsets:
                        doomed.append((topic, p))
            results.append((topic, codes))
        if doomed:
            exc = self._append(group.group_id, self._tombstones(group.group_id, doomed))
            if exc is not None:
                return self._store_error(exc, commit=False), []
            for tp in doomed:
                del group.offsets[tp]
            logger.info("deleted %s of group %s", plural(len(doomed), "committed offset"), group_id)
        return NONE, results

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

    # -- wire handlers ----------------------------------------------------------------------------------------

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
        result = await self._wait(lambda respond: self.join_group(req, respond))
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
        result = await self._wait(lambda respond: self.sync_group(req, respond))
        return {"throttle_time_ms": 0, **result}

    async def _handle_heartbeat(self, request: codec.Request, conn) -> dict:
        v, b = request.api_version, request.body
        code = self.heartbeat(b.group_id, b.generation_id, b.member_id, b.group_instance_id if v >= 3 else None)
        return {"throttle_time_ms": 0, "error_code": code}

    async def _handle_leave_group(self, request: codec.Request, conn) -> dict:
        v, b = request.api_version, request.body
        if v < 3:
            code, errors = self.leave_group(b.group_id, [(b.member_id, None)])
            return {"throttle_time_ms": 0, "error_code": code or next((e for e in errors if e != NONE), NONE)}
        leaving = [(m.member_id, m.group_instance_id) for m in b.members]
        code, errors = self.leave_group(b.group_id, leaving)
        members = [] if code != NONE else [
            {"member_id": mid, "group_instance_id": iid, "error_code": e} for (mid, iid), e in zip(leaving, errors)]
        return {"throttle_time_ms": 0, "error_code": code, "members": members}

    async def _handle_offset_commit(self, request: codec.Request, conn) -> dict:
        v, b = request.api_version, request.body
        partitions = [CommitPartition(t.name, p.partition_index, p.committed_offset,
                                      p.committed_leader_epoch if v >= 6 else -1, p.committed_metadata)
                      for t in b.topics for p in t.partitions]
        retention = b.retention_time_ms if 2 <= v <= 4 else -1
        self.last_append = None
        results = self.commit_offsets(b.group_id, b.generation_id_or_member_epoch, b.member_id or "",
                                      b.group_instance_id if v >= 7 else None, partitions,
                                      retention_ms=retention, api_version=v)
        appended = self.last_append
        if appended is not None:
            code = await self.writer.replicated(*appended)
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
        results = self.commit_offsets(b.group_id, b.generation_id if v >= 3 else -1,
                                      (b.member_id or "") if v >= 3 else "",
                                      b.group_instance_id if v >= 3 else None, partitions,
                                      producer=(b.producer_id, b.producer_epoch))
        return {"throttle_time_ms": 0, "topics": [
            {"name": t.name, "partitions": [{"partition_index": p.partition_index,
                                             "error_code": results[(t.name, p.partition_index)]}
                                            for p in t.partitions]} for t in b.topics]}

    def has_pending_txn_offsets(self, group_id: str, tp: tuple[str, int]) -> bool:
        """Kafka's GroupMetadata.hasPendingOffsetCommitsForTopicPartition (transactional ones: ours are the only
        commits that stay pending): an open transaction has committed an offset of `tp` for the group."""
        return any(tp in by_group.get(group_id, ()) for by_group in self.pending_txn_offsets.values())

    def _fetch_topics(self, group_id: str, topics, v: int, per_partition_error: bool,
                      require_stable: bool = False) -> tuple[int, list[dict]]:
        """OffsetFetch of one group; with `require_stable` (v7+) a partition asked for by name whose offset an
        open transaction has committed answers UNSTABLE_OFFSET_COMMIT (Kafka's getOffsets), which clients retry
        until the transaction ends."""
        wanted = None if topics is None else [(t.name, list(t.partition_indexes)) for t in topics]
        code, found = self.fetch_offsets(group_id, wanted)
        if code != NONE:
            if not per_partition_error:
                return code, []
            found = [(name, [(p, None) for p in parts]) for name, parts in (wanted or [])]
        unstable = {(name, p) for name, parts in found for p, _ in parts
                    if require_stable and wanted is not None and self.has_pending_txn_offsets(group_id, (name, p))}
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
        code, groups = self.list_groups(b.states_filter if v >= 4 else (), b.types_filter if v >= 5 else ())
        return {"throttle_time_ms": 0, "error_code": code,
                "groups": [{"group_id": g.group_id, "protocol_type": g.protocol_type or "",
                            "group_state": g.state.value, "group_type": CLASSIC_GROUP_TYPE} for g in groups]}

    async def _handle_describe_groups(self, request: codec.Request, conn) -> dict:
        v, b = request.api_version, request.body
        groups = [self.describe_group(group_id, v) for group_id in b.groups]
        if v >= 3 and b.include_authorized_operations:
            for g in groups:
                if g["error_code"] == NONE:
                    g["authorized_operations"] = GROUP_OPERATIONS
        return {"throttle_time_ms": 0, "groups": groups}

    async def _handle_delete_groups(self, request: codec.Request, conn) -> dict:
        results = self.delete_groups(request.body.groups_names)
        for group_id, code in results:
            if code != NONE:
                logger.info("DeleteGroups from client %r at %s refused for group %s with error %d", conn.client_id,
                            conn.host, group_id, code)
        return {"throttle_time_ms": 0, "results": [{"group_id": g, "error_code": c} for g, c in results]}

    async def _handle_offset_delete(self, request: codec.Request, conn) -> dict:
        b = request.body
        code, topics = self.delete_offsets(b.group_id, [(t.name, [p.partition_index for p in t.partitions])
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
