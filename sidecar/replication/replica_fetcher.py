"""The follower's fetchers: one connection per leader node, on the node's event loop (Kafka's
ReplicaFetcherThread, one per source broker).

`ReplicaManager` says whom each local replica follows (`follow(tp, leader, leader_epoch)`) and when it stops
(`unfollow(tp)`). Each leader — a node's registration, so a restarted node is a new one — gets a task that
long-polls it with Fetch v12 — `replica_id` = this node,
per partition `current_leader_epoch`, `fetch_offset` = our log end, `last_fetched_epoch` = our latest epoch —
and hands each partition's answer to `follower.py`, which appends, raises the high watermark or truncates.
Errors back the partition off for `replica.fetch.backoff.ms` (FENCED/UNKNOWN_LEADER_EPOCH, NOT_LEADER: a new
state from the store ends the wait at once); OFFSET_OUT_OF_RANGE asks the leader's log start and end with
ListOffsets; a lost connection is reopened after the same backoff.

Answers are applied on the loop, synchronously, with the log's lock; a state replaced or removed while its
fetch was in flight makes the answer stale, and it is dropped (Kafka compares the fetch offset and epoch).
"""

from __future__ import annotations

import asyncio
import logging
import select
import socket
import time
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Iterable, Protocol

from ..log.errors import LogError
from ..log.log import Log
from ..log.topic_partition import TopicPartition
from ..protocol import error_codes
from ..protocol.client_codec import decode_response, encode_request
from ..protocol.codec import ProtocolError
from ..server_config import ServerConfig
from .fetch_session_handler import FetchSessionHandler
from .follower import (
    FollowState,
    UnreplicatedRecordsKept,
    apply_fetched,
    apply_reset,
    start_following,
)
from .response_frames import ResponseFrames
from .store_records import NodeRegistration

logger = logging.getLogger(__name__)

FETCH, LIST_OFFSETS = 1, 2
FETCH_VERSION = 12  # topic names (v13+ needs topic ids), LastFetchedEpoch and DivergingEpoch (v12+)
LIST_OFFSETS_VERSION = 7  # CurrentLeaderEpoch (v4+)
LATEST, EARLIEST = -1, -2
NO_EPOCH = -1


@dataclass(frozen=True, slots=True)
class FetcherConfig:
    """Kafka's replica fetcher settings (`replica.fetch.*`, `replica.socket.timeout.ms`), and the node's
    `broker.session.timeout.ms`: how long a lost connection counts as news of the leader's death (`lost`)."""

    wait_max_ms: int  # the long poll at the leader
    min_bytes: int
    max_bytes: int  # per partition, and the largest piece appended at once
    response_max_bytes: int  # per fetch, over all partitions of one leader
    backoff_ms: int  # after a partition error or a lost connection
    socket_timeout_ms: int  # connecting, and an answer beyond the long poll
    session_timeout_ms: int  # a lost leader connection hides the leader from Metadata at most this long

    @classmethod
    def from_server_config(cls, config: ServerConfig) -> FetcherConfig:
        return cls(config.replica_fetch_wait_max_ms, config.replica_fetch_min_bytes, config.replica_fetch_max_bytes,
                   config.replica_fetch_response_max_bytes, config.replica_fetch_backoff_ms,
                   config.replica_socket_timeout_ms, config.broker_session_timeout_ms)


# (host, port) -> an open (and, on a secured listener, authenticated) connection to a leader
Connector = Callable[[str, int], Awaitable[tuple[asyncio.StreamReader, asyncio.StreamWriter]]]


class LeaderUnreachable(Exception):
    """The connection to a leader failed or broke; every partition fetched from it backs off. `refused`: the
    connection was refused, so no process listens at the leader's address any more."""

    def __init__(self, message: str, refused: bool = False) -> None:
        super().__init__(message)
        self.refused = refused


