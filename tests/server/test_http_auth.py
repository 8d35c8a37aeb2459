"""The HTTP port's TLS and authentication, against real `shale serve` processes over real HTTP(S).

Reads stay open (Prometheus, probes); every change needs the token of --http-token-file or a client
certificate of --http-tls-ca; a refusal changes nothing and the node goes on serving.
"""

from __future__ import annotations

import http.client
import json
import socket
import ssl
import subprocess
from pathlib import Path

import pytest

from support.node_util import ServeProcess, topic_manifest, wait_for, write_manifests

TOKEN = "s3cr3t-token-0123456789abcdef"


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True)


def make_ca(d: Path, name: str) -> None:
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{d}/{name}.key", "-out", f"{d}/{name}.pem",
             "-days", "2", "-subj", f"/CN={name}")


def make_cert(d: Path, name: str, ca: str, *, server: bool = False) -> None:
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{d}/{name}.key", "-out", f"{d}/{name}.csr",
             "-subj", f"/CN={name}")
    ext = d / f"{name}.ext"
    ext.write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n" if server else "extendedKeyUsage=clientAuth\n")
    _openssl("x509", "-req", "-in", f"{d}/{name}.csr", "-CA", f"{d}/{ca}.pem", "-CAkey", f"{d}/{ca}.key",
             "-CAcreateserial", "-out", f"{d}/{name}.pem", "-days", "2", "-extfile", str(ext))


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> Path:
    """A server CA with the node's certificate, a clients CA with the operator's, and a stranger's CA."""
    d = tmp_path_factory.mktemp("pki")
    make_ca(d, "server-ca")
    make_cert(d, "node", "server-ca", server=True)
    make_ca(d, "clients-ca")
    make_cert(d, "operator", "clients-ca")
    make_ca(d, "stranger-ca")
    make_cert(d, "stranger", "stranger-ca")
    return d


def start_node(tmp_path: Path, *extra: str) -> ServeProcess:
    topics = write_manifests(tmp_path / "topics" / "orders.yaml", topic_manifest("orders"))
    return ServeProcess(tmp_path / "data", topics.parent, *extra).start()


def call(node: ServeProcess, method: str, path: str, headers: dict | None = None,
         context: ssl.SSLContext | None = None) -> tuple[int, dict, dict]:
    if context is None:
        conn = http.client.HTTPConnection("127.0.0.1", node.http_port, timeout=30)
    else:
        conn = http.client.HTTPSConnection("127.0.0.1", node.http_port, timeout=30, context=context)
    try:
        conn.request(method, path, headers=headers or {})
        resp = conn.getresponse()
        body = resp.read()
        return resp.status, dict(resp.getheaders()), json.loads(body) if body.startswith(b"{") else {}
    finally:
        conn.close()


def pause_count(node: ServeProcess, context: ssl.SSLContext | None = None) -> int:
    status, _, doc = call(node, "GET", "/status", context=context)
    assert status == 200
    return doc["topics"]["orders"]["partitions"][0]["cleaning"]["pause_count"]


def served(node: ServeProcess, context: ssl.SSLContext | None = None) -> bool:
    status, _, doc = call(node, "GET", "/status", context=context)
    return status == 200 and bool(doc["topics"].get("orders", {}).get("partitions"))


def test_reads_are_open_and_changes_need_the_token(tmp_path):
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")  # a Secret's value often ends with a newline
    with start_node(tmp_path, "--http-token-file", str(token_file)) as node:
        wait_for(lambda: served(node), what="orders served")
        for path in ("/metrics", "/status", "/healthz", "/readyz"):
            assert call(node, "GET", path)[0] == 200, path
        assert call(node, "HEAD", "/healthz")[0] == 200

        status, headers, body = call(node, "POST", "/partitions/orders/0/pause")
        assert (status, headers["WWW-Authenticate"]) == (401, 'Bearer realm="shale"')
        assert "Authorization: Bearer" in body["error"]
        status, _, body = call(node, "POST", "/partitions/orders/0/pause", {"Authorization": "Bearer wrong"})
        assert (status, body) == (403, {"error": "the bearer token does not match"})
        assert call(node, "POST", "/partitions/orders/0/pause", {"Authorization": f"Basic {TOKEN}"})[0] == 401
        assert call(node, "POST", "/partitions/nope/0/pause")[0] == 401  # authenticated before routed: no probing
        for method in ("PUT", "DELETE", "PATCH"):
            assert call(node, method, "/partitions/orders/0/pause")[0] == 401, method
        assert pause_count(node) == 0  # nothing refused changed anything

        good = {"Authorization": f"Bearer {TOKEN}"}
        status, _, body = call(node, "POST", "/partitions/orders/0/pause", good)
        assert (status, body["pause_count"]) == (200, 1)
        assert call(node, "DELETE", "/partitions/orders/0/pause", good)[0] == 405
        assert call(node, "POST", "/partitions/nope/0/pause", good)[0] == 404

        token_file.write_text("rotated-token\n")  # a rotated Secret applies without a restart
        assert call(node, "POST", "/partitions/orders/0/resume", good)[0] == 403
        status, _, body = call(node, "POST", "/partitions/orders/0/resume", {"Authorization": "Bearer rotated-token"})
        assert (status, body["pause_count"]) == (200, 0)
        assert node.running
    log = node.log()
    assert "refused (401)" in log and "refused (403)" in log
    assert TOKEN not in log and "rotated-token" not in log


