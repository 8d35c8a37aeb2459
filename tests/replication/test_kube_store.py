"""What only KubeStore does, on a real kube-apiserver: the objects a person sees with kubectl, liveness judged
on the observer's own clock (client-go's rule), unreadable objects, RBAC refusals. The contract both stores
share is in test_control_stores.py."""

from __future__ import annotations

import itertools
import logging
import time
from datetime import datetime, timedelta, timezone

import kubernetes
import pytest
from hypothesis import given
from hypothesis import strategies as st

from kube_apiserver import ApiServer
from node_util import wait_for
from shale.sidecar.log.checkpoint import TopicPartition
from shale.sidecar.replication.control_store import SessionLost, StoreUnavailable
from shale.sidecar.replication.kube_store import KubeStore, LeaseObserver, micro_time
from store_util import RECORD, TP, node

_namespaces = itertools.count(1)


@pytest.fixture
def namespace(kube_api: ApiServer) -> str:
    name = f"kube-store{next(_namespaces)}"
    kubernetes.client.CoreV1Api(kube_api.client()).create_namespace({"metadata": {"name": name}})
    return name


def test_objects_are_the_documented_ones(kube_api, namespace):
    """docs/replication.md's objects, as `kubectl get lease,configmap -l shale.dev/cluster=prod -o yaml` shows."""
    store = KubeStore(kube_api.client(), namespace, "prod")
    me = node(1, "a")
    store.open_session(me, 2500)
    assert store.create_partition(TopicPartition("Orders_EU", 3), RECORD)
    api = kube_api.client()
    lease = kubernetes.client.CoordinationV1Api(api).read_namespaced_lease("shale-prod-node-1", namespace)
    assert (lease.spec.holder_identity, lease.spec.lease_duration_seconds) == ("a", 3)
    assert lease.metadata.labels == {"shale.dev/cluster": "prod"}
    assert lease.metadata.annotations == {"shale.dev/node": me.to_json()}
    (config_map,) = kubernetes.client.CoreV1Api(api).list_namespaced_config_map(
        namespace, label_selector="shale.dev/cluster=prod").items
    assert config_map.metadata.name.startswith("shale-prod-p-") and config_map.metadata.name.endswith("-3")
    assert config_map.metadata.annotations == {"shale.dev/topic": "Orders_EU", "shale.dev/partition": "3"}
    assert config_map.data == {"record": RECORD.to_json()}


def test_liveness_is_judged_on_the_observers_clock_not_the_lease_times(kube_api, namespace):
    """A Lease renewed by a node whose clock is 26 years behind is live while its renewals keep coming, and
    dead once they stop for its duration — as client-go judges leader leases (no clock comparison at all)."""
    leases = kubernetes.client.CoordinationV1Api(kube_api.client())
    me, long_ago = node(3, "skewed"), datetime(2000, 1, 1, microsecond=1, tzinfo=timezone.utc)
    body = {"metadata": {"name": "shale-c1-node-3", "labels": {"shale.dev/cluster": "c1"},
                         "annotations": {"shale.dev/node": me.to_json()}},
            "spec": {"holderIdentity": "skewed", "leaseDurationSeconds": 1, "renewTime": long_ago}}
    leases.create_namespaced_lease(namespace, body)
    observer = KubeStore(kube_api.client(), namespace, "c1")
    assert observer.view().is_live(3, "skewed")
    stop = time.monotonic() + 2.5
    while time.monotonic() < stop:  # renewals, each a microsecond later on the skewed clock
        long_ago += timedelta(microseconds=1)
        lease = leases.read_namespaced_lease("shale-c1-node-3", namespace)
        body["metadata"]["resourceVersion"] = lease.metadata.resource_version
        body["spec"]["renewTime"] = long_ago
        leases.replace_namespaced_lease("shale-c1-node-3", namespace, body)
        assert observer.view().is_live(3, "skewed")
        time.sleep(0.2)
    wait_for(lambda: not observer.view().is_live(3), what="the skewed node's renewals stopped: dead after 1 s")


def test_a_renewal_whose_answer_was_lost_is_settled_by_rereading(kube_api, namespace):
    """The Lease moved on under our version but still names us (our timed-out renewal landed): the session
    goes on; only another holder ends it."""
    store = KubeStore(kube_api.client(), namespace, "c1")
    store.open_session(node(1, "a"), 5000)
    leases = kubernetes.client.CoordinationV1Api(kube_api.client())
    lease = leases.read_namespaced_lease("shale-c1-node-1", namespace)
    lease.spec.renew_time = datetime.now(timezone.utc).replace(microsecond=1)  # as our lost renewal wrote it
    leases.replace_namespaced_lease("shale-c1-node-1", namespace, lease)
    store.keepalive()
    store.keepalive()
    lease = leases.read_namespaced_lease("shale-c1-node-1", namespace)
    lease.spec.holder_identity = "someone-else"
    leases.replace_namespaced_lease("shale-c1-node-1", namespace, lease)
    with pytest.raises(SessionLost, match="taken over by incarnation someone-else"):
        store.keepalive()


