"""The README's first command: `shale demo` starts `shale serve`, replays the walkthrough through a real client."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_demo_shows_each_key_latest_price_after_cleaning(tmp_path) -> None:
    listen, http = f"127.0.0.1:{_free_port()}", f"127.0.0.1:{_free_port()}"
    proc = subprocess.run([sys.executable, "-m", "shale.sidecar.cli", "demo", "--workdir", str(tmp_path / "d"),
                           "--listen", listen, "--http", http, "--exit"],
                          capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    produced, consumed = proc.stdout.split("consuming from the beginning")
    assert re.findall(r"produced (p\d):(\S+) at offset (\d+)", produced) == [
        ("p3", "10$", "0"), ("p5", "7$", "1"), ("p3", "11$", "2"), ("p6", "25$", "3"), ("p6", "12$", "4"),
        ("p5", "14$", "5"), ("p5", "17$", "6"), ("p7", "9$", "7")]
    # Cleaned: exactly one line per product, its latest price. p7's first price, in the active segment
    # (never cleaned), rolled the segment holding p5:17$ into the cleaner's reach, so p5:14$ is gone.
    lines = re.findall(r"offset (\d+): (p\d):(\S+)", consumed)
    assert lines == [("2", "p3", "11$"), ("4", "p6", "12$"), ("6", "p5", "17$"), ("7", "p7", "9$")]
    assert len({product for _, product, _ in lines}) == len(lines)
    # The server was stopped gracefully: the next start skips recovery.
    assert os.path.exists(tmp_path / "d" / "data" / ".kafka_cleanshutdown")
    assert "Traceback" not in proc.stderr
