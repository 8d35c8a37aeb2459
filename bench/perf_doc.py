"""Writing one benchmark's section of docs/performance.md, leaving the other sections alone."""

from __future__ import annotations

import os
import platform

DOC = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs", "performance.md")


def update_section(heading: str, section: str, path: str = DOC) -> None:
    """Replace the section that starts with `heading` (a `## ` line) by `section`, or append it."""
    text = ""
    if os.path.exists(path):
        with open(path) as f:
            text = f.read()
    if not text.strip():
        text = "# Performance\n\n"
    start = text.find(heading)
    if start < 0:
        text = text.rstrip("\n") + "\n\n" + section
    else:
        nxt = text.find("\n## ", start + len(heading))
        text = text[:start] + section + (text[nxt + 1 :] if nxt >= 0 else "")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text.rstrip("\n") + "\n")


def machine_facts() -> str:
    """The machine a benchmark ran on, for the first line of its section."""
    cpu = "?"
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), "?")
    except OSError:
        pass
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return (f"nproc {len(os.sched_getaffinity(0))}, cpu {cpu}, memory {mem:.1f} GiB, "
            f"python {platform.python_implementation()} {platform.python_version()}, "
            f"kernel {platform.system()} {platform.release()}")
