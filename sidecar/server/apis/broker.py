"""A node's Kafka server: the partition APIs and any other APIs' handlers behind the socket server, with the fetch
purgatory they share.

The socket server (socket_server.py) knows connections, not partitions; the partition APIs (partitions.py) know
partitions, not sockets. The broker puts the two together, and lets a one-record Produce take the native path
where its answer is the partition APIs' own (one replica per partition: no replica manager).
"""

from __future__ import annotations

import logging
from typing import Callable, Mapping, Sequence

from ...protocol.codec import MAX_FRAME_BYTES
from ...replication.fetch_session import FetchSessionCache
from ...replication.replica_manager import ReplicaManager
from ...topics.registry import TopicRegistry
from ..network.channel import FailedAuthentication
from ..network.handler import API_PRODUCE, Handler
from ..network.listener_security import ListenerSecurity
from ..network.socket_server import NativeSource, SocketServer
from .fetch_purgatory import FetchPurgatory
from .listener_addresses import ListenerAddresses
from .partitions import PartitionApis
from .produce_admission import native_log
from .transaction_verification import Verify

logger = logging.getLogger(__name__)


class Broker(SocketServer):
    """A Kafka broker serving the topics a `TopicRegistry` hosts here."""

    def __init__(
        self,
        registry: TopicRegistry,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        handlers: Mapping[int, Handler] | None = None,
        cluster_id: str = "shale",
        observe: Callable[[str, float], None] | None = None,
        max_request_bytes: int = MAX_FRAME_BYTES,
        queued_max_request_bytes: int = -1,
        replicas: ReplicaManager | None = None,
        listeners: Sequence[ListenerSecurity] | None = None,
        fetch_session_slots: int = 1000,
        consumer_fetch_sessions: bool = True,
        io_thread: bool = True,
        purgatory: FetchPurgatory | None = None,
        verify_transaction: Verify | None = None,
        authorize: Callable[[dict[int, Handler]], dict[int, Handler]] | None = None,
        on_failed_authentication: FailedAuthentication | None = None,
        addresses: ListenerAddresses | None = None,
    ) -> None:
        self.registry = registry
        self.purgatory = purgatory if purgatory is not None else FetchPurgatory()
        # consumer_fetch_sessions is False under an authorizer: the topics a consumer's session reads without
        # naming them would not be authorized again (Kafka re-checks each), so consumers fetch without sessions.
        self.partitions = PartitionApis(
            registry, self.purgatory, cluster_id=cluster_id, replicas=replicas,
            fetch_sessions=FetchSessionCache(fetch_session_slots, consumer_sessions=consumer_fetch_sessions),
            addresses=addresses, verify_transaction=verify_transaction)
        table = {**self.partitions.handlers(), **(handlers or {})}
        native = None if replicas is not None else NativeSource(
            table[API_PRODUCE], native_log(registry.local_log), self.purgatory.events, self.purgatory.poke)
        super().__init__(table, listeners=listeners or [ListenerSecurity.plaintext(host, port)], observe=observe,
                         max_request_bytes=max_request_bytes, queued_max_request_bytes=queued_max_request_bytes,
                         native=native, io_thread=io_thread, authorize=authorize,
                         on_failed_authentication=on_failed_authentication,
                         advertised_at=self.partitions.addresses.own)

    @property
    def node_id(self) -> int:
        return self.registry.node.node_id

    async def start(self) -> None:
        await super().start()
        node = self.registry.node
        logger.info("broker %d listening on %s (advertised %s:%d)", node.node_id, self.where, node.host, node.port)
