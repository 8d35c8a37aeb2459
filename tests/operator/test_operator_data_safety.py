"""Through the operator, only deleting a Topic deletes: bad specs and a lost ConfigMap leave the pods' data as it is.

Each test has its own pair of real `shale serve` pods (conftest) holding records acknowledged to a real client
(acks=all). Then the input the issue names — a Topic spec the CRD lets through but the operator
refuses, a ConfigMap emptied by hand or deleted — and the checks: the pods' partition files byte for
byte as before, the ConfigMap as it was (written back from the Topics, in one write), the Topic's
condition and Warning Event saying why, and after restarting the pod processes every record still
readable. The pods' part (deleting nothing while their topics directory is empty) is the node's guard
for a mass disappearance of manifests (sidecar/topics/manifests.py); these tests expect it.
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path
from typing import Iterator

import pytest
import yaml
from confluent_kafka import Consumer, TopicPartition

from shale.operator.manifests import PLACEHOLDER_KEY, PLACEHOLDER_TEXT, configmap_key
from support.clients_util import file_state
from support.cluster_util import (
    CONFIGMAP,
    REFRESH_SECONDS,
    STORAGE_NS,
    Cluster,
    OperatorThread,
    crd_errors,
    describe,
    produce,
)
from support.k8s_util import TEST_USER_AGENT
from support.node_util import wait_for

PRODUCED = {"ledger": {0: 20, 1: 30}, "alpha": {0: 12, 1: 9}, "beta": {0: 15}}


def with_data(cluster: Cluster, name: str, partitions: int, config: dict | None = None) -> None:
    """A Ready Topic whose partitions hold acknowledged records (PRODUCED), as its status reports them."""
    cluster.create_topic(name, partitions, config)
    cluster.wait_condition(name, "Ready", "True")
    produce(cluster.storage.nodes[0].bootstrap, name, PRODUCED[name])
    ends = [PRODUCED[name][p] for p in range(partitions)]
    wait_for(lambda: [p.get("logEndOffset") for p in cluster.topic(name)["status"]["partitions"]] == ends, 20,
             what=f"{name}'s end offsets {ends} in its status")


def partition_files(cluster: Cluster, *topics: str) -> dict[tuple[int, str], tuple[int, str]]:
    """(pod, path) → (size, digest) of every file in the topics' partition directories (`<topic>-<partition>`)."""
    out = {}
    for n, node in enumerate(cluster.storage.nodes):
        for path, digest in file_state(node.data_dir).files.items():
            if Path(path).parts[0].rsplit("-", 1)[0] in topics:
                out[(n, path)] = digest
    return out


def of_topic(files: dict[tuple[int, str], tuple[int, str]], topic: str) -> dict[tuple[int, str], tuple[int, str]]:
    return {(n, path): digest for (n, path), digest in files.items() if Path(path).parts[0].rsplit("-", 1)[0] == topic}


def logs_of(files: dict[tuple[int, str], tuple[int, str]]) -> dict[tuple[int, str], tuple[int, str]]:
    """Only the `.log` files: a clean stop trims the preallocated indexes, so those differ after a restart."""
    return {(n, path): digest for (n, path), digest in files.items() if path.endswith(".log")}


def served(cluster: Cluster, topic: str) -> dict[int, int] | None:
    """partition → log end offset of `topic` over both pods' /status, None if a pod does not list it."""
    ends = {}
    for n in (0, 1):
        entry = cluster.node_status(n)["topics"].get(topic)
        if entry is None:
            return None
        ends.update({p["partition"]: p["log_end_offset"] for p in entry["partitions"]})
    return ends


def consume_all(bootstrap: str, topic: str, ends: dict[int, int]) -> dict[int, list[tuple[int, bytes]]]:
    """Every record of `topic` up to `ends`, read by a real consumer (Metadata sends it to each pod)."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "data-safety", "enable.auto.commit": False})
    got: dict[int, list[tuple[int, bytes]]] = {p: [] for p in ends}
    try:
        consumer.assign([TopicPartition(topic, p, 0) for p in ends])

        def complete() -> bool:
            msg = consumer.poll(0.2)
            if msg is not None and msg.error() is None:
                got[msg.partition()].append((msg.offset(), msg.key()))
            return all(len(got[p]) >= end for p, end in ends.items())

        wait_for(complete, 30, interval=0, what=f"every record of {topic} up to {ends}")
    finally:
        consumer.close()
    return got


def restart_pods(cluster: Cluster) -> None:
    for node in cluster.storage.nodes:
        assert node.terminate() == 0, node.log()
        node.start()


def operator_configmap_writes(cluster: Cluster, since: int) -> list[dict]:
    """The bodies of the operator's writes (patch or create) to the topics ConfigMap, from request `since` on."""
    return [r.data for r in cluster.apiserver.requests()[since:]
            if r.headers.get("User-Agent") != TEST_USER_AGENT and r.resource is not None
            and r.resource.plural == "configmaps" and r.action.value in ("UPDATE", "CREATE")]


