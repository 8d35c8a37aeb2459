"""The transaction tests reuse tests/server's harness (node_util: ports, `shale serve` processes; clients_util)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "server"))
