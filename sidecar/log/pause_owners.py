"""Who holds a partition's cleaning pause, and `cleaner-pauses.json`, where the lasting pauses are kept.

Kafka counts pauses and every leak of KAFKA-9087's family is a resume that never came. A pause here
belongs to a named owner, `<kind>:<id>` (or a bare kind), so that a resume can only release its own
pause, a second pause by the same owner is not a second count, and a pause whose owner is gone can be
found and released (docs/moves.md, "Pauses with named owners"). Sans-I/O: the file is read and
written by `CleanerManager`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from .topic_partition import TopicPartition

PAUSES_FILE = "cleaner-pauses.json"
PAUSES_VERSION = 1

MOVE = "move"
DELETION = "deletion"
RETENTION = "retention"
ABORT = "abort"
SHUTDOWN = "shutdown"
HTTP = "http"
OPERATOR = "operator"
ANONYMOUS = "anonymous"

# Owners that must outlive a restart: a move resumes after one, and a person or the operator who paused
# has not resumed. The others end with the process (a deletion is finished at load, a retention run or an
# abort is gone) and are never written.
PERSISTED_KINDS = frozenset({MOVE, HTTP, OPERATOR})
KINDS = frozenset({MOVE, DELETION, RETENTION, ABORT, SHUTDOWN, HTTP, OPERATOR, ANONYMOUS})


class PauseFileError(ValueError):
    """`cleaner-pauses.json` could not be parsed; the message names the file."""


@dataclass(frozen=True, slots=True)
class PauseOwner:
    kind: str
    id: str = ""

    @classmethod
    def parse(cls, text: str) -> PauseOwner:
        """`kind` or `kind:id`, kind one of KINDS (ValueError with the text otherwise)."""
        kind, _, ident = text.partition(":")
        if kind not in KINDS:
            raise ValueError(f"unknown pause owner kind {kind!r} in {text!r}; expected one of {sorted(KINDS)}")
        return cls(kind, ident)

    @property
    def persisted(self) -> bool:
        return self.kind in PERSISTED_KINDS

    def __str__(self) -> str:
        return f"{self.kind}:{self.id}" if self.id else self.kind


def encode_pauses(pauses: dict[TopicPartition, tuple[PauseOwner, ...]]) -> bytes:
    """The file's bytes: only persisted owners, partitions without one left out, sorted for stable files."""
    body = {str(tp): sorted(str(o) for o in owners if o.persisted) for tp, owners in pauses.items()}
    return json.dumps({"version": PAUSES_VERSION, "pauses": {k: v for k, v in sorted(body.items()) if v}},
                      indent=1).encode() + b"\n"


def decode_pauses(data: bytes, path: str) -> dict[TopicPartition, tuple[PauseOwner, ...]]:
    try:
        doc = json.loads(data)
        if not isinstance(doc, dict) or doc.get("version") != PAUSES_VERSION or not isinstance(doc.get("pauses"), dict):
            raise ValueError(f"expected {{\"version\": {PAUSES_VERSION}, \"pauses\": {{...}}}}")
        return {TopicPartition.parse_dir_name(name): tuple(PauseOwner.parse(o) for o in owners)
                for name, owners in doc["pauses"].items()}
    except (ValueError, TypeError, AttributeError) as e:
        raise PauseFileError(f"{path}: {e}") from e
