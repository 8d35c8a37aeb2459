"""The Helm chart, linted and rendered by Helm's own engine (helm-python-sdk), objects checked against
Kubernetes' schemas (kubernetes-validate), and the storage container's command run for real: the
rendered shell line starts a real `shale serve`, whose rendered probes answer.
"""

from __future__ import annotations

import argparse
import base64
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
from kafka.protocol.metadata.metadata import MetadataRequest, MetadataResponse

from shale.operator import settings as operator_settings
from shale.operator.crd import render_yaml
from shale.operator.user_crd import render_yaml as render_user_yaml
from support.chart_util import CHART, FULL_VALUES, NAMESPACE, RELEASE, by_kind, objects, one, render
from support.clients_util import build, call, exchange, request_frame

KUBE_VERSIONS = ("1.29", kubernetes_validate.latest_version())  # the chart's kubeVersion floor, and the newest
PROMETHEUS_OPERATOR_KINDS = {"ServiceMonitor", "PrometheusRule"}  # no schema shipped by kubernetes-validate
STS, HEADLESS, CONFIGMAP = f"{RELEASE}-shale-storage", f"{RELEASE}-shale-storage-headless", f"{RELEASE}-shale-topics"
OPERATOR, STORAGE_SA = f"{RELEASE}-shale-operator", f"{RELEASE}-shale-storage"
NODES_ROLE = f"{OPERATOR}-{NAMESPACE}-nodes"
SECRETS = {"cluster-ca": f"{RELEASE}-shale-cluster-ca", "storage": f"{RELEASE}-shale-storage-tls",
           "operator": f"{RELEASE}-shale-operator-tls", "clients-ca": f"{RELEASE}-shale-clients-ca",
           "http-token": f"{RELEASE}-shale-http-token"}
INSECURE = {"security": {"enabled": False}, "networkPolicy": {"enabled": False}}


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


def test_chart_ships_the_generated_crds():
    with helm.Chart.load(str(CHART)) as chart:
        crds = {crd["filename"]: crd["data"] for crd in chart.crds}
        assert chart.metadata["kubeVersion"] == ">=1.29.0-0"
    assert crds == {"shale/crds/topics.shale.dev.yaml": render_yaml(), "shale/crds/users.shale.dev.yaml": render_user_yaml()}
    for data in crds.values():
        for version in KUBE_VERSIONS:
            kubernetes_validate.validate(yaml.safe_load(data), version, strict=True)


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
    ({"storage": {"podDisruptionBudget": {"maxUnavailable": 0}}},
     "at '/storage/podDisruptionBudget/maxUnavailable': minimum: got 0, want 1"),
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
        *(("Secret", name) for name in SECRETS.values()),
        ("NetworkPolicy", STS), ("NetworkPolicy", OPERATOR), ("PodDisruptionBudget", STS),
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
        ("apps", "statefulsets"): [(["get", "patch"], [STS])],  # a scale-in held until drained
        ("", "nodes"): [(["get"], None)],  # zone labels (ClusterRole)
        ("shale.dev", "users"): [(["list", "patch", "watch"], None)],
        ("shale.dev", "users/status"): [(["patch"], None)],
        # each User's Secret (any name: not known ahead), and the clients CA that signs tls Users' certificates
        ("", "secrets"): [(["create", "get", "patch"], None), (["get"], [SECRETS["clients-ca"]])],
    }
    # KubeStore's calls (tests/replication/test_kube_store.py runs them under this Role): Leases only.
    assert granted["storage"] == {("coordination.k8s.io", "leases"): [
        (["create", "delete", "get", "list", "patch", "watch"], None)]}
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
    assert {p["name"]: p["containerPort"] for p in c["ports"]} == {"kafka": 9092, "http": 8080, "internal": 9093,
                                                                   "kafka-tls": 9094}
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
    assert mounts == {"/var/lib/shale": "data", "/etc/shale/topics": "topics", "/tmp": "tmp", "/etc/shale/tls": "tls",
                      "/etc/shale/clients-ca": "clients-ca", "/etc/shale/http-token": "http-token"}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["topics"]["configMap"] == {"name": CONFIGMAP, "optional": True}
    [claim] = sts["spec"]["volumeClaimTemplates"]
    assert claim["metadata"]["name"] == "data" and claim["spec"]["resources"]["requests"]["storage"] == "10Gi"
    assert "storageClassName" not in claim["spec"]
    assert sts["spec"]["selector"]["matchLabels"].items() <= sts["spec"]["template"]["metadata"]["labels"].items()


