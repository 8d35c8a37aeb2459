"""Fixtures shared by tests in several folders."""

from __future__ import annotations

from typing import Iterator

import pytest
from xdist.scheduler import LoadScopeScheduling

from support.etcd_util import EtcdServer
from support.wheel_venv import WheelVenv, build


@pytest.fixture(scope="session")
def wheel_venv(tmp_path_factory) -> WheelVenv:
    """Shale installed from its wheel into a fresh venv (tests/support/wheel_venv.py says why and how)."""
    return build(tmp_path_factory.mktemp("wheel-venv"))


@pytest.fixture
def etcd(tmp_path_factory) -> Iterator[EtcdServer]:
    """A fresh etcd per test (tests/support/etcd_util.py): short leases, stoppable, freezable, killable."""
    server = EtcdServer(tmp_path_factory.mktemp("etcd")).start()
    try:
        yield server
    finally:
        server.kill()


class _ClusterGroupScheduling(LoadScopeScheduling):
    """`--dist loadgroup` with one group, by folder: every test of tests/cluster/ on one worker, in file order (they
    share one real cluster and its journeys run in order); every other test alone, as `--dist load` sends them.

    xdist 3.8's own loadgroup reads `xdist_group` marks through `item._nodeid`, which pytest 9 no longer has:
    under pytest 9.2 it groups nothing, so this scheduler does the grouping."""

    def _split_scope(self, nodeid: str) -> str:
        return "tests/cluster/" if nodeid.startswith("tests/cluster/") else nodeid


def pytest_xdist_make_scheduler(config, log):
    if config.getvalue("dist") == "loadgroup":
        return _ClusterGroupScheduling(config, log)
    return None