class _Connection:
    """One TCP connection to a leader, one request in flight at a time. Answers are read by `ResponseFrames`
    (each into one buffer of its size), requests written to the transport directly: they are small."""

    def __init__(self, node: NodeRegistration, client_id: str, timeout_s: float, connect: Connector) -> None:
        self.node = node
        self.connect = connect
        self.client_id = client_id
        self.timeout_s = timeout_s
        self._frames: ResponseFrames | None = None
        self._writer: asyncio.StreamWriter | None = None  # kept: a StreamWriter collected closes its transport
        self._correlation_id = 0

    async def request(self, api_key: int, version: int, body: dict, extra_wait_s: float = 0.0, *,
                      views: bool = False) -> Any:
        """Send one request and return the decoded response body; LeaderUnreachable on any failure.

        With `views`, the body's bytes fields (a Fetch answer's records) are views into the frame's buffer, not
        copies: valid only until the next request, which reads its answer into the same buffer."""
        where = f"node {self.node.node_id} at {self.node.host}:{self.node.port}"
        try:
            if self._frames is None:
                async with asyncio.timeout(self.timeout_s):
                    _reader, self._writer = await self.connect(self.node.host, self.node.port)
                sock = self._writer.get_extra_info("socket")
                if sock is not None:
                    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                self._frames = ResponseFrames.take_over(self._writer.transport, where)
            frames = self._frames
            self._correlation_id = (self._correlation_id + 1) & 0x7FFFFFFF
            cid = self._correlation_id
            if frames.transport.is_closing():
                raise ConnectionResetError("connection closing")
            frames.transport.write(encode_request(api_key, version, cid, self.client_id, body))
            async with asyncio.timeout(self.timeout_s + extra_wait_s):
                frame = await frames.next_frame()
            response = decode_response(api_key, version, frame, views=views)
            if response.correlation_id != cid:
                raise ProtocolError(api_key, version, response.correlation_id,
                                    f"answer to correlation id {response.correlation_id}, expected {cid}")
            return response.body
        except (OSError, EOFError, asyncio.TimeoutError, ProtocolError) as exc:
            self.close()
            raise LeaderUnreachable(f"{where}: {exc!r}", isinstance(exc, ConnectionRefusedError)) from exc

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
        self._frames = self._writer = None

    def peer_closed(self) -> bool:
        """The leader's end of the connection is closed (FIN or RST reached this host), asked of the kernel
        without reading: true as soon as the leader process dies, before the fetch task is resumed with the
        end of its stream (a Metadata request that arrives in the same loop iteration must see it too)."""
        sock = None if self._frames is None else self._frames.transport.get_extra_info("socket")
        if sock is None or not hasattr(select, "POLLRDHUP"):
            return False
        fd = sock.fileno()
        if fd < 0:  # closed on this side already (asyncio closes the socket before the fetch task learns of it)
            return True
        poller = select.poll()
        poller.register(fd, select.POLLRDHUP)
        return any(events & (select.POLLRDHUP | select.POLLHUP | select.POLLERR) for _, events in poller.poll(0))


