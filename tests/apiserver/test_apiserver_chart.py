"""Every object the Helm chart renders, created on a real kube-apiserver as `helm install` would create it.

No controller runs here (no controller-manager, scheduler or kubelet), so the Deployment and StatefulSet
are stored and validated but never run; the operator's tests stand in for that (test_apiserver_operator.py).
ServiceMonitor and PrometheusRule need the Prometheus Operator's CRDs, which this server does not have:
they are checked offline (tests/k8s/test_helm_chart.py, tests/k8s/test_alerts.py).
"""

from __future__ import annotations

import kubernetes
import pytest

from support.apiserver_util import create_objects, release_objects
from support.chart_util import FULL_VALUES
from support.kube_apiserver import ApiServer

PROMETHEUS_OPERATOR_KINDS = {"ServiceMonitor", "PrometheusRule"}


@pytest.mark.parametrize("values", [FULL_VALUES, {"operator": {"watchAnyNamespace": True}, **FULL_VALUES}],
                         ids=["full", "any-namespace"])
def test_every_object_the_chart_renders_is_accepted(apiserver: ApiServer, values, request):
    namespace = f"chart-{request.node.callspec.id}"
    api = apiserver.client()
    kubernetes.client.CoreV1Api(api).create_namespace({"metadata": {"name": namespace}})
    objs = release_objects(namespace, {**values, "storage": {"replicas": 3}})  # with replication: every object
    kinds = {o["kind"] for o in objs}
    assert PROMETHEUS_OPERATOR_KINDS <= kinds  # the full values render them...
    served = [o for o in objs if o["kind"] not in PROMETHEUS_OPERATOR_KINDS]
    create_objects(api, served, dry_run=True)  # ...the server validates the others, all of them first
    create_objects(api, served)
    client = kubernetes.dynamic.DynamicClient(api)
    for obj in served:  # and stores them: each one reads back
        resource = client.resources.get(api_version=obj["apiVersion"], kind=obj["kind"])
        stored = resource.get(name=obj["metadata"]["name"],
                              namespace=obj["metadata"].get("namespace") if resource.namespaced else None)
        assert stored.to_dict()["metadata"].get("labels") == obj["metadata"].get("labels")
    bindings = {o["metadata"]["name"] for o in objs if o["kind"] == "ClusterRoleBinding"}
    assert bindings == {f"demo-shale-operator-{namespace}-nodes"} | (
        {f"demo-shale-operator-{namespace}"} if values.get("operator", {}).get("watchAnyNamespace") else set())
    assert {"demo-shale-storage", "demo-shale-operator"} <= {o["metadata"]["name"] for o in objs
                                                             if o["kind"] == "ServiceAccount"}
