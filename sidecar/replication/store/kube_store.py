"""`ControlStore` on the Kubernetes API: `coordination.k8s.io/v1` Lease objects, for sessions and records alike.

Inside Kubernetes the API server (and the etcd behind it) is the consensus engine (docs/replication.md):

- a node's session is the Lease `shale-<cluster>-node-<id>`: `holderIdentity` is the incarnation, the
  `NodeRegistration` JSON (host, port, rack) is its `shale.dev/node` annotation, and every renewal rewrites
  `renewTime` under a resourceVersion precondition (a merge patch carrying it: see `_patch`). Nothing on the server expires a Lease, so liveness is
  judged as client-go's leader election and Patroni judge it: on the *observer's* monotonic clock, a Lease
  whose holder/renewTime has not changed for `leaseDurationSeconds` since this process first saw it is dead.
  Clock skew between nodes therefore never matters; the owner considers its own session lost once
  `leaseDurationSeconds` passed since the *send* time of its last successful renewal, which is never later
  than any observer's verdict.
- a partition's record is the Lease `shale-<cluster>-p-<hash of topic>-<partition>`: the `PartitionRecord`
  JSON in its `shale.dev/record` annotation (the only truth), topic and partition in annotations (topic names
  need not be valid object names), and `holderIdentity` mirroring the elected leader's incarnation (absent
  while offline) so that `kubectl get leases` shows who leads; no renewTime, nobody renews it. Written with
  create (409: someone else created it) or a merge patch carrying `metadata.resourceVersion` (409: CAS miss;
  404: deleted — never a PUT, which would create the Lease again).
  Leases rather than ConfigMaps so that the storage pods' Role grants `leases` only: a node can then never
  overwrite the operator's topics ConfigMap, whatever it does.
- an API-created topic's record is the Lease `shale-<cluster>-t-<hash of topic>`: the `TopicRecord` JSON in
  its `shale.dev/topic-record` annotation; created, patched and deleted under the same preconditions.
- a view is one list of the cluster's Leases (label `shale.dev/cluster`): one revision, as an etcd range
  read gives, so no record can name an incarnation whose session the view has not seen yet.

Every call is bounded by `timeout_s` with urllib3's retries off, and the API server's failures (connection,
timeout, 5xx, 429, and refusals such as RBAC's 403 that leave this node unable to act) are StoreUnavailable.
`wait_for_change` returns when the view's revision — a digest of the records' resourceVersions, the Leases'
holders and which nodes are live by the local clock — may have moved: on a watch event from the view's list
resourceVersion (kube_watch.py), except a live session's renewal, which changes no view; and when the first
live session could be judged expired, since an expiry is no event on the server at all (only re-reading and
re-judging sees it). An idle node so holds one watch and lists nothing between the controller's reads.
The verbs used, all on `leases` (the chart's storage Role): get, list, watch, create, patch, delete; without
`watch` (an older Role) the wait falls back to polling a view every 250 ms, with a warning.
"""

from __future__ import annotations

import copy
import hashlib
import logging
import re
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Callable, TypeVar

import kubernetes
import urllib3
from kubernetes.client.exceptions import ApiException

from ...log.topic_partition import TopicPartition
from ..control_store import SessionLost, StoreUnavailable, StoreView, UnreadableRecords, Versioned, session_ttl_seconds
from ..store_records import NO_LEADER, NodeRegistration, PartitionRecord, RecordError
from ..topic_record import TopicRecord
from .kube_watch import LeaseWatch

logger = logging.getLogger(__name__)

CLUSTER_LABEL = "shale.dev/cluster"
NODE_ANNOTATION = "shale.dev/node"
TOPIC_ANNOTATION = "shale.dev/topic"
PARTITION_ANNOTATION = "shale.dev/partition"
RECORD_ANNOTATION = "shale.dev/record"
TOPIC_RECORD_ANNOTATION = "shale.dev/topic-record"
DEFAULT_TIMEOUT_S = 1.0
POLL_S = 0.25  # without the watch verb only
WATCH_S = 60  # the API server ends each watch after this; the next wait opens another
_CLUSTER_ID = re.compile(r"[a-z0-9]([a-z0-9-]{0,38}[a-z0-9])?")
_T = TypeVar("_T")


