"""The store's JSON records (records.py): every valid record survives the round trip, and any other text is a
RecordError that names where it came from — never another exception, never a silently different record."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shale.sidecar.log.topic_partition import TopicPartition
from shale.sidecar.replication.store_records import NO_LEADER, NodeRegistration, PartitionRecord, RecordError

node_ids = st.integers(min_value=0, max_value=2**31 - 1)
texts = st.text(max_size=40)


@st.composite
def partition_records(draw) -> PartitionRecord:
    replicas = tuple(draw(st.lists(node_ids, min_size=1, max_size=7, unique=True)))
    isr = tuple(r for r in replicas if draw(st.booleans()))
    leader = draw(st.sampled_from(isr)) if isr and draw(st.booleans()) else NO_LEADER
    incarnations = tuple(draw(texts) for _ in isr) if draw(st.booleans()) else ()
    return PartitionRecord(replicas, isr, leader, draw(texts), draw(st.integers(0, 2**31 - 1)),
                           draw(st.integers(0, 2**31 - 1)), draw(st.booleans()), incarnations)


registrations = st.builds(NodeRegistration, node_ids, texts, texts, st.integers(0, 65535),
                          st.none() | texts,
                          st.lists(st.builds(TopicPartition, texts, node_ids), max_size=3).map(tuple))


@given(partition_records())
def test_partition_record_round_trip(record):
    assert PartitionRecord.from_json(record.to_json(), "k") == record
    assert PartitionRecord.from_json(record.to_json().encode(), "k") == record


@given(registrations)
def test_node_registration_round_trip(node):
    assert NodeRegistration.from_json(node.to_json(), "k") == node


@given(partition_records(), st.dictionaries(st.sampled_from(["isr", "leader", "replicas", "leader_epoch"]),
                                            st.none() | st.booleans() | st.floats() | texts | st.lists(texts)))
def test_damaged_partition_record_is_a_record_error_naming_the_key(record, damage):
    raw = {**json.loads(record.to_json()), **damage}
    try:
        parsed = PartitionRecord.from_json(json.dumps(raw), "/shale/c/partitions/t/0")
    except RecordError as exc:
        assert str(exc).startswith("/shale/c/partitions/t/0: ")
    else:  # only damage that is still a valid record may parse, and then exactly as written
        assert json.loads(parsed.to_json()) == {**raw, "replicas": list(parsed.replicas), "isr": list(parsed.isr)}


@given(st.text() | st.binary())
def test_any_text_is_a_record_or_a_record_error(text):
    for parse in (PartitionRecord.from_json, NodeRegistration.from_json):
        try:
            parse(text, "somewhere")
        except RecordError:
            pass


@pytest.mark.parametrize("text", ["[]", "null", '"x"', "{",
                                  '{"node_id": true, "incarnation": "a", "host": "h", "port": 1}'])
def test_not_a_registration(text):
    with pytest.raises(RecordError, match="nodes/3"):
        NodeRegistration.from_json(text, "/shale/c/nodes/3")


def test_records_written_before_isr_incarnations_and_unreplicated_lists_still_read():
    """Older nodes wrote neither field: their records read as members of unknown process, no held data."""
    old = '{"isr": [1, 2], "leader": 1, "leader_epoch": 4, "leader_incarnation": "a", "partition_epoch": 9, ' \
          '"recovering": false, "replicas": [1, 2, 3]}'
    record = PartitionRecord.from_json(old, "k")
    assert (record.isr, record.isr_incarnations, record.isr_incarnation(2)) == ((1, 2), ("", ""), "")
    node = NodeRegistration.from_json('{"host": "h", "incarnation": "a", "node_id": 1, "port": 9, "rack": null}', "k")
    assert node.unreplicated == () and "unreplicated" not in node.to_json()
    with pytest.raises(RecordError, match="k: .*2 incarnations"):
        PartitionRecord.from_json(old.replace('"isr": [1, 2]', '"isr": [1], "isr_incarnations": ["a", "b"]'), "k")


def test_an_isr_change_keeps_the_members_processes():
    record = PartitionRecord((1, 2, 3), (1, 2), 1, "a", 4, 9, isr_incarnations=("a", "b"))
    assert record.changed(isr=(1, 2, 3)).isr_incarnations == ("a", "b", "")
    assert record.changed(isr=(2,), leader=2, leader_incarnation="b").isr_incarnations == ("b",)


def test_invalid_partition_records_are_refused():
    with pytest.raises(RecordError, match="not within replicas"):
        PartitionRecord((1, 2), (3,))
    with pytest.raises(RecordError, match="not in the isr"):
        PartitionRecord((1, 2), (2,), leader=1)
    with pytest.raises(RecordError, match="distinct"):
        PartitionRecord((1, 1), (1,))
