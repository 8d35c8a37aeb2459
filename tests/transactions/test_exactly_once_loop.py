"""Exactly once under SIGKILL (issue 19's "How we will know"): a confluent-kafka consume-transform-produce loop
(input topic -> output topic, one transaction per batch with its input offsets, `send_offsets_to_transaction`)
runs as its own process against a real `shale serve`; at seeded random points the loop, the node (the
coordinator of everything here) or both are SIGKILLed and restarted while input keeps arriving. Checked at every
point where both were down, and at the end: for read_committed readers (confluent-kafka and aiokafka) every input
record's output is there exactly once, nothing of an aborted transaction is visible, and the committed offsets
are exactly the inputs whose outputs are visible."""

from __future__ import annotations

import asyncio
import os
import random
import subprocess
import sys
import textwrap
import time
from collections import Counter
from pathlib import Path

import confluent_kafka
from aiokafka import AIOKafkaConsumer
from aiokafka.structs import TopicPartition as AioTP
from kafka.protocol.admin.transactions import DescribeTransactionsRequest, DescribeTransactionsResponse
from kafka.protocol.consumer.group import OffsetFetchRequest, OffsetFetchResponse
from kafka.protocol.consumer.offsets import ListOffsetsRequest, ListOffsetsResponse
from kafka.protocol.producer.transaction import InitProducerIdRequest, InitProducerIdResponse

from shale.sidecar.protocol.error_codes import CONCURRENT_TRANSACTIONS, NONE
from support.clients_util import build, call
from support.node_util import ServeProcess, topic_manifest, wait_for, write_manifests
from support.txn_util import read_to_end

IN, OUT, GROUP, TXN_ID = "eos-in", "eos-out", "eos-loop", "eos-loop-1"
PARTITIONS = 2
SEED = int(os.environ.get("SHALE_EOS_SEED", "1919"))
STEPS = 20  # each: new input, a pause, then maybe a kill (~60 s in all with the restarts)
FEED = 25  # input records per step

# The loop: restarted by the test whenever it exits (any error ends it: the next instance fences its open
# transaction and starts from the committed offsets, which is how such a loop recovers). Its producer keeps its
# broker handles when the node is down (`metadata.recovery.strategy=none`): librdkafka's re-bootstrap can leave
# `send_offsets_to_transaction` waiting forever on a decommissioned group coordinator (librdkafka #5511, #5456;
# docs/transactions.md).
LOOP = textwrap.dedent(f"""
    import sys, confluent_kafka as ck
    p = ck.Producer({{"bootstrap.servers": sys.argv[1], "transactional.id": {TXN_ID!r},
                      "transaction.timeout.ms": 10000, "linger.ms": 2, "metadata.recovery.strategy": "none"}})
    p.init_transactions(30)
    c = ck.Consumer({{"bootstrap.servers": sys.argv[1], "group.id": {GROUP!r}, "isolation.level": "read_committed",
                      "enable.auto.commit": False, "auto.offset.reset": "earliest"}})
    start = c.committed([ck.TopicPartition({IN!r}, i) for i in range({PARTITIONS})], 30)  # require_stable
    c.assign([ck.TopicPartition({IN!r}, t.partition, t.offset if t.offset >= 0 else ck.OFFSET_BEGINNING)
              for t in start])
    print("ready", flush=True)
    while True:
        msgs = [m for m in c.consume(20, 0.2) if m.error() is None]
        if not msgs:
            continue
        p.begin_transaction()
        for m in msgs:
            p.produce({OUT!r}, b"out-" + m.value(), key=b"%d:%d" % (m.partition(), m.offset()), partition=m.partition())
        p.send_offsets_to_transaction(c.position(c.assignment()), c.consumer_group_metadata(), 30)
        p.commit_transaction(30)
""")


