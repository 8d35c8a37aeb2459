"""`helm install`, `helm upgrade` and `helm uninstall` of the chart with a real helm (v4.1.4, fetch_helm.sh)
against the real API server.

The chart declares kubeVersion >=1.29 and its CRD carries CEL rules, so helm is given a copy for 1.20:
the floor lowered, the CRD without `x-kubernetes-validations` (apiserver_util.crd_for_1_20), and the
PodDisruptionBudget under policy/v1beta1 (policy/v1 is served from 1.21; the same fields). Two helm
flags are 1.20's too: `--disable-openapi-validation` (helm would refuse the StatefulSet's
persistentVolumeClaimRetentionPolicy, a 1.27 field, from 1.20's OpenAPI; the server drops it) and
`--server-side=false` (1.20's beta server-side apply refuses Service ports without `protocol`, a bug fixed
in later releases). Neither is needed on the clusters the chart supports.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import kubernetes
import pytest

from support.apiserver_util import FLAGS_FOR_1_20, HELM_VERSION, RELEASE_VALUES, chart_for_1_20, release_objects
from support.chart_util import RELEASE, one
from support.kube_apiserver import ApiServer, cached_binary


def test_helm_install_upgrade_uninstall(apiserver: ApiServer, tmp_path: Path):
    helm = cached_binary("helm", HELM_VERSION)
    if not helm.exists():
        pytest.fail(f"{helm} missing: run tests/apiserver/fetch_helm.sh (`make test` does)")
    kubeconfig = apiserver.write_kubeconfig(tmp_path / "kubeconfig")
    chart, namespace = chart_for_1_20(tmp_path), "helm-journey"

    def run(*args: str) -> str:
        result = subprocess.run([str(helm), "--kubeconfig", str(kubeconfig), "-n", namespace, *args],
                                capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, result.stderr
        return result.stdout

    replicas = ["--set", f"storage.replicas={RELEASE_VALUES['storage']['replicas']}"]
    run("install", RELEASE, str(chart), "--create-namespace", *replicas, *FLAGS_FOR_1_20)
    rendered = release_objects(namespace)
    client = kubernetes.dynamic.DynamicClient(apiserver.client())

    def stored(obj: dict) -> dict | None:
        resource = client.resources.get(api_version=obj["apiVersion"], kind=obj["kind"])
        try:
            return resource.get(name=obj["metadata"]["name"], namespace=namespace).to_dict()
        except kubernetes.dynamic.exceptions.NotFoundError:
            return None

    for obj in rendered:  # what Helm's library renders is what the helm binary installed
        found = stored(obj)
        assert found is not None, f"{obj['kind']} {obj['metadata']['name']} not installed"
        assert found["metadata"]["annotations"]["meta.helm.sh/release-name"] == RELEASE
    assert "deployed" in run("status", RELEASE)

    secrets = {o["metadata"]["name"]: stored(o)["data"] for o in rendered if o["kind"] == "Secret"}
    assert len(secrets) == 5  # TLS material and the HTTP token, generated on install (security.enabled)
    run("upgrade", RELEASE, str(chart), "--set", "storage.replicas=3", *FLAGS_FOR_1_20)
    assert stored(one(rendered, "StatefulSet"))["spec"]["replicas"] == 3
    # An upgrade keeps every generated certificate, key and token (`lookup`): nothing to roll, no client cut off.
    assert {name: stored({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name}})["data"]
            for name in secrets} == secrets
    assert "REVISION: 2" in run("status", RELEASE)

    run("uninstall", RELEASE)
    assert [o["metadata"]["name"] for o in rendered if stored(o) is not None] == []
    # The CRD (and so every Topic) outlives the release, as Helm treats crds/.
    ext = kubernetes.client.ApiextensionsV1Api(apiserver.client())
    assert ext.read_custom_resource_definition("topics.shale.dev").metadata.name == "topics.shale.dev"