@given(st.lists(st.tuples(st.sampled_from(["renew", "wait"]), st.floats(0, 3)), max_size=30),
       st.integers(1, 3))
def test_lease_observer_rule(steps, duration):
    """Live exactly while less than `duration` has passed since the current marker was first seen."""
    observer, now, marker, first_seen = LeaseObserver(), 0.0, 0, 0.0
    assert observer.is_live("l", (marker,), duration, now)
    for action, amount in steps:
        now += amount
        if action == "renew":
            marker, first_seen = marker + 1, now
        assert observer.is_live("l", (marker,), duration, now) == (now - first_seen < duration)


def test_a_renewal_on_a_whole_second_is_accepted(kube_api, namespace):
    """The kubernetes client drops a zero microsecond part, which the API server refuses as a MicroTime."""
    on_the_second = datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone.utc)
    leases = kubernetes.client.CoordinationV1Api(kube_api.client())
    with pytest.raises(kubernetes.client.ApiException, match="parsing time"):  # why micro_time exists
        leases.create_namespaced_lease(namespace, {"metadata": {"name": "raw"}, "spec": {"renewTime": on_the_second}})
    leases.create_namespaced_lease(namespace, {"metadata": {"name": "raw"},
                                               "spec": {"renewTime": micro_time(on_the_second)}})
    assert micro_time(on_the_second) - on_the_second == timedelta(microseconds=1)
    assert micro_time(on_the_second.replace(microsecond=7)).microsecond == 7


def test_lease_observer_forgets_deleted_leases():
    observer = LeaseObserver()
    observer.is_live("a", ("x",), 1, 0.0)
    observer.forget_except(set())
    assert observer.is_live("a", ("x",), 1, 5.0)  # seen afresh: a full duration from now


def test_unreadable_objects_are_skipped_loudly_and_kept(kube_api, namespace, caplog):
    store = KubeStore(kube_api.client(), namespace, "c1")
    assert store.create_partition(TP, RECORD)
    core = kubernetes.client.CoreV1Api(kube_api.client())
    labels = {"shale.dev/cluster": "c1"}
    core.create_namespaced_config_map(namespace, {"metadata": {
        "name": "broken", "labels": labels, "annotations": {"shale.dev/topic": "t", "shale.dev/partition": "0"}},
        "data": {"record": "{not json"}})
    core.create_namespaced_config_map(namespace, {"metadata": {"name": "unnamed", "labels": labels},
                                                  "data": {"record": RECORD.to_json()}})
    kubernetes.client.CoordinationV1Api(kube_api.client()).create_namespaced_lease(namespace, {
        "metadata": {"name": "impostor", "labels": labels, "annotations": {"shale.dev/node": node(9, "a").to_json()}},
        "spec": {"holderIdentity": "b", "leaseDurationSeconds": 60}})
    with caplog.at_level(logging.ERROR):
        view = store.view()
    assert set(view.partitions) == {TP} and view.nodes == {}
    for name in ("ConfigMap kube-store", "/broken", "/unnamed: no shale.dev/topic", "/impostor: holder 'b'"):
        assert name in caplog.text
    caplog.clear()
    with caplog.at_level(logging.ERROR):
        assert store.view().partitions.keys() == {TP}
    assert caplog.text == ""  # once per version of a damaged object, not on every view
    assert core.read_namespaced_config_map("broken", namespace).data == {"record": "{not json"}


def test_a_node_without_rights_gets_a_clear_store_unavailable(kube_api, namespace):
    """A service account the chart forgot to bind: every call is refused (403), named with what and where."""
    core = kubernetes.client.CoreV1Api(kube_api.client())
    core.create_namespaced_service_account(namespace, {"metadata": {"name": "norights"}})
    token = kube_api.service_account_token(namespace, "norights")
    store = KubeStore(kube_api.client(token), namespace, "c1")
    with pytest.raises(StoreUnavailable, match=f"create Lease {namespace}/shale-c1-node-1: 403"):
        store.open_session(node(1, "a"), 2000)
    with pytest.raises(StoreUnavailable, match="list Leases .* 403"):
        store.view()
    with pytest.raises(StoreUnavailable, match="create ConfigMap .* 403"):
        store.create_partition(TP, RECORD)


def test_cluster_id_must_make_valid_object_names(kube_api):
    for bad in ("", "Prod", "a_b", "-a", "x" * 41):
        with pytest.raises(ValueError, match="cluster id"):
            KubeStore(kube_api.client(), "default", bad)
