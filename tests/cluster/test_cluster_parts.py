"""The real cluster's pure parts, without a cluster: the image config read from the Dockerfile, the DNS records
fed to dnsmasq, the network plan's addresses and CNI routes."""

from __future__ import annotations

import ipaddress

import network
import pytest
from dns_feed import hosts_file, records

from support.image import DOCKERFILE, dockerfile_config


def test_image_config_is_the_dockerfiles_final_stage():
    config = dockerfile_config(DOCKERFILE.read_text())
    assert config.user == "10001:10001"
    assert config.entrypoint == ["shale"] and config.cmd == ["--help"]
    assert config.env == {"PYTHONDONTWRITEBYTECODE": "1", "PYTHONUNBUFFERED": "1"}
    assert config.exposed_ports == [f"{p}/tcp" for p in (9092, 9093, 9094, 8080, 8081, 8082)]
    assert config.useradd.startswith("useradd --uid 10001 --user-group ")


def test_image_config_refuses_what_it_would_leave_out():
    text = "FROM a AS b\nRUN x\nFROM c\nRUN useradd --uid 1 u\nHEALTHCHECK CMD true\n"
    with pytest.raises(ValueError, match="HEALTHCHECK"):
        dockerfile_config(text)
    with pytest.raises(ValueError, match="useradd"):
        dockerfile_config("FROM c\nUSER 1\n")


def test_image_config_joins_continuations_and_reads_only_the_last_stage():
    text = ("ARG BASE=x\nFROM ${BASE} AS build\nUSER 0\nENV A=1\nFROM ${BASE}\n# a comment\n"
            "RUN useradd --uid 7 u \\\n    && true\nENV B=2 \\\n    C=\"three words\"\nUSER 7\nCMD run me\n")
    config = dockerfile_config(text)
    assert (config.user, config.env, config.cmd) == ("7", {"B": "2", "C": "three words"}, ["/bin/sh", "-c", "run me"])
    assert config.useradd == "useradd --uid 7 u"


def _service(name, ns, cluster_ip):
    return {"metadata": {"name": name, "namespace": ns}, "spec": {"clusterIP": cluster_ip}}


def test_dns_records_of_services_headless_services_and_statefulset_pods():
    services = [_service("kubernetes", "default", "198.18.128.1"), _service("shale", "shale", "198.18.128.7"),
                _service("shale-storage-headless", "shale", "None")]
    endpoints = [
        {"metadata": {"name": "shale-storage-headless", "namespace": "shale"},
         "subsets": [{"addresses": [{"ip": "198.18.0.5", "hostname": "shale-storage-0"}, {"ip": "198.18.0.6"}],
                      "notReadyAddresses": [{"ip": "198.18.0.9", "hostname": "shale-storage-2"}]}]},
        # the Endpoints of a Service with a ClusterIP: its pods get no names of their own
        {"metadata": {"name": "shale", "namespace": "shale"},
         "subsets": [{"addresses": [{"ip": "198.18.0.5", "hostname": "x"}]}]}]
    assert records(services, endpoints) == sorted([
        ("198.18.128.1", "kubernetes.default.svc.cluster.local"),
        ("198.18.128.7", "shale.shale.svc.cluster.local"),
        ("198.18.0.5", "shale-storage-headless.shale.svc.cluster.local"),
        ("198.18.0.6", "shale-storage-headless.shale.svc.cluster.local"),
        ("198.18.0.5", "shale-storage-0.shale-storage-headless.shale.svc.cluster.local")])
    assert hosts_file([("198.18.0.5", "a.b")]) == "198.18.0.5 a.b\n"


def test_network_plan_stays_inside_the_benchmark_range():
    for index in range(3):
        assert ipaddress.ip_address(network.node_ip(index)) in network.NODE_IPS
        assert network.node_subnet(index).subnet_of(network.POD_CIDR)
    for part in (network.POD_CIDR, network.SERVICE_CIDR, network.NODE_IPS):
        assert part.subnet_of(network.RANGE)
    assert not network.POD_CIDR.overlaps(network.SERVICE_CIDR)


def test_pods_get_routes_to_the_cluster_only_and_no_masquerade():
    config = network.cni_config(1, ipam_dir=network.Path("/nonexistent"))
    bridge = config["plugins"][0]
    assert bridge["bridge"] == network.BRIDGE and bridge["ipMasq"] is False and bridge["isDefaultGateway"] is False
    routes = [ipaddress.ip_network(r["dst"]) for r in bridge["ipam"]["routes"]]
    assert all(r.subnet_of(network.RANGE) for r in routes)  # no default route, nothing outside the range
    assert bridge["ipam"]["ranges"] == [[{"subnet": "198.18.1.0/24", "gateway": "198.18.1.1"}]]


def test_servicemonitor_targets_as_prometheus_operator_labels_them():
    from monitoring import monitor_targets, rules_for_test

    from support.chart_util import objects, render
    rendered = objects(render({"metrics": {"serviceMonitor": {"enabled": True}, "prometheusRule": {"enabled": True}}},
                              namespace="ns"))
    monitor = next(o for o in rendered if o["kind"] == "ServiceMonitor"
                   and o["metadata"]["labels"]["app.kubernetes.io/component"] == "storage")
    services = [o for o in rendered if o["kind"] == "Service"]
    headless = next(s["metadata"]["name"] for s in services if s["spec"].get("clusterIP") == "None")
    endpoints = [{"metadata": {"namespace": "ns", "name": s["metadata"]["name"]}, "subsets": [{
        "ports": [{"name": "kafka", "port": 9092}, {"name": "http", "port": 8080}],
        "addresses": [{"ip": "198.18.0.7", "targetRef": {"kind": "Pod", "name": "shale-storage-1"}}],
        "notReadyAddresses": [{"ip": "198.18.0.6", "targetRef": {"kind": "Pod", "name": "shale-storage-0"}}]}]}
        for s in services]
    # only the headless Service carries the ServiceMonitor's selector; a not-ready pod is scraped too
    assert monitor_targets(monitor, services, endpoints) == [
        {"targets": [f"198.18.0.{6 + i}:8080"], "labels": {"namespace": "ns", "service": headless,
                                                         "pod": f"shale-storage-{i}", "endpoint": "http", "job": headless}}
        for i in range(2)]
    rules = next(o for o in rendered if o["kind"] == "PrometheusRule")["spec"]
    shortened = rules_for_test(rules, "4s")
    for before, after in zip(rules["groups"][0]["rules"], shortened["groups"][0]["rules"]):
        assert {**before, "for": "4s"} == after  # only the duration changes
