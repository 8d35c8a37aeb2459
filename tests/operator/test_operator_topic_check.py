"""`python -m shale.operator.topic_check`: the pykube-ng Topic reader, against kmock's API server and the operator."""

from __future__ import annotations

import os
import subprocess
import sys

import kubernetes
import pykube
import pytest

from shale.operator.topic_check import TopicNotReady, TopicView, kube_config, main, wait
from support.cluster_util import GROUP, PLURAL, VERSION, Cluster, produce
from support.k8s_util import ApiServerThread


@pytest.fixture
def api_server(tmp_path):
    server = ApiServerThread().start()
    yield server, server.write_kubeconfig(tmp_path / "kubeconfig")
    server.stop()


def ready(generation: int, status: str = "True", reason: str = "PartitionsServed", message: str = "") -> dict:
    return {"observedGeneration": generation, "conditions": [
        {"type": "Ready", "status": status, "reason": reason, "message": message, "observedGeneration": generation}],
        "partitions": [{"partition": 0, "pod": "shale-0", "logStartOffset": 0, "logEndOffset": 5},
                       {"partition": 1, "pod": "shale-1", "logStartOffset": 0, "logEndOffset": 7}]}


def test_ready_counts_only_for_the_current_generation(api_server):
    server, kubeconfig = api_server
    objects = kubernetes.client.CustomObjectsApi(server.client())  # the operator's side: writes the status
    api = pykube.HTTPClient(kube_config(str(kubeconfig)))  # the reader's side: pykube-ng, from the kubeconfig

    def set_status(status: dict) -> None:
        objects.patch_namespaced_custom_object_status(GROUP, VERSION, "apps", PLURAL, "prices", {"status": status},
                                                      _content_type="application/merge-patch+json")

    with pytest.raises(TopicNotReady, match="Topic apps/prices not Ready after 0 s: it does not exist"):
        wait(api, "apps", "prices", timeout=0)
    objects.create_namespaced_custom_object(GROUP, VERSION, "apps", PLURAL, {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "Topic", "metadata": {"name": "prices"},
        "spec": {"partitions": 2, "config": {"retention.ms": "60000"}}})
    with pytest.raises(TopicNotReady, match="the operator has not reported a Ready condition yet"):
        wait(api, "apps", "prices", timeout=0)
    set_status(ready(1, "False", "InvalidConfig", "spec.config.retention.ms: bad"))
    with pytest.raises(TopicNotReady, match=r"Ready=False \(InvalidConfig\): spec.config.retention.ms: bad"):
        wait(api, "apps", "prices", timeout=0)

    set_status(ready(1))
    view = wait(api, "apps", "prices", timeout=0)
    assert (view.ref, view.generation, view.end_offsets) == ("apps/prices", 1, 12)
    with pytest.raises(TopicNotReady, match="end offsets add up to 12, waiting for 13"):
        wait(api, "apps", "prices", timeout=0, min_end_offsets=13)

    objects.patch_namespaced_custom_object(GROUP, VERSION, "apps", PLURAL, "prices",
                                           {"spec": {"config": {"retention.ms": "120000"}}},
                                           _content_type="application/merge-patch+json")
    # The Ready=True still there was computed for the old spec: not Ready until the operator catches up.
    with pytest.raises(TopicNotReady, match="Ready=True is for generation 1, the spec is at generation 2"):
        wait(api, "apps", "prices", timeout=0)
    set_status(ready(2))
    assert wait(api, "apps", "prices", timeout=0).generation == 2


def test_a_replicated_partition_counts_its_leaders_end_offset_once():
    status = ready(1)
    status["partitions"] = [
        {"partition": 0, "pod": "shale-0", "role": "leader", "logEndOffset": 5},
        {"partition": 0, "pod": "shale-1", "role": "follower", "logEndOffset": 4},
        {"partition": 0, "pod": "shale-2", "role": "offline", "logEndOffset": 2},
        {"partition": 1, "pod": "shale-1", "role": "leader", "logEndOffset": 7}]
    view = TopicView.of({"metadata": {"namespace": "apps", "name": "prices", "generation": 1}, "status": status})
    assert view.end_offsets == 12
    assert view.not_ready_because(min_end_offsets=13) == "the partitions' end offsets add up to 12, waiting for 13"


def test_the_command_reads_the_kubeconfig_and_exits_by_the_topics_state(api_server, tmp_path):
    server, kubeconfig = api_server
    objects = kubernetes.client.CustomObjectsApi(server.client())
    objects.create_namespaced_custom_object(GROUP, VERSION, "apps", PLURAL, {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "Topic", "metadata": {"name": "prices"}, "spec": {"partitions": 2}})
    command = [sys.executable, "-m", "shale.operator.topic_check", "prices", "--timeout", "0"]
    env = {**os.environ, "KUBECONFIG": f"{kubeconfig}{os.pathsep}{tmp_path / 'second'}"}  # the first file counts
    missing = subprocess.run([*command, "-n", "other"], env=env, capture_output=True, text=True, timeout=60)
    assert missing.returncode == 1
    assert missing.stderr == "Topic other/prices not Ready after 0 s: it does not exist\n"

    objects.patch_namespaced_custom_object_status(GROUP, VERSION, "apps", PLURAL, "prices", {"status": ready(1)},
                                                  _content_type="application/merge-patch+json")
    found = subprocess.run([*command, "-n", "apps"], env=env, capture_output=True, text=True, timeout=60)
    assert found.returncode == 0, found.stderr
    assert found.stdout.splitlines()[1:] == [
        "  Ready=True (PartitionsServed): ",
        "  partition  pod      logStartOffset  logEndOffset  sizeBytes  cleaningState  dirtyRatio",
        "  0          shale-0  0               5             -          -              -",
        "  1          shale-1  0               7             -          -              -"]


def test_it_waits_for_what_the_operator_reports_from_real_pods(cluster: Cluster, capsys):
    cluster.create_topic("orders", 2, {"cleanup.policy": "compact"})
    assert main(["orders", "-n", "default", "--timeout", "30", "--interval", "0.2"]) == 0  # $KUBECONFIG: kmock
    out = capsys.readouterr().out
    assert out.startswith("Topic default/orders (generation 1, observed 1): Kafka topic orders, ")
    assert "Ready=True (PartitionsServed): 2 partition(s) served by shale-0, shale-1" in out

    produce(cluster.storage.nodes[0].bootstrap, "orders", {0: 4, 1: 6})
    assert main(["orders", "--timeout", "30", "--interval", "0.2", "--min-end-offsets", "10"]) == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines()[-2:]]
    assert [(r[0], r[1], r[2], r[3]) for r in rows] == [("0", "shale-0", "0", "4"), ("1", "shale-1", "0", "6")]

    # A refused spec fails at once, however long the timeout: only a change of the spec can fix it.
    cluster.create_topic("broken", 1, {"segment.bytes": "1"})
    assert main(["broken", "--timeout", "600", "--interval", "0.2"]) == 1
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith("Topic default/broken cannot become Ready until its spec changes: "
                             "Ready=False (InvalidConfig): spec.config.segment.bytes: ")
    assert err[1] == "Topic default/broken (generation 1, observed 1)"  # then its conditions
