"""What a node measures, rendered for Prometheus: `NodeCollector` turns the live figures of node_figures.py
(`gather(node)`, read at scrape time) into metric families on each scrape. The only state kept here counts
events: `RequestStats`, fed by `Broker(observe=...)`, and `SecurityStats` (refused logins from channel.py and
socket_server.py, refused checks from authorization.py).

Every family is documented in docs/metrics.md; a test fails if one is missing there.
"""

from __future__ import annotations

import bisect
import functools
import logging
import threading
from collections import Counter
from typing import Callable, Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from ...log.cleaner_manager import CleaningState
from ...log.open_files import SEGMENT_FILES
from ...log.pause_owners import KINDS
from ...protocol.error_codes import FETCH_SESSION_ID_NOT_FOUND, INVALID_FETCH_SESSION_EPOCH, name_of
from ...topics.manifests import HELD_REASONS
from .node_figures import NodeFigures, gather

try:
    from ..network._native_produce import observe as _observe
except ImportError:  # pragma: no cover - a checkout without the compiled extension
    _observe = None

logger = logging.getLogger(__name__)

# Request latency buckets: produce/metadata take milliseconds, fetch long-polls and group joins take seconds.
REQUEST_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
PARTITION_LABELS = ["topic", "partition"]


class RequestStats:
    """Count and latency histogram of answered Kafka requests per API (`Broker(observe=...)`).

    `observe` is one C call (`_native_produce.observe`), so answering a request costs no Python frame for its
    metrics (issue 18) and a scrape sees each request counted whole: per API a bytearray of doubles holds the
    count, the sum of seconds and the per-bucket counts, and `snapshot` copies each in one step under the GIL.
    Without the compiled extension a Python function does the same under a lock.
    """

    def __init__(self, buckets: tuple[float, ...] = REQUEST_BUCKETS) -> None:
        self.buckets = buckets
        self._histograms: dict[str, bytearray] = {}  # api -> doubles: count, sum, per-bucket counts (+Inf last)
        self._lock = threading.Lock()
        bounds = tuple(float(b) for b in buckets)
        self.observe: Callable[[str, float], None] = (
            functools.partial(_observe, self._histograms, bounds) if _observe is not None
            else functools.partial(self._observe_locked, bounds))

    def _observe_locked(self, bounds: tuple[float, ...], api: str, seconds: float) -> None:
        with self._lock:
            histogram = self._histograms.get(api)
            if histogram is None:
                histogram = self._histograms[api] = bytearray(8 * (len(bounds) + 3))
            values = memoryview(histogram).cast("d")
            values[0] += 1
            values[1] += seconds
            values[2 + bisect.bisect_left(bounds, seconds)] += 1  # le: a value equal to a bound belongs to it

    def snapshot(self) -> dict[str, tuple[int, float, list[int]]]:
        """api -> (count, sum of seconds, per-bucket counts with +Inf last)."""
        with self._lock:
            copies = {api: bytes(histogram) for api, histogram in list(self._histograms.items())}
        out = {}
        for api, copy in copies.items():
            values = memoryview(copy).cast("d").tolist()
            out[api] = (int(values[0]), values[1], [int(v) for v in values[2:]])
        return out


