"""The real-cluster fixture: one Kubernetes cluster per test session (kube_cluster.py), on one pytest-xdist
worker (every test here is in the `kube-cluster` xdist group; `make test` runs `--dist loadgroup`).

A cold start (empty etcd and image stores) takes ~25 s of 2 shared cores; the images come from image.py's
cache (`make test` builds them first; a test run without them builds them here). A start that fails fails
every test that needs the cluster, with each component's log tail; none is skipped. The cluster is
stopped at the end of the session, and its teardown fails loudly if anything of it is left on the machine.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Iterator

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import image  # noqa: E402
from kube_cluster import KubeCluster  # noqa: E402


@pytest.hookimpl(tryfirst=True)  # before xdist's loadgroup reads the marks
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in Path(item.fspath).parents:
            item.add_marker(pytest.mark.xdist_group("kube-cluster"))


@pytest.fixture(scope="session")
def kube_cluster(tmp_path_factory) -> Iterator[KubeCluster]:
    images = image.images()
    if not images.built():
        image.build(Path(sys.executable), images)
    cluster = KubeCluster(tmp_path_factory.mktemp("kube"), images).start()
    yield cluster
    cluster.stop()
