"""The README's first command: `shale demo` writes the walkthrough, cleans it once and dumps it."""

from __future__ import annotations

import re
import subprocess
import sys


def test_demo_shows_each_key_latest_price_after_cleaning(tmp_path) -> None:
    proc = subprocess.run([sys.executable, "-m", "shale.sidecar.cli", "demo", "--data-dir", str(tmp_path / "d")],
                          capture_output=True, text=True, check=True, timeout=120)
    before, after = proc.stdout.split("after one cleaner pass")
    pairs = lambda text: re.findall(r"key: (p\d) payload: (\S+)", text)  # noqa: E731
    assert pairs(before) == [("p3", "10$"), ("p5", "7$"), ("p3", "11$"), ("p6", "25$"), ("p6", "12$"),
                             ("p5", "14$"), ("p5", "17$")]
    # Cleaned: one record per key below the active segment; p5's newest update is still in the active one.
    assert pairs(after) == [("p3", "11$"), ("p6", "12$"), ("p5", "14$"), ("p5", "17$")]
    assert "isvalid: false" not in proc.stdout
