"""The leader's incremental fetch sessions (KIP-227): which partitions a Fetch reads and which it answers.

A pure state machine, no I/O (docs/fetch-sessions.md): `FetchSessionCache.context` takes a request's session
fields and partitions and returns a `FetchContext` saying what to read; after the read, `FetchContext.answer`
prunes the answer (incremental) or opens a session on it (full). Kafka's rules throughout (`FetchSession.scala`):
a session remembers each partition's last request and the high watermark and log start offset last answered,
an incremental fetch reads every partition of its session and answers only the changed ones.
"""

from __future__ import annotations

import random
from collections import Counter, OrderedDict
from dataclasses import dataclass, field
from typing import Any, Callable

from ..protocol.error_codes import FETCH_SESSION_ID_NOT_FOUND, INVALID_FETCH_SESSION_EPOCH, NONE

__all__ = ["FINAL_EPOCH", "INITIAL_EPOCH", "INVALID_SESSION_ID", "EVICTION_MS", "FetchContext", "FetchSessionCache",
           "next_epoch"]

INVALID_SESSION_ID = 0  # no session
INITIAL_EPOCH = 0  # a full fetch that opens (or replaces) a session
FINAL_EPOCH = -1  # a full fetch with no session: every Fetch before v7, and librdkafka's
EVICTION_MS = 120_000  # Kafka's MIN_INCREMENTAL_FETCH_SESSION_EVICTION_MS, a constant there too
_MAX_EPOCH = 2**31 - 1

Key = tuple[str, int]  # (topic, partition)


def next_epoch(epoch: int) -> int:
    """The epoch after `epoch`: FINAL stays FINAL, and the wrap skips INITIAL (0)."""
    if epoch < 0:
        return FINAL_EPOCH
    return 1 if epoch == _MAX_EPOCH else epoch + 1


@dataclass
class CachedPartition:
    """A partition of a session: its last request (read again by every incremental fetch) and what was last
    answered for it. -1 before the first answer, so a partition added by an incremental fetch is answered."""

    request: Any  # the request's partition: fetch_offset, current_leader_epoch, last_fetched_epoch, ...
    high_watermark: int = -1
    log_start_offset: int = -1

    def must_answer(self, out: dict[str, Any]) -> bool:
        """Kafka's maybeUpdateResponseData with update: records, an error, a diverging epoch, or a changed high
        watermark or log start offset put the partition in the answer (and the last-answered values change)."""
        answer = False
        if out["records"]:
            answer = True
        if out["high_watermark"] != self.high_watermark:
            answer, self.high_watermark = True, out["high_watermark"]
        if out["log_start_offset"] != self.log_start_offset:
            answer, self.log_start_offset = True, out["log_start_offset"]
        if out["error_code"] != NONE:
            answer, self.high_watermark = True, -1  # answered again once the error clears
        if (out.get("diverging_epoch") or {}).get("epoch", -1) >= 0:
            answer = True
        return answer


@dataclass
class FetchSession:
    id: int
    privileged: bool  # a follower's: may evict consumers' sessions
    partitions: OrderedDict[Key, CachedPartition]
    created_ms: int
    last_used_ms: int
    epoch: int = 1

    def eviction_key(self) -> tuple[bool, int, int]:
        return self.privileged, len(self.partitions), self.id


@dataclass
class FetchContext:
    """What one Fetch reads and how its answer is made.

    `topics` is what to read, as (topic, partitions) in answer order; `error` a top-level error (nothing is read).
    """

    topics: list[tuple[str, list[Any]]]
    error: int = NONE
    session_id: int = INVALID_SESSION_ID
    _answer: Callable[[list[dict[str, Any]], int], tuple[int, int, list[dict[str, Any]]]] | None = field(
        default=None, repr=False)

    def answer(self, responses: list[dict[str, Any]], now_ms: int) -> tuple[int, int, list[dict[str, Any]]]:
        """(error code, session id, responses) of the answer to the read `responses` (Fetch's topic list)."""
        if self._answer is None:
            return self.error, self.session_id, responses
        return self._answer(responses, now_ms)


