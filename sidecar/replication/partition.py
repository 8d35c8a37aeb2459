"""One local replica's replication state, as pure functions of the committed record, the live nodes and time.

The leader keeps what Kafka's `Partition`/`Replica` keep (docs/replication.md, "ISR"): per follower its log
end offset, when it last caught up and the leader's log end offset at its previous fetch; the committed
partition record; at most one ISR change in flight. From these it decides the high watermark, the next ISR
change and the fate of a parked `acks=all` produce. Nothing here touches a log or the store: the replica
manager feeds numbers in and carries the answers out, so every rule is testable without I/O.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Mapping

from ..log.topic_partition import TopicPartition
from ..protocol.error_codes import (
    FENCED_LEADER_EPOCH,
    NONE,
    NOT_ENOUGH_REPLICAS_AFTER_APPEND,
    NOT_LEADER_OR_FOLLOWER,
    UNKNOWN_LEADER_EPOCH,
)
from .control_store import Versioned
from .store_records import UNKNOWN_INCARNATION, PartitionRecord

NO_EPOCH = -1  # a request that carries no leader epoch (Kafka's Optional.empty)


class Role(enum.Enum):
    NONE = "none"  # not a replica with a valid leader: no leader elected, or our own previous incarnation leads
    LEADER = "leader"
    FOLLOWER = "follower"


@dataclass(slots=True)
class FollowerState:
    """The leader's view of one follower (Kafka's ReplicaState), reset whenever a new leader epoch starts or the
    follower's process changes."""

    incarnation: str | None  # the follower's process when this state began; None = not live then
    log_end_offset: int = -1  # -1: not fetched yet in this epoch
    log_start_offset: int = -1
    last_caught_up_ms: int | None = None  # None: never caught up in this epoch
    last_fetch_leader_leo: int = -1
    last_fetch_ms: int | None = None
    # Its process changed while it was a member: out of sync at once (KIP-903), until it catches up or the
    # ISR without it is committed.
    replaced: bool = False

    def fetched(self, fetch_offset: int, log_start_offset: int, leader_leo: int, now_ms: int) -> None:
        """Kafka's Replica.updateFetchState: reaching the leader's end now, or its end at the previous fetch,
        counts as caught up at that fetch."""
        if fetch_offset >= leader_leo:
            self.last_caught_up_ms = _later(self.last_caught_up_ms, now_ms)
        elif self.last_fetch_ms is not None and fetch_offset >= self.last_fetch_leader_leo:
            self.last_caught_up_ms = _later(self.last_caught_up_ms, self.last_fetch_ms)
        self.log_end_offset = fetch_offset
        self.log_start_offset = log_start_offset
        self.last_fetch_leader_leo = leader_leo
        self.last_fetch_ms = now_ms

    def caught_up(self, leader_leo: int, now_ms: int, max_lag_ms: int) -> bool:
        return self.log_end_offset == leader_leo or (
            self.last_caught_up_ms is not None and now_ms - self.last_caught_up_ms <= max_lag_ms)


@dataclass(frozen=True, slots=True)
class PendingChange:
    """An ISR change handed to the controller and not yet seen committed (or missed) in a view."""

    based_on: Versioned[PartitionRecord]
    proposed: PartitionRecord
    since_ms: int


