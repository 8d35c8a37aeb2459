"""The Topic CRD: generated from the config table, structural, and refusing what it should, with its messages.

OpenAPI validation is jsonschema over the CRD's openAPIV3Schema, CEL rules run in cel-python, patterns
compile in RE2 (the API server's regexp engine), and pruning of unknown fields follows apiextensions'
rule (chart_util). Each bad Topic is checked for the message a user would see.
"""

from __future__ import annotations

import copy
import re

import celpy
import jsonschema
import pytest
import re2
import yaml
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from shale.operator import crd as crd_module
from shale.sidecar.cli import main as shale_main
from shale.sidecar.topic_config import (
    CONFIG_KEYS,
    INT_MAX,
    INT_MIN,
    LONG_MAX,
    LONG_MIN,
    InvalidConfigError,
    TopicConfig,
)
from support.chart_util import (
    CRD_FILES,
    ROOT,
    as_json_schema,
    cel,
    structural_violations,
    subschemas,
    topic_schema,
    unknown_fields,
)

CRD = crd_module.crd()
SCHEMA = topic_schema(CRD)
# OpenAPI v3's schema object is a JSON Schema draft 4 dialect, plus `nullable`.
VALIDATOR = jsonschema.Draft4Validator(as_json_schema(SCHEMA))
CONFIG = SCHEMA["properties"]["spec"]["properties"]["config"]
SPEC_RULES = {r["fieldPath"]: r for r in SCHEMA["properties"]["spec"]["x-kubernetes-validations"]}


def topic(spec: dict | None = None, name: str = "prices", **extra) -> dict:
    obj = {"apiVersion": "shale.dev/v1alpha1", "kind": "Topic", "metadata": {"name": name, "namespace": "kafka"}}
    if spec is not None:
        obj["spec"] = spec
    obj.update(extra)
    return obj


def errors(obj: dict) -> list[str]:
    return sorted(e.message for e in VALIDATOR.iter_errors(obj))


# -- the generated file -------------------------------------------------------------------------------