def test_storage_pods_have_a_disruption_budget(default_objects):
    """Drains evict one storage pod at a time: the budget selects exactly the StatefulSet's pods."""
    pdb = one(default_objects, "PodDisruptionBudget", STS)
    assert pdb["apiVersion"] == "policy/v1" and pdb["spec"]["maxUnavailable"] == 1
    assert pdb["spec"]["selector"] == one(default_objects, "StatefulSet")["spec"]["selector"]
    objs = objects(render({"storage": {"podDisruptionBudget": {"enabled": True, "maxUnavailable": 2}}}))
    assert one(objs, "PodDisruptionBudget", STS)["spec"]["maxUnavailable"] == 2
    assert not by_kind(objects(render({"storage": {"podDisruptionBudget": {"enabled": False}}})),
                       "PodDisruptionBudget")


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
    assert {p["name"]: p["port"] for p in headless["spec"]["ports"]} == {"kafka": 9092, "http": 8080, "internal": 9093,
                                                                         "kafka-tls": 9094}
    assert {p["name"]: p["port"] for p in client["spec"]["ports"]} == {"kafka": 9092, "kafka-tls": 9094}
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
                          "replication": {"enabled": False}}, **INSECURE}  # security on: test_security_*
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


# -- security: TLS material, listeners, the HTTP token, NetworkPolicies ------------------------------


def secret_values(objs: list[dict]) -> dict[str, dict[str, bytes]]:
    return {o["metadata"]["name"]: {k: base64.b64decode(v) for k, v in o["data"].items()} for o in by_kind(objs, "Secret")}


def storage_overrides(sts: dict) -> dict[str, str]:
    return dict(o.split("=", 1) for o in re.findall(r"--override '([^']*)'", container(sts)["args"][0]))


def test_security_off_renders_the_plaintext_chart():
    objs = objects(render(INSECURE))
    assert not by_kind(objs, "Secret") and not by_kind(objs, "NetworkPolicy")
    sts = one(objs, "StatefulSet")
    assert storage_overrides(sts) == {} and "--http-token-file" not in container(sts)["args"][0]
    assert {p["name"] for p in container(sts)["ports"]} == {"kafka", "http"}
    assert not [name for name in env_of(one(objs, "Deployment")) if name.startswith(("SHALE_ADMIN", "SHALE_CLIENTS"))]


def test_security_on_by_default_listeners_and_acls(default_objects):
    overrides = storage_overrides(one(default_objects, "StatefulSet"))
    assert overrides == {
        "listeners": "INTERNAL://0.0.0.0:9093,CLIENT://0.0.0.0:9092,CLIENTTLS://0.0.0.0:9094",
        "advertised.listeners": "INTERNAL://:9093,CLIENT://:9092,CLIENTTLS://:9094",
        "listener.security.protocol.map": "INTERNAL:SSL,CLIENT:SASL_SSL,CLIENTTLS:SSL",
        "inter.broker.listener.name": "INTERNAL",
        "ssl.keystore.location": "/etc/shale/tls/tls.crt", "ssl.keystore.key.location": "/etc/shale/tls/tls.key",
        "ssl.truststore.location": "/etc/shale/tls/ca.crt",
        "listener.name.internal.ssl.client.auth": "required", "listener.name.clienttls.ssl.client.auth": "required",
        "listener.name.clienttls.ssl.truststore.location": "/etc/shale/clients-ca/tls.crt",
        "sasl.enabled.mechanisms": "SCRAM-SHA-512", "authorizer.class.name": "shale",
        "super.users": f"User:CN={STS};User:CN={OPERATOR}",
    }
    # storage.overrides win over the chart's; super users may be added.
    objs = objects(render({"storage": {"overrides": {"sasl.enabled.mechanisms": "SCRAM-SHA-256,SCRAM-SHA-512"}},
                           "security": {"superUsers": ["User:admin"]}}))
    overrides = storage_overrides(one(objs, "StatefulSet"))
    assert overrides["sasl.enabled.mechanisms"] == "SCRAM-SHA-256,SCRAM-SHA-512"
    assert overrides["super.users"] == f"User:CN={STS};User:CN={OPERATOR};User:admin"


