"""Moves between pods driven by the operator on a real kube-apiserver (docs/moves.md, "The operator").

The chart's release with replication on, five real `shale serve --store kubernetes` processes of which three run
at first, and the operator under the chart's RBAC. The test plays the StatefulSet controller's part: it starts
pods 3 and 4 (process and Pod object) before raising `spec.replicas`, and stops them only once the operator has
lowered it. Under `acks=all` load from real clients on both topics:

- a Topic with `spec.replicas` 1 → 3 → 2: every partition ends with that many replicas on distinct pods;
- a Topic at RF 3 while the StatefulSet goes 3 → 5 (its replicas evened out onto the new pods) → 4 (`kubectl
  scale`: the test, as the StatefulSet controller, stops pod 4 at once, just before lowering the size; pod 4
  holds the only copy of a partition of a third, single-replica Topic; the operator puts the size back and shows
  why the scale-in waits, pod 4 returns on its data and is drained) → 3 (asked through the
  `shale.dev/scale-in-to` annotation: pod 3 drained first); each time the StatefulSet is lowered by the operator
  only once no manifest names the pods going and they serve nothing;

and, copies throttled, a Topic's `spec.replicas` 2 → 3 with the new replica's pod and then the partition's
leader SIGKILLed in the middle of the copy and restarted;

every move shows in the Topic's status (ongoing, then done), `Reassigning` goes back to False, every
acknowledged record is read back at its offset from replicas byte-identical below the high watermark, and no
partition is left with its cleaning paused.
"""

from __future__ import annotations

import itertools
import json
import re
import urllib.request
from collections import Counter
from contextlib import contextmanager
from typing import Iterator

import kubernetes
import pytest

from support.apiserver_util import Release, install_release, operated, run_pods, storage_pods
from support.chart_util import one
from support.cluster_util import Cluster, StorageNodes
from support.fault_util import AckedLoad, check_acknowledged, preload  # the fault tests' acks=all load and checks
from support.kube_apiserver import ApiServer
from support.node_util import TEST_OVERRIDES, KubeStoreUrl, ReplicatedCluster, ServeProcess, wait_for

_namespaces = itertools.count(1)
SCALED, GROWN, SINGLE = "scaled", "grown", "single"
ANNOTATION = "shale.dev/scale-in-to"
MOVE_TIMEOUT = 180
THROTTLE = 200_000  # bytes per second fetched by a node for replicas out of the ISR (the `throttled` fixture)


@contextmanager
def moves_release(apiserver: ApiServer, tmp_path_factory, monkeypatch, pods: int, *overrides: str
                  ) -> Iterator[tuple[Cluster, ReplicatedCluster, Release, dict[int, ServeProcess]]]:
    """The release (three storage pods, replication on) operated with pods 0-2 running and `pods` prepared,
    each started with `overrides`; after it, the real authorizer is checked to have granted the operator every
    call (409s are CAS misses) and the operator's calls are yielded for more checks."""
    release = install_release(apiserver.client(), f"moves{next(_namespaces)}",
                              {"storage": {"replicas": 3, "replication": {"enabled": True}},
                               "security": {"enabled": False}})  # plaintext: the moves, not the listeners
    line = one(release.objects, "StatefulSet")["spec"]["template"]["spec"]["containers"][0]["args"][0]
    store_args = re.search(r"--store (kubernetes) --cluster-id (\S+)", line)
    assert store_args, f"the chart's storage command has no --store kubernetes: {line}"
    base = tmp_path_factory.mktemp("moves")
    token = apiserver.service_account_token(release.namespace, release.storage_service_account)
    store = KubeStoreUrl(apiserver.write_kubeconfig(base / "storage-kubeconfig", token, namespace=release.namespace))
    nodes = ReplicatedCluster(base, store)
    nodes.topics_dir.mkdir()
    every = {n: ServeProcess(base / f"data{n}", nodes.topics_dir, "--store", store_args[1], "--cluster-id",
                             store_args[2], *TEST_OVERRIDES, *overrides, node_id=n,
                             env={"KUBECONFIG": str(store.kubeconfig)})
             for n in range(pods)}
    try:
        for n in range(3):
            nodes.servers[n] = every[n].start()
        nodes.wait_for_members()
        with operated(apiserver, release, StorageNodes(nodes.topics_dir, [every[n] for n in range(3)]), base,
                      monkeypatch) as cluster:
            yield cluster, nodes, release, every
    finally:
        nodes.stop()
    operator = f"system:serviceaccount:{release.namespace}:{release.service_account}"
    refused = sorted({(e["verb"], e["requestURI"].split("?")[0], e["responseStatus"]["code"])
                      for e in apiserver.responses(operator) if e["responseStatus"]["code"] in (401, 403, 422)})
    assert refused == [], f"the server refused the operator: {refused}"


