"""A fetcher's side of an incremental fetch session (KIP-227): which partitions the next Fetch names.

Pure, no I/O (docs/fetch-sessions.md): `build` takes every partition to fetch with its request fields and says
what goes on the wire (all of them in a full fetch; in an incremental one only the new and changed ones, and the
dropped ones as forgotten); `handle` takes the answer's session fields and moves the session on, or resets it.
Kafka's FetchSessionHandler rules: the epoch moves only on an accepted answer and never guesses, so every
failure ends in a full fetch that replaces the session.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Generic, Hashable, Iterable, TypeVar

from ..protocol.error_codes import FETCH_SESSION_ID_NOT_FOUND, NONE
from .fetch_session import INITIAL_EPOCH, INVALID_SESSION_ID, next_epoch

__all__ = ["FetchPlan", "FetchSessionHandler"]

K = TypeVar("K", bound=Hashable)


@dataclass(frozen=True)
class FetchPlan(Generic[K]):
    """One Fetch's session fields and partitions: `send` on the wire, `forgotten` in forgotten_topics_data."""

    session_id: int
    epoch: int
    send: list[K]
    forgotten: list[K]

    @property
    def full(self) -> bool:
        return self.epoch == INITIAL_EPOCH


@dataclass
class FetchSessionHandler(Generic[K]):
    """The session with one leader: its id, the epoch of the next Fetch, and each partition as last sent."""

    session_id: int = INVALID_SESSION_ID
    epoch: int = INITIAL_EPOCH
    _sent: dict[K, object] = field(default_factory=dict)

    def build(self, partitions: dict[K, object]) -> FetchPlan[K]:
        """The next Fetch of `partitions` (key → its request fields, compared for equality)."""
        previous, self._sent = self._sent, dict(partitions)
        if self.epoch == INITIAL_EPOCH:
            return FetchPlan(self.session_id, INITIAL_EPOCH, list(partitions), [])
        send = [key for key, fields in partitions.items() if previous.get(key, _ABSENT) != fields]
        forgotten = [key for key in previous if key not in partitions]
        return FetchPlan(self.session_id, self.epoch, send, forgotten)

    def handle(self, plan: FetchPlan[K], error_code: int, session_id: int, answered: Iterable[K]) -> bool:
        """Whether the answer to `plan` may be applied; the session moves on (or resets) either way."""
        if error_code != NONE:
            # An unknown session starts over; any other session error replaces this one with a full fetch.
            self._restart(INVALID_SESSION_ID if error_code == FETCH_SESSION_ID_NOT_FOUND else self.session_id)
            return False
        keys, session = set(answered), self._sent.keys()
        if (keys != session) if plan.full else not keys <= session:
            # A full answer names every partition asked; an incremental one only partitions of the session.
            self._restart(INVALID_SESSION_ID if plan.full else self.session_id)
            return False
        if session_id == INVALID_SESSION_ID:  # no session (none made, or the leader closed it): full fetches
            self._restart(INVALID_SESSION_ID)
        elif plan.full:
            self.session_id, self.epoch = session_id, next_epoch(INITIAL_EPOCH)
        else:
            self.epoch = next_epoch(self.epoch)
        return True

    def failed(self) -> None:
        """The Fetch got no answer (timeout, lost connection): the next one is full and replaces the session."""
        self._restart(self.session_id)

    def _restart(self, session_id: int) -> None:
        self.session_id, self.epoch = session_id, INITIAL_EPOCH


_ABSENT = object()
