"""The node's HTTP endpoints: /metrics, /status, /healthz, /readyz and pausing a partition's cleaning.

Served by the standard library's ThreadingHTTPServer in its own daemon thread, not on the Kafka
event loop, because:
- a scrape or /status reads every log under its lock and asks the CleanerManager for dirty ratios,
  and a pause waits for a running cleaner pass to abort — blocking work that would stall Kafka
  requests if it ran on the loop;
- it starts before the logs are loaded, so /healthz answers (and /readyz says 503) during a long
  recovery, when no event loop exists yet;
- one thread per request keeps a slow scrape from delaying a probe.

| method and path | answer |
|---|---|
| GET /metrics | Prometheus text format (docs/metrics.md) |
| GET /status | the node as JSON (`status_document`, shape documented in docs/metrics.md) |
| GET /healthz | 200 while the process runs; a dead cleaner thread is reported, not fatal (Kafka keeps running) |
| GET /readyz | 200 once the broker listens, 503 before and during shutdown |
| POST /partitions/<topic>/<partition>/pause[?owner=NAME] | abort and pause the partition's cleaning (and retention) for owner `http:NAME` (or a full `kind:id`; none: an anonymous pause); 200 with the count and owners |
| POST /partitions/<topic>/<partition>/resume[?owner=NAME] | release that owner's pause (none: the newest anonymous one); 409 naming the owners if it holds none |

Reads (GET, HEAD) are open to whoever reaches the port, so Prometheus and the kubelet's probes need no
credential; the chart's NetworkPolicy decides who reaches it. Every other method is a change and is
authenticated first, before its path is even looked at (`HttpSecurity`): a bearer token equal to the
contents of `--http-token-file` (read per request, so a rotated Secret applies without a restart), or a
client certificate verified against `--http-tls-ca`. Without either option changes stay open, as before
(a WARNING at start says so). A refusal is 401 (no credential) or 403 (a wrong token) with a JSON body,
changes nothing, and is logged with the client's address — never the token.
"""

from __future__ import annotations

import hmac
import json
import logging
import socket
import ssl
import threading
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Mapping
from urllib.parse import parse_qs, unquote, urlsplit

from prometheus_client import CONTENT_TYPE_LATEST

from ...log.cleaner_manager import CleaningStateError
from ...log.pause_owners import HTTP, PauseOwner
from ...log.topic_partition import TopicPartition
from ...security.tls import server_context
from .node_figures import NodeFigures, PartitionFigures, gather

logger = logging.getLogger(__name__)

STATUS_VERSION = 1
HANDSHAKE_TIMEOUT_SECONDS = 10.0  # a client that connects and says nothing holds one thread, not the port


@dataclass(frozen=True)
class HttpSecurity:
    """TLS and authentication of the HTTP port (`shale serve --http-*`); the default is plaintext and open."""

    token_file: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None
    tls_ca: str | None = None
    client_auth: str | None = None  # Kafka's ssl.client.auth values; None: `requested` with a CA, else `none`

    @property
    def authenticates(self) -> bool:
        return self.token_file is not None or self.tls_ca is not None

    def context(self) -> ssl.SSLContext | None:
        """The port's TLS context, or None for plaintext; ValueError naming the option or file that is wrong."""
        if self.tls_cert is None and self.tls_key is None:
            if self.tls_ca is not None or self.client_auth is not None:
                raise ValueError("--http-tls-ca and --http-tls-client-auth need --http-tls-cert and --http-tls-key")
            return None
        if self.tls_cert is None or self.tls_key is None:
            raise ValueError("--http-tls-cert and --http-tls-key go together")
        return server_context(self.tls_cert, self.tls_key, self.tls_ca,
                              self.client_auth or ("requested" if self.tls_ca else "none"))

    def token(self) -> str:
        """The expected bearer token: the file's text without surrounding whitespace (a Secret's trailing newline)."""
        try:
            with open(self.token_file, encoding="utf-8") as f:
                token = f.read().strip()
        except (OSError, UnicodeDecodeError) as exc:
            raise ValueError(f"--http-token-file {self.token_file}: {getattr(exc, 'strerror', None) or exc}") from None
        if not token:
            raise ValueError(f"--http-token-file {self.token_file} is empty")
        return token


