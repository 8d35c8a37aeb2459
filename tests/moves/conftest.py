"""The move tests reuse tests/server's harness (node_util: `shale serve` processes, a replicated cluster on a
real etcd), tests/replication's fault helpers (fault_util: acks=all load and its checks) and the fault proxy."""

from __future__ import annotations

import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
for folder in (TESTS / "server", TESTS / "replication", TESTS):
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))
