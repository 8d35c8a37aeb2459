"""The replication tests' real API server (tests/support/kube_apiserver.py) for the Kubernetes store; the rest of
their harness (node_util: ports, `shale serve` processes) is in tests/support/ too."""

from __future__ import annotations

from typing import Iterator

import pytest

from support.kube_apiserver import ApiServer


@pytest.fixture(scope="session")
def kube_api(tmp_path_factory) -> Iterator[ApiServer]:
    """etcd + kube-apiserver, once per session (per xdist worker); the stores need only core and Leases, so
    unlike tests/apiserver's `apiserver` no CRD is installed. Tests take a fresh namespace each."""
    server = ApiServer(tmp_path_factory.mktemp("kube-api"))
    try:
        server.start()
    except BaseException:
        server.stop()
        raise
    yield server
    server.stop()