def manifests_in(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if not p.name.startswith("."))


def held(cluster: Cluster, node: int) -> dict[str, str]:
    """topic → reason, for the topics the pod holds although no manifest declares them (its /status)."""
    manifests = cluster.node_status(node).get("manifests") or {}
    return {name: h["reason"] for name, h in (manifests.get("held") or {}).items()}


def wait_held(cluster: Cluster, expected: dict[str, str]) -> None:
    wait_for(lambda: [held(cluster, n) for n in (0, 1)] == [expected, expected], 20,
             what=f"both pods to hold {expected}, last: {[held(cluster, n) for n in (0, 1)]}")


# A spec the CRD's schema lets through (or, for partitions, only a real API server's CEL rule stops) that the
# operator refuses: (patch, reason, words of the message).
REFUSED = [
    ({"spec": {"config": {"min.compaction.lag.ms": 10, "max.compaction.lag.ms": 5}}}, "InvalidConfig",
     "spec.config.min.compaction.lag.ms: "),
    ({"spec": {"config": {"min.cleanable.dirty.ratio": [0.5]}}}, "InvalidConfig",
     "spec.config.min.cleanable.dirty.ratio: "),
    ({"spec": {"partitions": 1}}, "NotSupported", "spec.partitions cannot be decreased from 2 to 1"),
]
GOOD = {"spec": {"partitions": 2, "config": {"retention.ms": "86400000", "min.compaction.lag.ms": None,
                                             "max.compaction.lag.ms": None, "min.cleanable.dirty.ratio": None}}}


def test_a_refused_spec_writes_nothing_keeps_the_data_and_the_last_good_config(cluster: Cluster):
    with_data(cluster, "ledger", 2, {"retention.ms": "86400000"})
    manifests = cluster.configmap_data()
    files = partition_files(cluster, "ledger")
    digests = [cluster.node_status(n)["topics"]["ledger"]["spec_digest"] for n in (0, 1)]

    for patch, reason, words in REFUSED:
        cluster.patch_topic("ledger", patch)
        generation = cluster.topic("ledger")["metadata"]["generation"]
        if reason == "InvalidConfig":
            assert crd_errors(cluster.topic("ledger")) == []  # the API server would have stored it too
        cond = cluster.wait_condition("ledger", "Ready", "False", reason)
        assert words in cond["message"] and cond["observedGeneration"] == generation
        assert ("Warning", reason, cond["message"]) in wait_for(lambda: cluster.events("ledger"), what="the Event")
        time.sleep(3 * REFRESH_SECONDS)  # a few refreshes: none of them writes either
        assert cluster.configmap_data() == manifests
        assert [cluster.node_status(n)["topics"]["ledger"]["spec_digest"] for n in (0, 1)] == digests
        for node in cluster.storage.nodes:  # the pods keep running the last good config
            assert describe(node.bootstrap, "ledger")["retention.ms"] == "86400000"
        assert served(cluster, "ledger") == PRODUCED["ledger"]
        assert partition_files(cluster, "ledger") == files

        cluster.patch_topic("ledger", GOOD)  # back to the good spec: the same manifest, so nothing to write
        cluster.wait_condition("ledger", "Ready", "True")
        assert cluster.configmap_data() == manifests

    restart_pods(cluster)
    wait_for(lambda: served(cluster, "ledger") == PRODUCED["ledger"], 30, what="ledger served after the restart")
    assert logs_of(partition_files(cluster, "ledger")) == logs_of(files)
    records = consume_all(cluster.storage.nodes[1].bootstrap, "ledger", PRODUCED["ledger"])
    assert {p: [o for o, _ in r] for p, r in records.items()} == {p: list(range(n))
                                                                  for p, n in PRODUCED["ledger"].items()}


def _empty_by_removing_every_key(cluster: Cluster) -> None:
    cluster.core.patch_namespaced_config_map(CONFIGMAP, STORAGE_NS, {"data": dict.fromkeys(cluster.configmap_data())})