def test_generated_tls_material(default_objects):
    from cryptography import x509
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    values = secret_values(default_objects)
    certs = {name: x509.load_pem_x509_certificate(values[SECRETS[name]]["tls.crt"])
             for name in ("cluster-ca", "storage", "operator", "clients-ca")}
    for ca in ("cluster-ca", "clients-ca"):
        assert certs[ca].extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    assert certs["cluster-ca"].subject != certs["clients-ca"].subject
    for name, cn in (("storage", STS), ("operator", OPERATOR)):
        certs[name].verify_directly_issued_by(certs["cluster-ca"])
        assert certs[name].subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == cn
        assert values[SECRETS[name]]["ca.crt"] == values[SECRETS["cluster-ca"]]["tls.crt"]
        usages = certs[name].extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
        assert ExtendedKeyUsageOID.CLIENT_AUTH in usages and ExtendedKeyUsageOID.SERVER_AUTH in usages
    names = certs["storage"].extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert set(names.get_values_for_type(x509.DNSName)) == {
        f"*.{HEADLESS}.{NAMESPACE}.svc", f"{RELEASE}-shale.{NAMESPACE}.svc", f"{RELEASE}-shale"}
    assert re.fullmatch(rb"[A-Za-z0-9]{48}", values[SECRETS["http-token"]]["token"])


def test_given_secrets_are_mounted_and_nothing_is_generated():
    """cert-manager's Certificates write tls.crt/tls.key/ca.crt Secrets: name them, and the chart generates none."""
    given = {"storageSecret": "kafka-certs", "operatorSecret": "operator-certs", "clientsCASecret": "users-ca"}
    objs = objects(render({"security": {"tls": given, "httpTokenSecret": "control-token"}}))
    assert not by_kind(objs, "Secret")
    volumes = {v["name"]: v["secret"]["secretName"] for v in one(objs, "StatefulSet")["spec"]["template"]["spec"]["volumes"]
               if "secret" in v}
    assert volumes == {"tls": "kafka-certs", "clients-ca": "users-ca", "http-token": "control-token"}
    deployment = one(objs, "Deployment")
    assert {v["name"]: v["secret"]["secretName"] for v in deployment["spec"]["template"]["spec"]["volumes"]
            if "secret" in v} == {"operator-tls": "operator-certs"}
    assert env_of(deployment)["SHALE_CLIENTS_CA_SECRET"] == "users-ca"
    ca_rule = [r for r in one(objs, "Role", f"{OPERATOR}-storage")["rules"] if "secrets" in r["resources"]]
    assert ca_rule == [{"apiGroups": [""], "resources": ["secrets"], "resourceNames": ["users-ca"], "verbs": ["get"]}]


def test_no_secret_in_a_configmap_an_environment_variable_or_an_argument(default_objects):
    """Secrets hold the material; every other object only names files and Secrets."""
    material = [value for values in secret_values(default_objects).values() for value in values.values()]
    material += [base64.b64encode(value) for value in material]
    for obj in default_objects:
        if obj["kind"] == "Secret":
            continue
        text = yaml.safe_dump(obj).encode()
        assert not [m[:20] for m in material if m in text], f"{obj['kind']} {obj['metadata']['name']}"
        assert b"PRIVATE KEY" not in text and b"password" not in text.lower()
    for workload in by_kind(default_objects, "Deployment") + by_kind(default_objects, "StatefulSet"):
        env = container(workload).get("env") or []
        assert not [e for e in env if "secretKeyRef" in str(e.get("valueFrom"))], "a Secret in an environment variable"
        assert all(v == "" or not re.search(r"(?i)token|passw|key$", k) or v.startswith("/etc/shale/")
                   for k, v in env_of(workload).items())


def test_network_policies(default_objects):
    sts, deployment = one(default_objects, "StatefulSet"), one(default_objects, "Deployment")
    storage_pods = sts["spec"]["template"]["metadata"]["labels"]
    operator_pods = deployment["spec"]["template"]["metadata"]["labels"]
    storage = one(default_objects, "NetworkPolicy", STS)["spec"]
    assert storage["podSelector"]["matchLabels"].items() <= storage_pods.items()
    clients, internal, prometheus = storage["ingress"]
    assert clients == {"ports": [{"port": "kafka"}, {"port": "kafka-tls"}]}  # no `from`: any client
    assert internal["ports"] == [{"port": "internal"}, {"port": "http"}]
    peers = [p["podSelector"]["matchLabels"] for p in internal["from"]]
    assert len(peers) == 2 and peers[0].items() <= storage_pods.items() and peers[1].items() <= operator_pods.items()
    assert prometheus["ports"] == [{"port": "http"}]
    assert prometheus["from"] == [{"namespaceSelector": {}, "podSelector": {"matchLabels": {
        "app.kubernetes.io/name": "prometheus"}}}]
    operator = one(default_objects, "NetworkPolicy", OPERATOR)["spec"]
    assert operator["podSelector"]["matchLabels"].items() <= operator_pods.items()
    assert operator["ingress"] == [{"ports": [{"port": "metrics"}], "from": prometheus["from"]}]
    # Every named port exists on the pods it protects.
    assert {"kafka", "kafka-tls", "internal", "http"} <= {p["name"] for p in container(sts)["ports"]}
    apps = [{"namespaceSelector": {"matchLabels": {"team": "shop"}}}]
    objs = objects(render({"networkPolicy": {"kafkaClients": apps}}))
    assert one(objs, "NetworkPolicy", STS)["spec"]["ingress"][0]["from"] == apps


