"""`ControlStore` on etcd v3, through its JSON gateway (etcd3gw): leases for sessions, transactions for CAS.

Keys live under `/shale/<cluster id>/` (docs/replication.md, "What is stored where"): `nodes/<id>` bound to
the node's lease, so etcd itself deletes it when the node stops renewing, and `partitions/<topic>/<n>`
and `topics/<name>` (API-created topics) written only by transactions that compare the key's `mod_revision`
(the record's version) or, for a create, that its `create_revision` is 0. A view is one range read, so nodes
and records come from one revision.

Every call is bounded by `timeout_s` per endpoint (default 1 s, well inside a session) and tries the
endpoints in turn, starting with the last one that answered; when none answers it raises StoreUnavailable.
A write whose answer was lost may have landed: `ControlStore.update_partition` leaves that to the caller's
re-read. `wait_for_change` is a real watch on the prefix from the view's revision + 1, not polling: one
streamed HTTP request on its own connection, kept open across calls until the store changes
(`etcd_watch.py`).
"""

from __future__ import annotations

import base64
import http.client
import logging
from dataclasses import dataclass
from typing import Any, Callable, TypeVar

import etcd3gw
from etcd3gw import exceptions as etcd_errors

from ...log.topic_partition import TopicPartition
from ..control_store import SessionLost, StoreUnavailable, StoreView, UnreadableRecords, Versioned, session_ttl_seconds
from ..store_records import NodeRegistration, PartitionRecord, RecordError
from ..topic_record import TopicRecord
from .etcd_watch import WatchNotOpened, WatchStream

logger = logging.getLogger(__name__)

DEFAULT_TIMEOUT_S = 1.0
_T = TypeVar("_T")


def parse_endpoints(url: str) -> list[str]:
    """`etcd://h:p[,h:p…]` (the `--store` form) into `http://h:p` endpoints; a bare `h:p` list works too."""
    rest = url.removeprefix("etcd://")
    endpoints = [e.strip() for e in rest.split(",") if e.strip()]
    if not endpoints:
        raise ValueError(f"no etcd endpoint in {url!r} (expected etcd://host:port[,host:port…])")
    return [e if "://" in e else f"http://{e}" for e in endpoints]


@dataclass(frozen=True, slots=True)
class _Endpoint:
    host: str
    port: int
    protocol: str

    @classmethod
    def parse(cls, endpoint: str) -> "_Endpoint":
        protocol, sep, rest = endpoint.partition("://")
        if not sep:
            protocol, rest = "http", endpoint
        host, colon, port = rest.rstrip("/").rpartition(":")
        if not colon or not port.isdigit() or protocol not in ("http", "https"):
            raise ValueError(f"etcd endpoint {endpoint!r}: expected http://host:port")
        return cls(host.strip("[]"), int(port), protocol)

    def __str__(self) -> str:
        return f"{self.protocol}://{self.host}:{self.port}"


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def _unb64(text: str) -> str:
    return base64.b64decode(text).decode(errors="replace")  # not UTF-8: a RecordError when parsed, not a crash


def _prefix_end(prefix: str) -> str:
    """The range end that covers every key starting with `prefix` (etcd's `WithPrefix`)."""
    return prefix[:-1] + chr(ord(prefix[-1]) + 1)


