"""The admin API's writes of topic records to the control store (CreateTopics, DeleteTopics, CreatePartitions,
AlterConfigs on a node with `--store`).

A topic created through one node must exist on all of them, so the admin handlers never change the registry
themselves: they write the topic record (create-if-absent, compare-and-set) and wait until this node's own view
has applied it (`TopicRegistry.apply_store_topics`), as every other node does — the answer then describes what
this node serves. Store calls block, so they run on one thread of their own, through a store client of their
own (a store object is used from one thread; the controller's stays the controller's).
"""

from __future__ import annotations

import asyncio
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Callable, TypeVar

from ...log.topic_partition import TopicPartition
from ...replication.control_store import ControlStore, StoreView
from ...replication.store_records import PartitionRecord
from ...replication.topic_record import TopicRecord
from ...topics.registry import TopicRegistry

logger = logging.getLogger(__name__)

CAS_ATTEMPTS = 5  # read-modify-write rounds before a change racing others is given up
APPLIED_POLL_S = 0.01
_T = TypeVar("_T")


class StoreConflict(Exception):
    """The topic's record kept changing under a read-modify-write: the message names the topic."""


@dataclass
class StoreTopics:
    """Topic records written for the admin API, and the wait until this node has applied them."""

    store: ControlStore
    registry: TopicRegistry
    _thread: ThreadPoolExecutor = field(
        default_factory=lambda: ThreadPoolExecutor(max_workers=1, thread_name_prefix="shale-admin-store"))

    async def create(self, record: TopicRecord, timeout_s: float) -> bool:
        """Create the record; False if the name is taken in the store. Waits (bounded) until applied here."""
        if not await self._call(self.store.create_topic, record):
            return False
        logger.info("topic %s: record written to the control store (id %s, %d partitions)", record.name,
                    record.topic_id, record.partitions)
        await self.applied(lambda: self._serves(record), timeout_s, f"topic {record.name} created")
        return True

    async def change(self, name: str, change: Callable[[TopicRecord | None, StoreView], TopicRecord],
                     timeout_s: float) -> TopicRecord:
        """Rewrite the record as `change(current record or None, view)` says (it raises to refuse), by
        compare-and-set on a fresh read, again on a miss. StoreConflict after CAS_ATTEMPTS misses."""
        for _ in range(CAS_ATTEMPTS):
            view = await self._call(self.store.view)
            current = view.topics.get(name)
            new = change(None if current is None else current.record, view)
            if await self._call(self.store.update_topic, new, current.version):
                await self.applied(lambda: self._serves(new), timeout_s, f"topic {name} changed")
                return new
        raise StoreConflict(f"topic {name}: its record in the control store kept changing; try again")

    async def change_partition(self, tp: TopicPartition,
                               change: Callable[[PartitionRecord], PartitionRecord | None]) -> PartitionRecord | None:
        """Rewrite a partition record as `change(current)` says (None: leave it; it raises to refuse), by
        compare-and-set on a fresh read (a reassignment started or cancelled through the admin API). KeyError
        when the partition has no record; StoreConflict after CAS_ATTEMPTS misses."""
        for _ in range(CAS_ATTEMPTS):
            current = (await self._call(self.store.view)).partitions.get(tp)
            if current is None:
                raise KeyError(tp)
            new = change(current.record)
            if new is None:
                return None
            if await self._call(self.store.update_partition, tp, new, current.version):
                return new
        raise StoreConflict(f"{tp}: its record in the control store kept changing; try again")

    async def delete(self, name: str, timeout_s: float) -> bool:
        """Delete the record as it is now; False if there is none. Waits (bounded) until removed here."""
        for _ in range(CAS_ATTEMPTS):
            current = (await self._call(self.store.view)).topics.get(name)
            if current is None:
                return False
            if await self._call(self.store.delete_topic, name, current.version):
                logger.info("topic %s: record deleted from the control store", name)
                await self.applied(lambda: name not in self.registry.topics, timeout_s, f"topic {name} deleted")
                return True
        raise StoreConflict(f"topic {name}: its record in the control store kept changing; try again")

    async def view(self) -> StoreView:
        return await self._call(self.store.view)

    async def applied(self, done: Callable[[], bool], timeout_s: float, what: str) -> None:
        """Wait until this node's view has applied a write. The write is durable either way: past the timeout
        the answer goes out and the node catches up with its next view."""
        deadline = time.monotonic() + timeout_s
        while not done():
            if time.monotonic() >= deadline:
                logger.warning("%s in the control store, not yet applied on this node after %.1f s", what, timeout_s)
                return
            await asyncio.sleep(APPLIED_POLL_S)

    def close(self) -> None:
        self._thread.shutdown(wait=True)
        self.store.close()

    def _serves(self, record: TopicRecord) -> bool:
        return self.registry.topics.get(record.name) == record.spec()

    async def _call(self, method: Callable[..., _T], *args: object) -> _T:
        return await asyncio.get_running_loop().run_in_executor(self._thread, method, *args)