def test_operator_admin_settings_come_from_the_chart(default_objects):
    deployment = one(default_objects, "Deployment")
    s = operator_settings.Settings.from_env(env_of(deployment))
    fields = {"pod": f"{STS}-1", "service": HEADLESS, "namespace": NAMESPACE}
    assert s.admin_address_template.format(**fields) == f"{STS}-1.{HEADLESS}.{NAMESPACE}.svc:9093"
    mount = {m["name"]: m["mountPath"] for m in container(deployment)["volumeMounts"]}["operator-tls"]
    assert (s.admin_tls_ca_file, s.admin_tls_cert_file, s.admin_tls_key_file) == (
        f"{mount}/ca.crt", f"{mount}/tls.crt", f"{mount}/tls.key")
    assert s.clients_ca_secret == SECRETS["clients-ca"]


@pytest.mark.parametrize("values, message", [
    ({"security": {"tlsClientPort": 0}}, "at '/security/tlsClientPort': minimum: got 0, want 1"),
    ({"security": {"superUsers": ["admin"]}}, "'/security/superUsers/0'"),
    ({"security": {"tls": {"storageSecret": "Not_A_Name"}}}, "'/security/tls/storageSecret'"),
    ({"networkPolicy": {"enable": True}}, "additional properties 'enable' not allowed"),
])  # fmt: skip
def test_values_schema_refuses_bad_security_values(values, message):
    with pytest.raises(helm.HelmValuesError, match=re.escape(message)):
        render(values)


def _write_secret_volumes(objs: list[dict], workload: dict, root: Path) -> dict[str, Path]:
    """Each Secret volume of `workload` as the kubelet projects it: mount name → a directory of its files."""
    secrets = secret_values(objs)
    volumes = {v["name"]: v for v in workload["spec"]["template"]["spec"]["volumes"] if "secret" in v}
    written = {}
    for mount in container(workload)["volumeMounts"]:
        if mount["name"] in volumes:
            source = volumes[mount["name"]]["secret"]
            data = secrets[source["secretName"]]
            directory = written[mount["name"]] = root / mount["name"]
            directory.mkdir()
            for item in source.get("items") or [{"key": k, "path": k} for k in data]:
                (directory / item["path"]).write_bytes(data[item["key"]])
    return written


