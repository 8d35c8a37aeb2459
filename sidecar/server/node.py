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
import functools
import logging
import os
from dataclasses import dataclass, field
from typing import Mapping

from ..log.log_dirs import LogDirs, parse_log_dirs
from ..log.topic_partition import TopicPartition
from ..plural import plural
from ..replication.control_store import ControlStore, StoreView
from ..replication.controller import Controller, new_incarnation
from ..replication.follower import holds_unreplicated
from ..replication.replica_fetcher import FetcherConfig, ReplicaFetchers
from ..replication.replica_manager import LeaderRebalance, ReplicaManager
from ..replication.store_records import ListenerAddress, NodeRegistration
from ..replication.throttle import ReplicationQuota
from ..security.authorizer import Authorizer
from ..security.principal import parse_super_users
from ..security.store import SecurityStore
from ..server_config import ServerConfig
from ..topic_config import TopicConfig
from ..topics.manifests import ORIGIN_PREFIX, ManifestSource, require_path, watch
from ..topics.registry import NodeAddress, TopicRegistry
from .apis.acl_admin import AclAdmin
from .apis.admin import AdminApis
from .apis.authorization import authorize_handlers
from .apis.broker import Broker
from .apis.fetch_purgatory import FetchPurgatory
from .apis.listener_addresses import ListenerAddresses
from .apis.reassignments import Reassignments
from .apis.store_topics import StoreTopics
from .coordinator.find_coordinator import FindCoordinator
from .coordinator.group.coordinator import GroupCoordinator
from .coordinator.group.offset_records import OFFSETS_TOPIC
from .coordinator.runtime import LocalPartitionWriter, ReplicatedPartitionWriter
from .coordinator.transaction.coordinator import TransactionCoordinator
from .coordinator.transaction.producer_ids import ProducerIdAllocator
from .coordinator.transaction.transaction_records import TRANSACTION_STATE_TOPIC
from .coordinator.transaction.txn_markers import MarkerChannels
from .network.channel import SASL_HANDLERS
from .network.inter_broker import InterBrokerClient
from .network.listener_security import listener_securities, split_settings
from .ops.dynamic_broker_configs import DynamicBrokerConfigs
from .ops.http_api import HttpApi, HttpSecurity
from .ops.log_dir_moves import LogDirMoves
from .ops.maintenance import Maintenance
from .ops.metrics import NodeMetrics
from .ops.security_sync import SharedSecurity

logger = logging.getLogger(__name__)

SERVICE_ACCOUNT_NAMESPACE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"


@dataclass(frozen=True)
class ServeOptions:
    """The command line of `shale serve`."""

    data_dir: str
    topics: str
    listen: tuple[str, int] = ("127.0.0.1", 9092)
    http: tuple[str, int] = ("127.0.0.1", 8080)
    advertised_host: str | None = None
    advertised_port: int | None = None  # None: the listen port
    node_id: int = 0
    cluster_id: str = "shale"
    store: str | None = None  # the control store: "etcd://h:p[,h:p]" or "kubernetes"; None = one replica, no store
    overrides: Mapping[str, str] = field(default_factory=dict)  # broker configs (`--override key=value`)
    http_security: HttpSecurity = HttpSecurity()  # TLS and the authentication of changes on the HTTP port