class SecurityStats:
    """Refused logins and refused authorization checks, counted where they happen (Kafka's
    failed-authentication-total per listener, and its authorizer's denied requests): they are events, not
    state anything could be read from at scrape time. Fed on the event loop, read by the scrape thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._failed: Counter[tuple[str, str, str]] = Counter()  # (listener, mechanism, reason)
        self._refused: Counter[tuple[str, str]] = Counter()  # (api, resource type)

    def failed_authentication(self, listener: str, mechanism: str, reason: str) -> None:
        """`reason`: credentials, mechanism, protocol or tls (docs/metrics.md)."""
        with self._lock:
            self._failed[listener, mechanism, reason] += 1

    def authorization_refused(self, api: str, resource_type: str) -> None:
        with self._lock:
            self._refused[api, resource_type] += 1

    def snapshot(self) -> tuple[dict[tuple[str, str, str], int], dict[tuple[str, str], int]]:
        with self._lock:
            return dict(self._failed), dict(self._refused)


# -- Prometheus ---------------------------------------------------------------------------------


class NodeCollector(Collector):
    """A custom collector: every scrape calls `gather` and renders the figures as metric families."""

    def __init__(self, node, requests: RequestStats, security: SecurityStats) -> None:
        self.node = node
        self.requests = requests
        self.security = security

    def collect(self) -> Iterator[Metric]:
        f = gather(self.node)
        yield from _partition_families(f)
        yield from _replica_families(f)
        yield from _node_families(f)
        yield from _log_dir_families(f)
        yield from _cleaner_families(f)
        yield from _task_families(f)
        yield from _request_families(self.requests)
        yield from _security_families(self.security)
        yield from _limit_families(getattr(self.node, "broker", None))
        yield from _fetch_session_families(getattr(self.node, "broker", None))
        yield from _io_thread_families(getattr(self.node, "broker", None))


def _gauge(name: str, doc: str, labels: list[str] | None = None) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, labels=labels or [])


def _partition_families(f: NodeFigures) -> Iterator[Metric]:
    size = _gauge("shale_log_size_bytes", "Bytes in the partition's segments (Kafka's Log Size).", PARTITION_LABELS)
    segments = _gauge("shale_log_segments", "Segments of the partition (Kafka's NumLogSegments).", PARTITION_LABELS)
    start = _gauge("shale_log_start_offset", "First offset readable from the partition.", PARTITION_LABELS)
    end = _gauge("shale_log_end_offset", "Offset the next appended record gets.", PARTITION_LABELS)
    state = _gauge("shale_cleaning_state",
                   "1 for the partition's current cleaning state, 0 for the others.", PARTITION_LABELS + ["state"])
    seconds = _gauge("shale_cleaning_state_seconds", "Seconds since the partition entered its cleaning state.",
                     PARTITION_LABELS)
    pauses = _gauge("shale_cleaning_pause_count", "Pauses of the partition's cleaning not yet resumed.",
                    PARTITION_LABELS)
    uncleanable = _gauge("shale_log_uncleanable", "1 if a cleaning pass of the partition failed.", PARTITION_LABELS)
    dirty = _gauge("shale_log_dirty_ratio", "Cleanable share of a compacted partition, as the cleaner ranks it.",
                   PARTITION_LABELS)
    min_dirty = _gauge("shale_log_min_cleanable_dirty_ratio",
                       "The compacted partition's min.cleanable.dirty.ratio.", PARTITION_LABELS)
    last_clean = _gauge("shale_log_last_clean_timestamp_seconds",
                        "Unix time of the partition's last completed cleaning pass by this process.", PARTITION_LABELS)
    storage = _gauge("shale_log_storage_failing",
                     "1 while the partition's last write was refused by the filesystem (e.g. a full disk).",
                     PARTITION_LABELS)
    for p in f.partitions:
        labels = [p.topic, str(p.partition)]
        size.add_metric(labels, p.size_bytes)
        segments.add_metric(labels, p.segments)
        start.add_metric(labels, p.log_start_offset)
        end.add_metric(labels, p.log_end_offset)
        for s in CleaningState:
            state.add_metric(labels + [s.value], 1.0 if p.cleaning.state is s else 0.0)
        seconds.add_metric(labels, max(f.now_ms - p.cleaning.since_ms, 0) / 1000)
        pauses.add_metric(labels, p.cleaning.pause_count)
        uncleanable.add_metric(labels, 0.0 if p.uncleanable_reason is None else 1.0)
        if p.dirty_ratio is not None:
            dirty.add_metric(labels, p.dirty_ratio)
            min_dirty.add_metric(labels, p.min_cleanable_dirty_ratio)
        if p.last_clean_ms is not None:
            last_clean.add_metric(labels, p.last_clean_ms / 1000)
        storage.add_metric(labels, 0.0 if p.storage_failure is None else 1.0)
    yield from (size, segments, start, end, state, seconds, pauses, uncleanable, dirty, min_dirty, last_clean, storage)


def _replica_families(f: NodeFigures) -> Iterator[Metric]:
    """Per-replica state with a control store (docs/replication.md); without one, only the high watermark has
    samples (the other families are listed, empty, so that dashboards and alerts know them everywhere)."""
    hw = _gauge("shale_log_high_watermark", "Offset below which records are committed: readable by consumers "
                "(Kafka's HighWatermark); the log end offset on a node without a control store.", PARTITION_LABELS)
    lso = _gauge("shale_log_last_stable_offset", "Offset below which every transaction is decided: what "
                 "read_committed consumers read up to (Kafka's LastStableOffset).", PARTITION_LABELS)
    for p in f.partitions:
        hw.add_metric([p.topic, str(p.partition)], p.high_watermark)
        lso.add_metric([p.topic, str(p.partition)], p.last_stable_offset)
    yield hw
    yield lso
    session = _gauge("shale_node_session_valid", "1 while the node's session in the control store is certainly "
                     "valid: only then may it lead and acknowledge writes (no sample without a store).")
    if f.session_valid is not None:
        session.add_metric([], 1.0 if f.session_valid else 0.0)
    yield session
    leader = _gauge("shale_replica_leader", "1 if this node's replica is the partition's leader.", PARTITION_LABELS)
    in_sync = _gauge("shale_replica_in_sync", "1 if this node's replica is in the partition's ISR.", PARTITION_LABELS)
    epoch = _gauge("shale_replica_leader_epoch", "The partition's leader epoch as this node last read it.",
                   PARTITION_LABELS)
    lag = _gauge("shale_replica_lag_offsets", "A follower's offsets behind its leader's high watermark at its last "
                 "fetch (Kafka's ConsumerLag of the replica fetcher).", PARTITION_LABELS)
    under = _gauge("shale_partition_under_replicated", "1 on the leader while the ISR is smaller than the replicas "
                   "(Kafka's UnderReplicatedPartitions).", PARTITION_LABELS)
    under_min = _gauge("shale_partition_under_min_isr", "1 on the leader while the ISR is smaller than "
                       "min.insync.replicas: acks=all writes are refused (Kafka's UnderMinIsr).", PARTITION_LABELS)
    for p in f.partitions:
        r = p.replica
        if r is None:
            continue
        labels = [p.topic, str(p.partition)]
        leader.add_metric(labels, 1.0 if r.role == "leader" else 0.0)
        in_sync.add_metric(labels, 1.0 if r.in_sync else 0.0)
        epoch.add_metric(labels, r.leader_epoch)
        if r.lag is not None:
            lag.add_metric(labels, r.lag)
        if r.role == "leader":
            under.add_metric(labels, 1.0 if r.under_replicated else 0.0)
            under_min.add_metric(labels, 1.0 if r.under_min_isr else 0.0)
    yield from (leader, in_sync, epoch, lag, under, under_min)
    yield GaugeMetricFamily("shale_reassigning_partitions", "Partitions this node leads whose replicas are being "
                            "reassigned (Kafka's ReassigningPartitions, counted by each leader; docs/moves.md).",
                            value=sum(1 for p in f.partitions if p.replica is not None and p.replica.role == "leader"
                                      and p.replica.reassigning))
    moved = CounterMetricFamily("shale_reassignment_bytes", "Bytes moved by reassignments: in, fetched by this "
                                "node as a new replica; out, sent by it as leader to new replicas (Kafka's "
                                "ReassignmentBytesIn/OutPerSec).", labels=["direction"])
    rate = _gauge("shale_replication_throttled_rate_bytes", "The replication throttle of each side in bytes per "
                  "second (leader/follower.replication.throttled.rate); no sample: not throttled.", ["side"])
    in_force = _gauge("shale_replication_throttle_in_force", "1 while a side's measured rate of throttled replicas "
                      "is above its throttle: those replicas are held back now.", ["side"])
    throttled = CounterMetricFamily("shale_replication_throttled_bytes", "Bytes of throttled replicas (out of the "
                                    "ISR, named by *.replication.throttled.replicas) per side.", labels=["side"])
    for side, t in f.throttles.items():
        moved.add_metric(["in" if side == "follower" else "out"], t.reassignment_bytes)
        if t.rate is not None:
            rate.add_metric([side], t.rate)
        in_force.add_metric([side], 1.0 if t.in_force else 0.0)
        throttled.add_metric([side], t.throttled_bytes)
    yield from (moved, rate, in_force, throttled)


def _log_dir_families(f: NodeFigures) -> Iterator[Metric]:
    """JBOD: each log dir's partitions and future replicas, and the bytes log-dir moves copied (docs/moves.md)."""
    partitions = _gauge("shale_log_dir_partitions", "Partitions whose current log is in the log dir.", ["log_dir"])
    futures = _gauge("shale_log_dir_future_replicas", "Future replicas (log-dir moves copying) in the log dir.",
                     ["log_dir"])
    free = _gauge("shale_log_dir_bytes_free", "Free bytes of the log dir's filesystem (for an unprivileged writer).",
                  ["log_dir"])
    total = _gauge("shale_log_dir_bytes_total", "Size of the log dir's filesystem.", ["log_dir"])
    floor = _gauge("shale_log_dir_min_free_bytes", "The log dir's free-space floor (log.dir.min.free.bytes, "
                   "log.dir.min.free.ratio): under it clients' Produce is refused, the rest is the cleaner's.",
                   ["log_dir"])
    refused = _gauge("shale_log_dir_produce_refused", "1 while the log dir refuses clients' Produce "
                     "(KAFKA_STORAGE_ERROR): the last one would have left less than its free-space floor free.",
                     ["log_dir"])
    refusals = CounterMetricFamily("shale_log_dir_produce_refusals", "Clients' Produce to the log dir refused "
                                   "under its free-space floor, since the start.", labels=["log_dir"])
    for d in f.log_dirs:
        partitions.add_metric([d.path], d.partitions)
        futures.add_metric([d.path], d.future_replicas)
        free.add_metric([d.path], d.bytes_free)
        total.add_metric([d.path], d.bytes_total)
        floor.add_metric([d.path], d.min_free_bytes)
        refused.add_metric([d.path], 1.0 if d.produce_refused else 0.0)
        refusals.add_metric([d.path], d.produce_refusals)
    yield from (partitions, futures, free, total, floor, refused, refusals)
    yield CounterMetricFamily("shale_log_dir_move_bytes", "Bytes copied by log-dir moves (AlterReplicaLogDirs) "
                              "since the start.", value=f.bytes_moved)


