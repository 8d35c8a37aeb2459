"""Transactions benchmark: transactional produce throughput against idempotent produce, same `shale serve`, same run.

    .venv/bin/python bench/transactions.py            # full run, updates docs/performance.md ("Transactions")
    .venv/bin/python bench/transactions.py --quick    # small run, prints only (add --markdown to write the doc)
    .venv/bin/python bench/transactions.py --profile  # also py-spy `shale serve` during the smallest transactions

One `shale serve` (fresh data directory under bench/out/, deleted at the end). The client is confluent-kafka with
bench/broker.py's workload and producer settings (1 KiB incompressible records to one partition, `acks=all`,
`linger.ms` 5), idempotence on in every mode: the baseline produces every record with no transaction; each
transactional mode runs `begin_transaction`, N records, `commit_transaction` until the phase's records are
written, so the phase pays N records' produce plus one AddPartitionsToTxn, one EndTxn, the coordinator's three
`__transaction_state` writes and the COMMIT marker per transaction. The phase ends when the last record is
acknowledged (idempotent) or the last commit returns (transactional). After each phase the partition's end is
checked: its records plus one marker per transaction, and the last stable offset at that end (nothing left
open). Modes run in a rotating order from round to round; each records the server's CPU time, so the cost per
MB is comparable whatever share of the 2 cores other work left.
"""

from __future__ import annotations

import os
import shutil
import statistics
import sys
import time
from dataclasses import dataclass, field
from typing import Callable

from confluent_kafka import Consumer, Producer, TopicPartition

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from broker import (  # noqa: E402
    OUT_DIR,
    PRODUCER_CONFIG,
    RECORD_SIZE,
    ROOT,
    Phase,
    ServerProcess,
    make_values,
    own_time,
    profile_phase,
    send,
    start_shale,
    wait_for_topics,
)
from perf_doc import bullets, measured, paragraph, records_rounds_main, section  # noqa: E402

DOC = os.path.join(ROOT, "docs", "performance.md")
SECTION = "## Transactions (issue 19)"
IDEMPOTENT = "idempotent"
FULL_RECORDS, QUICK_RECORDS, FULL_ROUNDS = 100_000, 10_000, 5
TXN_SIZES = (100, 1000, 10_000)  # records per transaction

def mode_name(size: int | None) -> str:
    return IDEMPOTENT if size is None else f"transactional, {size:,} records per transaction"


@dataclass
class Results:
    records: int
    rounds: int
    sizes: tuple[int, ...]
    phases: dict[str, list[Phase]] = field(default_factory=dict)
    wall_s: float = 0.0
    load: tuple[float, float] = (0.0, 0.0)
    profile: str = ""  # py-spy summary of a phase of the smallest transactions

    @property
    def modes(self) -> list[str]:
        return [mode_name(None)] + [mode_name(s) for s in self.sizes]

    def median(self, mode: str, attr: str = "records_per_s") -> float:
        return statistics.median(getattr(p, attr) for p in self.phases[mode])

    def ratio(self, mode: str) -> float:
        """Records/s of `mode` / idempotent's, medians of the same run."""
        return self.median(mode) / self.median(IDEMPOTENT)


def check_end(server: ServerProcess, topic: str, expected_end: int) -> None:
    """The partition ends at `expected_end` and a read_committed reader's end (the LSO) is the same offset."""
    consumer = Consumer({"bootstrap.servers": server.bootstrap, "group.id": f"bench-check-{topic}",
                         "isolation.level": "read_committed"})
    try:
        _, lso = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=30, cached=False)
    finally:
        consumer.close()
    if lso != expected_end:
        raise AssertionError(f"{topic}-0: the last stable offset is {lso}, expected {expected_end} "
                             f"(records plus one COMMIT marker per transaction)")


