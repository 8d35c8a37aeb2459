"""What a node measures: live figures read at scrape time (`gather(node)`), for /metrics and /status.

`gather` reads the engine's own numbers when asked — log offsets and sizes, cleaning states, CleanerManager's
dirty ratio (`cleanable_offsets` + `log_to_clean`, the figures the cleaner ranks logs by), the cleaner threads,
the maintenance tasks — so nothing is copied into counters that could drift. metrics.py renders them for
Prometheus; /status (http_api.py) serializes the same `NodeFigures`.
"""

from __future__ import annotations

import logging
import shutil
from collections import Counter
from dataclasses import dataclass, field, replace

from ...log.cleaner_manager import PartitionCleaning
from ...log.log import StorageFailure, now_ms
from ...log.topic_partition import TopicPartition

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ReplicaFigures:
    """This node's replica of a partition, with a control store: its role and what its record says."""

    role: str  # "leader", "follower" or "none" (no valid leader known)
    leader: int  # the node the record names leader, if its session is live; -1 otherwise
    leader_epoch: int
    replicas: tuple[int, ...]
    isr: tuple[int, ...]
    in_sync: bool  # this node is in the committed ISR
    min_isr: int  # min.insync.replicas capped by the replication factor (Kafka's effective min ISR)
    lag: int | None  # a follower's offsets behind its leader's high watermark at the last fetch; None otherwise
    fetch_error: str | None = None  # a follower's last fetch error, or why it refuses to follow (data kept)
    adding: tuple[int, ...] = ()  # a reassignment in progress (docs/moves.md): the replicas it adds
    removing: tuple[int, ...] = ()  # ... and those it removes

    @property
    def reassigning(self) -> bool:
        return bool(self.adding or self.removing)

    @property
    def under_replicated(self) -> bool:
        """Kafka's UnderReplicatedPartitions, counted by the leader only."""
        return self.role == "leader" and len(self.isr) < len(self.replicas)

    @property
    def under_min_isr(self) -> bool:
        """Kafka's UnderMinIsr, counted by the leader only: acks=all writes are refused."""
        return self.role == "leader" and len(self.isr) < self.min_isr


@dataclass(frozen=True)
class ThrottleFigures:
    """One side's replication throttle (throttle.py) and what reassignments moved through this node."""

    rate: int | None  # bytes per second; None: not throttled
    in_force: bool  # the measured rate is above it: throttled replicas are held back now
    throttled_bytes: int  # bytes of throttled replicas since the start
    reassignment_bytes: int  # in: fetched by this node as a newcomer; out: sent by it as leader to newcomers


@dataclass(frozen=True)
class PartitionFigures:
    topic: str
    partition: int
    served: bool  # False for a stray log: on disk, assigned to no topic here (with a store: no replica here)
    log_start_offset: int
    log_end_offset: int
    recovery_point: int
    size_bytes: int
    segments: int
    cleanup_policy: tuple[str, ...]
    cleaning: PartitionCleaning
    uncleanable_reason: str | None
    dirty_ratio: float | None  # compacted logs only
    min_cleanable_dirty_ratio: float | None  # compacted logs only
    last_clean_ms: int | None  # the last clean by this process, if any
    storage_failure: StorageFailure | None = None  # the last write the filesystem refused, until one succeeds
    high_watermark: int = 0
    replica: ReplicaFigures | None = None  # with a control store
    log_dir: str | None = None  # the log dir holding it (several with JBOD)
    move: MoveFigures | None = None  # its log-dir move, running or the last one (docs/moves.md)
    last_stable_offset: int = 0  # read_committed readers stop here (docs/transactions.md)


@dataclass(frozen=True)
class MoveFigures:
    """A log-dir move, as /status shows it."""

    id: str
    source: str
    target: str
    state: str  # pending, copying, swapping, done, failed, cancelled
    reason: str
    started_ms: int
    finished_ms: int | None
    bytes_copied: int
    bytes_remaining: int | None


@dataclass(frozen=True)
class LogDirFigures:
    path: str
    partitions: int
    future_replicas: int
    bytes_free: int
    bytes_total: int
    min_free_bytes: int = 0  # the free-space floor (log/free_space.py): under it clients' Produce is refused
    produce_refused: bool = False
    produce_refusals: int = 0  # since the start


@dataclass(frozen=True)
class CleanerThreadFigures:
    index: int
    alive: bool
    error: str


@dataclass(frozen=True)
class CleanerFigures:
    enabled: bool
    threads: tuple[CleanerThreadFigures, ...]
    live: int
    dead: int
    max_dirty_ratio: float
    max_compaction_delay_ms: int
    last_run_ms: int
    max_clean_time_s: float
    max_buffer_utilization: float
    recopy_ratio: float
    uncleanable_bytes: int
    orphaned_pauses_released: int = 0  # persisted pauses released at start: their owner was gone


@dataclass(frozen=True)
class TaskFigures:
    name: str
    interval_ms: int
    runs: int
    errors: int
    last_run_ms: int | None
    last_error: str


