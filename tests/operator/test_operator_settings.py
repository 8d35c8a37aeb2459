"""`shale operator` settings: defaults, SHALE_* variables, flags over variables."""

from __future__ import annotations

import argparse

import pytest

from shale.operator.settings import Settings, add_arguments, from_args


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(argv)


def test_defaults_point_at_the_chart_layout():
    s = Settings.from_env({}, storage_namespace="data")
    assert (s.configmap, s.statefulset, s.service, s.watch_namespaces) == ("shale-topics", "shale", None, ())
    assert s.status_url_template == "http://{pod}.{service}.{namespace}.svc:8080/status"
    assert (s.liveness_endpoint, s.metrics_port) == ("http://0.0.0.0:8081/healthz", 8082)
    assert (s.cleaning_stuck_after_seconds, s.status_interval_seconds) == (3600.0, 30.0)


def test_variables_then_flags():
    env = {"SHALE_STORAGE_NAMESPACE": "data", "SHALE_WATCH_NAMESPACES": "a, b,,c",
           "SHALE_CLEANING_STUCK_AFTER_SECONDS": "90", "SHALE_METRICS_PORT": "9100", "SHALE_TOPICS_CONFIGMAP": "t"}
    s = from_args(parse(), env)
    assert (s.storage_namespace, s.watch_namespaces, s.cleaning_stuck_after_seconds, s.metrics_port, s.configmap) == (
        "data", ("a", "b", "c"), 90.0, 9100, "t")
    s = from_args(parse("--watch-namespaces", "x", "--metrics-port", "off", "--liveness-endpoint", "off",
                        "--cleaning-stuck-after-seconds", "5"), env)
    assert (s.watch_namespaces, s.metrics_port, s.liveness_endpoint, s.cleaning_stuck_after_seconds) == (
        ("x",), None, None, 5.0)


def test_bad_values_name_the_variable():
    with pytest.raises(ValueError, match="SHALE_STATUS_INTERVAL_SECONDS='often'"):
        Settings.from_env({"SHALE_STATUS_INTERVAL_SECONDS": "often"})
    with pytest.raises(ValueError, match="status_interval_seconds must be > 0"):
        Settings.from_env({"SHALE_STATUS_INTERVAL_SECONDS": "0"})
