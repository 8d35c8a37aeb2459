"""A node's HTTP endpoints read over real HTTP (urllib): status and body, JSON, and /metrics' samples.

Shared by the HTTP API's tests and by the tests of other folders that read a node's /metrics or /v1 answers.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request

from prometheus_client.parser import text_string_to_metric_families


def request(port: int, path: str, method: str = "GET") -> tuple[int, bytes, str]:
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", method=method)
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, resp.read(), resp.headers.get("Content-Type", "")
    except urllib.error.HTTPError as e:
        return e.code, e.read(), e.headers.get("Content-Type", "")


def get_json(port: int, path: str, method: str = "GET") -> tuple[int, dict]:
    status, body, content_type = request(port, path, method)
    assert content_type == "application/json"
    return status, json.loads(body)


def scrape(port: int) -> dict[tuple[str, frozenset], float]:
    """Every sample of /metrics, keyed by (sample name, labels)."""
    status, body, content_type = request(port, "/metrics")
    assert status == 200 and content_type.startswith("text/plain")
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(body.decode()) for s in family.samples}


def sample(metrics, name: str, **labels) -> float:
    return metrics[(name, frozenset((k, str(v)) for k, v in labels.items()))]
