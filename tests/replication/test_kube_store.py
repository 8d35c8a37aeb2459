"""What only KubeStore does, on a real kube-apiserver: the objects a person sees with kubectl, liveness judged
on the observer's own clock (client-go's rule), unreadable objects, RBAC refusals. The contract both stores
share is in test_control_stores.py."""

from __future__ import annotations

import itertools
import logging
import threading
import time
from datetime import datetime, timedelta, timezone

import kubernetes
import pytest
from hypothesis import given
from hypothesis import strategies as st
from store_util import RECORD, TP, node

from shale.sidecar.log.topic_partition import TopicPartition
from shale.sidecar.replication.control_store import SessionLost, StoreUnavailable
from shale.sidecar.replication.store.kube_store import KubeStore, LeaseObserver, micro_time
from support.apiserver_util import release_objects
from support.chart_util import by_kind
from support.kube_apiserver import ADMIN, ApiServer
from support.node_util import wait_for

_namespaces = itertools.count(1)


@pytest.fixture
def namespace(kube_api: ApiServer) -> str:
    name = f"kube-store{next(_namespaces)}"
    kubernetes.client.CoreV1Api(kube_api.client()).create_namespace({"metadata": {"name": name}})
    return name


def test_objects_are_the_documented_ones(kube_api, namespace):
    """docs/replication.md's objects, as `kubectl get leases -l shale.dev/cluster=prod -o yaml` shows: Leases only."""
    store = KubeStore(kube_api.client(), namespace, "prod")
    me = node(1, "a")
    store.open_session(me, 2500)
    assert store.create_partition(TopicPartition("Orders_EU", 3), RECORD)
    api = kube_api.client()
    leases = kubernetes.client.CoordinationV1Api(api)
    lease = leases.read_namespaced_lease("shale-prod-node-1", namespace)
    assert (lease.spec.holder_identity, lease.spec.lease_duration_seconds) == ("a", 3)
    assert lease.metadata.labels == {"shale.dev/cluster": "prod"}
    assert lease.metadata.annotations == {"shale.dev/node": me.to_json()}
    (record,) = [item for item in leases.list_namespaced_lease(namespace, label_selector="shale.dev/cluster=prod").items
                 if item.metadata.name != "shale-prod-node-1"]
    assert record.metadata.name.startswith("shale-prod-p-") and record.metadata.name.endswith("-3")
    assert record.metadata.annotations == {"shale.dev/topic": "Orders_EU", "shale.dev/partition": "3",
                                           "shale.dev/record": RECORD.to_json()}
    # kubectl's HOLDER column shows the elected leader's incarnation; nobody renews a record.
    assert (record.spec.holder_identity, record.spec.renew_time) == ("a", None)
    assert kubernetes.client.CoreV1Api(api).list_namespaced_config_map(namespace).items == []


def test_an_offline_partition_record_has_no_holder(kube_api, namespace):
    store = KubeStore(kube_api.client(), namespace, "c1")
    offline = RECORD.changed(leader=-1, leader_incarnation="", isr=(1, 2))
    assert store.create_partition(TP, offline)
    (record,) = kubernetes.client.CoordinationV1Api(kube_api.client()).list_namespaced_lease(namespace).items
    assert record.spec.holder_identity is None
    assert store.view().partitions[TP].record == offline


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


def test_a_deleted_session_lease_is_lost_not_recreated(kube_api, namespace):
    """Leases allow create-on-update: a renewal by PUT would bring a deleted session back; ours is a patch."""
    store = KubeStore(kube_api.client(), namespace, "c1")
    store.open_session(node(1, "a"), 5000)
    leases = kubernetes.client.CoordinationV1Api(kube_api.client())
    leases.delete_namespaced_lease("shale-c1-node-1", namespace)
    with pytest.raises(SessionLost, match="Lease shale-c1-node-1 was deleted"):
        store.keepalive()
    assert leases.list_namespaced_lease(namespace).items == []


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
    leases = kubernetes.client.CoordinationV1Api(kube_api.client())
    labels = {"shale.dev/cluster": "c1"}

    def lease(name: str, annotations: dict[str, str], holder: str | None = None) -> None:
        leases.create_namespaced_lease(namespace, {"metadata": {"name": name, "labels": labels,
                                                                "annotations": annotations},
                                                   "spec": {"holderIdentity": holder, "leaseDurationSeconds": 60}})
    lease("broken", {"shale.dev/topic": "t", "shale.dev/partition": "0", "shale.dev/record": "{not json"})
    lease("unnamed", {"shale.dev/record": RECORD.to_json()})
    lease("impostor", {"shale.dev/node": node(9, "a").to_json()}, holder="b")
    lease("stranger", {})
    with caplog.at_level(logging.ERROR):
        view = store.view()
    assert set(view.partitions) == {TP} and view.nodes == {}
    for name in ("Lease kube-store", "/broken: not JSON", "/unnamed: no shale.dev/topic", "/impostor: holder 'b'",
                 "/stranger: neither a session"):
        assert name in caplog.text
    caplog.clear()
    with caplog.at_level(logging.ERROR):
        assert store.view().partitions.keys() == {TP}
    assert caplog.text == ""  # once per version of a damaged object, not on every view
    assert leases.read_namespaced_lease("broken", namespace).metadata.annotations["shale.dev/record"] == "{not json"


