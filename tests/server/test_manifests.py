"""Topic manifests: parsing (`parse_topic`) and reading a file or directory of them (`ManifestSource`)."""

from __future__ import annotations

import base64
import shutil
import threading
import time
import uuid
from pathlib import Path

import pytest
import yaml

from shale.sidecar.topic_config import TopicConfig
from shale.sidecar.topics.manifests import (
    API_VERSION,
    HELD_DELETION_DISABLED,
    HELD_MISSING,
    ORIGIN_PREFIX,
    ManifestError,
    ManifestSource,
    parse_topic,
    require_path,
    watch,
)
from support.node_util import topic_manifest, wait_for, write_manifests


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
    assert spec.assignment == ((1,), (0,), (1,))
    assert dict(spec.nodes) == {0: ("shale-0.shale", 9092), 1: ("shale-1.shale", 9093)}
    assert [spec.node_of(p, default=7) for p in range(3)] == [1, 0, 1]


def test_assignment_lists_the_replicas_of_each_partition_and_needs_no_addresses_with_a_store():
    spec = parse_topic(topic_manifest("replicated", 2, assignment={"partitions": [[0, 1, 2], [1, 2, 0]]}, replicas=3),
                       origin="m")
    assert spec.assignment == ((0, 1, 2), (1, 2, 0)) and dict(spec.nodes) == {}
    assert [spec.node_of(p, default=7) for p in range(2)] == [0, 1]  # the preferred leader
    assert spec.replicas_of(1) == (1, 2, 0) and spec.replication_factor == 3 and spec.replicated


def test_replicas_alone_leave_the_choice_of_nodes_to_the_store():
    spec = parse_topic(topic_manifest("chosen", 3, replicas=2), origin="m")
    assert spec.assignment is None and spec.replicas_of(0) is None
    assert spec.replication_factor == 2 and spec.replicated


def test_the_digest_of_a_one_replica_assignment_is_the_one_it_had_before_replication():
    """Pods that upgrade report the same spec_digest for an unchanged manifest (the operator's Ready check)."""
    nodes = {"0": "a:1", "1": "b:2"}
    plain = parse_topic(topic_manifest("spread", 2, assignment={"partitions": [1, 0], "nodes": nodes}), origin="m")
    as_lists = parse_topic(topic_manifest("spread", 2, assignment={"partitions": [[1], [0]], "nodes": nodes}),
                           origin="m")
    assert plain == as_lists and plain.digest == "1af21b47e7dfe1d0"  # computed by the code before replication
    assert parse_topic(topic_manifest("spread", 2, replicas=1, assignment={"partitions": [1, 0], "nodes": nodes}),
                       origin="m").digest != plain.digest


@pytest.mark.parametrize("spec, fragment", [
    ({"replicas": 0}, "spec.replicas must be an integer >= 1, got 0"),
    ({"replicas": "3"}, "spec.replicas must be an integer >= 1, got '3'"),
    ({"replicas": 2, "assignment": {"partitions": [[0, 1, 2], [1, 2, 0]]}},
     "spec.replicas is 2, but spec.assignment.partitions names 3 replicas per partition"),
    ({"replicas": 2, "assignment": {"partitions": [[0, 1], [1]]}},
     "spec.replicas is 2, but spec.assignment.partitions names 1 replicas per partition"),
    ({"assignment": {"partitions": [[0, 0], [1, 2]]}}, "partitions[0] must be a node id or a list of distinct node ids"),
    ({"assignment": {"partitions": [[], [1]]}}, "partitions[0] must be a node id or a list of distinct node ids"),
    ({"assignment": {"partitions": [0, "1"]}}, "partitions[1] must be a node id or a list of distinct node ids"),
    ({"assignment": {"partitions": [[0, 1], [1, 2]], "nodes": {"0": "a:1", "1": "b:1"}}},
     "partition 1 is assigned to node 2, which spec.assignment.nodes does not name"),
])
def test_bad_replicas_are_refused(spec, fragment):
    with pytest.raises(ManifestError, match="topic spread") as info:
        parse_topic(topic_manifest("spread", 2, **spec), origin="m")
    assert fragment in str(info.value)


