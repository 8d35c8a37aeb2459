"""The cluster admin APIs: DescribeCluster (the nodes, as Metadata names them), and DescribeLogDirs and
AlterReplicaLogDirs (this node's log dirs, the partitions in them and their moves between them), answered the
way a KRaft broker answers them (ReplicaManager's describeLogDirs and alterReplicaLogDirs).
"""

from __future__ import annotations

import logging
import os
from typing import Any

from ...log.topic_partition import TopicPartition
from ...protocol import codec
from ...protocol.error_codes import (
    INVALID_REQUEST,
    KAFKA_STORAGE_ERROR,
    MISMATCHED_ENDPOINT_TYPE,
    NONE,
    UNSUPPORTED_ENDPOINT_TYPE,
    name_of,
)
from ...topics.registry import TopicRegistry
from ..network.handler import ConnectionInfo, Handler
from ..ops.log_dir_moves import LogDirMoves
from .admin_errors import client
from .authorized_operations import CLUSTER_OPERATIONS
from .listener_addresses import ListenerAddresses
from .partitions import controller_id

logger = logging.getLogger(__name__)

API_DESCRIBE_LOG_DIRS, API_DESCRIBE_CLUSTER, API_ALTER_REPLICA_LOG_DIRS = 35, 60, 34

# DescribeCluster's EndpointType: a node is a broker endpoint, never a KRaft controller endpoint.
ENDPOINT_BROKERS, ENDPOINT_CONTROLLERS = 1, 2


class ClusterAdmin:
    """The cluster and log-dir handlers; AlterReplicaLogDirs is served with `log_dir_moves` (docs/moves.md)."""

    def __init__(self, registry: TopicRegistry, cluster_id: str, addresses: ListenerAddresses,
                 log_dir_moves: LogDirMoves | None) -> None:
        self.registry = registry
        self.cluster_id = cluster_id
        # Each node's address on each listener (DescribeCluster answers a request's listener with its endpoints).
        self.addresses = addresses
        self.log_dir_moves = log_dir_moves

    def handlers(self) -> dict[int, Handler]:
        return {
            API_DESCRIBE_CLUSTER: self._describe_cluster,
            API_DESCRIBE_LOG_DIRS: self._describe_log_dirs,
            **({API_ALTER_REPLICA_LOG_DIRS: self._alter_replica_log_dirs} if self.log_dir_moves is not None else {}),
        }

    # -- DescribeCluster -------------------------------------------------------------------------

    async def _describe_cluster(self, request: codec.Request, conn: ConnectionInfo) -> dict:
        """The nodes Metadata names and its controller id; a node serves the broker endpoint only."""
        version, body = request.api_version, request.body
        endpoint = body.endpoint_type if version >= 1 else ENDPOINT_BROKERS
        if endpoint not in (ENDPOINT_BROKERS, ENDPOINT_CONTROLLERS):
            return {"error_code": INVALID_REQUEST if version == 0 else UNSUPPORTED_ENDPOINT_TYPE,
                    "error_message": f"Unsupported endpoint type {endpoint}", "cluster_id": self.cluster_id}
        if endpoint != ENDPOINT_BROKERS:
            return {"error_code": INVALID_REQUEST if version == 0 else MISMATCHED_ENDPOINT_TYPE,
                    "error_message": "The request was sent to an endpoint of type BROKER, but we wanted an endpoint "
                                     "of type CONTROLLER", "cluster_id": self.cluster_id}
        nodes = sorted(self.registry.nodes().values(), key=lambda n: n.node_id)
        shown = {n.node_id: self.addresses.address_on(n.node_id, conn.listener) for n in nodes}  # None: not on this listener
        return {
            "throttle_time_ms": 0, "error_code": NONE, "error_message": None, "endpoint_type": ENDPOINT_BROKERS,
            "cluster_id": self.cluster_id, "controller_id": controller_id(self.registry),
            "brokers": [{"broker_id": n.node_id, "host": n.host, "port": n.port, "rack": None, "is_fenced": False}
                        | shown[n.node_id] for n in nodes if shown[n.node_id] is not None],
            "authorized_operations": CLUSTER_OPERATIONS if body.include_cluster_authorized_operations else None,
        }

    # -- DescribeLogDirs and AlterReplicaLogDirs -------------------------------------------------

    async def _describe_log_dirs(self, request: codec.Request, conn: ConnectionInfo) -> dict:
        """Kafka's ReplicaManager.describeLogDirs: every log dir, each partition's size and offset lag, and the
        future replicas of log-dir moves (`is_future_key`, their lag behind the current log)."""
        body = request.body
        log_dir = self.registry.log_dir
        with log_dir.lock:
            logs = dict(log_dir.logs)
            homes = {tp: log_dir.dir_of(tp) for tp in logs}
        moves = self.log_dir_moves.snapshot() if self.log_dir_moves is not None else {}
        if body.topics is not None:
            wanted = {(t.topic, p) for t in body.topics for p in t.partitions}
            logs = {tp: log for tp, log in logs.items() if (tp.topic, tp.partition) in wanted}
        results = []
        for path in log_dir.paths:
            result: dict[str, Any] = {"error_code": NONE, "log_dir": path}
            try:
                fs = os.statvfs(path)
            except OSError as exc:
                logger.error("DescribeLogDirs: cannot read the file system of %s: %s", path, exc)
                results.append({**result, "error_code": KAFKA_STORAGE_ERROR, "topics": []})
                continue
            by_topic: dict[str, list[dict]] = {}
            for tp, log in sorted(logs.items(), key=lambda item: (item[0].topic, item[0].partition)):
                with log.lock:
                    size, end = log.size_in_bytes, log.log_end_offset
                if homes.get(tp) == path:
                    # Kafka's offset lag of a current log is max(HW - LEO, 0): 0, the HW never passing the log end.
                    by_topic.setdefault(tp.topic, []).append({"partition_index": tp.partition, "partition_size": size,
                                                              "offset_lag": 0, "is_future_key": False})
                move = moves.get(tp)
                if move is not None and move.running and move.target == path:
                    by_topic.setdefault(tp.topic, []).append({
                        "partition_index": tp.partition, "partition_size": move.bytes_copied,
                        "offset_lag": max(end - move.copied_through, 0), "is_future_key": True})
            result.update(topics=[{"name": name, "partitions": parts} for name, parts in by_topic.items()],
                          total_bytes=fs.f_blocks * fs.f_frsize, usable_bytes=fs.f_bavail * fs.f_frsize)
            results.append(result)
        return {"throttle_time_ms": 0, "error_code": NONE, "results": results}

    async def _alter_replica_log_dirs(self, request: codec.Request, conn: ConnectionInfo) -> dict:
        """Kafka's alterReplicaLogDirs: each partition moves to the dir named (docs/moves.md); the copy runs on."""
        out: dict[str, list[dict]] = {}
        for d in request.body.dirs:
            for t in d.topics:
                for p in t.partitions:
                    tp = TopicPartition(t.name, p)
                    code = self.log_dir_moves.alter(tp, d.path)
                    if code != NONE:
                        logger.info("AlterReplicaLogDirs from %s: %s to %s refused: %s", client(conn), tp, d.path,
                                    name_of(code))
                    out.setdefault(t.name, []).append({"partition_index": p, "error_code": code})
        return {"throttle_time_ms": 0,
                "results": [{"topic_name": name, "partitions": parts} for name, parts in out.items()]}