def _bound_token(kube_api: ApiServer, namespace: str, role: dict) -> str:
    """A service account of `namespace` bound to `role` (created here), and its token."""
    api = kube_api.client()
    rbac = kubernetes.client.RbacAuthorizationV1Api(api)
    rbac.create_namespaced_role(namespace, role)
    core = kubernetes.client.CoreV1Api(api)
    core.create_namespaced_service_account(namespace, {"metadata": {"name": "storage"}})
    rbac.create_namespaced_role_binding(namespace, {
        "metadata": {"name": "storage"}, "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                                     "name": role["metadata"]["name"]},
        "subjects": [{"kind": "ServiceAccount", "name": "storage", "namespace": namespace}]})
    return kube_api.service_account_token(namespace, "storage")


def test_the_storage_role_of_the_chart_is_enough_and_configmaps_are_out_of_reach(kube_api, namespace, caplog):
    """The chart's storage Role (helm/shale/templates/rbac-storage.yaml), bound to a service account: a whole
    session and record life works with it, waits included, and the operator's ConfigMaps cannot be touched."""
    replicating = release_objects(namespace, {"storage": {"replication": {"enabled": True}}})
    [role] = [r for r in by_kind(replicating, "Role") if r["metadata"]["name"].endswith("-leases")]
    token = _bound_token(kube_api, namespace, role)
    core = kubernetes.client.CoreV1Api(kube_api.client())
    core.create_namespaced_config_map(namespace, {"metadata": {"name": "shale-topics"}, "data": {"a.yaml": "x"}})
    store = KubeStore(kube_api.client(token), namespace, "c1")
    store.open_session(node(1, "a"), 2000)
    store.keepalive()
    view = store.view()
    threading.Timer(0.3, lambda: store_of(kube_api, namespace).create_partition(TP, RECORD)).start()
    store.wait_for_change(view.revision, 30.0)  # woken by the watch the Role allows
    wait_for(lambda: TP in store.view().partitions, what="the partition record")
    assert "polling" not in caplog.text
    version = store.view().partitions[TP].version
    assert store.update_partition(TP, RECORD.changed(isr=(1, 2)), version)
    store.delete_partition(TP)
    assert store.view().partitions == {}
    store.close_session()
    mine = kubernetes.client.CoreV1Api(kube_api.client(token))
    with pytest.raises(kubernetes.client.ApiException) as refused:
        mine.patch_namespaced_config_map("shale-topics", namespace, {"data": {"a.yaml": "overwritten"}})
    assert refused.value.status == 403
    assert core.read_namespaced_config_map("shale-topics", namespace).data == {"a.yaml": "x"}


def store_of(kube_api: ApiServer, namespace: str) -> KubeStore:
    return KubeStore(kube_api.client(), namespace, "c1")


def test_a_role_without_watch_falls_back_to_polling_with_a_warning(kube_api, namespace, caplog):
    """A Role from before the watch (no `watch` verb): the refused watch is named once, and waits still end on
    changes, by polling."""
    role = {"metadata": {"name": "old-leases"}, "rules": [{"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
                                                           "verbs": ["get", "list", "create", "patch", "delete"]}]}
    store = KubeStore(kube_api.client(_bound_token(kube_api, namespace, role)), namespace, "c1")
    for partition in range(3):
        tp = TopicPartition(TP.topic, partition)
        view = store.view()
        threading.Timer(0.3, lambda tp=tp: store_of(kube_api, namespace).create_partition(tp, RECORD)).start()
        store.wait_for_change(view.revision, 30.0)
        wait_for(lambda tp=tp: tp in store.view().partitions, what=f"the record of {tp}")
    assert caplog.text.count("the storage Role lacks the 'watch' verb") == 1


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
    with pytest.raises(StoreUnavailable, match="create Lease .* 403"):
        store.create_partition(TP, RECORD)


def test_cluster_id_must_make_valid_object_names(kube_api):
    for bad in ("", "Prod", "a_b", "-a", "x" * 41):
        with pytest.raises(ValueError, match="cluster id"):
            KubeStore(kube_api.client(), "default", bad)


