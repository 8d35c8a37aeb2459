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
| POST /partitions/<topic>/<partition>/pause | abort and pause the partition's cleaning (and retention); 200 with the count |
| POST /partitions/<topic>/<partition>/resume | undo one pause; 409 if not paused |
"""

from __future__ import annotations

import json
import logging
import threading
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Mapping
from urllib.parse import unquote, urlsplit

from prometheus_client import CONTENT_TYPE_LATEST

from shale.sidecar.log.checkpoint import TopicPartition
from shale.sidecar.log.cleaner_manager import CleaningStateError
from shale.sidecar.server.metrics import NodeFigures, PartitionFigures, gather

logger = logging.getLogger(__name__)

STATUS_VERSION = 1


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
        "replica": None if p.replica is None else {
            "role": p.replica.role, "leader": p.replica.leader, "leader_epoch": p.replica.leader_epoch,
            "replicas": list(p.replica.replicas), "isr": list(p.replica.isr), "in_sync": p.replica.in_sync,
            "lag": p.replica.lag, "fetch_error": p.replica.fetch_error,
            "under_replicated": p.replica.under_replicated, "under_min_isr": p.replica.under_min_isr},
    }


class HttpApi:
    """The HTTP server of one StorageNode; `port` is the bound port (useful with port 0)."""

    def __init__(self, node, host: str, port: int) -> None:
        self.node = node
        api = self

        class Handler(_Handler):
            owner = api

        self.server = ThreadingHTTPServer((host, port), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self._thread = threading.Thread(target=self.server.serve_forever, name="shale-http", daemon=True)

    def start(self) -> HttpApi:
        self._thread.start()
        logger.info("HTTP endpoints on %s:%d (/metrics, /status, /healthz, /readyz)",
                    self.server.server_address[0], self.port)
        return self

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

    def cleaning(self, topic: str, partition_text: str, action: str) -> tuple[int, str, bytes]:
        maintenance = getattr(self.node, "maintenance", None)
        log_dir = getattr(self.node, "log_dir", None)
        if maintenance is None or log_dir is None:
            return _json(503, {"error": "the node is still loading its logs"})
        if not partition_text.isdigit() or TopicPartition(topic, int(partition_text)) not in log_dir.logs:
            return _json(404, {"error": f"no partition {topic}-{partition_text} on this node"})
        tp = TopicPartition(topic, int(partition_text))
        manager = maintenance.manager
        try:
            if action == "pause":
                count = maintenance.pause(tp)
                logger.info("cleaning of %s paused through the HTTP API (pause count %d)", tp, count)
            else:
                count = maintenance.resume(tp)
                logger.info("cleaning of %s resumed through the HTTP API (pause count %d)", tp, count)
        except CleaningStateError as exc:
            return _json(409, {"error": str(exc), "topic": topic, "partition": tp.partition,
                               "state": manager.state(tp).state.value})
        state = manager.state(tp)
        return _json(200, {"topic": topic, "partition": tp.partition, "state": state.state.value,
                           "pause_count": state.pause_count})


def _json(status: int, body: object) -> tuple[int, str, bytes]:
    return status, "application/json", json.dumps(body, indent=1, sort_keys=True).encode() + b"\n"


class _Handler(BaseHTTPRequestHandler):
    owner: HttpApi
    server_version = "shale"

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

    def do_POST(self) -> None:  # noqa: N802
        path = urlsplit(self.path).path
        route = self._cleaning_route(path)
        if route is None:
            self._send(*_json(404, {"error": f"no such endpoint: {path}"}))
            return
        self._answer(lambda: self.owner.cleaning(*route))

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

    def _send(self, status: int, content_type: str, body: bytes) -> None:
        self.send_response(status, HTTPStatus(status).phrase)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args) -> None:  # noqa: A002 - the stdlib's signature
        logger.debug("HTTP %s: " + format, self.address_string(), *args)
