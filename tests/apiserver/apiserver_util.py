"""What the real-API-server tests put on the server: the CRD as 1.20 takes it, the chart's objects, the pods.

The chart is rendered by Helm's engine (tests/k8s/chart_util.py) into a namespace of its own per test,
and every object it renders is created on the server as `helm install` would create it — so the
operator's service account holds exactly the Roles the chart grants. The storage pods are Pod objects
as the StatefulSet controller would create them from the chart's template (no controller runs here),
with the real `shale serve` processes' ports and status as a kubelet would report them.
"""

from __future__ import annotations

import copy
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import kubernetes
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "k8s"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "operator"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "server"))
from chart_util import CRD_FILES, objects, one, render  # noqa: E402
from cluster_util import REFRESH_SECONDS, STUCK_AFTER_SECONDS, Cluster, OperatorThread, StorageNodes  # noqa: E402
from node_util import ServeProcess, free_port  # noqa: E402
from projection import ConfigMapProjection  # noqa: E402

from shale.operator.settings import Settings  # noqa: E402

# Two storage nodes (placement has a choice) without a store: the operator journeys run one replica per
# partition; test_replication_on_apiserver.py renders the chart with replication for its three nodes.
RELEASE_VALUES = {"storage": {"replicas": 2, "replication": {"enabled": False}}}


@dataclass
class Release:
    """The chart installed into `namespace`: its objects as rendered, and the operator's service account."""

    namespace: str
    objects: list[dict[str, Any]]

    @property
    def service_account(self) -> str:
        return one(self.objects, "Deployment")["spec"]["template"]["spec"]["serviceAccountName"]

    @property
    def storage_service_account(self) -> str:
        return one(self.objects, "StatefulSet")["spec"]["template"]["spec"]["serviceAccountName"]


def crd_for_1_20() -> dict[str, Any]:
    """The shipped CRD minus its CEL rules: `x-kubernetes-validations` arrived after 1.20, whose server
    refuses the unknown field. The shipped CRD keeps them (tests/k8s/test_crd.py runs them in cel-python);
    only this copy, given to the 1.20 test server, goes without."""
    def strip(node: Any) -> Any:
        if isinstance(node, dict):
            return {k: strip(v) for k, v in node.items() if k != "x-kubernetes-validations"}
        return [strip(v) for v in node] if isinstance(node, list) else node
    return strip(yaml.safe_load(CRD_FILES[0].read_text()))


def install_crd(api: kubernetes.client.ApiClient) -> dict[str, Any]:
    """Create the CRD and wait until it is Established (served), as `helm install` does for crds/."""
    ext = kubernetes.client.ApiextensionsV1Api(api)
    crd = crd_for_1_20()
    ext.create_custom_resource_definition(crd)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        status = ext.read_custom_resource_definition(crd["metadata"]["name"]).status
        if any(c.type == "Established" and c.status == "True" for c in status.conditions or ()):
            return crd
        time.sleep(0.1)
    raise AssertionError(f"CRD {crd['metadata']['name']} not Established: {status}")


