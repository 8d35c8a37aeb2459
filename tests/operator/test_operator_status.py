"""The pods' /status → a Topic's status and conditions (pure), checked against a real node's document too."""

from __future__ import annotations

import json
import re
import urllib.request
from pathlib import Path

from shale.operator.conditions import Condition, merge, rfc3339
from shale.operator.manifests import loaded_digest
from shale.operator.status import NodeReport, observe, placements
from shale.operator.storage import Storage
from support.node_util import NodeThread, topic_manifest, wait_for, write_manifests

STORAGE = Storage("data", "shale", "shale-headless", 2, {})
DOCS = Path(__file__).resolve().parents[2] / "docs" / "metrics.md"


def partition(p, state="idle", seconds=1.0, served=True, **extra):
    return {"partition": p, "served": served, "log_start_offset": 0, "log_end_offset": 10 + p, "size_bytes": 100 * (p + 1),
            "cleaning": {"state": state, "since_ms": 1_700_000_000_000, "seconds_in_state": seconds,
                         "pause_count": 1 if state == "paused" else 0,
                         "uncleanable_reason": "CorruptRecordException at offset 7" if state == "uncleanable" else None},
            "dirty_ratio": None, "last_clean_ms": None, **extra}


def report(ordinal, *entries, topic="t", errors=None):
    doc = {"version": 1, "topics": {topic: {"partitions": list(entries)}} if entries else {},
           "errors": errors or {"manifests": {}, "topics": {}}}
    return NodeReport(ordinal, f"shale-{ordinal}", document=doc)


def test_all_partitions_served_is_ready_with_their_offsets_and_sizes():
    reports = {0: report(0, partition(0), partition(2, dirty_ratio=0.4, last_clean_ms=1_700_000_100_000)),
               1: report(1, partition(1))}
    obs = observe("t", "ns_t.yaml", [(0,), (1,), (0,)], STORAGE, reports, 60)
    assert obs.ready == Condition("Ready", True, "PartitionsServed", "3 partition(s) served by shale-0, shale-1")
    assert obs.partitions[2] == {"partition": 2, "pod": "shale-0", "logStartOffset": 0, "logEndOffset": 12,
                                 "sizeBytes": 300, "cleaningState": "idle", "cleaningSince": "2023-11-14T22:13:20Z",
                                 "dirtyRatio": 0.4, "lastCleaned": "2023-11-14T22:15:00Z"}
    assert obs.disk_usage_bytes == 100 + 200 + 300
    assert obs.cleaning_stuck.status is False and obs.cleaning_stuck.reason == "CleaningProgressing"


def test_partitions_not_served_yet_are_named_with_the_reason():
    reports = {0: report(0, partition(0), partition(2, served=False)),
               1: NodeReport(1, "shale-1", error="GET http://x/status: Connection refused")}
    obs = observe("t", "ns_t.yaml", [(0,), (1,), (0,), (5,)], STORAGE, reports, 60)
    assert obs.ready.status is False and obs.ready.reason == "PartitionsNotServed"
    assert obs.ready.message == ("partitions not served: 1 (pod shale-1: GET http://x/status: Connection refused); "
                                 "2 (pod shale-0 does not serve it yet); "
                                 "3 (pod shale-5 is beyond the StatefulSet's 2 replicas)")
    assert obs.partitions[1] == {"partition": 1, "pod": "shale-1"}
    assert obs.disk_usage_bytes == 100


def test_a_refused_manifest_or_change_makes_the_topic_not_ready():
    errors = {"manifests": {"/etc/shale/topics/ns_t.yaml: t": "bad thing"}, "topics": {}}
    obs = observe("t", "ns_t.yaml", [(0,)], STORAGE, {0: report(0, partition(0), errors=errors)}, 60)
    assert obs.ready == Condition("Ready", False, "StorageRefused", "pod shale-0: bad thing")
    errors = {"manifests": {"/etc/shale/topics/other.yaml": "x"}, "topics": {"t": "fewer partitions: 1 < 2"}}
    obs = observe("t", "ns_t.yaml", [(0,)], STORAGE, {0: report(0, partition(0), errors=errors)}, 60)
    assert obs.ready.message == "pod shale-0: fewer partitions: 1 < 2"


def with_digest(report_: NodeReport, digest, ready=True, topic="t"):
    doc = dict(report_.document, ready=ready)
    doc["topics"] = {name: dict(entry, spec_digest=digest) for name, entry in doc["topics"].items()}
    if digest is not None and topic not in doc["topics"]:
        doc["topics"][topic] = {"spec_digest": digest, "partitions": []}  # a pod holding none of its partitions
    return NodeReport(report_.ordinal, report_.pod, document=doc)