class Loop:
    """The loop's process: started, SIGKILLed, restarted when it has exited."""

    def __init__(self, bootstrap: str, log_path) -> None:
        self.bootstrap, self.log_path = bootstrap, log_path
        self.proc: subprocess.Popen | None = None
        self.starts = 0

    def ensure_running(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            with open(self.log_path, "ab") as log:
                self.proc = subprocess.Popen([sys.executable, "-c", LOOP, self.bootstrap], stdout=log, stderr=log)
            self.starts += 1

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
        if self.proc is not None:
            self.proc.wait(10)


def offset_fetch(port: int, require_stable: bool) -> list:
    req = build(OffsetFetchRequest, {"group_id": GROUP, "topics": [
        {"name": IN, "partition_indexes": list(range(PARTITIONS))}], "require_stable": require_stable}, 7)
    return call(port, req, OffsetFetchResponse).topics[0].partitions


def committed_offsets(port: int) -> dict[int, int]:
    """The group's last committed input offsets (-1: none), not waiting for open transactions."""
    parts = offset_fetch(port, require_stable=False)
    assert all(p.error_code == NONE for p in parts), parts
    return {p.partition_index: p.committed_offset for p in parts}


def stall_report(node: ServeProcess, loop: Loop) -> str:
    """What a loop that stopped committing leaves to look at: where the loop is, the transaction's state, whether
    the group's offsets are stable, both topics' LSO and end, and the tails of the loop's and the node's logs."""
    def tail(path, lines: int) -> str:
        text = path.read_text(errors="replace") if path.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    txn = call(node.port, build(DescribeTransactionsRequest, {"transactional_ids": [TXN_ID]}, 0),
               DescribeTransactionsResponse).transaction_states[0]
    stable = [(p.partition_index, p.committed_offset, p.error_code) for p in offset_fetch(node.port, True)]
    ends = {t: (end_offsets(node.port, t, 1), end_offsets(node.port, t, 0)) for t in (IN, OUT)}
    if loop.proc.poll() is None:  # where the loop waits: py-spy (a pinned dependency) reads its threads' stacks
        spy = subprocess.run([str(Path(sys.executable).with_name("py-spy")), "dump", "--native", "--pid",
                              str(loop.proc.pid)], capture_output=True, text=True, timeout=60, check=False)
        where = spy.stdout + spy.stderr
    else:
        where = f"exited with {loop.proc.returncode}"
    return (f"node running: {node.running}; loop started {loop.starts} times\n--- the loop now ---\n{where}\n"
            f"transaction {TXN_ID}: {txn}\nstable offsets (partition, offset, error): {stable}\n"
            f"(LSO, end) per topic: {ends}\n--- loop log ---\n{tail(loop.log_path, 40)}\n"
            f"--- node log ---\n{tail(node.log_path, 60)}")


def end_offsets(port: int, topic: str, isolation: int) -> dict[int, int]:
    req = build(ListOffsetsRequest, {"replica_id": -1, "isolation_level": isolation, "topics": [
        {"name": topic, "partitions": [{"partition_index": p, "timestamp": -1} for p in range(PARTITIONS)]}]}, 5)
    return {p.partition_index: p.offset for p in call(port, req, ListOffsetsResponse).topics[0].partitions}


def fence_the_loop(port: int) -> None:
    """What the loop's next instance does first: InitProducerId for its transactional id aborts its open
    transaction, so what is committed stands still while the test looks."""
    def fenced() -> bool:
        resp = call(port, build(InitProducerIdRequest, {"transactional_id": TXN_ID, "transaction_timeout_ms": 10000,
                                                        "producer_id": -1, "producer_epoch": -1}, 4),
                    InitProducerIdResponse)
        assert resp.error_code in (NONE, CONCURRENT_TRANSACTIONS), resp
        return resp.error_code == NONE

    wait_for(fenced, 30, interval=0.1, what="the loop's open transaction to be aborted")


def confluent_outputs(bootstrap: str) -> list[tuple[bytes, bytes]]:
    """(key, value) of every output a read_committed librdkafka consumer reads up to the LSO."""
    return list(read_to_end(bootstrap, OUT, PARTITIONS, timeout=30).values())


def aiokafka_outputs(bootstrap: str) -> list[tuple[bytes, bytes]]:
    async def run() -> list[tuple[bytes, bytes]]:
        consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False,
                                    isolation_level="read_committed", fetch_max_wait_ms=100)
        await consumer.start()
        tps = [AioTP(OUT, p) for p in range(PARTITIONS)]
        try:
            consumer.assign(tps)
            await consumer.seek_to_beginning(*tps)
            stop = await consumer.end_offsets(tps)  # the LSO, for read_committed
            out = []
            async with asyncio.timeout(30):
                while [tp for tp in tps if await consumer.position(tp) < stop[tp]]:
                    for records in (await consumer.getmany(timeout_ms=200)).values():
                        out += [(r.key, r.value) for r in records]
            return out
        finally:
            await consumer.stop()

    return asyncio.run(run())


