"""The real-cluster fixture: one Kubernetes cluster per test session (kube_cluster.py), on one pytest-xdist
worker: `make test` runs `--dist loadgroup`, and tests/conftest.py's scheduler sends every test of this folder
to one worker, in file order.

A cold start (empty etcd and image stores) takes 29–34 s, about half of it importing the images; the images come from image.py's
cache (`make test` builds them first; a test run without them builds them here). A start that fails fails
every test that needs the cluster, with each component's log tail; none is skipped. The cluster is
stopped after the last test of this folder, and its teardown fails loudly if anything of it is left on the
machine.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Iterator

import pytest
from kube_cluster import KubeCluster

from support import image

_HERE = Path(__file__).resolve().parent
# Three nodes in three zones: a partition's replicas on different nodes, and a node lost loses one replica.
NODES = 3
_running: list[KubeCluster] = []


def _needs_cluster(item: pytest.Item | None) -> bool:
    return item is not None and _HERE in Path(item.fspath).resolve().parents


@pytest.fixture(scope="session")
def kube_cluster(tmp_path_factory) -> Iterator[KubeCluster]:
    images = image.images()
    if not images.built():
        image.build(Path(sys.executable), images)
    cluster = KubeCluster(tmp_path_factory.mktemp("kube"), images, node_count=NODES).start()
    _running.append(cluster)
    yield cluster
    _stop()


def _stop() -> None:
    while _running:
        _running.pop().stop()


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    """Stop the cluster after the last test that needs it, not at the end of the session: idle, it still
    costs half a core that the rest of the suite, on the other worker and this one, can use. The tests of
    this folder run one after another (one xdist work unit; consecutive without xdist)."""
    if _running and not _needs_cluster(nextitem):
        _stop()