def test_ready_needs_every_answering_pod_to_report_the_spec_just_written():
    three = Storage("data", "shale", "shale-headless", 3, {})
    owner = with_digest(report(0, partition(0)), "new")
    reports = {0: owner, 1: with_digest(report(1), "new"), 2: NodeReport(2, "shale-2", error="refused")}
    ready = observe("t", "k", [(0,)], three, reports, 60, spec_digest="new").ready
    assert ready == Condition("Ready", True, "PartitionsServed",
                              "1 partition(s) served by shale-0; spec new loaded by every pod")

    stale_owner = with_digest(report(0, partition(0)), "old")
    ready = observe("t", "k", [(0,)], three, {**reports, 0: stale_owner}, 60, spec_digest="new").ready
    assert ready == Condition("Ready", False, "SpecNotLoaded",
                              "the current spec (new) is not loaded yet: pod shale-0 has spec old")
    # A pod without a partition of the topic still answers Metadata for it: it must have loaded the spec too.
    for other, said in ((with_digest(report(1), "old"), "has spec old"),
                        (with_digest(report(1), None), "does not declare the topic yet")):
        ready = observe("t", "k", [(0,)], three, {**reports, 1: other}, 60, spec_digest="new").ready
        assert (ready.reason, ready.message) == ("SpecNotLoaded",
                                                 f"the current spec (new) is not loaded yet: pod shale-1 {said}")
    # ...unless it is still loading its logs (no clients are sent to it yet).
    loading = with_digest(report(1), None, ready=False)
    assert observe("t", "k", [(0,)], three, {**reports, 1: loading}, 60, spec_digest="new").ready.status is True
    # An owner that is not ready is never skipped: its partitions are not served.
    assert observe("t", "k", [(0,)], three, {**reports, 0: with_digest(report(0), None, ready=False)}, 60,
                   spec_digest="new").ready.reason == "PartitionsNotServed"


def test_cleaning_is_stuck_once_paused_or_uncleanable_for_the_threshold():
    below = observe("t", "k", [(0,)], STORAGE, {0: report(0, partition(0, "paused", 59.9))}, 60)
    assert below.cleaning_stuck.status is False
    at = observe("t", "k", [(0,), (1,)], STORAGE, {0: report(0, partition(0, "paused", 60.0)),
                                             1: report(1, partition(1, "in-progress", 9999))}, 60)
    assert at.cleaning_stuck == Condition(
        "CleaningStuck", True, "CleaningPaused",
        "partition 0 on pod shale-0: cleaning paused for 60 s (longer than 60 s; pause count 1)")
    both = observe("t", "k", [(0,), (1,)], STORAGE, {0: report(0, partition(0, "paused", 61)),
                                               1: report(1, partition(1, "uncleanable", 3600))}, 60)
    assert both.cleaning_stuck.reason == "CleaningStuck"  # more than one kind
    assert "partition 1 on pod shale-1: cleaning uncleanable for 3600 s" in both.cleaning_stuck.message
    assert "CorruptRecordException at offset 7" in both.cleaning_stuck.message
    assert both.ready.status is True  # stuck cleaning does not stop serving


def test_placements_are_the_pods_holding_each_partitions_logs():
    reports = {0: report(0, partition(0), partition(1, served=False)), 1: report(1, partition(1), partition(2))}
    assert placements("t", reports) == {0: (0,), 1: (0, 1), 2: (1,)}
    assert placements("other", reports) == {}


def test_conditions_keep_their_transition_time_until_the_status_flips():
    ready = Condition("Ready", True, "PartitionsServed", "ok")
    first = merge(None, [ready], generation=1, now="T1")
    assert first == [{"type": "Ready", "status": "True", "reason": "PartitionsServed", "message": "ok",
                      "lastTransitionTime": "T1", "observedGeneration": 1}]
    same = merge(first, [Condition("Ready", True, "PartitionsServed", "still ok")], generation=2, now="T2")
    assert same[0]["lastTransitionTime"] == "T1" and same[0]["message"] == "still ok"
    flipped = merge(same + [{"type": "ReconciliationPaused", "status": "True"}],
                    [Condition("Ready", False, "InvalidConfig", "x")], generation=3, now="T3",
                    drop=("ReconciliationPaused",))
    assert [(c["type"], c["status"], c["lastTransitionTime"]) for c in flipped] == [("Ready", "False", "T3")]
    assert rfc3339(0) == "1970-01-01T00:00:00Z"