def test_open_store_finds_the_api_server_as_kubectl_does(kube_api, namespace, tmp_path, monkeypatch):
    """`shale serve --store kubernetes` outside a pod: $KUBECONFIG, its current context's namespace, else
    "default"; without any configuration a one-line error saying what was looked for."""
    from shale.sidecar.server.node import open_store

    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)  # not in a pod
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "absent"))
    with pytest.raises(ValueError, match=r"--store kubernetes: not in a pod .* no usable kubeconfig"):
        open_store("kubernetes", "c1")
    monkeypatch.setenv("KUBECONFIG", str(kube_api.write_kubeconfig(tmp_path / "plain")))
    store = open_store("kubernetes", "c1")
    assert store.namespace == "default"
    store.close()
    monkeypatch.setenv("KUBECONFIG", str(kube_api.write_kubeconfig(tmp_path / "scoped", namespace=namespace)))
    store = open_store("kubernetes", "c1")
    try:
        assert store.namespace == namespace
        store.open_session(node(4, "k"), 2000)  # reaches the server with the kubeconfig's credentials
        assert store.view().nodes == {4: node(4, "k")}
        store.close_session()
    finally:
        store.close()


def _lease_requests(kube_api: ApiServer, namespace: str, verb: str) -> int:
    """How many `verb` requests on the namespace's Leases the API server has completed (its audit log)."""
    return sum(1 for event in kube_api.responses(ADMIN)
               if event["verb"] == verb and event.get("objectRef", {}).get("resource") == "leases"
               and event["objectRef"].get("namespace") == namespace)


@pytest.mark.timeout(60)
def test_an_idle_wait_lists_nothing_while_live_nodes_renew(kube_api, namespace):
    """Waiting as the controller waits (slices of 100 ms) through 3 s in which another node renews its session
    every 200 ms: one watch, and no list until something changes. Polling listed every Lease of the cluster
    twice per slice — 60 lists in these 3 s, per node, and as many objects each as the cluster has partitions."""
    renewer, waiter = KubeStore(kube_api.client(), namespace, "c1"), KubeStore(kube_api.client(), namespace, "c1")
    renewer.open_session(node(2, "b"), 3000)
    assert waiter.create_partition(TP, RECORD)
    view = waiter.view()
    assert view.is_live(2, "b")
    lists_before = _lease_requests(kube_api, namespace, "list")
    stop = time.monotonic() + 3.0
    next_renewal = 0.0
    renewals = 0  # ~16; fewer on a loaded machine, where each call takes longer
    while time.monotonic() < stop:
        if time.monotonic() >= next_renewal:
            renewer.keepalive()
            renewals += 1
            next_renewal = time.monotonic() + 0.2
        waiter.wait_for_change(view.revision, 0.1)
    renewer.keepalive()
    renewals += 1
    assert renewals >= 5, "the renewer kept up too little to test anything"
    wait_for(lambda: _lease_requests(kube_api, namespace, "patch") >= renewals, what="the renewals in the audit log")
    assert _lease_requests(kube_api, namespace, "list") == lists_before
    writer = KubeStore(kube_api.client(), namespace, "c1")  # a real change still wakes the waiter at once
    assert writer.update_partition(TP, RECORD.changed(isr=(1, 2)), view.partitions[TP].version)
    waiter.wait_for_change(view.revision, 30.0)
    assert waiter.view().revision != view.revision
    # A watch is audited when it ends (this one ended with the change): one for the whole wait.
    wait_for(lambda: _lease_requests(kube_api, namespace, "watch") >= 1, what="the watch in the audit log")
    assert _lease_requests(kube_api, namespace, "watch") == 1


@pytest.mark.timeout(120)
def test_a_watch_cut_by_the_api_server_wakes_the_waiter_and_the_next_wait_watches_again(kube_api, namespace):
    """The API server SIGKILLed under an open watch: the wait ends at once (not after its 60 s) and the caller's
    next view names the outage; once the server is back, a wait watches again and a change wakes it."""
    store = store_of(kube_api, namespace)
    assert store.create_partition(TP, RECORD)
    view = store.view()
    waiting = threading.Thread(target=store.wait_for_change, args=(view.revision, 60.0))
    waiting.start()
    time.sleep(0.5)  # the watch is open (a wait of 0.5 s would have returned already: it did not)
    assert waiting.is_alive()
    kube_api.kill_apiserver()
    try:
        waiting.join(30)
        assert not waiting.is_alive(), "the wait did not end when its watch was cut"
        with pytest.raises(StoreUnavailable):
            store.view()
    finally:
        kube_api.start_apiserver()
    view = store.view()
    threading.Timer(0.3, lambda: store_of(kube_api, namespace).update_partition(
        TP, RECORD.changed(isr=(1, 2)), view.partitions[TP].version)).start()
    store.wait_for_change(view.revision, 60.0)
    assert store.view().partitions[TP].record.isr == (1, 2)
