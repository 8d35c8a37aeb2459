"""Kafka's text checkpoint files and `partition.metadata`, as pure encode/parse functions plus atomic I/O.

Checkpoint layout (CheckpointFile.java): `version\\ncount\\n` then one `topic partition offset`
line per entry, version 0. Used for `recovery-point-offset-checkpoint`,
`log-start-offset-checkpoint` and `cleaner-offset-checkpoint`.
"""

from __future__ import annotations

import base64
import os
import re
import uuid
from dataclasses import dataclass
from typing import Mapping

from .atomic_file import atomic_write

RECOVERY_POINT_CHECKPOINT = "recovery-point-offset-checkpoint"
LOG_START_OFFSET_CHECKPOINT = "log-start-offset-checkpoint"
CLEANER_OFFSET_CHECKPOINT = "cleaner-offset-checkpoint"
PARTITION_METADATA = "partition.metadata"
CHECKPOINT_VERSION = 0


class CheckpointError(ValueError):
    """A checkpoint or metadata file that does not parse; the message names the file and line."""


@dataclass(frozen=True, order=True, slots=True)
class TopicPartition:
    topic: str
    partition: int

    def __str__(self) -> str:
        return f"{self.topic}-{self.partition}"

    @classmethod
    def parse_dir_name(cls, name: str) -> "TopicPartition":
        """`<topic>-<partition>`, split at the last dash since topics may contain dashes."""
        topic, sep, part = name.rpartition("-")
        if not sep or not topic or not part.isdigit():
            raise ValueError(f"directory name {name!r} is not in the form of topic-partition")
        return cls(topic, int(part))


def encode_offsets(offsets: Mapping[TopicPartition, int]) -> bytes:
    lines = [str(CHECKPOINT_VERSION), str(len(offsets))]
    lines += [f"{tp.topic} {tp.partition} {off}" for tp, off in offsets.items()]
    return ("\n".join(lines) + "\n").encode("utf-8")


def parse_offsets(data: bytes, name: str = "checkpoint") -> dict[TopicPartition, int]:
    """Parse a checkpoint; an empty file is an empty map, as in Kafka."""
    text = _text(data, name)
    if not text:
        return {}
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
    entries: dict[TopicPartition, int] = {}
    for line in lines[2:]:
        fields = line.split()
        if len(fields) != 3 or not re.fullmatch(r"-?\d+", fields[1]) or not re.fullmatch(r"-?\d+", fields[2]):
            raise CheckpointError(f"malformed line in checkpoint file {name}: {line!r}")
        entries[TopicPartition(fields[0], int(fields[1]))] = int(fields[2])
    if len(entries) != count:
        raise CheckpointError(f"expected {count} entries in checkpoint file {name} but found only {len(entries)}")
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
