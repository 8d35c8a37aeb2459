"""Kafka's Throttler: one byte-rate limit shared by all cleaner threads (`log.cleaner.io.max.bytes.per.second`)."""

from __future__ import annotations

import threading
import time
from typing import Callable

CHECK_INTERVAL_S = 0.3  # Kafka checks the observed rate every 300 ms


class Throttler:
    """Sleeps callers so that the bytes they report stay under `rate` per second, measured per period."""

    def __init__(self, rate: float, *, monotonic: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep, check_interval_s: float = CHECK_INTERVAL_S) -> None:
        """`check_interval_s`: how much may pass unmeasured (0: every report is checked, as log-dir moves do)."""
        self.rate = rate
        self.check_interval_s = check_interval_s
        self._monotonic = monotonic
        self._sleep = sleep
        self._lock = threading.Lock()
        self._period_start = monotonic()
        self._observed = 0.0
        self.total_bytes = 0
        self.total_sleep_s = 0.0

    def __call__(self, n: int) -> None:
        """Report `n` bytes read or written; may sleep."""
        with self._lock:
            self.total_bytes += n
            if self.rate == float("inf") or self.rate <= 0:
                return
            self._observed += n
            elapsed = self._monotonic() - self._period_start
            if elapsed < 0:
                # Another caller is sleeping out the last period's excess: wait for it too (Kafka's throttler
                # sleeps under its lock, so callers queue); these bytes count in the next period.
                sleep_s = -elapsed
            elif elapsed <= self.check_interval_s:
                return
            else:
                sleep_s = max(self._observed / self.rate - elapsed, 0.0)  # over the rate: sleep off the excess
                self._period_start = self._monotonic() + sleep_s
                self._observed = 0.0
        if sleep_s > 0:
            self.total_sleep_s += sleep_s
            self._sleep(sleep_s)