def _empty_by_replacing_data(cluster: Cluster) -> None:  # `kubectl edit` down to `data: {}`
    cluster.core.patch_namespaced_config_map(CONFIGMAP, STORAGE_NS, [{"op": "replace", "path": "/data", "value": {}}],
                                             _content_type="application/json-patch+json")


def _delete(cluster: Cluster) -> None:  # the pods' volume is `optional`: it empties too
    cluster.core.delete_namespaced_config_map(CONFIGMAP, STORAGE_NS)


@pytest.mark.parametrize("lose", [_empty_by_removing_every_key, _empty_by_replacing_data, _delete],
                         ids=["every-key-removed", "data-emptied", "configmap-deleted"])
def test_a_lost_configmap_is_written_back_from_the_topics_and_the_pods_delete_nothing(cluster: Cluster, lose):
    with_data(cluster, "alpha", 2)
    with_data(cluster, "beta", 1, {"cleanup.policy": "compact"})
    manifests = cluster.configmap_data()
    assert sorted(manifests) == [configmap_key("default", "alpha"), configmap_key("default", "beta"), PLACEHOLDER_KEY]
    files = partition_files(cluster, "alpha", "beta")
    topics_dir = cluster.storage.topics_dir

    # The operator may not write meanwhile (as if it were slower than the kubelet): the pods see the empty directory.
    cluster.apiserver.refuse("UPDATE", "configmaps")
    cluster.apiserver.refuse("CREATE", "configmaps")
    since = len(cluster.apiserver.requests())
    lose(cluster)
    wait_for(lambda: manifests_in(topics_dir) == [], what="the pods' topics directory to be empty")
    wait_for(lambda: operator_configmap_writes(cluster, since), 20, what="the operator to try to write the keys back")
    # The node's guard: every manifest gone at once is no explicit act; the pods hold and serve both topics.
    wait_held(cluster, {"alpha": "manifests-missing", "beta": "manifests-missing"})
    assert all(cluster.node_status(n)["manifests"]["missing"] for n in (0, 1))
    assert served(cluster, "alpha") == PRODUCED["alpha"] and served(cluster, "beta") == PRODUCED["beta"]
    assert partition_files(cluster, "alpha", "beta") == files

    cluster.apiserver.allow("UPDATE", "configmaps")
    cluster.apiserver.allow("CREATE", "configmaps")
    wait_for(lambda: cluster.configmap_data() == manifests, 20, what="the ConfigMap written back as it was")
    # Every write carried both keys: the pods never saw a part of the set, which would read as deleting the rest.
    writes = operator_configmap_writes(cluster, since)
    assert all(sorted(w["data"]) == sorted(manifests) for w in writes), writes
    wait_for(lambda: manifests_in(topics_dir) == sorted(manifests), what="the pods' directory filled again")
    wait_held(cluster, {})
    for name in ("alpha", "beta"):
        cluster.wait_condition(name, "Ready", "True")
        message = wait_for(lambda: [m for t, r, m in cluster.events(name) if (t, r) == ("Warning", "ManifestRestored")],
                           what=f"the ManifestRestored Event on {name}")
        assert message == [f"{configmap_key('default', name)} was missing from ConfigMap {STORAGE_NS}/{CONFIGMAP} "
                           "(emptied, deleted or edited by hand) and was written back from this Topic; only deleting "
                           "the Topic deletes the topic"]
    assert "shale_operator_manifests_restored_total 2.0" in cluster.metrics()
    if lose is _delete:
        labels = cluster.core.read_namespaced_config_map(CONFIGMAP, STORAGE_NS).metadata.labels
        assert labels == {"app.kubernetes.io/managed-by": "shale-operator"}
    assert served(cluster, "alpha") == PRODUCED["alpha"] and served(cluster, "beta") == PRODUCED["beta"]
    assert partition_files(cluster, "alpha", "beta") == files

    restart_pods(cluster)
    for name in ("alpha", "beta"):
        wait_for(lambda: served(cluster, name) == PRODUCED[name], 30, what=f"{name} served after the restart")
        records = consume_all(cluster.storage.nodes[0].bootstrap, name, PRODUCED[name])
        assert {p: [k for _, k in r] for p, r in records.items()} == {
            p: [b"k%d" % i for i in range(n)] for p, n in PRODUCED[name].items()}
    assert logs_of(partition_files(cluster, "alpha", "beta")) == logs_of(files)

    # The explicit act: deleting the Topic removes its key, and the pods delete that topic — only that one.
    cluster.delete_topic("alpha")
    wait_for(lambda: cluster.topic("alpha") is None, what="alpha's finalizer removed")
    assert sorted(cluster.configmap_data()) == [configmap_key("default", "beta"), PLACEHOLDER_KEY]
    wait_for(lambda: served(cluster, "alpha") is None and served(cluster, "beta") == PRODUCED["beta"], 20,
             what="alpha deleted on the pods, beta kept")
    wait_for(lambda: partition_files(cluster, "alpha") == {}, what="alpha's partition directories gone")
    assert logs_of(partition_files(cluster, "beta")) == logs_of(of_topic(files, "beta")) != {}
    # ...the last one too: its key goes, the placeholder stays, so the pods do not take it for a lost volume.
    cluster.delete_topic("beta")
    wait_for(lambda: cluster.topic("beta") is None, what="beta's finalizer removed")
    assert cluster.configmap_data() == {PLACEHOLDER_KEY: PLACEHOLDER_TEXT}
    wait_for(lambda: served(cluster, "beta") is None, 20, what="beta deleted on the pods")
    wait_for(lambda: partition_files(cluster, "beta") == {}, what="beta's partition directories gone")
    assert [held(cluster, n) for n in (0, 1)] == [{}, {}]


