"""Prometheus and Alertmanager (Debian's 2.42 and 0.25) watching the real cluster, with the test as the webhook.

No Prometheus Operator runs here, so what it would do with the chart's objects is done by hand, and only
that: the storage ServiceMonitor becomes the scrape job prometheus-operator generates for it — the
Endpoints of the Services its selector picks, on its named port, labelled `namespace`, `service`, `pod`,
`endpoint` and `job` as prometheus-operator labels them, `honorLabels` where it says so. Debian builds
Prometheus without Kubernetes discovery, so the targets come from the API server through a file
(`monitor_targets`, file_sd) instead of `kubernetes_sd_configs`; and the
PrometheusRule's `spec` is the rules file, as rendered by the chart with the test's thresholds. Only the
alerts' `for:` durations are shortened (`rules_for_test`), so that an alert of a 5 m rule arrives within
seconds; their expressions, labels and annotations are the chart's.

Alertmanager routes everything to `Webhook`, an HTTP server of the test process on loopback that keeps every
notification it gets; `wait_for` returns the first that matches.
"""

from __future__ import annotations

import json
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Callable

import yaml

from support.kube_apiserver import log_tail

SCRAPE_INTERVAL = "2s"


def scrape_job(monitor: dict[str, Any], targets_file: Path) -> dict[str, Any]:
    """The scrape job prometheus-operator generates for `monitor` (its first endpoint), with its targets read
    from `targets_file` (`monitor_targets`): Debian's Prometheus is built without Kubernetes discovery."""
    endpoint = monitor["spec"]["endpoints"][0]
    return {
        "job_name": f"serviceMonitor/{monitor['metadata']['namespace']}/{monitor['metadata']['name']}/0",
        "honor_labels": bool(endpoint.get("honorLabels", False)),
        "metrics_path": endpoint.get("path", "/metrics"),
        "scrape_interval": SCRAPE_INTERVAL,
        "file_sd_configs": [{"files": [str(targets_file)], "refresh_interval": "1s"}],
    }


