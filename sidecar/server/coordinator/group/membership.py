"""Group membership, Kafka's classic protocol: JoinGroup, SyncGroup, Heartbeat and LeaveGroup, the rebalance
they drive (Empty -> PreparingRebalance -> CompletingRebalance -> Stable) and the session, join and sync timers.

The initial rebalance delay, rebalance and session timeouts, MEMBER_ID_REQUIRED (KIP-394), pending-sync expiry and
basic static membership (KIP-345) follow Kafka's `ClassicGroup` and `GroupMetadataManager`. The state machine is
synchronous and runs on the event loop; JoinGroup and SyncGroup hand it a callback (`Respond`) it calls now or when
the rebalance completes."""

from __future__ import annotations

import logging
import uuid
from typing import Callable

from ....plural import plural
from ....protocol.error_codes import (
    COORDINATOR_NOT_AVAILABLE,
    FENCED_INSTANCE_ID,
    ILLEGAL_GENERATION,
    INCONSISTENT_GROUP_PROTOCOL,
    INVALID_SESSION_TIMEOUT,
    MEMBER_ID_REQUIRED,
    NONE,
    REBALANCE_IN_PROGRESS,
    UNKNOWN_MEMBER_ID,
)
from ..runtime import Clock
from .group_log import GroupLog
from .model import (
    Group,
    GroupState,
    JoinRequest,
    Member,
    Respond,
    SyncRequest,
    answer_waiting,
    cancel_timers,
    join_error,
    sync_result,
)

logger = logging.getLogger(__name__)


