"""Writing one benchmark's section of docs/performance.md, leaving the other sections alone: the section's
blocks (wrapped paragraphs, bullets, tables), and the command line the record-and-round benches share."""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import re
import textwrap
from typing import Any, Callable, Iterable

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


WIDTH = 115  # the page's line length


def _wrap(text: str, first: str, rest: str) -> str:
    """`text` filled to WIDTH, never breaking inside a `code span`."""
    held = re.sub(r"`[^`]*`", lambda m: m.group(0).replace(" ", "\0"), text)
    return textwrap.fill(held, WIDTH, initial_indent=first, subsequent_indent=rest, break_long_words=False,
                         break_on_hyphens=False).replace("\0", " ")


def paragraph(text: str) -> str:
    """One paragraph, wrapped."""
    return _wrap(text, "", "")


def bullets(items: Iterable[str], numbered: bool = False) -> str:
    """A list, one wrapped `- ` (or `1. `) item per string; empty strings left out."""
    kept = [item for item in items if item]
    if numbered:
        return "\n".join(_wrap(item, f"{i}. ", "   ") for i, item in enumerate(kept, 1))
    return "\n".join(_wrap(item, "- ", "  ") for item in kept)


def section(heading: str, *blocks: str) -> str:
    """A `## ` section: the heading, then the non-empty blocks, a blank line apart."""
    return "\n\n".join([heading, *(b.strip("\n") for b in blocks if b.strip())]) + "\n"


def measured(command: str, wall_s: float, load: tuple[float, float] | list[float], then: str = "") -> str:
    """The section's first paragraph: when, the command, wall time and load; `then` adds the other modes."""
    return paragraph(f"Measured {datetime.date.today().isoformat()} with `{command}` (wall time {wall_s:.0f} s; "
                     f"one-minute load average {load[0]:.2f} before, {load[-1]:.2f} after). {then}".rstrip())


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


def records_rounds_main(argv: list[str] | None, doc: str, script: str, quick_records: int, full_records: int,
                        full_rounds: int, run: Callable[[int, int, bool], Any], table: Callable[[Any], str],
                        summary: Callable[[Any], str], markdown: Callable[[Any, str, str], str], section: str,
                        profile_help: str, profile_label: str) -> int:
    """The command line of a bench measured in records and rounds (tls.py, transactions.py): `--quick` prints
    only; a full run (or `--markdown`) rewrites its section of docs/performance.md."""
    ap = argparse.ArgumentParser(description=doc.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help=f"{quick_records:,} records, 1 round, prints only")
    ap.add_argument("--records", type=int, help="records per phase")
    ap.add_argument("--rounds", type=int, help="rounds per case")
    ap.add_argument("--profile", action="store_true", help=profile_help)
    ap.add_argument("--markdown", action="store_true", help="write docs/performance.md (the default of a full run)")
    ap.add_argument("--no-markdown", action="store_true", help="do not write docs/performance.md")
    args = ap.parse_args(argv)
    records = args.records or (quick_records if args.quick else full_records)
    rounds = args.rounds or (1 if args.quick else full_rounds)
    command = f".venv/bin/python bench/{script}" + " ".join(
        [""] + (["--quick"] if args.quick else []) + ([f"--records {args.records}"] if args.records else [])
        + ([f"--rounds {args.rounds}"] if args.rounds else []) + (["--profile"] if args.profile else []))
    facts = machine_facts()
    print(facts)
    res = run(records, rounds, args.profile)
    print(f"\n{table(res)}\n\n{summary(res)}")
    if res.profile:
        print(f"\nprofile of shale serve, {profile_label}: {res.profile}")
    print(f"\nwall time {res.wall_s:.0f} s, load average {res.load[0]:.2f} before, {res.load[1]:.2f} after")
    if (args.markdown or not args.quick) and not args.no_markdown:
        update_section(section, markdown(res, facts, command))
        print(f"wrote {os.path.relpath(DOC, os.path.dirname(os.path.dirname(DOC)))}")
    return 0
