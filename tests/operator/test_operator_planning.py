"""A Topic CR → the manifest the pods read: validation, rendering, and the rules of a ConfigMap key's content."""

from __future__ import annotations

import uuid

import pytest
import yaml

from shale.operator.manifests import (
    SpecError,
    configmap_key,
    desired_topic,
    last_applied,
    loaded_digest,
    parse_applied,
    render,
    to_yaml,
)
from shale.operator.planning import Restore, lost_topics, plan, plan_restore
from shale.operator.storage import Storage, StorageError, StoragePod
from shale.sidecar.topics.manifests import parse_topic
from shale.sidecar.topics.registry import topic_uuid

UID = "0f7c3a52-9d8e-4b1a-8c55-1e2f3a4b5c6d"
DNS = "{pod}.{service}.{namespace}.svc:9092"


def body(name="prices", partitions=2, config=None, namespace="team-a", uid=UID, **spec):
    return {"metadata": {"name": name, "namespace": namespace, "uid": uid},
            "spec": {"partitions": partitions, "config": config or {}, **spec}}


def storage(replicas=2, pods=None) -> Storage:
    return Storage("data", "shale", "shale-headless", replicas, pods or {})


def test_config_is_checked_with_the_topic_config_table_and_written_as_kafka_strings():
    topic = desired_topic(body(config={"cleanup.policy": "compact, delete", "segment.ms": 100,
                                       "min.cleanable.dirty.ratio": 0.25, "preallocate": True}))
    assert topic.config == {"cleanup.policy": "compact,delete", "segment.ms": "100",
                            "min.cleanable.dirty.ratio": "0.25", "preallocate": "true"}
    assert (topic.topic_name, topic.partitions, topic.key) == ("prices", 2, "team-a_prices.yaml")


@pytest.mark.parametrize("config, key, words", [
    ({"retention.ms": "soon"}, "retention.ms", "Not a number"),
    ({"retention.msec": 1}, "retention.msec", "Unknown topic config name"),
    ({"cleanup.policy": "compress"}, "cleanup.policy", "compress"),
    ({"min.compaction.lag.ms": 10, "max.compaction.lag.ms": 5}, "min.compaction.lag.ms", "max.compaction.lag.ms"),
])
def test_an_invalid_config_names_its_key(config, key, words):
    with pytest.raises(SpecError) as info:
        desired_topic(body(config=config))
    assert info.value.reason == "InvalidConfig"
    assert str(info.value).startswith(f"spec.config.{key}: ") and words in str(info.value)


@pytest.mark.parametrize("spec, words", [
    ({"partitions": 0}, "spec.partitions"),
    ({"partitions": "3"}, "spec.partitions"),
    ({"topicName": "x" * 250}, "longer than 249"),
])
def test_an_invalid_spec_is_refused(spec, words):
    with pytest.raises(SpecError, match=words) as info:
        desired_topic(body(**spec))
    assert info.value.reason == "InvalidSpec"


def test_the_rendered_manifest_is_what_the_sidecar_parses():
    topic = desired_topic(body(config={"retention.ms": 1000}, topicName="Prices_V2"))
    manifest = render(topic, [(0,), (1,)], {0: "a:9092", 1: "b:9092"})
    spec = parse_topic(manifest, origin="test")
    assert (spec.name, spec.partitions, spec.assignment) == ("Prices_V2", 2, ((0,), (1,)))
    assert spec.nodes == {0: ("a", 9092), 1: ("b", 9092)}
    assert spec.config.retention_ms == 1000
    assert topic_uuid(spec.topic_id) == uuid.UUID(UID)  # the Topic's uid is the Kafka topic id
    applied = parse_applied(topic.key, yaml.safe_dump(manifest))
    assert (applied.namespace, applied.name, applied.uid, applied.topic_name) == ("team-a", "prices", UID,
                                                                                  "Prices_V2")
    assert (applied.partitions, applied.assignment) == (2, ((0,), (1,)))