@dataclass(slots=True)
class PartitionState:
    """One replica of `tp` on node `me`: its role, the committed record and, on the leader, its followers."""

    tp: TopicPartition
    me: int
    role: Role = Role.NONE
    committed: Versioned[PartitionRecord] | None = None
    leader_epoch: int = NO_EPOCH
    leader_epoch_start_offset: int = -1  # the leader's LEO when its epoch began (followers expand only past it)
    followers: dict[int, FollowerState] = field(default_factory=dict)
    live: Mapping[int, str] = field(default_factory=dict)  # live node id -> incarnation, from the last view
    pending: PendingChange | None = None

    # -- transitions ---------------------------------------------------------------------------

    def become_leader(self, versioned: Versioned[PartitionRecord], leader_leo: int, now_ms: int,
                      live: Mapping[int, str]) -> None:
        """Kafka's makeLeader for a new epoch: every follower starts afresh; ISR members count as caught up now."""
        record = versioned.record
        self.role, self.committed, self.live, self.pending = Role.LEADER, versioned, dict(live), None
        self.leader_epoch = record.leader_epoch
        self.leader_epoch_start_offset = leader_leo
        self.followers = {r: FollowerState(self.live.get(r), last_caught_up_ms=now_ms if r in record.isr else None)
                          for r in record.replicas if r != self.me}

    def become_follower(self, versioned: Versioned[PartitionRecord]) -> None:
        self.role, self.committed, self.pending = Role.FOLLOWER, versioned, None
        self.leader_epoch = versioned.record.leader_epoch
        self.followers = {}
        self.leader_epoch_start_offset = -1

    def resign(self, versioned: Versioned[PartitionRecord] | None) -> None:
        """No valid leader we could follow or be (elections pending, or a record naming our previous process)."""
        self.role, self.pending, self.followers, self.leader_epoch_start_offset = Role.NONE, None, {}, -1
        if versioned is not None:
            self.committed = versioned
            self.leader_epoch = versioned.record.leader_epoch

    def update(self, versioned: Versioned[PartitionRecord], live: Mapping[int, str]) -> None:
        """A newer record in the same role and leader epoch (an ISR change), and the live nodes of its view.

        A follower whose process changed (or whose session ended) starts afresh: it is out of sync at once, as
        KRaft's controller drops fenced brokers, and must catch up again to return."""
        self.committed = versioned
        self.live = dict(live)
        if self.pending is not None and versioned.version != self.pending.based_on.version:
            self.pending = None  # landed, or someone else wrote first: decide again from this record
        if self.role is not Role.LEADER:
            return
        for r in versioned.record.replicas:
            if r == self.me:
                continue
            state = self.followers.get(r)
            if state is None or state.incarnation != self.live.get(r):
                state = self.followers[r] = FollowerState(self.live.get(r), replaced=state is not None)
            if r not in versioned.record.isr:
                state.replaced = False
        for r in [r for r in self.followers if r not in versioned.record.replicas]:
            del self.followers[r]

    def follower_fetched(self, replica: int, fetch_offset: int, log_start_offset: int, leader_leo: int,
                         now_ms: int) -> bool:
        """Record a follower's fetch; False if `replica` is not a follower of this leader."""
        state = self.followers.get(replica)
        if self.role is not Role.LEADER or state is None:
            return False
        state.fetched(fetch_offset, log_start_offset, leader_leo, now_ms)
        return True

    # -- decisions -----------------------------------------------------------------------------

    @property
    def record(self) -> PartitionRecord | None:
        return None if self.committed is None else self.committed.record

    def min_isr(self, min_insync_replicas: int) -> int:
        """Kafka's effectiveMinIsr: `min.insync.replicas` capped by the replication factor."""
        record = self.record
        return min(min_insync_replicas, len(record.replicas)) if record is not None else min_insync_replicas

    def under_min_isr(self, min_insync_replicas: int) -> bool:
        record = self.record
        return record is None or len(record.isr) < self.min_isr(min_insync_replicas)

    def maximal_isr(self) -> frozenset[int]:
        """The committed ISR plus a pending expansion (KIP-497): what the high watermark waits for. A pending
        shrink is not applied until committed, so the high watermark never outruns a member a new leader
        could come from."""
        record = self.record
        isr = set(record.isr) if record is not None else set()
        if self.pending is not None:
            isr |= set(self.pending.proposed.isr)
        return frozenset(isr)

    def eligible(self, replica: int) -> bool:
        """A follower may be (or stay) in the ISR only as the live process whose fetches we have been counting,
        and a member only as the process the record says it was in sync as (KIP-903: a restart while no leader
        watched may have lost what it had not flushed)."""
        state = self.followers.get(replica)
        if state is None or state.incarnation is None or self.live.get(replica) != state.incarnation:
            return False
        record = self.record
        if record is None or replica not in record.isr:
            return True
        recorded = record.isr_incarnation(replica)
        return recorded == UNKNOWN_INCARNATION or recorded == state.incarnation

    def high_watermark(self, leader_leo: int, now_ms: int, max_lag_ms: int, min_insync_replicas: int) -> int | None:
        """Kafka's maybeIncrementLeaderHW candidate: the leader's end offset lowered to every maximal-ISR member's
        (and every caught-up, eligible follower's, so that it can join); None while under the minimum ISR
        (KAFKA-15583) or when not leading. The caller keeps it from moving back."""
        if self.role is not Role.LEADER or self.under_min_isr(min_insync_replicas):
            return None
        maximal = self.maximal_isr()
        hw = leader_leo
        for r, state in self.followers.items():
            joining = state.caught_up(leader_leo, now_ms, max_lag_ms) and self.eligible(r)
            if (r in maximal or joining) and state.log_end_offset < hw:
                hw = state.log_end_offset
        return hw

    def isr_change(self, leader_leo: int, high_watermark: int, now_ms: int, max_lag_ms: int, *,
                   shrink_lagging: bool = False) -> PartitionRecord | None:
        """The next ISR change to propose, or None: shrink out members whose session ended or process changed (at
        once) or that lag (only when `shrink_lagging`: Kafka's isr-expiration timer), else expand in eligible followers at or past
        the high watermark and the start of this leader epoch. One change at a time (none while one is pending);
        an expansion also ends an unclean leader's recovery. Shrinking laggards on the timer only keeps a
        follower that rejoined at a frozen high watermark (under min.insync.replicas) from being shrunk again at
        its next fetch while its caught-up time is still old: the ISR changes at most once per timer period."""
        record = self.record
        if self.role is not Role.LEADER or self.pending is not None or record is None:
            return None
        out = [r for r in record.isr if r != self.me and (not self.eligible(r) or (
            (shrink_lagging or self.followers[r].replaced)
            and not self.followers[r].caught_up(leader_leo, now_ms, max_lag_ms)))]
        if out:
            return record.changed(isr=tuple(r for r in record.isr if r not in out))
        joining = {r for r, s in self.followers.items()
                   if r not in record.isr and self.eligible(r) and s.log_end_offset >= high_watermark
                   and s.log_end_offset >= self.leader_epoch_start_offset}
        if joining:
            isr = tuple(r for r in record.replicas if r in record.isr or r in joining)
            # each newcomer recorded as the process whose fetches caught it up (KIP-903)
            incarnations = tuple(self.followers[r].incarnation or UNKNOWN_INCARNATION if r in joining
                                 else record.isr_incarnation(r) for r in isr)
            return record.changed(isr=isr, isr_incarnations=incarnations, recovering=False)
        return None

    def propose(self, new: PartitionRecord, now_ms: int) -> PendingChange:
        assert self.committed is not None
        self.pending = PendingChange(self.committed, new, now_ms)
        return self.pending

    def resend_pending(self, now_ms: int, retry_ms: int) -> PendingChange | None:
        """The pending change again if no view has answered it for `retry_ms` (to hand to the controller once
        more). It is never forgotten on a timer: a pending expansion already holds the high watermark back for
        its new member, and the write may still land; only a view with another version ends it."""
        if self.pending is None or now_ms - self.pending.since_ms < retry_ms:
            return None
        self.pending = PendingChange(self.pending.based_on, self.pending.proposed, now_ms)
        return self.pending

    def produce_outcome(self, required_offset: int, append_epoch: int, high_watermark: int,
                        min_insync_replicas: int, may_lead: bool) -> int | None:
        """Kafka's checkEnoughReplicasReachOffset for a parked `acks=all` append: an error code to answer with,
        or None to keep waiting. An append made in another leader epoch is never acknowledged: a leader that
        lost and regained leadership may have truncated it meanwhile."""
        if self.role is not Role.LEADER or self.leader_epoch != append_epoch or not may_lead:
            return NOT_LEADER_OR_FOLLOWER
        if high_watermark < required_offset:
            return None
        return NOT_ENOUGH_REPLICAS_AFTER_APPEND if self.under_min_isr(min_insync_replicas) else NONE

    def check_epoch(self, current_leader_epoch: int) -> int:
        """Kafka's checkCurrentLeaderEpoch for requests that carry one (-1: none carried)."""
        if current_leader_epoch == NO_EPOCH or current_leader_epoch == self.leader_epoch:
            return NONE
        return FENCED_LEADER_EPOCH if current_leader_epoch < self.leader_epoch else UNKNOWN_LEADER_EPOCH


def _later(a: int | None, b: int) -> int:
    return b if a is None else max(a, b)