@pytest.mark.parametrize("path", CRD_FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_committed_crd_is_the_generators_output(path):
    assert path.read_text(encoding="utf-8") == crd_module.render_yaml(), (
        f"{path.relative_to(ROOT)} is stale: run "
        "shale crd -o crds/topics.shale.dev.yaml -o helm/shale/crds/topics.shale.dev.yaml"
    )


def test_shale_crd_prints_and_writes_the_crd(tmp_path, capsys):
    assert shale_main(["crd"]) == 0
    assert capsys.readouterr().out == crd_module.render_yaml()
    out = tmp_path / "a" / "crd.yaml"
    assert shale_main(["crd", "-o", str(out)]) == 0
    assert yaml.safe_load(out.read_text()) == CRD


def test_names_and_subresources():
    spec = CRD["spec"]
    assert CRD["metadata"]["name"] == "topics.shale.dev"
    assert (spec["group"], spec["scope"]) == ("shale.dev", "Namespaced")
    assert spec["names"] == {"kind": "Topic", "listKind": "TopicList", "plural": "topics", "singular": "topic",
                             "shortNames": ["stp"], "categories": ["shale"]}
    [version] = spec["versions"]
    assert (version["name"], version["served"], version["storage"]) == ("v1alpha1", True, True)
    assert version["subresources"] == {"status": {}}


def test_config_properties_are_the_tables_keys():
    assert list(CONFIG["properties"]) == [key.name for key in CONFIG_KEYS]
    for key in CONFIG_KEYS:
        assert CONFIG["properties"][key.name]["description"] == key.doc


def test_annotations_are_documented_in_the_crd():
    assert 'shale.dev/paused-reconciliation: "true"' in SCHEMA["description"]
    assert 'shale.dev/managed: "false"' in SCHEMA["description"]


# -- what the API server requires of the schema ------------------------------------------------------


def test_schema_is_structural():
    assert structural_violations(SCHEMA) == []


def test_structural_check_catches_what_the_api_server_refuses():
    """The checker itself: the table's own schema (additionalProperties: false) is refused, as upstream."""
    broken = copy.deepcopy(SCHEMA)
    broken["properties"]["spec"]["properties"]["config"]["additionalProperties"] = False
    del broken["properties"]["spec"]["properties"]["partitions"]["type"]
    broken["properties"]["spec"]["properties"]["topicName"]["anyOf"] = [{"type": "string"}]
    assert structural_violations(broken) == [
        ".spec.partitions: must have a type",
        ".spec.topicName.anyOf: sets type",
        ".spec.config: properties and additionalProperties are mutually exclusive",
    ]


def test_preserve_unknown_fields_only_on_number_or_string_and_boolean_or_string_values():
    """Nowhere else: spec, config and status prune (and refuse) what they do not declare."""
    untyped = {path for path, node in subschemas(SCHEMA) if node.get("x-kubernetes-preserve-unknown-fields")}
    expected = {f".spec.config.{k.name}" for k in CONFIG_KEYS if k.type.name in ("double", "boolean")}
    assert untyped == expected and expected


def test_every_pattern_compiles_in_re2():
    patterns = [node["pattern"] for _, node in subschemas(SCHEMA) if "pattern" in node]
    assert len(patterns) > len(CONFIG_KEYS) // 2
    for pattern in patterns:
        re2.compile(pattern)


def test_defaults_are_valid():
    partitions = SCHEMA["properties"]["spec"]["properties"]["partitions"]
    jsonschema.Draft4Validator(partitions).validate(partitions["default"])


def test_every_cel_rule_compiles():
    rules = SCHEMA["x-kubernetes-validations"] + SCHEMA["properties"]["spec"]["x-kubernetes-validations"]
    for rule in rules:
        for field in ("rule", "messageExpression"):
            if field in rule:
                celpy.Environment().compile(rule[field])
        assert rule.get("reason", "FieldValueInvalid") in ("FieldValueInvalid", "FieldValueForbidden",
                                                            "FieldValueRequired", "FieldValueDuplicate")


# -- good Topics -------------------------------------------------------------------------------------


def test_readme_example_is_valid():
    """The README's manifest (quoted values, Kafka style) is what `kubectl apply` will get."""
    readme = (ROOT / "README.md").read_text()
    block = re.search(r"```yaml\n(apiVersion: shale.dev/v1alpha1\n.*?)```", readme, re.S)[1]
    doc = yaml.safe_load(block)
    assert doc["spec"]["config"]["min.cleanable.dirty.ratio"] == "0.01"
    assert errors(doc) == []
    assert unknown_fields(doc, SCHEMA) == []


def test_minimal_topic_is_valid():
    assert errors(topic({})) == []


def test_every_key_in_native_and_string_form():
    native = {key.name: (",".join(key.default) if key.type.name == "list" else key.default) for key in CONFIG_KEYS}
    strings = {key.name: key.to_string(key.default) for key in CONFIG_KEYS}
    for config in (native, strings):
        obj = topic({"partitions": 3, "topicName": "Prices_V2", "config": config})
        assert errors(obj) == [] and unknown_fields(obj, SCHEMA) == []
        TopicConfig.from_mapping(config)  # and the operator's check agrees


def test_status_as_the_operator_writes_it():
    status = {
        "observedGeneration": 2,
        "topicName": "prices",
        "appliedSpec": {"topicName": "prices", "partitions": 2, "config": {"cleanup.policy": "compact",
                                                                         "retention.ms": "86400000"}},
        "diskUsageBytes": 81234,
        "conditions": [
            {"type": "Ready", "status": "True", "reason": "Reconciled", "message": "",
             "lastTransitionTime": "2026-11-21T10:00:00Z", "observedGeneration": 2},
            {"type": "CleaningStuck", "status": "False", "reason": "Cleaning",
             "lastTransitionTime": "2026-11-21T10:00:00Z"},
        ],
        "partitions": [
            {"partition": 0, "pod": "demo-shale-storage-0", "logStartOffset": 0, "logEndOffset": 1200,
             "sizeBytes": 81234, "cleaningState": "paused", "cleaningSince": "2026-11-21T10:00:00Z",
             "dirtyRatio": 0.42, "lastCleaned": None},
            {"partition": 1, "pod": "demo-shale-storage-1", "cleaningState": "idle", "dirtyRatio": None},
        ],
    }
    obj = topic({"partitions": 2}, status=status)
    assert errors(obj) == [] and unknown_fields(obj, SCHEMA) == []


# -- bad Topics and their messages -------------------------------------------------------------------


@pytest.mark.parametrize("spec, message", [
    ({"partitions": 0}, "0 is less than the minimum of 1"),
    ({"partitions": "3"}, "'3' is not of type 'integer'"),
    ({"partitions": 2**31}, "2147483648 is greater than the maximum of 2147483647"),
    ({"topicName": ".."}, "'..' should not be valid under {'enum': ['.', '..']}"),
    ({"topicName": "a/b"}, "'a/b' does not match '^[a-zA-Z0-9._-]+$'"),
    ({"topicName": "x" * 250}, f"'{'x' * 250}' is too long"),
    ({"config": "cleanup.policy=compact"}, "'cleanup.policy=compact' is not of type 'object'"),
    ({"config": {"cleanup.policy": "compacted"}}, "'compacted' does not match"),
    ({"config": {"cleanup.policy": ["compact"]}}, "['compact'] is not of type 'string'"),
    ({"config": {"segment.bytes": 13}}, "13 is less than the minimum of 14"),
    ({"config": {"segment.bytes": 2**31}}, "2147483648 is greater than the maximum of 2147483647"),
    ({"config": {"segment.bytes": "1 GiB"}}, "'1 GiB' does not match '^([+-]?)0*([0-9]+)$'"),
    ({"config": {"retention.ms": -2}}, "-2 is less than the minimum of -1"),
    ({"config": {"retention.ms": 1.5}}, "1.5 is not valid under any of the given schemas"),
    ({"config": {"min.cleanable.dirty.ratio": 1.5}}, "1.5 is greater than the maximum of 1"),
    ({"config": {"min.cleanable.dirty.ratio": "half"}}, "'half' does not match"),
    ({"config": {"compression.type": "brotli"}}, "'brotli' is not one of"),
    ({"config": {"compression.gzip.level": 0}}, "0 should not be valid under {'enum': [0]}"),
    ({"config": {"preallocate": "yes"}}, "'yes' does not match"),
    ({"config": {"message.timestamp.type": "createtime"}},
     "'createtime' is not one of ['CreateTime', 'LogAppendTime']"),
])  # fmt: skip
def test_bad_spec_is_refused_with_its_message(spec, message):
    found = errors(topic(spec))
    assert len(found) == 1 and found[0].startswith(message), found


def test_spec_is_required():
    assert errors(topic(None)) == ["'spec' is a required property"]


def test_bad_status_is_refused():
    bad = {"partitions": [{"partition": 0, "cleaningSince": 1732299990000}], "conditions": [{"type": "Ready"}]}
    assert errors(topic({}, status=bad)) == ["'status' is a required property",
                                             "1732299990000 is not of type 'string', 'null'"]


def test_unknown_config_key_is_refused_by_the_api_server_and_the_operator():
    obj = topic({"config": {"cleanup.policy": "compact", "retention.msec": 1000}})
    assert errors(obj) == []  # an unknown key is no OpenAPI error: it is pruned before validation...
    assert unknown_fields(obj, SCHEMA) == ['unknown field "spec.config.retention.msec"']  # ...or refused (strict)
    assert "additionalProperties" not in CONFIG and "x-kubernetes-preserve-unknown-fields" not in CONFIG
    with pytest.raises(InvalidConfigError, match="Unknown topic config name: retention.msec"):
        TopicConfig.from_mapping(obj["spec"]["config"])


def test_unknown_spec_field_is_refused():
    obj = topic({"partitions": 1, "replicas": 3, "replicationFactor": 3, "assignment": {"partitions": [0]}})
    assert unknown_fields(obj, SCHEMA) == ['unknown field "spec.replicationFactor"', 'unknown field "spec.assignment"']


def test_values_the_crd_cannot_type_are_left_to_the_operator():
    """A list where a number or boolean is due passes the untyped property and is refused by TopicConfig."""
    for key, value, rule in [("min.cleanable.dirty.ratio", [0.5], "Expected value to be a double, but it was a list"),
                             ("preallocate", 1, "Expected value to be either true or false")]:
        assert errors(topic({"config": {key: value}})) == []
        with pytest.raises(InvalidConfigError, match=re.escape(rule)):
            TopicConfig.from_mapping({key: value})


def test_cross_key_rules_are_left_to_the_operator():
    config = {"min.compaction.lag.ms": 10, "max.compaction.lag.ms": 5}
    assert errors(topic({"config": config})) == []
    with pytest.raises(InvalidConfigError, match=r"min.compaction.lag.ms \(10\) > max.compaction.lag.ms \(5\)"):
        TopicConfig.from_mapping(config)


# -- the CRD agrees with the config table ------------------------------------------------------------

_NUMERIC = [k for k in CONFIG_KEYS if k.type.name in ("int", "long", "double")]


def _kafka_accepts(key, value) -> bool:
    try:
        key.parse(value)
        return True
    except InvalidConfigError:
        return False


def _crd_accepts(key, value) -> bool:
    return not list(jsonschema.Draft4Validator(CONFIG["properties"][key.name]).iter_errors(value))


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(_NUMERIC), st.one_of(st.integers(LONG_MIN * 2, LONG_MAX * 2),
                                            st.integers(INT_MIN - 5, INT_MAX + 5), st.integers(-200000, 30)))
