"""The operator's test cluster: kmock's API server, two real `shale serve` pods, the operator in a thread.

`storage_nodes` (a fresh pair per test) are real `shale serve` processes with node ids 0 and 1 watching
one topics directory — fresh, because pods would hold what an earlier test left: the next test's empty
ConfigMap empties their directory, which they take for a lost volume, deleting nothing. Each test gets
a fresh `cluster`: an API server holding the StatefulSet `shale` and its pods `shale-0`/`shale-1`
(podIP 127.0.0.1, named container ports `kafka` and `http` = the processes' ports), the ConfigMap
projection into the watched directory, and `shale operator` running in a background thread against
the API server through a kubeconfig — as kopf's KopfRunner runs an operator, but through our own
entry point and settings.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import kubernetes
import pytest

from shale.operator.settings import Settings
from support.cluster_util import (
    CLIENTS_CA_SECRET,
    CONFIGMAP,
    REFRESH_SECONDS,
    STORAGE_NS,
    STUCK_AFTER_SECONDS,
    Cluster,
    OperatorThread,
    StorageNodes,
    storage_objects,
)
from support.k8s_util import ApiServerThread
from support.node_util import ServeProcess, free_port
from support.projection import ConfigMapProjection


@pytest.fixture
def storage_nodes(tmp_path_factory, request) -> Iterator[StorageNodes]:
    """Parametrize indirectly with broker overrides ("key=value", ...) for the pods."""
    base = tmp_path_factory.mktemp("storage")
    topics_dir = base / "topics"
    topics_dir.mkdir()
    overrides = ["log.cleaner.backoff.ms=200", *getattr(request, "param", ())]
    nodes = [ServeProcess(base / f"data{n}", topics_dir, *(a for o in overrides for a in ("--override", o)), node_id=n)
             for n in (0, 1)]
    for node in nodes:
        node.start()
    yield StorageNodes(topics_dir, nodes)
    for node in nodes:
        assert node.terminate() == 0, node.log()


@dataclass
class ClusterParts:
    """Everything of `cluster` but the operator: for tests that start it themselves."""

    api: kubernetes.client.ApiClient
    apiserver: ApiServerThread
    projection: ConfigMapProjection
    settings: Settings
    kubeconfig: Path


@pytest.fixture
def cluster_parts(storage_nodes: StorageNodes, tmp_path: Path, monkeypatch) -> Iterator[ClusterParts]:
    server = ApiServerThread().start()
    api = server.client()
    sts, pods = storage_objects(storage_nodes.nodes)
    kubernetes.client.AppsV1Api(api).create_namespaced_stateful_set(STORAGE_NS, sts)
    for pod in pods:
        kubernetes.client.CoreV1Api(api).create_namespaced_pod(STORAGE_NS, pod)
    kubeconfig = server.write_kubeconfig(tmp_path / "kubeconfig")
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
    projection = ConfigMapProjection(api, STORAGE_NS, CONFIGMAP, storage_nodes.topics_dir).start()
    settings = Settings(storage_namespace=STORAGE_NS, configmap=CONFIGMAP, statefulset="shale",
                        status_url_template="http://{pod_ip}:{port_http}/status",
                        node_address_template="{pod_ip}:{port_kafka}",
                        cleaning_stuck_after_seconds=STUCK_AFTER_SECONDS, status_interval_seconds=REFRESH_SECONDS,
                        scale_check_interval_seconds=REFRESH_SECONDS,
                        ready_wait_seconds=10, liveness_endpoint=f"http://127.0.0.1:{free_port()}/healthz",
                        metrics_host="127.0.0.1", metrics_port=free_port(), clients_ca_secret=CLIENTS_CA_SECRET)
    try:
        yield ClusterParts(api, server, projection, settings, kubeconfig)
    finally:
        projection.stop()
        server.stop()


@pytest.fixture
def cluster(storage_nodes: StorageNodes, cluster_parts: ClusterParts) -> Iterator[Cluster]:
    parts = cluster_parts
    operator = OperatorThread(parts.settings).start()
    try:
        yield Cluster(parts.api, storage_nodes, operator, parts.projection, parts.apiserver, parts.kubeconfig)
    finally:
        operator.stop()