def micro_time(moment: datetime) -> datetime:
    """`moment` as the kubernetes client can send it as a MicroTime: the client writes datetimes with
    isoformat(), which leaves out a zero microsecond part, and the API server refuses a MicroTime without
    one (400) — one renewal in a million would fail. The moment one microsecond on is as good a renewTime."""
    return moment.replace(microsecond=1) if moment.microsecond == 0 else moment


@dataclass
class LeaseObserver:
    """client-go's expiry rule, on this process's monotonic clock: a Lease lives for its duration after the
    moment we first saw its current (holder, renewTime, duration)."""

    _seen: dict[str, tuple[tuple, float]] = field(default_factory=dict)

    def is_live(self, name: str, marker: tuple, duration_s: float, now: float) -> bool:
        seen = self._seen.get(name)
        if seen is None or seen[0] != marker:
            self._seen[name] = (marker, now)
            return True
        return now - seen[1] < duration_s

    def expires_at(self, name: str, duration_s: float) -> float:
        """When a Lease judged live now is judged dead if nothing changes it."""
        return self._seen[name][1] + duration_s

    def forget_except(self, names: set[str]) -> None:
        for name in self._seen.keys() - names:
            del self._seen[name]


@dataclass(frozen=True)
class _Basis:
    """What a wait needs of the last view: a watch from `resource_version` (its list's) misses no change after
    it; an event that only renews one of the `live` sessions (Lease name → holder) changes no view, until
    `next_expiry`, when the first of them could be judged dead."""

    revision: str
    resource_version: str
    live: dict[str, str]
    next_expiry: float


@dataclass
class _Session:
    me: NodeRegistration
    duration_s: int
    resource_version: str
    renewed_at: float  # monotonic send time of the last successful write of the Lease