def test_native_integers_accepted_exactly_as_kafka_does(key, value):
    # Except a long past 64 bits, which the schema cannot bound (kube-apiserver holds bounds as float64, and 2^63-1
    # overflows its int64 check): the parser refuses it (tests/test_topic_config.py, past 64 bits).
    assume(not (key.type.name == "long" and not LONG_MIN <= value <= LONG_MAX))
    assert _crd_accepts(key, value) == _kafka_accepts(key, value), (key.name, value)


@settings(max_examples=200, deadline=None)
@given(st.sampled_from([k for k in CONFIG_KEYS if k.type.name == "double"]),
       st.floats(allow_nan=False, allow_infinity=True, width=64))
def test_native_doubles_accepted_exactly_as_kafka_does(key, value):
    assert _crd_accepts(key, value) == _kafka_accepts(key, value), (key.name, value)


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(CONFIG_KEYS), st.text(alphabet="0123456789.-+eE,*:abcdefiInprtuyzCLT ", max_size=12))
def test_string_refused_by_the_crd_is_refused_by_kafka(key, value):
    """The CRD never refuses a string Kafka takes, except for spaces around it (Kafka trims them)."""
    if value != value.strip():
        return
    if not _crd_accepts(key, value):
        assert not _kafka_accepts(key, value), (key.name, value)