def test_the_spec_digest_changes_with_what_the_pods_apply_and_only_with_that():
    """`loaded_digest` of the text written = the `spec_digest` a pod reports once it parsed that text."""
    def digest(assignment=(0, 1), nodes=None, **overrides) -> str:
        manifest = render(desired_topic(body(**overrides)), [(n,) for n in assignment], nodes or {0: "a:9092", 1: "b:9092"})
        return loaded_digest(to_yaml(manifest))  # the text the operator writes

    base = digest(config={"retention.ms": 1000})
    path = "/etc/shale/topics/team-a_prices.yaml"
    manifest = render(desired_topic(body(config={"retention.ms": 1000})), [(0,), (1,)], {0: "a:9092", 1: "b:9092"})
    assert parse_topic(manifest, origin="manifest:" + path).digest == base  # where it was read from: no matter
    assert digest(config={"retention.ms": "1000"}) == base  # the same value, written another way
    other_layout = yaml.safe_dump(manifest, sort_keys=True, default_flow_style=True)
    assert other_layout != to_yaml(manifest) and loaded_digest(other_layout) == base  # the same document
    changed = [digest(config={"retention.ms": 2000}), digest(config={"retention.ms": 1000, "segment.ms": 100}),
               digest(config={"retention.ms": 1000}, partitions=3, assignment=(0, 1, 1)),
               digest(config={"retention.ms": 1000}, assignment=(1, 0)),
               digest(config={"retention.ms": 1000}, nodes={0: "a:9092", 1: "c:9092"}),
               digest(config={"retention.ms": 1000}, uid=str(uuid.uuid4()))]
    assert len({base, *changed}) == 1 + len(changed)


def test_what_the_sidecar_would_refuse_is_not_rendered():
    with pytest.raises(SpecError, match="reserved") as info:
        render(desired_topic(body(topicName="__consumer_offsets")), [(0,), (0,)], {0: "a:1"})
    assert info.value.reason == "InvalidSpec"
    with pytest.raises(SpecError, match="not a UUID"):
        render(desired_topic(body(uid="not-a-uid")), [(0,), (0,)], {0: "a:1"})


def test_configmap_keys_never_collide_and_stay_legal():
    assert configmap_key("a-b", "c") != configmap_key("a", "b-c")
    assert configmap_key("a.b", "c") != configmap_key("a", "b.c")
    long = configmap_key("n" * 63, "x" * 253)
    assert len(long) <= 253 and long.endswith(".yaml") and long != configmap_key("n" * 63, "x" * 252 + "y")
    assert parse_applied("k", "not: [yaml") is None
    assert parse_applied("k", "kind: ConfigMap\nspec: {}") is None


def test_a_new_topic_is_placed_on_the_least_loaded_nodes():
    other = render(desired_topic(body("other", 3, uid=str(uuid.uuid4()))), [(0,), (1,), (0,)], {0: "x:1", 1: "y:1"})
    data = {"team-a_other.yaml": yaml.safe_dump(other), "README": "not a manifest"}
    text, owners, _ = plan(desired_topic(body(partitions=3)), data, storage(), DNS, {})
    assert owners == [(1,), (0,), (1,)]
    manifest = yaml.safe_load(text)
    assert manifest["spec"]["assignment"] == {"partitions": [1, 0, 1], "nodes": {
        "0": "shale-0.shale-headless.data.svc:9092", "1": "shale-1.shale-headless.data.svc:9092"}}
    assert manifest["metadata"] == {"name": "prices", "namespace": "team-a", "uid": UID}


