"""The real-API-server fixtures: one etcd + kube-apiserver per test session (per xdist worker), and per test
a namespace holding the chart's release, two real `shale serve` pods and the operator under the chart's RBAC.

`apiserver` starts the server (kube_apiserver.py; ~3 s, ~400 MB) and installs the Topic CRD once. A test
that needs it fails with the reason when it cannot start — it never skips. `release` renders the chart
into a fresh namespace and creates every object on the server; `cluster` adds the storage processes,
their Pod objects, the ConfigMap projection (the kubelet's part, tests/support/projection.py) and the
operator, in a thread as tests/operator runs it, logged in with a TokenRequest token of the chart's
service account: every call it makes passes the real authorizer or fails as it would in a cluster.
"""

from __future__ import annotations

import itertools
from typing import Iterator

import pytest

from support.apiserver_util import USER_CRD_FILE, Release, install_crd, install_release, operated
from support.cluster_util import Cluster, StorageNodes
from support.kube_apiserver import ApiServer
from support.node_util import ServeProcess

_namespaces = itertools.count(1)


@pytest.fixture(scope="session")
def apiserver(tmp_path_factory) -> Iterator[ApiServer]:
    server = ApiServer(tmp_path_factory.mktemp("apiserver"))
    try:
        server.start()
        install_crd(server.client())
        install_crd(server.client(), USER_CRD_FILE)
    except BaseException:
        server.stop()
        raise
    yield server
    server.stop()


@pytest.fixture
def release(apiserver: ApiServer) -> Release:
    # Fresh per test (each xdist worker has its own server); never deleted.
    return install_release(apiserver.client(), f"t{next(_namespaces)}")


@pytest.fixture
def cluster(apiserver: ApiServer, release: Release, tmp_path_factory, monkeypatch) -> Iterator[Cluster]:
    base = tmp_path_factory.mktemp("storage")
    topics_dir = base / "topics"
    topics_dir.mkdir()
    nodes = [ServeProcess(base / f"data{n}", topics_dir, "--override", "log.cleaner.backoff.ms=200", node_id=n)
             for n in (0, 1)]
    try:
        for node in nodes:
            node.start()
        with operated(apiserver, release, StorageNodes(topics_dir, nodes), base, monkeypatch) as cluster:
            yield cluster
    finally:
        for node in nodes:
            if node.proc is not None:
                assert node.terminate() == 0, node.log()