def _node_families(f: NodeFigures) -> Iterator[Metric]:
    yield GaugeMetricFamily("shale_node_ready", "1 once the node serves Kafka requests, 0 before and while stopping.",
                            value=1.0 if f.ready else 0.0)
    yield GaugeMetricFamily("shale_data_dir_bytes_used", "Bytes in the data directory's partition logs.",
                            value=f.bytes_used)
    yield GaugeMetricFamily("shale_data_dir_bytes_free", "Free bytes of the data directory's filesystem.",
                            value=f.bytes_free)
    yield GaugeMetricFamily("shale_data_dir_bytes_total", "Size of the data directory's filesystem.",
                            value=f.bytes_total)
    yield GaugeMetricFamily("shale_data_dir_storage_failing_partitions",
                            "Partitions whose last write the filesystem refused (Kafka would take the dir offline).",
                            value=len(f.storage_failing))
    yield GaugeMetricFamily("shale_manifest_errors", "Topic manifest files or documents that could not be applied.",
                            value=len(f.manifest_errors))
    yield GaugeMetricFamily("shale_topic_errors", "Declared topic changes that were refused.",
                            value=len(f.topic_errors))
    m = f.manifests
    yield CounterMetricFamily("shale_manifest_refusals", "Manifest files or documents refused (each new refusal "
                              "once); the topic keeps its last good spec and data.", value=m.refusals if m else 0)
    yield GaugeMetricFamily("shale_manifests_missing", "1 while the manifests look missing (PATH gone or not "
                            "listable, every declaring file gone): the node deletes nothing.",
                            value=1.0 if m and m.missing else 0.0)
    held = _gauge("shale_topics_held", "Topics no manifest declares any more, kept with their data, by reason.",
                  ["reason"])
    for reason in HELD_REASONS:
        held.add_metric([reason], sum(1 for r, _ in (m.held.values() if m else ()) if r == reason))
    yield held