def test_security_storage_command_serves_sasl_ssl_mtls_and_a_guarded_http_port(tmp_path):
    """The rendered storage line with security on, run for real on the chart's generated Secrets: the operator's
    certificate administers the node on the internal listener; a SCRAM user produces over SASL_SSL on the
    client port, a tls User (its certificate signed with the clients CA, as the operator signs it) over mutual
    TLS on the tls client port; a wrong password and plaintext are refused; HTTP changes need the token."""
    import asyncio
    import ssl

    from confluent_kafka import Producer

    from shale.operator.user_admin import NodeAdmin
    from shale.operator.user_secret import ClientsCA, tls_values
    from shale.sidecar.security.acl import (
        AccessControlEntry,
        AclBinding,
        AclOperation,
        AclPermissionType,
        PatternType,
        ResourcePattern,
        ResourceType,
    )

    ports = {name: _free_port() for name in ("kafka", "http", "internal", "tls")}
    values = {"storage": {"kafkaPort": ports["kafka"], "httpPort": ports["http"], "replication": {"enabled": False}},
              "security": {"internalPort": ports["internal"], "tlsClientPort": ports["tls"]}}
    objs = objects(render(values))
    sts, deployment = one(objs, "StatefulSet"), one(objs, "Deployment")
    files = _write_secret_volumes(objs, sts, tmp_path)
    operator_files = _write_secret_volumes(objs, deployment, tmp_path)
    [line] = container(sts)["args"]
    for mount in container(sts)["volumeMounts"]:
        if mount["name"] in files:
            line = line.replace(mount["mountPath"] + "/", f"{files[mount['name']]}/")
    data, topics = tmp_path / "volume", tmp_path / "topics"
    topics.mkdir()
    (topics / "orders.yaml").write_text(yaml.safe_dump({"apiVersion": "shale.dev/v1alpha1", "kind": "Topic",
                                                        "metadata": {"name": "orders"}, "spec": {"partitions": 1}}))
    line = line.replace("/var/lib/shale/", f"{data}/").replace("/etc/shale/topics", str(topics))
    line = line.replace(f'"${{POD_NAME}}.{HEADLESS}.{NAMESPACE}.svc"', "127.0.0.1")  # names that resolve here
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"
    log_path = tmp_path / "node.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(["/bin/sh", "-c", line], env={**os.environ, "POD_NAME": f"{STS}-0", "PATH": path},
                                stdout=log, stderr=log)
    token = (files["http-token"] / "token").read_text()
    password = "alice-" + token[:8][::-1]  # as the operator would generate one
    try:
        deadline = time.monotonic() + 60
        while _get(ports["http"], "/readyz")[0] != 200:
            assert proc.poll() is None, log_path.read_text()
            assert time.monotonic() < deadline, "node not ready within 60 s"
            time.sleep(0.2)

        # The operator's side: its certificate (a super user) on the internal listener, as user_handlers does.
        operator = ssl.create_default_context(cafile=str(operator_files["operator-tls"] / "ca.crt"))
        operator.load_cert_chain(operator_files["operator-tls"] / "tls.crt", operator_files["operator-tls"] / "tls.key")
        operator.check_hostname = False  # the certificate names the pods' DNS names, not 127.0.0.1

        def allow(principal: str, op: AclOperation) -> AclBinding:
            return AclBinding(ResourcePattern(ResourceType.TOPIC, "orders", PatternType.LITERAL),
                              AccessControlEntry(principal, "*", op, AclPermissionType.ALLOW))

        async def administer() -> None:
            async with await NodeAdmin.connect(f"127.0.0.1:{ports['internal']}", operator, 10) as admin:
                await admin.upsert_credential("alice", password)
                await admin.create_acls([allow(p, op) for p in ("User:alice", "User:CN=erin")
                                         for op in (AclOperation.WRITE, AclOperation.DESCRIBE)])
        asyncio.run(administer())

        def produce(**config) -> list:
            producer = Producer({"bootstrap.servers": f"127.0.0.1:{ports['kafka']}", "message.timeout.ms": 15000,
                                 "ssl.ca.location": str(files["tls"] / "ca.crt"),
                                 "ssl.endpoint.identification.algorithm": "none", **config})
            delivered = []
            producer.produce("orders", b"v", on_delivery=lambda err, msg: delivered.append(
                err.name() if err else msg.offset()))
            producer.flush(30)
            return delivered

        scram = {"security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512", "sasl.username": "alice"}
        assert produce(**scram, **{"sasl.password": password}) == [0]
        [refused] = produce(**scram, **{"sasl.password": "wrong", "message.timeout.ms": 3000})
        assert isinstance(refused, str)  # a delivery error: nothing written with a wrong password
        ca_dir = tmp_path / "users-ca"
        ca_dir.mkdir()
        clients_ca = secret_values(objs)[SECRETS["clients-ca"]]
        erin = tls_values("erin", ClientsCA(clients_ca["tls.crt"], clients_ca["tls.key"]))
        for key, value in erin.items():
            (ca_dir / key).write_text(value)
        assert produce(**{"bootstrap.servers": f"127.0.0.1:{ports['tls']}", "security.protocol": "SSL",
                          "ssl.certificate.location": str(ca_dir / "user.crt"),
                          "ssl.key.location": str(ca_dir / "user.key")}) == [1]

        # Plaintext Kafka to the SASL_SSL port: the TLS handshake fails, no Kafka answer, the connection closed.
        metadata = request_frame(build(MetadataRequest, {"topics": None, "allow_auto_topic_creation": False}, 12))
        answer, closed = exchange(ports["kafka"], metadata)
        assert closed and b"orders" not in answer

        pause = f"http://127.0.0.1:{ports['http']}/partitions/orders/0/pause"
        for headers, status in (({}, 401), ({"Authorization": "Bearer wrong"}, 403),
                                ({"Authorization": f"Bearer {token}"}, 200)):
            try:
                with urllib.request.urlopen(urllib.request.Request(pause, method="POST", headers=headers), timeout=10) as r:
                    assert r.status == status
            except urllib.error.HTTPError as exc:
                assert exc.code == status
        assert proc.poll() is None
    finally:
        proc.terminate()
        assert proc.wait(timeout=60) == 0
    log = log_path.read_text()
    assert "authenticated as User:alice with SCRAM-SHA-512" in log
    assert token not in log and password not in log