@dataclass(frozen=True)
class ManifestFigures:
    """What the manifests under --topics look like to the node (ManifestSource)."""

    path: str
    files: int
    missing: str | None  # why they look missing (an unmounted volume, a wrong path), or None
    held: dict[str, tuple[str, str]]  # topic -> (reason, message): kept although no manifest declares it
    refusals: int  # refusals logged since the start


@dataclass(frozen=True)
class NodeFigures:
    node_id: int
    phase: str
    ready: bool
    now_ms: int
    data_dir: str
    bytes_used: int
    bytes_free: int
    bytes_total: int
    had_clean_shutdown: bool | None  # None while the logs are still loading
    partitions: tuple[PartitionFigures, ...] = ()
    cleaner: CleanerFigures | None = None
    scheduler_alive: bool = False
    tasks: tuple[TaskFigures, ...] = ()
    manifest_errors: dict[str, str] = field(default_factory=dict)
    topic_errors: dict[str, str] = field(default_factory=dict)
    manifests: ManifestFigures | None = None
    session_valid: bool | None = None  # with a control store: the node may lead (its session is certainly valid)
    throttles: dict[str, ThrottleFigures] = field(default_factory=dict)  # with a store: "leader", "follower"
    log_dirs: tuple[LogDirFigures, ...] = ()
    bytes_moved: int = 0  # copied by log-dir moves since the start

    @property
    def storage_failing(self) -> list[PartitionFigures]:
        return [p for p in self.partitions if p.storage_failure is not None]

    @property
    def uncleanable(self) -> list[PartitionFigures]:
        return [p for p in self.partitions if p.uncleanable_reason is not None]


def gather(node) -> NodeFigures:
    """Read a StorageNode's live state. Safe from any thread, and while the node is still starting."""
    now = now_ms()
    options = node.options
    log_dir = getattr(node, "log_dir", None)
    path = log_dir.path if log_dir is not None else options.data_dir.split(",")[0]
    try:
        usage = shutil.disk_usage(path)
        free, total = usage.free, usage.total
    except OSError:
        free = total = 0
    figures = NodeFigures(node_id=options.node_id, phase=getattr(node, "phase", "starting"),
                          ready=bool(getattr(node, "ready", False)), now_ms=now, data_dir=path, bytes_used=0,
                          bytes_free=free, bytes_total=total, had_clean_shutdown=None)
    maintenance = getattr(node, "maintenance", None)
    registry = getattr(node, "registry", None)
    if log_dir is None or maintenance is None or registry is None:
        return figures
    manager, cleaner = maintenance.manager, maintenance.cleaner
    moves = getattr(node, "moves", None)
    # Moves before cleaning states: a move releases its pause before it says it ended, so a move read as
    # ended is never shown beside the pause it already released.
    move_snapshot = moves.snapshot() if moves is not None else {}
    with log_dir.lock:
        logs = dict(log_dir.logs)
    checkpoint = manager.read_checkpoint()
    uncleanable = manager.uncleanable()
    partitions = []
    replicas = getattr(node, "replicas", None)
    for tp, log in sorted(logs.items(), key=lambda item: (item[0].topic, item[0].partition)):
        try:
            partitions.append(_partition(tp, log, registry, manager, checkpoint.get(tp), uncleanable,
                                         cleaner.last_clean_ms.get(tp), now,
                                         None if replicas is None else _replica(tp, log, node)))
        except Exception as exc:  # noqa: BLE001 - e.g. deleted during the scrape: leave it out this time
            logger.debug("no figures for %s this time: %s", tp, exc)
    try:
        uncleanable_bytes = manager.uncleanable_bytes()
    except Exception as exc:  # noqa: BLE001
        logger.debug("uncleanable bytes not available: %s", exc)
        uncleanable_bytes = 0
    stats = [s.last_stats for s in cleaner.status if s.last_stats is not None]
    started = cleaner.live_threads + cleaner.dead_threads
    cleaner_figures = CleanerFigures(
        enabled=maintenance.config.log_cleaner_enable,
        threads=tuple(CleanerThreadFigures(s.index, s.alive, s.error) for s in cleaner.status[:started]),
        live=cleaner.live_threads,
        dead=cleaner.dead_threads,
        max_dirty_ratio=manager.max_dirty_ratio,
        max_compaction_delay_ms=manager.max_compaction_delay_ms,
        last_run_ms=manager.last_run_ms,
        max_clean_time_s=max((s.elapsed_s for s in stats), default=0.0),
        max_buffer_utilization=max((s.buffer_utilization for s in stats), default=0.0),
        recopy_ratio=sum(s.bytes_written for s in stats) / max(sum(s.bytes_read for s in stats), 1),
        uncleanable_bytes=uncleanable_bytes,
        orphaned_pauses_released=manager.orphaned_pauses_released,
    )
    tasks = tuple(TaskFigures(t.name, t.interval_ms, t.runs, t.errors, t.last_run_ms, t.last_error)
                  for t in maintenance.tasks.values())
    manifests = getattr(node, "manifests", None)
    controller = getattr(node, "controller", None)
    partitions, log_dirs = _log_dir_figures(log_dir, move_snapshot, partitions)
    return replace(figures, bytes_used=sum(p.size_bytes for p in partitions),
                   log_dirs=log_dirs, bytes_moved=moves.bytes_moved_total if moves is not None else 0,
                   session_valid=None if replicas is None else controller is not None and controller.may_lead(),
                   throttles={} if replicas is None else _throttles(replicas),
                   had_clean_shutdown=log_dir.had_clean_shutdown, partitions=tuple(partitions),
                   cleaner=cleaner_figures, scheduler_alive=maintenance.scheduler.alive, tasks=tasks,
                   manifest_errors=dict(getattr(manifests, "errors", {}) or {}),
                   topic_errors=dict(getattr(node, "topic_errors", {}) or {}),
                   manifests=None if manifests is None else ManifestFigures(
                       manifests.path, manifests.files_found, manifests.missing,
                       {name: (h.reason, h.message) for name, h in dict(manifests.held).items()},
                       manifests.refusals))