def _cleaner_families(f: NodeFigures) -> Iterator[Metric]:
    c = f.cleaner
    figures = {
        "shale_uncleanable_partitions": ("Partitions whose cleaning failed (Kafka's uncleanable-partitions-count).",
                                         len(f.uncleanable)),
        "shale_uncleanable_bytes": ("Cleanable bytes stuck in uncleanable partitions (Kafka's uncleanable-bytes).",
                                    c.uncleanable_bytes if c else 0),
        "shale_cleaner_threads_live": ("Cleaner threads running.", c.live if c else 0),
        "shale_cleaner_threads_dead": ("Cleaner threads that died (Kafka's DeadThreadCount).", c.dead if c else 0),
        "shale_cleaner_max_dirty_ratio": ("Highest dirty ratio at the cleaner's last look (Kafka's "
                                          "max-dirty-percent / 100).", c.max_dirty_ratio if c else 0.0),
        "shale_cleaner_max_compaction_delay_seconds": ("How far past max.compaction.lag.ms the most overdue log was "
                                                       "at the last look (Kafka's max-compaction-delay-secs).",
                                                       c.max_compaction_delay_ms / 1000 if c else 0.0),
        "shale_cleaner_time_since_last_run_seconds": ("Seconds since a cleaner thread last looked for work "
                                                      "(Kafka's time-since-last-run-ms / 1000).",
                                                      max(f.now_ms - c.last_run_ms, 0) / 1000 if c else 0.0),
        "shale_cleaner_max_clean_time_seconds": ("Longest last pass over the threads (Kafka's max-clean-time-secs).",
                                                 c.max_clean_time_s if c else 0.0),
        "shale_cleaner_max_buffer_utilization_ratio": ("Fullest offset map of the threads' last passes (Kafka's "
                                                       "max-buffer-utilization-percent / 100).",
                                                       c.max_buffer_utilization if c else 0.0),
        "shale_cleaner_recopy_ratio": ("Bytes written over bytes read by the threads' last passes (Kafka's "
                                       "cleaner-recopy-percent / 100).", c.recopy_ratio if c else 0.0),
    }
    for name, (doc, value) in figures.items():
        yield GaugeMetricFamily(name, doc, value=value)
    by_kind = _gauge("shale_cleaning_pauses", "Cleaning pauses held, by owner kind (docs/moves.md): each owner "
                     "counts once.", ["kind"])
    held = Counter(o.kind for p in f.partitions if p.cleaning.pause_count for o in p.cleaning.owners)
    for kind in sorted(KINDS):
        by_kind.add_metric([kind], held.get(kind, 0))
    yield by_kind
    yield CounterMetricFamily("shale_cleaning_pauses_released_orphaned", "Persisted cleaning pauses released at "
                              "start because their owner (a move, ...) or their partition no longer existed.",
                              value=c.orphaned_pauses_released if c else 0)