def test_a_configmap_lost_while_the_operator_was_down_and_the_pods_restarted_is_written_back_as_it_was(
        cluster: Cluster):
    with_data(cluster, "alpha", 2)
    with_data(cluster, "beta", 1)
    manifests = cluster.configmap_data()
    files = partition_files(cluster, "alpha", "beta")
    cluster.operator.stop()
    since = len(cluster.apiserver.requests())
    _delete(cluster)
    wait_for(lambda: manifests_in(cluster.storage.topics_dir) == [], what="the pods' topics directory to be empty")
    wait_held(cluster, {"alpha": "manifests-missing", "beta": "manifests-missing"})
    assert served(cluster, "alpha") == PRODUCED["alpha"] and served(cluster, "beta") == PRODUCED["beta"]

    # Restarted without manifests, the pods keep the logs as strays: on disk and in /status, not served.
    restart_pods(cluster)
    for name in ("alpha", "beta"):
        entries = [p for n in (0, 1) for p in (cluster.node_status(n)["topics"].get(name) or {}).get("partitions", [])]
        assert sorted((p["partition"], p["log_end_offset"], p["served"]) for p in entries) == [
            (p, end, False) for p, end in PRODUCED[name].items()]
    assert logs_of(partition_files(cluster, "alpha", "beta")) == logs_of(files)

    restarted = OperatorThread(cluster.operator.settings).start()
    try:
        # On start, one create with every key, each partition placed where its log is: the manifests as they were.
        wait_for(lambda: cluster.configmap_data() == manifests, 20, what="the ConfigMap written back on start")
        writes = operator_configmap_writes(cluster, since)
        assert len(writes) == 1 and sorted(writes[0]["data"]) == sorted(manifests)
        for name in ("alpha", "beta"):
            cluster.wait_condition(name, "Ready", "True")
            records = consume_all(cluster.storage.nodes[1].bootstrap, name, PRODUCED[name])
            assert {p: len(r) for p, r in records.items()} == PRODUCED[name]
        wait_held(cluster, {})
        assert logs_of(partition_files(cluster, "alpha", "beta")) == logs_of(files)
    finally:
        restarted.stop()


@contextlib.contextmanager
def _seen_empty_first(cluster: Cluster, lose) -> Iterator[None]:
    """The operator may not write until the pods have seen the empty directory and hold every topic."""
    cluster.apiserver.refuse("UPDATE", "configmaps")
    cluster.apiserver.refuse("CREATE", "configmaps")
    lose(cluster)
    wait_for(lambda: manifests_in(cluster.storage.topics_dir) == [], what="the pods' topics directory to be empty")
    wait_held(cluster, {"alpha": "manifests-missing", "beta": "manifests-missing"})
    cluster.apiserver.allow("UPDATE", "configmaps")
    cluster.apiserver.allow("CREATE", "configmaps")
    yield


@contextlib.contextmanager
def _final_state_only(cluster: Cluster, lose) -> Iterator[None]:
    """The kubelet syncs the volume only after the operator wrote the keys back: the pods see only the result."""
    with cluster.projection.held():
        lose(cluster)
        yield


