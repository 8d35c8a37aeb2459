"""Committed offsets: OffsetCommit and TxnOffsetCommit (pending until the transaction's marker), OffsetFetch,
OffsetDelete, expiry after `offsets.retention.ms` and a deleted topic's offsets (Kafka's OffsetMetadataManager)."""

from __future__ import annotations

import logging
from typing import Callable, Iterable

from ....plural import plural
from ....protocol.error_codes import (
    COORDINATOR_NOT_AVAILABLE,
    GROUP_ID_NOT_FOUND,
    GROUP_SUBSCRIBED_TO_TOPIC,
    ILLEGAL_GENERATION,
    INVALID_GROUP_ID,
    NON_EMPTY_GROUP,
    NONE,
    OFFSET_METADATA_TOO_LARGE,
    REBALANCE_IN_PROGRESS,
    UNKNOWN_MEMBER_ID,
    UNKNOWN_TOPIC_OR_PARTITION,
)
from ....topics.registry import TopicRegistry
from ..runtime import Clock, Timer
from .group_log import GroupLog
from .membership import Membership
from .model import CONSUMER_PROTOCOL_TYPE, CommitPartition, Group, GroupState
from .offset_records import GroupMetadataKey, OffsetCommitKey, OffsetCommitValue, encode_key, encode_offset_commit_value

logger = logging.getLogger(__name__)


class Offsets:
    """The committed offsets of every group loaded here, and those of open transactions."""

    def __init__(self, groups: dict[str, Group], registry: TopicRegistry, log: GroupLog, membership: Membership,
                 clock: Clock, check: Callable[..., int], active: Callable[[], bool], *, offsets_retention_ms: int,
                 offsets_retention_check_interval_ms: int, offset_metadata_max_bytes: int) -> None:
        self.groups = groups  # the coordinator's
        self.registry = registry  # a commit to a partition that does not exist is refused
        self.log = log
        self.membership = membership  # a commit is as good as a heartbeat; an expired empty group goes
        self.clock = clock
        self.check = check  # the coordinator's group_error
        self.active = active  # the coordinator's: expiry stops, and a deleted topic's offsets stay, once it closed
        self.offsets_retention_ms = offsets_retention_ms
        self.offsets_retention_check_interval_ms = offsets_retention_check_interval_ms
        self.offset_metadata_max_bytes = offset_metadata_max_bytes
        # TxnOffsetCommit: producer id -> group -> offsets, visible once that producer's COMMIT marker reaches the
        # group's partition, dropped on ABORT (Kafka's pendingTransactionalOffsetCommits).
        self.pending_txn_offsets: dict[int, dict[str, dict[tuple[str, int], OffsetCommitValue]]] = {}
        self._expiry_timer: Timer | None = None

    # -- commits ----------------------------------------------------------------------------------------------------

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
        code = self.check(group_id, allow_empty=True)
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
            self.membership.schedule_session(group, member, member.session_timeout_ms)  # a commit is as good as a heartbeat
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
            exc = self.log.append(group_id, [(encode_key(OffsetCommitKey(group_id, t, p)), encode_offset_commit_value(v))
                                             for (t, p), v in values.items()], now, producer)
            if exc is not None:
                code = getattr(exc, "error_code", None) if producer is not None else None  # a fenced epoch: 47
                code = code if code is not None else self.log.store_error(exc, commit=True)
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
        for group_id in [g for g in by_group if self.log.partition_for(g) == partition]:
            offsets = by_group.pop(group_id)
            if commit:
                self.groups.setdefault(group_id, Group(group_id)).offsets.update(offsets)
        if not by_group:
            self.pending_txn_offsets.pop(producer_id, None)

    def fetch_offsets(self, group_id: str, topics: list[tuple[str, list[int]]] | None
                      ) -> tuple[int, list[tuple[str, list[tuple[int, OffsetCommitValue | None]]]]]:
        """Committed offsets of the given partitions (None = every partition the group committed)."""
        code = self.check(group_id, allow_empty=True)
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

    def has_pending_txn_offsets(self, group_id: str, tp: tuple[str, int]) -> bool:
        """Kafka's GroupMetadata.hasPendingOffsetCommitsForTopicPartition (transactional ones: ours are the only
        commits that stay pending): an open transaction has committed an offset of `tp` for the group."""
        return any(tp in by_group.get(group_id, ()) for by_group in self.pending_txn_offsets.values())

    # -- expiry -----------------------------------------------------------------------------------------------------

    def schedule_expiry(self) -> None:
        """The next expiry check, `offsets.retention.check.interval.ms` from now (then one after each)."""
        self._expiry_timer = self.clock.call_later(self.offsets_retention_check_interval_ms, self._expiry_tick)

    def stop_expiry(self) -> None:
        if self._expiry_timer is not None:
            self._expiry_timer.cancel()
            self._expiry_timer = None

    def _expiry_tick(self) -> None:
        self._expiry_timer = None
        if not self.active():
            return
        try:
            self.expire_offsets()
        finally:
            self.schedule_expiry()

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
            tombstones = self.log.tombstones(group.group_id, expired)
            if dead and group.generation > 0:
                tombstones.append((encode_key(GroupMetadataKey(group.group_id)), None))
            if tombstones and self.log.append(group.group_id, tombstones, now) is not None:
                continue  # logged; tried again at the next check
            for tp in expired:
                del group.offsets[tp]
            removed += len(expired)
            if expired:
                logger.info("removed %s of group %s", plural(len(expired), "expired offset"), group.group_id)
            if dead:
                self.membership.remove_group(group)
                logger.info("group %s is empty with no offsets left; removed", group.group_id)
        return removed

    def topic_deleted(self, topic: str) -> None:
        """Kafka's onPartitionsDeleted: a deleted topic's committed offsets go from every group (tombstones).

        A topic created again under the same name then starts without the old offsets, and lag tools stop
        showing a topic that is gone.
        """
        if not self.active():
            return
        for group in list(self.groups.values()):
            doomed = [tp for tp in group.offsets if tp[0] == topic]
            if not doomed or self.log.append(group.group_id, self.log.tombstones(group.group_id, doomed)) is not None:
                continue  # a failed append is logged; the offsets stay until the next deletion or expiry
            for tp in doomed:
                del group.offsets[tp]
            logger.info("removed %s of deleted topic %s from group %s", plural(len(doomed), "committed offset"),
                        topic, group.group_id)

    # -- OffsetDelete -----------------------------------------------------------------------------------------------

    def delete_offsets(self, group_id: str | None, topics: list[tuple[str, list[int]]]
                       ) -> tuple[int, list[tuple[str, list[tuple[int, int]]]]]:
        """Kafka's OffsetDelete: the group's error code, or the error code of each requested partition."""
        code = INVALID_GROUP_ID if not group_id else self.check(group_id, allow_empty=False)
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
            exc = self.log.append(group.group_id, self.log.tombstones(group.group_id, doomed))
            if exc is not None:
                return self.log.store_error(exc, commit=False), []
            for tp in doomed:
                del group.offsets[tp]
            logger.info("deleted %s of group %s", plural(len(doomed), "committed offset"), group_id)
        return NONE, results

def _java_length(s: str) -> int:
    """String.length() in Java: UTF-16 code units (offset.metadata.max.bytes is checked against it)."""
    return len(s.encode("utf-16-le", "surrogatepass")) // 2
