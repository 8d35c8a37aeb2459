"""Kafka's text checkpoint files and `partition.metadata`, as pure encode/parse functions plus atomic I/O.

Checkpoint layout (CheckpointFile.java): `version\\ncount\\n` then one line per entry, version 0.
Offset checkpoints (`recovery-point-offset-checkpoint`, `log-start-offset-checkpoint`,
`cleaner-offset-checkpoint`, `replication-offset-checkpoint`) have `topic partition offset`
lines; a partition's `leader-epoch-checkpoint` has `epoch startOffset` lines.
"""

from __future__ import annotations

import base64
import os
import re
import uuid
from dataclasses import dataclass
from typing import Iterable, Mapping

from .atomic_file import atomic_write
from .topic_partition import TopicPartition

RECOVERY_POINT_CHECKPOINT = "recovery-point-offset-checkpoint"
LOG_START_OFFSET_CHECKPOINT = "log-start-offset-checkpoint"
CLEANER_OFFSET_CHECKPOINT = "cleaner-offset-checkpoint"
REPLICATION_OFFSET_CHECKPOINT = "replication-offset-checkpoint"
LEADER_EPOCH_CHECKPOINT = "leader-epoch-checkpoint"
PARTITION_METADATA = "partition.metadata"
CHECKPOINT_VERSION = 0


class CheckpointError(ValueError):
    """A checkpoint or metadata file that does not parse; the message names the file and line."""


@dataclass(frozen=True, order=True, slots=True)
class EpochEntry:
    """Kafka's EpochEntry: a leader epoch and the first offset written in it."""

    epoch: int
    start_offset: int


def _encode(lines: list[str]) -> bytes:
    return "\n".join([str(CHECKPOINT_VERSION), str(len(lines)), *lines, ""]).encode("utf-8")


def _entry_lines(data: bytes, name: str) -> list[str]:
    """The entry lines of a checkpoint after its version and count lines are checked; none for an empty file."""
    text = _text(data, name)
    if not text:
        return []
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    try:
        version = int(lines[0])
    except (IndexError, ValueError):
        raise CheckpointError(f"malformed version line in {name}: {lines[:1]!r}") from None
    if version != CHECKPOINT_VERSION:
        raise CheckpointError(f"unrecognised version {version} in {name}")
    try:
        count = int(lines[1])
    except (IndexError, ValueError):
        raise CheckpointError(f"malformed entry count in {name}") from None
    if len(lines) - 2 != count:
        raise CheckpointError(f"expected {count} entries in checkpoint file {name} but found only {len(lines) - 2}")
    return lines[2:]


def encode_offsets(offsets: Mapping[TopicPartition, int]) -> bytes:
    return _encode([f"{tp.topic} {tp.partition} {off}" for tp, off in offsets.items()])


def parse_offsets(data: bytes, name: str = "checkpoint") -> dict[TopicPartition, int]:
    """Parse a checkpoint; an empty file is an empty map, as in Kafka."""
    entries: dict[TopicPartition, int] = {}
    for line in _entry_lines(data, name):
        fields = line.split()
        if len(fields) != 3 or not re.fullmatch(r"-?\d+", fields[1]) or not re.fullmatch(r"-?\d+", fields[2]):
            raise CheckpointError(f"malformed line in checkpoint file {name}: {line!r}")
        entries[TopicPartition(fields[0], int(fields[1]))] = int(fields[2])
    return entries


def encode_epoch_entries(entries: Iterable[EpochEntry]) -> bytes:
    """`leader-epoch-checkpoint`: one `epoch startOffset` line per entry, one space, as Kafka writes it."""
    return _encode([f"{e.epoch} {e.start_offset}" for e in entries])


def parse_epoch_entries(data: bytes, name: str = LEADER_EPOCH_CHECKPOINT) -> list[EpochEntry]:
    """Parse a `leader-epoch-checkpoint`; an empty file (as Kafka creates it) has no entries.

    Kafka splits a line on any whitespace into exactly two integers; its cache then refuses a
    negative epoch or offset, so those are refused here too.
    """
    entries = []
    for line in _entry_lines(data, name):
        fields = re.split(r"\s+", line.rstrip())
        if len(fields) != 2 or not all(re.fullmatch(r"[+-]?[0-9]+", f) for f in fields):
            raise CheckpointError(f"malformed line in checkpoint file {name}: {line!r}")
        epoch, start = int(fields[0]), int(fields[1])
        if not (0 <= epoch < 2**31 and 0 <= start < 2**63):
            raise CheckpointError(f"invalid leader epoch entry in {name}: epoch {epoch}, start offset {start}")
        entries.append(EpochEntry(epoch, start))
    return entries


def read_offsets(path: str) -> dict[TopicPartition, int]:
    """Read a checkpoint file; a missing file is an empty map."""
    if not os.path.exists(path):
        return {}
    with open(path, "rb") as f:
        return parse_offsets(f.read(), path)


def write_offsets(path: str, offsets: Mapping[TopicPartition, int]) -> None:
    atomic_write(path, encode_offsets(offsets))


def new_topic_id() -> str:
    """A Kafka Uuid in its text form: URL-safe base64 of 16 bytes without padding."""
    return base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode("ascii")


def encode_partition_metadata(topic_id: str) -> bytes:
    """Exactly Kafka's `version: 0\\ntopic_id: <id>` with no trailing newline."""
    return f"version: 0\ntopic_id: {topic_id}".encode("utf-8")


def parse_partition_metadata(data: bytes, name: str = PARTITION_METADATA) -> str:
    """Return the topic id; Kafka splits each line on `:\\s+`."""
    fields = {}
    for line in filter(None, _text(data, name).split("\n")):
        key_value = re.split(r":\s+", line, maxsplit=1)
        if len(key_value) != 2:
            raise CheckpointError(f"malformed line in {name}: {line!r}")
        fields[key_value[0]] = key_value[1]
    if fields.get("version") != "0":
        raise CheckpointError(f"unrecognised version {fields.get('version')!r} in {name}")
    if "topic_id" not in fields:
        raise CheckpointError(f"no topic_id in {name}")
    return fields["topic_id"]


def _text(data: bytes, name: str) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise CheckpointError(f"{name} is not UTF-8 text: {e}") from None
