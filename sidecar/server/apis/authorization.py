"""ACL checks on every API: one layer around the broker's handler table, making the checks Kafka's broker makes.

With `authorizer.class.name` set, `authorize_handlers` wraps each handler. A whole-request check that fails
answers the API's error response without calling the handler. A per-item request (topics, partitions,
groups, config resources) is split: the handler gets a copy of the request with only the items the
principal may touch, and the refused items are added to its answer with the resource type's
`*_AUTHORIZATION_FAILED`; when nothing is left the handler is not called at all. Listings (Metadata of
every topic, ListGroups, OffsetFetch of every topic) leave out what the principal may not DESCRIBE, so
a client cannot learn that it exists, and the authorized operations a client asks for come from the
authorizer. The checks per API are `api_permissions.API_PERMISSIONS` (Kafka's `KafkaApis`); the
handlers themselves stay unaware of ACLs, and a node without an authorizer runs them unwrapped.
"""

from __future__ import annotations

import uuid
from typing import Any, Callable, Mapping

from ...protocol import codec
from ...security.authorizer import Authorizer
from ..network.handler import ConnectionInfo, Handler
from .access import Access, Guard, Refused, not_counted
from .api_guards import guards

# Requests no ACL guards: the handshake a client makes before it is anybody.
UNCHECKED = frozenset({17, 18, 36})  # SaslHandshake, ApiVersions, SaslAuthenticate


def authorize_handlers(handlers: Mapping[int, Handler], authorizer: Authorizer,
                       topic_name: Callable[[uuid.UUID], str | None],
                       on_refused: Refused = not_counted) -> dict[int, Handler]:
    """`handlers` with every API checked; `topic_name` resolves a topic id (DeleteTopics v6) to its name;
    `on_refused(api, resource type)` counts each check that refused something (/metrics).

    An API without a guard is refused here, at start, so a handler added later cannot go unchecked."""
    table = guards(topic_name)
    missing = sorted(set(handlers) - set(table) - UNCHECKED)
    if missing:
        raise ValueError(f"no ACL checks defined for API keys {missing}")
    wrapped = dict(handlers)
    for key, handler in handlers.items():
        if key in table:
            wrapped[key] = _wrap(table[key], handler, authorizer, on_refused)
    return wrapped


def _wrap(guard: Guard, handler: Handler, authorizer: Authorizer, on_refused: Refused) -> Handler:
    async def checked(request: codec.Request, conn: ConnectionInfo) -> Any:
        return await guard(Access(authorizer, conn, request.api_name, on_refused), request, handler)
    return checked