@pytest.mark.parametrize("assignment, fragment", [
    ({"partitions": [0], "nodes": {"0": "a:1"}}, "must list one node id (or a list of replicas) for each of the 2 partitions"),
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


def test_a_directory_is_read_recursively_skipping_hidden_entries_and_other_files(tmp_path):
    root = tmp_path / "topics"
    write_manifests(root / "a.yaml", topic_manifest("top"))
    write_manifests(root / "team" / "billing" / "b.yml", topic_manifest("nested", 2))
    (root / "team" / "notes.txt").write_text("kind: Topic\n")  # not YAML by name: ignored
    write_manifests(root / "..2024_01_01" / "c.yaml", topic_manifest("configmap-internal"))  # ConfigMap's ..data
    write_manifests(root / ".hidden.yaml", topic_manifest("hidden"))
    source = ManifestSource(str(root))
    specs = by_name(source.reload())
    assert sorted(specs) == ["nested", "top"]
    assert specs["nested"].origin == ORIGIN_PREFIX + str(root / "team" / "billing" / "b.yml")
    assert source.errors == {} and source.files_found == 2 and source.missing is None


def test_a_document_that_is_not_a_topic_is_refused_and_its_neighbours_apply(tmp_path):
    path = write_manifests(tmp_path / "b.yaml", topic_manifest("nested", 2),
                           {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "unrelated"}})
    (tmp_path / "list.yaml").write_text("- 1\n- 2\n")
    source = ManifestSource(str(tmp_path))
    assert [s.name for s in source.reload()] == ["nested"]
    assert source.errors == {
        f"{path}: unrelated": f"{path}: document 2: kind must be Topic, got 'ConfigMap' (every YAML document under "
                              "--topics must be a Topic)",
        f"{tmp_path / 'list.yaml'}: document 1": f"{tmp_path / 'list.yaml'}: document 1 is a YAML list, not a Topic",
    }
    assert source.refusals == 2


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
    write_manifests(tmp_path / "u.yaml", topic_manifest("stays"))
    source = ManifestSource(str(tmp_path))
    assert sorted(s.name for s in source.reload()) == ["gone", "stays"]
    path.unlink()
    assert [s.name for s in source.reload()] == ["stays"]
    assert source.errors == {} and source.held == {} and source.missing is None


def test_removing_a_document_from_a_clean_file_removes_its_topic(tmp_path):
    path = write_manifests(tmp_path / "t.yaml", topic_manifest("a"), topic_manifest("b"))
    source = ManifestSource(str(tmp_path))
    assert sorted(s.name for s in source.reload()) == ["a", "b"]
    write_manifests(path, topic_manifest("b"))  # an edit, not a truncation: the file does not start as before
    assert [s.name for s in source.reload()] == ["b"] and source.errors == {}


# -- What is refused: the topics keep their last good spec ---------------------------------------------


def edited(tmp_path, change) -> tuple[ManifestSource, dict, Path]:
    """A file declaring `orders` (3 partitions, compacted) and `audit`, read once, then changed by `change`."""
    path = write_manifests(tmp_path / "orders.yaml",
                           topic_manifest("orders", 3, {"cleanup.policy": "compact", "retention.ms": -1}),
                           topic_manifest("audit", 1, {"retention.ms": 3600000}))
    source = ManifestSource(str(tmp_path))
    good = by_name(source.reload())
    change(path)
    return source, good, path


BREAKAGES = {
    "kind": lambda p: p.write_text(p.read_text().replace("kind: Topic", "kind: Topics")),
    "api_version": lambda p: p.write_text(p.read_text().replace("shale.dev/v1alpha1", "shale.dev/v1")),
    "empty": lambda p: p.write_bytes(b""),
    "blank": lambda p: p.write_text("\n  \n"),
    "comments_only": lambda p: p.write_text("# orders moved to another team\n"),
    "not_yaml": lambda p: p.write_text("apiVersion: shale.dev/v1alpha1\nkind: Topic\nmetadata: {name: orders\n"),
    "not_utf8": lambda p: p.write_bytes(b"\xff\xfe" + p.read_bytes()),
    "a_list": lambda p: p.write_text("- orders\n- audit\n"),
    "invalid_config": lambda p: p.write_text(p.read_text().replace("'-1'", "'-7'")),
    "half": lambda p: p.write_bytes(p.read_bytes()[:len(p.read_bytes()) // 2]),
    "first_document_only": lambda p: p.write_bytes(p.read_bytes().split(b"---")[0]),
    "a_directory_now": lambda p: (p.unlink(), p.mkdir()),
}


@pytest.mark.parametrize("breakage", BREAKAGES)
def test_a_broken_file_is_refused_and_deletes_or_changes_nothing(tmp_path, breakage):
    source, good, path = edited(tmp_path, BREAKAGES[breakage])
    after = by_name(source.reload())
    if breakage == "a_directory_now":  # the file is gone (a directory of that name holds nothing): held
        assert source.held.keys() == {"orders", "audit"} and source.missing
    else:
        assert any(key.startswith(str(path)) for key in source.errors), source.errors
        assert all(message.startswith(f"{path}: ") for message in source.errors.values())
        assert source.refusals >= 1
    assert after == good  # every topic at its last good spec: nothing deleted, nothing reverted


def test_every_truncation_of_a_file_is_refused_or_harmless(tmp_path):
    """Cut at every byte: the file is its last applied content's beginning, so nothing it declared changes."""
    source, good, path = edited(tmp_path, lambda p: None)
    full = path.read_bytes()
    assert by_name(source.reload()) == good
    refused = 0
    for cut in range(len(full)):
        path.write_bytes(full[:cut])
        assert by_name(source.reload()) == good, f"cut at byte {cut}: {full[:cut]!r}"
        # Refused, unless read afresh the cut file declares exactly the same (e.g. only a final newline or a
        # default value's line is gone).
        fresh = ManifestSource(str(tmp_path))
        harmless = by_name(fresh.reload()) == good and fresh.errors == {}
        assert bool(source.errors) != harmless, f"cut at byte {cut}: errors {source.errors}"
        refused += bool(source.errors)
        path.write_bytes(full)
        assert by_name(source.reload()) == good and source.errors == {}
    assert refused >= len(full) - 20  # nearly every cut changes what the file declares


def test_a_truncated_file_names_the_cut_and_an_edit_that_shortens_it_differently_applies(tmp_path):
    source, good, path = edited(tmp_path, lambda p: None)
    full = path.read_bytes()
    path.write_bytes(full[:40])
    source.reload()
    assert source.errors == {str(path): f"{path}: truncated: the file is the first 40 of the {len(full)} bytes it "
                                        "held when last applied (to shorten it on purpose, change it in another "
                                        "way too)"}
    write_manifests(path, topic_manifest("audit", 1, {"retention.ms": 3600000}))  # orders' document removed
    assert [s.name for s in source.reload()] == ["audit"] and source.errors == {}


def test_a_refused_document_keeps_the_topics_its_file_declared_before_even_without_a_name(tmp_path):
    path = write_manifests(tmp_path / "t.yaml", topic_manifest("a"), topic_manifest("b", 2))
    source = ManifestSource(str(tmp_path))
    good = by_name(source.reload())
    broken = topic_manifest("b", 2)
    del broken["metadata"]  # the name is gone with the damage
    write_manifests(path, topic_manifest("a", 1, {"retention.ms": 5}), broken)
    after = by_name(source.reload())
    assert after["b"] == good["b"] and after["a"].config.retention_ms == 5  # the valid neighbour applies
    assert list(source.errors) == [f"{path}: document 2"]


# -- Mass disappearance and delete.topic.enable: held, never deleted -----------------------------------


def test_every_manifest_file_gone_at_once_deletes_nothing(tmp_path):
    root = tmp_path / "topics"
    a = write_manifests(root / "a.yaml", topic_manifest("a"))
    b = write_manifests(root / "team" / "b.yaml", topic_manifest("b", 2))
    source = ManifestSource(str(root))
    good = by_name(source.reload())
    a.unlink()
    b.unlink()
    assert by_name(source.reload()) == good
    assert {name: h.reason for name, h in source.held.items()} == {"a": HELD_MISSING, "b": HELD_MISSING}
    assert source.missing == f"no manifest file left under {root}"
    # A new file does not make the vanished ones deletable: they stay held until declared again.
    write_manifests(root / "c.yaml", topic_manifest("c"))
    assert sorted(s.name for s in source.reload()) == ["a", "b", "c"] and source.held.keys() == {"a", "b"}
    write_manifests(a, topic_manifest("a"))
    write_manifests(b, topic_manifest("b", 2))
    assert sorted(s.name for s in source.reload()) == ["a", "b", "c"]
    assert source.held == {} and source.missing is None


@pytest.mark.parametrize("how", ["removed", "renamed", "emptied", "replaced_by_a_file"])
def test_the_directory_itself_gone_deletes_nothing(tmp_path, how):
    root = tmp_path / "topics"
    write_manifests(root / "a.yaml", topic_manifest("a"))
    source = ManifestSource(str(root))
    good = by_name(source.reload())
    if how == "removed":
        shutil.rmtree(root)
    elif how == "renamed":
        root.rename(tmp_path / "topics.old")
    elif how == "emptied":
        (root / "a.yaml").unlink()
    else:
        shutil.rmtree(root)
        root.write_text("not a directory\n")
    assert by_name(source.reload()) == good and source.held["a"].reason == HELD_MISSING
    assert source.missing


def test_a_directory_replaced_by_one_without_the_declaring_files_deletes_nothing(tmp_path):
    root = tmp_path / "topics"
    write_manifests(root / "a.yaml", topic_manifest("a"))
    source = ManifestSource(str(root))
    good = by_name(source.reload())
    root.rename(tmp_path / "topics.old")
    write_manifests(root / "other-team.yaml", topic_manifest("theirs"))
    assert by_name(source.reload()) == {**good, "theirs": by_name(source.reload())["theirs"]}
    assert source.held["a"].reason == HELD_MISSING
    assert source.missing == f"none of the 1 manifest file read before is left under {root} (replaced?)"


def test_a_placeholder_file_makes_removing_the_last_manifest_explicit(tmp_path):
    """A file that declares nothing (and never did) is no refusal; beside it the last manifest is not the last file."""
    (tmp_path / "placeholder.yaml").write_text("# keeps this directory from ever being empty\n")
    last = write_manifests(tmp_path / "last.yaml", topic_manifest("last"))
    source = ManifestSource(str(tmp_path))
    assert [s.name for s in source.reload()] == ["last"] and source.errors == {}
    last.unlink()
    assert source.reload() == [] and source.held == {} and source.missing is None
    (tmp_path / "placeholder.yaml").unlink()  # now the directory is empty: nothing was declared, nothing held
    assert source.reload() == [] and source.held == {}


def test_a_single_file_path_removed_is_a_mass_disappearance(tmp_path):
    path = write_manifests(tmp_path / "topics.yaml", topic_manifest("solo"))
    source = ManifestSource(str(path))
    good = by_name(source.reload())
    path.unlink()
    assert by_name(source.reload()) == good and source.missing == f"{path} does not exist"


def test_with_delete_topic_enable_false_a_removed_manifest_is_held(tmp_path):
    a = write_manifests(tmp_path / "a.yaml", topic_manifest("a", 2))
    write_manifests(tmp_path / "b.yaml", topic_manifest("b"))
    source = ManifestSource(str(tmp_path), delete_topic_enable=False)
    good = by_name(source.reload())
    a.unlink()
    assert by_name(source.reload()) == good
    assert source.held["a"].reason == HELD_DELETION_DISABLED and source.missing is None
    assert source.held["a"].message == (f"topic a: its manifest was removed from {a}, but delete.topic.enable is "
                                        "false: the topic and its data are kept")


def test_a_held_topic_deleted_another_way_is_forgotten(tmp_path):
    path = write_manifests(tmp_path / "a.yaml", topic_manifest("a"))
    source = ManifestSource(str(tmp_path))
    source.reload()
    path.unlink()
    assert [s.name for s in source.reload()] == ["a"]
    source.forget("a")  # TopicRegistry.remove (DeleteTopics) tells the node, which tells the source
    assert source.reload() == [] and source.held == {}


def test_no_manifest_at_all_beside_undeclared_logs_is_reported(tmp_path):
    source = ManifestSource(str(tmp_path))
    source.reload()
    source.check_strays({"orders"})
    assert source.missing == (f"no manifest file under {tmp_path}, but the data directory holds logs of 1 topic "
                              "no manifest declares (orders): kept, not served")
    write_manifests(tmp_path / "orders.yaml", topic_manifest("orders"))
    source.reload()
    source.check_strays(set())
    assert source.missing is None


def test_a_single_file_path_is_a_source_too(tmp_path):
    path = write_manifests(tmp_path / "one.yaml", topic_manifest("solo"))
    write_manifests(tmp_path / "other.yaml", topic_manifest("not-read"))
    source = ManifestSource(str(path))
    assert [s.name for s in source.reload()] == ["solo"]


def test_an_empty_directory_declares_nothing_and_a_missing_one_is_reported(tmp_path):
    empty = ManifestSource(str(tmp_path))
    assert empty.reload() == [] and empty.missing is None and empty.errors == {}
    absent = ManifestSource(str(Path(tmp_path) / "absent"))
    assert absent.reload() == [] and absent.missing == f"{tmp_path / 'absent'} does not exist"


def test_a_missing_path_cannot_start_a_node(tmp_path):
    require_path(str(tmp_path))
    with pytest.raises(ManifestError, match=f"--topics {tmp_path / 'typo'}: no such file or directory"):
        require_path(str(tmp_path / "typo"))


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


def test_a_volume_mounted_and_unmounted_between_two_looks_is_read_again(tmp_path):
    """A reload that an inotify event started read the files of a volume mounted meanwhile; the volume is
    gone again before the next look, so the watched identity never changed: the look still reloads."""
    import os
    import subprocess

    root = tmp_path / "topics"
    root.mkdir()
    identities: list[tuple[int, int]] = []

    def on_change() -> None:
        st = os.stat(root)
        identities.append((st.st_dev, st.st_ino))

    stop = watch(str(root), on_change, debounce_s=0.3, resync_s=2.0)
    try:
        disk = os.stat(root)
        (root / "a.yaml").write_text("kind: Topic\n")  # an event: the reload runs 0.3 s later ...
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "shale-test", str(root)], check=True)
        try:  # ... and reads the mount
            wait_for(lambda: identities, timeout=1.5, what="the reload the event started")
        finally:
            subprocess.run(["umount", str(root)], check=True)
        assert identities[0] != (disk.st_dev, disk.st_ino), "the reload ran before the mount: nothing tested"
        wait_for(lambda: len(identities) > 1, timeout=10, what="a reload after the unmount")
        assert identities[-1] == (disk.st_dev, disk.st_ino)
    finally:
        stop()


def test_watching_a_directory_follows_it_when_it_is_replaced(tmp_path):
    """inotify watches inodes: after `topics` is swapped for a new directory, changes in the new one count."""
    root = tmp_path / "topics"
    root.mkdir()
    changed = threading.Event()
    stop = watch(str(root), changed.set, debounce_s=0.05, resync_s=0.1)
    try:
        (root / "a.yaml").write_text("kind: Topic\n")
        assert changed.wait(10), "a change in the directory did not trigger a reload"
        changed.clear()
        root.rename(tmp_path / "topics.old")
        assert changed.wait(10), "the directory renamed away did not trigger a reload"
        root.mkdir()
        changed.clear()
        (root / "b.yaml").write_text("kind: Topic\n")  # seen by the new watch, or by the look that moved it
        assert changed.wait(10), "the new directory did not trigger a reload"
        changed.clear()
        (root / "c.yaml").write_text("kind: Topic\n")  # the watch has moved: only inotify can report this
        assert changed.wait(10), "a change in the new directory did not trigger a reload"
        changed.clear()
        (tmp_path / "topics.old" / "d.yaml").write_text("kind: Topic\n")
        assert not changed.wait(0.5), "a change in the old, renamed directory triggered a reload"
        for _ in range(3):  # removed and made again: the new directory often gets the old inode number
            shutil.rmtree(root)
            root.mkdir()
            (root / "e.yaml").write_text("kind: Topic\n")
            assert changed.wait(10), "the directory made again did not trigger a reload"
            changed.clear()
            (root / "f.yaml").write_text("kind: Topic\n")
            assert changed.wait(10), "the first change in the directory made again did not trigger a reload"
            changed.clear()
            (root / "g.yaml").write_text("kind: Topic\n")  # the watch has moved by now
            assert changed.wait(10), "a change in the directory made again did not trigger a reload"
            changed.clear()
    finally:
        stop()


@pytest.mark.parametrize("layout", ["file", "directory"])
def test_reading_the_manifests_does_not_trigger_another_reload(tmp_path, layout):
    """A reload opens and reads the watched file; those events are no change, so nothing may follow.

    They used to mark the file as replaced, and every resync then reloaded again (YAML parsed on the
    event loop every few seconds while nothing changed)."""
    root = tmp_path / "topics"
    root.mkdir()
    manifest = root / "topics.yaml"
    manifest.write_text("kind: Topic\nmetadata: {name: a}\n")
    watched = manifest if layout == "file" else root
    reloads: list[int] = []

    def read_all() -> None:
        for p in sorted(root.iterdir()):
            p.read_text()

    def on_change() -> None:
        reloads.append(1)
        read_all()

    stop = watch(str(watched), on_change, debounce_s=0.05, resync_s=0.1)
    try:
        read_all()  # as the node reads the manifests right after it starts watching
        time.sleep(1.5)  # fifteen looks
        assert reloads == [], f"{len(reloads)} reloads while nothing changed"
        manifest.write_text("kind: Topic\nmetadata: {name: b}\n")
        wait_for(lambda: reloads, timeout=10, what="a reload after a real change")
    finally:
        stop()
