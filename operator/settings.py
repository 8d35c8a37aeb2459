"""What the operator needs to know about its storage and its timing: environment variables and flags.

Every setting has an environment variable (what the Helm chart sets) and a `shale operator` flag that
overrides it. The templates make the operator independent of how the storage is reached: in a cluster
the pods' DNS names through the headless Service, in tests loopback addresses and the ports of real
`shale serve` processes, taken from the pods' named container ports.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Callable, Mapping

_SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


def _own_namespace() -> str:
    """The pod's namespace (service account file), so a chart needs no setting for the usual layout."""
    try:
        return _SERVICE_ACCOUNT_NAMESPACE.read_text().strip() or "default"
    except OSError:
        return "default"


@dataclass(frozen=True)
class Settings:
    """The operator's settings; see docs/operator.md for each one's environment variable and flag."""

    storage_namespace: str = field(default_factory=_own_namespace)
    configmap: str = "shale-topics"
    statefulset: str = "shale"
    service: str | None = None  # the headless Service; None = the StatefulSet's spec.serviceName
    watch_namespaces: tuple[str, ...] = ()  # Topics to watch; empty = every namespace
    # Fields: pod, ordinal, service, namespace, pod_ip, and port_<name> for each named container port.
    status_url_template: str = "http://{pod}.{service}.{namespace}.svc:8080/status"
    node_address_template: str = "{pod}.{service}.{namespace}.svc:9092"
    default_replicas: int = 1  # replicas of each partition of a Topic without spec.replicas (the chart sets 3)
    cleaning_stuck_after_seconds: float = 3600.0
    status_interval_seconds: float = 30.0
    ready_wait_seconds: float = 15.0  # a change handler waits this long for the pods to serve the partitions
    http_timeout_seconds: float = 5.0
    max_moves_per_topic: int = 2  # partitions of one topic moving between pods at a time (docs/moves.md)
    scale_check_interval_seconds: float = 5.0  # how often the StatefulSet's size is checked against the drains
    liveness_endpoint: str | None = "http://0.0.0.0:8081/healthz"
    metrics_host: str = "0.0.0.0"
    metrics_port: int | None = 8082  # None = no metrics server
    # Users (operator/user_handlers.py): how the operator reaches each pod's Kafka admin APIs, and the clients CA.
    admin_address_template: str | None = None  # None = node_address_template
    admin_tls_ca_file: str | None = None  # TLS to the pods when set (with a client certificate when cert/key are)
    admin_tls_cert_file: str | None = None
    admin_tls_key_file: str | None = None
    clients_ca_secret: str | None = None  # Secret (storage namespace, tls.crt/tls.key) signing tls Users' certificates

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> "Settings":
        """Defaults, then the SHALE_* environment variables, then `overrides` (None values ignored)."""
        env = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        for name, (variable, parse) in _ENV.items():
            raw = env.get(variable)
            if raw is not None and raw != "":
                try:
                    values[name] = parse(raw)
                except ValueError as exc:
                    raise ValueError(f"{variable}={raw!r}: {exc}") from None
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**{k: (None if v is OFF else v) for k, v in values.items()})

    def __post_init__(self) -> None:
        for name in ("cleaning_stuck_after_seconds", "status_interval_seconds", "http_timeout_seconds",
                     "scale_check_interval_seconds"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        if self.default_replicas < 1:
            raise ValueError(f"default_replicas must be >= 1, got {self.default_replicas}")
        if self.max_moves_per_topic < 1:
            raise ValueError(f"max_moves_per_topic must be >= 1, got {self.max_moves_per_topic}")
        if self.ready_wait_seconds < 0:
            raise ValueError(f"ready_wait_seconds must be >= 0, got {self.ready_wait_seconds}")


def _namespaces(raw: str) -> tuple[str, ...]:
    return tuple(n.strip() for n in raw.split(",") if n.strip())


OFF = object()  # "switched off" as parsed from a flag or variable (None there means "not given")


def _optional_port(raw: str) -> Any:
    return OFF if raw.strip().lower() in ("off", "none") else int(raw)


def _optional_text(raw: str) -> Any:
    return OFF if raw.strip().lower() in ("off", "none") else raw


def _positive_int(raw: str) -> int:
    value = int(raw)
    if value < 1:
        raise ValueError(f"must be an integer >= 1, got {value}")
    return value


_ENV: dict[str, tuple[str, Callable[[str], Any]]] = {
    "storage_namespace": ("SHALE_STORAGE_NAMESPACE", str),
    "configmap": ("SHALE_TOPICS_CONFIGMAP", str),
    "statefulset": ("SHALE_STATEFULSET", str),
    "service": ("SHALE_HEADLESS_SERVICE", str),
    "watch_namespaces": ("SHALE_WATCH_NAMESPACES", _namespaces),
    "status_url_template": ("SHALE_STATUS_URL_TEMPLATE", str),
    "node_address_template": ("SHALE_NODE_ADDRESS_TEMPLATE", str),
    "default_replicas": ("SHALE_DEFAULT_REPLICAS", _positive_int),
    "cleaning_stuck_after_seconds": ("SHALE_CLEANING_STUCK_AFTER_SECONDS", float),
    "status_interval_seconds": ("SHALE_STATUS_INTERVAL_SECONDS", float),
    "ready_wait_seconds": ("SHALE_READY_WAIT_SECONDS", float),
    "http_timeout_seconds": ("SHALE_HTTP_TIMEOUT_SECONDS", float),
    "max_moves_per_topic": ("SHALE_MAX_MOVES_PER_TOPIC", _positive_int),
    "scale_check_interval_seconds": ("SHALE_SCALE_CHECK_INTERVAL_SECONDS", float),
    "liveness_endpoint": ("SHALE_LIVENESS_ENDPOINT", _optional_text),
    "metrics_host": ("SHALE_METRICS_HOST", str),
    "metrics_port": ("SHALE_METRICS_PORT", _optional_port),
    "admin_address_template": ("SHALE_ADMIN_ADDRESS_TEMPLATE", str),
    "admin_tls_ca_file": ("SHALE_ADMIN_TLS_CA_FILE", str),
    "admin_tls_cert_file": ("SHALE_ADMIN_TLS_CERT_FILE", str),
    "admin_tls_key_file": ("SHALE_ADMIN_TLS_KEY_FILE", str),
    "clients_ca_secret": ("SHALE_CLIENTS_CA_SECRET", str),
}
assert set(_ENV) == {f.name for f in fields(Settings)}, "every setting needs an environment variable"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """`shale operator` flags; each overrides its environment variable (shown in the help)."""
    def flag(name: str, help: str, **kwargs: Any) -> None:
        dest = name.lstrip("-").replace("-", "_")
        parser.add_argument(name, dest=dest, default=None, help=f"{help} (env {_ENV[dest][0]})", **kwargs)

    flag("--storage-namespace", "namespace of the storage StatefulSet and the topics ConfigMap")
    flag("--configmap", "the ConfigMap every storage pod mounts as its --topics directory")
    flag("--statefulset", "the StatefulSet of `shale serve` pods")
    flag("--service", "its headless Service (default: the StatefulSet's spec.serviceName)")
    flag("--watch-namespaces", "comma-separated namespaces whose Topics to manage (default: all)",
         type=_namespaces)
    flag("--status-url-template", "URL of a pod's /status; fields {pod} {ordinal} {service} {namespace} "
         "{pod_ip} {port_<name>}")
    flag("--node-address-template", "Kafka address of a pod, as clients reach it; same fields")
    flag("--default-replicas", "replicas of each partition of a Topic without spec.replicas, capped by the pods",
         type=_positive_int)
    flag("--cleaning-stuck-after-seconds", "paused or uncleanable this long: CleaningStuck=True", type=float)
    flag("--status-interval-seconds", "how often each Topic is reconciled and its status refreshed", type=float)
    flag("--ready-wait-seconds", "how long a change waits for the pods to serve it before returning", type=float)
    flag("--http-timeout-seconds", "timeout of a pod's /status request", type=float)
    flag("--max-moves-per-topic", "partitions of one topic moving between pods at a time", type=_positive_int)
    flag("--scale-check-interval-seconds", "how often the StatefulSet's size is checked against the drains",
         type=float)
    flag("--liveness-endpoint", "kopf's liveness probe URL to serve, or 'off'", type=_optional_text)
    flag("--metrics-host", "address of the Prometheus /metrics server")
    flag("--metrics-port", "port of the Prometheus /metrics server, or 'off'", type=_optional_port)
    flag("--admin-address-template", "Kafka address of a pod for the Users' admin requests (SCRAM credentials, "
         "ACLs); default: --node-address-template")
    flag("--admin-tls-ca-file", "CA of the pods' admin listener: TLS when given")
    flag("--admin-tls-cert-file", "the operator's client certificate on the admin listener (a super user there)")
    flag("--admin-tls-key-file", "its private key")
    flag("--clients-ca-secret", "Secret (tls.crt, tls.key) of the CA that signs tls Users' certificates")


def from_args(args: argparse.Namespace, environ: Mapping[str, str] | None = None) -> Settings:
    return Settings.from_env(environ, **{name: getattr(args, name, None) for name in _ENV})