@pytest.fixture
def five(apiserver: ApiServer, tmp_path_factory, monkeypatch) -> Iterator[tuple[Cluster, ReplicatedCluster, Release,
                                                                               dict[int, ServeProcess]]]:
    """Pods 0-2 running, pods 3 and 4 prepared; the StatefulSet patches were granted too."""
    with moves_release(apiserver, tmp_path_factory, monkeypatch, 5) as five:
        yield five
    operator = f"system:serviceaccount:{five[2].namespace}:{five[2].service_account}"
    assert any(e["verb"] == "patch" and "/statefulsets/" in e["requestURI"] for e in apiserver.responses(operator))


@pytest.fixture
def throttled(apiserver: ApiServer, tmp_path_factory, monkeypatch) -> Iterator[tuple[Cluster, ReplicatedCluster,
                                                                                    Release, dict[int, ServeProcess]]]:
    """Three pods whose replicas out of the ISR fetch at most ~200 KB/s (a topic's throttled replicas): a move
    between pods takes seconds, so a node can be killed in the middle of one. Two one-second quota windows and
    64 KiB fetches: with Kafka's defaults (11 windows, 1 MiB) a freshly started node may fetch ~2 MB (the rate
    over ten seconds) before its quota reads as exceeded — a restarted replica then caught up at once."""
    with moves_release(apiserver, tmp_path_factory, monkeypatch, 3,
                       "--override", f"follower.replication.throttled.rate={THROTTLE}",
                       "--override", "replication.quota.window.num=2", "--override", "replica.fetch.max.bytes=65536"
                       ) as three:
        yield three


def assignment(cluster: Cluster, topic: str) -> list[tuple[int, ...]]:
    raw = cluster.manifest(topic)["spec"]["assignment"]["partitions"]
    return [tuple(r) if isinstance(r, list) else (r,) for r in raw]


def settled(cluster: Cluster, topic: str, before: list[tuple[int, ...]], check) -> list[tuple[int, ...]] | None:
    """The topic's assignment once `check(assignment)` holds and the status shows it reached: Ready for the current
    generation, Reassigning False, and every partition that changed since `before` with a done move to where it
    is now."""
    placed = assignment(cluster, topic)
    body = cluster.topic(topic) or {}
    status = body.get("status") or {}
    ready = cluster.condition(topic, "Ready")
    if not check(placed) or ready.get("status") != "True" or \
            ready.get("observedGeneration") != body["metadata"]["generation"]:
        return None
    if cluster.condition(topic, "Reassigning").get("status") != "False":
        return None
    done = {m["partition"]: tuple(m["targetReplicas"]) for m in status.get("moves") or () if m["state"] == "done"}
    changed = [p for p, replicas in enumerate(placed) if replicas != before[p]]
    return placed if all(done.get(p) == placed[p] for p in changed) else None


def wait_settled(cluster: Cluster, topic: str, before: list[tuple[int, ...]], check, what: str
                 ) -> list[tuple[int, ...]]:
    try:
        return wait_for(lambda: settled(cluster, topic, before, check), MOVE_TIMEOUT, interval=0.5,
                        what=f"{topic}: {what}")
    except AssertionError as exc:  # what the Topic shows at the end, not at the start of the wait
        body = cluster.topic(topic) or {}
        raise AssertionError(f"{exc}; now: assignment {assignment(cluster, topic)}, generation "
                             f"{body.get('metadata', {}).get('generation')}, status {body.get('status')}") from None


def node_status(server: ServeProcess) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{server.http_port}/status", timeout=5) as r:
        return json.load(r)