class EtcdStore:
    """The control store on an etcd cluster; used from one thread (the node's controller)."""

    def __init__(self, endpoints: list[str], cluster_id: str, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        if not endpoints:
            raise ValueError("EtcdStore needs at least one endpoint")
        if not cluster_id or "/" in cluster_id:
            raise ValueError(f"cluster id {cluster_id!r}: must be non-empty and without '/'")
        self.cluster_id = cluster_id
        self.prefix = f"/shale/{cluster_id}/"
        self.timeout_s = timeout_s
        self._endpoints = [_Endpoint.parse(e) for e in endpoints]
        self._clients = self._connect()
        # Renewals come from the controller's session thread while its control loop reads and writes: they go
        # over connections of their own (a requests.Session is not made for two threads at once).
        self._renew_clients = self._connect()
        self._current = 0  # the endpoint that answered last
        self._lease_id: int | None = None
        self._me: NodeRegistration | None = None
        self._unreadable = UnreadableRecords("etcd")
        self._watch: WatchStream | None = None  # kept open while the view's revision is unchanged

    def _connect(self) -> list[etcd3gw.Etcd3Client]:
        # api_path fixed: etcd ≥ 3.4 serves /v3/; discovery would cost a round trip on every new client.
        return [etcd3gw.Etcd3Client(e.host, e.port, e.protocol, timeout=self.timeout_s, api_path="/v3/")
                for e in self._endpoints]

    # Sessions.
    def open_session(self, me: NodeRegistration, ttl_ms: int) -> None:
        ttl = session_ttl_seconds(ttl_ms)
        granted = self._post("/lease/grant", {"TTL": ttl, "ID": 0})
        lease_id, granted_ttl = int(granted["ID"]), int(granted.get("TTL", 0))
        if granted_ttl != ttl:
            logger.warning("etcd granted node %d a session of %d s, not the %d s asked for (its minimum TTL is "
                           "1.5 election timeouts)", me.node_id, granted_ttl, ttl)
        key = self._node_key(me.node_id)
        # Replace whatever registration the node id has: a restarted node's previous process loses its
        # session now (its lease is revoked below), not when that lease would have expired.
        for _ in range(8):
            previous = self._get_one(key)
            compare = ({"key": _b64(key), "target": "MOD", "result": "EQUAL", "mod_revision": previous[1]}
                       if previous else {"key": _b64(key), "target": "CREATE", "result": "EQUAL", "create_revision": 0})
            put = {"request_put": {"key": _b64(key), "value": _b64(me.to_json()), "lease": lease_id}}
            if self._txn([compare], [put]):
                break
        else:
            self._revoke(lease_id)
            raise StoreUnavailable(f"etcd: could not register node {me.node_id} at {key}: it kept changing")
        self._lease_id, self._me = lease_id, me
        old_lease = int(previous[2].get("lease", 0)) if previous else 0
        if old_lease and old_lease != lease_id:
            self._revoke(old_lease)
            logger.info("node %d: session of incarnation %s replaced by incarnation %s", me.node_id,
                        _incarnation(previous[0], key), me.incarnation)
        logger.info("node %d incarnation %s: etcd session open (lease %x, %d s)", me.node_id, me.incarnation,
                    lease_id, granted_ttl)

    def keepalive(self) -> None:
        if self._lease_id is None or self._me is None:
            raise SessionLost("no etcd session is open")
        answer = self._post("/lease/keepalive", {"ID": self._lease_id}, self._renew_clients)
        if int(answer.get("result", {}).get("TTL", 0)) <= 0:
            lost, self._lease_id = self._lease_id, None
            raise SessionLost(f"node {self._me.node_id} incarnation {self._me.incarnation}: etcd lease {lost:x} "
                              "expired or was revoked")

    def close_session(self) -> None:
        lease_id, self._lease_id = self._lease_id, None
        if lease_id is not None:
            self._revoke(lease_id)  # deletes nodes/<id> with it

    def end_session(self, node: NodeRegistration) -> bool:
        key = self._node_key(node.node_id)
        current = self._get_one(key)
        if current is None or _incarnation(current[0], key) != node.incarnation:
            return False
        lease_id = int(current[2].get("lease", 0))
        if not lease_id:
            return False
        self._revoke(lease_id)  # by id: a successor's lease is another one and stays
        logger.info("etcd: ended the session of node %d incarnation %s (lease %x)", node.node_id, node.incarnation,
                    lease_id)
        return True

    # Reads.
    def view(self) -> StoreView:
        answer = self._post("/kv/range", {"key": _b64(self.prefix), "range_end": _b64(_prefix_end(self.prefix))})
        nodes: dict[int, NodeRegistration] = {}
        partitions: dict[TopicPartition, Versioned[PartitionRecord]] = {}
        topics: dict[str, Versioned[TopicRecord]] = {}
        topics_complete = True
        for kv in answer.get("kvs", []):
            key = _unb64(kv["key"])
            value = _unb64(kv.get("value", ""))
            try:
                kind, _, rest = key[len(self.prefix):].partition("/")
                if kind == "nodes":
                    node = NodeRegistration.from_json(value, key)
                    if rest != str(node.node_id):
                        raise RecordError(f"{key}: holds the registration of node {node.node_id}")
                    nodes[node.node_id] = node
                elif kind == "partitions":
                    topic, _, partition = rest.rpartition("/")
                    if not topic or not partition.isdigit():
                        raise RecordError(f"{key}: not a partitions/<topic>/<partition> key")
                    partitions[TopicPartition(topic, int(partition))] = Versioned(
                        PartitionRecord.from_json(value, key), str(kv["mod_revision"]))
                elif kind == "topics":
                    topic = TopicRecord.from_json(value, key)
                    if rest != topic.name:
                        raise RecordError(f"{key}: holds the record of topic {topic.name}")
                    topics[topic.name] = Versioned(topic, str(kv["mod_revision"]))
            except RecordError as exc:
                # Left in the store untouched for a person to read; the rest of the view is still good.
                self._unreadable.report(key, kv["mod_revision"], exc)
                topics_complete &= kind != "topics"
        return StoreView(str(answer["header"]["revision"]), nodes, partitions, topics, topics_complete)

    def wait_for_change(self, revision: str, timeout_s: float) -> None:
        """A watch from `revision` + 1, kept open across calls for the same revision (etcd_watch.py says why)."""
        stream = self._watch
        if stream is not None and stream.revision != revision:
            stream.close()  # a newer view was read: watch from there
            stream = self._watch = None
        if stream is None:
            endpoint = self._endpoints[self._current]
            connection_class = (http.client.HTTPSConnection if endpoint.protocol == "https"
                                else http.client.HTTPConnection)
            try:
                stream = WatchStream.open(connection_class(endpoint.host, endpoint.port, timeout=self.timeout_s),
                                          _b64(self.prefix), _b64(_prefix_end(self.prefix)), revision, self.timeout_s)
            except WatchNotOpened as exc:
                self._current = (self._current + 1) % len(self._clients)
                raise StoreUnavailable(f"etcd {endpoint}: {exc}") from None
            if stream is None:
                return  # changed already
            self._watch = stream
        if stream.ended.wait(max(timeout_s, 0.0)):  # a change (or the stream's end), told once: then a new watch
            stream.close()
            self._watch = None

    # Writes.
    def create_partition(self, tp: TopicPartition, record: PartitionRecord) -> bool:
        key = self._partition_key(tp)
        return self._txn([{"key": _b64(key), "target": "CREATE", "result": "EQUAL", "create_revision": 0}],
                         [{"request_put": {"key": _b64(key), "value": _b64(record.to_json())}}])

    def update_partition(self, tp: TopicPartition, record: PartitionRecord, expected_version: str) -> bool:
        return self.update_partitions([(tp, record, expected_version)])

    def update_partitions(self, updates: list[tuple[TopicPartition, PartitionRecord, str]]) -> bool:
        keys = [_b64(self._partition_key(tp)) for tp, _, _ in updates]
        return self._txn([{"key": key, "target": "MOD", "result": "EQUAL", "mod_revision": int(version)}
                          for key, (_, _, version) in zip(keys, updates)],
                         [{"request_put": {"key": key, "value": _b64(record.to_json())}}
                          for key, (_, record, _) in zip(keys, updates)])

    def delete_partition(self, tp: TopicPartition) -> None:
        self._post("/kv/deleterange", {"key": _b64(self._partition_key(tp))})

    def create_topic(self, record: TopicRecord) -> bool:
        key = self._topic_key(record.name)
        return self._txn([{"key": _b64(key), "target": "CREATE", "result": "EQUAL", "create_revision": 0}],
                         [{"request_put": {"key": _b64(key), "value": _b64(record.to_json())}}])

    def update_topic(self, record: TopicRecord, expected_version: str) -> bool:
        key = self._topic_key(record.name)
        return self._txn([{"key": _b64(key), "target": "MOD", "result": "EQUAL",
                           "mod_revision": int(expected_version)}],
                         [{"request_put": {"key": _b64(key), "value": _b64(record.to_json())}}])

    def delete_topic(self, name: str, expected_version: str) -> bool:
        key = self._topic_key(name)
        return self._txn([{"key": _b64(key), "target": "MOD", "result": "EQUAL",
                           "mod_revision": int(expected_version)}],
                         [{"request_delete_range": {"key": _b64(key)}}])

    # One named document under the prefix, changed by compare-and-swap (the cluster's security state,
    # sidecar/server/ops/security_sync.py, on a store of its own prefix).
    def get_document(self, name: str) -> tuple[str, str] | None:
        """(value, version) of `name`, None when absent."""
        found = self._get_one(self.prefix + name)
        return None if found is None else (found[0], str(found[1]))

    def put_document(self, name: str, value: str, expected_version: str | None) -> str | None:
        """Write `name` if it is still at `expected_version` (None: only if absent): its new version, or None
        if it was not."""
        key = _b64(self.prefix + name)
        compare = ({"key": key, "target": "CREATE", "result": "EQUAL", "create_revision": 0}
                   if expected_version is None else
                   {"key": key, "target": "MOD", "result": "EQUAL", "mod_revision": int(expected_version)})
        answer = self._post("/kv/txn", {"compare": [compare], "success": [
            {"request_put": {"key": key, "value": _b64(value)}}], "failure": []})
        return str(answer["header"]["revision"]) if answer.get("succeeded", False) else None

    def close(self) -> None:
        if self._watch is not None:
            self._watch.close()
        for client in self._clients + self._renew_clients:
            client.session.close()

    # Plumbing.
    def _node_key(self, node_id: int) -> str:
        return f"{self.prefix}nodes/{node_id}"

    def _partition_key(self, tp: TopicPartition) -> str:
        if not tp.topic or "/" in tp.topic:
            raise ValueError(f"topic {tp.topic!r} cannot be an etcd key part")
        return f"{self.prefix}partitions/{tp.topic}/{tp.partition}"

    def _topic_key(self, name: str) -> str:
        if not name or "/" in name:
            raise ValueError(f"topic {name!r} cannot be an etcd key part")
        return f"{self.prefix}topics/{name}"

    def _get_one(self, key: str) -> tuple[str, int, dict[str, Any]] | None:
        """(value, mod_revision, raw kv) of `key`, None when absent."""
        kvs = self._post("/kv/range", {"key": _b64(key)}).get("kvs", [])
        if not kvs:
            return None
        return _unb64(kvs[0].get("value", "")), int(kvs[0]["mod_revision"]), kvs[0]

    def _txn(self, compare: list[dict], success: list[dict]) -> bool:
        # The gateway leaves out false and zero fields: no `succeeded` means the comparison failed.
        return bool(self._post("/kv/txn", {"compare": compare, "success": success, "failure": []})
                    .get("succeeded", False))

    def _revoke(self, lease_id: int) -> None:
        try:
            self._post("/kv/lease/revoke", {"ID": lease_id})
        except _LeaseNotFound:
            pass  # expired already: what revoking would have done

    def _post(self, path: str, body: dict, clients: list[etcd3gw.Etcd3Client] | None = None) -> dict:
        return self._call(lambda client: client.post(client.get_url(path), json=body), path, clients or self._clients)

    def _call(self, action: Callable[[etcd3gw.Etcd3Client], _T], what: str,
              clients: list[etcd3gw.Etcd3Client]) -> _T:
        failures = []
        for step in range(len(clients)):
            index = (self._current + step) % len(clients)
            try:
                result = action(clients[index])
            except (etcd_errors.ConnectionFailedError, etcd_errors.ConnectionTimeoutError,
                    etcd_errors.InternalServerError) as exc:
                failures.append(f"{self._endpoints[index]}: {type(exc).__name__} {_short(exc)}")
                continue
            except etcd_errors.Etcd3Exception as exc:
                if "lease not found" in _short(exc):
                    raise _LeaseNotFound(str(exc)) from None
                raise StoreUnavailable(f"etcd {self._endpoints[index]} refused {what}: {_short(exc)}") from None
            self._current = index
            return result
        raise StoreUnavailable(f"etcd {what} failed on every endpoint: {'; '.join(failures)}")


class _LeaseNotFound(Exception):
    pass


def _short(exc: Exception) -> str:
    return str(getattr(exc, "detail_text", None) or exc)[:200]


def _incarnation(value: str, key: str) -> str:
    try:
        return NodeRegistration.from_json(value, key).incarnation
    except RecordError:
        return "(unreadable)"
