"""Fixtures of the log-engine tests."""

from __future__ import annotations

import pytest

from support.logtest_util import FakeClock
from support.logtest_util import make_config as _make_config


@pytest.fixture
def make_config():
    """Factory: a topic config from Kafka-named settings, e.g. make_config({"segment.bytes": 1024})."""
    return _make_config


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()

