"""The chart installed on the real cluster with helm, and what the journeys do with it: wait for pods, apply
Topics, run the Kafka client in a pod, read what the nodes and the operator say when something fails.

The chart is the real one (helm/shale), in the copy a 1.20 server takes (apiserver_util.chart_for_1_20: the
kubeVersion floor, the CRDs without CEL rules, PodDisruptionBudget under policy/v1beta1; nothing else
differs), with Shale's image from image.py (`imagePullPolicy: Never`: the image is in each node's
containerd and its registry, shale.local, resolves nowhere).
"""

from __future__ import annotations

import json
import subprocess
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from kube_cluster import KubeCluster

from shale.operator.topic_check import TopicView
from support.apiserver_util import FLAGS_FOR_1_20, HELM_VERSION, chart_for_1_20
from support.kube_apiserver import cached_binary

POD_CLIENT = Path(__file__).with_name("pod_client.py")
CLIENT_POD = "kafka-client"


@dataclass
class Release:
    """`helm install` of the chart as `name` into `namespace`; `values` as --set-json pairs."""

    cluster: KubeCluster
    workdir: Path
    namespace: str = "shale"
    name: str = "shale"
    values: dict[str, Any] = field(default_factory=dict)

    @property
    def fullname(self) -> str:
        return self.name if "shale" in self.name else f"{self.name}-shale"

    @property
    def bootstrap(self) -> str:
        """The chart's client Service, as a pod in another namespace reaches it."""
        return f"{self.fullname}.{self.namespace}.svc:9092"

    def pod_address(self, ordinal: int) -> str:
        """A storage pod by the DNS name it advertises."""
        return f"{self.fullname}-storage-{ordinal}.{self.fullname}-storage-headless.{self.namespace}.svc:9092"

    def helm(self, *args: str, timeout: float = 300) -> str:
        helm = cached_binary("helm", HELM_VERSION)
        if not helm.exists():
            raise AssertionError(f"{helm} missing: run tests/apiserver/fetch_helm.sh (`make test` does)")
        result = subprocess.run([str(helm), "--kubeconfig", str(self.cluster.kubeconfig), "-n", self.namespace, *args],
                                capture_output=True, text=True, timeout=timeout)
        if result.returncode != 0:
            raise AssertionError(f"helm {' '.join(args)} exited {result.returncode}: {result.stderr}")
        return result.stdout

    def install(self) -> "Release":
        chart = chart_for_1_20(self.workdir) if not (self.workdir / "shale").exists() else self.workdir / "shale"
        repository, _, tag = self.cluster.images.shale.rpartition(":")
        registry, _, repository = repository.partition("/")
        values = {"image": {"registry": registry, "repository": repository, "tag": tag, "pullPolicy": "Never"},
                  **self.values}
        (self.workdir / "values.yaml").write_text(yaml.safe_dump(values))
        self.helm("install", self.name, str(chart), "--create-namespace", "-f", str(self.workdir / "values.yaml"),
                  *FLAGS_FOR_1_20)
        return self

    def kubectl(self, *args: str, **kw) -> subprocess.CompletedProcess:
        return self.cluster.kubectl("-n", self.namespace, *args, **kw)

    def pods(self, component: str) -> list[dict[str, Any]]:
        selector = f"app.kubernetes.io/instance={self.name},app.kubernetes.io/component={component}"
        return json.loads(self.kubectl("get", "pods", "-l", selector, "-o", "json").stdout)["items"]

    def wait_ready(self, storage: int, timeout: float = 240) -> float:
        """Until the operator's pod and `storage` storage pods are Ready; the seconds it took."""
        start = time.monotonic()
        while time.monotonic() - start < timeout:
            operator, nodes = self.pods("operator"), self.pods("storage")
            if _all_ready(operator, 1) and _all_ready(nodes, storage):
                return time.monotonic() - start
            time.sleep(1)
        raise AssertionError(f"pods not Ready after {timeout:.0f}s:\n{self.diagnose()}")

    def apply(self, obj: dict[str, Any]) -> None:
        self.kubectl("apply", "-f", "-", input=yaml.safe_dump(obj))

    def topic(self, name: str) -> dict[str, Any]:
        return json.loads(self.kubectl("get", "topic", name, "-o", "json").stdout)

    def wait_topic(self, name: str, min_end_offsets: int = 0, timeout: float = 120) -> TopicView:
        """Until the Topic is Ready for its generation with at least `min_end_offsets` records (topic_check's rule)."""
        deadline = time.monotonic() + timeout
        while True:
            view = TopicView.of(self.topic(name))
            why = view.not_ready_because(min_end_offsets)
            if why is None:
                return view
            if time.monotonic() > deadline:
                raise AssertionError(f"{why} after {timeout:.0f}s\n{view.summary()}\n{self.diagnose()}")
            time.sleep(1)

    def client_pod(self) -> str:
        """A pod of the client image that sleeps, for `client` to exec into (created once per namespace)."""
        if self.kubectl("get", "pod", CLIENT_POD, check=False).returncode != 0:  # once per namespace
            self.apply({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": CLIENT_POD},
                        "spec": {"containers": [{"name": "client", "image": self.cluster.images.client,
                                                 "imagePullPolicy": "Never", "command": ["sleep", "infinity"],
                                                 "securityContext": {"runAsUser": 10001, "runAsNonRoot": True}}],
                                 "terminationGracePeriodSeconds": 0}})
        # also after a node restart, which restarts its container
        self.kubectl("wait", "--for=condition=Ready", f"pod/{CLIENT_POD}", "--timeout=120s", timeout=130)
        return CLIENT_POD

    def client(self, command: str, *args: str, timeout: float = 300) -> dict[str, Any]:
        """pod_client.py COMMAND ARGS in the client pod; its JSON answer."""
        pod = self.client_pod()
        result = self.kubectl("exec", "-i", pod, "--", "python", "-", command, *args, check=False,
                              input=POD_CLIENT.read_text(), timeout=timeout)
        if result.returncode != 0:
            raise AssertionError(f"pod_client {command} {' '.join(args)} exited {result.returncode}:\n"
                                 f"{result.stderr[-3000:]}\n{self.diagnose()}")
        return json.loads(result.stdout)

    def diagnose(self) -> str:
        """Objects, events, and the operator's and nodes' log tails: what a failed journey prints."""
        parts = [self.kubectl("get", "all,topics,pvc", "-o", "wide", check=False).stdout,
                 self.kubectl("get", "events", "--sort-by=.lastTimestamp", check=False).stdout[-4000:]]
        for component in ("operator", "storage"):
            for pod in self.pods(component):
                name = pod["metadata"]["name"]
                logs = self.kubectl("logs", name, "--tail=40", check=False)
                parts.append(f"--- {name} ---\n{logs.stdout or logs.stderr}")
                if component == "storage":  # what the kubelet has projected, and what the node says it serves
                    parts.append(self.kubectl("exec", name, "-c", "shale", "--", "ls", "-la", "/etc/shale/topics/",
                                              check=False).stdout)
                    parts.append(self._status_text(pod))
        for node in self.cluster.nodes:  # the kubelets' word on the projections
            log = (self.cluster.directory / "logs" / f"{node.name}-kubelet.log").read_text(errors="replace")
            lines = [line for line in log.splitlines() if "configmap" in line.lower()]
            parts.append(f"--- {node.name}-kubelet, lines about ConfigMaps ---\n" + "\n".join(lines[-15:]))
        return "\n".join(parts)

    def _status_text(self, pod: dict[str, Any]) -> str:
        """What the storage pod's /status (from its pod IP: the host reaches pods over the bridge) says of its
        manifests, its session and each replica of the journeys' topics; or why it could not be read."""
        try:
            with urllib.request.urlopen(f"http://{pod['status']['podIP']}:8080/status", timeout=10) as response:
                status = json.load(response)
        except (OSError, KeyError, ValueError) as exc:
            return f"/status: {exc!r}"
        replicas = {f"{topic}-{p['partition']}": p.get("replica") for topic, t in status.get("topics", {}).items()
                    if not topic.startswith("__") for p in t.get("partitions", ())}
        return json.dumps({"manifests": status.get("manifests"), "errors": status.get("errors"),
                           "session_valid": status.get("session_valid"), "replicas": replicas})


def _all_ready(pods: list[dict[str, Any]], count: int) -> bool:
    ready = [p for p in pods if p["metadata"].get("deletionTimestamp") is None and
             any(c["type"] == "Ready" and c["status"] == "True" for c in p.get("status", {}).get("conditions", ()))]
    return len(ready) == count

