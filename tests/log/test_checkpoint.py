"""Checkpoint files and partition.metadata, byte for byte (spec 3.2, 3.3)."""

from __future__ import annotations

import base64
import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shale.sidecar.log.atomic_file import atomic_write
from shale.sidecar.log.checkpoint import (
    CheckpointError,
    encode_offsets,
    encode_partition_metadata,
    new_topic_id,
    parse_offsets,
    parse_partition_metadata,
    read_offsets,
    write_offsets,
)
from shale.sidecar.log.topic_partition import TopicPartition


def test_empty_checkpoint_is_four_bytes() -> None:
    assert encode_offsets({}) == b"0\n0\n"
    assert parse_offsets(b"0\n0\n") == {}


def test_real_recovery_point_checkpoint_form() -> None:
    offsets = {TopicPartition("__consumer_offsets", 22): 0, TopicPartition("my-topic", 3): 1048576}
    assert encode_offsets(offsets) == b"0\n2\n__consumer_offsets 22 0\nmy-topic 3 1048576\n"
    assert parse_offsets(b"0\n2\n__consumer_offsets 22 0\nmy-topic 3 1048576\n") == offsets


def test_parse_splits_on_whitespace_and_accepts_an_empty_file() -> None:
    assert parse_offsets(b"") == {}
    assert parse_offsets(b"0\n1\nt  0\t7\n") == {TopicPartition("t", 0): 7}


@pytest.mark.parametrize("data,match", [
    (b"1\n0\n", "version"),
    (b"x\n0\n", "version"),
    (b"0\n", "count"),
    (b"0\n2\nt 0 1\n", "expected 2 entries"),
    (b"0\n1\nt 0\n", "malformed line"),
    (b"0\n1\nt zero 1\n", "malformed line"),
    (b"0\n1\nt 0 1 extra\n", "malformed line"),
    (b"0\n1\n\xff 0 1\n", "is not UTF-8 text"),
])
def test_malformed_checkpoints_are_refused(data: bytes, match: str) -> None:
    with pytest.raises(CheckpointError, match=match):
        parse_offsets(data, "recovery-point-offset-checkpoint")


@settings(max_examples=100, deadline=None)
@given(st.dictionaries(
    st.builds(TopicPartition, st.from_regex(r"[A-Za-z0-9._-]{1,20}", fullmatch=True), st.integers(0, 10_000)),
    st.integers(0, 2**63 - 1), max_size=20))
def test_round_trip(offsets) -> None:
    data = encode_offsets(offsets)
    lines = data.decode().split("\n")
    assert lines[0] == "0" and lines[1] == str(len(offsets)) and lines[-1] == ""
    assert parse_offsets(data) == offsets


def test_write_is_atomic_via_tmp_and_read_of_missing_file(tmp_path) -> None:
    path = str(tmp_path / "cleaner-offset-checkpoint")
    assert read_offsets(path) == {}
    write_offsets(path, {TopicPartition("t", 1): 5})
    assert open(path, "rb").read() == b"0\n1\nt 1 5\n"
    assert os.listdir(tmp_path) == ["cleaner-offset-checkpoint"], "no .tmp left behind"
    # A stale .tmp from a crash is overwritten, the target replaced whole.
    (tmp_path / "cleaner-offset-checkpoint.tmp").write_bytes(b"garbage")
    write_offsets(path, {})
    assert open(path, "rb").read() == b"0\n0\n"
    assert os.listdir(tmp_path) == ["cleaner-offset-checkpoint"]
    atomic_write(str(tmp_path / "x"), b"")
    assert (tmp_path / "x").read_bytes() == b""


def test_partition_metadata_is_exactly_43_bytes() -> None:
    data = encode_partition_metadata("B3_HiNPgSQ6oxG9ZZ6ED5A")
    assert data == b"version: 0\ntopic_id: B3_HiNPgSQ6oxG9ZZ6ED5A"
    assert len(data) == 43
    assert parse_partition_metadata(data) == "B3_HiNPgSQ6oxG9ZZ6ED5A"


def test_new_topic_ids_are_kafka_uuid_text() -> None:
    ids = {new_topic_id() for _ in range(50)}
    assert len(ids) == 50
    for tid in ids:
        assert len(tid) == 22 and "=" not in tid
        assert len(base64.urlsafe_b64decode(tid + "==")) == 16
        assert len(encode_partition_metadata(tid)) == 43


@pytest.mark.parametrize("data", [b"version: 1\ntopic_id: B3_HiNPgSQ6oxG9ZZ6ED5A", b"version: 0\n",
                                  b"version 0\ntopic_id B3_HiNPgSQ6oxG9ZZ6ED5A", b"version: 0\ntopic_id: \xff"])
def test_bad_partition_metadata_is_refused(data: bytes) -> None:
    with pytest.raises(CheckpointError):
        parse_partition_metadata(data)


def test_topic_partition_dir_names() -> None:
    assert TopicPartition.parse_dir_name("my-topic-0") == TopicPartition("my-topic", 0)
    assert TopicPartition.parse_dir_name("__consumer_offsets-22") == TopicPartition("__consumer_offsets", 22)
    assert str(TopicPartition("a-b", 7)) == "a-b-7"
    for bad in ("topic", "topic-", "-3", "topic-x"):
        with pytest.raises(ValueError):
            TopicPartition.parse_dir_name(bad)
