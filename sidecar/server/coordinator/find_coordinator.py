"""FindCoordinator (API 10): the node that coordinates a group (key type 0) or a transactional id (key type 1),
at its address on the listener the request came through."""

from __future__ import annotations

from typing import Any, Protocol

from ...protocol import codec
from ...protocol.error_codes import COORDINATOR_NOT_AVAILABLE, INVALID_REQUEST, NONE
from ..apis.listener_addresses import ListenerAddresses
from ..network.handler import ConnectionInfo

API_FIND_COORDINATOR = 10
GROUP_KEY, TRANSACTION_KEY = 0, 1


class Coordinator(Protocol):
    def find_coordinator(self, key: str | None) -> dict[str, Any]:
        """The coordinator of `key`: error_code, error_message, node_id, host, port (the registered address)."""
        ...


class FindCoordinator:
    """Answers for both coordinators; without a transaction coordinator, key type 1 is not served."""

    def __init__(self, groups: Coordinator, transactions: Coordinator | None, addresses: ListenerAddresses) -> None:
        self.groups = groups
        self.transactions = transactions
        self.addresses = addresses

    def handlers(self) -> dict[int, Any]:
        return {API_FIND_COORDINATOR: self._handle}

    def find(self, key: str | None, key_type: int) -> dict[str, Any]:
        if key_type == GROUP_KEY:
            return self.groups.find_coordinator(key)
        out = {"error_code": NONE, "error_message": None, "node_id": -1, "host": "", "port": -1}
        if key_type == TRANSACTION_KEY and self.transactions is not None:
            return self.transactions.find_coordinator(key)
        if key_type == TRANSACTION_KEY:
            return {**out, "error_code": COORDINATOR_NOT_AVAILABLE,
                    "error_message": "transactions are not supported by this server"}
        return {**out, "error_code": INVALID_REQUEST, "error_message": f"unknown coordinator type {key_type}"}

    def _on_listener(self, key: str | None, key_type: int, listener: str) -> dict[str, Any]:
        """The coordinator's address on the request's listener; a coordinator without that listener is
        COORDINATOR_NOT_AVAILABLE, as Kafka answers when the node has no endpoint there."""
        found = self.find(key, key_type)
        shown = self.addresses.address_on(found["node_id"], listener)
        if shown is None:
            return {**found, "error_code": COORDINATOR_NOT_AVAILABLE, "node_id": -1, "host": "", "port": -1,
                    "error_message": f"the coordinator (node {found['node_id']}) has no listener {listener}"}
        return {**found, **shown}

    async def _handle(self, request: codec.Request, conn: ConnectionInfo) -> dict[str, Any]:
        v, b = request.api_version, request.body
        key_type = b.key_type if v >= 1 else 0
        if v < 4:
            return {"throttle_time_ms": 0, **self._on_listener(b.key, key_type, conn.listener)}
        return {"throttle_time_ms": 0,
                "coordinators": [{"key": key, **self._on_listener(key, key_type, conn.listener)}
                                 for key in b.coordinator_keys]}
