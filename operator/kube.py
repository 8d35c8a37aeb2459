"""The Kubernetes API client configuration: one, for the operator's own calls and for kopf's.

One client, the official `kubernetes` package, for every call the operator makes itself (ConfigMap,
StatefulSet, pods). It was chosen over pykube-ng, the lighter one: its in-cluster loader re-reads the
service-account token that the kubelet rotates (pykube-ng 23.6 reads it once at start, so a
long-running operator would start getting 401s when a bound token expires), and its ApiException
carries the HTTP status the ConfigMap's optimistic concurrency needs (409). pykube-ng serves where its
limits do not matter: the one-shot Topic reader, operator/topic_check.py. kopf talks to the API with
its own aiohttp client; `login` hands it this same configuration (server, CA, token, client cert), so
kopf and the operator's calls always reach the same server as the same user — a second client library
would bring a second configuration loader that could disagree.

The kubeconfig path is read when the operator starts (the client library's default is fixed when it
is imported). The client is blocking (urllib3); the handlers call it through `asyncio.to_thread`.
"""

from __future__ import annotations

import os

import kopf
import kubernetes

# (connect, read) seconds for each of the operator's own requests. The client's default is none at all: a
# connection that dies without a reset (a NAT or node gone) would hold a handler, and the Topic's lock it
# holds, forever. The read bound is above the API server's own `--request-timeout` (60 s), which answers first.
REQUEST_TIMEOUT_S = (10.0, 65.0)


class BoundedApiClient(kubernetes.client.ApiClient):
    """The official client with a timeout on every request that does not name its own."""

    def call_api(self, *args: object, _request_timeout: object = None, **kwargs: object):  # type: ignore[override]
        return super().call_api(*args, _request_timeout=_request_timeout or REQUEST_TIMEOUT_S, **kwargs)


def api_client() -> kubernetes.client.ApiClient:
    """In the cluster: the pod's service account; outside: $KUBECONFIG (first file) or ~/.kube/config."""
    configuration = kubernetes.client.Configuration()
    try:
        kubernetes.config.load_incluster_config(client_configuration=configuration)
    except kubernetes.config.ConfigException:
        path = (os.environ.get("KUBECONFIG") or "~/.kube/config").split(os.pathsep)[0]
        kubernetes.config.load_kube_config(config_file=os.path.expanduser(path), client_configuration=configuration)
    return BoundedApiClient(configuration)


def connection_info(configuration: kubernetes.client.Configuration) -> kopf.ConnectionInfo:
    """The client's configuration as kopf's credentials; called again by kopf when the API answers 401."""
    # Calling get_api_key_with_prefix runs the in-cluster loader's refresh hook (a rotated token).
    header = (configuration.get_api_key_with_prefix("BearerToken")
              or configuration.get_api_key_with_prefix("authorization") or "")
    scheme, _, token = header.partition(" ") if " " in header else (None, "", header)
    return kopf.ConnectionInfo(
        server=configuration.host, ca_path=configuration.ssl_ca_cert, insecure=not configuration.verify_ssl,
        username=configuration.username or None, password=configuration.password or None,
        scheme=scheme, token=token or None,
        certificate_path=configuration.cert_file, private_key_path=configuration.key_file)