def status_document(f: NodeFigures, spec_digests: Mapping[str, str] | None = None) -> dict:
    """The /status JSON. Fields are only ever added within a version; a change of meaning bumps `version`.

    spec_digests: topic → `TopicSpec.digest` of every topic the node declares, listed even where it holds
    none of the topic's partitions (every node answers Metadata for every topic).
    """
    topics: dict[str, dict] = {name: {"spec_digest": digest, "partitions": []}
                               for name, digest in sorted((spec_digests or {}).items())}
    for p in f.partitions:
        topics.setdefault(p.topic, {"spec_digest": None, "partitions": []})["partitions"].append(
            _partition_document(p, f.now_ms))
    c, m = f.cleaner, f.manifests
    return {
        "version": STATUS_VERSION,
        "node_id": f.node_id,
        "phase": f.phase,
        "ready": f.ready,
        "time_ms": f.now_ms,
        "data_dir": {"path": f.data_dir, "bytes_used": f.bytes_used, "bytes_free": f.bytes_free,
                     "bytes_total": f.bytes_total, "had_clean_shutdown": f.had_clean_shutdown,
                     "storage_failing_partitions": len(f.storage_failing)},
        "log_dirs": [{"path": d.path, "partitions": d.partitions, "future_replicas": d.future_replicas,
                      "bytes_free": d.bytes_free, "bytes_total": d.bytes_total, "min_free_bytes": d.min_free_bytes,
                      "produce_refused": d.produce_refused, "produce_refusals": d.produce_refusals}
                     for d in f.log_dirs],
        "moves_bytes_copied": f.bytes_moved,
        "topics": topics,
        "cleaner": None if c is None else {
            "enabled": c.enabled,
            "threads_live": c.live,
            "threads_dead": c.dead,
            "threads": [{"index": t.index, "alive": t.alive, "error": t.error or None} for t in c.threads],
            "max_dirty_ratio": c.max_dirty_ratio,
            "max_compaction_delay_ms": c.max_compaction_delay_ms,
            "last_run_ms": c.last_run_ms,
            "max_clean_time_seconds": c.max_clean_time_s,
            "uncleanable_bytes": c.uncleanable_bytes,
        },
        "uncleanable_partitions": [{"topic": p.topic, "partition": p.partition, "reason": p.uncleanable_reason}
                                   for p in f.uncleanable],
        "maintenance": {
            "scheduler_alive": f.scheduler_alive,
            "tasks": {t.name: {"interval_ms": t.interval_ms, "runs": t.runs, "errors": t.errors,
                               "last_run_ms": t.last_run_ms, "last_error": t.last_error or None}
                      for t in f.tasks},
        },
        "errors": {"manifests": f.manifest_errors, "topics": f.topic_errors},
        "session_valid": f.session_valid,
        "replication_throttles": {side: {"rate": t.rate, "in_force": t.in_force, "throttled_bytes": t.throttled_bytes,
                                         "reassignment_bytes": t.reassignment_bytes}
                                  for side, t in f.throttles.items()},
        "manifests": None if m is None else {
            "path": m.path,
            "files": m.files,
            "missing": m.missing,
            "held": {name: {"reason": reason, "message": message} for name, (reason, message) in sorted(m.held.items())},
            "refusals": m.refusals,
        },
    }


def _partition_document(p: PartitionFigures, now: int) -> dict:
    return {
        "partition": p.partition,
        "served": p.served,
        "log_start_offset": p.log_start_offset,
        "log_end_offset": p.log_end_offset,
        "recovery_point": p.recovery_point,
        "size_bytes": p.size_bytes,
        "segments": p.segments,
        "cleanup_policy": list(p.cleanup_policy),
        "cleaning": {
            "state": p.cleaning.state.value,
            "since_ms": p.cleaning.since_ms,
            "seconds_in_state": max(now - p.cleaning.since_ms, 0) / 1000,
            "pause_count": p.cleaning.pause_count,
            "pause_owners": [str(o) for o in p.cleaning.owners] if p.cleaning.pause_count else [],
            "uncleanable_reason": p.uncleanable_reason,
        },
        "dirty_ratio": p.dirty_ratio,
        "min_cleanable_dirty_ratio": p.min_cleanable_dirty_ratio,
        "last_clean_ms": p.last_clean_ms,
        "storage_error": None if p.storage_failure is None else {
            "errno": p.storage_failure.errno, "reason": p.storage_failure.reason,
            "since_ms": p.storage_failure.since_ms, "failures": p.storage_failure.failures,
            "appends_stopped": p.storage_failure.appends_stopped},
        "high_watermark": p.high_watermark,
        "last_stable_offset": p.last_stable_offset,
        "replica": None if p.replica is None else {
            "role": p.replica.role, "leader": p.replica.leader, "leader_epoch": p.replica.leader_epoch,
            "replicas": list(p.replica.replicas), "isr": list(p.replica.isr), "in_sync": p.replica.in_sync,
            "lag": p.replica.lag, "fetch_error": p.replica.fetch_error,
            "under_replicated": p.replica.under_replicated, "under_min_isr": p.replica.under_min_isr,
            "adding_replicas": list(p.replica.adding), "removing_replicas": list(p.replica.removing)},
        "log_dir": p.log_dir,
        "move": None if p.move is None else {
            "id": p.move.id, "source": p.move.source, "target": p.move.target, "state": p.move.state,
            "reason": p.move.reason or None, "started_ms": p.move.started_ms, "finished_ms": p.move.finished_ms,
            "bytes_copied": p.move.bytes_copied, "bytes_remaining": p.move.bytes_remaining},
    }