def _log_dir_figures(log_dir, snapshot: dict, partitions: list[PartitionFigures]) -> tuple[list[PartitionFigures],
                                                                                      tuple[LogDirFigures, ...]]:
    """Each partition's log dir and move; each log dir's partitions, future replicas and space."""
    out = []
    for p in partitions:
        tp = TopicPartition(p.topic, p.partition)
        m = snapshot.get(tp)
        out.append(replace(p, log_dir=log_dir.dir_of(tp), move=None if m is None else MoveFigures(
            m.id, m.source, m.target, m.state, m.reason, m.started_ms, m.finished_ms, m.bytes_copied,
            m.bytes_remaining)))
    futures = Counter(target.path for _, target in dict(getattr(log_dir, "futures", {})).values())
    dirs = []
    for space in log_dir.spaces:
        s = space.sample()
        dirs.append(LogDirFigures(space.path, sum(1 for p in out if p.log_dir == space.path), futures.get(space.path, 0),
                                  s.free, s.total, s.floor, space.refusing, space.refused))
    return out, tuple(dirs)


def _throttles(replicas) -> dict[str, ThrottleFigures]:
    return {side: ThrottleFigures(quota.rate if quota.enabled else None, quota.exceeded(), quota.recorded_bytes,
                                  moved)
            for side, quota, moved in (("leader", replicas.leader_quota, replicas.reassignment_bytes_out),
                                       ("follower", replicas.follower_quota, replicas.reassignment_bytes_in))}


def _replica(tp: TopicPartition, log, node) -> ReplicaFigures | None:
    """The replica manager's view of one local log (read from the HTTP thread: a snapshot of plain values)."""
    partition = node.replicas.partitions.get(tp)
    record = node.replicas.record(tp)
    if partition is None or record is None:
        return None
    fetchers = node.fetchers
    return ReplicaFigures(role=partition.state.role.value, leader=node.replicas.valid_leader(record),
                          leader_epoch=record.leader_epoch, replicas=tuple(record.replicas), isr=tuple(record.isr),
                          in_sync=node.options.node_id in record.isr,
                          min_isr=min(log.config.min_insync_replicas, len(record.replicas)),
                          lag=None if fetchers is None else fetchers.lag(tp),
                          fetch_error=None if fetchers is None else fetchers.error(tp),
                          adding=tuple(record.adding_replicas), removing=tuple(record.removing_replicas))


def _partition(tp: TopicPartition, log, registry, manager, checkpoint: int | None,
               uncleanable: dict[TopicPartition, PartitionCleaning], last_clean_ms: int | None,
               now: int, replica: ReplicaFigures | None = None) -> PartitionFigures:
    config = log.config
    with log.lock:
        start, end, recovery = log.log_start_offset, log.log_end_offset, log.recovery_point
        size, segments, storage_failure = log.size_in_bytes, len(log.segments), log.storage_failure
        high_watermark, last_stable_offset = log.high_watermark, log.last_stable_offset
    dirty = min_ratio = None
    if config.compact:  # the cleaner's own figures: the ratio it ranks this log by
        ltc = manager.log_to_clean(log, manager.cleanable_offsets(tp, log, checkpoint, now), now)
        dirty, min_ratio = ltc.cleanable_ratio, config.min_cleanable_dirty_ratio
    mark = uncleanable.get(tp)
    return PartitionFigures(
        topic=tp.topic, partition=tp.partition, served=registry.hosts(tp) and registry.log_dir.logs.get(tp) is log,
        log_start_offset=start, log_end_offset=end, recovery_point=recovery, size_bytes=size, segments=segments,
        cleanup_policy=tuple(config.cleanup_policy), cleaning=manager.state(tp),
        uncleanable_reason=mark.reason if mark is not None else None, dirty_ratio=dirty,
        min_cleanable_dirty_ratio=min_ratio, last_clean_ms=last_clean_ms, storage_failure=storage_failure,
        high_watermark=high_watermark, replica=replica, last_stable_offset=last_stable_offset,
    )
