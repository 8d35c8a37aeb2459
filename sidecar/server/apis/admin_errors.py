"""The admin APIs' one failure, `AdminError` (a Kafka error code and its message), and the checks and calls
every admin API shares whose failures become one: topic names, topic ownership, topic configs, registry and
store writes.

Who owns a topic decides whether it may be altered. Topics created through the API (origin "api") belong to the
API: they are changed live and persisted by the registry. Topics declared by a Topic manifest belong
to the manifest, because Kubernetes is declarative: a change made over the wire would be silently
reverted by the next reload of the manifest (or the next restart), and `kubectl get topic` would no
longer show the truth. Altering, deleting or growing them is refused with POLICY_VIOLATION and a message
saying which manifest to edit; once their manifest is gone and the removal is only held (see `manifests`),
DeleteTopics deletes them. Internal topics (`__consumer_offsets`) belong to the node and are refused alike.
"""

from __future__ import annotations

import re
from typing import Any, Mapping

from ...protocol.error_codes import INVALID_CONFIG, INVALID_REQUEST, POLICY_VIOLATION, REQUEST_TIMED_OUT
from ...replication.control_store import StoreUnavailable
from ...topic_config import InvalidConfigError, TopicConfig
from ...topics.manifests import ORIGIN_PREFIX
from ...topics.registry import CapacityError, TopicError, TopicRegistry, TopicSpec
from ..network.handler import ConnectionInfo
from .store_topics import StoreConflict

DEFAULT_TIMEOUT_MS = 30000  # how long a store write waits to be applied here when the request names no timeout
MAX_TOPIC_NAME_LENGTH = 249
_LEGAL_TOPIC_CHARS = re.compile(r"[a-zA-Z0-9._-]+")


class AdminError(Exception):
    """A resource or topic the request cannot be applied to: a Kafka error code and its message."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code, self.message = code, message


def topic_name_error(name: str | None) -> str | None:
    """Kafka's Topic.validate: why `name` cannot be a topic name, or None."""
    if not name:
        return "Topic name is illegal, it can't be empty"
    if name in (".", ".."):
        return 'Topic name cannot be "." or ".."'
    if len(name) > MAX_TOPIC_NAME_LENGTH:
        return (f"Topic name is illegal, it can't be longer than {MAX_TOPIC_NAME_LENGTH} characters, "
                f"topic name: {name}")
    if not _LEGAL_TOPIC_CHARS.fullmatch(name):
        return (f'Topic name "{name}" is illegal, it contains a character other than ASCII alphanumerics, '
                "'.', '_' and '-'")
    return None


def check_api_owned(spec: TopicSpec, manifest_advice: str, internal_advice: str) -> None:
    """Only a topic created through the API changes through it (see the module docstring)."""
    if spec.origin.startswith(ORIGIN_PREFIX):
        path = spec.origin[len(ORIGIN_PREFIX):]
        raise AdminError(POLICY_VIOLATION, f"Topic '{spec.name}' is declared by the Topic manifest {path}: "
                                           f"{manifest_advice}")
    if spec.origin != "api":
        raise AdminError(POLICY_VIOLATION, f"Topic '{spec.name}' is an internal topic ({spec.origin}); "
                                           f"{internal_advice}")


def parse_config(overrides: Mapping[str, object]) -> TopicConfig:
    try:
        return TopicConfig.from_mapping(overrides)
    except InvalidConfigError as exc:
        raise AdminError(INVALID_CONFIG, str(exc)) from None


def put(registry: TopicRegistry, spec: TopicSpec) -> None:
    try:
        registry.put(spec)
    except CapacityError as exc:  # more partitions than the node can hold (KRaft refuses too large a batch alike)
        raise AdminError(POLICY_VIOLATION, str(exc)) from None
    except TopicError as exc:  # e.g. an assignment the registry cannot apply; the message names the topic
        raise AdminError(INVALID_REQUEST, str(exc)) from None


async def stored(write: Any) -> Any:
    """A store call's result; its failures as the retriable error Kafka answers when its controller
    does not answer in time."""
    try:
        return await write
    except (StoreUnavailable, StoreConflict) as exc:
        raise AdminError(REQUEST_TIMED_OUT, f"The control store did not take the change: {exc}") from None


def client(conn: ConnectionInfo) -> str:
    """Who asked, as the admin APIs' log lines name them."""
    return f"client {conn.client_id!r} at {conn.host}"
