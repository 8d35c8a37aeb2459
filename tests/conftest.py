"""Fixtures shared by tests in several folders."""

from __future__ import annotations

from typing import Iterator

import pytest

from etcd_util import EtcdServer
from wheel_venv import WheelVenv, build


@pytest.fixture(scope="session")
def wheel_venv(tmp_path_factory) -> WheelVenv:
    """Shale installed from its wheel into a fresh venv (tests/wheel_venv.py says why and how)."""
    return build(tmp_path_factory.mktemp("wheel-venv"))


@pytest.fixture
def etcd(tmp_path_factory) -> Iterator[EtcdServer]:
    """A fresh etcd per test (tests/etcd_util.py): short leases, stoppable, freezable, killable."""
    server = EtcdServer(tmp_path_factory.mktemp("etcd")).start()
    try:
        yield server
    finally:
        server.kill()