def statefulset(cluster: Cluster, release: Release) -> tuple[int, str | None]:
    name = one(release.objects, "StatefulSet")["metadata"]["name"]
    sts = kubernetes.client.AppsV1Api(cluster.api).read_namespaced_stateful_set(name, release.namespace)
    return sts.spec.replicas, (sts.metadata.annotations or {}).get(ANNOTATION)


def scaled_in(cluster: Cluster, release: Release, every: dict[int, ServeProcess], size: int) -> None:
    """Until the operator sets the StatefulSet's size to `size`; then no manifest names a pod at or above it and
    those pods serve nothing, and they go (the StatefulSet controller's part: process and Pod object)."""
    wait_for(lambda: statefulset(cluster, release) == (size, None), MOVE_TIMEOUT, interval=0.2,
             what=f"the operator to scale the StatefulSet to {size}; last {statefulset(cluster, release)}, "
                  f"{SCALED} {assignment(cluster, SCALED)}, {GROWN} {assignment(cluster, GROWN)}")
    going = [n for n in every if n >= size and every[n].running]
    for topic in (SCALED, GROWN, SINGLE):
        assert all(max(r) < size for r in assignment(cluster, topic)), (topic, assignment(cluster, topic))
    for n in going:
        served = {t: [e["partition"] for e in d["partitions"] if e.get("served", True)]
                  for t, d in node_status(every[n])["topics"].items()}
        assert all(not parts for parts in served.values()), f"pod {n} still serves {served}"
    sts = one(release.objects, "StatefulSet")["metadata"]["name"]
    for n in going:
        assert every[n].terminate() == 0, every[n].log()
        cluster.core.delete_namespaced_pod(f"{sts}-{n}", release.namespace)


