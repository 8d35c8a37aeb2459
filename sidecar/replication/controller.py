"""The node's control loop: its session in the store, elections, ISR writes, and the view the node acts on.

One daemon thread per node, in the shape of Patroni's HA loop (docs/replication.md): open a session, read the
store, run `election.decide` for each partition the node wants and write what it decides (compare-and-set),
carry out the ISR changes its leaders propose, end the session of a leader its fetchers find gone, and hand
each new view to the event loop. Store calls block, which is why this is a thread and not a coroutine.
A second thread does nothing but renew the session every `broker.heartbeat.interval.ms`: a slow view or write
(each up to the store's call timeout) on the control loop can then never delay a renewal, which on a loaded
machine fenced nodes that were alive and well.

Fencing is local and time-based: `may_lead()` is true only until the last successful renewal's *send* time
plus the session timeout minus one heartbeat. The store starts its clock when the renewal arrives, so the
node always stops leading before anyone else may start. Once fenced, a node never resumes a session: it
opens a new one under a new incarnation, which voids every leadership of the old one.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import uuid
from dataclasses import replace
from typing import Callable, Mapping, NamedTuple

from ..log.topic_partition import TopicPartition
from . import preferred_leader, reassignment
from .control_store import ControlStore, SessionLost, StoreUnavailable, StoreView, Versioned
from .election import NotEnoughLiveNodes, choose_replicas, decide
from .store_records import UNKNOWN_INCARNATION, NodeRegistration, PartitionRecord

logger = logging.getLogger(__name__)

ELECTIONS_PER_WRITE = 64  # within etcd's default --max-txn-ops (128): a compare and a put each


class Wanted(NamedTuple):
    """What the node knows of a partition it should hold: the assigned replicas (None: choose them from the
    live nodes), the replication factor, and the topic's `unclean.leader.election.enable`. A plain
    `(replicas, replication_factor)` tuple is accepted too."""

    replicas: tuple[int, ...] | None
    replication_factor: int
    unclean: bool = False


def new_incarnation() -> str:
    """A fresh id for one process's session (KIP-903's broker epoch): random, so restarts never reuse one."""
    return uuid.uuid4().hex


def alter_partition_error(based_on: PartitionRecord, new: PartitionRecord) -> str | None:
    """Why a leader's proposed ISR change is refused, or None: Kafka's controller checks of AlterPartition
    (`validateAlterPartitionData`) that do not depend on the store's version, which the CAS checks. A leader
    also completes a reassignment this way (KIP-455), possibly handing the leadership to a target replica, and
    hands it to the preferred replica (preferred_leader.py)."""
    if reassignment.is_completion(based_on, new) or preferred_leader.is_handover(based_on, new):
        return None
    if (new.adding_replicas, new.removing_replicas) != (based_on.adding_replicas, based_on.removing_replicas):
        return "an ISR change may not change a reassignment"
    if (new.leader, new.leader_incarnation, new.leader_epoch) != (
            based_on.leader, based_on.leader_incarnation, based_on.leader_epoch):
        return "an ISR change may not change the leader or its epoch"
    if new.replicas != based_on.replicas:
        return "an ISR change may not change the replicas"
    if new.partition_epoch != based_on.partition_epoch + 1:
        return f"partition epoch {new.partition_epoch} does not follow {based_on.partition_epoch}"
    if new.recovering and len(new.isr) > 1:
        return "a recovering leader may not add replicas to the ISR (KIP-704)"
    if new.recovering and not based_on.recovering:
        return "a recovered partition cannot become recovering again"
    return None


class Controller:
    """The control loop of one node. Thread-safe: `propose`, `delete`, `wake`, `may_lead` and `incarnation`
    are called from the event loop; `on_view` and `on_fenced` are run on it with `call_soon_threadsafe`.

    `wanted()` is called on the controller thread and must return a snapshot:
    {TopicPartition: Wanted or (replicas or None, replication_factor)}.
    """

    def __init__(self, store: ControlStore, me: NodeRegistration, *, session_ms: int, heartbeat_ms: int,
                 loop: asyncio.AbstractEventLoop, on_view: Callable[[StoreView], None],
                 on_fenced: Callable[[], None],
                 wanted: Callable[[], Mapping[TopicPartition, Wanted | tuple]], poll_ms: int = 100) -> None:
        if 3 * heartbeat_ms > session_ms:
            raise ValueError(f"heartbeat {heartbeat_ms} ms is more than a third of the session {session_ms} ms")
        self._store = store
        self._me = me
        self._session_ms = session_ms
        self._session_s = session_ms / 1000
        self._heartbeat_s = heartbeat_ms / 1000
        self._poll_s = min(poll_ms / 1000, self._heartbeat_s)
        self._loop = loop
        self._on_view = on_view
        self._on_fenced = on_fenced
        self._wanted = wanted
        self._lock = threading.Lock()
        self._proposals: dict[TopicPartition, tuple[Versioned, PartitionRecord]] = {}
        self._deletions: set[TopicPartition] = set()
        self._refusing: set[NodeRegistration] = set()  # leaders whose port refused a connection, to check
        self._judged: set[NodeRegistration] = set()  # refusing leaders already acted on (or declined): once each
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._session_open = False
        self._lead_until = 0.0  # monotonic; 0 while no session is known valid
        self._next_keepalive = 0.0
        self._next_read = 0.0  # the control loop reads a view at least this often (one heartbeat)
        # Session calls (open, renew, end) and the session fields go under this lock: the renewal thread and the
        # control loop both make them, and a renewal of a fenced incarnation must not revive `may_lead()`.
        self._session_lock = threading.Lock()
        self._lost: str | None = None  # the incarnation whose renewal found the session gone
        self._renew_down = False  # a failing renewal is logged once per outage
        self._errors: set[str] = set()  # unexpected errors of the loop, logged with a traceback once each
        self._delivered: tuple[str, str] | None = None
        self._store_down = False  # logged once per outage, not every retry
        self._early_revision: str | None = None  # the store said this revision changed; throttles a spurious one
        self._warned: set[tuple[TopicPartition, str]] = set()  # conditions logged once, not every round
        self._thread = threading.Thread(target=self._run, name=f"shale-controller-{me.node_id}", daemon=True)
        self._renewer = threading.Thread(target=self._keep_alive, name=f"shale-session-{me.node_id}", daemon=True)

    # -- the event loop's side ---------------------------------------------------------------------------

    def start(self) -> None:
        self._thread.start()
        self._renewer.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop the loop, end the session (the others see this node gone at once) and release the store."""
        self._stopping.set()
        self._wake.set()
        if self._thread.ident is None:  # never started: there is no session, only connections
            self._store.close()
            return
        self._thread.join(timeout_s)

    @property
    def incarnation(self) -> str:
        """The incarnation of the current (or next) session; a record names this node as leader only if it
        carries this value."""
        return self._me.incarnation

    @property
    def node(self) -> NodeRegistration:
        return self._me

    def may_lead(self) -> bool:
        """True while the session is certainly still valid in the store: a leader acknowledges nothing else."""
        return time.monotonic() < self._lead_until

    @property
    def leads_until(self) -> float:
        """The `time.monotonic()` at which `may_lead()` turns false unless a renewal succeeds first (0 when
        fenced): a replica manager can time its parked acknowledgements out at that moment."""
        return self._lead_until

    def propose(self, tp: TopicPartition, based_on: Versioned, new: PartitionRecord) -> None:
        """Queue a leader's ISR change (AlterPartition). It is written only if the record is still `based_on`
        and names this session as leader; the outcome shows in a later view. A newer proposal for the same
        partition replaces one not yet written."""
        error = alter_partition_error(based_on.record, new)
        if error is not None:
            raise ValueError(f"{tp}: {error}: {based_on.record} -> {new}")
        with self._lock:
            self._proposals[tp] = (based_on, new)
        self._wake.set()

    def delete(self, tp: TopicPartition) -> None:
        """Remove a deleted topic's partition record (retried until the store answers)."""
        with self._lock:
            self._deletions.add(tp)
            self._proposals.pop(tp, None)
        self._wake.set()

    def leader_refused(self, leader: NodeRegistration) -> None:
        """A connection to `leader`'s address was refused: no process listens there, so the process that
        registered it is gone (SIGKILL, crash). The controller ends its session now, rather than waiting up
        to `broker.session.timeout.ms` for it to expire, if it still leads a partition this node is in sync
        for (docs/replication.md, "Ending a dead leader's session")."""
        with self._lock:
            if leader in self._judged:
                return
            self._refusing.add(leader)
        self._wake.set()

    def wake(self) -> None:
        """Run the loop now rather than at the next renewal: `wanted()` has changed (a topic was created), and
        deliver the view again even if the store has not changed: records of a topic this node did not know yet
        were passed over when their view was applied (another node, whose manifests came first, may have
        created them), and a quiet store would not deliver them again."""
        self._delivered = None
        self._wake.set()

    # -- the controller thread ---------------------------------------------------------------------------

    def _run(self) -> None:
        try:
            while not self._stopping.is_set():
                self._wake.clear()  # before reading the queues: anything queued later wakes the next wait
                try:
                    self._iterate()
                    if self._store_down:
                        self._store_down = False
                        logger.info("node %d: the control store answers again", self._me.node_id)
                except SessionLost as exc:
                    self._fence(f"session lost ({exc})")
                except StoreUnavailable as exc:
                    if self._session_open and time.monotonic() >= self._lead_until:
                        self._fence(f"store unreachable for longer than the session allows ({exc})")
                    elif not self._store_down:
                        logger.warning("node %d: control store unreachable, retrying every %d ms: %s",
                                       self._me.node_id, self._poll_s * 1000, exc)
                    self._store_down = True
                    self._stopping.wait(self._poll_s)
                except Exception as exc:  # noqa: BLE001 - the loop must go on: a dead loop never leads again
                    self._unexpected("control loop", exc)
                    if self._session_open and time.monotonic() >= self._lead_until:
                        self._fence(f"the control loop failed for longer than the session allows ({exc!r})")
                    self._stopping.wait(self._poll_s)
        finally:
            self._close()

    def _unexpected(self, where: str, exc: Exception) -> None:
        """Log an error no store or session exception explains: with its traceback the first time, briefly
        after (a persistent one would flood the log every poll)."""
        if repr(exc) not in self._errors:
            self._errors.add(repr(exc))
            logger.exception("node %d: %s: unexpected error; retrying every %d ms", self._me.node_id, where,
                             self._poll_s * 1000)
        else:
            logger.warning("node %d: %s: %r again", self._me.node_id, where, exc)

    # -- the session thread ------------------------------------------------------------------------------

    def _keep_alive(self) -> None:
        """Renew the open session every heartbeat; a failure is retried every poll until `may_lead()`'s
        deadline passes, and then the control loop fences. A session found gone ends leading at once."""
        while not self._stopping.is_set():
            with self._session_lock:
                due = self._next_keepalive - time.monotonic() if self._session_open else self._poll_s
                if due <= 0:
                    due = self._renew_once()
            self._stopping.wait(due)

    def _renew_once(self) -> float:
        """One renewal, under the session lock; the seconds until the next attempt."""
        sent = time.monotonic()
        try:
            self._store.keepalive()
        except SessionLost as exc:
            self._lead_until = 0.0
            self._lost = self._me.incarnation
            self._wake.set()
            logger.warning("node %d: renewal: %s", self._me.node_id, exc)
            return self._poll_s
        except StoreUnavailable as exc:
            if not self._renew_down:
                self._renew_down = True
                logger.warning("node %d: session renewal failed, retrying every %d ms: %s", self._me.node_id,
                               self._poll_s * 1000, exc)
            return self._poll_s
        except Exception as exc:  # noqa: BLE001 - as the control loop: renewing must go on
            self._unexpected("session renewal", exc)
            return self._poll_s
        if self._renew_down:
            self._renew_down = False
            logger.info("node %d: session renewed again", self._me.node_id)
        self._renewed(sent)
        return self._heartbeat_s

    def _iterate(self) -> None:
        now = time.monotonic()
        if self._lost is not None and self._lost == self._me.incarnation:
            self._fence("its renewal found the session gone")
        elif self._session_open and now >= self._lead_until:  # e.g. woken from SIGSTOP: the session may be gone
            self._fence(f"its last renewal was sent {now - self._next_keepalive + self._heartbeat_s:.3f} s ago")
        if not self._session_open:
            self._open_session()
        self._next_read = time.monotonic() + self._heartbeat_s
        view = self._store.view()
        if not view.is_live(self._me.node_id, self._me.incarnation):
            raise SessionLost(f"the store no longer lists node {self._me.node_id} incarnation {self._me.incarnation}")
        wrote = self._write(view)
        self._deliver(view)
        if not wrote:  # after a write, read again at once: the replicas must act on the new records
            self._wait_for_change(view.revision)

    def _open_session(self) -> None:
        with self._session_lock:
            sent = time.monotonic()
            self._store.open_session(self._me, self._session_ms)
            self._session_open = True
            self._renewed(sent)
        logger.info("node %d: session opened, incarnation %s", self._me.node_id, self._me.incarnation)

    def _renewed(self, sent: float) -> None:
        self._lead_until = sent + self._session_s - self._heartbeat_s
        self._next_keepalive = sent + self._heartbeat_s

    def _fence(self, reason: str) -> None:
        """Stop leading now and prepare a new session under a new incarnation (never resume the old one)."""
        self._lead_until = 0.0  # at once, even while a renewal in flight holds the lock
        with self._session_lock:  # a renewal in flight for the old incarnation finishes first, and is void
            self._lead_until = 0.0
            was_open, self._session_open = self._session_open, False
            old = self._me.incarnation
            self._me = replace(self._me, incarnation=new_incarnation())
        logger.warning("node %d: fenced, incarnation %s: %s; next incarnation %s",
                       self._me.node_id, old, reason, self._me.incarnation)
        if was_open:
            self._call_on_loop(self._on_fenced)

    def _write(self, view: StoreView) -> bool:
        """Deletions, then the leaders' ISR proposals, then elections; True if anything was written."""
        # Items leave the queues only once done: a StoreUnavailable leaves the rest for the next round, where
        # a write whose answer was lost is settled by the view (its version has moved on if it landed).
        with self._lock:
            deletions, proposals = set(self._deletions), dict(self._proposals)
            refusing, self._refusing = self._refusing, set()
        ended = {leader.node_id for leader in refusing if self._end_session_of(view, leader)}
        wrote = bool(ended)
        if ended:  # elect now, on the view as the store has it after the ended sessions (the CAS guards the rest)
            view = replace(view, nodes={n: r for n, r in view.nodes.items() if n not in ended})
        for tp in deletions:
            self._store.delete_partition(tp)
            with self._lock:
                self._deletions.discard(tp)
            logger.info("node %d: deleted the partition record of %s", self._me.node_id, tp)
            wrote = True
        for tp, proposal in proposals.items():
            wrote |= self._alter(view, tp, *proposal)
            with self._lock:
                if self._proposals.get(tp) is proposal:
                    del self._proposals[tp]
        elections: list[tuple[TopicPartition, Versioned, PartitionRecord]] = []
        for tp, wanted in self._in_my_order(list(self._wanted().items()), view):
            if tp not in deletions:
                wrote |= self._elect(view, tp, Wanted(*wanted), elections)
        for start in range(0, len(elections), ELECTIONS_PER_WRITE):
            self._write_elections(elections[start:start + ELECTIONS_PER_WRITE])
        return wrote

    def _in_my_order(self, items: list, view: StoreView) -> list:
        """The partitions rotated by this node's rank among the live ones: when a node that led many partitions
        dies, every survivor elects them all (the CAS lets one write land), and in one shared order they would
        race on each in turn; rotated, each starts where no other does, and the last partition of the list is
        not the last elected everywhere."""
        live = sorted(view.nodes)
        if not items or self._me.node_id not in live:
            return items
        start = live.index(self._me.node_id) * len(items) // len(live)
        return items[start:] + items[:start]

    def _end_session_of(self, view: StoreView, leader: NodeRegistration) -> bool:
        """End the session of a leader whose port refused this node's connection, if that process still holds
        it and leads a partition whose ISR holds this node as the process it is (so the election that follows
        is the clean one among the ISR, which is safe whether or not the old leader lives)."""
        if not view.is_live(leader.node_id, leader.incarnation) or leader.node_id == self._me.node_id:
            with self._lock:
                self._judged.add(leader)
            return False
        led = [tp for tp, v in view.partitions.items()
               if (v.record.leader, v.record.leader_incarnation) == (leader.node_id, leader.incarnation)
               and self._me.node_id in v.record.isr
               and v.record.isr_incarnation(self._me.node_id) in (self._me.incarnation, UNKNOWN_INCARNATION)]
        if not self.may_lead():
            return False  # this node's own session is in doubt: the fetcher's next refusal asks again
        if not led:
            with self._lock:
                self._judged.add(leader)
            logger.info("node %d: leader node %d (incarnation %s) refuses connections; this node is not in sync for "
                        "a partition it leads: its session is left to expire", self._me.node_id, leader.node_id,
                        leader.incarnation)
            return False
        ended = self._store.end_session(leader)  # StoreUnavailable: the fetcher's next refusal asks again
        with self._lock:
            self._judged.add(leader)
        logger.warning("node %d: leader node %d (incarnation %s) refuses connections at %s:%d: %s its session so "
                       "that %s elect a new leader now", self._me.node_id, leader.node_id, leader.incarnation,
                       leader.host, leader.port, "ended" if ended else "did not need to end",
                       ", ".join(map(str, sorted(led)[:5])) + (" …" if len(led) > 5 else ""))
        return ended

    def _alter(self, view: StoreView, tp: TopicPartition, based_on: Versioned, new: PartitionRecord) -> bool:
        current = view.partitions.get(tp)
        if (current is None or current.version != based_on.version or not self.may_lead()
                or (based_on.record.leader, based_on.record.leader_incarnation)
                != (self._me.node_id, self._me.incarnation)):
            logger.info("node %d: %s: ISR change %s -> %s dropped: the record or this session has moved on",
                        self._me.node_id, tp, based_on.record.isr, new.isr)
            return False
        if self._store.update_partition(tp, new, based_on.version):
            logger.info("node %d: %s: ISR %s -> %s in leader epoch %d (partition epoch %d)", self._me.node_id, tp,
                        based_on.record.isr, new.isr, new.leader_epoch, new.partition_epoch)
        else:
            logger.info("node %d: %s: ISR change %s -> %s missed: the record changed", self._me.node_id, tp,
                        based_on.record.isr, new.isr)
        return True

    def _elect(self, view: StoreView, tp: TopicPartition, wanted: Wanted,
               elections: list[tuple[TopicPartition, Versioned, PartitionRecord]]) -> bool:
        """Decide one partition: a new record is created at once, an election of an existing one joins
        `elections`, written together afterwards; True if anything is (to be) written."""
        current = view.partitions.get(tp)
        if current is not None and self._me.node_id not in current.record.replicas:
            return False  # only a partition's own replicas elect its leader
        try:
            replicas = current.record.replicas if current is not None else (
                wanted.replicas or choose_replicas(view.nodes, wanted.replication_factor, tp.partition, tp.topic))
            new = decide(current, replicas, view, wanted.unclean, tp=tp)
        except ValueError as exc:  # too few live nodes (it waits), or an assignment no record can hold
            self._warn_once(tp, "create", "not creating its record %s: %s",
                            "yet" if isinstance(exc, NotEnoughLiveNodes) else "(fix its assignment)", exc)
            return False
        if new is None and current is not None and wanted.replicas \
                and wanted.replicas != current.record.target_replicas:
            return self._reassign(view, tp, current, wanted.replicas)
        if new is None:
            return False
        if current is not None:
            elections.append((tp, current, new))
            return True
        self._log_election(tp, None, new, self._store.create_partition(tp, new))
        return True

    def _write_elections(self, elections: list[tuple[TopicPartition, Versioned, PartitionRecord]]) -> None:
        """Elections written together (`ControlStore.update_partitions`: one etcd transaction). A node that led
        many partitions dies: its survivors elect them all at once, and the first batch to land wins every one
        (the others' miss, re-read, and find nothing left to decide), rather than one round trip each."""
        landed = self._store.update_partitions([(tp, new, current.version) for tp, current, new in elections])
        for tp, current, new in elections:
            self._log_election(tp, current.record, new, landed)

    def _log_election(self, tp: TopicPartition, before: PartitionRecord | None, new: PartitionRecord,
                      landed: bool) -> None:
        was = "none" if before is None else f"leader {before.leader} epoch {before.leader_epoch} isr {before.isr}"
        logger.info("node %d: %s: %s -> leader %d epoch %d isr %s%s%s", self._me.node_id, tp, was, new.leader,
                    new.leader_epoch, new.isr, " (unclean, recovering)" if new.recovering and not
                    (before and before.recovering) else "", "" if landed else ": another node wrote first")

    def _reassign(self, view: StoreView, tp: TopicPartition, current: Versioned, target: tuple[int, ...]) -> bool:
        """The assignment (a manifest's, a topic record's) names other replicas than the record's target: start
        the move there (docs/moves.md). Every replica computes the same record, so concurrent writers agree."""
        try:
            reassignment.check_target(target, view.nodes)
        except reassignment.InvalidTarget as exc:
            self._warn_once(tp, f"reassign {target}", "not moving to the assigned replicas: %s", exc)
            return False
        new = reassignment.start(current.record, target, {n: r.incarnation for n, r in view.nodes.items()})
        if new is None:
            return False
        landed = self._store.update_partition(tp, new, current.version)
        logger.info("node %d: %s: reassignment of replicas %s to %s: record %s%s", self._me.node_id, tp,
                    list(current.record.replicas), list(target), reassignment.describe(new),
                    "" if landed else ": another node wrote first")
        return True

    def _warn_once(self, tp: TopicPartition, kind: str, message: str, *args: object) -> None:
        """Log a condition of a partition once, not every round of the loop."""
        if (tp, kind) not in self._warned:
            self._warned.add((tp, kind))
            logger.warning("node %d: %s: " + message, self._me.node_id, tp, *args)

    def _deliver(self, view: StoreView) -> None:
        key = (view.revision, self._me.incarnation)
        if key != self._delivered:
            self._delivered = key
            self._call_on_loop(self._on_view, view)

    def _wait_for_change(self, revision: str) -> None:
        """Wait for a store change, a wake-up, or the next renewal, whichever is first. The store's wait is
        cut into `poll_ms` slices so that a proposal or a new topic is acted on within one slice."""
        while not self._wake.is_set():
            left = self._next_read - time.monotonic()
            if left <= 0:
                return
            slice_s = min(left, self._poll_s)
            if revision == self._early_revision:  # the last early return was spurious: do not spin on it
                self._early_revision = None
                self._wake.wait(slice_s)
                continue
            started = time.monotonic()
            self._store.wait_for_change(revision, slice_s)
            if time.monotonic() - started < slice_s * 0.9:
                self._early_revision = revision  # the store changed (or a spurious return, which costs one read)
                return

    def _call_on_loop(self, callback: Callable, *args: object) -> None:
        try:
            self._loop.call_soon_threadsafe(callback, *args)
        except RuntimeError:  # the loop is closed: the node is shutting down
            self._stopping.set()

    def _close(self) -> None:
        self._lead_until = 0.0
        self._stopping.set()
        if self._renewer.ident is not None:
            self._renewer.join()  # it waits on `_stopping`; at most one renewal is in flight
        try:
            if self._session_open:
                self._store.close_session()
        except (StoreUnavailable, SessionLost) as exc:
            logger.warning("node %d: could not end the session (it will expire): %s", self._me.node_id, exc)
        finally:
            self._session_open = False
            self._store.close()
