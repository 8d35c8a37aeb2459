"""Topic manifests: parsing (`parse_topic`) and reading a file or directory of them (`ManifestSource`)."""

from __future__ import annotations

import base64
import threading
import uuid
from pathlib import Path

import pytest
import yaml

from shale.sidecar.server.manifests import (
    API_VERSION, ORIGIN_PREFIX, ManifestError, ManifestSource, parse_topic, watch,
)
from shale.sidecar.topic_config import TopicConfig

from node_util import topic_manifest, write_manifests


def by_name(specs) -> dict:
    return {s.name: s for s in specs}


# -- parse_topic -----------------------------------------------------------------------------------


def test_a_good_manifest_becomes_a_topic_spec_with_its_config_parsed_by_the_config_table():
    doc = topic_manifest("prices", 3, {"cleanup.policy": "compact", "segment.ms": 100,
                                       "min.cleanable.dirty.ratio": 0.1})
    spec = parse_topic(doc, origin=ORIGIN_PREFIX + "/m/prices.yaml")
    assert (spec.name, spec.partitions, spec.origin) == ("prices", 3, "manifest:/m/prices.yaml")
    assert spec.config == TopicConfig.from_mapping({"cleanup.policy": "compact", "segment.ms": "100",
                                                    "min.cleanable.dirty.ratio": "0.1"})
    assert spec.config.cleanup_policy == ("compact",) and spec.config.segment_ms == 100
    assert spec.assignment is None and spec.topic_id is None and dict(spec.nodes) == {}


def test_yaml_native_values_and_defaults():
    doc = {"apiVersion": API_VERSION, "kind": "Topic", "metadata": {"name": "plain"},
           "spec": {"config": {"retention.ms": -1, "preallocate": True, "cleanup.policy": ["compact", "delete"]}}}
    spec = parse_topic(doc, origin="manifest:x")
    assert spec.partitions == 1  # spec.partitions defaults to 1
    assert spec.config.retention_ms == -1 and spec.config.preallocate is True
    assert spec.config.cleanup_policy == ("compact", "delete")
    # No spec at all: Kafka's defaults.
    bare = parse_topic({"apiVersion": API_VERSION, "kind": "Topic", "metadata": {"name": "bare"}}, origin="m")
    assert (bare.partitions, bare.config) == (1, TopicConfig.from_mapping({}))


def test_topic_name_takes_precedence_over_metadata_name():
    doc = topic_manifest("latest-price", topicName="latest_price")
    assert parse_topic(doc, origin="m").name == "latest_price"


@pytest.mark.parametrize("change, fragment", [
    ({"apiVersion": "shale.dev/v1"}, "apiVersion must be shale.dev/v1alpha1, got 'shale.dev/v1'"),
    ({"metadata": {}}, "a Topic needs metadata.name"),
    ({"metadata": {"name": "has space"}}, "topic 'has space': a topic name is 1-249 characters"),
    ({"metadata": {"name": "x" * 250}}, "a topic name is 1-249 characters"),
    ({"metadata": {"name": ".."}}, "a topic name is 1-249 characters"),
    ({"metadata": {"name": "__consumer_offsets"}}, "topic __consumer_offsets: the name is reserved"),
    ({"spec": {"partitions": 0}}, "topic t: spec.partitions must be an integer >= 1, got 0"),
    ({"spec": {"partitions": "two"}}, "spec.partitions must be an integer >= 1, got 'two'"),
    ({"spec": {"partitions": True}}, "spec.partitions must be an integer >= 1, got True"),
    ({"spec": {"config": ["retention.ms"]}}, "topic t: spec.config must be a mapping"),
    ({"spec": {"config": {"retention.ms": "soon"}}},
     "topic t: invalid config: Invalid value soon for configuration retention.ms: Not a number of type LONG"),
    ({"spec": {"config": {"retention.msec": 1}}}, "topic t: invalid config: Unknown topic config name: retention.msec"),
    ({"spec": {"config": {"min.compaction.lag.ms": 10, "max.compaction.lag.ms": 5}}},
     "min.compaction.lag.ms (10) > max.compaction.lag.ms (5)"),
    ({"metadata": {"name": "t", "uid": "not-a-uuid"}}, "topic t: metadata.uid 'not-a-uuid' is not a UUID"),
    ({"metadata": ["t"]}, "metadata and spec must be mappings"),
])
def test_an_invalid_topic_is_refused_with_a_message_naming_the_field(change, fragment):
    doc = {**topic_manifest("t"), **change}
    with pytest.raises(ManifestError) as info:
        parse_topic(doc, origin="m")
    assert fragment in str(info.value)


