"""Each node's address on each listener: Kafka answers a request with the endpoints of the listener it came
through (Metadata, FindCoordinator, DescribeCluster), so a client outside the cluster is never sent an inside
address."""

from __future__ import annotations

from ...replication.replica_manager import ReplicaManager


class ListenerAddresses:
    """This node's advertised listeners (filled by the socket server as they bind) and, with a control store,
    the other nodes' from their registrations."""

    def __init__(self, node_id: int, replicas: ReplicaManager | None = None) -> None:
        self.node_id = node_id
        self.replicas = replicas
        self.own: dict[str, tuple[str, int]] = {}  # listener name -> this node's advertised (host, port)

    def address_on(self, node_id: int, listener: str) -> dict | None:
        """A node's address on the listener a request came through: {} keeps the registered (inter-broker)
        address — a listener not advertised here, a node registered without listeners (one listener, or an
        older node), or a node known only from manifests; None: the node registered its listeners and this
        one is not among them (Kafka leaves it out)."""
        if listener not in self.own:
            return {}
        if node_id == self.node_id:
            shown: tuple[str, int] | None = self.own[listener]
        else:
            registration = self.replicas.view.nodes.get(node_id) if self.replicas is not None else None
            if registration is None or not registration.listeners:
                return {}
            shown = registration.endpoint(listener)
        return None if shown is None else {"host": shown[0], "port": shown[1]}