@pytest.mark.parametrize("pods_see", [_final_state_only, _seen_empty_first], ids=["final-state-only", "empty-first"])
def test_a_lost_key_whose_topic_is_refused_now_comes_back_at_its_last_good_spec_with_the_others(cluster: Cluster,
                                                                                               pods_see):
    """Every key comes back in one write, the refused Topic's at its `status.appliedSpec`: pods that see only
    the final state (a kubelet syncs a volume about once a minute) must not find one manifest missing, which
    is an explicit deletion of that topic and its data."""
    with_data(cluster, "alpha", 2)
    with_data(cluster, "beta", 1, {"retention.ms": "86400000"})
    cluster.patch_topic("beta", {"spec": {"config": {"retention.ms": None}}})  # a good change: the last applied
    last_good = {"topicName": "beta", "partitions": 1, "config": {}}
    generation = cluster.topic("beta")["metadata"]["generation"]
    wait_for(lambda: cluster.topic("beta")["status"].get("appliedSpec") == last_good
             and cluster.condition("beta", "Ready").get("observedGeneration") == generation, 20,
             what=f"beta's status.appliedSpec {last_good} (a removed config key removed there too)")
    cluster.wait_condition("beta", "Ready", "True")
    manifests = cluster.configmap_data()
    beta = configmap_key("default", "beta")
    assert yaml.safe_load(manifests[beta])["spec"]["config"] == {}
    files = partition_files(cluster, "alpha", "beta")
    cluster.patch_topic("beta", {"spec": {"config": {"min.cleanable.dirty.ratio": [0.5]}}})
    refused = cluster.wait_condition("beta", "Ready", "False", "InvalidConfig")["message"]
    assert cluster.topic("beta")["status"]["appliedSpec"] == last_good  # a refused spec is not recorded

    since = len(cluster.apiserver.requests())
    with pods_see(cluster, _empty_by_removing_every_key):
        wait_for(lambda: cluster.configmap_data() == manifests, 20, what="every key written back, beta's as it was")
        writes = operator_configmap_writes(cluster, since)
        assert writes and all(sorted(w["data"]) == sorted(manifests) for w in writes), writes
    wait_for(lambda: manifests_in(cluster.storage.topics_dir) == sorted(manifests), what="the pods' directory")
    wait_held(cluster, {})
    restored = wait_for(lambda: [m for t, r, m in cluster.events("beta") if (t, r) == ("Warning", "ManifestRestored")],
                        what="the ManifestRestored Event on beta")
    assert restored == [f"{beta} was missing from ConfigMap {STORAGE_NS}/{CONFIGMAP} (emptied, deleted or edited by "
                        "hand) and was written back at this Topic's last applied spec (status.appliedSpec), since its "
                        f"current spec is refused: {refused}. Only deleting the Topic deletes the topic"]
    time.sleep(3 * REFRESH_SECONDS)  # refreshes of both Topics: nothing more written, nothing deleted on the pods
    assert cluster.configmap_data() == manifests and "ManifestLost" not in [r for _, r, _ in cluster.events("beta")]
    cluster.wait_condition("alpha", "Ready", "True")
    assert cluster.condition("beta", "Ready")["message"] == refused
    assert served(cluster, "alpha") == PRODUCED["alpha"] and served(cluster, "beta") == PRODUCED["beta"]
    assert partition_files(cluster, "alpha", "beta") == files
    for name in ("alpha", "beta"):
        records = consume_all(cluster.storage.nodes[0].bootstrap, name, PRODUCED[name])
        assert {p: [k for _, k in r] for p, r in records.items()} == {
            p: [b"k%d" % i for i in range(n)] for p, n in PRODUCED[name].items()}

    cluster.patch_topic("beta", {"spec": {"config": {"min.cleanable.dirty.ratio": None}}})  # fixed: the same manifest
    cluster.wait_condition("beta", "Ready", "True")
    assert cluster.configmap_data() == manifests
    assert partition_files(cluster, "alpha", "beta") == files


@pytest.mark.parametrize("storage_nodes", [["delete.topic.enable=false"]], indirect=True)
def test_with_delete_topic_enable_false_deleting_a_topic_keeps_its_data_on_the_pods(cluster: Cluster):
    """The operator knows no broker settings: it removes the key; the pods refuse the deletion, as Kafka does."""
    with_data(cluster, "alpha", 2)
    with_data(cluster, "beta", 1)
    files = partition_files(cluster, "alpha")
    cluster.delete_topic("alpha")
    wait_for(lambda: cluster.topic("alpha") is None, what="alpha's finalizer removed")
    assert sorted(cluster.configmap_data()) == [configmap_key("default", "beta"), PLACEHOLDER_KEY]
    wait_held(cluster, {"alpha": "deletion-disabled"})
    assert served(cluster, "alpha") == PRODUCED["alpha"]
    assert partition_files(cluster, "alpha") == files