def test_uid_becomes_the_topic_id_in_kafkas_text_form():
    uid = "3f2a1c9e-5b7d-4e8f-9a0b-1c2d3e4f5a6b"
    doc = topic_manifest("with-uid")
    doc["metadata"]["uid"] = uid
    spec = parse_topic(doc, origin="m")
    assert spec.topic_id == base64.urlsafe_b64encode(uuid.UUID(uid).bytes).rstrip(b"=").decode()
    assert len(spec.topic_id) == 22 and "=" not in spec.topic_id


def test_assignment_names_the_node_of_each_partition_and_their_addresses():
    nodes = {"0": "shale-0.shale:9092", "1": "shale-1.shale:9093"}
    spec = parse_topic(topic_manifest("spread", 3, assignment={"partitions": [1, 0, 1], "nodes": nodes}), origin="m")
    assert spec.assignment == (1, 0, 1)
    assert dict(spec.nodes) == {0: ("shale-0.shale", 9092), 1: ("shale-1.shale", 9093)}
    assert [spec.node_of(p, default=7) for p in range(3)] == [1, 0, 1]


@pytest.mark.parametrize("assignment, fragment", [
    ({"partitions": [0], "nodes": {"0": "a:1"}}, "must list one node id for each of the 2 partitions"),
    ({"partitions": [0, 2], "nodes": {"0": "a:1"}}, "partition 1 is assigned to node 2, which spec.assignment.nodes"),
    ({"partitions": [0, 0], "nodes": {"0": "a:port"}}, "spec.assignment.nodes[0] must map a node id to 'host:port'"),
    ({"partitions": [0, 0], "nodes": {"0": ":9092"}}, "spec.assignment.nodes[0] has no host"),
    ([0, 0], "spec.assignment must be a mapping"),
])
def test_a_bad_assignment_is_refused(assignment, fragment):
    with pytest.raises(ManifestError, match="topic spread") as info:
        parse_topic(topic_manifest("spread", 2, assignment=assignment), origin="m")
    assert fragment in str(info.value)


# -- ManifestSource --------------------------------------------------------------------------------


def test_a_multi_document_file_declares_every_topic_in_it(tmp_path):
    path = tmp_path / "topics.yaml"
    path.write_text(yaml.safe_dump(topic_manifest("a", 2)) + "---\n" + yaml.safe_dump(topic_manifest("b"))
                    + "---\n")  # a trailing empty document is allowed
    source = ManifestSource(str(path))
    specs = by_name(source.reload())
    assert sorted(specs) == ["a", "b"] and specs["a"].partitions == 2
    assert {s.origin for s in specs.values()} == {ORIGIN_PREFIX + str(path)}
    assert source.errors == {}


def test_a_directory_is_read_recursively_skipping_other_objects_hidden_entries_and_other_files(tmp_path):
    root = tmp_path / "topics"
    write_manifests(root / "a.yaml", topic_manifest("top"))
    write_manifests(root / "team" / "billing" / "b.yml", topic_manifest("nested", 2),
                    {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "unrelated"}})
    (root / "team" / "notes.txt").write_text("kind: Topic\n")  # not YAML by name: ignored
    (root / "team" / "list.yaml").write_text("- 1\n- 2\n")  # YAML, but no objects
    write_manifests(root / "..2024_01_01" / "c.yaml", topic_manifest("configmap-internal"))  # ConfigMap's ..data
    write_manifests(root / ".hidden.yaml", topic_manifest("hidden"))
    source = ManifestSource(str(root))
    specs = by_name(source.reload())
    assert sorted(specs) == ["nested", "top"]
    assert specs["nested"].origin == ORIGIN_PREFIX + str(root / "team" / "billing" / "b.yml")
    assert source.errors == {}


def test_broken_yaml_is_refused_naming_the_file_and_keeps_what_it_declared(tmp_path):
    path = write_manifests(tmp_path / "t.yaml", topic_manifest("keep", 2, {"retention.ms": 1000}))
    source = ManifestSource(str(tmp_path))
    first = by_name(source.reload())
    path.write_text("apiVersion: shale.dev/v1alpha1\nkind: Topic\nmetadata: {name: keep\n")
    second = by_name(source.reload())
    assert second == first  # nothing deleted, nothing reverted
    assert list(source.errors) == [str(path)]
    assert source.errors[str(path)].startswith(f"{path}: not readable as YAML")
    # Fixed: the new spec applies and the error is gone.
    write_manifests(path, topic_manifest("keep", 3, {"retention.ms": 2000}))
    third = by_name(source.reload())
    assert (third["keep"].partitions, third["keep"].config.retention_ms) == (3, 2000)
    assert source.errors == {}


def test_broken_yaml_in_a_new_file_declares_nothing(tmp_path):
    (tmp_path / "new.yaml").write_text("kind: [Topic\n")
    source = ManifestSource(str(tmp_path))
    assert source.reload() == []
    assert list(source.errors) == [str(tmp_path / "new.yaml")]


