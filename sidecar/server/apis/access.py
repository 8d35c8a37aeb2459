"""One request's principal before the authorizer: the checks a guard makes, the refusals it logs and counts."""

from __future__ import annotations

import logging
import time
from typing import Any, Callable, Iterable

from ...protocol import codec
from ...protocol.error_codes import (
    CLUSTER_AUTHORIZATION_FAILED,
    GROUP_AUTHORIZATION_FAILED,
    TOPIC_AUTHORIZATION_FAILED,
    TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
)
from ...security.acl import CLUSTER_NAME, AclOperation, ResourceType
from ...security.authorizer import Authorizer
from ..network.handler import ConnectionInfo, Handler

logger = logging.getLogger(__name__)

# Kafka's default messages of the authorization errors (`Errors.java`), for the fields that carry one.
MESSAGES = {
    TOPIC_AUTHORIZATION_FAILED: "Topic authorization failed.",
    GROUP_AUTHORIZATION_FAILED: "Group authorization failed.",
    CLUSTER_AUTHORIZATION_FAILED: "Cluster authorization failed.",
    TRANSACTIONAL_ID_AUTHORIZATION_FAILED: "Transactional Id authorization failed.",
}

Refused = Callable[[str, str], None]  # (api name, resource type name): one check that refused something


def not_counted(_api: str, _resource_type: str) -> None:
    """No count kept: handlers wrapped outside a node (tests)."""


class Access:
    """One request's principal before the authorizer: every check of the request goes through here (a plain
    slotted class: one is made per request, and a frozen dataclass costs several times as much)."""

    __slots__ = ("authorizer", "conn", "api", "on_refused")

    def __init__(self, authorizer: Authorizer, conn: ConnectionInfo, api: str,
                 on_refused: Refused = not_counted) -> None:
        self.authorizer, self.conn, self.api, self.on_refused = authorizer, conn, api, on_refused

    def allows(self, operation: AclOperation, resource_type: ResourceType, name: str = CLUSTER_NAME) -> bool:
        return self.authorizer.authorize(self.conn.principal, self.conn.host, operation, resource_type, name)

    def operations(self, resource_type: ResourceType, name: str = CLUSTER_NAME) -> frozenset[AclOperation]:
        return self.authorizer.authorized_operations(self.conn.principal, self.conn.host, resource_type, name)

    def refused(self, operation: AclOperation, resource_type: ResourceType, names: Iterable[str]) -> None:
        """A log line for a check that refused something, naming the principal and the resources; the same
        refusal again (a consumer polling a topic it may not read) is logged once a minute."""
        names = sorted(set(names))
        if not names:
            return
        self.on_refused(self.api, resource_type.name)  # counted every time, logged once a minute
        key = (self.api, self.conn.principal, self.conn.host, operation, resource_type, tuple(names))
        now = time.monotonic()
        if now - _LOGGED.get(key, -LOG_EVERY_S) < LOG_EVERY_S:
            return
        if len(_LOGGED) >= 4096:  # bounded: forget them all rather than grow with principals and names
            _LOGGED.clear()
        _LOGGED[key] = now
        shown = ", ".join(repr(n) for n in names[:10]) + (f" and {len(names) - 10} more" if len(names) > 10 else "")
        logger.info("refused %s: %s from %s (listener %s) may not %s %s %s", self.api, self.conn.principal,
                    self.conn.host, self.conn.listener, operation.name, resource_type.name, shown)


LOG_EVERY_S = 60.0
_LOGGED: dict[tuple, float] = {}  # refusal -> when it was last logged (the event loop's thread only)


Guard = Callable[[Access, codec.Request, Handler], Any]  # async (access, request, handler) -> response body