def test_an_unchanged_spec_gives_the_same_text_and_a_change_keeps_the_placement():
    topic = desired_topic(body(partitions=2))
    text, owners, _ = plan(topic, {}, storage(), DNS, {})
    data = {topic.key: text}
    assert plan(topic, data, storage(), DNS, {})[:2] == (text, owners)
    grown = desired_topic(body(partitions=4, config={"retention.ms": 5}))
    text2, owners2, _ = plan(grown, data, storage(replicas=3), DNS, {})
    assert owners2[:2] == owners and owners2[2] == (2,)  # node 2 is new and empty
    assert yaml.safe_load(text2)["spec"]["config"] == {"retention.ms": "5"}


def test_placements_found_on_the_pods_are_kept_when_the_key_is_lost():
    topic = desired_topic(body(partitions=3))
    _, owners, _ = plan(topic, {}, storage(), DNS, {0: (1,), 1: (1,)})
    assert owners == [(1,), (1,), (0,)]


def test_decreasing_partitions_is_not_supported():
    topic = desired_topic(body(partitions=3))
    text, *_ = plan(topic, {}, storage(), DNS, {})
    with pytest.raises(SpecError, match="cannot be decreased from 3 to 2") as info:
        plan(desired_topic(body(partitions=2)), {topic.key: text}, storage(), DNS, {})
    assert info.value.reason == "NotSupported"
    with pytest.raises(SpecError, match="from 5 to 2"):  # the pods hold partition 4: the topic had 5
        plan(desired_topic(body(partitions=2)), {}, storage(), DNS, {4: 0})


def test_changing_the_topic_name_is_not_supported():
    text, *_ = plan(desired_topic(body()), {}, storage(), DNS, {})
    with pytest.raises(SpecError, match="topicName") as info:
        plan(desired_topic(body(topicName="renamed")), {"team-a_prices.yaml": text}, storage(), DNS, {})
    assert info.value.reason == "NotSupported"


def test_two_topics_for_one_kafka_topic_conflict():
    first = desired_topic(body("a", topicName="shared", namespace="x"))
    text, *_ = plan(first, {}, storage(), DNS, {})
    with pytest.raises(SpecError, match="managed by Topic x/a") as info:
        plan(desired_topic(body("b", topicName="shared", namespace="y")), {first.key: text}, storage(), DNS, {})
    assert info.value.reason == "ResourceConflict"


def test_addresses_from_pod_fields_need_the_pod():
    pods = {0: StoragePod("shale-0", 0, "10.0.0.7", {"kafka": 9092})}
    text, *_ = plan(desired_topic(body(partitions=1)), {}, storage(replicas=1, pods=pods), "{pod_ip}:{port_kafka}", {})
    assert yaml.safe_load(text)["spec"]["assignment"]["nodes"] == {"0": "10.0.0.7:9092"}
    with pytest.raises(StorageError, match="pod data/shale-1 does not exist"):
        plan(desired_topic(body(partitions=1)), {}, storage(replicas=2, pods=pods), "{pod_ip}:{port_kafka}", {})


def test_no_pod_for_new_partitions_is_a_storage_problem():
    with pytest.raises(StorageError, match="StatefulSet data/shale: no storage node"):
        plan(desired_topic(body(partitions=1)), {}, storage(replicas=0), DNS, {})


def test_lost_keys_are_written_back_where_the_pods_hold_the_logs():
    """A ConfigMap emptied by hand: every lost key is planned, on the pods that hold its partitions."""
    a = body("a", 3, {"retention.ms": 60000}, uid=str(uuid.uuid4()))
    b = body("b", 2, uid=str(uuid.uuid4()))
    found = {"a": {0: (1,), 1: (1,), 2: (0,)}, "b": {0: (0,), 1: (1,)}}
    before = {}
    for topic in (a, b):  # what the operator had written
        text, *_ = plan(desired_topic(topic), before, storage(), DNS, found[topic["metadata"]["name"]])
        before[desired_topic(topic).key] = text

    restore = plan_restore([b, a], {}, storage(), DNS, lambda name: found[name])
    assert restore.texts == before and restore.refused == {}  # byte for byte: same ids, config, placements
    assert plan_restore([], {"x.yaml": "x"}, storage(), DNS, lambda name: {}) == Restore({}, {}, {})


