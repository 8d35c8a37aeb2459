"""Fixtures of the log-engine tests."""

from __future__ import annotations

import pytest
from logtest_util import FakeClock, make_config as _make_config

from shale.sidecar.log.segment import LogSegment


@pytest.fixture
def make_config():
    """Factory: a topic config from Kafka-named settings, e.g. make_config({"segment.bytes": 1024})."""
    return _make_config


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture(autouse=True)
def release_segment_descriptors(monkeypatch):
    """After each test, release the descriptors of every segment it opened and left open.

    A segment holds its `.log` file as a raw descriptor (`os.open`), which, unlike a file object or
    an mmap, nothing closes when the segment is garbage collected. Tests drop Logs unclosed on
    purpose (what a SIGKILL leaves, then a recovery from a copy) and by omission; without this,
    an xdist worker ended `tests/log` with ~3,000 descriptors open, and the Spark tests sharing the
    worker hung (py4j's callback server uses select(), which refuses descriptors above 1023).
    Releasing only closes descriptors and maps (`close_handles`): the files stay as the test left them.
    """
    opened: list[LogSegment] = []
    real_init = LogSegment.__init__

    def init_and_remember(self, *args, **kwargs) -> None:
        real_init(self, *args, **kwargs)
        opened.append(self)

    monkeypatch.setattr(LogSegment, "__init__", init_and_remember)
    yield
    for seg in opened:
        seg.close_handles()
