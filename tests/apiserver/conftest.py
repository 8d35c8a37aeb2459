"""The real-API-server fixtures: one etcd + kube-apiserver per test session (per xdist worker), and per test
a namespace holding the chart's release, two real `shale serve` pods and the operator under the chart's RBAC.

`apiserver` starts the server (kube_apiserver.py; ~3 s, ~400 MB) and installs the Topic CRD once. A test
that needs it fails with the reason when it cannot start — it never skips. `release` renders the chart
into a fresh namespace and creates every object on the server; `cluster` adds the storage processes,
their Pod objects, the ConfigMap projection (the kubelet's part, tests/operator/projection.py) and the
operator, in a thread as tests/operator runs it, logged in with a TokenRequest token of the chart's
service account: every call it makes passes the real authorizer or fails as it would in a cluster.
"""

from __future__ import annotations

import itertools
from typing import Iterator

import kubernetes
import pytest

from apiserver_util import (Release, create_objects, install_crd, operator_env, release_objects, run_pods,
                            storage_pods)
from cluster_util import REFRESH_SECONDS, STUCK_AFTER_SECONDS, Cluster, OperatorThread, StorageNodes
from kube_apiserver import ApiServer
from node_util import ServeProcess, free_port
from projection import ConfigMapProjection
from shale.operator.settings import Settings

_namespaces = itertools.count(1)


@pytest.fixture(scope="session")
def apiserver(tmp_path_factory) -> Iterator[ApiServer]:
    server = ApiServer(tmp_path_factory.mktemp("apiserver"))
    try:
        server.start()
        install_crd(server.client())
    except BaseException:
        server.stop()
        raise
    yield server
    server.stop()


@pytest.fixture
def release(apiserver: ApiServer) -> Release:
    namespace = f"t{next(_namespaces)}"  # fresh per test (each xdist worker has its own server); never deleted
    api = apiserver.client()
    kubernetes.client.CoreV1Api(api).create_namespace({"metadata": {"name": namespace}})
    # The namespace's `default` service account is the controller-manager's doing; none runs here.
    kubernetes.client.CoreV1Api(api).create_namespaced_service_account(namespace, {"metadata": {"name": "default"}})
    objs = release_objects(namespace)
    create_objects(api, objs)
    return Release(namespace, objs)


@pytest.fixture
def cluster(apiserver: ApiServer, release: Release, tmp_path_factory, monkeypatch) -> Iterator[Cluster]:
    base = tmp_path_factory.mktemp("storage")
    topics_dir = base / "topics"
    topics_dir.mkdir()
    nodes = [ServeProcess(base / f"data{n}", topics_dir, "--override", "log.cleaner.backoff.ms=200", node_id=n)
             for n in (0, 1)]
    projection = operator = None
    try:
        for node in nodes:
            node.start()
        api = apiserver.client()
        run_pods(api, storage_pods(release.objects, nodes))
        token = apiserver.service_account_token(release.namespace, release.service_account)
        kubeconfig = apiserver.write_kubeconfig(base / "kubeconfig", token)
        monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
        settings = Settings.from_env(
            operator_env(release.objects),  # the chart's names and namespaces; loopback where DNS would be
            status_url_template="http://{pod_ip}:{port_http}/status", node_address_template="{pod_ip}:{port_kafka}",
            cleaning_stuck_after_seconds=STUCK_AFTER_SECONDS, status_interval_seconds=REFRESH_SECONDS,
            ready_wait_seconds=10, liveness_endpoint=f"http://127.0.0.1:{free_port()}/healthz",
            metrics_host="127.0.0.1", metrics_port=free_port())
        projection = ConfigMapProjection(api, settings.storage_namespace, settings.configmap, topics_dir).start()
        operator = OperatorThread(settings).start()
        yield Cluster(api, StorageNodes(topics_dir, nodes), operator, projection, apiserver, kubeconfig,
                      namespace=release.namespace, storage_namespace=settings.storage_namespace,
                      configmap=settings.configmap)
    finally:  # whatever started is stopped, also when a later step failed
        if operator is not None:
            operator.stop()
        if projection is not None:
            projection.stop()
        for node in nodes:
            if node.proc is not None:
                assert node.terminate() == 0, node.log()