def open_store(url: str, cluster_id: str) -> ControlStore:
    """The control store `--store` names: `etcd://h:p[,h:p]`, or `kubernetes` — as kubectl finds its API server:
    in a pod the in-cluster config (namespace: the pod's service account's), elsewhere $KUBECONFIG or
    ~/.kube/config (namespace: the current context's, else "default"). ValueError for anything else."""
    if url.startswith("etcd://"):
        from ..replication.store.etcd_store import EtcdStore, parse_endpoints

        return EtcdStore(parse_endpoints(url), cluster_id)
    if url == "kubernetes":
        import kubernetes

        from ..replication.store.kube_store import KubeStore

        try:
            kubernetes.config.load_incluster_config()
            with open(SERVICE_ACCOUNT_NAMESPACE, encoding="utf-8") as f:
                namespace = f.read().strip()
        except kubernetes.config.ConfigException as in_pod:
            # Read now, not at the client's import (its default is fixed then); a list of paths merges, as kubectl's.
            config_file = os.environ.get("KUBECONFIG") or None
            try:
                kubernetes.config.load_kube_config(config_file=config_file)
                _, context = kubernetes.config.list_kube_config_contexts(config_file=config_file)
            except (kubernetes.config.ConfigException, OSError) as exc:
                raise ValueError(f"--store kubernetes: not in a pod ({in_pod}) and no usable kubeconfig "
                                 f"($KUBECONFIG or ~/.kube/config): {exc}") from None
            namespace = context.get("context", {}).get("namespace") or "default"
        return KubeStore(kubernetes.client.ApiClient(), namespace, cluster_id)
    raise ValueError(f"--store {url!r}: expected etcd://HOST:PORT[,HOST:PORT...] or kubernetes")


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
        # The store's address is checked before anything is created too; it is first used once the node listens.
        self.store: ControlStore | None = None if options.store is None else open_store(options.store,
                                                                                         options.cluster_id)
        self.phase = "recovering"  # -> starting -> serving -> stopping -> stopped (/status, /readyz)
        listener_settings, broker_settings = split_settings(options.overrides)
        self.server_config = ServerConfig.from_mapping(broker_settings)
        # The Kafka port's listeners, their TLS files read, before anything is created (a bad one: exit 1); SASL
        # sessions look credentials up in the security store, opened with the log directory below.
        self.listener_config, self.listeners = listener_securities(
            listener_settings, options.listen, options.advertised_host,
            lambda user, mechanism: self.security.scram_credential(user, mechanism))
        self.inter_broker = InterBrokerClient.from_settings(listener_settings, self.listener_config)
        self.metrics = NodeMetrics(self)
        self.http = HttpApi(self, *options.http, options.http_security).start()  # before the logs load: probes answer during recovery
        self.http_port = self.http.port
        registry: TopicRegistry | None = None  # built on the log dirs below, once they loaded

        def config_for(topic: str) -> TopicConfig:
            """The log dirs' topic configs: the registry's; while they load, before it exists, Kafka's defaults."""
            return registry.config_for(topic) if registry is not None else TopicConfig.from_mapping({})

        try:
            # The logs on disk load before the registry exists: they open with Kafka's defaults and get
            # their topic's config when the topic is put (load_api_topics, reload_manifests).
            # Every log dir (`log.dirs`, else each --data-dir; JBOD, docs/moves.md); node files live in the first.
            self.log_dir = LogDirs(parse_log_dirs(self.server_config.log_dirs or options.data_dir), config_for,
                                   producer_id_expiration_ms=self.server_config.producer_id_expiration_ms,
                                   floor=self.server_config.free_floor())
            # The node's one security state (ACLs, SCRAM credentials): the authorizer, the ACL and SCRAM admin
            # APIs and the SASL sessions all read this store; an unreadable file stops the start (docs/security.md).
            self.authorizer = Authorizer(parse_super_users(self.server_config.super_users),
                                         self.server_config.allow_everyone_if_no_acl_found)
            self.security = SecurityStore.open(self.log_dir.path, self.authorizer)
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
        address = NodeAddress(options.node_id, advertised, options.advertised_port or port)
        if self.listener_config is not None:  # the node is known by its inter-broker listener (listed first)
            inter_broker = self.listeners[0].advertised
            address = NodeAddress(options.node_id, inter_broker.host, inter_broker.port)
        self.registry = registry = TopicRegistry(self.log_dir, address, on_change=self._topic_changed)
        # Fetches parked until their partitions change: appends, commits, markers and high watermarks wake them.
        self.purgatory = FetchPurgatory()
        # With a control store, the store's partition records decide where replicas live and who leads
        # (docs/replication.md); the controller thread and the fetchers start with the event loop (run()).
        self.replicas: ReplicaManager | None = None
        self.controller: Controller | None = None
        self.fetchers: ReplicaFetchers | None = None
        if self.store is not None:
            config = self.server_config
            quota = functools.partial(ReplicationQuota, window_num=config.replication_quota_window_num,
                                      window_s=config.replication_quota_window_size_seconds)
            self.replicas = ReplicaManager(
                self.registry, replica_lag_time_max_ms=config.replica_lag_time_max_ms,
                default_replication_factor=config.default_replication_factor,
                leader_quota=quota(config.leader_replication_throttled_rate),
                follower_quota=quota(config.follower_replication_throttled_rate),
                leader_rebalance=LeaderRebalance(config.leader_imbalance_check_interval_seconds * 1000,
                                                 config.leader_imbalance_per_broker_percentage)
                if config.auto_leader_rebalance_enable else None,
                wake_fetches=self.purgatory.poke, wake_consumers=self.purgatory.poke_consumers)
        # Each node's address on each listener: the socket server fills this node's; Metadata, FindCoordinator and
        # DescribeCluster answer a request's listener with them.
        self.addresses = ListenerAddresses(options.node_id, self.replicas)
        self.maintenance = Maintenance(self.log_dir, self.registry, self.server_config)
        self.moves = LogDirMoves(self.log_dir, self.maintenance, run_exclusive=self._on_loop,
                                 io_max_bytes_per_second=self.server_config.replica_alter_log_dirs_io_max_bytes_per_second)
        self.moves.load()  # the persisted cleaning pauses: held while their owners exist, released otherwise
        self.manifests = ManifestSource(options.topics, delete_topic_enable=self.server_config.delete_topic_enable)
        self.topic_errors: dict[str, str] = {}  # topic -> why its declared change was not applied
        # The admin API writes topic records through a store client of its own (a store is used from one thread).
        store_topics = None if options.store is None else StoreTopics(open_store(options.store, options.cluster_id),
                                                                      self.registry)
        self.admin = AdminApis(self.registry, self.server_config, options.cluster_id,
                               removal_held=lambda name: name in self.manifests.held, store_topics=store_topics,
                               log_dir_moves=self.moves, dynamic_broker={} if self.replicas is None else {
                                   "leader.replication.throttled.rate": self.replicas.leader_quota.set_rate,
                                   "follower.replication.throttled.rate": self.replicas.follower_quota.set_rate},
                               addresses=self.addresses,
                               dynamic_file=DynamicBrokerConfigs.in_dir(self.log_dir.paths[0]))
        self.authorizing = bool(self.server_config.authorizer_class_name)
        # With etcd the cluster shares one security state (security_sync.py); on Kubernetes the operator writes it.
        self.shared_security: SharedSecurity | None = None
        if options.store is not None and options.store.startswith("etcd://"):
            self.shared_security = SharedSecurity.on_etcd(options.store, options.cluster_id, self.security)
        # The coordinators: both write their internal topic through one writer (a commit or a marker wakes the
        # fetches of its partition; with a store, writes are in the leader epoch and wait for the ISR), and follow
        # the partitions this node leads (_coordinator_follows_leadership). Groups first: the transaction coordinator
        # makes their TxnOffsetCommit offsets visible when its markers reach `__consumer_offsets`.
        config = self.server_config
        writer = LocalPartitionWriter(self.purgatory.poke) if self.replicas is None else \
            ReplicatedPartitionWriter(self.replicas, options.node_id, self.purgatory.poke)
        self.groups = GroupCoordinator(self.registry, writer=writer,
                                       offsets_partitions=config.offsets_topic_num_partitions,
                                       initial_rebalance_delay_ms=config.group_initial_rebalance_delay_ms,
                                       replication_factor=config.offsets_topic_replication_factor
                                       if self.replicas is not None else None)
        self.producer_ids = ProducerIdAllocator(self.log_dir.path, node_id=options.node_id)
        # Transactions: on a single node, or with a store where every node may lead state partitions (markers to the
        # other nodes' partitions go by WriteTxnMarkers on the inter-broker listener).
        self.transactions = TransactionCoordinator(
            self.registry, self.producer_ids, offsets_partitions=config.offsets_topic_num_partitions,
            partitions=config.transaction_state_log_num_partitions,
            max_timeout_ms=config.transaction_max_timeout_ms,
            abort_interval_ms=config.transaction_abort_timed_out_transaction_cleanup_interval_ms,
            id_expiration_ms=config.transactional_id_expiration_ms,
            replication_factor=config.transaction_state_log_replication_factor,
            min_isr=min(config.transaction_state_log_min_isr, config.transaction_state_log_replication_factor),
            serving=lambda: self.replicas is not None or len(self.registry.nodes()) == 1,
            writer=writer, complete_txn_offsets=self.groups.complete_txn_offsets,
            channels=None if self.replicas is None else MarkerChannels(self.inter_broker.connect,
                                                                       f"shale-txn-markers-{options.node_id}"))
        self.broker = Broker(self.registry, host=host, port=port, cluster_id=options.cluster_id,
                             observe=self.metrics.requests.observe,
                             max_request_bytes=self.server_config.socket_request_max_bytes,
                             queued_max_request_bytes=self.server_config.queued_max_request_bytes,
                             fetch_session_slots=self.server_config.max_incremental_fetch_session_cache_slots,
                             consumer_fetch_sessions=not self.authorizing,
                             replicas=self.replicas, listeners=self.listeners, purgatory=self.purgatory,
                             handlers={**SASL_HANDLERS, **self.admin.handlers(), **self.groups.handlers(),
                                       **FindCoordinator(self.groups, self.transactions, self.addresses).handlers(),
                                       **Reassignments(self.registry, store_topics, self._store_view).handlers(),
                                       **AclAdmin(self.security, authorizer_enabled=self.authorizing,
                                                  shared=self.shared_security).handlers(),
                                       **self.transactions.handlers()},
                             # Produce asks the coordinator about a producer's first transactional batch to a partition.
                             verify_transaction=self.transactions.verify_partition,
                             # every API checked as Kafka's broker checks it (authorization.py)
                             authorize=functools.partial(authorize_handlers, authorizer=self.authorizer,
                                                         topic_name=self.registry.topic_named_by,
                                                         on_refused=self.metrics.security.authorization_refused)
                             if self.authorizing else None,
                             on_failed_authentication=self.metrics.security.failed_authentication,
                             addresses=self.addresses)
        self.ready = False
        self.clean_shutdown = False  # set by run() once the logs are closed; `shale serve` exits 1 without it
        self._stop: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def reload_manifests(self) -> None:
        """Apply the manifests as they are now (on the event loop); ManifestSource decides what may be deleted."""
        self.topic_errors = self.registry.sync_origin(ORIGIN_PREFIX, self.manifests.reload())
        if self.replicas is None:  # with a store, its records place __consumer_offsets like any topic
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
        assignment = ((owner.node_id,),) * spec.partitions
        if spec.assignment != assignment:
            self.registry.put(dataclasses.replace(spec, assignment=assignment,
                                                  nodes={owner.node_id: (owner.host, owner.port)}))

    def _store_view(self) -> StoreView:
        """This node's latest view of the control store (an empty one without a store)."""
        return self.replicas.view if self.replicas is not None else StoreView(revision="")

    def _topic_changed(self, name: str) -> None:
        """TopicRegistry's on_change: the cleaner forgets deleted partitions and wakes for new configs; a topic
        deleted another way (DeleteTopics) is forgotten by the manifests, so no last good spec brings it back;
        fetches waiting on the topic look again, and a deleted topic's committed offsets go (onPartitionsDeleted)."""
        self.maintenance.topic_changed(name)
        self.purgatory.topic_changed(name)
        if self.replicas is not None:
            # The partitions the controller may still have written for it (the last snapshot it read), not only
            # those of the last view: a record it re-created after another node deleted the topic's (it still
            # wanted them) may not be in a view yet, and would stay in the store for good.
            had = {tp for tp in self.replicas.wanted() if tp.topic == name}
            self.replicas.topics_changed(name)
            if self.controller is not None:
                if name not in self.registry.topics:  # its records go too; every node that deletes it says so
                    for tp in had | {tp for tp in self.replicas.view.partitions if tp.topic == name}:
                        self.controller.delete(tp)
                self.controller.wake()
        if name not in self.registry.topics:
            self.manifests.forget(name)
            self.groups.topic_deleted(name)

    def _on_view(self, view: StoreView) -> None:
        """The controller read the store: the API's topics follow their records (first: replicas need their
        topics), replicas follow theirs, the coordinator its partitions."""
        partitions = {name: spec.partitions for name, spec in self.registry.topics.items()}
        try:
            removed = self.registry.apply_store_topics({name: v.record for name, v in view.topics.items()},
                                                       view.topics_complete)
        except OSError as exc:  # a deletion failed (logged by the log dir); the replicas still follow this view
            logger.error("node %d: applying the topic records of the control store failed: %s",
                         self.options.node_id, exc)
            removed = []
        for name in removed:
            # Every partition the topic had, not only those in a view: a record this node's controller created
            # from the topic while it still served it must go too (deletion is idempotent).
            for partition in range(partitions[name]):
                self.controller.delete(TopicPartition(name, partition))
        self.transactions.declare_if_in({tp.topic for tp in view.partitions})  # before its records apply
        self.replicas.apply_view(view)
        self._coordinator_follows_leadership()

    def _on_fenced(self) -> None:
        self.replicas.on_fenced()
        self._coordinator_follows_leadership()

    def _coordinator_follows_leadership(self) -> None:
        """Groups and transactional ids are coordinated where their `__consumer_offsets` / `__transaction_state`
        partition is led: loaded on election (from the replicated log), unloaded on resignation, as Kafka's
        onElection / onResignation do."""
        led = {tp: p.leader_epoch for tp, p in self.replicas.partitions.items() if self.replicas.leader(tp) is not None}
        self.groups.leadership_changed({tp.partition: e for tp, e in led.items() if tp.topic == OFFSETS_TOPIC})
        self.transactions.leadership_changed({tp.partition: e for tp, e in led.items()
                                              if tp.topic == TRANSACTION_STATE_TOPIC})

    def _start_replication(self) -> None:
        """Open the session and follow the store (after the broker listens: the session carries its port)."""
        config = self.server_config
        # Logs holding records from before replication are announced, so that a missing record names this
        # node their leader rather than an empty replica (election._create).
        unreplicated = tuple(sorted(tp for tp, log in self.log_dir.logs.items() if holds_unreplicated(log)))
        if unreplicated:
            logger.info("node %d holds records written before replication in %s", self.options.node_id,
                        ", ".join(map(str, unreplicated)))
        # Every advertised listener is registered: the others answer each listener's requests with its address.
        listeners = tuple(sorted(ListenerAddress(name, host, port)
                                 for name, (host, port) in self.addresses.own.items()))
        me = NodeRegistration(self.options.node_id, new_incarnation(), self.registry.node.host,
                              self.registry.node.port, unreplicated=unreplicated, listeners=listeners)
        self.controller = Controller(self.store, me, session_ms=config.broker_session_timeout_ms,
                                     heartbeat_ms=config.broker_heartbeat_interval_ms, loop=self._loop,
                                     on_view=self._on_view, on_fenced=self._on_fenced, wanted=self.replicas.wanted)
        self.fetchers = ReplicaFetchers(self.options.node_id, self.log_dir.logs.get,
                                        FetcherConfig.from_server_config(config),
                                        on_refused=self.controller.leader_refused, connect=self.inter_broker.connect,
                                        throttle=self.replicas)
        self.replicas.attach(self.controller, self.fetchers)
        self.replicas.topics_changed()
        self.replicas.start()
        self.controller.start()
        logger.info("node %d: replication on, control store %s, cluster %s", self.options.node_id,
                    self.options.store, self.options.cluster_id)

    async def _stop_replication(self) -> None:
        """End the session first, so the others elect new leaders at once rather than after its timeout."""
        if self.shared_security is not None:
            await asyncio.to_thread(self.shared_security.close)
        if self.controller is not None:
            await asyncio.to_thread(self.controller.stop)
        if self.admin.store_topics is not None:
            await asyncio.to_thread(self.admin.store_topics.close)
        if self.fetchers is not None:
            await self.fetchers.close()
        if self.replicas is not None:
            await self.replicas.close()

    async def run(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        self.phase = "starting"
        await self.groups.start()  # declares __consumer_offsets first: manifests cannot claim the name
        await self.transactions.start()  # and __transaction_state
        self.registry.load_api_topics()
        # Watch before the first read: a manifest written while the node starts is then never missed.
        stop_watching = watch(self.options.topics,
                              lambda: self._loop.call_soon_threadsafe(self.reload_manifests))
        self.reload_manifests()
        self.maintenance.start()
        self.moves.start()  # moves found at load resume (their swap runs on this loop)
        await self.broker.start()
        if self.registry.node.port == 0 and (not self.options.advertised_port or self.listener_config is not None):
            self.registry.bound(self.broker.port)
        if self.replicas is not None:
            self._start_replication()
        if self.shared_security is not None:
            self.shared_security.start(self._loop)
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
            self.transactions.close()
            await self._stop_replication()
            await self.broker.close()
            await asyncio.to_thread(self.moves.shutdown)  # copies stop; each resumes at the next start
            self.maintenance.shutdown()  # the cleaner and scheduled tasks let go of the logs
            self.clean_shutdown = self.log_dir.close()
            self.phase = "stopped"
            if self.clean_shutdown:
                logger.info("node %d stopped cleanly", self.options.node_id)
            else:
                logger.error("node %d stopped without a clean shutdown (see above): the next start recovers",
                             self.options.node_id)
            self.http.close()

    def _on_loop(self, fn):
        """Run `fn` on the event loop, where appends run, and wait for it (a log-dir move's swap)."""
        async def call():
            return fn()

        return asyncio.run_coroutine_threadsafe(call(), self._loop).result()

    def stop(self) -> None:
        """Ask `run()` to shut down; safe from signal handlers and other threads."""
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
