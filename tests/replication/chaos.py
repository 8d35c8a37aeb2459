"""`make chaos`: leaders killed again and again under `acks=all` load, then the invariants of docs/replication.md.

    PYTHONPATH=tests .venv/bin/python tests/replication/chaos.py               # 100 leader faults (~10 min, 2 cores)
    PYTHONPATH=tests .venv/bin/python tests/replication/chaos.py --faults 20   # a shorter run

(PYTHONPATH=tests makes the tests' helpers, tests/support/, importable, as pytest's `pythonpath` does.)

One etcd and three `shale serve --store` nodes (the fault tests' harness), a topic of 3 partitions with 3
replicas and `min.insync.replicas=2`, and two real producers writing all the time with `acks=all` and
idempotence (confluent-kafka and kafka-python, each up to 50 records in flight; never restarted). Then, fault
after fault, the leader of the next partition in turn is SIGKILLed (three times out of four) or SIGSTOPped
until a new leader is elected, then woken (the fourth); the time until each producer's first acknowledgement of a record
of that partition sent after the fault is measured; the node is started again (or woken) and the next fault waits until every
partition has its three replicas in sync again. At the end, for every partition: every acknowledged record is
at its acknowledged offset, the replicas are byte-identical below the high watermark, no leader epoch had two
leaders, and epochs never go back in the log (`fault_util.check_acknowledged`). Exit status 1 if any fails.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from support.etcd_util import EtcdServer
from support.fault_util import CLIENTS, AckedLoad, check_acknowledged
from support.node_util import start_replicated_cluster, topic_manifest

PARTITIONS = 3


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--faults", type=int, default=100, help="leader faults (default 100)")
    ap.add_argument("--workdir", default=None, help="keep the data here (default: a temporary directory, removed)")
    args = ap.parse_args(argv)
    work = Path(args.workdir or tempfile.mkdtemp(prefix="shale-chaos-"))
    work.mkdir(parents=True, exist_ok=True)
    etcd = EtcdServer(work / "etcd").start()
    cluster = start_replicated_cluster(work, etcd, 3, topic_manifest(
        "chaos", PARTITIONS, replicas=3, config={"min.insync.replicas": 2}))
    loads = [AckedLoad(client, cluster.bootstrap, "chaos", PARTITIONS).start() for client in CLIENTS]
    failovers: dict[str, list[float]] = {client: [] for client in CLIENTS}
    kinds = {"SIGKILL": 0, "SIGSTOP": 0}
    started = time.monotonic()
    ok = False  # until the run ends with every invariant checked
    try:
        for load in loads:
            load.wait_for_acks(100)
        for k in range(args.faults):
            partition = k % PARTITIONS
            old = cluster.wait_for_leader("chaos", partition)
            kind = "SIGSTOP" if k % 4 == 3 else "SIGKILL"
            sent = {load.client: load.sent for load in loads}
            fault_at = time.monotonic()
            if kind == "SIGKILL":
                cluster.kill(old.leader)
            else:
                cluster.servers[old.leader].pause()
            kinds[kind] += 1
            cluster.wait_for_leader("chaos", partition, excluding=(old.leader,), newer_than=old.leader_epoch)
            if kind == "SIGSTOP":  # woken once replaced: it must find out by itself that it leads no more
                cluster.servers[old.leader].resume()
            for load in loads:
                first = min(_wait_for_ack_since(load, sent[load.client], partition))
                failovers[load.client].append(first - fault_at)
            if kind == "SIGKILL":
                cluster.restart(old.leader, timeout=120)
            for p in range(PARTITIONS):
                cluster.wait_for_isr("chaos", p, timeout=120)
            print(f"fault {k + 1}/{args.faults}: {kind} node {old.leader} (leader of chaos-{partition} in epoch "
                  f"{old.leader_epoch}); first acks of chaos-{partition} after "
                  + ", ".join(f"{c} {failovers[c][-1]:.2f} s" for c in CLIENTS), flush=True)
        acked = {load.client: load.stop() for load in loads}
        ok = True
        for p in range(PARTITIONS):
            for client, records in acked.items():
                try:
                    check_acknowledged(cluster, "chaos", p, records)
                except AssertionError as exc:
                    ok = False
                    print(f"INVARIANT BROKEN ({client}, chaos-{p}): {exc}", flush=True)
        elapsed = time.monotonic() - started
        print(f"\n{args.faults} leader faults in {elapsed:.0f} s ({kinds['SIGKILL']} SIGKILL, {kinds['SIGSTOP']} "
              f"SIGSTOP), 3 nodes, {PARTITIONS} partitions × 3 replicas, min.insync.replicas=2")
        for load in loads:
            times = failovers[load.client]
            print(f"  {load.client}: {len(acked[load.client]):,} records acknowledged, "
                  f"{len(load.failed)} failures reported to the application; first acknowledgement after a "
                  f"fault: p50 {statistics.median(times):.2f} s, p99 {percentile(times, 0.99):.2f} s, "
                  f"max {max(times):.2f} s")
            ok &= not load.failed
        print("  invariants: " + ("every acknowledged record at its offset, replicas byte-identical below the "
                                  "high watermark, one leader per epoch" if ok else "BROKEN (see above)"))
    finally:
        for load in loads:
            load.close()
        cluster.stop()
        etcd.kill()
        if args.workdir is None and ok:
            shutil.rmtree(work, ignore_errors=True)
        elif not ok:
            print(f"the nodes' logs and data are kept in {work}")
    return 0 if ok else 1


def _wait_for_ack_since(load: AckedLoad, sent_before: int, partition: int, timeout: float = 60.0) -> list[float]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        times = load.acked_since(sent_before, partition)
        if times:
            return times
        time.sleep(0.01)
    raise AssertionError(f"{load.client}: no acknowledgement within {timeout} s of a fault "
                         f"(failures: {load.failed[-3:]})")


if __name__ == "__main__":
    sys.exit(main())