def test_a_lost_key_that_cannot_be_written_back_does_not_hold_back_the_others():
    good = body("good", 1, uid=str(uuid.uuid4()))
    bad = body("bad", 1, {"retention.ms": "soon"}, uid=str(uuid.uuid4()))  # refused since it was applied
    restore = plan_restore([good, bad], {}, storage(), DNS, lambda name: {0: (0,)})
    assert list(restore.texts) == ["team-a_good.yaml"]
    assert list(restore.refused) == ["team-a_bad.yaml"]
    assert restore.refused["team-a_bad.yaml"].startswith("spec.config.retention.ms: ")


@pytest.mark.parametrize("spec, reason", [
    ({"config": {"min.compaction.lag.ms": 10, "max.compaction.lag.ms": 5}}, "spec.config.min.compaction.lag.ms: "),
    ({"config": {"min.cleanable.dirty.ratio": [0.5]}}, "spec.config.min.cleanable.dirty.ratio: "),
    ({"partitions": 1}, "spec.partitions cannot be decreased from 2 to 1"),
    ({"topicName": "renamed"}, "spec.topicName cannot be added, changed or removed"),
])  # fmt: skip
def test_a_lost_key_whose_spec_is_refused_now_is_written_back_at_its_applied_spec(spec, reason):
    """All keys come back: pods that see only the final state would take one left out for a deletion."""
    ledger = body("ledger", 2, {"retention.ms": 86400000, "cleanup.policy": "compact"}, uid=str(uuid.uuid4()))
    other = body("other", 1, uid=str(uuid.uuid4()))
    found = {"ledger": {0: (1,), 1: (0,)}, "other": {0: (1,)}}
    before = {}
    for b in (ledger, other):
        applied = desired_topic(b)
        before[applied.key] = plan(applied, before, storage(), DNS, found[applied.topic_name])[0]
        b["status"] = {"topicName": applied.topic_name, "appliedSpec": applied.spec}
    assert last_applied(ledger) == desired_topic(ledger)  # the status round-trips to the same Topic
    ledger["spec"] = {**ledger["spec"], **spec}

    restore = plan_restore([ledger, other], {}, storage(), DNS, lambda name: found.get(name, {}))
    assert restore.texts == before and restore.refused == {}  # byte for byte the manifest the pods had
    assert list(restore.fallback) == ["team-a_ledger.yaml"] and reason in restore.fallback["team-a_ledger.yaml"]


def test_a_lost_key_is_refused_only_without_an_applied_spec_to_fall_back_on():
    never = body("never", 1, {"retention.ms": "soon"}, uid=str(uuid.uuid4()))
    never["status"] = {"topicName": "never"}  # applied by an operator that did not record the spec yet
    stale = body("stale", 1, {"retention.ms": "soon"}, uid=str(uuid.uuid4()))
    stale["status"] = {"topicName": "stale", "appliedSpec": {"topicName": "stale", "partitions": 1,
                                                             "config": {"segment.bytes": "1"}}}
    restore = plan_restore([never, stale], {}, storage(), DNS, lambda name: {0: (0,)})
    assert restore.texts == {} and restore.fallback == {} and last_applied(never) is None
    assert restore.refused["team-a_never.yaml"].startswith("spec.config.retention.ms: ")
    assert restore.refused["team-a_stale.yaml"].startswith("spec.config.retention.ms: ")
    assert "its last applied spec (status.appliedSpec) is refused too: spec.config.segment.bytes: " in \
        restore.refused["team-a_stale.yaml"]