def test_a_real_nodes_status_document_reads_as_expected(tmp_path):
    """The /status shape the operator reads is the one `shale serve` writes (docs/metrics.md)."""
    manifest = write_manifests(tmp_path / "topics" / "t.yaml", topic_manifest("t", 2, {"cleanup.policy": "compact"}))
    with NodeThread(tmp_path / "data", tmp_path / "topics") as node:
        url = f"http://127.0.0.1:{node.node.http.port}/status"

        def document():
            with urllib.request.urlopen(url, timeout=5) as r:
                doc = json.load(r)
            return doc if len(doc["topics"].get("t", {}).get("partitions", [])) == 2 else None

        doc = wait_for(document, what="both partitions in /status")
    digest = loaded_digest(manifest.read_text())  # what the operator computes from the text it wrote
    assert doc["topics"]["t"]["spec_digest"] == digest
    one_pod, reports = Storage("d", "shale", "h", 1, {}), {0: NodeReport(0, "shale-0", document=doc)}
    obs = observe("t", "t.yaml", [(0,), (0,)], one_pod, reports, 3600, spec_digest=digest)
    assert obs.ready.status is True
    other = loaded_digest(manifest.read_text().replace("compact", "delete"))
    assert observe("t", "t.yaml", [(0,), (0,)], one_pod, reports, 3600, spec_digest=other).ready.reason == "SpecNotLoaded"
    # Every field of a topic's entry is documented with the /status shape.
    rows = set(re.findall(r"^\| `topics\.<name>\.(\w+)", DOCS.read_text(), re.M))
    assert set(doc["topics"]["t"]) == rows == {"spec_digest", "partitions"}
    assert [set(p) for p in obs.partitions] == [{"partition", "pod", "logStartOffset", "logEndOffset", "sizeBytes",
                                                 "cleaningState", "cleaningSince", "dirtyRatio"}] * 2
    assert placements("t", {0: NodeReport(0, "shale-0", document=doc)}) == {0: (0,), 1: (0,)}


def test_refreshes_share_one_fetch_per_pod_while_it_is_recent():
    import asyncio

    from shale.operator.status import ReportCache

    fetches = []

    async def fetch():
        fetches.append(1)
        await asyncio.sleep(0.01)  # concurrent callers wait for this one fetch
        return NodeReport(0, "shale-0", document={"n": len(fetches)})

    async def scenario():
        shared = ReportCache(max_age=3600)
        first = await asyncio.gather(*(shared.get("http://a/status", fetch) for _ in range(5)))
        fresh = ReportCache(max_age=0)
        second = [await fresh.get("http://a/status", fetch) for _ in range(2)]
        return first, second

    first, second = asyncio.run(scenario())
    assert [r.document for r in first] == [{"n": 1}] * 5
    assert [r.document for r in second] == [{"n": 2}, {"n": 3}]  # max_age 0: always asked again


def replica(role, in_sync=True, lag=None, epoch=2):
    return {"role": role, "leader": 0 if role != "none" else -1, "leader_epoch": epoch, "replicas": [0, 1, 2],
            "isr": [0, 1], "in_sync": in_sync, "lag": lag, "under_replicated": role == "leader", "under_min_isr": False}


def test_replicated_partitions_show_each_replicas_role_and_need_a_leader():
    three = Storage("data", "shale", "shale-headless", 3, {})
    reports = {0: report(0, partition(0, replica=replica("leader"))),
               1: report(1, partition(0, replica=replica("follower", lag=0))),
               2: report(2, partition(0, replica=replica("follower", in_sync=False, lag=5)))}
    obs = observe("t", "k", [(0, 1, 2)], three, reports, 60)
    assert obs.ready == Condition("Ready", True, "PartitionsServed",
                                  "1 partition(s) (3 replicas each) served by shale-0, shale-1, shale-2")
    assert [(e["pod"], e["role"], e["inSync"], e["lag"]) for e in obs.partitions] == [
        ("shale-0", "leader", True, 0), ("shale-1", "follower", True, 0), ("shale-2", "follower", False, 5)]
    assert obs.disk_usage_bytes == 3 * 100  # every copy takes disk
    # Between a leader's death and the election every replica knows of no valid leader: not Ready.
    offline = {n: report(n, partition(0, replica=replica("none", in_sync=n < 2))) for n in (0, 1, 2)}
    obs = observe("t", "k", [(0, 1, 2)], three, offline, 60)
    assert obs.ready == Condition("Ready", False, "PartitionsNotServed", "partitions not served: 0 (no replica "
                                  "leads it: shale-0 offline, shale-1 offline, shale-2 offline)")
    assert {e["role"] for e in obs.partitions} == {"offline"}


def test_a_real_replicated_clusters_status_reads_as_expected(tmp_path, etcd):
    """/status of three real `shale serve --store etcd://…` replicas of one partition, as the operator reads it."""
    from support.cluster_util import produce
    from support.node_util import start_replicated_cluster

    cluster = start_replicated_cluster(tmp_path, etcd, 3, topic_manifest("t", 1, replicas=3))
    try:
        cluster.wait_for_isr("t", 0)
        produce(cluster.bootstrap, "t", {0: 7})  # acks=all: on every in-sync replica when acknowledged

        def documents():
            docs = {}
            for n, server in cluster.servers.items():
                with urllib.request.urlopen(f"http://127.0.0.1:{server.http_port}/status", timeout=5) as r:
                    docs[n] = NodeReport(n, f"shale-{n}", document=json.load(r))
            obs = observe("t", "t.yaml", [(0, 1, 2)], Storage("d", "shale", "h", 3, {}), docs, 3600)
            caught_up = all(e.get("inSync") and e.get("lag") == 0 and e["logEndOffset"] == 7 for e in obs.partitions)
            return obs if obs.ready.status and caught_up else None

        obs = wait_for(documents, 30, what="every replica in sync and caught up in /status")
    finally:
        cluster.stop()
    assert sorted(e["role"] for e in obs.partitions) == ["follower", "follower", "leader"]  # one leader
