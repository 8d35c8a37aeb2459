"""The store's topic records (topic_record.py): every valid record survives the JSON round trip, and any other
text is a RecordError naming where it came from — never another exception, never a different record."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shale.sidecar.replication.store_records import RecordError
from shale.sidecar.replication.topic_record import TopicRecord

node_ids = st.integers(min_value=0, max_value=2**31 - 1)
names = st.text(min_size=1, max_size=40)
topic_records = st.builds(
    TopicRecord, names, names,
    st.lists(st.lists(node_ids, min_size=1, max_size=5, unique=True).map(tuple), min_size=1, max_size=8).map(tuple),
    st.dictionaries(st.text(max_size=30), st.text(max_size=30), max_size=4))


@given(topic_records)
def test_topic_record_round_trip(record):
    assert TopicRecord.from_json(record.to_json(), "k") == record
    assert TopicRecord.from_json(record.to_json().encode(), "k") == record


@given(topic_records, st.sampled_from(["name", "topic_id", "assignment", "partitions", "config"]),
       st.none() | st.integers() | st.text(max_size=5) | st.lists(st.integers(), max_size=2) | st.booleans())
def test_damaged_topic_record_is_a_record_error_naming_the_key(record, field, value):
    raw = json.loads(record.to_json())
    raw[field] = value
    try:
        again = TopicRecord.from_json(json.dumps(raw), "topics/x")
    except RecordError as exc:
        assert "topics/x" in str(exc) or "topic record" in str(exc)
        return
    # Accepted only where the damage still describes a valid record (a name that is text anyway): exactly it.
    assert json.loads(again.to_json()) == raw


@given(st.text(max_size=200))
def test_any_text_is_a_topic_record_or_a_record_error(text):
    try:
        TopicRecord.from_json(text, "k")
    except RecordError:
        pass


@pytest.mark.parametrize("raw, fragment", [
    ({"name": "t", "topic_id": "i", "partitions": 2, "assignment": [[1]], "config": {}}, "2 partitions but 1"),
    ({"name": "t", "topic_id": "i", "partitions": 1, "assignment": [[1, 1]], "config": {}}, "distinct"),
    ({"name": "t", "topic_id": "i", "partitions": 0, "assignment": [], "config": {}}, "at least one partition"),
    ({"name": "t", "topic_id": "i", "partitions": 1, "assignment": [[True]], "config": {}}, "not a node id"),
    ({"name": "t", "topic_id": "i", "partitions": 1, "assignment": [[1]], "config": {"a": 1}}, "map of strings"),
])
def test_invalid_topic_records_are_refused(raw, fragment):
    with pytest.raises(RecordError, match=fragment):
        TopicRecord.from_json(json.dumps(raw), "k")