class KubeStore:
    """The control store in namespace `namespace` of a Kubernetes API server; used from one thread."""

    def __init__(self, api: kubernetes.client.ApiClient, namespace: str, cluster_id: str,
                 timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        if not _CLUSTER_ID.fullmatch(cluster_id):
            raise ValueError(f"cluster id {cluster_id!r}: Kubernetes names need lowercase letters, digits and '-', "
                             "at most 40 characters")
        configuration = copy.deepcopy(api.configuration)
        configuration.retries = 0  # one attempt per call: the timeout below is the whole bound
        self._api = kubernetes.client.ApiClient(configuration)
        self._leases = kubernetes.client.CoordinationV1Api(self._api)
        self.namespace, self.cluster_id = namespace, cluster_id
        self.timeout_s = timeout_s
        self._selector = f"{CLUSTER_LABEL}={cluster_id}"
        self._observer = LeaseObserver()
        self._unreadable = UnreadableRecords("Kubernetes")
        self._session: _Session | None = None
        self._basis: _Basis | None = None  # of the last view
        self._watch: LeaseWatch | None = None
        self._watch_refused = False

    # Sessions.
    def open_session(self, me: NodeRegistration, ttl_ms: int) -> None:
        duration = session_ttl_seconds(ttl_ms)
        name = self.lease_name(me.node_id)
        for _ in range(8):
            sent = time.monotonic()
            body = self._lease_body(me, duration)
            try:
                written = self._call("create Lease", name, self._leases.create_namespaced_lease, self.namespace, body)
            except ApiException as exc:
                if exc.status != 409:
                    raise self._refused("create Lease", name, exc) from None
                written = self._take_over(name, me, body)
                if written is None:
                    continue  # changed under us: read again
            self._session = _Session(me, duration, written.metadata.resource_version, sent)
            logger.info("node %d incarnation %s: Kubernetes session open (Lease %s/%s, %d s)", me.node_id,
                        me.incarnation, self.namespace, name, duration)
            return
        raise StoreUnavailable(f"Kubernetes: could not register node {me.node_id} in Lease {self.namespace}/{name}: "
                               "it kept changing")

    def _take_over(self, name: str, me: NodeRegistration, body: dict) -> Any:
        """Replace an existing Lease of this node id (a restarted node): its previous process's renewals now
        miss the precondition, so it learns at once that its session is gone. None on a CAS miss."""
        try:
            current = self._call("read Lease", name, self._leases.read_namespaced_lease, name, self.namespace)
        except ApiException as exc:
            if exc.status == 404:
                return None  # deleted meanwhile: create again
            raise self._refused("read Lease", name, exc) from None
        body["metadata"]["resourceVersion"] = current.metadata.resource_version
        body["spec"]["leaseTransitions"] = (current.spec.lease_transitions or 0) + 1
        try:
            written = self._patch("replace Lease", name, body)
        except ApiException as exc:
            if exc.status in (404, 409):
                return None
            raise self._refused("replace Lease", name, exc) from None
        if current.spec.holder_identity != me.incarnation:
            logger.info("node %d: session of incarnation %s replaced by incarnation %s", me.node_id,
                        current.spec.holder_identity, me.incarnation)
        return written

    def keepalive(self) -> None:
        session = self._session
        if session is None:
            raise SessionLost("no Kubernetes session is open")
        name, sent = self.lease_name(session.me.node_id), time.monotonic()
        if sent - session.renewed_at >= session.duration_s:
            self._session = None  # observers may already have judged it dead: its leaderships are void
            raise SessionLost(f"node {session.me.node_id} incarnation {session.me.incarnation}: Lease {name} not "
                              f"renewed for {session.duration_s} s")
        written = self._renew(name, session)
        if written is None:  # 409: a renewal whose answer was lost may have landed; settled by re-reading
            current = self._read_lease(name, session)
            if current.spec.holder_identity != session.me.incarnation:
                self._session = None
                raise SessionLost(f"node {session.me.node_id} incarnation {session.me.incarnation}: Lease {name} "
                                  f"taken over by incarnation {current.spec.holder_identity}")
            session.resource_version = current.metadata.resource_version
            written = self._renew(name, session)
            if written is None:
                raise StoreUnavailable(f"Kubernetes: Lease {self.namespace}/{name} keeps changing under its holder")
        session.resource_version, session.renewed_at = written.metadata.resource_version, sent

    def _renew(self, name: str, session: _Session) -> Any:
        """The Lease rewritten with a fresh renewTime if it is still at our version; None on a CAS miss."""
        body = self._lease_body(session.me, session.duration_s)
        body["metadata"]["resourceVersion"] = session.resource_version
        try:
            return self._patch("renew Lease", name, body)
        except ApiException as exc:
            if exc.status == 409:
                return None
            self._session = None
            raise SessionLost(f"node {session.me.node_id} incarnation {session.me.incarnation}: Lease {name} was "
                              "deleted") from None

    def _read_lease(self, name: str, session: _Session) -> Any:
        try:
            return self._call("read Lease", name, self._leases.read_namespaced_lease, name, self.namespace)
        except ApiException:  # 404 (409 cannot happen on a read)
            self._session = None
            raise SessionLost(f"node {session.me.node_id} incarnation {session.me.incarnation}: Lease {name} was "
                              "deleted") from None

    def close_session(self) -> None:
        session, self._session = self._session, None
        if session is None:
            return
        name = self.lease_name(session.me.node_id)
        options = kubernetes.client.V1DeleteOptions(
            preconditions=kubernetes.client.V1Preconditions(resource_version=session.resource_version))
        try:  # only our own version: a successor's Lease stays
            self._call("delete Lease", name, self._leases.delete_namespaced_lease, name, self.namespace, body=options)
        except ApiException as exc:
            if exc.status not in (404, 409):
                raise self._refused("delete Lease", name, exc) from None

    def end_session(self, node: NodeRegistration) -> bool:
        name = self.lease_name(node.node_id)
        try:
            current = self._call("read Lease", name, self._leases.read_namespaced_lease, name, self.namespace)
        except ApiException as exc:
            if exc.status == 404:
                return False  # gone already
            raise self._refused("read Lease", name, exc) from None
        if current.spec.holder_identity != node.incarnation:
            return False
        options = kubernetes.client.V1DeleteOptions(preconditions=kubernetes.client.V1Preconditions(
            resource_version=current.metadata.resource_version))
        try:  # only the version read: a renewal meanwhile means the holder is alive, and the Lease stays
            self._call("delete Lease", name, self._leases.delete_namespaced_lease, name, self.namespace, body=options)
        except ApiException as exc:
            if exc.status in (404, 409):
                return False
            raise self._refused("delete Lease", name, exc) from None
        logger.info("Kubernetes: ended the session of node %d incarnation %s (Lease %s/%s deleted)", node.node_id,
                    node.incarnation, self.namespace, name)
        return True

    # Reads.
    def view(self) -> StoreView:
        leases = self._list("list Leases", self._leases.list_namespaced_lease)
        now = time.monotonic()
        nodes: dict[int, NodeRegistration] = {}
        partitions: dict[TopicPartition, Versioned[PartitionRecord]] = {}
        topics: dict[str, Versioned[TopicRecord]] = {}
        topics_complete = True
        digest = hashlib.sha256()
        live: dict[str, str] = {}
        next_expiry = float("inf")
        for lease in leases.items:
            name, version = lease.metadata.name, lease.metadata.resource_version
            annotations = lease.metadata.annotations or {}
            try:
                if NODE_ANNOTATION in annotations:
                    node = self._node_of(lease, annotations[NODE_ANNOTATION])
                elif TOPIC_RECORD_ANNOTATION in annotations:
                    where = f"Lease {self.namespace}/{name}"
                    topic = TopicRecord.from_json(annotations[TOPIC_RECORD_ANNOTATION], where)
                    if name != self.topic_name(topic.name):
                        raise RecordError(f"Lease {self.namespace}/{name}: holds the record of topic {topic.name}")
                    topics[topic.name] = Versioned(topic, version)
                    digest.update(f"t {name} {version}\n".encode())
                    continue
                elif TOPIC_ANNOTATION in annotations or RECORD_ANNOTATION in annotations:
                    tp, record = self._record_of(name, annotations)
                    partitions[tp] = Versioned(record, version)
                    digest.update(f"p {name} {version}\n".encode())
                    continue
                else:
                    raise RecordError(f"Lease {self.namespace}/{name}: neither a session ({NODE_ANNOTATION}) nor a "
                                      f"partition record ({TOPIC_ANNOTATION})")
            except RecordError as exc:
                self._unreadable.report(f"Lease {name}", version, exc)
                topics_complete &= TOPIC_RECORD_ANNOTATION not in annotations
                continue
            spec = lease.spec
            marker = (spec.holder_identity, str(spec.renew_time), spec.lease_duration_seconds)
            if self._observer.is_live(name, marker, spec.lease_duration_seconds or 0, now):
                nodes[node.node_id] = node
                digest.update(f"n {node.node_id} {node.incarnation}\n".encode())
                live[name] = spec.holder_identity
                next_expiry = min(next_expiry, self._observer.expires_at(name, spec.lease_duration_seconds or 0))
        self._observer.forget_except({lease.metadata.name for lease in leases.items})
        revision = digest.hexdigest()
        self._basis = _Basis(revision, leases.metadata.resource_version, live, next_expiry)
        return StoreView(revision, nodes, partitions, topics, topics_complete)

    def _node_of(self, lease: Any, text: str) -> NodeRegistration:
        where = f"Lease {self.namespace}/{lease.metadata.name}"
        node = NodeRegistration.from_json(text, where)
        if node.incarnation != lease.spec.holder_identity:
            raise RecordError(f"{where}: holder {lease.spec.holder_identity!r} is not the registered incarnation "
                              f"{node.incarnation!r}")
        return node

    def _record_of(self, name: str, annotations: dict[str, str]) -> tuple[TopicPartition, PartitionRecord]:
        where = f"Lease {self.namespace}/{name}"
        partition = annotations.get(PARTITION_ANNOTATION, "")
        if not annotations.get(TOPIC_ANNOTATION) or not partition.isdigit():
            raise RecordError(f"{where}: no {TOPIC_ANNOTATION}/{PARTITION_ANNOTATION} annotations")
        tp = TopicPartition(annotations[TOPIC_ANNOTATION], int(partition))
        return tp, PartitionRecord.from_json(annotations.get(RECORD_ANNOTATION, ""), where)

    def wait_for_change(self, revision: str, timeout_s: float) -> None:
        """Until an event that may move the view past `revision`, a live session's expiry, or `timeout_s`. The
        watch stays open across calls for the same revision (the controller waits in 100 ms slices)."""
        basis = self._basis
        if basis is None or basis.revision != revision:
            if self.view().revision != revision:
                return
            basis = self._basis
        if self._watch_refused:
            return self._poll(revision, timeout_s)
        watch = self._watch
        if watch is not None and watch.revision != revision:
            watch.close()  # a newer view was read: watch from its list
            watch = None
        if watch is None:
            watch = self._watch = LeaseWatch.start(revision, lambda: self._open_watch(basis.resource_version),
                                                   self._wakes)
        if watch.ended.wait(max(0.0, min(timeout_s, basis.next_expiry - time.monotonic()))):
            watch.close()
            self._watch = None
            if isinstance(watch.failure, ApiException) and watch.failure.status == 403:
                self._watch_refused = True
                logger.warning("Kubernetes: watching Leases in %s is refused (403): the storage Role lacks the "
                               "'watch' verb (an older chart?); polling a view every %.2f s instead",
                               self.namespace, POLL_S)

    def _wakes(self, event: dict) -> bool:
        """Whether a watch event may change the view (the watch thread asks): anything but a renewal of a
        session the last view counts live (same Lease, same holder), and a bookmark."""
        if event.get("type") == "BOOKMARK":
            return False
        if event.get("type") != "MODIFIED":
            return True  # ADDED, DELETED, ERROR (410 Gone: the resourceVersion is too old)
        lease = event.get("object") or {}
        metadata, spec = lease.get("metadata") or {}, lease.get("spec") or {}
        basis = self._basis
        name = metadata.get("name")
        return not (basis is not None and NODE_ANNOTATION in (metadata.get("annotations") or {})
                    and name in basis.live and basis.live[name] == spec.get("holderIdentity"))

    def _open_watch(self, resource_version: str) -> Any:
        """The watch request (in the watch's thread): the connection bounded like every call, the stream by the
        server's `timeoutSeconds` and, should the server vanish without a word, a read timeout past it."""
        return self._leases.list_namespaced_lease(
            self.namespace, label_selector=self._selector, watch=True, resource_version=resource_version,
            timeout_seconds=WATCH_S, allow_watch_bookmarks=False, _preload_content=False,
            _request_timeout=(self.timeout_s, WATCH_S + 10))

    def _poll(self, revision: str, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while self.view().revision == revision:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            time.sleep(min(POLL_S, remaining))

    # Writes.
    def create_partition(self, tp: TopicPartition, record: PartitionRecord) -> bool:
        name = self.record_name(tp)
        try:
            self._call("create Lease", name, self._leases.create_namespaced_lease, self.namespace,
                       self._record_body(tp, record))
        except ApiException as exc:
            if exc.status == 409:
                return False
            raise self._refused("create Lease", name, exc) from None
        return True

    def update_partition(self, tp: TopicPartition, record: PartitionRecord, expected_version: str) -> bool:
        name, body = self.record_name(tp), self._record_body(tp, record)
        body["metadata"]["resourceVersion"] = expected_version
        try:
            self._patch("replace Lease", name, body)
        except ApiException as exc:
            if exc.status in (404, 409):  # changed, or deleted with its topic: either way a miss
                return False
            raise self._refused("replace Lease", name, exc) from None
        return True

    def update_partitions(self, updates: list[tuple[TopicPartition, PartitionRecord, str]]) -> bool:
        return all(self.update_partition(tp, record, version) for tp, record, version in updates)  # stops at a miss

    def delete_partition(self, tp: TopicPartition) -> None:
        name = self.record_name(tp)
        try:
            self._call("delete Lease", name, self._leases.delete_namespaced_lease, name, self.namespace)
        except ApiException as exc:
            if exc.status != 404:
                raise self._refused("delete Lease", name, exc) from None

    def create_topic(self, record: TopicRecord) -> bool:
        name = self.topic_name(record.name)
        try:
            self._call("create Lease", name, self._leases.create_namespaced_lease, self.namespace,
                       self._topic_body(record))
        except ApiException as exc:
            if exc.status == 409:
                return False
            raise self._refused("create Lease", name, exc) from None
        return True

    def update_topic(self, record: TopicRecord, expected_version: str) -> bool:
        name, body = self.topic_name(record.name), self._topic_body(record)
        body["metadata"]["resourceVersion"] = expected_version
        try:
            self._patch("replace Lease", name, body)
        except ApiException as exc:
            if exc.status in (404, 409):
                return False
            raise self._refused("replace Lease", name, exc) from None
        return True

    def delete_topic(self, name: str, expected_version: str) -> bool:
        lease = self.topic_name(name)
        options = kubernetes.client.V1DeleteOptions(
            preconditions=kubernetes.client.V1Preconditions(resource_version=expected_version))
        try:
            self._call("delete Lease", lease, self._leases.delete_namespaced_lease, lease, self.namespace, body=options)
        except ApiException as exc:
            if exc.status in (404, 409):
                return False
            raise self._refused("delete Lease", lease, exc) from None
        return True

    def close(self) -> None:
        if self._watch is not None:
            self._watch.close()
            self._watch = None
        self._api.close()

    # Names and bodies.
    def lease_name(self, node_id: int) -> str:
        return f"shale-{self.cluster_id}-node-{node_id}"

    def record_name(self, tp: TopicPartition) -> str:
        # Topic names may hold '_' and upper case, which object names may not: an 80-bit digest stands in.
        return f"shale-{self.cluster_id}-p-{hashlib.sha256(tp.topic.encode()).hexdigest()[:20]}-{tp.partition}"

    def topic_name(self, topic: str) -> str:
        return f"shale-{self.cluster_id}-t-{hashlib.sha256(topic.encode()).hexdigest()[:20]}"

    def _topic_body(self, record: TopicRecord) -> dict[str, Any]:
        annotations = {TOPIC_RECORD_ANNOTATION: record.to_json()}
        return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "spec": {},
                "metadata": self._metadata(self.topic_name(record.name), annotations)}

    def _metadata(self, name: str, annotations: dict[str, str]) -> dict[str, Any]:
        return {"name": name, "namespace": self.namespace, "labels": {CLUSTER_LABEL: self.cluster_id},
                "annotations": annotations}

    def _lease_body(self, me: NodeRegistration, duration_s: int) -> dict[str, Any]:
        now = micro_time(datetime.now(timezone.utc))
        return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                "metadata": self._metadata(self.lease_name(me.node_id), {NODE_ANNOTATION: me.to_json()}),
                "spec": {"holderIdentity": me.incarnation, "leaseDurationSeconds": duration_s,
                         "acquireTime": now, "renewTime": now}}

    def _record_body(self, tp: TopicPartition, record: PartitionRecord) -> dict[str, Any]:
        annotations = {TOPIC_ANNOTATION: tp.topic, PARTITION_ANNOTATION: str(tp.partition),
                       RECORD_ANNOTATION: record.to_json()}
        leads = record.leader != NO_LEADER and record.leader_incarnation
        # null, not absent: a patch must remove an earlier leader's identity
        spec = {"holderIdentity": record.leader_incarnation if leads else None}
        return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "spec": spec,
                "metadata": self._metadata(self.record_name(tp), annotations)}

    # Plumbing.
    def _patch(self, what: str, name: str, body: dict[str, Any]) -> Any:
        """Rewrite an existing Lease if it is still at `body`'s resourceVersion (else 409); 404 if it is gone.

        A merge patch, not a PUT: the API server creates a Lease on a PUT to a missing name (Leases allow
        create-on-update), which would resurrect a deleted topic's record or a session someone deleted."""
        return self._call(what, name, self._leases.patch_namespaced_lease, name, self.namespace, body,
                          _content_type="application/merge-patch+json")

    def _list(self, what: str, method: Callable[..., _T], **kwargs: Any) -> _T:
        try:
            return self._call(what, self._selector, method, self.namespace, label_selector=self._selector, **kwargs)
        except ApiException as exc:  # 404: the namespace is gone
            raise self._refused(what, self._selector, exc) from None

    def _call(self, what: str, name: str, method: Callable[..., _T], *args: Any, **kwargs: Any) -> _T:
        """One bounded request; ApiException only for 404/409 (the caller's answer), else StoreUnavailable."""
        try:
            return method(*args, _request_timeout=self.timeout_s, **kwargs)
        except ApiException as exc:
            if exc.status in (404, 409):
                raise
            raise self._refused(what, name, exc) from None
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise StoreUnavailable(f"Kubernetes API {self._api.configuration.host}: {what} failed: {exc}") from None

    def _refused(self, what: str, name: str, exc: ApiException) -> StoreUnavailable:
        return StoreUnavailable(f"Kubernetes API {self._api.configuration.host}: {what} {self.namespace}/{name}: "
                                f"{exc.status} {exc.reason}: {(exc.body or '')[:300]}")