def check_outputs_agree_with_offsets(node: ServeProcess, inputs: dict[int, list[bytes]]) -> int:
    """With the loop fenced: committed offsets and visible outputs are the same inputs, each once. Returns the
    number of inputs done."""
    fence_the_loop(node.port)
    wait_for(lambda: end_offsets(node.port, OUT, 1) == end_offsets(node.port, OUT, 0), 30,
             what=f"the LSO of {OUT} to reach its end once no transaction is open")
    committed = committed_offsets(node.port)
    outputs = confluent_outputs(node.bootstrap)
    counts = Counter(key for key, _ in outputs)
    twice = sorted(k for k, n in counts.items() if n > 1)
    assert not twice, f"outputs seen more than once by a read_committed reader: {twice[:10]}"
    expected = {b"%d:%d" % (p, o): b"out-" + inputs[p][o]
                for p in range(PARTITIONS) for o in range(max(committed[p], 0))}
    assert dict(outputs) == expected, (
        f"committed offsets {committed} disagree with the visible outputs: "
        f"missing {sorted(set(expected) - set(counts))[:10]}, unexpected {sorted(set(counts) - set(expected))[:10]}")
    return sum(max(c, 0) for c in committed.values())


def test_exactly_once_loop_under_kills(tmp_path):
    rng = random.Random(SEED)
    topics = write_manifests(tmp_path / "topics", topic_manifest(IN, partitions=PARTITIONS),
                             topic_manifest(OUT, partitions=PARTITIONS))
    node = ServeProcess(tmp_path / "data", topics, "--override",
                        "transaction.abort.timed.out.transaction.cleanup.interval.ms=200").start()
    loop = Loop(node.bootstrap, tmp_path / "loop.log")
    feeder = confluent_kafka.Producer({"bootstrap.servers": node.bootstrap, "enable.idempotence": True,
                                       "linger.ms": 2})
    inputs: dict[int, list[bytes]] = {p: [] for p in range(PARTITIONS)}
    sent = 0
    kills = Counter()
    try:
        for step in range(STEPS):
            for _ in range(FEED):  # input keeps arriving; the idempotent producer writes each record once
                p = sent % PARTITIONS
                feeder.produce(IN, b"in-%d" % sent, partition=p)
                inputs[p].append(b"in-%d" % sent)
                sent += 1
            assert feeder.flush(60) == 0, "the input was not all written"
            loop.ensure_running()
            time.sleep(rng.uniform(0.2, 1.5))
            action = rng.choice(["none", "loop", "loop", "node", "node", "both"])
            if action == "loop":
                loop.kill()
            elif action == "node":  # the loop lives on and must ride out the node's restart
                node.kill()
                time.sleep(rng.uniform(0.0, 1.0))
                node.start()
            elif action == "both":
                loop.kill()
                node.kill()
                node.start()
                check_outputs_agree_with_offsets(node, inputs)
            kills[action] += 1
        # No more kills: the loop must catch up with every input.
        loop.ensure_running()
        wanted = {p: len(v) for p, v in inputs.items()}

        def caught_up() -> bool:
            loop.ensure_running()
            return committed_offsets(node.port) == wanted

        try:
            wait_for(caught_up, 90, interval=0.5, what=f"the loop to commit every input ({wanted})")
        except AssertionError as stalled:
            raise AssertionError(f"{stalled}\n{stall_report(node, loop)}") from None
        loop.kill()
        assert check_outputs_agree_with_offsets(node, inputs) == sent
        assert sorted(aiokafka_outputs(node.bootstrap)) == sorted(confluent_outputs(node.bootstrap))
        uncommitted = sum(end_offsets(node.port, OUT, 0).values())
        print(f"seed {SEED}: {sent} inputs, kills {dict(kills)}, loop started {loop.starts} times, "
              f"{uncommitted} output offsets (markers and aborted records included)")
        assert kills["loop"] + kills["both"] > 0 and kills["node"] + kills["both"] > 0, kills
    finally:
        loop.kill()
        if node.proc.poll() is None:
            node.kill()
