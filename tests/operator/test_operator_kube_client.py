"""The operator's Kubernetes client bounds every request (operator/kube.py): an API server that accepts a
connection and never answers fails the call instead of holding a handler, and the Topic's lock, forever."""

from __future__ import annotations

import socket
import threading

import kubernetes
import pytest
import urllib3

from shale.operator import kube


@pytest.fixture
def silent_server():
    """A TCP listener that accepts connections and never writes a byte."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    accepted: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        listener.settimeout(0.1)
        while not stop.is_set():
            try:
                accepted.append(listener.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    stop.set()
    thread.join()
    for conn in accepted:
        conn.close()
    listener.close()


def client_for(host: str) -> kubernetes.client.ApiClient:
    configuration = kubernetes.client.Configuration()
    configuration.host = host
    return kube.BoundedApiClient(configuration)


def test_a_request_the_server_never_answers_times_out(silent_server, monkeypatch):
    monkeypatch.setattr(kube, "REQUEST_TIMEOUT_S", (1.0, 0.3))
    core = kubernetes.client.CoreV1Api(client_for(silent_server))
    with pytest.raises(urllib3.exceptions.MaxRetryError, match="Read timed out"):  # after the client's retries
        core.read_namespaced_config_map("topics", "default")


def test_a_timeout_named_by_the_caller_wins(silent_server, monkeypatch):
    monkeypatch.setattr(kube, "REQUEST_TIMEOUT_S", (1.0, 3600.0))  # would outlive the test: the caller's is used
    core = kubernetes.client.CoreV1Api(client_for(silent_server))
    with pytest.raises(urllib3.exceptions.MaxRetryError, match="Read timed out"):  # after the client's retries
        core.read_namespaced_config_map("topics", "default", _request_timeout=(1.0, 0.3))
