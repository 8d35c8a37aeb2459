"""A partition's name, `<topic>-<partition>`: the key of every map of partitions, in every layer."""

from __future__ import annotations

from typing import NamedTuple


class TopicPartition(NamedTuple):
    """A partition's name. A tuple, not a dataclass: it keys the dicts every fetch and produce looks partitions
    up in (a session's dozens per fetch), and a tuple's hash and equality run in C, not in Python."""

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
