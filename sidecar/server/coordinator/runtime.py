"""What both coordinators run on: time, the writer of their internal topic's partitions, and loading the
partitions this node comes to lead (Kafka's CoordinatorRuntime and PartitionWriter; docs/coordinator-runtime.md).

The node's replica manager decides who leads; this module turns its decisions into loads and unloads, once for
both coordinators; each coordinator is the state machine of its own partitions and says how one is loaded and
unloaded.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Callable, Mapping, Protocol

from ...log.errors import LogError
from ...log.log import AppendInfo, Log
from ...log.topic_partition import TopicPartition
from ...plural import plural
from ...protocol.error_codes import NONE, NOT_LEADER_OR_FOLLOWER, REQUEST_TIMED_OUT
from ...replication.replica_manager import ReplicaManager

logger = logging.getLogger(__name__)

OFFSETS_COMMIT_TIMEOUT_MS = 5000  # Kafka's offsets.commit.timeout.ms: how long a coordinator's write waits for the ISR


# -- time ---------------------------------------------------------------------------------------------------------


class Timer(Protocol):
    def cancel(self) -> None: ...


class Clock(Protocol):
    """Wall-clock milliseconds and one-shot timers: a coordinator's only source of time (tests drive a fake one)."""

    def now_ms(self) -> int: ...

    def call_later(self, delay_ms: int, callback: Callable[[], None]) -> Timer: ...


class LoopClock:
    """Real time, with timers on the running event loop."""

    def now_ms(self) -> int:
        return int(time.time() * 1000)

    def call_later(self, delay_ms: int, callback: Callable[[], None]) -> Timer:
        return asyncio.get_running_loop().call_later(max(delay_ms, 0) / 1000, callback)


# -- writing ------------------------------------------------------------------------------------------------------


class PartitionWriter(Protocol):
    """How a coordinator writes to a partition this node leads (Kafka's PartitionWriter)."""

    # True with a control store: the partitions are replicated, so a write counts once the ISR has it, and a
    # partition is loaded when this node is elected its leader rather than at start.
    replicates: bool

    def append(self, tp: TopicPartition, log: Log, batch: bytes) -> AppendInfo:
        """Append a record batch to `log`, `tp`'s, and wake the fetches waiting on it. Raises LogError when this
        node does not lead `tp` (any more), and whatever `Log.append` raises."""
        ...

    async def replicated(self, tp: TopicPartition, last_offset: int) -> int:
        """Wait until `last_offset` of `tp` is committed: NONE, or the error code of a write the ISR did not take."""
        ...


class LocalPartitionWriter:
    """A node without a control store: every partition is local and has no other replica."""

    replicates = False

    def __init__(self, wake: Callable[[TopicPartition], None] = lambda _tp: None) -> None:
        self.wake = wake  # the fetch purgatory's poke

    def append(self, tp: TopicPartition, log: Log, batch: bytes) -> AppendInfo:
        info = log.append(batch)
        self.wake(tp)
        return info

    async def replicated(self, tp: TopicPartition, last_offset: int) -> int:
        return NONE  # no other replica: appended is committed


class ReplicatedPartitionWriter:
    """A node with a control store: appends in the leader epoch, acknowledged as `acks=all` produces are."""

    replicates = True

    def __init__(self, replicas: ReplicaManager, node_id: int, wake: Callable[[TopicPartition], None],
                 timeout_ms: int = OFFSETS_COMMIT_TIMEOUT_MS) -> None:
        self.replicas = replicas
        self.node_id = node_id
        self.wake = wake
        self.timeout_ms = timeout_ms

    def append(self, tp: TopicPartition, log: Log, batch: bytes) -> AppendInfo:
        """Stamped with the leader epoch, the high watermark raised as for a produce."""
        partition = self.replicas.leader(tp)
        if partition is None or partition.log is not log:
            raise LogError(f"{tp} is not led by node {self.node_id} now")
        info = log.append(batch, leader_epoch=partition.leader_epoch)
        self.replicas.appended(partition)
        self.wake(tp)
        return info

    async def replicated(self, tp: TopicPartition, last_offset: int) -> int:
        """The error code of the parked produce, or REQUEST_TIMED_OUT after `timeout_ms`."""
        partition = self.replicas.leader(tp)
        if partition is None:
            return NOT_LEADER_OR_FOLLOWER
        waiter = self.replicas.park(partition, last_offset)
        try:
            await asyncio.wait_for(asyncio.shield(waiter.done), self.timeout_ms / 1000)
            return waiter.done.result()
        except asyncio.TimeoutError:
            return REQUEST_TIMED_OUT
        finally:
            self.replicas.delayed.forget(waiter)


# -- loading on election ------------------------------------------------------------------------------------------


class LedPartitions:
    """The partitions of one coordinator's topic loaded here, each with the leader epoch it was loaded in.

    `follow` is Kafka's onElection / onResignation: a partition no longer led, or led in another epoch, is
    unloaded; one led and not loaded is replayed from its log, which holds whatever earlier leaders wrote. A load
    runs to the log's end on the event loop, so no resignation, request or timer comes between.
    """

    def __init__(self, topic: str, noun: str, logs: Mapping[TopicPartition, Log], *,
                 load: Callable[[int], tuple[int, int]], unload: Callable[[int], int]) -> None:
        self.topic = topic
        self.noun = noun  # what the coordinator keeps per key, for the log lines ("group", "transactional id")
        self.logs = logs  # the node's logs: a partition is loaded only once its replica is here
        self.load = load  # replays one partition: (keys loaded, records read)
        self.unload = unload  # forgets one partition's keys (answering their waiting requests): how many went
        self.epochs: dict[int, int] = {}  # partition -> the leader epoch it was loaded in

    def epoch(self, partition: int) -> int | None:
        """The leader epoch `partition` was loaded in; None while it is not loaded here."""
        return self.epochs.get(partition)

    def follow(self, led: Mapping[int, int]) -> list[int]:
        """`led` is {partition: leader epoch} of the topic's partitions this node leads now; returns the
        partitions loaded by this call, in order."""
        resigned = sorted(p for p, epoch in self.epochs.items() if led.get(p) != epoch)
        unloaded = sum(self.unload(p) for p in resigned)
        for p in resigned:
            del self.epochs[p]
        elected: list[int] = []
        keys = records = 0
        for p, epoch in sorted(led.items()):
            if p in self.epochs or TopicPartition(self.topic, p) not in self.logs:
                continue
            loaded, read = self.load(p)
            keys, records = keys + loaded, records + read
            self.epochs[p] = epoch
            elected.append(p)
        if resigned:
            logger.info("%s partitions %s no longer led here: %s unloaded", self.topic, ", ".join(map(str, resigned)),
                        plural(unloaded, self.noun))
        if elected:
            logger.info("%s partitions %s led here: %s loaded (%s)", self.topic,
                        ", ".join(f"{p} (epoch {led[p]})" for p in elected), plural(keys, self.noun),
                        plural(records, "record"))
        return elected
