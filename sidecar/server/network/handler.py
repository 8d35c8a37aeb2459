"""The contract between the Kafka port and the APIs: who sent a request, what a handler is, and which versions
of each API a node serves.

A handler is `async (request, connection info) -> response body`; components (the partition APIs, admin,
the coordinators) give tables of them by API key, the socket server calls them (socket_server.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Awaitable, Callable

from ...protocol import codec
from ...security.principal import ANONYMOUS, KafkaPrincipal

API_PRODUCE, API_FETCH, API_LIST_OFFSETS, API_METADATA, API_API_VERSIONS = 0, 1, 2, 3, 18
API_OFFSET_FOR_LEADER_EPOCH = 23

# Caps below the codec's ranges where a version identifies topics by ID, which is
# not routed yet (kafka-protocol.md G6): Fetch >= 13, Produce 13, OffsetCommit and
# OffsetFetch >= 10.
# AddPartitionsToTxn v4+, EndTxn v5 and TxnOffsetCommit v5 are KIP-890's transaction version 2 (server-side
# partition verification, an epoch bump per transaction), which the coordinator does not implement.
VERSION_CAPS = {API_FETCH: 12, API_PRODUCE: 12, 8: 9, 9: 9, 24: 3, 26: 4, 28: 4}



@dataclass(frozen=True, slots=True)
class ConnectionInfo:
    """Who sent a request: group members record the client id and host; the authorizer checks the principal
    (`User:ANONYMOUS` on a PLAINTEXT listener) and which listener it came through."""

    client_id: str | None
    host: str
    principal: KafkaPrincipal = ANONYMOUS
    listener: str = "PLAINTEXT"


Handler = Callable[[codec.Request, ConnectionInfo], Awaitable[Any]]



def advertised_range(api_key: int) -> tuple[int, int]:
    lo, hi = codec.SUPPORTED_VERSIONS[api_key]
    return lo, min(hi, VERSION_CAPS.get(api_key, hi))