class HttpApi:
    """The HTTP server of one StorageNode; `port` is the bound port (useful with port 0)."""

    def __init__(self, node, host: str, port: int, security: HttpSecurity = HttpSecurity()) -> None:
        self.node = node
        self.security = security
        context = security.context()
        if security.token_file is not None:
            security.token()  # an unreadable or empty file: refused at start, not at the first pause
        api = self

        class Handler(_Handler):
            owner = api

        self.server = _Server((host, port), Handler, context)
        self.port = self.server.server_address[1]
        self._thread = threading.Thread(target=self.server.serve_forever, name="shale-http", daemon=True)

    def start(self) -> HttpApi:
        self._thread.start()
        tls = self.server.context
        logger.info("HTTP endpoints on %s://%s:%d (/metrics, /status, /healthz, /readyz)",
                    "http" if tls is None else "https", self.server.server_address[0], self.port)
        if not self.security.authenticates:
            logger.warning("HTTP changes (pause/resume) are open to anyone who reaches port %d: "
                           "give --http-token-file or --http-tls-ca", self.port)
        return self

    def authenticate(self, authorization: str | None, peer_certificate: dict | None) -> tuple[int, str] | None:
        """None when a change may go ahead; else the refusal's status and message."""
        if not self.security.authenticates or peer_certificate:
            return None  # a certificate is only ever present once verified against --http-tls-ca
        if self.security.token_file is None:
            return 401, "changes need a client certificate signed by the HTTP port's CA"
        scheme, _, presented = (authorization or "").partition(" ")
        if scheme.lower() != "bearer" or not presented.strip():
            return 401, "changes need an Authorization: Bearer <token> header (the token of --http-token-file)"
        try:
            expected = self.security.token()
        except ValueError as exc:
            logger.error("HTTP change refused: %s", exc)
            return 503, "the node cannot read its token file"
        if not hmac.compare_digest(presented.strip().encode(), expected.encode()):
            return 403, "the bearer token does not match"
        return None

    def close(self) -> None:
        if self._thread.is_alive():
            self.server.shutdown()
            self._thread.join(10)
        self.server.server_close()

    # -- endpoints: (status, content type, body) -------------------------------------------------

    def metrics(self) -> tuple[int, str, bytes]:
        return 200, CONTENT_TYPE_LATEST, self.node.metrics.exposition()

    def status(self) -> tuple[int, str, bytes]:
        figures = gather(self.node)
        registry = getattr(self.node, "registry", None)
        specs = dict(registry.topics) if registry is not None else {}  # a copy: the event loop changes it
        return _json(200, status_document(figures, {name: spec.digest for name, spec in specs.items()}))

    def healthz(self) -> tuple[int, str, bytes]:
        maintenance = getattr(self.node, "maintenance", None)
        dead = maintenance.cleaner.dead_threads if maintenance is not None else 0
        return _json(200, {"status": "ok", "phase": getattr(self.node, "phase", "starting"),
                           "cleaner_threads_dead": dead})

    def readyz(self) -> tuple[int, str, bytes]:
        ready = bool(getattr(self.node, "ready", False))
        return _json(200 if ready else 503, {"ready": ready, "phase": getattr(self.node, "phase", "starting")})

    def cleaning(self, topic: str, partition_text: str, action: str,
                 owner_text: str | None = None) -> tuple[int, str, bytes]:
        maintenance = getattr(self.node, "maintenance", None)
        log_dir = getattr(self.node, "log_dir", None)
        if maintenance is None or log_dir is None:
            return _json(503, {"error": "the node is still loading its logs"})
        if not partition_text.isdigit() or TopicPartition(topic, int(partition_text)) not in log_dir.logs:
            return _json(404, {"error": f"no partition {topic}-{partition_text} on this node"})
        tp = TopicPartition(topic, int(partition_text))
        manager = maintenance.manager
        try:
            owner = None if owner_text is None else (
                PauseOwner.parse(owner_text) if ":" in owner_text else PauseOwner(HTTP, owner_text))
        except ValueError as exc:
            return _json(400, {"error": str(exc)})
        try:
            if action == "pause":
                count = maintenance.pause(tp, owner)
                logger.info("cleaning of %s paused through the HTTP API by %s (pause count %d)", tp,
                            owner or "an anonymous caller", count)
            else:
                count = maintenance.resume(tp, owner)
                logger.info("cleaning of %s resumed through the HTTP API for %s (pause count %d)", tp,
                            owner or "an anonymous caller", count)
        except CleaningStateError as exc:
            return _json(409, {"error": str(exc), "topic": topic, "partition": tp.partition,
                               "state": manager.state(tp).state.value})
        state = manager.state(tp)
        return _json(200, {"topic": topic, "partition": tp.partition, "state": state.state.value,
                           "pause_count": state.pause_count,
                           "pause_owners": [str(o) for o in state.owners] if state.pause_count else []})