def test_scale_3_5_3_and_replicas_1_3_2_move_replicas_under_acks_all(five):
    cluster, nodes, release, every = five
    sts = one(release.objects, "StatefulSet")["metadata"]["name"]
    apps = kubernetes.client.AppsV1Api(cluster.api)
    cluster.create_topic(SCALED, 3, {"min.insync.replicas": "2"}, replicas=3)
    cluster.create_topic(GROWN, 2, replicas=1)
    cluster.wait_condition(SCALED, "Ready", "True", "PartitionsServed", timeout=90)
    cluster.wait_condition(GROWN, "Ready", "True", "PartitionsServed", timeout=90)
    assert all(sorted(r) == [0, 1, 2] for r in assignment(cluster, SCALED))
    loads = [AckedLoad("confluent", nodes.bootstrap, SCALED, 3).start(),
             AckedLoad("kafka-python", nodes.bootstrap, GROWN, 2).start()]
    try:
        for load in loads:
            load.wait_for_acks(50)

        # spec.replicas 1 → 3: each partition gains two replicas on distinct pods.
        before = assignment(cluster, GROWN)
        cluster.patch_topic(GROWN, {"spec": {"replicas": 3}})
        grown = wait_settled(cluster, GROWN, before, lambda a: all(len(set(r)) == 3 for r in a),
                             "three replicas each")
        moves = cluster.topic(GROWN)["status"]["moves"]
        assert sorted(m["partition"] for m in moves) == [0, 1]
        for m in moves:
            assert len(m["fromReplicas"]) == 1 and sorted(m["targetReplicas"]) == [0, 1, 2] and m["startedAt"]
            assert m["bytesRemaining"] == 0 and m["finishedAt"]
        assert [r[0] for r in grown] == [r[0] for r in map(tuple, (m["fromReplicas"] for m in
                                                                   sorted(moves, key=lambda m: m["partition"])))]

        # Scale-out 3 → 5: the pods start (the StatefulSet controller's part), then spec.replicas goes up.
        run_pods(cluster.api, storage_pods(release.objects, [every[n] for n in range(5)])[3:])
        for n in (3, 4):
            nodes.servers[n] = every[n].start()
        nodes.wait_for_members()
        before = assignment(cluster, SCALED)
        apps.patch_namespaced_stateful_set(sts, release.namespace, {"spec": {"replicas": 5}})
        spread = wait_settled(cluster, SCALED, before,
                              lambda a: set(Counter(n for r in a for n in r)) == {0, 1, 2, 3, 4},
                              "replicas on all five pods")
        counts = Counter(n for r in spread for n in r)
        assert sorted(counts.values()) == [1, 2, 2, 2, 2]  # 9 replicas over 5 pods, evened out
        assert all(len(set(r)) == 3 for r in spread)

        # spec.replicas 3 → 2 (on five pods now).
        before = assignment(cluster, GROWN)
        cluster.patch_topic(GROWN, {"spec": {"replicas": 2}})
        wait_settled(cluster, GROWN, before, lambda a: all(len(set(r)) == 2 for r in a), "two replicas each")

        # A third topic, one replica per partition, evened out over the five pods: pod 4 holds the only copy of one.
        cluster.create_topic(SINGLE, 5, replicas=1)
        cluster.wait_condition(SINGLE, "Ready", "True", "PartitionsServed", timeout=90)
        single = assignment(cluster, SINGLE)
        assert sorted(single) == [(0,), (1,), (2,), (3,), (4,)]
        only = single.index((4,))
        acked_single = AckedLoad("confluent", nodes.bootstrap, SINGLE, 5).start()
        acked_single.wait_for_acks(100)
        acked_single.stop()

        # Scale-in 5 → 4 with `kubectl scale`: the StatefulSet controller stops pod 4 at once. Its partition of
        # SINGLE cannot be copied from anywhere meanwhile: the operator puts the size back, records the target
        # and says why the scale-in waits; the controller brings pod 4 back on its data, and it is drained.
        # Pod 4 is stopped before spec.replicas is lowered: the other order races the operator, which may well
        # copy the tiny partition off pod 4 in the moment the pod still runs (then nothing is put back).
        assert every[4].terminate() == 0, every[4].log()
        cluster.core.delete_namespaced_pod(f"{sts}-4", release.namespace)
        apps.patch_namespaced_stateful_set(sts, release.namespace, {"spec": {"replicas": 4}})
        wait_for(lambda: statefulset(cluster, release) == (5, "4"), 30, interval=0.1,
                 what=f"the operator to put the StatefulSet back; last {statefulset(cluster, release)}")
        blocked = cluster.wait_condition(SINGLE, "ScaleInBlocked", "True", "ScaleInRefused", timeout=30)
        assert (f"cannot be scaled in to 4: partition {only}: its in-sync replicas [4] are all on leaving pods "
                "that are down") in blocked["message"]
        assert assignment(cluster, SINGLE)[only] == (4,)  # nothing to copy from: not moved
        run_pods(cluster.api, storage_pods(release.objects, [every[n] for n in range(5)])[4:])
        every[4].start()
        scaled_in(cluster, release, every, 4)
        wait_for(lambda: cluster.condition(SINGLE, "ScaleInBlocked") == {}, 30, what="ScaleInBlocked gone")

        # Scale-in 4 → 3 through the annotation: no pod goes before it is drained.
        before = {topic: assignment(cluster, topic) for topic in (SCALED, GROWN)}
        apps.patch_namespaced_stateful_set(sts, release.namespace, {"metadata": {"annotations": {ANNOTATION: "3"}}})
        scaled_in(cluster, release, every, 3)
        wait_settled(cluster, SCALED, before[SCALED], lambda a: all(sorted(r) == [0, 1, 2] for r in a),
                     "back on pods 0-2")
        wait_settled(cluster, GROWN, before[GROWN], lambda a: all(len(set(r)) == 2 and max(r) < 3 for r in a),
                     "two replicas each on pods 0-2")
    finally:
        for load in loads:
            load.close()

    # Every acknowledged record at its offset, replicas byte-identical below the HW, nothing left paused.
    assert sorted(Counter(r[0] for r in assignment(cluster, SINGLE)).values()) == [1, 2, 2]  # on pods 0-2, even
    for load in loads + [acked_single]:
        assert load.failed == [], f"{load.client} was told of failures: {load.failed[:3]}"
        for partition in range(load.partitions):
            check_acknowledged(nodes, load.topic, partition, load.acked)
    for n in range(3):
        paused = [(t, e["partition"]) for t, d in cluster.node_status(n)["topics"].items() for e in d["partitions"]
                  if (e.get("cleaning") or {}).get("state") == "paused"]
        assert paused == [], f"pod {n}: cleaning left paused on {paused}"
    metrics = cluster.metrics()
    assert f'shale_topic_moves{{namespace="{release.namespace}",state="ongoing",topic="{SCALED}"}} 0.0' in metrics
    assert "shale_operator_scale_in_target -1.0" in metrics


