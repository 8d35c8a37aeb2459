"""One storage node (`shale serve`): the log directory, its topics, the Kafka server and their lifecycle.

`StorageNode` composes the parts, each in its own module: `TopicRegistry` (what exists),
`ManifestSource` (Topic manifests, watched), `Broker` (the Kafka wire protocol) and the components
that add APIs to it. `run()` serves until `stop()` (SIGTERM/SIGINT in `shale serve`), then shuts
down cleanly: the server stops taking requests, every log is flushed, the checkpoints and the
clean-shutdown marker are written, so the next start skips recovery.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

from shale.sidecar.log.log_dir import LogDir
from shale.sidecar.server.broker import Broker
from shale.sidecar.server.manifests import ORIGIN_PREFIX, ManifestSource, watch
from shale.sidecar.server.topics import NodeAddress, TopicRegistry

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ServeOptions:
    """The command line of `shale serve`."""

    data_dir: str
    topics: str
    listen: tuple[str, int] = ("127.0.0.1", 9092)
    http: tuple[str, int] = ("127.0.0.1", 8080)
    advertised_host: str | None = None
    node_id: int = 0
    cluster_id: str = "shale"


def parse_host_port(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"expected HOST:PORT, got {text!r}")
    return host or "0.0.0.0", int(port)


class StorageNode:
    """Everything one `shale serve` process runs, started and stopped together."""

    def __init__(self, options: ServeOptions) -> None:
        self.options = options
        self.log_dir = LogDir(options.data_dir, lambda topic: self.registry.config_for(topic))
        host, port = options.listen
        advertised = options.advertised_host or (host if host not in ("0.0.0.0", "::", "") else "127.0.0.1")
        self.registry = TopicRegistry(self.log_dir, NodeAddress(options.node_id, advertised, port))
        self.manifests = ManifestSource(options.topics)
        self.topic_errors: dict[str, str] = {}  # topic -> why its declared change was not applied
        self.broker = Broker(self.registry, host=host, port=port, cluster_id=options.cluster_id)
        self.ready = False
        self._stop: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def reload_manifests(self) -> None:
        """Apply the manifests as they are now (on the event loop)."""
        self.topic_errors = self.registry.sync_origin(ORIGIN_PREFIX, self.manifests.reload())

    async def run(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        self.registry.load_api_topics()
        self.reload_manifests()
        await self.broker.start()
        if self.registry.node.port == 0:  # an ephemeral port (tests): advertise the one we got
            self.registry.node = NodeAddress(self.options.node_id, self.registry.node.host, self.broker.port)
        stop_watching = watch(self.options.topics,
                              lambda: self._loop.call_soon_threadsafe(self.reload_manifests))
        self.ready = True
        logger.info("node %d serving %d topics from %s", self.options.node_id, len(self.registry.topics),
                    self.log_dir.path)
        try:
            await self._stop.wait()
        finally:
            self.ready = False
            stop_watching()
            await self.broker.close()
            self.log_dir.close()
            logger.info("node %d stopped cleanly", self.options.node_id)

    def stop(self) -> None:
        """Ask `run()` to shut down; safe from signal handlers and other threads."""
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