def test_tls_and_client_certificates(tmp_path, pki):
    with start_node(tmp_path, "--http-tls-cert", f"{pki}/node.pem", "--http-tls-key", f"{pki}/node.key",
                    "--http-tls-ca", f"{pki}/clients-ca.pem") as node:
        anonymous = ssl.create_default_context(cafile=f"{pki}/server-ca.pem")
        wait_for(lambda: served(node, anonymous), what="orders served over TLS")
        assert call(node, "GET", "/metrics", context=anonymous)[0] == 200  # Prometheus needs no certificate

        assert call(node, "POST", "/partitions/orders/0/pause", context=anonymous)[0] == 401
        assert pause_count(node, anonymous) == 0

        operator = ssl.create_default_context(cafile=f"{pki}/server-ca.pem")
        operator.load_cert_chain(f"{pki}/operator.pem", f"{pki}/operator.key")
        status, _, body = call(node, "POST", "/partitions/orders/0/pause", context=operator)
        assert (status, body["pause_count"]) == (200, 1)

        stranger = ssl.create_default_context(cafile=f"{pki}/server-ca.pem")
        stranger.load_cert_chain(f"{pki}/stranger.pem", f"{pki}/stranger.key")
        with pytest.raises((ssl.SSLError, ConnectionError)):
            call(node, "POST", "/partitions/orders/0/pause", context=stranger)

        with socket.create_connection(("127.0.0.1", node.http_port), timeout=30) as plain:  # plaintext to TLS
            plain.sendall(b"POST /partitions/orders/0/resume HTTP/1.0\r\n\r\n")
            try:
                answer = plain.recv(4096)
            except ConnectionResetError:
                answer = b""
            assert b"HTTP/1" not in answer  # a TLS alert, or a reset; never an answer
        assert pause_count(node, anonymous) == 1  # still paused: only the operator's certificate changed it
        assert node.running


def test_a_token_and_tls_together(tmp_path, pki):
    (tmp_path / "token").write_text(TOKEN)
    with start_node(tmp_path, "--http-tls-cert", f"{pki}/node.pem", "--http-tls-key", f"{pki}/node.key",
                    "--http-token-file", str(tmp_path / "token")) as node:
        context = ssl.create_default_context(cafile=f"{pki}/server-ca.pem")
        wait_for(lambda: served(node, context), what="orders served over TLS")
        assert call(node, "POST", "/partitions/orders/0/pause", context=context)[0] == 401
        status, _, body = call(node, "POST", "/partitions/orders/0/pause", {"Authorization": f"Bearer {TOKEN}"},
                               context=context)
        assert (status, body["pause_count"]) == (200, 1)


@pytest.mark.parametrize("args, message", [
    (["--http-token-file", "{d}/empty"], "--http-token-file {d}/empty is empty"),
    (["--http-token-file", "{d}/absent"], "--http-token-file {d}/absent: No such file or directory"),
    (["--http-tls-cert", "{pki}/node.pem"], "--http-tls-cert and --http-tls-key go together"),
    (["--http-tls-cert", "{pki}/node.pem", "--http-tls-key", "{pki}/operator.key"], "TLS certificate {pki}/node.pem"),
    (["--http-tls-cert", "{pki}/node.pem", "--http-tls-key", "{pki}/node.key", "--http-tls-ca", "{d}/absent"],
     "TLS CA file {d}/absent"),
    (["--http-tls-ca", "{pki}/clients-ca.pem"], "--http-tls-ca and --http-tls-client-auth need --http-tls-cert"),
])
def test_bad_options_refuse_to_start_and_create_nothing(tmp_path, pki, args, message):
    (tmp_path / "empty").write_text("\n")
    topics = write_manifests(tmp_path / "topics" / "orders.yaml", topic_manifest("orders"))
    fill = {"d": tmp_path, "pki": pki}
    node = ServeProcess(tmp_path / "data", topics.parent, *(a.format(**fill) for a in args))
    done = subprocess.run(node.args, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done.stderr
    assert message.format(**fill) in done.stderr
    assert not (tmp_path / "data").exists()
