"""Kafka's admin APIs over the `TopicRegistry`, in one handler table: the topics (topic_admin.py), their configs
and this node's (config_admin.py), the cluster and its log dirs (cluster_admin.py). Each answers the way a KRaft
broker and controller answer (error codes and messages of ControllerApis, ReplicationControlManager,
ConfigurationControlManager, ConfigAdminManager, ConfigHelper, ReplicaManager); what they share, the
refusals and who owns a topic, is admin_errors.py.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

from ...server_config import ServerConfig
from ...topics.registry import TopicRegistry
from ..network.handler import Handler
from ..ops.dynamic_broker_configs import DynamicBrokerConfigs
from ..ops.log_dir_moves import LogDirMoves
from .cluster_admin import ClusterAdmin
from .config_admin import ConfigAdmin
from .listener_addresses import ListenerAddresses
from .store_topics import StoreTopics
from .topic_admin import TopicAdmin


class AdminApis:
    """The admin handlers a `Broker` serves; every topic change goes through `registry.put`."""

    def __init__(self, registry: TopicRegistry, server_config: ServerConfig | None = None,
                 cluster_id: str = "shale", removal_held: Callable[[str], bool] = lambda _name: False,
                 store_topics: StoreTopics | None = None, log_dir_moves: LogDirMoves | None = None,
                 dynamic_broker: Mapping[str, Callable[[Any], None]] | None = None,
                 addresses: ListenerAddresses | None = None, dynamic_file: DynamicBrokerConfigs | None = None) -> None:
        addresses = addresses if addresses is not None else ListenerAddresses(registry.node.node_id)
        # With a control store the API's topics are its topic records (every node applies them); None: this node's.
        self.store_topics = store_topics
        self.topics = TopicAdmin(registry, server_config, removal_held, store_topics)
        self.configs = ConfigAdmin(registry, server_config, store_topics, addresses, dynamic_broker or {},
                                   dynamic_file)
        self.cluster = ClusterAdmin(registry, cluster_id, addresses, log_dir_moves)

    def handlers(self) -> dict[int, Handler]:
        return {**self.topics.handlers(), **self.configs.handlers(), **self.cluster.handlers()}