def monitor_targets(monitor: dict[str, Any], services: list[dict[str, Any]],
                    endpoints: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """What prometheus-operator's endpoints discovery and relabelling make of `monitor` (pure): one target per
    address of the Endpoints of each Service its selector and namespaces pick, on the named port, labelled
    namespace, service, pod, endpoint and job as prometheus-operator labels them. File-SD entries."""
    spec, port_name = monitor["spec"], monitor["spec"]["endpoints"][0]["port"]
    namespaces = set(spec["namespaceSelector"]["matchNames"])
    chosen = {(s["metadata"]["namespace"], s["metadata"]["name"]) for s in services
              if s["metadata"]["namespace"] in namespaces
              and spec["selector"]["matchLabels"].items() <= (s["metadata"].get("labels") or {}).items()}
    targets = []
    for ep in endpoints:
        key = (ep["metadata"]["namespace"], ep["metadata"]["name"])
        if key not in chosen:
            continue
        for subset in ep.get("subsets") or ():
            port = next((p["port"] for p in subset.get("ports") or () if p.get("name") == port_name), None)
            if port is None:
                continue
            for address in (subset.get("addresses") or []) + (subset.get("notReadyAddresses") or []):
                pod = (address.get("targetRef") or {}).get("name", "")
                targets.append({"targets": [f"{address['ip']}:{port}"], "labels": {
                    "namespace": key[0], "service": key[1], "pod": pod, "endpoint": port_name, "job": key[1]}})
    return sorted(targets, key=lambda t: t["labels"]["pod"])


def rules_for_test(rules: dict[str, Any], for_duration: str = "4s") -> dict[str, Any]:
    """The chart's rule groups with every `for:` shortened to `for_duration` (nothing else changed)."""
    groups = []
    for group in rules["groups"]:
        groups.append({**group, "interval": SCRAPE_INTERVAL,
                       "rules": [{**rule, "for": for_duration} if "for" in rule else rule for rule in group["rules"]]})
    return {"groups": groups}


@dataclass
class Notification:
    status: str  # firing or resolved
    labels: dict[str, str]
    annotations: dict[str, str]
    received: float


class Webhook:
    """Alertmanager's webhook receiver: every alert of every notification, with the time it arrived."""

    def __init__(self) -> None:
        self.notifications: list[Notification] = []
        self.lock = threading.Lock()
        webhook = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with webhook.lock:
                    for alert in body["alerts"]:
                        webhook.notifications.append(Notification(alert["status"], alert["labels"],
                                                                  alert["annotations"], time.monotonic()))
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, name="alert-webhook", daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/"

    def wait_for(self, match: Callable[[Notification], bool], what: str, timeout: float = 90) -> Notification:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.lock:
                found = next((n for n in self.notifications if match(n)), None)
            if found is not None:
                return found
            time.sleep(0.2)
        with self.lock:
            seen = [(n.status, n.labels.get("alertname"), n.labels) for n in self.notifications]
        raise AssertionError(f"no {what} at the webhook after {timeout:.0f}s; received: {seen}")

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@dataclass
class Monitoring:
    """Prometheus scraping `jobs` with `rules`, and Alertmanager sending everything to a `Webhook`."""

    directory: Path
    jobs: list[dict[str, Any]]
    rules: dict[str, Any]
    ports: tuple[int, int, int]  # Prometheus, Alertmanager, Alertmanager's (unused) cluster port
    webhook: Webhook = field(default_factory=Webhook)
    procs: dict[str, subprocess.Popen] = field(default_factory=dict)

    @property
    def prometheus_url(self) -> str:
        return f"http://127.0.0.1:{self.ports[0]}"

    def start(self) -> "Monitoring":
        d = self.directory
        d.mkdir(parents=True, exist_ok=True)
        prometheus, alertmanager, _ = self.ports
        (d / "alertmanager.yml").write_text(yaml.safe_dump({
            "route": {"receiver": "test", "group_by": ["alertname", "pod", "topic", "partition"],
                      "group_wait": "1s", "group_interval": "1s", "repeat_interval": "1h"},
            "receivers": [{"name": "test", "webhook_configs": [{"url": self.webhook.url, "send_resolved": True}]}]}))
        (d / "rules.yml").write_text(yaml.safe_dump(self.rules, sort_keys=False))
        (d / "prometheus.yml").write_text(yaml.safe_dump({
            "global": {"scrape_interval": SCRAPE_INTERVAL, "evaluation_interval": SCRAPE_INTERVAL},
            "rule_files": [str(d / "rules.yml")],
            "alerting": {"alertmanagers": [{"static_configs": [{"targets": [f"127.0.0.1:{alertmanager}"]}]}]},
            "scrape_configs": self.jobs}, sort_keys=False))
        self._spawn("alertmanager", [
            "prometheus-alertmanager", f"--config.file={d / 'alertmanager.yml'}", f"--storage.path={d / 'am-data'}",
            f"--web.listen-address=127.0.0.1:{alertmanager}", "--cluster.listen-address="])
        self._spawn("prometheus", [
            "prometheus", f"--config.file={d / 'prometheus.yml'}", f"--storage.tsdb.path={d / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{prometheus}", "--web.enable-lifecycle"])
        return self

    def _spawn(self, name: str, argv: list[str]) -> None:
        with open(self.directory / f"{name}.log", "ab") as log:
            self.procs[name] = subprocess.Popen(["setpriv", "--pdeathsig", "KILL", "--", *argv], stdout=log,
                                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)

    def query(self, expr: str) -> list[dict[str, Any]]:
        url = f"{self.prometheus_url}/api/v1/query?{urllib.parse.urlencode({'query': expr})}"
        with urllib.request.urlopen(url, timeout=10) as response:
            return json.loads(response.read())["data"]["result"]

    def wait_for_targets(self, count: int, timeout: float = 60) -> None:
        """Until `count` targets are up (what discovery through the API server found, scraped)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for name, proc in self.procs.items():
                if proc.poll() is not None:
                    raise AssertionError(f"{name} exited with {proc.returncode}:\n{self.log(name)}")
            try:
                if len(self.query("up == 1")) >= count:
                    return
            except OSError:
                pass
            time.sleep(0.5)
        raise AssertionError(f"fewer than {count} targets up after {timeout:.0f}s:\n{self.log('prometheus')}")

    def log(self, name: str) -> str:
        return log_tail(self.directory / f"{name}.log")

    def stop(self) -> None:
        for proc in self.procs.values():
            proc.terminate()
        for proc in self.procs.values():
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
        self.webhook.stop()