def _json(status: int, body: object) -> tuple[int, str, bytes]:
    return status, "application/json", json.dumps(body, indent=1, sort_keys=True).encode() + b"\n"


class _Server(ThreadingHTTPServer):
    """ThreadingHTTPServer with TLS: the handshake runs in the request's own thread, with a timeout, so a slow
    or plaintext client never holds the accept loop; a failed handshake is logged and the connection closed."""

    daemon_threads = True

    def __init__(self, address: tuple[str, int], handler, context: ssl.SSLContext | None) -> None:
        self.context = context
        super().__init__(address, handler)

    def finish_request(self, request: socket.socket, client_address) -> None:
        if self.context is None:
            super().finish_request(request, client_address)
            return
        request.settimeout(HANDSHAKE_TIMEOUT_SECONDS)
        try:
            tls = self.context.wrap_socket(request, server_side=True)  # takes over the descriptor
        except (OSError, ValueError) as exc:  # ssl.SSLError is an OSError; a timeout too
            logger.info("HTTP TLS handshake with %s:%d failed: %s", *client_address[:2], exc)
            return
        try:
            super().finish_request(tls, client_address)
        finally:
            try:
                tls.shutdown(socket.SHUT_WR)
            except OSError:
                pass
            tls.close()


class _Handler(BaseHTTPRequestHandler):
    owner: HttpApi
    server_version = "shale"
    timeout = 60  # seconds of silence before a connection is dropped: no thread is held forever

    def do_GET(self) -> None:  # noqa: N802 - the stdlib's naming
        routes = {"/metrics": self.owner.metrics, "/status": self.owner.status, "/healthz": self.owner.healthz,
                  "/readyz": self.owner.readyz}
        path = urlsplit(self.path).path
        if path in routes:
            self._answer(routes[path])
        elif self._cleaning_route(path) is not None:
            self._send(*_json(405, {"error": f"use POST for {path}"}))
        else:
            self._send(*_json(404, {"error": f"no such endpoint: {path}"}))

    def do_HEAD(self) -> None:  # noqa: N802
        self.do_GET()

    def do_POST(self) -> None:  # noqa: N802
        if not self._authenticated():
            return
        url = urlsplit(self.path)
        route = self._cleaning_route(url.path)
        if route is None:
            self._send(*_json(404, {"error": f"no such endpoint: {url.path}"}))
            return
        owner = parse_qs(url.query).get("owner", [None])[-1]
        self._answer(lambda: self.owner.cleaning(*route, owner))

    def do_PUT(self) -> None:  # noqa: N802 - every other change: authenticated, then no such route
        if self._authenticated():
            self._send(*_json(405, {"error": f"{self.command} is not served; changes are POST"}))

    do_DELETE = do_PATCH = do_PUT

    def _authenticated(self) -> bool:
        peer = self.connection.getpeercert() if isinstance(self.connection, ssl.SSLSocket) else None
        refusal = self.owner.authenticate(self.headers.get("Authorization"), peer)
        if refusal is None:
            return True
        status, message = refusal
        logger.warning("HTTP %s %s from %s refused (%d): %s", self.command, urlsplit(self.path).path,
                       self.address_string(), status, message)
        self._send(*_json(status, {"error": message}),
                   {"WWW-Authenticate": 'Bearer realm="shale"'} if status == 401 else {})
        return False

    @staticmethod
    def _cleaning_route(path: str) -> tuple[str, str, str] | None:
        parts = path.strip("/").split("/")
        if len(parts) == 4 and parts[0] == "partitions" and parts[3] in ("pause", "resume"):
            return unquote(parts[1]), unquote(parts[2]), parts[3]
        return None

    def _answer(self, endpoint) -> None:
        try:
            result = endpoint()
        except Exception as exc:  # noqa: BLE001 - a failed request must not end the server
            logger.exception("HTTP %s %s failed", self.command, self.path)
            result = _json(500, {"error": f"{type(exc).__name__}: {exc}"})
        self._send(*result)

    def _send(self, status: int, content_type: str, body: bytes, headers: Mapping[str, str] = {}) -> None:
        self.send_response(status, HTTPStatus(status).phrase)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for name, value in headers.items():
            self.send_header(name, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def log_message(self, format: str, *args) -> None:  # noqa: A002 - the stdlib's signature
        logger.debug("HTTP %s: " + format, self.address_string(), *args)