class FetchSessionCache:
    """The leader's sessions: at most `slots`, least recently used first (Kafka's FetchSessionCache, unsharded)."""

    def __init__(self, slots: int = 1000, *, consumer_sessions: bool = True, rng: random.Random | None = None) -> None:
        self.slots = slots
        # False: only followers get sessions; a consumer's full fetch finds no slot and is answered sessionless.
        self.consumer_sessions = consumer_sessions
        self._rng = rng or random.SystemRandom()
        self._sessions: OrderedDict[int, FetchSession] = OrderedDict()  # by last use, oldest first
        self.evictions = 0  # sessions dropped to make room (Kafka's IncrementalFetchSessionEvictionsPerSec)
        # Session errors answered, by code: a fetcher that lost an answer (or a session) and did not start over.
        self.errors: Counter[int] = Counter()

    def __len__(self) -> int:
        return len(self._sessions)

    def get(self, session_id: int) -> FetchSession | None:
        return self._sessions.get(session_id)

    def partitions_cached(self) -> int:
        """Partitions over all sessions (Kafka's NumIncrementalFetchPartitionsCached); safe from another thread."""
        return sum(len(s.partitions) for s in list(self._sessions.values()))

    def context(self, session_id: int, epoch: int, topics: list[tuple[str, list[Any]]], forgotten: list[Key],
                follower: bool, now_ms: int) -> FetchContext:
        """Kafka's FetchManager.newContext: `topics` are the request's (topic, partitions), `forgotten` its
        forgotten_topics_data flattened."""
        if epoch in (INITIAL_EPOCH, FINAL_EPOCH):
            if session_id != INVALID_SESSION_ID:
                self._sessions.pop(session_id, None)  # a full fetch replaces (or closes) the session it names
            if epoch == FINAL_EPOCH:
                return FetchContext(topics)
            return FetchContext(topics, _answer=lambda responses, now: self._open(topics, responses, follower, now))
        session = self._sessions.get(session_id)
        if session is None or session.epoch != epoch:
            error = FETCH_SESSION_ID_NOT_FOUND if session is None else INVALID_FETCH_SESSION_EPOCH
            self.errors[error] += 1
            return FetchContext([], error)
        for topic, partitions in topics:
            for p in partitions:
                cached = session.partitions.get((topic, p.partition))
                if cached is None:
                    session.partitions[topic, p.partition] = CachedPartition(p)
                else:
                    cached.request = p
        for key in forgotten:
            session.partitions.pop(key, None)
        if not session.partitions:
            del self._sessions[session_id]
            return FetchContext(topics)
        session.last_used_ms = now_ms
        self._sessions.move_to_end(session_id)
        session.epoch = next_epoch(epoch)
        return FetchContext(_by_topic(session.partitions), session_id=session_id,
                            _answer=lambda responses, now: self._incremental(session, epoch, responses))

    def _open(self, topics: list[tuple[str, list[Any]]], responses: list[dict[str, Any]], follower: bool,
              now_ms: int) -> tuple[int, int, list[dict[str, Any]]]:
        """A full fetch's answer: everything read, and a new session on it if a slot is free or can be freed."""
        requested = {(topic, p.partition): p for topic, partitions in topics for p in partitions}
        partitions: OrderedDict[Key, CachedPartition] = OrderedDict()
        for t in responses:
            for out in t["partitions"]:
                key = (t["topic"], out["partition_index"])
                cached = partitions[key] = CachedPartition(requested[key])
                cached.must_answer(out)
        if not partitions or not (follower or self.consumer_sessions) or not self._make_room(follower, len(partitions),
                                                                                               now_ms):
            return NONE, INVALID_SESSION_ID, responses
        session_id = self._new_id()
        self._sessions[session_id] = FetchSession(session_id, follower, partitions, now_ms, now_ms)
        return NONE, session_id, responses

    def _incremental(self, session: FetchSession, epoch: int,
                     responses: list[dict[str, Any]]) -> tuple[int, int, list[dict[str, Any]]]:
        """An incremental fetch's answer: only the partitions that changed; those with records go to the back of
        the session, so the next read's byte budget starts with the others (Kafka's round robin)."""
        if session.epoch != next_epoch(epoch):  # a later request of this session was accepted meanwhile
            return INVALID_FETCH_SESSION_EPOCH, session.id, []
        pruned = []
        for t in responses:
            kept = []
            for out in t["partitions"]:
                key = (t["topic"], out["partition_index"])
                cached = session.partitions.get(key)
                if cached is None or not cached.must_answer(out):
                    continue
                kept.append(out)
                if out["records"]:
                    session.partitions.move_to_end(key)
            if kept:
                pruned.append({**t, "partitions": kept})
        return NONE, session.id, pruned

    def _make_room(self, privileged: bool, size: int, now_ms: int) -> bool:
        """Kafka's tryEvict: a free slot; else the least recently used session if idle past EVICTION_MS; else the
        smallest session the newcomer may evict (one created over EVICTION_MS ago, or any consumer's when the
        newcomer is a follower's), if the newcomer outranks it in (privileged, size) order."""
        if len(self._sessions) < self.slots:
            return True
        if not self._sessions:
            return False
        oldest_id, oldest = next(iter(self._sessions.items()))
        if now_ms - oldest.last_used_ms > EVICTION_MS:
            del self._sessions[oldest_id]
            self.evictions += 1
            return True
        candidates = [s for s in self._sessions.values()
                      if now_ms - s.created_ms > EVICTION_MS or (privileged and not s.privileged)]
        if not candidates:
            return False
        victim = min(candidates, key=FetchSession.eviction_key)
        if (privileged, size, INVALID_SESSION_ID) <= victim.eviction_key():
            return False
        del self._sessions[victim.id]
        self.evictions += 1
        return True

    def _new_id(self) -> int:
        while True:
            session_id = self._rng.randint(1, _MAX_EPOCH)
            if session_id not in self._sessions:
                return session_id


def _by_topic(partitions: OrderedDict[Key, CachedPartition]) -> list[tuple[str, list[Any]]]:
    """A session's partitions as (topic, partitions) in session order, one entry per run of a topic."""
    out: list[tuple[str, list[Any]]] = []
    for (topic, _), cached in partitions.items():
        if out and out[-1][0] == topic:
            out[-1][1].append(cached.request)
        else:
            out.append((topic, [cached.request]))
    return out