def size_on(server: ServeProcess, topic: str, partition: int) -> int:
    """The bytes of `topic`-`partition` a pod holds (0 while it has none), from its /status."""
    entries = (node_status(server)["topics"].get(topic) or {}).get("partitions") or []
    return sum(int(e.get("size_bytes") or 0) for e in entries if e["partition"] == partition)


def test_nodes_killed_mid_move_the_operators_move_still_completes(throttled):
    """spec.replicas 2 → 3 under `acks=all` load, the copy throttled: the new replica's pod is SIGKILLed in the
    middle of its copy and restarted (it resumes from what it has), then the partition's leader is SIGKILLed while
    the copy still runs (the other in-sync replica leads; the copy goes on from it) and restarted. The move ends
    done in the Topic's status, every acknowledged record is read back at its offset from three byte-identical
    replicas, and no pod is left with the partition's cleaning paused."""
    cluster, nodes, _, every = throttled
    topic = "killed"
    cluster.create_topic(topic, 1, {"min.insync.replicas": "1", "segment.bytes": "262144",
                                    "follower.replication.throttled.replicas": "*"}, replicas=2)
    cluster.wait_condition(topic, "Ready", "True", "PartitionsServed", timeout=90)
    [before] = assignment(cluster, topic)
    [target] = set(range(3)) - set(before)
    preload(nodes.bootstrap, topic, records=3000)  # ~3 MB: ~15 s of copy at the throttle
    load = AckedLoad("confluent", nodes.bootstrap, topic).start()
    try:
        load.wait_for_acks(50)
        cluster.patch_topic(topic, {"spec": {"replicas": 3}})

        # The new replica, SIGKILLed mid-copy: it holds part of the log, far from all of it.
        copied = wait_for(lambda: (n := size_on(every[target], topic, 0)) > 200_000 and n, MOVE_TIMEOUT,
                          interval=0.1, what=f"pod {target}'s copy of {topic}-0 to start")
        nodes.kill(target)
        assert size_on(every[before[0]], topic, 0) > copied + 1_000_000, "the kill came after the copy"
        nodes.restart(target)

        # The leader, SIGKILLed while the restarted replica still copies: the other in-sync replica leads.
        leader = nodes.wait_for_leader(topic, 0)
        wait_for(lambda: size_on(every[target], topic, 0) > copied, MOVE_TIMEOUT, interval=0.1,
                 what=f"pod {target} to copy again after its restart")
        assert size_on(every[leader.leader], topic, 0) > size_on(every[target], topic, 0) + 500_000, \
            "the copy ended before the leader's kill"
        nodes.kill(leader.leader)
        nodes.wait_for_leader(topic, 0, excluding=(leader.leader,), newer_than=leader.leader_epoch)
        nodes.restart(leader.leader)
        load.wait_for_acks(len(load.acked) + 100)
        acked = load.stop()  # a throttled copy catches up only once the writes stop outrunning the throttle
        assert load.failed == [], f"the producer was told of failures: {load.failed[:3]}"

        wait_settled(cluster, topic, [before], lambda a: sorted(a[0]) == [0, 1, 2], "three replicas")
        [move] = cluster.topic(topic)["status"]["moves"]
        assert (move["state"], sorted(move["targetReplicas"]), move["bytesRemaining"]) == ("done", [0, 1, 2], 0)
        check_acknowledged(nodes, topic, 0, acked)  # every ack at its offset; replicas byte-identical below the HW
    finally:
        load.close()
    for n in range(3):
        paused = [(t, e["partition"]) for t, d in cluster.node_status(n)["topics"].items() for e in d["partitions"]
                  if (e.get("cleaning") or {}).get("state") == "paused"]
        assert paused == [], f"pod {n}: cleaning left paused on {paused}"