# -- CEL rules (cel-python) --------------------------------------------------------------------------


def test_partitions_may_grow_but_never_shrink():
    rule = SPEC_RULES[".partitions"]
    assert cel(rule["rule"], self={"partitions": 4}, oldSelf={"partitions": 3}) is True
    assert cel(rule["rule"], self={"partitions": 3}, oldSelf={"partitions": 3}) is True
    assert cel(rule["rule"], self={"partitions": 2}, oldSelf={"partitions": 3}) is False
    message = cel(rule["messageExpression"], self={"partitions": 2}, oldSelf={"partitions": 3})
    assert message == "spec.partitions cannot be decreased from 3 to 2: Kafka cannot remove partitions"
    assert rule["message"] == crd_module.PARTITIONS_DECREASE_MESSAGE
    assert rule["reason"] == "FieldValueForbidden"


@pytest.mark.parametrize("old, new, allowed", [
    ({}, {}, True),
    ({"topicName": "Prices"}, {"topicName": "Prices"}, True),
    ({"topicName": "Prices"}, {"topicName": "Prices2"}, False),
    ({}, {"topicName": "Prices"}, False),
    ({"topicName": "Prices"}, {}, False),
])  # fmt: skip
def test_topic_name_is_fixed(old, new, allowed):
    rule = SPEC_RULES[".topicName"]
    result = cel(rule["rule"], self={"partitions": 1, **new}, oldSelf={"partitions": 1, **old})
    assert result is allowed
    assert rule["message"] == crd_module.TOPIC_NAME_CHANGE_MESSAGE


@pytest.mark.parametrize("name, spec, allowed", [
    ("x" * 249, {}, True),
    ("x" * 250, {}, False),
    ("x" * 250, {"topicName": "short"}, True),
])  # fmt: skip
def test_long_metadata_name_needs_topic_name(name, spec, allowed):
    [rule] = SCHEMA["x-kubernetes-validations"]
    result = cel(rule["rule"], self={"metadata": {"name": name}, "spec": spec})
    assert result is allowed
    assert "set spec.topicName" in rule["message"]


# -- printer columns ---------------------------------------------------------------------------------


def test_printer_columns_point_at_declared_fields():
    columns = {c["name"]: c for c in CRD["spec"]["versions"][0]["additionalPrinterColumns"]}
    assert list(columns) == ["Policy", "Partitions", "Ready", "CleaningStuck", "Size", "Topic", "Age"]
    spec, status = SCHEMA["properties"]["spec"]["properties"], SCHEMA["properties"]["status"]["properties"]
    assert columns["Policy"]["jsonPath"] == r".spec.config.cleanup\.policy"
    assert "cleanup.policy" in spec["config"]["properties"]
    assert columns["Partitions"]["jsonPath"] == ".spec.partitions" and spec["partitions"]["type"] == "integer"
    assert columns["Size"]["jsonPath"] == ".status.diskUsageBytes" and status["diskUsageBytes"]["type"] == "integer"
    for name in ("Ready", "CleaningStuck"):
        assert columns[name]["jsonPath"] == f'.status.conditions[?(@.type=="{name}")].status'
        assert name in crd_module.CONDITION_TYPES
    assert "status" in status["conditions"]["items"]["properties"]
    assert columns["Age"] == {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}