class Membership:
    """The members of every group loaded here, and their rebalances."""

    def __init__(self, groups: dict[str, Group], log: GroupLog, clock: Clock, check: Callable[..., int], *,
                 initial_rebalance_delay_ms: int, min_session_timeout_ms: int, max_session_timeout_ms: int,
                 new_member_join_timeout_ms: int) -> None:
        self.groups = groups  # the coordinator's
        self.log = log  # a group's metadata is stored after each rebalance
        self.clock = clock
        self.check = check  # the coordinator's group_error: is the group id valid and coordinated here
        self.initial_rebalance_delay_ms = initial_rebalance_delay_ms
        self.min_session_timeout_ms = min_session_timeout_ms
        self.max_session_timeout_ms = max_session_timeout_ms
        self.new_member_join_timeout_ms = new_member_join_timeout_ms

    # -- timers -----------------------------------------------------------------------------------------------------

    def schedule_session(self, group: Group, member: Member, timeout_ms: int) -> None:
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

    # -- membership -------------------------------------------------------------------------------------------------

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
        self.schedule_session(group, member, self.new_member_join_timeout_ms)
        logger.info("member %s (client %r%s) joins group %s", member_id, req.client_id,
                    f", instance {req.group_instance_id}" if req.group_instance_id else "", group.group_id)
        self._maybe_prepare_rebalance(group, f"adding new member {member_id}"
                                      + (f" with reason: {req.reason}" if req.reason else ""))

    def _update_member_and_rebalance(self, group: Group, member: Member, req: JoinRequest, respond: Respond) -> None:
        if member.awaiting_join is not None:  # a JoinGroup the client gave up on
            member.awaiting_join(join_error(member.member_id, REBALANCE_IN_PROGRESS))
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
        answer_waiting(member, UNKNOWN_MEMBER_ID)
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

    # -- rebalance --------------------------------------------------------------------------------------------------

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
            code = self.log.store_group(group, {})
            if code != NONE:
                logger.warning("failed to write the metadata of empty group %s generation %d: error %d",
                               group.group_id, group.generation, code)
            return
        group.protocol_name = group.select_protocol()
        group.subscribed_topics = group.subscriptions()
        group.state = GroupState.COMPLETING_REBALANCE
        logger.info("stabilized group %s generation %d (protocol %s, %s, leader %s)", group.group_id,
                    group.generation, group.protocol_name, plural(len(group.members), "member"), group.leader_id)
        for m in list(group.members.values()):
            respond, m.awaiting_join, m.is_new = m.awaiting_join, None, False
            respond(self._join_result(group, m.member_id))
            self.schedule_session(group, m, m.session_timeout_ms)
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
                m.awaiting_sync(sync_result(code))
                m.awaiting_sync = None

    # -- JoinGroup --------------------------------------------------------------------------------------------------

    def join_group(self, req: JoinRequest, respond: Respond) -> None:
        """Handle a JoinGroup; `respond` is called now or when the rebalance completes."""
        code = self.check(req.group_id, allow_empty=False)
        if code == NONE and not self.min_session_timeout_ms <= req.session_timeout_ms <= self.max_session_timeout_ms:
            code = INVALID_SESSION_TIMEOUT
        group = self.groups.get(req.group_id)
        if code == NONE and group is None:
            if req.member_id:
                code = UNKNOWN_MEMBER_ID
            else:
                group = self.groups[req.group_id] = Group(req.group_id)
        if code != NONE:
            respond(join_error(req.member_id, code))
            return
        if group.state is GroupState.DEAD:
            respond(join_error(req.member_id, COORDINATOR_NOT_AVAILABLE))
        elif not group.supports(req.protocol_type, req.protocols):
            respond(join_error(req.member_id, INCONSISTENT_GROUP_PROTOCOL))
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
            respond(join_error(member_id, MEMBER_ID_REQUIRED))
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
            respond(join_error(req.member_id, code or UNKNOWN_MEMBER_ID))
            return
        member = group.members[req.member_id]
        unchanged = member.protocols == list(req.protocols)
        if group.state is GroupState.PREPARING_REBALANCE:
            self._update_member_and_rebalance(group, member, req, respond)
        elif group.state is GroupState.COMPLETING_REBALANCE and unchanged:
            respond(self._join_result(group, member.member_id))  # a JoinGroup retried after a lost answer
        elif group.state is GroupState.STABLE and unchanged and group.leader_id != member.member_id:
            self.schedule_session(group, member, member.session_timeout_ms)
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
            self.schedule_session(group, member, member.session_timeout_ms)
            code = self.log.store_group(group, {m.member_id: m.assignment for m in group.members.values()})
            if code != NONE:
                self._replace_member_id(group, member, old_id)
                member.protocols = old_protocols
                member.rebalance_timeout_ms, member.session_timeout_ms = old_timeouts
                respond(join_error("", code))
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
            member.awaiting_join(join_error(old_id, FENCED_INSTANCE_ID))
            member.awaiting_join = None
        if member.awaiting_sync is not None:
            member.awaiting_sync(sync_result(FENCED_INSTANCE_ID))
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

    # -- SyncGroup --------------------------------------------------------------------------------------------------

    def sync_group(self, req: SyncRequest, respond: Respond) -> None:
        """Handle a SyncGroup; `respond` is called now or when the leader's assignment arrives."""
        code = self.check(req.group_id, allow_empty=False)
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
            respond(sync_result(code))
            return
        member = group.members[req.member_id]
        group.pending_sync.discard(member.member_id)
        if group.state is GroupState.STABLE:
            self.schedule_session(group, member, member.session_timeout_ms)
            respond(sync_result(NONE, group, member.assignment))
            return
        member.awaiting_sync = respond  # CompletingRebalance
        if member.member_id != group.leader_id:
            return
        assignments = {mid: req.assignments.get(mid, b"") for mid in group.members}
        code = self.log.store_group(group, assignments)
        if code != NONE:
            self._reset_and_propagate_assignment_error(group, code)
            self._maybe_prepare_rebalance(group, f"failed to store the assignment of generation {group.generation}")
            return
        for m in group.members.values():
            m.assignment = assignments[m.member_id]
            if m.awaiting_sync is not None:
                m.awaiting_sync(sync_result(NONE, group, m.assignment))
                m.awaiting_sync = None
                self.schedule_session(group, m, m.session_timeout_ms)
        group.state = GroupState.STABLE
        logger.info("assignment received from leader %s for group %s generation %d", member.member_id,
                    group.group_id, group.generation)

    # -- Heartbeat / LeaveGroup -------------------------------------------------------------------------------------

    def heartbeat(self, group_id: str, generation_id: int, member_id: str, group_instance_id: str | None = None) -> int:
        code = self.check(group_id, allow_empty=False)
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
        self.schedule_session(group, member, member.session_timeout_ms)
        return REBALANCE_IN_PROGRESS if group.state is GroupState.PREPARING_REBALANCE else NONE

    def leave_group(self, group_id: str, leaving: list[tuple[str, str | None]]) -> tuple[int, list[int]]:
        """Remove members given as (member id, group instance id); the top-level and per-member error codes."""
        code = self.check(group_id, allow_empty=False)
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

    def remove_group(self, group: Group) -> None:
        """Forget a group whose tombstones are written: Dead, no timers left."""
        cancel_timers(group)
        group.state = GroupState.DEAD
        del self.groups[group.group_id]
