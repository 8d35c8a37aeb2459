"""Walking the batches of a `.log` file by their headers, as Kafka's FileLogInputStream does.

Only headers are read; a batch's bytes are read when asked for. The walk stops
quietly at a partial trailing batch (recovery truncates it) and raises on a
declared size below Kafka's minimum, which is how preallocated zeros show up.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Iterator

from .errors import CorruptRecordError
from .records import BATCH_OVERHEAD, HEADER_SIZE_UP_TO_MAGIC, LOG_OVERHEAD, MAGIC, MIN_ENTRY_SIZE, BatchHeader

_LEGACY_MAGICS = (0, 1)


@dataclass(frozen=True, slots=True)
class BatchPosition:
    """A batch header and where the batch sits in its file."""

    position: int
    header: BatchHeader

    @property
    def size(self) -> int:
        return self.header.size

    @property
    def end(self) -> int:
        return self.position + self.header.size


def iter_batches(fd: int, start: int, end: int, where: str = "") -> Iterator[BatchPosition]:
    """Yield the v2 batches that lie whole in `[start, end)` of the file `fd`."""
    pos = start
    while pos < end - HEADER_SIZE_UP_TO_MAGIC:
        head = os.pread(fd, BATCH_OVERHEAD, pos)
        size = int.from_bytes(head[8:12], "big", signed=True)
        if size < MIN_ENTRY_SIZE:
            raise CorruptRecordError(
                f"found record size {size} smaller than minimum record overhead ({MIN_ENTRY_SIZE}) at position {pos}"
                + (f" in {where}" if where else "")
            )
        if pos + LOG_OVERHEAD + size > end:
            return
        magic = head[16]
        if magic != MAGIC:
            kind = "legacy (v0/v1)" if magic in _LEGACY_MAGICS else "unknown"
            raise CorruptRecordError(
                f"{kind} record batch magic {magic} at position {pos}" + (f" in {where}" if where else "")
            )
        if len(head) < BATCH_OVERHEAD or size < BATCH_OVERHEAD - LOG_OVERHEAD:
            raise CorruptRecordError(
                f"record batch of {size + LOG_OVERHEAD} bytes at position {pos} is smaller than the v2 header"
                + (f" in {where}" if where else "")
            )
        header = BatchHeader.parse(head)
        yield BatchPosition(pos, header)
        pos += header.size
