"""The test cluster's volumes behave as what they stand for (kube_cluster.py, `_storage`): a `shared` volume follows
its claim to any node, as network storage does; a `local` one keeps its pod on its node; a `small` one is a
filesystem of its own that fills up."""

from __future__ import annotations

import json
import time
from typing import Any

from kube_cluster import SMALL_VOLUME_MIB, KubeCluster

NAMESPACE = "volumes"


def _pod(name: str, claim: str, node: str | None, command: str, image: str) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "securityContext": {"fsGroup": 10001},  # the image's user writes to the volume, as the chart's pods do
        "containers": [{"name": "c", "image": image, "imagePullPolicy": "Never", "command": ["sh", "-c", command],
                        "volumeMounts": [{"name": "v", "mountPath": "/v"}]}],
        "volumes": [{"name": "v", "persistentVolumeClaim": {"claimName": claim}}]}
    if node is not None:
        spec["nodeSelector"] = {"kubernetes.io/hostname": node}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": NAMESPACE}, "spec": spec}


def _claim(name: str, storage_class: str, size: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": name, "namespace": NAMESPACE},
            "spec": {"storageClassName": storage_class, "accessModes": ["ReadWriteOnce"],
                     "resources": {"requests": {"storage": size}}}}


def _run(cluster: KubeCluster, pod: dict[str, Any], timeout: float = 120) -> tuple[str, str]:
    """Run the pod to its end: (the node it ran on, its output)."""
    name = pod["metadata"]["name"]
    cluster.apply([pod])
    deadline = time.monotonic() + timeout
    while True:
        found = json.loads(cluster.kubectl("-n", NAMESPACE, "get", "pod", name, "-o", "json").stdout)
        if found["status"].get("phase") in ("Succeeded", "Failed"):
            break
        assert time.monotonic() < deadline, f"pod {name} did not finish: {found['status']}"
        time.sleep(0.5)
    logs = cluster.kubectl("-n", NAMESPACE, "logs", name).stdout
    assert found["status"]["phase"] == "Succeeded", logs
    cluster.kubectl("-n", NAMESPACE, "delete", "pod", name, "--wait=true")
    return found["spec"]["nodeName"], logs


def test_a_shared_volume_follows_its_claim_to_another_node_and_a_small_one_fills_up(kube_cluster: KubeCluster):
    cluster, image = kube_cluster, kube_cluster.images.shale
    cluster.kubectl("create", "namespace", NAMESPACE)
    try:
        cluster.apply([_claim("moved", "shared", "1Gi"), _claim("tiny", "small", f"{SMALL_VOLUME_MIB}Mi")])
        first, _ = _run(cluster, _pod("writer", "moved", "node-0", "echo written-on-node-0 > /v/data", image))
        second, read = _run(cluster, _pod("reader", "moved", "node-2", "cat /v/data", image))
        assert (first, second, read) == ("node-0", "node-2", "written-on-node-0\n")

        # A tmpfs of SMALL_VOLUME_MIB: writing more than it holds fails with ENOSPC, in the pod.
        # head's error goes to a file and is printed after "refused", so the log's order does not hang on how the
        # container runtime interleaves stdout and stderr.
        _, filled = _run(cluster, _pod("filler", "tiny", None, f"df -m /v | tail -1; head -c {SMALL_VOLUME_MIB + 1}M "
                                       "/dev/zero > /v/fill 2>/tmp/err || { echo refused; cat /tmp/err; }", image))
        lines = filled.splitlines()
        size = int(lines[0].split()[1])
        assert size == SMALL_VOLUME_MIB and lines[1] == "refused" and "No space left on device" in lines[2], filled
    finally:
        cluster.kubectl("delete", "namespace", NAMESPACE, "--wait=true", timeout=180)
