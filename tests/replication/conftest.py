"""The replication tests reuse tests/server's harness (node_util: ports, `shale serve` processes) and
tests/apiserver's real API server (kube_apiserver.py) for the Kubernetes store."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Iterator

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "server"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "apiserver"))
from kube_apiserver import ApiServer  # noqa: E402


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
