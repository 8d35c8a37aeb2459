"""The request histograms behind `shale_requests` and `shale_request_duration_seconds`: one C call per answered
request, or the Python fallback of a checkout without the extension, counting the same."""

from __future__ import annotations

import threading

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shale.sidecar.server.ops import metrics
from shale.sidecar.server.ops.metrics import REQUEST_BUCKETS, RequestStats

APIS = st.sampled_from(["Produce", "Fetch", "Metadata"])
SECONDS = st.sampled_from([0.0, *REQUEST_BUCKETS, 61.0]) | st.floats(0, 100, allow_nan=False)


def expected(observed: list[tuple[str, float]]) -> dict[str, tuple[int, float, list[int]]]:
    out: dict[str, tuple[int, float, list[int]]] = {}
    for api, seconds in observed:
        count, total, buckets = out.get(api, (0, 0.0, [0] * (len(REQUEST_BUCKETS) + 1)))
        buckets[next((i for i, bound in enumerate(REQUEST_BUCKETS) if seconds <= bound), len(REQUEST_BUCKETS))] += 1
        out[api] = (count + 1, total + seconds, buckets)
    return out


@pytest.mark.parametrize("compiled", [True, False], ids=["C", "Python"])
@given(observed=st.lists(st.tuples(APIS, SECONDS), max_size=30))
def test_each_request_lands_in_its_bucket(compiled, observed):
    """A value equal to a bound belongs to it (Prometheus' le); above the last bound, +Inf."""
    stats = RequestStats() if compiled else _python_stats()
    for api, seconds in observed:
        stats.observe(api, seconds)
    got = stats.snapshot()
    want = expected(observed)
    assert {api: (c, b) for api, (c, _, b) in got.items()} == {api: (c, b) for api, (c, _, b) in want.items()}
    assert all(got[api][1] == pytest.approx(want[api][1]) for api in want)


def test_a_scrape_sees_every_request_counted_whole():
    """A scrape thread copies the histograms while the loop's thread observes: the count always equals the sum of
    the buckets in each copy."""
    stats = RequestStats()
    stop = threading.Event()
    torn: list = []

    def scrape():
        while not stop.is_set():
            for api, (count, _, buckets) in stats.snapshot().items():
                if count != sum(buckets):
                    torn.append((api, count, buckets))
    scraper = threading.Thread(target=scrape)
    scraper.start()
    try:
        for i in range(200_000):
            stats.observe("Produce", (i % 100) / 1000)
    finally:
        stop.set()
        scraper.join()
    assert not torn, torn[:3]
    assert stats.snapshot()["Produce"][0] == 200_000


def _python_stats() -> RequestStats:
    saved, metrics._observe = metrics._observe, None
    try:
        return RequestStats()
    finally:
        metrics._observe = saved
