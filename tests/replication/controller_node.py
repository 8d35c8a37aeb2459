"""A process running one `Controller` on a real etcd, for tests that SIGKILL or SIGSTOP a node's control loop.

    python controller_node.py '{"endpoint": …, "cluster": …, "node_id": 1, "session_ms": 1000,
                               "heartbeat_ms": 250, "quorum": 3, "wanted": [["topic", 0, [1, 2, 3], 3]]}'

It prints one JSON line per event: every view the loop receives (with whether this node may lead it now),
every fencing, and every change of `may_lead()` or `leads_until` as sampled on the event loop every 5 ms —
what a replica manager would see — plus the first sample after a pause. The line order is the order of
events in the process. The node wants its partitions only once it has seen `quorum` live nodes, so that a
record is created with every replica in sync.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
import time

from shale.sidecar.log.topic_partition import TopicPartition
from shale.sidecar.replication.controller import Controller, Wanted, new_incarnation
from shale.sidecar.replication.store.etcd_store import EtcdStore
from shale.sidecar.replication.store_records import NodeRegistration


def emit(**event: object) -> None:
    print(json.dumps(event, sort_keys=True), flush=True)


async def main(spec: dict) -> None:
    loop = asyncio.get_running_loop()
    me = NodeRegistration(spec["node_id"], new_incarnation(), "127.0.0.1", 9000 + spec["node_id"])
    wanted = {TopicPartition(t, p): Wanted(None if r is None else tuple(r), rf) for t, p, r, rf in spec["wanted"]}
    ready = asyncio.Event()
    controller: Controller

    def on_view(view) -> None:
        if len(view.nodes) >= spec["quorum"] and not ready.is_set():
            ready.set()
            controller.wake()
        records = {f"{tp}": {"leader": v.record.leader, "incarnation": v.record.leader_incarnation,
                             "epoch": v.record.leader_epoch, "isr": list(v.record.isr)}
                   for tp, v in view.partitions.items()}
        mine = (me.node_id, controller.incarnation)
        leads = [tp for tp, r in records.items() if (r["leader"], r["incarnation"]) == mine]
        emit(view=records, nodes={n.node_id: n.incarnation for n in view.nodes.values()},
             incarnation=controller.incarnation, may_lead=controller.may_lead(), leads=leads)

    controller = Controller(EtcdStore([spec["endpoint"]], spec["cluster"]), me,
                            session_ms=spec["session_ms"], heartbeat_ms=spec["heartbeat_ms"], loop=loop,
                            on_view=on_view, on_fenced=lambda: emit(fenced=controller.incarnation),
                            wanted=lambda: wanted if ready.is_set() else {})
    controller.start()
    emit(started=me.incarnation)
    last, sampled = None, time.monotonic()
    while True:
        now = (controller.may_lead(), controller.incarnation, controller.leads_until)
        resumed = time.monotonic() - sampled > 0.1  # the process was paused (SIGSTOP) since the last sample
        sampled = time.monotonic()
        if now != last or resumed:
            emit(may_lead=now[0], incarnation=now[1], until=now[2], resumed=resumed)
            last = now
        await asyncio.sleep(0.005)


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    asyncio.run(main(json.loads(sys.argv[1])))
