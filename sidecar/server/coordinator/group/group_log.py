"""A group coordinator's records in `__consumer_offsets`: each group's writes, in Kafka's record layout
(`offset_records`), appended through the coordinator runtime's writer to the group's partition."""

from __future__ import annotations

import logging
from typing import Iterable

from ....log.errors import LogError, RecordTooLargeError
from ....log.records import Record, encode_batch
from ....log.topic_partition import TopicPartition
from ....plural import plural
from ....protocol.error_codes import INVALID_COMMIT_OFFSET_SIZE, NONE, NOT_COORDINATOR, UNKNOWN_SERVER_ERROR
from ....topics.registry import TopicRegistry
from ..runtime import Clock, PartitionWriter
from .model import Group
from .offset_records import (
    OFFSETS_TOPIC,
    GroupMetadataKey,
    GroupMetadataValue,
    MemberMetadata,
    OffsetCommitKey,
    encode_group_metadata_value,
    encode_key,
    partition_for,
)

logger = logging.getLogger(__name__)


class GroupLog:
    """Appends to the partition of `__consumer_offsets` a group id hashes to."""

    def __init__(self, registry: TopicRegistry, writer: PartitionWriter, clock: Clock, partitions: int) -> None:
        self.registry = registry
        # With a control store OffsetCommit answers only once the ISR has the commit, as Kafka's appends to
        # __consumer_offsets use acks=all.
        self.writer = writer
        self.clock = clock
        self.partitions = partitions  # offsets.topic.num.partitions, or the count on disk (GroupCoordinator.start)
        self.last_append: tuple[TopicPartition, int] | None = None  # partition and last offset of the last append

    def partition_for(self, group_id: str) -> int:
        return partition_for(group_id, self.partitions)

    def append(self, group_id: str, entries: list[tuple[bytes, bytes | None]],
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
    def store_error(exc: Exception, *, commit: bool) -> int:
        """Kafka's mapping of append errors: storage -> NOT_COORDINATOR, too large -> 28 (commits)."""
        if isinstance(exc, RecordTooLargeError):
            return INVALID_COMMIT_OFFSET_SIZE if commit else UNKNOWN_SERVER_ERROR
        if isinstance(exc, (LogError, OSError)):
            return NOT_COORDINATOR
        return UNKNOWN_SERVER_ERROR

    def store_group(self, group: Group, assignments: dict[str, bytes]) -> int:
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
        exc = self.append(group.group_id, [(encode_key(GroupMetadataKey(group.group_id)),
                                             encode_group_metadata_value(value))])
        return NONE if exc is None else self.store_error(exc, commit=False)

    @staticmethod
    def tombstones(group_id: str, partitions: Iterable[tuple[str, int]]) -> list[tuple[bytes, bytes | None]]:
        return [(encode_key(OffsetCommitKey(group_id, topic, p)), None) for topic, p in partitions]