def _task_families(f: NodeFigures) -> Iterator[Metric]:
    runs = CounterMetricFamily("shale_maintenance_task_runs", "Runs of each scheduled maintenance task.",
                               labels=["task"])
    errors = CounterMetricFamily("shale_maintenance_task_errors",
                                 "Failed runs and failed per-partition steps of each maintenance task.",
                                 labels=["task"])
    last = _gauge("shale_maintenance_task_last_run_timestamp_seconds",
                  "Unix time each maintenance task last ran.", ["task"])
    for t in f.tasks:
        runs.add_metric([t.name], t.runs)
        errors.add_metric([t.name], t.errors)
        if t.last_run_ms is not None:
            last.add_metric([t.name], t.last_run_ms / 1000)
    yield from (runs, errors, last)


def _request_families(requests: RequestStats) -> Iterator[Metric]:
    total = CounterMetricFamily("shale_requests", "Kafka requests answered, by API.", labels=["api"])
    duration = HistogramMetricFamily("shale_request_duration_seconds",
                                     "Time from a request's decoding to its response, by API.", labels=["api"])
    for api, (count, seconds, buckets) in sorted(requests.snapshot().items()):
        total.add_metric([api], count)
        cumulative, running = [], 0
        for bound, n in zip([*map(_le, requests.buckets), "+Inf"], buckets):
            running += n
            cumulative.append((bound, running))
        duration.add_metric([api], cumulative, seconds)
    yield from (total, duration)


def _security_families(security: SecurityStats) -> Iterator[Metric]:
    failed, refused = security.snapshot()
    logins = CounterMetricFamily("shale_failed_authentications", "Connections refused at authentication on the Kafka "
                                 "port, by listener, SASL mechanism (none: not chosen) and reason (credentials, "
                                 "mechanism, protocol, tls).", labels=["listener", "mechanism", "reason"])
    for labels, count in sorted(failed.items()):
        logins.add_metric(list(labels), count)
    checks = CounterMetricFamily("shale_authorization_refusals", "Authorization checks that refused a request or "
                                 "part of it, by API and resource type.", labels=["api", "resource_type"])
    for labels, count in sorted(refused.items()):
        checks.add_metric(list(labels), count)
    yield from (logins, checks)


