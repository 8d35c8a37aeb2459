"""Replication throttles with Kafka's names, so that a move does not starve producers (docs/moves.md).

Kafka's ReplicationQuotaManager, one per side: the broker settings `leader.replication.throttled.rate` and
`follower.replication.throttled.rate` (bytes per second; Long.MAX_VALUE, the default, is no throttle) bound
the bytes of *throttled* replicas a node sends as leader and fetches as follower, measured over
`replication.quota.window.num` windows of `replication.quota.window.size.seconds`. A replica is throttled
when its topic's `leader.replication.throttled.replicas` (on the leader) or
`follower.replication.throttled.replicas` (on the follower) names `partition:node` of this node or is `*`,
and it is out of the ISR (Kafka's shouldLeaderThrottle / shouldFollowerThrottle): a replica in sync is never
held back, so `acks=all` does not wait on a throttle. While the quota is exceeded, the leader answers a
throttled replica's fetch with no records, and the follower leaves the partition out of its fetches.
Pure but for the clock, which is given, and a lock (`/metrics` reads from its own thread).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable

from ..topic_config import LONG_MAX


def names_replica(throttled_replicas: tuple[str, ...], partition: int, node_id: int) -> bool:
    """A `*.replication.throttled.replicas` value names this replica: `*`, or `partition:node` in the list
    (the topic config's validator has checked the form)."""
    if "".join(throttled_replicas).strip() == "*":
        return True
    wanted = (partition, node_id)
    for item in throttled_replicas:
        p, _, n = item.strip().partition(":")
        if p and n and (int(p), int(n)) == wanted:
            return True
    return False


@dataclass
class ReplicationQuota:
    """One side's byte rate (Kafka's Rate over SampledStat windows): `record` what throttled replicas moved,
    `exceeded` while the rate measured over the windows is above `rate`."""

    rate: int = LONG_MAX  # bytes per second
    window_num: int = 11
    window_s: float = 1.0
    clock: Callable[[], float] = time.monotonic
    recorded_bytes: int = 0  # throttled replicas' bytes since the start (for /metrics)
    configured: int = field(init=False)  # the command line's rate, which a dynamic config overrides
    _samples: deque = field(default_factory=deque)  # [window start, bytes], oldest first
    _lock: threading.Lock = field(default_factory=threading.Lock)  # /metrics reads from the HTTP thread

    def __post_init__(self) -> None:
        self.configured = self.rate

    def set_rate(self, rate: int | None) -> None:
        """A dynamic broker config (IncrementalAlterConfigs on this node): the new rate, None back to the
        configured one. Takes effect at the next check; what was measured stays."""
        self.rate = self.configured if rate is None else rate

    @property
    def enabled(self) -> bool:
        return self.rate < LONG_MAX

    def record(self, size: int) -> None:
        now = self.clock()
        with self._lock:
            self._expire(now)
            if not self._samples or now - self._samples[-1][0] >= self.window_s:
                self._samples.append([now, 0])
            self._samples[-1][1] += size
            self.recorded_bytes += size

    def measured(self) -> float:
        """Bytes per second over the kept windows, the elapsed time counted as at least all windows but the
        current one (Kafka's Rate.windowSize), so that a first burst is not read as an enormous rate."""
        now = self.clock()
        with self._lock:
            self._expire(now)
            if not self._samples:
                return 0.0
            elapsed = max(now - self._samples[0][0], (self.window_num - 1) * self.window_s, self.window_s)
            return sum(b for _, b in self._samples) / elapsed

    def exceeded(self) -> bool:
        return self.enabled and self.measured() > self.rate

    def _expire(self, now: float) -> None:
        while self._samples and now - self._samples[0][0] >= self.window_num * self.window_s:
            self._samples.popleft()
