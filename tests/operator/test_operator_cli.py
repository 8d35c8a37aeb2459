"""`shale operator` as a process: settings from variables and flags, kubeconfig login, probes, SIGTERM."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.error
import urllib.request

import kubernetes

from support.k8s_util import ApiServerThread
from support.node_util import free_port, wait_for


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return r.status, r.read().decode()
    except (urllib.error.URLError, ConnectionError):
        return 0, ""


def test_the_command_reconciles_serves_its_probes_and_stops_on_sigterm(tmp_path):
    server = ApiServerThread().start()
    liveness, metrics = free_port(), free_port()
    env = {**os.environ, "KUBECONFIG": str(server.write_kubeconfig(tmp_path / "kubeconfig")),
           "SHALE_STORAGE_NAMESPACE": "storage", "SHALE_STATUS_INTERVAL_SECONDS": "0.5",
           "SHALE_LIVENESS_ENDPOINT": f"http://127.0.0.1:{liveness}/healthz"}
    log = open(tmp_path / "operator.log", "wb")
    proc = subprocess.Popen([sys.executable, "-m", "shale.sidecar.cli", "operator", "--metrics-host", "127.0.0.1",
                             "--metrics-port", str(metrics), "--statefulset", "missing"],
                            env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        status, body = wait_for(lambda: (r := get(f"http://127.0.0.1:{liveness}/healthz"))[0] == 200 and r, 30,
                                what="the liveness probe")
        assert json.loads(body) == {"topics": 0}  # the probe handler: how many Topics this operator tracks

        topics = kubernetes.client.CustomObjectsApi(server.client())
        for name, config in (("valid", {}), ("invalid", {"segment.bytes": "1"})):
            topics.create_namespaced_custom_object("shale.dev", "v1alpha1", "apps", "topics", {
                "apiVersion": "shale.dev/v1alpha1", "kind": "Topic", "metadata": {"name": name},
                "spec": {"partitions": 1, "config": config}})

        def ready(name: str) -> dict:
            obj = topics.get_namespaced_custom_object("shale.dev", "v1alpha1", "apps", "topics", name)
            return next((c for c in (obj.get("status") or {}).get("conditions", []) if c["type"] == "Ready"), {})

        wait_for(lambda: ready("invalid").get("reason") == "InvalidConfig", 20, what="InvalidConfig")
        assert "spec.config.segment.bytes" in ready("invalid")["message"]
        wait_for(lambda: ready("valid").get("reason") == "StorageNotReady", 20, what="StorageNotReady")
        assert ready("valid")["message"] == "storage StatefulSet storage/missing not found"
        text = get(f"http://127.0.0.1:{metrics}/metrics")[1]
        assert 'shale_topic_ready{namespace="apps",topic="invalid"} 0.0' in text
        assert 'shale_topic_ready{namespace="apps",topic="valid"} 0.0' in text

        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        log.close()
        server.stop()
    output = (tmp_path / "operator.log").read_text()
    assert "managing Topics in all namespaces; storage: StatefulSet storage/missing" in output
