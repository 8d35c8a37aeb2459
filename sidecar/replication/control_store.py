"""The control store's interface: sessions, live nodes, partition records and API-created topics' records,
written by compare-and-set.

Two implementations stand on a real consensus engine (docs/replication.md): `etcd_store.EtcdStore` and
`kube_store.KubeStore`. Everything that decides (election, ISR changes) is pure and sees only a `StoreView`;
this interface is the one place where a decision becomes durable, and its only write primitive is
compare-and-set on a record's version, so two writers deciding from the same view cannot both win.

All methods are blocking: the node calls them from its controller thread, never from the event loop.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from typing import Generic, Mapping, Protocol, TypeVar

from ..log.topic_partition import TopicPartition
from .store_records import NodeRegistration, PartitionRecord
from .topic_record import TopicRecord

logger = logging.getLogger(__name__)


class StoreUnavailable(Exception):
    """The store did not answer (connection refused, timeout, 5xx): nothing is known about the write."""


class SessionLost(Exception):
    """This node's session is gone (expired, revoked, replaced): its leaderships are void; open a new one."""


R = TypeVar("R", PartitionRecord, TopicRecord)


@dataclass(frozen=True, slots=True)
class Versioned(Generic[R]):
    """A record and the store's version of it (etcd mod_revision, Kubernetes resourceVersion)."""

    record: R
    version: str


@dataclass(frozen=True, slots=True)
class StoreView:
    """One consistent read of the store: the live nodes, every partition record and every API-created topic."""

    revision: str  # opaque; `wait_for_change(revision, …)` returns once the store has moved past it
    nodes: Mapping[int, NodeRegistration] = field(default_factory=dict)  # live sessions only
    partitions: Mapping[TopicPartition, Versioned[PartitionRecord]] = field(default_factory=dict)
    topics: Mapping[str, Versioned[TopicRecord]] = field(default_factory=dict)  # CreateTopics' topics, by name
    # False when some topic record could not be read: a topic missing from `topics` may then still exist, and no
    # node deletes a topic on the word of such a view.
    topics_complete: bool = True

    def is_live(self, node_id: int, incarnation: str | None = None) -> bool:
        node = self.nodes.get(node_id)
        return node is not None and (incarnation is None or node.incarnation == incarnation)


def session_ttl_seconds(ttl_ms: int) -> int:
    """Sessions are granted in whole seconds (etcd leases, Lease.leaseDurationSeconds): rounded up, never
    below one second, so a store never ends a session earlier than the node asked."""
    return max(1, math.ceil(ttl_ms / 1000))


@dataclass
class UnreadableRecords:
    """Logs each unreadable store value once per version: views are read several times a second, and a
    damaged record stays damaged until someone rewrites it (the stores skip it and never overwrite it)."""

    store: str
    _reported: set[tuple[str, str]] = field(default_factory=set)

    def report(self, where: str, version: str, error: Exception) -> None:
        if (where, version) not in self._reported:
            self._reported.add((where, version))
            logger.error("%s: skipping an unreadable record (left as it is): %s", self.store, error)


class ControlStore(Protocol):
    def open_session(self, me: NodeRegistration, ttl_ms: int) -> None:
        """Register `me` under a new session of `ttl_ms`, replacing any earlier registration of the same node
        id (a restarted node: its previous process's session ends now, not at its expiry)."""

    def keepalive(self) -> None:
        """Renew the session. Raises SessionLost if it is gone, StoreUnavailable if the store did not answer."""

    def close_session(self) -> None:
        """End the session now (clean shutdown): the others see this node gone without waiting for the TTL."""

    def end_session(self, node: NodeRegistration) -> bool:
        """End another node's session now if `node.incarnation` still holds it (a peer found that process
        gone); False if that incarnation's session is gone already or was replaced. The ended node, were it
        alive, learns at its next keepalive (SessionLost). Safe by the election rule, not by timing: see
        docs/replication.md, "Ending a dead leader's session"."""

    def view(self) -> StoreView:
        """The live nodes, all partition records and all topic records, read at one revision."""

    def wait_for_change(self, revision: str, timeout_s: float) -> None:
        """Block until the store changed after `revision` (a node's session, a partition or topic record) or the
        timeout passed, whichever is first. Spurious returns are allowed."""

    def create_partition(self, tp: TopicPartition, record: PartitionRecord) -> bool:
        """Create the record if there is none; False if one exists (someone else created it first)."""

    def update_partition(self, tp: TopicPartition, record: PartitionRecord, expected_version: str) -> bool:
        """Write the record if its version is still `expected_version`; False on a miss (re-read and decide
        again). A write whose answer was lost is settled by re-reading: equal content means it landed."""

    def update_partitions(self, updates: list[tuple[TopicPartition, PartitionRecord, str]]) -> bool:
        """`update_partition` for several records, each at its expected version: True if all were written. On
        etcd one transaction, all or none; on Kubernetes (no transactions across objects) one write each, in
        order, stopping at the first miss. After False, re-read and decide again."""

    def delete_partition(self, tp: TopicPartition) -> None:
        """Remove a deleted topic's partition record (DeleteTopics / manifest removal)."""

    def create_topic(self, record: TopicRecord) -> bool:
        """Create the topic's record if there is none; False if one exists (the name is taken)."""

    def update_topic(self, record: TopicRecord, expected_version: str) -> bool:
        """Rewrite the topic's record (configs, more partitions) if its version is still `expected_version`;
        False on a miss, the record deleted included."""

    def delete_topic(self, name: str, expected_version: str) -> bool:
        """Remove the topic's record if its version is still `expected_version` (a deletion never undoes a change
        it did not see); False on a miss, the record already gone included."""

    def close(self) -> None:
        """Release connections (after close_session)."""