def produce_phase(server: ServerProcess, topic: str, count: int, values: list[bytes], size: int | None) -> Phase:
    """`count` records to partition 0 of `topic`, idempotent (`size` None) or in transactions of `size` records."""
    failures: list[str] = []

    def on_delivery(err, msg) -> None:  # failures only (delivery.report.only.error)
        if err is not None:
            failures.append(f"{msg.topic()}-{msg.partition()}: {err}")

    config = {"bootstrap.servers": server.bootstrap, "on_delivery": on_delivery, **PRODUCER_CONFIG,
              "enable.idempotence": True}
    if size is not None:
        config["transactional.id"] = f"bench-{topic}"
    producer = Producer(config)
    producer.list_topics(topic, timeout=10)  # connection and metadata before timing
    if size is not None:
        producer.init_transactions(30)
    n = len(values)
    cpu0 = server.cpu_seconds()
    t0 = time.perf_counter()
    for i in range(count):
        if size is not None and i % size == 0:
            producer.begin_transaction()
        send(producer, topic, values[i % n], i)
        if size is not None and ((i + 1) % size == 0 or i + 1 == count):
            producer.commit_transaction(60)
    left = producer.flush(120)
    elapsed = time.perf_counter() - t0
    cpu = server.cpu_seconds() - cpu0
    if left or failures:
        raise AssertionError(f"{left} records not delivered to {topic}, {len(failures)} failed: {failures[:3]}")
    transactions = 0 if size is None else -(-count // size)
    check_end(server, topic, count + transactions)
    return Phase(elapsed, count, count * RECORD_SIZE, cpu)


def run(records: int, rounds: int, sizes: tuple[int, ...] = TXN_SIZES, out_dir: str = OUT_DIR,
        profile: bool = False, say: Callable[..., None] = print) -> Results:
    """The whole benchmark; the smoke test calls it with tiny sizes."""
    started = time.perf_counter()
    load_before = os.getloadavg()[0]
    work = os.path.join(out_dir, f"txn-{os.getpid()}")
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    values = make_values()
    res = Results(records, rounds, sizes)
    kinds: list[int | None] = [None, *sizes]
    topics = [f"bench-txn-{r}-{k or 0}" for r in range(rounds) for k in kinds] + ["bench-txn-warmup"] + (
        ["bench-txn-profiled"] if profile else [])
    server: ServerProcess | None = None
    try:
        server = start_shale(work, topics, 1)
        wait_for_topics(server, topics, 1)
        produce_phase(server, "bench-txn-warmup", min(records, 5000), values, 100)  # not kept: first-use costs
        for r in range(rounds):
            for size in kinds[r % len(kinds):] + kinds[:r % len(kinds)]:
                mode = mode_name(size)
                p = produce_phase(server, f"bench-txn-{r}-{size or 0}", records, values, size)
                res.phases.setdefault(mode, []).append(p)
                say(f"  round {r + 1} {mode}: {p.records_per_s:,.0f} records/s, {p.mb_per_s:.1f} MB/s, "
                    f"server CPU {p.server_ms_per_mb:.2f} ms/MB")
        if profile:
            res.profile = profile_phase(server, lambda: "{:,.0f} records/s in transactions of {}".format(
                produce_phase(server, "bench-txn-profiled", records, values, min(sizes)).records_per_s, min(sizes)),
                work)
        errors = [ln for ln in server.log().splitlines() if " ERROR " in ln or "Traceback" in ln]
        if errors:
            raise AssertionError(f"shale serve logged errors during the benchmark: {errors[:5]}")
    finally:
        if server is not None:
            server.stop()
        shutil.rmtree(work, ignore_errors=True)
    res.wall_s = time.perf_counter() - started
    res.load = (load_before, os.getloadavg()[0])
    return res


# -- report --------------------------------------------------------------------------------------


def table(res: Results) -> str:
    lines = ["| Mode | records/s median (range) | MB/s median | / idempotent | server CPU ms/MB |",
             "|---|---:|---:|---:|---:|"]
    for mode in res.modes:
        rates = sorted(p.records_per_s for p in res.phases[mode])
        spread = f"{rates[0]:,.0f}–{rates[-1]:,.0f}" if len(rates) > 1 else f"{rates[0]:,.0f}"
        vs = "—" if mode == IDEMPOTENT else f"{res.ratio(mode):.0%}"
        lines.append(f"| {mode} | {res.median(mode):,.0f} ({spread}) | {res.median(mode, 'mb_per_s'):.1f} | {vs} "
                     f"| {res.median(mode, 'server_ms_per_mb'):.2f} |")
    return "\n".join(lines)


def cpu_per_transaction_ms(res: Results, size: int) -> float:
    """Server CPU per transaction beyond idempotent produce of the same records: the medians' CPU per MB apart,
    times a transaction's MB (meaningful where transactions are small enough for it to stand out of the noise)."""
    extra = res.median(mode_name(size), "server_ms_per_mb") - res.median(IDEMPOTENT, "server_ms_per_mb")
    return extra * size * RECORD_SIZE / 1e6


def summary(res: Results) -> str:
    smallest = min(res.sizes)
    return ("; ".join(f"{size:,} per transaction {res.ratio(mode_name(size)):.2f} of idempotent" for size in res.sizes)
            + f"; server CPU per transaction beyond idempotent, from the {smallest:,}-record transactions: "
              f"{cpu_per_transaction_ms(res, smallest):.2f} ms")


def interpretation(res: Results) -> str:
    """The section's bullets: the cost per transaction and what it does to each size, from the run's medians."""
    smallest = min(res.sizes)
    idem = sorted(p.records_per_s for p in res.phases[IDEMPOTENT])
    idem_cpu = res.median(IDEMPOTENT, "server_ms_per_mb")

    def by_size(size: int) -> str:
        mode = mode_name(size)
        spread = " (inside the rounds' spread)" if idem[0] <= res.median(mode) <= idem[-1] else ""
        return (f"{size:,} records: {res.median(mode, 'server_ms_per_mb') / idem_cpu:.1f}× idempotent's server CPU "
                f"per MB, {res.ratio(mode):.0%} of its throughput{spread}")

    out = [
        "**A transaction costs the server per transaction, not per record**: "
        f"{cpu_per_transaction_ms(res, smallest):.2f} ms of CPU here (from the {smallest:,}-record transactions) for "
        "AddPartitionsToTxn, EndTxn, three `__transaction_state` appends (Ongoing, PrepareCommit, CompleteCommit), "
        "the COMMIT marker and the verification of the transaction's first batch.",
        "**By transaction size**: " + "; ".join(by_size(size) for size in res.sizes)
        + f". Idempotent alone ranged {idem[0]:,.0f}–{idem[-1]:,.0f} records/s over the rounds.",
        "**Latency too**: the producer waits for each commit (EndTxn is answered once the markers are written) before "
        "the next transaction starts, so small transactions pay a round trip and the coordinator's appends.",
    ]
    if res.profile:
        out.append(f"**Profile** (py-spy during {smallest:,}-record transactions, `--profile`): "
                   f"{own_time(res.profile, 3)}.")
    return bullets(out)


def markdown(res: Results, facts: str, command: str) -> str:
    """This benchmark's section of docs/performance.md."""
    what = [
        "**The setup**: one `shale serve`; confluent-kafka with bench/broker.py's workload (1 KiB incompressible "
        "records to one partition, `acks=all`, `linger.ms` 5), idempotence on in every mode.",
        "**The modes**: the baseline produces with no transaction; each transactional mode runs `begin_transaction`, N "
        "records, `commit_transaction` until the phase's records are written. Modes rotate from round to round.",
        "**Per transaction** the phase pays one AddPartitionsToTxn, one EndTxn, three `__transaction_state` writes and "
        "the COMMIT marker. A phase ends at the last acknowledgement or commit; the partition's end is then checked "
        "(its records plus one marker per transaction, the last stable offset at the end).",
    ]
    return section(
        SECTION,
        measured(command, res.wall_s, res.load, f"{res.records:,} records of {RECORD_SIZE // 1024} KiB per phase, "
                 f"{res.rounds} rounds: compare the ratios and CPU per MB, taken in the same run, rather than absolute "
                 "figures. `--quick` runs small and prints only."),
        paragraph(f"Machine: {facts}."), "What is measured:", bullets(what), table(res),
        paragraph(f"Ratios (medians): {summary(res)}."), "Interpretation:", interpretation(res))


def main(argv: list[str] | None = None) -> int:
    return records_rounds_main(argv, __doc__, "transactions.py", QUICK_RECORDS, FULL_RECORDS, FULL_ROUNDS,
                               lambda records, rounds, profile: run(records, rounds, profile=profile),
                               table, summary, markdown, SECTION,
                               "py-spy shale serve during one more phase", "during the profiled phase")


if __name__ == "__main__":
    sys.exit(main())
