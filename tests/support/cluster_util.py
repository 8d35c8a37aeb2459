"""The operator's test cluster, as tests use it: API server objects, the storage processes, the operator thread.

The fixtures that build it are in tests/operator/conftest.py; this module holds what tests import.
"""

from __future__ import annotations

import json
import threading
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes
import yaml
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, ConfigResource

from shale.operator.crd import crd
from shale.operator.main import run as run_operator
from shale.operator.manifests import configmap_key
from shale.operator.settings import Settings
from support.chart_util import as_json_schema, topic_schema, unknown_fields  # noqa: F401 - the CRD's offline checks
from support.k8s_util import ApiServerThread
from support.node_util import ServeProcess, wait_for
from support.projection import ConfigMapProjection

STORAGE_NS = "storage"
CONFIGMAP = "shale-topics"
CLIENTS_CA_SECRET = "shale-clients-ca"  # signs tls Users' certificates (tests/operator/test_user_handlers.py)
GROUP, VERSION, PLURAL = "shale.dev", "v1alpha1", "topics"
STUCK_AFTER_SECONDS = 3.0
REFRESH_SECONDS = 0.5
CRD_SCHEMA = topic_schema(crd())
_CRD_VALIDATOR = jsonschema.Draft4Validator(as_json_schema(CRD_SCHEMA))


def crd_errors(obj: dict) -> list[str]:
    """What the API server's OpenAPI validation of the Topic CRD would refuse in `obj` (tests/k8s/test_crd.py)."""
    return sorted(e.message for e in _CRD_VALIDATOR.iter_errors(obj))


@dataclass
class StorageNodes:
    topics_dir: Path
    nodes: list[ServeProcess]


class OperatorThread:
    """`shale.operator.main.run` in a background thread, stopped through kopf's stop flag."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.stop_flag, self.ready_flag = threading.Event(), threading.Event()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name="shale-operator", daemon=True)

    def _run(self) -> None:
        try:
            run_operator(self.settings, stop_flag=self.stop_flag, ready_flag=self.ready_flag)
        except BaseException as exc:  # noqa: BLE001 - reported to the test thread
            self.error = exc

    def start(self) -> "OperatorThread":
        self.thread.start()
        wait_for(lambda: self.ready_flag.is_set() or self.error is not None, 30, what="the operator to start")
        if self.error:
            raise self.error
        return self

    def stop(self) -> None:
        self.stop_flag.set()
        self.thread.join(30)
        assert not self.thread.is_alive(), "the operator did not stop"
        if self.error:
            raise self.error


@dataclass
class Cluster:
    """What a test uses: the API (as kubectl would), the storage processes, the operator's endpoints."""

    api: kubernetes.client.ApiClient
    storage: StorageNodes
    operator: OperatorThread
    projection: ConfigMapProjection  # the kubelet's part: ConfigMap → the pods' topics directory
    apiserver: ApiServerThread  # or tests/apiserver's real kube-apiserver (kube_apiserver.ApiServer)
    kubeconfig: Path  # for clients that log in as a user would (the operator does too)
    namespace: str = "default"
    storage_namespace: str = STORAGE_NS  # where the topics ConfigMap and the storage pods are
    configmap: str = CONFIGMAP
    objects: kubernetes.client.CustomObjectsApi = field(init=False)
    core: kubernetes.client.CoreV1Api = field(init=False)

    def __post_init__(self) -> None:
        self.objects = kubernetes.client.CustomObjectsApi(self.api)
        self.core = kubernetes.client.CoreV1Api(self.api)

    # Topics, as `kubectl apply/patch/delete/get` would do them.
    def create_topic(self, name: str, partitions: int = 1, config: dict | None = None,
                     annotations: dict | None = None, **spec: Any) -> dict:
        body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "Topic",
                "metadata": {"name": name, "namespace": self.namespace, "annotations": annotations or {}},
                "spec": {"partitions": partitions, "config": config or {}, **spec}}
        return self.objects.create_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL, body)

    def patch_topic(self, name: str, patch: dict) -> dict:
        return self.objects.patch_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL, name, patch,
                                                           _content_type="application/merge-patch+json")

    def delete_topic(self, name: str) -> None:
        self.objects.delete_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL, name)

    def topic(self, name: str) -> dict | None:
        try:
            return self.objects.get_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL, name)
        except kubernetes.client.ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def condition(self, name: str, kind: str) -> dict:
        topic = self.topic(name) or {}
        return next((c for c in (topic.get("status") or {}).get("conditions") or () if c["type"] == kind), {})

    def wait_condition(self, name: str, kind: str, status: str, reason: str | None = None,
                       timeout: float = 20) -> dict:
        def check() -> dict | None:
            cond = self.condition(name, kind)
            ok = cond.get("status") == status and (reason is None or cond.get("reason") == reason)
            return cond if ok else None
        return wait_for(check, timeout, interval=0.1,
                        what=f"{kind}={status} ({reason}) on Topic {name}, last: {self.condition(name, kind)}")

    def events(self, name: str) -> list[tuple[str, str, str]]:
        """(type, reason, message) of the Events about Topic `name`, as `kubectl describe topic` lists them."""
        items = self.core.list_namespaced_event(self.namespace, _preload_content=False)
        return [(e.get("type"), e.get("reason"), e.get("message")) for e in json.loads(items.data)["items"]
                if (e.get("involvedObject") or {}).get("name") == name
                and (e.get("involvedObject") or {}).get("kind") == "Topic"]

    # The ConfigMap and the storage pods.
    def configmap_data(self) -> dict[str, str]:
        try:
            return dict(self.core.read_namespaced_config_map(self.configmap, self.storage_namespace).data or {})
        except kubernetes.client.ApiException as exc:
            if exc.status == 404:
                return {}
            raise

    def manifest(self, name: str) -> dict | None:
        text = self.configmap_data().get(configmap_key(self.namespace, name))
        return yaml.safe_load(text) if text is not None else None

    def node_status(self, node: int) -> dict:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.storage.nodes[node].http_port}/status", timeout=5) as r:
            return json.load(r)

    def node_post(self, node: int, path: str) -> dict:
        request = urllib.request.Request(f"http://127.0.0.1:{self.storage.nodes[node].http_port}{path}",
                                         method="POST", data=b"")
        with urllib.request.urlopen(request, timeout=30) as r:
            return json.load(r)

    def metrics(self) -> str:
        url = f"http://127.0.0.1:{self.operator.settings.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.read().decode()


