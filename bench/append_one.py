"""One record's `Log.append`, in process: the whole C append (`append_produced`), the leader's C check
(`prepare_produce`) alone, and `Log._assign`'s Python.

    .venv/bin/python bench/append_one.py             # 20,000 appends per round, 6 rounds; updates docs/performance.md
    .venv/bin/python bench/append_one.py --appends 2000 --rounds 2   # a short run, prints only

The unit the native request path (docs/native-request-path.md) builds on, without a server around it: each
round appends the same one-record batches to three fresh logs under bench/out/ (git-ignored, deleted at the end):
one with both C functions, one with the whole append switched off (`log._append_produced = None`, so the C check
runs inside `Log.append`'s Python) and one with both off (`Log._assign` serves), in rotating order, and times each. Two producers: plain batches (no producer id, as librdkafka sends by
default) and an idempotent producer's (producer id, rising sequences, a leader epoch stamped, as a Java client
sends by default; the whole C append leaves those to Python, so its first two columns measure the same code).
The logs of a round must end byte for byte the same, or the run fails: the baseline is the same append, not
another one. Prints µs per append (medians, with every round) and the ratio; a full run writes its section of
docs/performance.md.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import time
from typing import Callable

from shale.sidecar.log import log as log_module
from shale.sidecar.log.log import Log
from shale.sidecar.log.records import Record, encode_batch
from shale.sidecar.topic_config import TopicConfig

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from perf_doc import bullets, machine_facts, measured, paragraph, section, update_section  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT_DIR = os.path.join(ROOT, "bench", "out")
SECTION = "## One record's append, in process (issue 18)"
FULL_APPENDS, FULL_ROUNDS = 20_000, 6

PRODUCERS = ("plain", "idempotent")
# Each path: (append_produced, prepare_produce) switched on (True) or off.
PATHS = {"C append": (True, True), "C check": (False, True), "Python": (False, False)}
NOW = 1_800_000_000_000


def batches(producer: str, count: int) -> list[bytes]:
    """`count` one-record batches of 100-byte values, as `producer` sends them."""
    idempotent = producer == "idempotent"
    return [encode_batch([Record(0, NOW + i, b"key-%d" % (i % 100), b"v" * 100)],
                         producer_id=7 if idempotent else -1, producer_epoch=0 if idempotent else -1,
                         base_sequence=i if idempotent else -1) for i in range(count)]


def timed_appends(directory: str, data: list[bytes], leader_epoch: int | None) -> tuple[float, dict[str, bytes]]:
    """µs per append of `data` to a fresh log in `directory`, and the log's files afterwards."""
    log = Log(directory, TopicConfig.from_mapping({"segment.bytes": str(1 << 30)}), clock=lambda: NOW)
    try:
        started = time.perf_counter()
        for batch in data:
            log.append(batch, leader_epoch=leader_epoch)
        elapsed = time.perf_counter() - started
        log.flush()
        files = {}
        for name in sorted(os.listdir(directory)):
            with open(os.path.join(directory, name), "rb") as f:
                files[name] = f.read()
        return elapsed / len(data) * 1e6, files
    finally:
        log.close()


def run(appends: int, rounds: int, out_dir: str = OUT_DIR,
        say: Callable[..., None] = print) -> dict[str, dict[str, list[float]]]:
    """{producer: {path: µs per append, one per round}}; fails if the two paths' logs differ."""
    work = os.path.join(out_dir, f"append-one-{os.getpid()}")
    shutil.rmtree(work, ignore_errors=True)
    kernel = (log_module._append_produced, log_module._prepare_produce)
    if None in kernel:
        raise RuntimeError("the log's C kernel is not built: `pip install -e .` compiles it")
    results = {producer: {path: [] for path in PATHS} for producer in PRODUCERS}
    try:
        for producer in PRODUCERS:
            data = batches(producer, appends)
            epoch = 3 if producer == "idempotent" else None
            for r in range(rounds):
                files = {}
                names = list(PATHS)
                for i, path in enumerate(names[r % len(names):] + names[:r % len(names)]):
                    log_module._append_produced, log_module._prepare_produce = (
                        fn if on else None for fn, on in zip(kernel, PATHS[path]))
                    try:
                        directory = os.path.join(work, f"{producer}-{r}-{i}", "bench-0")  # one log name
                        us, files[path] = timed_appends(directory, data, epoch)
                    finally:
                        log_module._append_produced, log_module._prepare_produce = kernel
                    results[producer][path].append(us)
                differ = [path for path in names[1:] if files[path] != files[names[0]]]
                if differ:
                    raise AssertionError(f"{producer} round {r + 1}: the logs written by {', '.join(differ)} differ "
                                         f"from the log written by {names[0]}")
                say(f"  {producer} round {r + 1}: " + ", ".join(
                    f"{path} {results[producer][path][-1]:.2f} µs" for path in PATHS))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return results