def test_an_invalid_topic_keeps_its_last_good_spec_while_its_neighbours_change(tmp_path):
    path = write_manifests(tmp_path / "t.yaml", topic_manifest("a", 1, {"retention.ms": 1000}),
                           topic_manifest("b", 1, {"retention.ms": 1000}))
    source = ManifestSource(str(tmp_path))
    before = by_name(source.reload())
    write_manifests(path, topic_manifest("a", 1, {"retention.ms": "-7"}), topic_manifest("b", 1, {"retention.ms": 5}))
    after = by_name(source.reload())
    assert after["a"] == before["a"]  # refused: last good config
    assert after["b"].config.retention_ms == 5  # its neighbour changes
    key = f"{path}: a"
    assert list(source.errors) == [key]
    assert source.errors[key] == (f"{path}: topic a: invalid config: Invalid value -7 for configuration "
                                  "retention.ms: Value must be at least -1")


def test_bad_partitions_and_bad_api_version_are_refused_with_file_and_topic(tmp_path):
    path = write_manifests(tmp_path / "t.yaml", topic_manifest("p", 0), {**topic_manifest("v"), "apiVersion": "x/v1"})
    source = ManifestSource(str(tmp_path))
    assert source.reload() == []  # never good before: nothing declared
    assert source.errors == {
        f"{path}: p": f"{path}: topic p: spec.partitions must be an integer >= 1, got 0",
        f"{path}: v": f"{path}: apiVersion must be shale.dev/v1alpha1, got 'x/v1'",
    }


def test_a_topic_declared_twice_stays_with_the_first_declaration(tmp_path):
    write_manifests(tmp_path / "b.yaml", topic_manifest("dup", 1, {"retention.ms": 1}))
    source = ManifestSource(str(tmp_path))
    assert by_name(source.reload())["dup"].config.retention_ms == 1
    # A file that sorts first declares the same name: the topic stays with b.yaml.
    write_manifests(tmp_path / "a.yaml", topic_manifest("dup", 1, {"retention.ms": 2}), topic_manifest("other"))
    specs = by_name(source.reload())
    assert specs["dup"].config.retention_ms == 1 and specs["dup"].origin == ORIGIN_PREFIX + str(tmp_path / "b.yaml")
    assert "other" in specs
    key = f"{tmp_path / 'a.yaml'}: dup"
    assert list(source.errors) == [key]
    assert f"topic dup is already declared in {tmp_path / 'b.yaml'}; this declaration is ignored" in source.errors[key]


def test_two_new_declarations_of_one_name_go_to_the_first_file_in_order(tmp_path):
    write_manifests(tmp_path / "z.yaml", topic_manifest("dup", 1, {"retention.ms": 26}))
    write_manifests(tmp_path / "a.yaml", topic_manifest("dup", 1, {"retention.ms": 1}))
    source = ManifestSource(str(tmp_path))
    (spec,) = source.reload()
    assert spec.config.retention_ms == 1
    assert list(source.errors) == [f"{tmp_path / 'z.yaml'}: dup"]


def test_removing_a_file_removes_its_topics(tmp_path):
    path = write_manifests(tmp_path / "t.yaml", topic_manifest("gone"))
    source = ManifestSource(str(tmp_path))
    assert [s.name for s in source.reload()] == ["gone"]
    path.unlink()
    assert source.reload() == [] and source.errors == {}


def test_a_single_file_path_is_a_source_too(tmp_path):
    path = write_manifests(tmp_path / "one.yaml", topic_manifest("solo"))
    write_manifests(tmp_path / "other.yaml", topic_manifest("not-read"))
    source = ManifestSource(str(path))
    assert [s.name for s in source.reload()] == ["solo"]


def test_an_empty_or_missing_directory_declares_nothing(tmp_path):
    assert ManifestSource(str(tmp_path)).reload() == []
    assert ManifestSource(str(Path(tmp_path) / "absent")).reload() == []


def test_watching_one_file_ignores_its_busy_neighbours(tmp_path):
    """`--topics topics.yaml` beside `--data-dir data`: appends to the data dir must not reload manifests."""
    manifest = tmp_path / "topics.yaml"
    manifest.write_text("kind: Topic\n")
    (tmp_path / "data").mkdir()
    changed = threading.Event()
    stop = watch(str(manifest), changed.set, debounce_s=0.05)
    try:
        for i in range(20):
            (tmp_path / "data" / f"{i:020d}.log").write_bytes(b"x" * 100)
        (tmp_path / "neighbour.yaml").write_text("not mine\n")
        assert not changed.wait(1.0), "a change beside the watched file triggered a reload"
        replacement = tmp_path / ".topics.yaml.tmp"
        replacement.write_text("kind: Topic\nmetadata: {name: x}\n")
        replacement.replace(manifest)  # as editors and kubectl-projected ConfigMaps replace files
        assert changed.wait(10), "replacing the watched file did not trigger a reload"
    finally:
        stop()