def storage_objects(nodes: list[ServeProcess]) -> tuple[dict, list[dict]]:
    """The StatefulSet and its pods as the API holds them; the pods' named ports are the processes' ports."""
    labels = {"app.kubernetes.io/name": "shale", "app.kubernetes.io/component": "storage"}
    container = {"name": "shale", "image": "shale:test"}
    sts = {"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {"name": "shale", "namespace": STORAGE_NS},
           "spec": {"replicas": len(nodes), "serviceName": "shale-headless", "selector": {"matchLabels": labels},
                    "template": {"metadata": {"labels": labels}, "spec": {"containers": [container]}}}}
    pods = [{"apiVersion": "v1", "kind": "Pod",
             "metadata": {"name": f"shale-{n}", "namespace": STORAGE_NS, "labels": labels},
             "spec": {"containers": [{**container, "ports": [
                 {"name": "kafka", "containerPort": node.port}, {"name": "http", "containerPort": node.http_port}]}]},
             "status": {"phase": "Running", "podIP": "127.0.0.1"}}
            for n, node in enumerate(nodes)]
    return sts, pods


# Kafka clients (librdkafka), as applications reach the pods.
def produce(bootstrap: str, topic: str, count_per_partition: dict[int, int]) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5})
    errors = []
    for partition, count in count_per_partition.items():
        for i in range(count):
            producer.produce(topic, key=b"k%d" % i, value=b"v" * 100, partition=partition,
                             on_delivery=lambda err, msg: errors.append(err) if err else None)
    assert producer.flush(30) == 0
    assert errors == []


def describe(bootstrap: str, topic: str) -> dict[str, str]:
    """The topic's configs as DescribeConfigs answers them."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    future = admin.describe_configs([ConfigResource(ConfigResource.Type.TOPIC, topic)])
    [(_, result)] = future.items()
    return {name: entry.value for name, entry in result.result(20).items()}
