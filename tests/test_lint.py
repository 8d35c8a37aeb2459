"""The code's lint and types, as part of the suite: ruff over every Python file (pyflakes, pycodestyle, import
order; pyproject.toml's [tool.ruff]) and `mypy --strict` over the pure modules — the log format, the codec, the
replication rules and the transaction state — whose values every other layer trusts."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent

# Pure: bytes to values and back, or rules over values; no sockets, threads or clocks of their own.
STRICT = [
    "log.varint", "log.records", "log.checkpoint", "log.topic_partition", "log.leader_epoch_cache",
    "log.producer_snapshot", "log.transaction_index", "log.compression", "log.control_records", "log.message_reader",
    "log.append_state",
    "protocol.codec", "protocol.error_codes",
    "replication.election", "replication.partition", "replication.truncation", "replication.reassignment",
    "replication.preferred_leader", "replication.store_records", "replication.topic_record",
    "replication.fetch_session", "replication.fetch_session_handler",
    "server.coordinator.transaction.transaction_state", "server.coordinator.transaction.transaction_records",
    "server.coordinator.group.offset_records", "server.coordinator.group.model",
]


def test_ruff_finds_nothing_in_any_python_file():
    run = subprocess.run([str(BIN / "ruff"), "check", "--no-cache", "."], cwd=ROOT, capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr


def test_the_pure_modules_pass_mypy_strict(tmp_path: Path):
    # pyproject maps the folders onto `shale.sidecar`; mypy reads a tree with that shape.
    (tmp_path / "shale").mkdir()
    (tmp_path / "shale" / "sidecar").symlink_to(ROOT / "sidecar")
    modules = [arg for name in STRICT for arg in ("-m", f"shale.sidecar.{name}")]
    run = subprocess.run([str(BIN / "mypy"), "--strict", "--follow-imports=silent", "--ignore-missing-imports",
                          "--namespace-packages", "--explicit-package-bases", "--cache-dir", str(tmp_path / "cache"),
                          *modules], cwd=tmp_path, env={"MYPYPATH": str(tmp_path), "PATH": "/usr/bin:/bin"},
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr
    assert f"no issues found in {len(STRICT)} source files" in run.stdout