def report(results: dict[str, dict[str, list[float]]]) -> str:
    lines = ["| one-record `Log.append`, µs (median; every round) | C append | C check | Python | C append / Python |",
             "|---|---:|---:|---:|---:|"]
    for producer, by_path in results.items():
        medians = [statistics.median(by_path[p]) for p in PATHS]
        rounds = "; ".join(", ".join(f"{x:.2f}" for x in by_path[p]) for p in PATHS)
        lines.append(f"| {producer} ({rounds}) | " + " | ".join(f"{m:.2f}" for m in medians)
                     + f" | {medians[0] / medians[-1]:.2f} |")
    return "\n".join(lines)


def medians(results: dict[str, dict[str, list[float]]]) -> dict[str, dict[str, float]]:
    """{producer: {path: median µs per append}}."""
    return {producer: {path: statistics.median(us) for path, us in by_path.items()}
            for producer, by_path in results.items()}


def interpretation(results: dict[str, dict[str, list[float]]]) -> str:
    """The section's bullets: each path against the Python one, from the run's medians."""
    med = medians(results)
    plain, idem = med["plain"], med["idempotent"]
    return bullets([
        f"**Plain batches: the whole C append {plain['C append'] / plain['Python']:.2f}× the Python path's time** "
        f"({plain['Python']:.2f} → {plain['C append']:.2f} µs); the C check alone, inside `Log.append`'s Python, "
        f"{plain['C check']:.2f} µs. This is the append a one-record Produce answered natively makes.",
        f"**An idempotent producer's batches: {idem['C check']:.2f} µs with the C check against {idem['Python']:.2f} "
        f"({idem['C check'] / idem['Python']:.2f}×).** The whole C append leaves producer state to Python, so its "
        "first two columns measure the same code.",
        "**What a server adds**: the request's decode, the answer's encode and the system calls around them; the "
        "Kafka server section above measures the whole one-record Produce (docs/native-request-path.md).",
    ])


def markdown(results: dict[str, dict[str, list[float]]], facts: str, command: str, wall_s: float,
             load: tuple[float, float]) -> str:
    """This benchmark's section of docs/performance.md."""
    what = [
        "**The paths**: *C append* = `append_produced`, the log's whole append in C; *C check* = that switched off, "
        "so `Log.append`'s Python runs with `prepare_produce` (the leader's check and offsets in C); *Python* = both "
        "off, `Log._assign` serves. Each round appends the same one-record batches (100-byte values) to a fresh log "
        "per path, the paths' order rotating.",
        "**The producers**: plain batches (no producer id, as librdkafka sends by default) and an idempotent "
        "producer's (producer id, rising sequences, a leader epoch stamped, as a Java client sends by default).",
        "**Checked**: the logs of a round must end byte for byte the same, or the run fails: the baseline is the same "
        "append, not another one.",
    ]
    return section(
        SECTION,
        measured(command, wall_s, load, "`--appends 2000 --rounds 2` is a short run that only prints."),
        paragraph(f"Machine: {facts}. One process, no server; the logs on the disk of `bench/out/`, deleted "
                  "afterwards."),
        "What is measured (µs per `Log.append` of one record, medians over the rounds):", bullets(what),
        report(results), "Interpretation:", interpretation(results))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--appends", type=int, default=FULL_APPENDS, help="appends per log and round")
    parser.add_argument("--rounds", type=int, default=FULL_ROUNDS)
    parser.add_argument("--markdown", action="store_true", help="write docs/performance.md (the default of a full run)")
    parser.add_argument("--no-markdown", action="store_true", help="do not write docs/performance.md")
    args = parser.parse_args(argv)
    full = (args.appends, args.rounds) == (FULL_APPENDS, FULL_ROUNDS)
    command = ".venv/bin/python bench/append_one.py" + ("" if full else f" --appends {args.appends} --rounds {args.rounds}")
    facts = machine_facts()
    print(facts)
    started, load_before = time.perf_counter(), os.getloadavg()[0]
    results = run(args.appends, args.rounds)
    wall_s, load = time.perf_counter() - started, (load_before, os.getloadavg()[0])
    print(f"\n{report(results)}\n\n{interpretation(results)}")
    if (args.markdown or full) and not args.no_markdown:
        update_section(SECTION, markdown(results, facts, command, wall_s, load))
        print(f"wrote {os.path.relpath(os.path.join(ROOT, 'docs', 'performance.md'), ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