def test_only_applied_topics_that_are_still_managed_count_as_lost():
    def applied(name, **meta):
        b = body(name, uid=f"uid-{name}")
        b["metadata"].update(meta)
        b["status"] = {"topicName": name}
        return b

    kept = applied("kept")
    bodies = [kept, applied("lost"), body("new", uid="uid-new"),  # never applied: its own handler writes it
              applied("paused", annotations={"shale.dev/paused-reconciliation": "true"}),
              applied("unmanaged", annotations={"shale.dev/managed": "false"}),
              applied("terminating", deletionTimestamp="2026-01-01T00:00:00Z"), applied("removed")]
    data = {"team-a_kept.yaml": "..."}
    assert [b["metadata"]["name"] for b in lost_topics(bodies, data, {"uid-removed"})] == ["lost"]


def test_replicas_place_each_partition_on_distinct_pods_and_the_sidecar_parses_the_lists():
    topic = desired_topic(body(partitions=3, replicas=3))
    text, owners, _ = plan(topic, {}, storage(replicas=3), DNS, {})
    assert owners == [(0, 1, 2), (1, 0, 2), (2, 0, 1)]
    manifest = yaml.safe_load(text)
    assert manifest["spec"]["assignment"]["partitions"] == [[0, 1, 2], [1, 0, 2], [2, 0, 1]]
    assert parse_topic(manifest, origin="test").assignment == ((0, 1, 2), (1, 0, 2), (2, 0, 1))
    assert parse_applied(topic.key, text).assignment == ((0, 1, 2), (1, 0, 2), (2, 0, 1))


def test_the_default_replication_factor_applies_without_spec_replicas_and_is_capped_by_the_pods():
    topic = desired_topic(body(partitions=2))
    assert topic.replicas is None
    assert plan(topic, {}, storage(replicas=2), DNS, {}, default_replicas=3)[1] == [(0, 1), (1, 0)]
    assert plan(topic, {}, storage(replicas=2), DNS, {})[1] == [(0,), (1,)]


def test_new_partitions_get_the_topics_replication_factor_and_lost_keys_keep_the_pods_found():
    topic = desired_topic(body(partitions=2, replicas=2))
    text, owners, _ = plan(topic, {}, storage(replicas=3), DNS, {})
    assert owners == [(0, 1), (2, 0)]  # the second's leader on the pod holding nothing yet
    grown = desired_topic(body(partitions=3, replicas=3))  # as Kafka's CreatePartitions: the topic's factor
    assert plan(grown, {topic.key: text}, storage(replicas=3), DNS, {})[1] == owners + [(1, 2)]
    # The key lost: the pods holding each partition's logs are its replicas.
    assert plan(grown, {}, storage(replicas=3), DNS, {0: (0, 2), 1: (1, 2)})[1] == [(0, 2), (1, 2), (2, 0)]


@pytest.mark.parametrize("replicas", [0, -1, "3", True, 1.5])
def test_spec_replicas_must_be_a_positive_integer(replicas):
    with pytest.raises(SpecError, match="spec.replicas must be an integer >= 1") as info:
        desired_topic(body(replicas=replicas))
    assert info.value.reason == "InvalidSpec"


def test_a_pod_gone_for_a_while_keeps_its_written_address_and_a_new_node_still_needs_its_pod():
    pods = {n: StoragePod(f"shale-{n}", n, "10.0.0.%d" % n, {"kafka": 9092}) for n in (0, 1)}
    topic = desired_topic(body(partitions=2))
    text, owners, _ = plan(topic, {}, storage(replicas=2, pods=pods), "{pod_ip}:{port_kafka}", {})
    assert yaml.safe_load(text)["spec"]["assignment"]["nodes"] == {"0": "10.0.0.0:9092", "1": "10.0.0.1:9092"}
    del pods[1]  # restarting, or stopped by a scale-in that is then held back
    again, *_ = plan(topic, {topic.key: text}, storage(replicas=2, pods=pods), "{pod_ip}:{port_kafka}", {})
    assert again == text
    with pytest.raises(StorageError, match="shale-1 does not exist"):
        plan(topic, {}, storage(replicas=2, pods=pods), "{pod_ip}:{port_kafka}", {})