class _LeaderLink:
    """The fetch loop of one leader process (a node's registration: id, incarnation, address): a task that
    lives while any partition follows it. A restarted leader is a new registration, so a new link and a new
    connection; the old link's partitions move as the store's records name the new one."""

    def __init__(self, owner: "ReplicaFetchers", node: NodeRegistration) -> None:
        self.owner = owner
        self.node = node
        self.conn = _Connection(node, f"shale-replica-{owner.node_id}", owner.config.socket_timeout_ms / 1000,
                                owner.connect)
        self.wake = asyncio.Event()
        self.stopped = False  # checked after every wait: nothing a stopped link received is applied
        self.unreachable: str | None = None  # the last connection error, logged once per episode
        self.unreachable_since: float | None = None  # time.monotonic() when the episode began
        self.session: FetchSessionHandler[TopicPartition] = FetchSessionHandler()
        self.task = asyncio.get_running_loop().create_task(self._run(), name=f"replica-fetcher-{node.node_id}")

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while not self.stopped:
                states = self.owner.states_of(self.node)
                if not states:
                    return
                now = loop.time()
                ready = [s for s in states if s.ready(now)]
                if not ready:
                    self.wake.clear()
                    waiting = [s.delayed_until for s in states if s.refused is None]
                    timeout = min(waiting) - now if waiting else None  # refused ones wait for a new state
                    try:
                        async with asyncio.timeout(timeout):
                            await self.wake.wait()
                    except TimeoutError:
                        pass
                    continue
                try:
                    for state in [s for s in ready if s.needs_reset]:
                        await self._reset(state)
                    fetchable = [s for s in ready if not s.needs_reset and self.owner.is_current(s)]
                    if fetchable:
                        await self._fetch(fetchable)
                    if self.unreachable is not None:
                        logger.info("leader node %d at %s:%d reachable again", self.node.node_id, self.node.host,
                                    self.node.port)
                        self.unreachable = self.unreachable_since = None
                except LeaderUnreachable as exc:
                    if self.stopped:
                        return
                    self.session.failed()
                    if self.unreachable is None:
                        self.unreachable_since = time.monotonic()
                        logger.warning("replica fetcher: cannot reach leader %s; partitions %s back off %d ms and "
                                       "retry", exc, ", ".join(str(s.tp) for s in states),
                                       self.owner.config.backoff_ms)
                    self.unreachable = str(exc)
                    if exc.refused and self.owner.on_refused is not None:
                        self.owner.on_refused(self.node)
                    # Only the partitions of this round: one that a new store record added meanwhile tries now.
                    self.owner.back_off([s for s in ready if self.owner.is_current(s)], str(exc), log=False)
                except Exception as exc:  # noqa: BLE001 - a bug must not end the fetching of every partition
                    if self.stopped:
                        return
                    self.session.failed()
                    logger.exception("replica fetcher of leader node %d: unexpected error; partitions %s back off",
                                     self.node.node_id, ", ".join(str(s.tp) for s in ready))
                    self.owner.back_off([s for s in ready if self.owner.is_current(s)], repr(exc))
        finally:
            self.conn.close()

    async def _fetch(self, states: list[FollowState]) -> None:
        cfg = self.owner.config
        # Every partition of this round, as the session holds it; the leader may answer any of them.
        sent: dict[TopicPartition, tuple[FollowState, int]] = {}
        fields: dict[TopicPartition, dict] = {}
        throttle, held = self.owner.throttle, []
        for state in states:
            if throttle is not None and throttle.follower_held_back(state.tp):
                held.append(state)  # out of this fetch while the follower quota is exceeded (Kafka's rule)
                continue
            log = self.owner.log_of(state)
            if log is None:
                continue
            if log.space is not None and not log.space.has_room():
                # The reserve is for the cleaner: as a follower whose dir failed in Kafka, it leaves the ISR instead
                self.owner.back_off([state], f"not fetching: log dir {log.space.path} is under its free-space floor")
                continue
            sent[state.tp] = (state, state.fetch_offset)
            fields[state.tp] = {
                "partition": state.tp.partition,
                "current_leader_epoch": state.leader_epoch,
                "fetch_offset": state.fetch_offset,
                "last_fetched_epoch": NO_EPOCH if state.last_fetched_epoch is None else state.last_fetched_epoch,
                "log_start_offset": log.log_start_offset,
                "partition_max_bytes": cfg.max_bytes,
            }
        if held:
            until = asyncio.get_running_loop().time() + cfg.backoff_ms / 1000
            for state in held:
                state.delayed_until = until
        if not sent:
            return
        # An incremental fetch session (KIP-227): only new and changed partitions go on the wire.
        plan = self.session.build(fields)
        forgotten: dict[str, list[int]] = {}
        for tp in plan.forgotten:
            forgotten.setdefault(tp.topic, []).append(tp.partition)
        body = {
            "replica_id": self.owner.node_id, "max_wait_ms": cfg.wait_max_ms, "min_bytes": cfg.min_bytes,
            "max_bytes": cfg.response_max_bytes, "isolation_level": 0, "session_id": plan.session_id,
            "session_epoch": plan.epoch, "topics": _by_topic({tp: fields[tp] for tp in plan.send}),
            "forgotten_topics_data": [{"topic": t, "partitions": ps} for t, ps in forgotten.items()],
            "rack_id": "",
        }
        # The records stay in the connection's buffer: every partition is applied (appended) before the next request.
        response = await self.conn.request(FETCH, FETCH_VERSION, body, cfg.wait_max_ms / 1000, views=True)
        if self.stopped:
            return
        answered = [TopicPartition(t.topic, d.partition_index) for t in response.responses for d in t.partitions]
        if not self.session.handle(plan, response.error_code, response.session_id, answered):
            if response.error_code not in (error_codes.FETCH_SESSION_ID_NOT_FOUND,
                                           error_codes.INVALID_FETCH_SESSION_EPOCH):
                # A session error is answered by a full fetch at once; anything else backs the round off.
                self.owner.back_off([s for s, _ in sent.values()],
                                    f"Fetch: {error_codes.name_of(response.error_code)}" if response.error_code
                                    else "Fetch: an answer that does not match its session")
            return
        appended = False
        for topic in response.responses:
            for data in topic.partitions:
                tp = TopicPartition(topic.topic, data.partition_index)
                if tp not in sent:
                    continue
                if appended:
                    # Let the loop serve clients between partitions: an answer holds up to
                    # replica.fetch.response.max.bytes, a partition up to replica.fetch.max.bytes. Not after the
                    # last one: the next Fetch, which tells the leader our new log end, goes out at once.
                    await asyncio.sleep(0)
                    if self.stopped:
                        return
                self.owner.apply(sent[tp][0], sent[tp][1], data)
                appended = bool(data.records)
                if appended and throttle is not None:
                    throttle.fetched_as_follower(tp, len(data.records))

    async def _reset(self, state: FollowState) -> None:
        """OFFSET_OUT_OF_RANGE: ask the leader's log end and start (as a replica: its log end, not its high
        watermark), then cut or restart the local log (`follower.apply_reset`)."""
        answers = []
        for timestamp in (LATEST, EARLIEST):
            body = {"replica_id": self.owner.node_id, "isolation_level": 0, "topics": [{
                "name": state.tp.topic, "partitions": [{
                    "partition_index": state.tp.partition, "current_leader_epoch": state.leader_epoch,
                    "timestamp": timestamp}]}]}
            response = await self.conn.request(LIST_OFFSETS, LIST_OFFSETS_VERSION, body)
            if self.stopped:
                return
            answer = response.topics[0].partitions[0] if response.topics and response.topics[0].partitions else None
            if answer is None or answer.error_code != error_codes.NONE:
                code = error_codes.UNKNOWN_TOPIC_OR_PARTITION if answer is None else answer.error_code
                self.owner.back_off([state], f"ListOffsets: {error_codes.name_of(code)}")
                return
            answers.append(answer.offset)
        log = self.owner.log_of(state)
        if log is not None and self.owner.is_current(state):
            try:
                apply_reset(state, log, answers[0], answers[1])
            except UnreplicatedRecordsKept as exc:
                self.owner.refuse(state, exc)

    def stop(self) -> None:
        self.stopped = True
        self.task.cancel()


