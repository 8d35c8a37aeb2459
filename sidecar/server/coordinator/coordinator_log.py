"""A coordinator's internal topic: declared at start, and each partition read back from its start to its end.

The group and transaction coordinators both keep their state in an internal compacted topic
(`__consumer_offsets` / `__transaction_state`) and rebuild it at load by replaying their partitions (Kafka's
`loadGroupsAndOffsets` / `loadTransactionMetadata`). One declaration and one walk serve both, so a partition
count on disk, or a read that returns a partial batch or none, is handled the same way by each.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Iterator, Mapping

from ...log.log import Log
from ...log.records import BATCH_OVERHEAD, BatchHeader, Record, decode_batch
from ...plural import plural
from ...topic_config import TopicConfig
from ...topics.registry import TopicRegistry, TopicSpec

logger = logging.getLogger(__name__)

READ_BYTES = 1 << 20


def declare_internal_topic(registry: TopicRegistry, topic: str, partitions: int, config: Mapping[str, str],
                           setting: str, replication_factor: int | None = None) -> int:
    """Declare `topic` with `partitions` (the value of `setting`), or with the count already on disk; returns
    the count used. As in Kafka, the setting applies only when the topic is created: ids hash onto the
    partitions their records are in, so the count never changes afterwards."""
    on_disk = [tp.partition for tp in registry.log_dir.logs if tp.topic == topic]
    if on_disk and max(on_disk) + 1 != partitions:
        logger.warning("%s has %s on disk; keeping them (%s is %d)", topic, plural(max(on_disk) + 1, "partition"),
                       setting, partitions)
        partitions = max(on_disk) + 1
    registry.put(TopicSpec(topic, partitions, TopicConfig.from_mapping(config), origin="internal", internal=True,
                           replication_factor=replication_factor))
    return partitions


@dataclass(frozen=True)
class LoadedBatch:
    """One batch reaching past the walk's position; `records()` decodes it only when the caller needs it."""

    header: BatchHeader
    data: memoryview
    from_offset: int
    log_name: str

    def records(self) -> list[Record]:
        """The batch's records at or past the position the walk had reached (a read may start mid-batch)."""
        batch = decode_batch(self.data, f"{self.log_name} offset {self.header.base_offset}")
        return [r for r in batch.records if r.offset >= self.from_offset]

    def where(self, record: Record) -> str:
        return f"{self.log_name} offset {record.offset}"


def loaded_batches(log: Log, read_bytes: int = READ_BYTES) -> Iterator[LoadedBatch]:
    """Every batch of `log` from its start offset to its end offset as of the call, each once; reads of
    `read_bytes` may end inside a batch, which the next read starts with."""
    offset, end = log.log_start_offset, log.log_end_offset
    while offset < end:
        found = log.read(offset, read_bytes, min_one_message=True)
        if found is None:
            return
        data = memoryview(found.read())
        pos, progressed = 0, False
        while pos + BATCH_OVERHEAD <= len(data):
            header = BatchHeader.parse(data, pos)
            if pos + header.size > len(data):
                break
            if header.next_offset > offset:
                yield LoadedBatch(header, data[pos : pos + header.size], offset, log.name)
                offset, progressed = header.next_offset, True
            pos += header.size
        if not progressed:
            raise RuntimeError(f"cannot read {log.name} at offset {offset}: no whole batch returned")
