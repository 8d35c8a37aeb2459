"""`.index`: sparse map from offset to byte position in the segment's `.log` (8-byte entries)."""

from __future__ import annotations

import struct

from .errors import InvalidIndexEntryError
from .index import MmapIndex

_ENTRY = struct.Struct(">ii")  # relative offset, position
INT32_MAX = 2**31 - 1


class OffsetIndex(MmapIndex):
    """Entries (offset - base, position), strictly increasing in offset."""

    entry_size = 8

    def entry(self, slot: int) -> tuple[int, int]:
        """(absolute offset, position) of one slot."""
        rel, pos = self._raw(slot, _ENTRY.unpack_from)
        return self.base_offset + rel, pos

    def _rel(self, slot: int) -> int:
        return _ENTRY.unpack_from(self.mm, slot * 8)[0]  # type: ignore[arg-type]

    @property
    def last_offset(self) -> int:
        return self.entry(self.entries - 1)[0] if self.entries else self.base_offset

    def can_append_offset(self, offset: int) -> bool:
        return 0 <= offset - self.base_offset <= INT32_MAX

    def append(self, offset: int, position: int) -> None:
        """Add an entry; Kafka refuses a full index, a non-increasing offset and an int32 overflow."""
        self._check_writable()
        if self.is_full:
            raise InvalidIndexEntryError(f"attempt to append to a full index {self.path} ({self.entries} entries)")
        if self.entries and offset <= self.last_offset:
            raise InvalidIndexEntryError(
                f"attempt to append offset {offset} to position {self.entries} no larger than the last offset "
                f"appended ({self.last_offset}) to {self.path}"
            )
        if not self.can_append_offset(offset):
            raise InvalidIndexEntryError(f"offset {offset} overflows the relative offset of {self.path} (base {self.base_offset})")
        self.reserve()  # a full disk is an OSError here, never a SIGBUS in pack_into
        _ENTRY.pack_into(self.mm, self.entries * 8, offset - self.base_offset, position)  # type: ignore[arg-type]
        self.entries += 1

    def lookup(self, offset: int) -> tuple[int, int]:
        """The entry with the largest offset <= `offset`, or (base offset, 0)."""
        slot = self._search(self._rel, offset - self.base_offset)
        return (self.base_offset, 0) if slot < 0 else self.entry(slot)

    def fetch_upper_bound_position(self, start_position: int, fetch_size: int) -> int | None:
        """Position of the first entry at or beyond start + size: lets a read stop at an indexed batch boundary."""
        found = self.fetch_upper_bound(start_position, fetch_size)
        return None if found is None else found[1]

    def fetch_upper_bound(self, start_position: int, fetch_size: int) -> tuple[int, int] | None:
        """The first entry (offset, position) at or beyond start + size (Kafka's fetchUpperBoundOffset: its
        offset bounds the aborted transactions a read_committed fetch of that range must list)."""
        target = start_position + fetch_size
        lo, hi = 0, self.entries
        while lo < hi:
            mid = (lo + hi) >> 1
            if self.entry(mid)[1] >= target:
                hi = mid
            else:
                lo = mid + 1
        return self.entry(lo) if lo < self.entries else None

    def truncate_to(self, offset: int) -> None:
        """Remove the entries at or above `offset`."""
        self._set_entries(self._truncate_slot(self._rel, offset - self.base_offset))