def release_objects(namespace: str, values: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """The chart rendered into `namespace` (CRD excluded: it is cluster-wide, installed once per session)."""
    return objects(render({**RELEASE_VALUES, **(values or {})}, namespace=namespace))


def create_objects(api: kubernetes.client.ApiClient, objs: list[dict[str, Any]], dry_run: bool = False) -> None:
    """Create each object on the server through discovery, as `helm install`/`kubectl create` do."""
    client = kubernetes.dynamic.DynamicClient(api)
    for obj in objs:
        resource = client.resources.get(api_version=obj["apiVersion"], kind=obj["kind"])
        namespace = obj["metadata"].get("namespace") if resource.namespaced else None
        resource.create(body=obj, namespace=namespace, **({"dry_run": "All"} if dry_run else {}))


def storage_pods(objs: list[dict[str, Any]], nodes: list[ServeProcess]) -> list[dict[str, Any]]:
    """The StatefulSet's pods `<sts>-<n>` from its template, the container ports being the processes' ports.

    The template's volumes come from volumeClaimTemplates (PVCs the controller would create), so the
    data mount is dropped; no service-account token is mounted (no token controller runs here)."""
    sts = one(objs, "StatefulSet")
    pods = []
    for n, node in enumerate(nodes):
        template = copy.deepcopy(sts["spec"]["template"])
        spec = template["spec"]
        spec["automountServiceAccountToken"] = False
        claims = {c["metadata"]["name"] for c in sts["spec"].get("volumeClaimTemplates", ())}
        for container in spec["containers"]:
            container["volumeMounts"] = [m for m in container.get("volumeMounts", ()) if m["name"] not in claims]
            container["ports"] = [{**p, "containerPort": {"kafka": node.port, "http": node.http_port}[p["name"]]}
                                  for p in container["ports"]]
        pods.append({"apiVersion": "v1", "kind": "Pod", "spec": spec,
                     "metadata": {**template["metadata"], "name": f"{sts['metadata']['name']}-{n}",
                                  "namespace": sts["metadata"]["namespace"]}})
    return pods


def run_pods(api: kubernetes.client.ApiClient, pods: list[dict[str, Any]]) -> None:
    """Create the pods and report them Running on 127.0.0.1, as the kubelet would."""
    core = kubernetes.client.CoreV1Api(api)
    for pod in pods:
        ns, name = pod["metadata"]["namespace"], pod["metadata"]["name"]
        core.create_namespaced_pod(ns, pod)
        core.patch_namespaced_pod_status(name, ns, {"status": {
            "phase": "Running", "podIP": "127.0.0.1", "podIPs": [{"ip": "127.0.0.1"}]}})


def operator_env(objs: list[dict[str, Any]]) -> dict[str, str]:
    """The operator's environment as the chart's Deployment sets it."""
    [container] = one(objs, "Deployment")["spec"]["template"]["spec"]["containers"]
    return {e["name"]: e["value"] for e in container.get("env", ()) if "value" in e}



def install_release(api: kubernetes.client.ApiClient, namespace: str, values: dict[str, Any] | None = None) -> Release:
    """A fresh namespace holding every object the chart renders (with `values`), as `helm install` leaves it."""
    kubernetes.client.CoreV1Api(api).create_namespace({"metadata": {"name": namespace}})
    # The namespace's `default` service account is the controller-manager's doing; none runs here.
    kubernetes.client.CoreV1Api(api).create_namespaced_service_account(namespace, {"metadata": {"name": "default"}})
    objs = release_objects(namespace, values)
    create_objects(api, objs)
    return Release(namespace, objs)


@contextmanager
def operated(apiserver: Any, release: Release, storage: StorageNodes, base: Path, monkeypatch: Any) -> Iterator[Cluster]:
    """The storage processes' Pod objects, the ConfigMap projection and the operator — logged in with a
    TokenRequest token of the chart's service account — around `storage` (started or not: its ports are known)."""
    projection = operator = None
    try:
        api = apiserver.client()
        run_pods(api, storage_pods(release.objects, storage.nodes))
        token = apiserver.service_account_token(release.namespace, release.service_account)
        kubeconfig = apiserver.write_kubeconfig(base / "kubeconfig", token)
        monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
        settings = Settings.from_env(
            operator_env(release.objects),  # the chart's names and namespaces; loopback where DNS would be
            status_url_template="http://{pod_ip}:{port_http}/status", node_address_template="{pod_ip}:{port_kafka}",
            cleaning_stuck_after_seconds=STUCK_AFTER_SECONDS, status_interval_seconds=REFRESH_SECONDS,
            ready_wait_seconds=10, liveness_endpoint=f"http://127.0.0.1:{free_port()}/healthz",
            metrics_host="127.0.0.1", metrics_port=free_port())
        projection = ConfigMapProjection(api, settings.storage_namespace, settings.configmap, storage.topics_dir).start()
        operator = OperatorThread(settings).start()
        yield Cluster(api, storage, operator, projection, apiserver, kubeconfig, namespace=release.namespace,
                      storage_namespace=settings.storage_namespace, configmap=settings.configmap)
    finally:  # whatever started is stopped, also when a later step failed
        if operator is not None:
            operator.stop()
        if projection is not None:
            projection.stop()
