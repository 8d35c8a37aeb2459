"""A classic group as the coordinator holds it: its state, members and committed offsets, and the JoinGroup,
SyncGroup and OffsetCommit requests as the state machine takes them (Kafka's ClassicGroup, ClassicGroupMember)."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, Callable

from ....protocol.error_codes import FENCED_INSTANCE_ID, NONE, UNKNOWN_MEMBER_ID
from ..runtime import Timer
from .offset_records import OffsetCommitValue, subscribed_topics

CONSUMER_PROTOCOL_TYPE = "consumer"
CLASSIC_GROUP_TYPE = "classic"  # ListGroups v5 group type: every group here uses the classic protocol

Respond = Callable[[dict[str, Any]], None]  # answers a waiting JoinGroup or SyncGroup


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
        leader = self.members.get(self.leader_id) if self.leader_id is not None else None
        leader = leader or next(iter(self.members.values()))
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

    def subscriptions(self) -> frozenset[str] | None:
        """The union of the members' subscribed topics (consumer protocol only), for offset expiry."""
        if self.protocol_type != CONSUMER_PROTOCOL_TYPE or self.protocol_name is None or not self.members:
            return None
        topics: set[str] = set()
        for m in self.members.values():
            mine = subscribed_topics(m.metadata(self.protocol_name))
            if mine is None:
                return None
            topics |= mine
        return frozenset(topics)


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


def join_error(member_id: str, code: int) -> dict[str, Any]:
    return {"error_code": code, "generation_id": -1, "protocol_type": None, "protocol_name": None, "leader": "",
            "skip_assignment": False, "member_id": member_id, "members": []}


def sync_result(code: int, group: Group | None = None, assignment: bytes = b"") -> dict[str, Any]:
    return {"error_code": code, "protocol_type": group.protocol_type if group and code == NONE else None,
            "protocol_name": group.protocol_name if group and code == NONE else None, "assignment": assignment}


def answer_waiting(member: Member, code: int) -> None:
    """Answer a member's pending JoinGroup/SyncGroup with an error (it is leaving the coordinator's care)."""
    if member.awaiting_join is not None:
        member.awaiting_join(join_error(member.member_id, code))
        member.awaiting_join = None
    if member.awaiting_sync is not None:
        member.awaiting_sync(sync_result(code))
        member.awaiting_sync = None


def cancel_timers(group: Group) -> None:
    """Stop every timer of a group and its members (it leaves this coordinator's care or is removed)."""
    for t in [group.join_timer, group.sync_timer, *group.pending_members.values(),
              *(m.timer for m in group.members.values())]:
        if t is not None:
            t.cancel()
    group.join_timer = group.sync_timer = None
    for m in group.members.values():
        m.timer = None

