"""The node's replicas: store records applied to local logs (Kafka's ReplicaManager), on the event loop.

Each view the controller reads (`apply_view`) says, per partition, who leads in which epoch and who is in
sync. For every partition whose record names this node a replica, the manager creates its log, and makes it
leader (epoch assigned at the log end before any append, followers' state reset), follower (the fetchers
follow the leader) or neither (no valid leader yet). As leader it counts followers' fetches, raises the high
watermark, answers parked `acks=all` produces and proposes ISR changes to the controller — Kafka's
AlterPartition, here a compare-and-set the controller thread carries out. When the node's session is lost
(`on_fenced`) it stops acknowledging at once (docs/replication.md, "Fencing").

Without a control store there is no manager: the broker and the registry behave as on one node.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Callable, Mapping, Protocol

from ..log.log import Log
from ..log.topic_partition import TopicPartition
from ..plural import plural
from ..protocol.error_codes import NONE, NOT_LEADER_OR_FOLLOWER, UNKNOWN_TOPIC_OR_PARTITION
from ..topics.registry import NodeAddress, TopicError, TopicRegistry
from . import preferred_leader, reassignment
from .control_store import StoreView, Versioned
from .controller import Wanted
from .delayed_produce import DelayedProduces, Waiter
from .follower import holds_unreplicated
from .partition import PartitionState, Role
from .store_records import NO_LEADER, NodeRegistration, PartitionRecord
from .throttle import ReplicationQuota, names_replica

logger = logging.getLogger(__name__)



@dataclass(frozen=True)
class LeaderRebalance:
    """Kafka's `leader.imbalance.check.interval.seconds` and `leader.imbalance.per.broker.percentage`, in force
    with `auto.leader.rebalance.enable`."""

    interval_ms: int
    imbalance_percentage: int

class Leadership(Protocol):
    """What the manager needs of the controller (`controller.Controller`)."""

    @property
    def incarnation(self) -> str: ...

    def may_lead(self) -> bool: ...

    def propose(self, tp: TopicPartition, based_on: Versioned, new: PartitionRecord) -> None: ...

    def wake(self) -> None: ...


class Fetchers(Protocol):
    """What the manager needs of the follower side (`replica_fetcher.ReplicaFetchers`)."""

    def follow(self, tp: TopicPartition, leader: NodeRegistration, leader_epoch: int) -> None: ...

    def unfollow(self, tp: TopicPartition) -> None: ...

    def lost(self, leader: NodeRegistration) -> bool: ...




def monotonic_ms() -> int:
    return time.monotonic_ns() // 1_000_000


@dataclass(eq=False, slots=True)
class Partition:
    """One local replica: its log and its replication state."""

    log: Log
    state: PartitionState

    @property
    def tp(self) -> TopicPartition:
        return self.state.tp

    @property
    def leader_epoch(self) -> int:
        return self.state.leader_epoch


class ReplicaManager:
    """Local replicas of the partitions whose records name this node; `TopicRegistry.replication`."""

    def __init__(self, registry: TopicRegistry, *, replica_lag_time_max_ms: int = 30000,
                 default_replication_factor: int = 1, clock_ms: Callable[[], int] = monotonic_ms,
                 leader_quota: ReplicationQuota | None = None, follower_quota: ReplicationQuota | None = None,
                 leader_rebalance: LeaderRebalance | None = None,
                 wake_fetches: Callable[[TopicPartition], None] | None = None,
                 wake_consumers: Callable[[TopicPartition], None] | None = None) -> None:
        self.registry = registry
        self.leader_rebalance = leader_rebalance  # None: leadership stays where elections put it
        # Kafka's replication throttles (throttle.py), and the bytes moved by reassignments (KIP-373's
        # ReassignmentBytesIn/OutPerSec): what followers of this node fetched as newcomers, what it sent to them.
        self.leader_quota = leader_quota or ReplicationQuota()
        self.follower_quota = follower_quota or ReplicationQuota()
        self.reassignment_bytes_in = 0
        self.reassignment_bytes_out = 0
        self.node_id = registry.node.node_id
        self.lag_max_ms = replica_lag_time_max_ms
        self.default_replication_factor = default_replication_factor
        self.clock_ms = clock_ms
        self.controller: Leadership | None = None
        self.fetchers: Fetchers | None = None
        # The fetch purgatory's pokes: an append or a follower's progress wakes fetches of the partition; the
        # high watermark alone rose: consumers may read more, followers (reading to the log end) may not.
        self.wake_fetches: Callable[[TopicPartition], None] = wake_fetches or (lambda tp: None)
        self.wake_consumers: Callable[[TopicPartition], None] = wake_consumers or self.wake_fetches
        self.delayed = DelayedProduces()
        self.partitions: dict[TopicPartition, Partition] = {}
        self.view = StoreView(revision="")
        self._wanted: dict[TopicPartition, Wanted] = {}
        self._tasks: list[asyncio.Task] = []
        self._refused: dict[TopicPartition, str] = {}  # replicas whose log cannot be created here, and why
        registry.before_delete.append(self._before_delete)
        registry.follow(self)

    def attach(self, controller: Leadership, fetchers: Fetchers) -> None:
        """The controller and the fetchers are built after the manager (they call back into it)."""
        self.controller, self.fetchers = controller, fetchers

    # -- queries (registry, broker) --------------------------------------------------------------

    def leader(self, tp: TopicPartition) -> Partition | None:
        """The partition if this node leads it and may acknowledge now: its session is valid and is the one the
        record elected (a session reopened after a fence leads nothing until a record names it)."""
        p = self.partitions.get(tp)
        if p is None or p.state.role is not Role.LEADER or self.controller is None or not self.controller.may_lead():
            return None
        record = p.state.record
        if record is None or record.leader_incarnation != self.controller.incarnation:
            return None
        return p

    def replica_for(self, tp: TopicPartition, current_leader_epoch: int, *,
                    leader_only: bool = True, acknowledging: bool = False) -> tuple[Partition | None, int]:
        """The local replica a request may use, or the error to answer (Kafka's Partition.getLocalLog): the
        request's leader epoch is checked first (FENCED_LEADER_EPOCH / UNKNOWN_LEADER_EPOCH), then the role.
        `acknowledging` (follower fetches) also needs a valid session: a fenced leader's high watermark must not
        move; reads of committed data by consumers go on."""
        p = self.partitions.get(tp)
        if p is None:
            return None, self.error_for(tp)
        code = p.state.check_epoch(current_leader_epoch)
        if code != NONE:
            return None, code
        if leader_only and p.state.role is not Role.LEADER:
            return None, NOT_LEADER_OR_FOLLOWER
        if acknowledging and self.leader(tp) is None:
            return None, NOT_LEADER_OR_FOLLOWER
        return p, NONE

    def error_for(self, tp: TopicPartition) -> int:
        """Why `leader(tp)` is None: an unknown partition, or one led elsewhere (or by nobody right now)."""
        return NOT_LEADER_OR_FOLLOWER if self._known(tp) else UNKNOWN_TOPIC_OR_PARTITION

    def record(self, tp: TopicPartition) -> PartitionRecord | None:
        versioned = self.view.partitions.get(tp)
        return None if versioned is None else versioned.record

    def valid_leader(self, record: PartitionRecord) -> int:
        """The record's leader if its process is the live one, else -1 (being re-elected)."""
        if record.leader != NO_LEADER and self.view.is_live(record.leader, record.leader_incarnation):
            return record.leader
        return NO_LEADER

    def announced_leader(self, record: PartitionRecord) -> int:
        """The leader Metadata names: `valid_leader`, but -1 (LEADER_NOT_AVAILABLE) while this node's fetcher
        has lost its connection to that process (closed, refused) — Kafka names no leader that is not a live
        broker. A client told so asks again within its retry backoff (librdkafka's fast leader query) and finds
        the new leader as soon as it is elected; told the dead one, it waits for its one-second refresh."""
        leader = self.valid_leader(record)
        if leader != NO_LEADER and self.fetchers is not None and self.fetchers.lost(self.view.nodes[leader]):
            return NO_LEADER
        return leader

    def leader_id(self, tp: TopicPartition) -> int:
        record = self.record(tp)
        return NO_LEADER if record is None else self.valid_leader(record)

    def leader_log(self, tp: TopicPartition) -> Log | None:
        p = self.leader(tp)
        return None if p is None else p.log

    def is_replica(self, tp: TopicPartition) -> bool:
        record = self.record(tp)
        return record is not None and self.node_id in record.replicas

    def live_nodes(self) -> Mapping[int, NodeAddress]:
        return {n: NodeAddress(n, reg.host, reg.port) for n, reg in self.view.nodes.items()}

    def wanted(self) -> Mapping[TopicPartition, Wanted]:
        """Every partition of every topic, with its assigned replicas (or None), replication factor and
        `unclean.leader.election.enable`: read by the controller thread, so it is a snapshot replaced whole on
        the loop (`topics_changed`), never mutated."""
        return self._wanted

    def topics_changed(self, name: str | None = None) -> None:
        """The registry's topics changed: rebuild the controller's snapshot; a deleted topic's replicas go."""
        wanted: dict[TopicPartition, Wanted] = {}
        for spec in list(self.registry.topics.values()):
            rf = spec.replication_factor or self.default_replication_factor
            unclean = spec.config.unclean_leader_election_enable
            for p in range(spec.partitions):
                replicas = spec.replicas_of(p)
                wanted[TopicPartition(spec.name, p)] = Wanted(replicas, len(replicas) if replicas else rf, unclean)
        self._wanted = wanted
        if self.controller is not None:
            self.controller.wake()
        for tp in [tp for tp in self.partitions if not self._known(tp)]:
            self._drop(tp, "its topic or partition is gone")

    # -- store records ---------------------------------------------------------------------------

    def apply_view(self, view: StoreView) -> None:
        """Make every local replica what its record says (the controller's `on_view`, on the loop)."""
        self.view = view
        live = {n: reg.incarnation for n, reg in view.nodes.items()}
        mine = {tp: v for tp, v in view.partitions.items()
                if self.node_id in v.record.replicas and self._known(tp)}
        for tp in [tp for tp in self.partitions if tp not in mine]:
            self._drop(tp, "its record no longer names this node a replica")
            if self._moved_away(tp):
                self.registry.delete_replica(tp)
        for tp in [tp for tp, log in self.registry.log_dir.logs.items()
                   if tp not in mine and self._moved_away(tp) and not holds_unreplicated(log)]:
            logger.warning("%s: node %d is no longer among its replicas %s (moved while this node was away): "
                           "deleting its log", tp, self.node_id, list(view.partitions[tp].record.replicas))
            self.registry.delete_replica(tp)
        for tp, versioned in mine.items():
            try:
                self._apply(tp, versioned, live)
                self._refused.pop(tp, None)
            except (TopicError, OSError) as exc:  # CapacityError is a TopicError: the others still apply
                if self._refused.get(tp) != str(exc):  # once per reason, not at every view
                    logger.error("%s: cannot host the replica the store assigns to node %d: %s", tp, self.node_id,
                                 exc)
                self._refused[tp] = str(exc)

    def _moved_away(self, tp: TopicPartition) -> bool:
        """The partition's record exists and names other nodes: a reassignment moved it off this one, whose log
        is then deleted (Kafka's StopReplica with delete). A partition without a record keeps its log."""
        versioned = self.view.partitions.get(tp)
        return versioned is not None and self._known(tp) and self.node_id not in versioned.record.replicas

    def _known(self, tp: TopicPartition) -> bool:
        spec = self.registry.topics.get(tp.topic)
        return spec is not None and 0 <= tp.partition < spec.partitions

    def _apply(self, tp: TopicPartition, versioned: Versioned, live: Mapping[int, str]) -> None:
        p = self.partitions.get(tp)
        if p is None:
            log = self.registry.ensure_log(tp)
            log.replicated = True
            p = self.partitions[tp] = Partition(log, PartitionState(tp, self.node_id))
        state, record = p.state, versioned.record
        if state.record is not None and record.partition_epoch < state.record.partition_epoch:
            return  # an older record than one already applied (Kafka ignores older partition epochs)
        if record.leader == self.node_id and self.controller is not None \
                and record.leader_incarnation == self.controller.incarnation:
            if state.role is Role.LEADER and state.leader_epoch == record.leader_epoch:
                state.update(versioned, live)
                self._leader_changed(p, wake=False)
            else:
                self._make_leader(p, versioned, live)
            return
        leader = self.valid_leader(record)
        if leader != NO_LEADER:
            if state.role is Role.FOLLOWER and state.leader_epoch == record.leader_epoch:
                state.update(versioned, live)
            else:
                self._make_follower(p, versioned, self.view.nodes[leader])
            return
        if state.role is not Role.NONE or state.leader_epoch != record.leader_epoch:
            self._stop_replicating(p, f"no valid leader in epoch {record.leader_epoch} (leader {record.leader})")
        state.resign(versioned)

    def _make_leader(self, p: Partition, versioned: Versioned, live: Mapping[int, str]) -> None:
        """Kafka's makeLeader: the new epoch starts at the log end, recorded before any append (KAFKA-7415)."""
        record, log = versioned.record, p.log
        self.delayed.fail(p.tp, NOT_LEADER_OR_FOLLOWER)  # parked under an older epoch of ours: never acknowledged
        if self.fetchers is not None:
            self.fetchers.unfollow(p.tp)
        with log.lock:
            log.leader_epoch_cache.assign(record.leader_epoch, log.log_end_offset)
            leo = log.log_end_offset
        p.state.become_leader(versioned, leo, self.clock_ms(), live)
        logger.info("%s: node %d leads in epoch %d from offset %d (high watermark %d, replicas %s, isr %s)",
                    p.tp, self.node_id, record.leader_epoch, leo, log.high_watermark, list(record.replicas),
                    list(record.isr))
        self._leader_changed(p)

    def _make_follower(self, p: Partition, versioned: Versioned, leader: NodeRegistration) -> None:
        record = versioned.record
        was_leader = p.state.role is Role.LEADER
        self.delayed.fail(p.tp, NOT_LEADER_OR_FOLLOWER)
        p.state.become_follower(versioned)
        if self.fetchers is not None:
            self.fetchers.follow(p.tp, leader, record.leader_epoch)
        logger.info("%s: node %d follows node %d in epoch %d from offset %d%s", p.tp, self.node_id, leader.node_id,
                    record.leader_epoch, p.log.log_end_offset, " (was leader)" if was_leader else "")
        self.wake_fetches(p.tp)

    def _stop_replicating(self, p: Partition, why: str) -> None:
        self.delayed.fail(p.tp, NOT_LEADER_OR_FOLLOWER)
        if self.fetchers is not None:
            self.fetchers.unfollow(p.tp)
        if p.state.role is not Role.NONE:
            logger.info("%s: node %d stops being %s: %s", p.tp, self.node_id, p.state.role.value, why)
        self.wake_fetches(p.tp)

    def _drop(self, tp: TopicPartition, why: str) -> None:
        """Forget a replica (its log stays on disk, unserved, as Kafka's strays do)."""
        p = self.partitions.pop(tp)
        self._stop_replicating(p, why)
        p.state.resign(None)

    def _before_delete(self, tp: TopicPartition) -> None:
        """A topic's log is about to be deleted: stop following and leading it first."""
        if tp in self.partitions:
            self._drop(tp, "its topic is being deleted")

    def on_fenced(self) -> None:
        """The session is lost or cannot be renewed: acknowledge nothing more (parked produces answer
        NOT_LEADER_OR_FOLLOWER so clients re-read Metadata); reads of committed data go on."""
        failed = self.delayed.fail_all(NOT_LEADER_OR_FOLLOWER)
        leading = [p.tp for p in self.partitions.values() if p.state.role is Role.LEADER]
        if leading:
            logger.warning("node %d is fenced (session lost): stops acknowledging writes to %s (%s answered "
                           "NOT_LEADER_OR_FOLLOWER)", self.node_id, plural(len(leading), "led partition"),
                           plural(failed, "parked produce"))
        for tp in leading:
            self.wake_fetches(tp)

    # -- throttles and bytes moved (the broker's follower reads, the fetchers' answers) ----------------

    def leader_held_back(self, p: Partition, replica: int) -> bool:
        """Kafka's shouldLeaderThrottle: answer this follower's fetch of `p` with no records now."""
        return self.leader_quota.exceeded() and self._leader_throttled(p, replica)

    def sent_to_follower(self, tp: TopicPartition, replica: int, size: int) -> None:
        """A follower's fetch took `size` bytes of `tp` from this leader."""
        p = self.partitions.get(tp)
        record = None if p is None else p.state.record
        if record is None:
            return
        if replica in record.adding_replicas:
            self.reassignment_bytes_out += size
        if self._leader_throttled(p, replica):
            self.leader_quota.record(size)

    def follower_held_back(self, tp: TopicPartition) -> bool:
        """Kafka's shouldFollowerThrottle: leave `tp` out of this node's next fetch."""
        return self.follower_quota.exceeded() and self._follower_throttled(tp)

    def fetched_as_follower(self, tp: TopicPartition, size: int) -> None:
        """The fetcher appended `size` bytes of `tp` from its leader."""
        record = self.record(tp)
        if record is not None and self.node_id in record.adding_replicas:
            self.reassignment_bytes_in += size
        if self._follower_throttled(tp):
            self.follower_quota.record(size)

    def _leader_throttled(self, p: Partition, replica: int) -> bool:
        record = p.state.record
        return (self.leader_quota.enabled and record is not None and replica not in record.isr
                and names_replica(p.log.config.leader_replication_throttled_replicas, p.tp.partition, self.node_id))

    def _follower_throttled(self, tp: TopicPartition) -> bool:
        p, record = self.partitions.get(tp), self.record(tp)
        return (self.follower_quota.enabled and p is not None and record is not None
                and self.node_id not in record.isr
                and names_replica(p.log.config.follower_replication_throttled_replicas, tp.partition, self.node_id))

    # -- the leader's work -----------------------------------------------------------------------

    def appended(self, p: Partition) -> None:
        """After a leader append: the high watermark may rise (a lone ISR), and fetches waiting on it wake."""
        self._leader_changed(p)

    def park(self, p: Partition, last_offset: int) -> Waiter:
        """Park an `acks=all` append until the high watermark passes `last_offset` (see `_outcome`)."""
        waiter = self.delayed.park(p.tp, last_offset + 1, p.leader_epoch)
        self.delayed.complete(p.tp, lambda w: self._outcome(p, w))
        return waiter

    def follower_fetched(self, p: Partition, replica: int, fetch_offset: int, log_start_offset: int,
                         leader_leo: int) -> bool:
        """A follower fetched from `fetch_offset` (its log end); False if it is not a follower of ours.

        As Kafka's Partition.updateFollowerFetchState, the leader's decisions are revisited only when they can
        change: the follower's log end moved, or it is not a settled ISR member (it may join), or an ISR change
        is in flight. A follower's Fetch names every partition it follows, idle ones too."""
        follower = p.state.followers.get(replica)
        before = None if follower is None else follower.log_end_offset
        if not p.state.follower_fetched(replica, fetch_offset, log_start_offset, leader_leo, self.clock_ms()):
            return False
        record = p.state.record
        if (fetch_offset != before or follower.replaced or p.state.pending is not None or record is None
                or replica not in record.isr):
            self._leader_changed(p, wake=False)
        return True

    def _leader_changed(self, p: Partition, *, wake: bool = True, shrink_lagging: bool = False) -> None:
        """Something the leader's decisions depend on moved: raise the high watermark if it may, answer the
        parked produces whose fate is known, propose an ISR change if one is due, and wake the fetches waiting
        on the partition (`wake`: new records or a new role, for every fetch; else, when the high watermark rose,
        the consumers' fetches only)."""
        if p.state.role is not Role.LEADER:
            return
        log, now = p.log, self.clock_ms()
        candidate = p.state.high_watermark(log.log_end_offset, now, self.lag_max_ms, log.config.min_insync_replicas)
        rose = candidate is not None and log.update_high_watermark(candidate)
        self.delayed.complete(p.tp, lambda w: self._outcome(p, w))
        self._maybe_propose(p, now, shrink_lagging)
        if wake:
            self.wake_fetches(p.tp)
        elif rose:
            self.wake_consumers(p.tp)

    def _outcome(self, p: Partition, waiter: Waiter) -> int | None:
        may_lead = self.controller is not None and self.controller.may_lead()
        return p.state.produce_outcome(waiter.required_offset, waiter.leader_epoch, p.log.high_watermark,
                                       p.log.config.min_insync_replicas, may_lead)

    def _maybe_propose(self, p: Partition, now: int, shrink_lagging: bool) -> None:
        if self.controller is None or not self.controller.may_lead():
            return
        new = p.state.isr_change(p.log.log_end_offset, p.log.high_watermark, now, self.lag_max_ms,
                                 shrink_lagging=shrink_lagging)
        if new is None and p.state.pending is None and p.state.record is not None:
            done = reassignment.complete(p.state.record, p.state.live)  # every target replica in sync: finish it
            if done is not None:
                pending = p.state.propose(done, now)
                logger.info("%s: leader %d completes the reassignment %s: replicas %s, isr %s, leader %d", p.tp,
                            self.node_id, reassignment.describe(pending.based_on.record), list(done.replicas),
                            list(done.isr), done.leader)
                self.controller.propose(p.tp, pending.based_on, done)
            return
        if new is None:
            return
        pending = p.state.propose(new, now)
        old = pending.based_on.record
        logger.info("%s: leader %d proposes isr %s -> %s in epoch %d (%s)", p.tp, self.node_id, list(old.isr),
                    list(new.isr), old.leader_epoch, _why(p.state, old.isr, new.isr))
        self.controller.propose(p.tp, pending.based_on, new)

    def check_isr(self) -> None:
        """Kafka's isr-expiration task: shrink out lagging followers (and send again a proposal no view answered)."""
        now = self.clock_ms()
        for p in list(self.partitions.values()):
            if p.state.role is not Role.LEADER:
                continue
            again = p.state.resend_pending(now, self.lag_max_ms // 2)
            if again is not None and self.controller is not None and self.controller.may_lead():
                self.controller.propose(p.tp, again.based_on, again.proposed)
            self._leader_changed(p, wake=False, shrink_lagging=True)

    async def _check_isr_forever(self) -> None:
        period = max(self.lag_max_ms // 2, 1) / 1000
        while True:
            await asyncio.sleep(period)
            try:
                self.check_isr()
            except Exception:  # noqa: BLE001 - the next round tries again; a dead task would freeze the ISR
                logger.exception("node %d: the ISR check failed", self.node_id)

    def rebalance_leaders(self) -> None:
        """Kafka's auto leader rebalance for the partitions this node leads (preferred_leader.py): where the
        preferred replica's node prefers more than its share of partitions it does not lead, hand it the
        leadership if it is in the ISR."""
        if self.leader_rebalance is None or self.controller is None or not self.controller.may_lead():
            return
        wanting = preferred_leader.imbalanced((v.record for v in self.view.partitions.values()), self.view,
                                              self.leader_rebalance.imbalance_percentage)
        now = self.clock_ms()
        for p in list(self.partitions.values()):
            record = p.state.record
            if p.state.role is not Role.LEADER or p.state.pending is not None or record is None \
                    or not record.replicas or record.replicas[0] not in wanting:
                continue
            new = preferred_leader.handover(record, self.view)
            if new is None:
                continue
            pending = p.state.propose(new, now)
            logger.info("%s: leader %d hands the leadership to its preferred replica %d (leader epoch %d -> %d)",
                        p.tp, self.node_id, new.leader, record.leader_epoch, new.leader_epoch)
            self.controller.propose(p.tp, pending.based_on, new)

    async def _rebalance_forever(self, interval_s: float) -> None:
        while True:
            await asyncio.sleep(interval_s)
            try:
                self.rebalance_leaders()
            except Exception:  # noqa: BLE001 - the next round tries again
                logger.exception("node %d: the preferred leader check failed", self.node_id)

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._tasks.append(loop.create_task(self._check_isr_forever()))
        if self.leader_rebalance is not None:
            self._tasks.append(loop.create_task(self._rebalance_forever(self.leader_rebalance.interval_ms / 1000)))

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []
        self.delayed.fail_all(NOT_LEADER_OR_FOLLOWER)


def _why(state: PartitionState, old: tuple[int, ...], new: tuple[int, ...]) -> str:
    """The reason an ISR change is proposed, for its log line."""
    gone = [r for r in old if r not in new]
    if not gone:
        return "caught up: " + ", ".join(f"node {r}" for r in new if r not in old)
    reasons = []
    for r in gone:
        f = state.followers.get(r)
        if f is None or f.incarnation is None or state.live.get(r) != f.incarnation:
            reasons.append(f"node {r} has no session")
        elif f.last_fetch_ms is None:
            reasons.append(f"node {r} has not fetched since its process or this epoch began")
        else:
            reasons.append(f"node {r} at offset {f.log_end_offset} has not caught up")
    return "; ".join(reasons)
