"""Kafka's fetch purgatory (DelayedFetch): fetches parked on their partitions until an append, a high watermark that
rose, a changed topic or their max wait wakes them.

The appends of this event loop happen between a fetch's read and its parking never (the two are one synchronous
step); the I/O thread's may (io_thread.py), so a fetch parks with the count of native appends it read at and is
woken at once if that count moved.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from ...log.topic_partition import TopicPartition
from ..network.native_produce import appended


@dataclass(eq=False, slots=True)
class _ParkedFetch:
    """A Fetch waiting for its partitions to change: one future, set by the first poke or by its max wait (no
    task per partition, and the handler resumes in the loop iteration after the poke)."""

    wake: asyncio.Future
    follower: bool  # a replica reads to the log end: a high watermark that rose alone gives it nothing new

    def wake_up(self) -> None:
        if not self.wake.done():
            self.wake.set_result(None)



class FetchPurgatory:
    """The fetches parked on each partition, and the pokes that wake them."""

    def __init__(self) -> None:
        # Read by the native Produce's C call too: it pokes only when some fetch waits.
        self.events: dict[TopicPartition, set[_ParkedFetch]] = {}

    def poke(self, tp: TopicPartition) -> None:
        """Wake fetches waiting on a partition (after an append by another component)."""
        self._poke(tp)


    def topic_changed(self, name: str) -> None:
        """Wake the fetches waiting on a topic that changed: a deleted or moved partition answers now, as Kafka's
        DelayedFetch completes when its partition goes, not at the fetch's max wait."""
        for tp in [tp for tp in self.events if tp.topic == name]:
            self._poke(tp)


    def poke_consumers(self, tp: TopicPartition) -> None:
        """Wake the consumers' fetches of a partition whose high watermark rose (followers read to the log end:
        they wait for records, as Kafka's DelayedFetch of a follower does not complete on the high watermark)."""
        self._poke(tp, followers=False)


    def _poke(self, tp: TopicPartition, *, followers: bool = True) -> None:
        for parked in self.events.get(tp, ()):
            if followers or not parked.follower:
                parked.wake_up()


    async def park(self, tps: set[TopicPartition], deadline: float, follower: bool, since: int) -> None:
        """Wait until one of `tps` is poked or the loop time reaches `deadline`. `since`: the count of native appends
        before the fetch read its partitions; if the I/O thread appended since, it may not have seen this fetch
        parked, so the fetch reads again at once."""
        loop = asyncio.get_running_loop()
        parked = _ParkedFetch(loop.create_future(), follower)
        for tp in tps:
            self.events.setdefault(tp, set()).add(parked)
        if appended() != since:
            parked.wake_up()
        timer = loop.call_at(deadline, parked.wake_up)
        try:
            await parked.wake
        finally:
            timer.cancel()
            for tp in tps:
                waiting = self.events.get(tp)
                if waiting is not None:
                    waiting.discard(parked)
                    if not waiting:
                        del self.events[tp]
