"""One storage node (`shale serve`): the log directory, its topics, the Kafka server and their lifecycle.

`StorageNode` composes the parts, each in its own module: `TopicRegistry` (what exists),
`ManifestSource` (Topic manifests, watched), `Broker` (the Kafka wire protocol) and the components
that add APIs to it. `run()` serves until `stop()` (SIGTERM/SIGINT in `shale serve`), then shuts
down cleanly: the server stops taking requests, every log is flushed, the checkpoints and the
clean-shutdown marker are written, so the next start skips recovery.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from dataclasses import dataclass, field
from typing import Mapping

from shale.sidecar.log.log_dir import LogDir
from shale.sidecar.plural import plural
from shale.sidecar.server.admin import AdminApis
from shale.sidecar.protocol import codec
from shale.sidecar.server.broker import Broker, ConnectionInfo
from shale.sidecar.server.group_coordinator import OFFSETS_TOPIC, GroupCoordinator
from shale.sidecar.server.http_api import HttpApi
from shale.sidecar.server.maintenance import Maintenance
from shale.sidecar.server.manifests import ORIGIN_PREFIX, ManifestSource, require_path, watch
from shale.sidecar.server.metrics import NodeMetrics
from shale.sidecar.server.producer_ids import ProducerIdAllocator, init_producer_id
from shale.sidecar.server.server_config import ServerConfig
from shale.sidecar.server.topics import NodeAddress, TopicRegistry
from shale.sidecar.topic_config import TopicConfig

logger = logging.getLogger(__name__)

API_INIT_PRODUCER_ID = 22


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
    overrides: Mapping[str, str] = field(default_factory=dict)  # broker configs (`--override key=value`)


def parse_host_port(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"expected HOST:PORT, got {text!r}")
    return host or "0.0.0.0", int(port)


class StorageNode:
    """Everything one `shale serve` process runs, started and stopped together."""

    def __init__(self, options: ServeOptions) -> None:
        self.options = options
        require_path(options.topics)  # before anything is created: a wrong --topics is one line, exit 1
        self.phase = "recovering"  # -> starting -> serving -> stopping -> stopped (/status, /readyz)
        self.server_config = ServerConfig.from_mapping(options.overrides)
        self.metrics = NodeMetrics(self)
        self.http = HttpApi(self, *options.http).start()  # before the logs load: probes answer during recovery
        self.http_port = self.http.port
        try:
            # The logs on disk load before the registry exists: they open with Kafka's defaults and get
            # their topic's config when the topic is put (load_api_topics, reload_manifests).
            self.log_dir = LogDir(options.data_dir, lambda topic: self.registry.config_for(topic)
                                  if hasattr(self, "registry") else TopicConfig.from_mapping({}),
                                  producer_id_expiration_ms=self.server_config.producer_id_expiration_ms)
        except BaseException:
            self.http.close()
            raise
        if self.log_dir.is_new:
            logger.info("new data directory %s: no logs to load", self.log_dir.path)
        else:
            logger.info("loaded %s from %s (%s)", plural(len(self.log_dir.logs), "log"), self.log_dir.path,
                        "clean shutdown: recovery skipped" if self.log_dir.had_clean_shutdown
                        else "no clean-shutdown marker: recovered from the recovery points")
        host, port = options.listen
        advertised = options.advertised_host or (host if host not in ("0.0.0.0", "::", "") else "127.0.0.1")
        self.registry = TopicRegistry(self.log_dir, NodeAddress(options.node_id, advertised, port),
                                      on_change=self._topic_changed)
        self.maintenance = Maintenance(self.log_dir, self.registry, self.server_config)
        self.manifests = ManifestSource(options.topics, delete_topic_enable=self.server_config.delete_topic_enable)
        self.topic_errors: dict[str, str] = {}  # topic -> why its declared change was not applied
        self.admin = AdminApis(self.registry, self.server_config, options.cluster_id,
                               removal_held=lambda name: name in self.manifests.held)
        self.groups = GroupCoordinator(self.registry,
                                       offsets_partitions=self.server_config.offsets_topic_num_partitions,
                                       initial_rebalance_delay_ms=self.server_config.group_initial_rebalance_delay_ms)
        self.producer_ids = ProducerIdAllocator(self.log_dir.path, node_id=options.node_id)
        self.broker = Broker(self.registry, host=host, port=port, cluster_id=options.cluster_id,
                             observe=self.metrics.observe_request,
                             max_request_bytes=self.server_config.socket_request_max_bytes,
                             queued_max_request_bytes=self.server_config.queued_max_request_bytes,
                             handlers={**self.admin.handlers(), **self.groups.handlers(),
                                       API_INIT_PRODUCER_ID: self._init_producer_id})
        self.groups.on_append = self.broker.poke  # commits wake fetches of __consumer_offsets
        self.ready = False
        self.clean_shutdown = False  # set by run() once the logs are closed; `shale serve` exits 1 without it
        self._stop: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    async def _init_producer_id(self, request: codec.Request, conn: ConnectionInfo) -> dict:
        return init_producer_id(self.producer_ids, request.api_version, request.body)

    def reload_manifests(self) -> None:
        """Apply the manifests as they are now (on the event loop); ManifestSource decides what may be deleted."""
        self.topic_errors = self.registry.sync_origin(ORIGIN_PREFIX, self.manifests.reload())
        self._place_consumer_offsets()
        self.manifests.check_strays({tp.topic for tp in self.registry.strays()})

    def _place_consumer_offsets(self) -> None:
        """Put every `__consumer_offsets` partition on the cluster's lowest node id (Metadata's controller).

        The nodes share no controller to elect group coordinators, so all of them derive the same one from
        the node set the manifests name: every member of a group then finds the same coordinator, whichever
        node it asked. A single node keeps the topic unassigned (all partitions local).
        """
        spec = self.registry.topics[OFFSETS_TOPIC]
        nodes = self.registry.nodes()
        owner = nodes[min(nodes)]
        if len(nodes) == 1 and spec.assignment is None:
            return
        assignment = (owner.node_id,) * spec.partitions
        if spec.assignment != assignment:
            self.registry.put(dataclasses.replace(spec, assignment=assignment,
                                                  nodes={owner.node_id: (owner.host, owner.port)}))

    def _topic_changed(self, name: str) -> None:
        """TopicRegistry's on_change: the cleaner forgets deleted partitions and wakes for new configs; a topic
        deleted another way (DeleteTopics) is forgotten by the manifests, so no last good spec brings it back;
        fetches waiting on the topic look again, and a deleted topic's committed offsets go (onPartitionsDeleted)."""
        self.maintenance.topic_changed(name)
        self.broker.topic_changed(name)
        if name not in self.registry.topics:
            self.manifests.forget(name)
            self.groups.topic_deleted(name)

    async def run(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        self.phase = "starting"
        await self.groups.start()  # declares __consumer_offsets first: manifests cannot claim the name
        self.registry.load_api_topics()
        # Watch before the first read: a manifest written while the node starts is then never missed.
        stop_watching = watch(self.options.topics,
                              lambda: self._loop.call_soon_threadsafe(self.reload_manifests))
        self.reload_manifests()
        self.maintenance.start()
        await self.broker.start()
        if self.registry.node.port == 0:  # an ephemeral port (tests): advertise the one we got
            self.registry.node = NodeAddress(self.options.node_id, self.registry.node.host, self.broker.port)
        self.ready = True
        self.phase = "serving"
        logger.info("node %d serving %s from %s", self.options.node_id, plural(len(self.registry.topics), "topic"),
                    self.log_dir.path)
        try:
            await self._stop.wait()
        finally:
            self.ready = False
            self.phase = "stopping"
            stop_watching()
            self.groups.close()  # first: JoinGroup/SyncGroup still waiting get NOT_COORDINATOR, so connections end
            await self.broker.close()
            self.maintenance.shutdown()  # the cleaner and scheduled tasks let go of the logs
            self.clean_shutdown = self.log_dir.close()
            self.phase = "stopped"
            if self.clean_shutdown:
                logger.info("node %d stopped cleanly", self.options.node_id)
            else:
                logger.error("node %d stopped without a clean shutdown (see above): the next start recovers",
                             self.options.node_id)
            self.http.close()

    def stop(self) -> None:
        """Ask `run()` to shut down; safe from signal handlers and other threads."""
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