class FollowerThrottle(Protocol):
    """What the fetchers ask of the replica manager about throttles and bytes moved (throttle.py)."""

    def follower_held_back(self, tp: TopicPartition) -> bool: ...

    def fetched_as_follower(self, tp: TopicPartition, size: int) -> None: ...


class ReplicaFetchers:
    """Every partition this node follows, grouped by leader node. Call everything from the event loop."""

    def __init__(self, node_id: int, logs: Callable[[TopicPartition], Log | None],
                 config: FetcherConfig | None = None,
                 on_refused: Callable[[NodeRegistration], None] | None = None,
                 connect: Connector = asyncio.open_connection, throttle: FollowerThrottle | None = None) -> None:
        self.node_id = node_id
        self.throttle = throttle  # follower.replication.throttled.rate (None: never held back)
        # Opens a connection to a leader's inter-broker listener (TLS and SASL: server/network/inter_broker.py).
        self.connect = connect
        self.config = config or FetcherConfig.from_server_config(ServerConfig.from_mapping({}))
        # Told of a leader whose address refuses connections (the controller ends its session early).
        self.on_refused = on_refused
        self._logs = logs
        self._states: dict[TopicPartition, FollowState] = {}
        self._links: dict[NodeRegistration, _LeaderLink] = {}

    # -- what the replica manager calls --------------------------------------------------------------------

    def follow(self, tp: TopicPartition, leader: NodeRegistration, leader_epoch: int) -> None:
        """Fetch `tp` from `leader` in `leader_epoch`. The same leader and epoch again changes nothing; a new
        one starts a new fetch state at once (no backoff left over from the old leader)."""
        current = self._states.get(tp)
        if current is not None and current.leader == leader and current.leader_epoch == leader_epoch:
            return
        log = self._logs(tp)
        if log is None:
            raise KeyError(f"cannot follow {tp}: no local log")
        self._states[tp] = start_following(tp, log, leader, leader_epoch)
        logger.info("following %s from node %d in leader epoch %d at offset %d", tp, leader.node_id, leader_epoch,
                    self._states[tp].fetch_offset)
        link = self._links.get(leader)
        if link is not None and not link.task.done():
            link.wake.set()
        else:
            self._links[leader] = _LeaderLink(self, leader)
        if current is not None and current.leader != leader:
            self._release(current.leader)

    def unfollow(self, tp: TopicPartition) -> None:
        """Stop fetching `tp` (this node leads it now, or holds no replica). An answer in flight is dropped."""
        state = self._states.pop(tp, None)
        if state is not None:
            logger.info("no longer following %s (was node %d, epoch %d, at offset %d)", tp, state.leader.node_id,
                        state.leader_epoch, state.fetch_offset)
            self._release(state.leader)

    async def close(self) -> None:
        """Stop every fetch and close every connection."""
        self._states.clear()
        links = list(self._links.values())
        self._links.clear()
        for link in links:
            link.stop()
        await asyncio.gather(*(link.task for link in links), return_exceptions=True)

    # -- what metrics and /status read ---------------------------------------------------------------------

    def lost(self, leader: NodeRegistration) -> bool:
        """True while the connection to this leader process is down (closed, refused, timed out) and not yet
        reopened, for at most `broker.session.timeout.ms`: Metadata then names no leader for its partitions
        (`ReplicaManager.announced_leader`). The loss is news the store cannot have yet: a dead leader's session
        has not expired. Past that time a leader the store still names live is renewing its session — alive,
        cut off from this node only (a network partition) — and this node names it again, as every other does;
        else a client that asks only this node would never learn the leader."""
        link = self._links.get(leader)
        if link is None:
            return False
        if link.unreachable_since is not None:
            return time.monotonic() - link.unreachable_since < self.config.session_timeout_ms / 1000
        return link.conn.peer_closed()

    def lag(self, tp: TopicPartition) -> int | None:
        """Offsets between the leader's high watermark and our log end at the last answer (None: none yet)."""
        state = self._states.get(tp)
        return None if state is None else state.lag

    def error(self, tp: TopicPartition) -> str | None:
        """The followed partition's last fetch error (None once a fetch succeeds), or why it refuses to follow."""
        state = self._states.get(tp)
        return None if state is None else state.error

    def states(self) -> dict[TopicPartition, FollowState]:
        """The fetch state of every followed partition (read them, do not change them)."""
        return dict(self._states)

    # -- what the links call -------------------------------------------------------------------------------

    def states_of(self, node: NodeRegistration) -> list[FollowState]:
        return [s for s in self._states.values() if s.leader == node]

    def is_current(self, state: FollowState) -> bool:
        return self._states.get(state.tp) is state

    def log_of(self, state: FollowState) -> Log | None:
        log = self._logs(state.tp)
        if log is None:
            self.back_off([state], "no local log")
        return log

    def apply(self, state: FollowState, fetch_offset: int, data: Any) -> None:
        """One partition's answer, if the state it was asked under is still the current one."""
        if not self.is_current(state) or state.fetch_offset != fetch_offset:
            return
        if data.error_code == error_codes.OFFSET_OUT_OF_RANGE:
            state.needs_reset = True  # the next round asks the leader's log start and end (`_LeaderLink._reset`)
            state.error = error_codes.name_of(data.error_code)
            return
        if data.error_code != error_codes.NONE:
            self.back_off([state], f"Fetch: {error_codes.name_of(data.error_code)}")
            return
        log = self.log_of(state)
        if log is None:
            return
        try:
            apply_fetched(state, log, data, self.config.max_bytes)
        except UnreplicatedRecordsKept as exc:
            self.refuse(state, exc)
        except LogError as exc:  # a corrupt batch, a full disk: this partition waits, the others go on
            logger.error("%s: cannot apply the leader's answer: %s", state.describe(), exc)
            self.back_off([state], f"{type(exc).__name__}: {exc}")

    def refuse(self, state: FollowState, exc: UnreplicatedRecordsKept) -> None:
        """Stop fetching a partition whose records from before replication following would lose; it stays so
        (shown in /status) until the store names another leader or epoch (`follow` starts a new state)."""
        state.refused = state.error = f"refused: {exc}"
        logger.error("node %d: %s", self.node_id, exc)

    def back_off(self, states: Iterable[FollowState], reason: str, *, log: bool = True) -> None:
        """Fetch these partitions again only after replica.fetch.backoff.ms (logged per partition when its
        reason changes, unless the caller logged it once for all, as for a lost connection)."""
        until = asyncio.get_running_loop().time() + self.config.backoff_ms / 1000
        for state in states:
            if log and state.error != reason and self.is_current(state):
                logger.info("%s: %s; retrying in %d ms", state.describe(), reason, self.config.backoff_ms)
            state.error = reason
            state.delayed_until = until

    def _release(self, node: NodeRegistration) -> None:
        """Stop the link of a leader no partition follows any more (closing its connection now, even in the
        middle of a long poll or of a wait on a leader that stopped answering)."""
        link = self._links.get(node)
        if link is not None and not self.states_of(node):
            del self._links[node]
            link.stop()


def _by_topic(partitions: dict[TopicPartition, dict]) -> list[dict]:
    """Fetch's topic list: the partitions' request fields grouped by topic."""
    topics: dict[str, list[dict]] = {}
    for tp, fields in partitions.items():
        topics.setdefault(tp.topic, []).append(fields)
    return [{"topic": topic, "partitions": parts} for topic, parts in topics.items()]
