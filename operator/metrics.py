"""The operator's Prometheus metrics, served on their own port.

`shale_topic_ready{namespace,topic}` is 1 while a Topic's Ready condition is True, 0 otherwise (topic =
the Topic object's name); a Topic that is deleted or handed back (managed: "false") drops its series.
`shale_operator_manifests_restored_total` counts the keys written back after they went missing from
the topics ConfigMap: anything above 0 means someone emptied, deleted or edited it.
`shale_topic_moves{namespace,topic,state}` counts the partitions whose move between pods is pending, ongoing
or failed, and `shale_topic_move_bytes_remaining{namespace,topic}` the bytes their new replicas still have to
copy (docs/moves.md); `shale_operator_scale_in_target` is the StatefulSet's scale-in target while pods are
drained before it, -1 when none waits.
kopf's liveness server serves one path only, so /metrics has its own aiohttp server (default port
8082, beside kopf's /healthz on 8081). Each operator has its own registry, so several can run in one
process (the tests do).
"""

from __future__ import annotations

from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.aiohttp import make_aiohttp_handler

from .moves import FAILED, ONGOING, PENDING

MOVE_STATES = (PENDING, ONGOING, FAILED)  # done moves are not counted: they stay in the status only


class OperatorMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.topic_ready = Gauge("shale_topic_ready", "1 if the Topic's Ready condition is True, else 0",
                                 ["namespace", "topic"], registry=self.registry)
        self.manifests_restored = Counter(
            "shale_operator_manifests_restored", "Topic keys written back to the topics ConfigMap after they went "
            "missing (emptied, deleted or edited by hand)", registry=self.registry)
        self.topic_moves = Gauge("shale_topic_moves", "Partitions of the Topic whose move between pods is in this "
                                 "state (pending, ongoing, failed)", ["namespace", "topic", "state"],
                                 registry=self.registry)
        self.move_bytes_remaining = Gauge("shale_topic_move_bytes_remaining", "Bytes the Topic's moving replicas "
                                          "still have to copy", ["namespace", "topic"], registry=self.registry)
        self.scale_in_target = Gauge("shale_operator_scale_in_target", "The storage StatefulSet's size once the "
                                     "pods above it are drained; -1: no scale-in waits", registry=self.registry)
        self.scale_in_target.set(-1)
        self._runner: web.AppRunner | None = None

    def set_ready(self, namespace: str, name: str, ready: bool) -> None:
        self.topic_ready.labels(namespace=namespace, topic=name).set(1 if ready else 0)

    def set_moves(self, namespace: str, name: str, moves: list[dict]) -> None:
        for state in MOVE_STATES:
            self.topic_moves.labels(namespace=namespace, topic=name, state=state).set(
                sum(1 for m in moves if m.get("state") == state))
        self.move_bytes_remaining.labels(namespace=namespace, topic=name).set(
            sum(int(m.get("bytesRemaining") or 0) for m in moves if m.get("state") in MOVE_STATES))

    def forget(self, namespace: str, name: str) -> None:
        for gauge, labels in [(self.topic_ready, (namespace, name)), (self.move_bytes_remaining, (namespace, name))] + [
                (self.topic_moves, (namespace, name, state)) for state in MOVE_STATES]:
            try:
                gauge.remove(*labels)
            except KeyError:
                pass

    async def start(self, host: str, port: int) -> None:
        app = web.Application()
        app.router.add_get("/metrics", make_aiohttp_handler(self.registry))
        self._runner = web.AppRunner(app, handle_signals=False)
        await self._runner.setup()
        await web.TCPSite(self._runner, host, port).start()

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
