"""The Helm chart, linted and rendered by Helm's own engine (helm-python-sdk), objects checked against
Kubernetes' schemas (kubernetes-validate), and the storage container's command run for real: the
rendered shell line starts a real `shale serve`, whose rendered probes answer.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import helm_python as helm
import kubernetes_validate
import pytest
import yaml
from chart_util import CHART, FULL_VALUES, NAMESPACE, RELEASE, by_kind, objects, one, render
from kafka.protocol.metadata.metadata import MetadataRequest, MetadataResponse

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "server"))
from clients_util import build, call  # noqa: E402

from shale.operator import settings as operator_settings
from shale.operator.crd import render_yaml

KUBE_VERSIONS = ("1.29", kubernetes_validate.latest_version())  # the chart's kubeVersion floor, and the newest
PROMETHEUS_OPERATOR_KINDS = {"ServiceMonitor", "PrometheusRule"}  # no schema shipped by kubernetes-validate
STS, HEADLESS, CONFIGMAP = f"{RELEASE}-shale-storage", f"{RELEASE}-shale-storage-headless", f"{RELEASE}-shale-topics"
OPERATOR, STORAGE_SA = f"{RELEASE}-shale-operator", f"{RELEASE}-shale-storage"
NODES_ROLE = f"{OPERATOR}-{NAMESPACE}-nodes"


@pytest.fixture(scope="module")
def default_objects():
    return objects(render())


@pytest.fixture(scope="module")
def full_objects():
    return objects(render(FULL_VALUES))


def container(obj: dict) -> dict:
    [only] = obj["spec"]["template"]["spec"]["containers"]
    return only


def env_of(obj: dict) -> dict[str, str]:
    return {e["name"]: e["value"] for e in container(obj)["env"] if "value" in e}


# -- lint and schemas --------------------------------------------------------------------------------


@pytest.mark.parametrize("values", [None, FULL_VALUES], ids=["default", "full"])
def test_helm_lint_strict(values):
    report = helm.lint(str(CHART), values, strict=True, namespace=NAMESPACE, kube_version="v1.29.0")
    assert report["errors"] == []
    assert [m for m in report["messages"] if m["severity"] >= 2] == []


def test_chart_ships_the_generated_crd():
    with helm.Chart.load(str(CHART)) as chart:
        [crd] = chart.crds
        assert chart.metadata["kubeVersion"] == ">=1.29.0-0"
    assert crd["filename"] == "shale/crds/topics.shale.dev.yaml" and crd["data"] == render_yaml()
    for version in KUBE_VERSIONS:
        kubernetes_validate.validate(yaml.safe_load(crd["data"]), version, strict=True)


@pytest.mark.parametrize("values", [None, FULL_VALUES, {"operator": {"watchAnyNamespace": True}, **FULL_VALUES}],
                         ids=["default", "full", "any-namespace"])
@pytest.mark.parametrize("version", KUBE_VERSIONS)
def test_every_object_is_valid_kubernetes(values, version):
    skipped = set()
    for obj in objects(render(values)):
        try:
            kubernetes_validate.validate(obj, version, strict=True)
        except kubernetes_validate.SchemaNotFoundError:
            skipped.add(obj["kind"])
        except kubernetes_validate.ValidationError as exc:
            pytest.fail(f"{obj['kind']} {obj['metadata']['name']}: {exc}")
    assert skipped <= PROMETHEUS_OPERATOR_KINDS


def test_kubernetes_validate_refuses_a_broken_object(default_objects):
    """The check above has teeth: a wrong type in a rendered object is refused."""
    sts = one(default_objects, "StatefulSet")
    broken = yaml.safe_load(yaml.safe_dump(sts))
    broken["spec"]["replicas"] = "two"
    with pytest.raises(kubernetes_validate.ValidationError, match="'two' is not of type 'integer'"):
        kubernetes_validate.validate(broken, KUBE_VERSIONS[0], strict=True)


@pytest.mark.parametrize("values, message", [
    ({"storage": {"replicas": 0}}, "at '/storage/replicas': minimum: got 0, want 1"),
    ({"storage": {"persistence": {"size": "ten gigs"}}}, "'/storage/persistence/size'"),
    ({"operator": {"watchNamespace": ["a"]}}, "additional properties 'watchNamespace' not allowed"),
    ({"metrics": {"prometheusRule": {"disabledAlerts": ["NoSuchAlert"]}}},
     "'/metrics/prometheusRule/disabledAlerts/0'"),
    ({"fullnameOverride": "x" * 41}, "'/fullnameOverride'"),
    ({"operator": {"defaultReplicas": 0}}, "at '/operator/defaultReplicas': minimum: got 0, want 1"),
    ({"storage": {"replication": {"enabled": "yes"}}}, "'/storage/replication/enabled'"),
])  # fmt: skip
def test_values_schema_refuses_bad_values(values, message):
    with pytest.raises(helm.HelmValuesError, match=re.escape(message)):
        render(values)


# -- what the default render holds -------------------------------------------------------------------


def test_default_objects(default_objects):
    kinds = sorted((o["kind"], o["metadata"]["name"]) for o in default_objects)
    assert kinds == sorted([
        ("ConfigMap", CONFIGMAP), ("Deployment", OPERATOR),
        ("Role", f"{OPERATOR}-storage"), ("Role", f"{OPERATOR}-topics"),
        ("RoleBinding", f"{OPERATOR}-storage"), ("RoleBinding", f"{OPERATOR}-topics"),
        ("ClusterRole", NODES_ROLE), ("ClusterRoleBinding", NODES_ROLE),
        ("Role", f"{STS}-leases"), ("RoleBinding", f"{STS}-leases"),
        ("Service", f"{RELEASE}-shale"), ("Service", HEADLESS), ("Service", OPERATOR),
        ("ServiceAccount", OPERATOR), ("ServiceAccount", STORAGE_SA), ("StatefulSet", STS),
    ])  # fmt: skip
    for obj in default_objects:
        if obj["kind"] not in ("ClusterRole", "ClusterRoleBinding"):
            assert obj["metadata"]["namespace"] == NAMESPACE, obj["metadata"]["name"]


def test_full_render_adds_monitoring(full_objects, default_objects):
    extra = [o for o in full_objects if o["kind"] in PROMETHEUS_OPERATOR_KINDS]
    assert sorted((o["kind"], o["metadata"]["name"]) for o in extra) == [
        ("PrometheusRule", f"{RELEASE}-shale"), ("ServiceMonitor", OPERATOR), ("ServiceMonitor", STS)]
    assert len(full_objects) == len(default_objects) + 3


def test_operator_deployment(default_objects):
    deployment = one(default_objects, "Deployment")
    assert deployment["spec"]["replicas"] == 1
    assert deployment["spec"]["strategy"] == {"type": "Recreate"}
    pod = deployment["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == one(default_objects, "ServiceAccount", OPERATOR)["metadata"]["name"]
    c = container(deployment)
    assert c["args"] == ["--log-level", "INFO", "operator"]
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports == {"health": 8081, "metrics": 8082}
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}
    assert "readinessProbe" not in c


def test_operator_settings_come_from_the_chart(default_objects):
    """The chart's environment, read by the operator's own Settings: names, ports and templates agree."""
    deployment, sts = one(default_objects, "Deployment"), one(default_objects, "StatefulSet")
    env = env_of(deployment)
    parser = argparse.ArgumentParser()
    operator_settings.add_arguments(parser)
    known = set(re.findall(r"\(env (SHALE_\w+)\)", " ".join(a.help or "" for a in parser._actions)))
    assert set(env) <= known, f"variables the operator does not read: {set(env) - known}"
    s = operator_settings.Settings.from_env(env)
    assert s.storage_namespace == NAMESPACE and s.watch_namespaces == (NAMESPACE,)
    assert s.configmap == CONFIGMAP == one(default_objects, "ConfigMap")["metadata"]["name"]
    assert s.statefulset == STS == sts["metadata"]["name"]
    assert s.service == HEADLESS == sts["spec"]["serviceName"]
    assert s.liveness_endpoint == "http://0.0.0.0:8081/healthz" and s.metrics_port == 8082
    fields = {"pod": f"{STS}-2", "service": HEADLESS, "namespace": NAMESPACE}
    assert s.node_address_template.format(**fields) == f"{STS}-2.{HEADLESS}.{NAMESPACE}.svc:9092"
    assert s.status_url_template.format(**fields) == f"http://{STS}-2.{HEADLESS}.{NAMESPACE}.svc:8080/status"
    assert s.default_replicas == 3  # Kafka's usual replication factor; the operator caps it by the pods
    unreplicated = objects(render({"storage": {"replication": {"enabled": False}}, "operator": {"defaultReplicas": 5}}))
    assert operator_settings.Settings.from_env(env_of(one(unreplicated, "Deployment"))).default_replicas == 1


def test_watch_namespaces():
    objs = objects(render({"operator": {"watchNamespaces": ["team-a", "team-b"]}}))
    assert env_of(one(objs, "Deployment"))["SHALE_WATCH_NAMESPACES"] == "team-a,team-b"
    topic_roles = [r for r in by_kind(objs, "Role") if r["metadata"]["name"] == f"{OPERATOR}-topics"]
    assert sorted(r["metadata"]["namespace"] for r in topic_roles) == ["team-a", "team-b"]
    anywhere = objects(render({"operator": {"watchAnyNamespace": True}}))
    assert env_of(one(anywhere, "Deployment"))["SHALE_WATCH_NAMESPACES"] == ""
    assert sorted(r["metadata"]["name"] for r in by_kind(anywhere, "Role")) == [f"{OPERATOR}-storage", f"{STS}-leases"]
    topics_everywhere = one(anywhere, "ClusterRole", f"{OPERATOR}-{NAMESPACE}")
    assert topics_everywhere["rules"] == one(objects(render()), "Role", f"{OPERATOR}-topics")["rules"]
    assert one(anywhere, "ClusterRoleBinding", f"{OPERATOR}-{NAMESPACE}")["roleRef"]["name"] == f"{OPERATOR}-{NAMESPACE}"
    # No cluster-wide rights unless asked for, but reading nodes' zones (rbac.nodeZones, default on).
    assert [r["metadata"]["name"] for r in by_kind(objects(render()), "ClusterRole")] == [NODES_ROLE]
    assert not by_kind(objects(render({"rbac": {"nodeZones": False}})), "ClusterRole")


def test_rbac_is_least_privilege(default_objects):
    rules = {(r["metadata"]["name"], r["metadata"].get("namespace")): r["rules"]
             for r in by_kind(default_objects, "Role") + by_kind(default_objects, "ClusterRole")}
    granted: dict[str, dict] = {}
    for (name, _), role_rules in rules.items():
        for rule in role_rules:
            for group in rule["apiGroups"]:
                for resource in rule["resources"]:
                    assert "*" not in rule["verbs"] and resource != "*" and group != "*"
                    who = "storage" if name == f"{STS}-leases" else "operator"
                    granted.setdefault(who, {}).setdefault((group, resource), []).append(
                        (sorted(rule["verbs"]), rule.get("resourceNames")))
    assert granted["operator"] == {
        ("shale.dev", "topics"): [(["list", "patch", "watch"], None)],
        ("shale.dev", "topics/status"): [(["patch"], None)],
        ("", "events"): [(["create"], None)],
        # create cannot be limited to a name: recreating the deleted topics ConfigMap
        ("", "configmaps"): [(["get", "patch"], [CONFIGMAP]), (["create"], None)],
        ("", "pods"): [(["list"], None)],
        ("apps", "statefulsets"): [(["get"], [STS])],
        ("", "nodes"): [(["get"], None)],  # zone labels (ClusterRole)
    }
    # KubeStore's calls (tests/replication/test_kube_store.py runs them under this Role): Leases only.
    assert granted["storage"] == {("coordination.k8s.io", "leases"): [(["create", "delete", "get", "list", "patch"],
                                                                       None)]}
    accounts = {"operator": one(default_objects, "ServiceAccount", OPERATOR)["metadata"]["name"],
                "storage": one(default_objects, "ServiceAccount", STORAGE_SA)["metadata"]["name"]}
    for binding in by_kind(default_objects, "RoleBinding") + by_kind(default_objects, "ClusterRoleBinding"):
        sa = accounts["storage" if binding["metadata"]["name"] == f"{STS}-leases" else "operator"]
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": sa, "namespace": NAMESPACE}]
        assert (binding["roleRef"]["name"], binding["metadata"].get("namespace")) in rules


def test_storage_pods_run_with_the_store_and_their_own_account_only_when_replicating(default_objects):
    sts = one(default_objects, "StatefulSet")
    pod = sts["spec"]["template"]["spec"]
    assert (pod["serviceAccountName"], pod["automountServiceAccountToken"]) == (STORAGE_SA, True)
    assert "--store kubernetes --cluster-id demo-shale" in container(sts)["args"][0]
    assert one(default_objects, "ServiceAccount", STORAGE_SA)["automountServiceAccountToken"] is False
    off = objects(render({"storage": {"replication": {"enabled": False}}}))
    pod = one(off, "StatefulSet")["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is False and "--store" not in container(one(off, "StatefulSet"))["args"][0]
    assert not [r for r in by_kind(off, "Role") if r["metadata"]["name"] == f"{STS}-leases"]


def test_storage_statefulset(default_objects):
    sts = one(default_objects, "StatefulSet")
    pod = sts["spec"]["template"]["spec"]
    c = container(sts)
    assert {p["name"]: p["containerPort"] for p in c["ports"]} == {"kafka": 9092, "http": 8080}
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
    assert mounts == {"/var/lib/shale": "data", "/etc/shale/topics": "topics", "/tmp": "tmp"}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["topics"]["configMap"] == {"name": CONFIGMAP, "optional": True}
    [claim] = sts["spec"]["volumeClaimTemplates"]
    assert claim["metadata"]["name"] == "data" and claim["spec"]["resources"]["requests"]["storage"] == "10Gi"
    assert "storageClassName" not in claim["spec"]
    assert sts["spec"]["selector"]["matchLabels"].items() <= sts["spec"]["template"]["metadata"]["labels"].items()


def test_storage_class_can_be_set():
    sts = one(objects(render({"storage": {"persistence": {"storageClassName": "fast-ssd"}}})), "StatefulSet")
    assert sts["spec"]["volumeClaimTemplates"][0]["spec"]["storageClassName"] == "fast-ssd"


def test_pods_run_as_non_root_with_a_read_only_root(default_objects):
    for workload in by_kind(default_objects, "Deployment") + by_kind(default_objects, "StatefulSet"):
        pod = workload["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] != 0
        sc = container(workload)["securityContext"]
        assert sc["readOnlyRootFilesystem"] is True and sc["allowPrivilegeEscalation"] is False
        assert sc["capabilities"] == {"drop": ["ALL"]}
        assert "/tmp" in {m["mountPath"] for m in container(workload)["volumeMounts"]}


def test_the_dockerfile_builds_the_image_the_chart_runs(default_objects):
    """No Docker engine here: the Dockerfile is checked against what the chart expects of the image."""
    dockerfile = (CHART.parents[1] / "Dockerfile").read_text()
    uid, gid = map(int, re.search(r"^USER (\d+):(\d+)$", dockerfile, re.M).groups())
    assert re.search(rf"useradd --uid {uid} --user-group ", dockerfile)
    assert re.search(r'^ENTRYPOINT \["shale"\]$', dockerfile, re.M)  # the operator's args are shale's
    assert "PYTHONDONTWRITEBYTECODE=1" in dockerfile  # the root filesystem is read-only
    assert re.search(r"^FROM python:3\.11-slim$", dockerfile, re.M)  # pyproject: requires-python 3.11
    exposed = {int(port) for port in re.search(r"^EXPOSE (.+)$", dockerfile, re.M)[1].split()}
    for workload in by_kind(default_objects, "Deployment") + by_kind(default_objects, "StatefulSet"):
        pod = workload["spec"]["template"]["spec"]
        assert (pod["securityContext"]["runAsUser"], pod["securityContext"]["runAsGroup"]) == (uid, gid)
        assert {p["containerPort"] for p in container(workload)["ports"]} <= exposed
    assert container(one(default_objects, "Deployment"))["args"][-1] == "operator"
    assert container(one(default_objects, "StatefulSet"))["args"][0].startswith("exec shale serve ")


def test_services_select_the_storage_pods(default_objects):
    sts = one(default_objects, "StatefulSet")
    pod_labels = sts["spec"]["template"]["metadata"]["labels"]
    headless, client = one(default_objects, "Service", HEADLESS), one(default_objects, "Service", f"{RELEASE}-shale")
    assert headless["spec"]["clusterIP"] == "None" and headless["spec"]["publishNotReadyAddresses"] is True
    assert {p["name"]: p["port"] for p in headless["spec"]["ports"]} == {"kafka": 9092, "http": 8080}
    assert {p["name"]: p["port"] for p in client["spec"]["ports"]} == {"kafka": 9092}
    for service in (headless, client):
        assert service["spec"]["selector"].items() <= pod_labels.items()
    operator_pod = one(default_objects, "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert one(default_objects, "Service", OPERATOR)["spec"]["selector"].items() <= operator_pod.items()


def test_service_monitors_scrape_each_pod_once(full_objects):
    services = {s["metadata"]["name"]: s for s in by_kind(full_objects, "Service")}
    storage_sm, operator_sm = one(full_objects, "ServiceMonitor", STS), one(full_objects, "ServiceMonitor", OPERATOR)
    for sm, expected in ((storage_sm, HEADLESS), (operator_sm, OPERATOR)):
        selector = sm["spec"]["selector"]["matchLabels"].items()
        selected = [n for n, s in services.items() if selector <= s["metadata"]["labels"].items()]
        assert selected == [expected]
        [endpoint] = sm["spec"]["endpoints"]
        assert endpoint["path"] == "/metrics"
        assert endpoint["port"] in {p["name"] for p in services[expected]["spec"]["ports"]}
    assert operator_sm["spec"]["endpoints"][0]["honorLabels"] is True  # keeps shale_topic_ready's namespace label
    assert "honorLabels" not in storage_sm["spec"]["endpoints"][0]


def test_monitoring_labels_for_kube_prometheus_stack():
    values = {"metrics": {"serviceMonitor": {"enabled": True, "additionalLabels": {"release": "kps"}},
                          "prometheusRule": {"enabled": True, "additionalLabels": {"release": "kps"}}}}
    for obj in objects(render(values)):
        if obj["kind"] in PROMETHEUS_OPERATOR_KINDS:
            assert obj["metadata"]["labels"]["release"] == "kps"


# -- the storage command, run for real ---------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(port: int, path: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()
    except OSError:
        return 0, b""


def test_storage_command_starts_a_node_with_the_pods_ordinal_as_node_id(tmp_path):
    """The rendered `sh -c` line, run by /bin/sh with POD_NAME set as the downward API sets it."""
    kafka, http = _free_port(), _free_port()
    # Without replication: outside a pod and without an API server, `--store kubernetes` has nothing to talk to
    # (tests/apiserver/test_replication_on_apiserver.py runs replicated nodes against a real one).
    values = {"storage": {"kafkaPort": kafka, "httpPort": http, "overrides": {"log.cleaner.threads": 2},
                          "replication": {"enabled": False}}}
    sts = one(objects(render(values)), "StatefulSet")
    c = container(sts)
    assert c["command"] == ["/bin/sh", "-c"]
    [line] = c["args"]
    data, topics = tmp_path / "volume", tmp_path / "topics"
    topics.mkdir()
    (topics / "prices.yaml").write_text(yaml.safe_dump({
        "apiVersion": "shale.dev/v1alpha1", "kind": "Topic", "metadata": {"name": "prices"},
        "spec": {"partitions": 2, "config": {"cleanup.policy": "compact"}}}))
    line = line.replace("/var/lib/shale/", f"{data}/").replace("/etc/shale/topics", str(topics))
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"  # `shale` of this venv
    env = {**os.environ, "POD_NAME": f"{STS}-3", "PATH": path}
    proc = subprocess.Popen(["/bin/sh", "-c", line], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        probes = {name: c[name]["httpGet"]["path"] for name in ("readinessProbe", "livenessProbe")}
        deadline = time.monotonic() + 60
        while _get(http, probes["readinessProbe"])[0] != 200:
            assert proc.poll() is None, proc.stderr.read().decode()
            assert time.monotonic() < deadline, "node not ready within 60 s"
            time.sleep(0.2)
        assert _get(http, probes["livenessProbe"])[0] == 200
        status = json.loads(_get(http, "/status")[1])
        assert status["node_id"] == 3
        assert status["data_dir"]["path"] == str(data / "data")
        assert len(status["cleaner"]["threads"]) == 2
        assert [p["partition"] for p in status["topics"]["prices"]["partitions"]] == [0, 1]
        # Metadata on one raw connection: the name clients are sent to (it resolves only in the cluster, so a
        # real client would drop the bootstrap connection for it and never get an answer here).
        metadata = call(kafka, build(MetadataRequest, {"topics": None, "allow_auto_topic_creation": False}, 12),
                        MetadataResponse)
        advertised = f"{STS}-3.{HEADLESS}.{NAMESPACE}.svc"
        assert [(b.node_id, b.host, b.port) for b in metadata.brokers] == [(3, advertised, kafka)]
    finally:
        proc.terminate()  # `exec` made shale PID 1 of the shell line: SIGTERM is a clean stop
        assert proc.wait(timeout=60) == 0
    assert (data / "data" / ".kafka_cleanshutdown").exists()