def _le(bound: float) -> str:
    return repr(float(bound))


class NodeMetrics:
    """The node's Prometheus registry: the live collector plus the request statistics."""

    def __init__(self, node) -> None:
        self.requests = RequestStats()
        self.security = SecurityStats()
        self.registry = CollectorRegistry()
        self.registry.register(NodeCollector(node, self.requests, self.security))

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


def _fetch_session_families(broker) -> Iterator[Metric]:
    """Kafka's FetchSessionCache gauges: the incremental fetch sessions of followers and consumers (KIP-227)."""
    sessions = broker.partitions.fetch_sessions if broker is not None else None
    yield GaugeMetricFamily("shale_fetch_sessions", "Incremental fetch sessions held for followers and consumers "
                            "(max.incremental.fetch.session.cache.slots at most).",
                            value=len(sessions) if sessions else 0)
    yield GaugeMetricFamily("shale_fetch_session_partitions", "Partitions over all incremental fetch sessions.",
                            value=sessions.partitions_cached() if sessions else 0)
    yield CounterMetricFamily("shale_fetch_session_evictions", "Fetch sessions dropped to make room for another.",
                              value=sessions.evictions if sessions else 0)
    errors = CounterMetricFamily("shale_fetch_session_errors", "Fetches answered with a session error: an unknown "
                                 "session, or a stale epoch (a fetcher that lost an answer and did not start over).",
                                 labels=["error"])
    for code in (FETCH_SESSION_ID_NOT_FOUND, INVALID_FETCH_SESSION_EPOCH):
        errors.add_metric([name_of(code)], sessions.errors[code] if sessions else 0)
    yield errors


def _io_thread_families(broker) -> Iterator[Metric]:
    """The I/O thread's counters (io_thread.py): how much of the one-record Produce traffic skips the event loop."""
    io = broker.io if broker is not None else None
    yield CounterMetricFamily("shale_io_thread_requests", "One-record Produces answered by the I/O thread, without "
                              "the event loop.", value=io.answered if io else 0)
    yield CounterMetricFamily("shale_io_thread_handbacks", "Lent connections given back to the event loop: a request "
                              "the I/O thread does not answer, several at once, the connection's end.",
                              value=io.returned if io else 0)
    yield GaugeMetricFamily("shale_io_thread_connections", "Connections whose socket the I/O thread serves now.",
                            value=io.lent if io else 0)


def _limit_families(broker) -> Iterator[Metric]:
    """The bounds on memory and descriptors (queued.max.request.bytes, the open segment files), read live."""
    memory = broker.memory if broker is not None else None
    yield GaugeMetricFamily("shale_request_bytes_in_flight", "Bytes of requests received and not yet handled, "
                            "over all connections.", value=memory.used if memory else 0)
    yield GaugeMetricFamily("shale_request_bytes_limit", "Bytes of requests in flight above which connections "
                            "stop reading (queued.max.request.bytes).", value=memory.limit if memory else 0)
    yield CounterMetricFamily("shale_request_memory_waits", "Times a connection stopped reading because the bytes "
                              "in flight reached the limit.", value=memory.paused_total if memory else 0)
    yield CounterMetricFamily("shale_accept_errors", "accept() calls that failed for lack of descriptors or "
                              "memory (EMFILE, ENFILE, ENOBUFS, ENOMEM); accepting backs off meanwhile.",
                              value=broker.accept_errors if broker is not None else 0)
    yield GaugeMetricFamily("shale_open_segment_files", "Segment .log files open now.",
                            value=SEGMENT_FILES.open_count)
    yield GaugeMetricFamily("shale_open_segment_files_limit", "Segment .log files kept open at most (half the "
                            "descriptor limit); the least recently used is closed first.",
                            value=SEGMENT_FILES.capacity)
    yield CounterMetricFamily("shale_segment_file_evictions", "Segment .log files closed to stay within the limit.",
                              value=SEGMENT_FILES.evictions)
