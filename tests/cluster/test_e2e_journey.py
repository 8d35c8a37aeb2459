"""`e2e/journey.sh`, what the README tells users to run against their cluster, run against the real one.

The script runs as a user would run it: with this cluster's KUBECONFIG, kubectl and helm on PATH (kubectl
1.20 from build_kubernetes.sh, matching the server; helm 4.1.4), Shale's image by its reference, and the two
things a 1.20 server needs from any chart user: the chart copy it takes (`CHART`,
apiserver_util.chart_for_1_20) and helm's flags for it (`HELM_FLAGS`). It installs its own release into
its own namespace and removes it at the end.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from kube_cluster import KubeCluster

from support.apiserver_util import FLAGS_FOR_1_20, HELM_VERSION, chart_for_1_20
from support.kube_apiserver import cached_binary, kubernetes_binary

JOURNEY = Path(__file__).resolve().parents[2] / "e2e" / "journey.sh"


def test_e2e_journey_passes_on_the_real_cluster(kube_cluster: KubeCluster, tmp_path: Path):
    path = os.pathsep.join([str(kubernetes_binary("kubectl").parent), str(cached_binary("helm", HELM_VERSION).parent),
                            os.environ["PATH"]])
    env = {**os.environ, "PATH": path, "KUBECONFIG": str(kube_cluster.kubeconfig), "IMAGE": kube_cluster.images.shale,
           "CHART": str(chart_for_1_20(tmp_path)), "HELM_FLAGS": " ".join(FLAGS_FOR_1_20), "PYTHON": sys.executable,
           "NAMESPACE": "shale-e2e"}
    result = subprocess.run(["bash", str(JOURNEY)], env=env, capture_output=True, text=True, timeout=900)
    print(result.stdout)
    assert result.returncode == 0, f"{result.stdout[-6000:]}\n{result.stderr[-4000:]}"
    assert "== journey passed" in result.stdout
    # What a 1.20 server leaves to the operator was refused by it (no CEL there), with the CRD rule's words.
    assert "refused: " in result.stdout and "cannot be decreased from 3 to 2" in result.stdout
