"""`.timeindex`: sparse map from timestamp to offset (12-byte entries), with the last slot kept for roll/close."""

from __future__ import annotations

import struct

from .errors import InvalidIndexEntryError
from .index import MmapIndex

_ENTRY = struct.Struct(">qi")  # timestamp, relative offset


class TimeIndex(MmapIndex):
    """Entries (timestamp, offset - base) meaning 'the largest timestamp before this offset'."""

    entry_size = 12

    def entry(self, slot: int) -> tuple[int, int]:
        """(timestamp, absolute offset) of one slot."""
        ts, rel = self._raw(slot, _ENTRY.unpack_from)
        return ts, self.base_offset + rel

    def _ts(self, slot: int) -> int:
        return _ENTRY.unpack_from(self.mm, slot * 12)[0]  # type: ignore[arg-type]

    def _rel(self, slot: int) -> int:
        return _ENTRY.unpack_from(self.mm, slot * 12)[1]  # type: ignore[arg-type]

    @property
    def is_full(self) -> bool:
        """Full one slot early: the last slot is for the entry written when the segment rolls or closes."""
        return self.entries >= self.max_entries - 1

    @property
    def last_entry(self) -> tuple[int, int]:
        """The last entry, or (-1, base offset) when empty."""
        return self.entry(self.entries - 1) if self.entries else (-1, self.base_offset)

    def maybe_append(self, timestamp: int, offset: int, skip_full_check: bool = False) -> None:
        """Add (timestamp, offset) if the timestamp is larger than the last one, as Kafka does."""
        self._check_writable()
        if not skip_full_check and self.is_full:
            raise InvalidIndexEntryError(f"attempt to append to a full time index {self.path} ({self.entries} entries)")
        last_ts, last_off = self.last_entry
        if self.entries and offset < last_off:
            raise InvalidIndexEntryError(
                f"attempt to append offset {offset} below the last offset {last_off} of time index {self.path}"
            )
        if self.entries and timestamp < last_ts:
            raise InvalidIndexEntryError(
                f"attempt to append timestamp {timestamp} below the last timestamp {last_ts} of time index {self.path}"
            )
        if timestamp > last_ts:
            if self.entries >= self.max_entries:
                # A segment reopened with a trimmed index has no spare slot: grow by one entry.
                self.resize(self.size_bytes + self.entry_size)
            self.reserve()  # a full disk is an OSError here, never a SIGBUS in pack_into
            _ENTRY.pack_into(self.mm, self.entries * 12, timestamp, offset - self.base_offset)  # type: ignore[arg-type]
            self.entries += 1

    def lookup(self, timestamp: int) -> tuple[int, int]:
        """The entry with the largest timestamp <= `timestamp`, or (-1, base offset)."""
        slot = self._search(self._ts, timestamp)
        return (-1, self.base_offset) if slot < 0 else self.entry(slot)

    def truncate_to(self, offset: int) -> None:
        """Remove the entries whose offset is at or above `offset`."""
        self._set_entries(self._truncate_slot(self._rel, offset - self.base_offset))
