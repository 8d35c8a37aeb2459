"""Parked `acks=all` produces: Kafka's produce purgatory (`DelayedProduce`), on the event loop.

An `acks=all` append is written by the leader at once and answered only when the high watermark passes it,
the leadership it was written under ends, or the request's timeout passes (docs/replication.md, "High
watermark and acknowledgements"). Each appended partition parks one `Waiter`; whoever changes what decides
its fate (a follower's fetch raising the high watermark, a committed ISR change, a new record, a fence) calls
`complete(tp, outcome)`, and the produce handler awaits the waiters with the request's timeout.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Callable

from ..log.topic_partition import TopicPartition


@dataclass(eq=False, slots=True)
class Waiter:
    """One partition's part of a parked produce: done when HW ≥ `required_offset` (its last offset + 1)."""

    tp: TopicPartition
    required_offset: int
    leader_epoch: int  # the epoch the records were appended in
    done: asyncio.Future = field(repr=False)  # result: the partition's error code


class DelayedProduces:
    """The waiters of every partition on this node."""

    def __init__(self) -> None:
        self._waiting: dict[TopicPartition, list[Waiter]] = {}

    def park(self, tp: TopicPartition, required_offset: int, leader_epoch: int) -> Waiter:
        waiter = Waiter(tp, required_offset, leader_epoch, asyncio.get_running_loop().create_future())
        self._waiting.setdefault(tp, []).append(waiter)
        return waiter

    def complete(self, tp: TopicPartition, outcome: Callable[[Waiter], int | None]) -> int:
        """Answer the waiters of `tp` for which `outcome` gives an error code (None: keep waiting); returns how
        many were answered."""
        waiters = self._waiting.get(tp)
        if not waiters:
            return 0
        keep = []
        for waiter in waiters:
            code = outcome(waiter) if not waiter.done.done() else None
            if code is None and not waiter.done.done():
                keep.append(waiter)
            elif code is not None:
                waiter.done.set_result(code)
        if keep:
            self._waiting[tp] = keep
        else:
            del self._waiting[tp]
        return len(waiters) - len(keep)

    def fail(self, tp: TopicPartition, code: int) -> int:
        return self.complete(tp, lambda _w: code)

    def fail_all(self, code: int) -> int:
        return sum(self.fail(tp, code) for tp in list(self._waiting))

    def forget(self, waiter: Waiter) -> None:
        """Drop a waiter its request stopped waiting for (timed out, connection gone)."""
        waiters = self._waiting.get(waiter.tp)
        if waiters is not None and waiter in waiters:
            waiters.remove(waiter)
            if not waiters:
                del self._waiting[waiter.tp]

    def partitions(self) -> list[TopicPartition]:
        return list(self._waiting)

    def __len__(self) -> int:
        return sum(len(w) for w in self._waiting.values())
