"""The memory-mapped, preallocated, fixed-entry index files shared by `.index` and `.timeindex`.

Kafka's AbstractIndex semantics: a new file is preallocated to
`roundDown(segment.index.bytes, entry size)`; an existing file is taken to hold
`length // entry size` valid entries, so it must be trimmed when the segment
stops being active. Entries are big-endian.

Unlike Kafka, the blocks under a page are allocated (`posix_fallocate`) before the map first writes
to it. The preallocated file is sparse, and a store into a hole the filesystem cannot fill (a full
disk) is reported by the kernel as SIGBUS, which kills the process; the JVM turns it into an
InternalError, Python cannot. Reserving a page at a time keeps a full disk an ordinary
OSError(ENOSPC), raised before anything is written, without reserving `segment.index.bytes` of
real disk for every partition (a 10 MiB default, twice per partition, that Kafka's sparse files
never use).
"""

from __future__ import annotations

import mmap
import os
from typing import Callable

from .append_state import IndexAppendState
from .errors import CorruptIndexError
from .open_files import map_file


class MmapIndex(IndexAppendState):
    """An index file of `entry_size`-byte entries sorted by a key that the subclass reads (the fields the C append
    reads and writes declared in append_state.py)."""

    entry_size: int = 0

    def __init__(self, path: str, base_offset: int, max_index_size: int, writable: bool = True) -> None:
        self.path = path
        self.base_offset = base_offset
        self.writable = writable
        self.reserved = 0  # bytes [0, reserved) of the file are known to have blocks (see reserve)
        exists = os.path.exists(path)
        if writable:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                length = os.fstat(fd).st_size
                if not exists:
                    length = self._round(max_index_size)
                    if length < self.entry_size:
                        raise ValueError(f"invalid max index size {max_index_size} for {path}")
                    os.ftruncate(fd, length)
                    self.entries = 0
                else:
                    self.entries = length // self.entry_size
                self._map(fd, length)
            finally:
                os.close(fd)
        else:
            length = os.path.getsize(path) if exists else 0
            self.entries = length // self.entry_size
            self.mm = None
            if length >= self.entry_size:
                with open(path, "rb") as f:
                    self.mm = map_file(f.fileno(), self._round(length), access=mmap.ACCESS_READ)
            self.max_entries = self.entries

    def _round(self, n: int) -> int:
        return n - n % self.entry_size

    def _map(self, fd: int, length: int) -> None:
        self.mm = map_file(fd, length) if length else None  # keeps no descriptor (open_files)
        self.max_entries = length // self.entry_size
        self.reserved = min(self.reserved, length)  # a shrink gave the blocks beyond `length` back

    def reserve(self, entries: int = 1) -> None:
        """Allocate the blocks of the next `entries` slots, so that writing them through the map cannot fault.

        Raises OSError (ENOSPC on a full disk) naming the file; nothing is written then. Allocation goes
        a page at a time and stops at the file's end (the file never grows here).
        """
        end = (self.entries + entries) * self.entry_size
        if end > self.reserved:  # once per page of entries; every other call ends here
            self._allocate(min(end, self.max_entries * self.entry_size))

    def _allocate(self, end: int) -> None:
        upto = min(-(-end // mmap.PAGESIZE) * mmap.PAGESIZE, self.max_entries * self.entry_size)
        if upto <= self.reserved:
            return
        fd = os.open(self.path, os.O_RDWR)
        try:
            os.posix_fallocate(fd, self.reserved, upto - self.reserved)
        except OSError as e:
            raise OSError(e.errno, f"{e.strerror} (reserving index bytes {self.reserved}-{upto})",
                          self.path) from None
        finally:
            os.close(fd)
        self.reserved = upto

    @property
    def size_bytes(self) -> int:
        """Bytes of valid entries."""
        return self.entries * self.entry_size

    @property
    def is_full(self) -> bool:
        return self.entries >= self.max_entries

    def _search(self, key: Callable[[int], int], target: int) -> int:
        """Slot of the largest entry whose key is <= target, or -1 (the result of Kafka's largestLowerBound)."""
        lo, hi = 0, self.entries - 1
        if self.entries == 0 or key(0) > target:
            return -1
        while lo < hi:
            mid = (lo + hi + 1) >> 1
            if key(mid) > target:
                hi = mid - 1
            else:
                lo = mid
        return lo

    def _truncate_slot(self, key: Callable[[int], int], value: int) -> int:
        """Number of entries to keep so that none has key >= value."""
        slot = self._search(key, value)
        if slot < 0:
            return 0
        return slot if key(slot) == value else slot + 1

    def _set_entries(self, n: int) -> None:
        self.entries = n

    def resize(self, new_size: int) -> None:
        """Set the file to `new_size` rounded down to whole entries, keeping the entries that still fit."""
        length = self._round(new_size)
        if self.writable and length == self.max_entries * self.entry_size:
            return  # Kafka skips an unchanged size too; remapping costs a syscall storm per segment at load
        if self.mm is not None:
            # No msync here: the pages reach the file through the shared mapping; durability is Log.flush's job.
            self.mm.close()
            self.mm = None
        fd = os.open(self.path, os.O_RDWR)
        try:
            os.ftruncate(fd, length)
            self._map(fd, length)
        finally:
            os.close(fd)
        self.entries = min(self.entries, self.max_entries)
        self.writable = True

    def trim_to_valid_size(self) -> None:
        """Shrink the file to its entries: what a reopen counts as valid."""
        if self.writable:
            self.resize(self.size_bytes)

    def reset(self, max_index_size: int) -> None:
        """Drop every entry and preallocate again (recovery rebuilds the index from the log)."""
        self.entries = 0
        self.resize(max_index_size)

    def flush(self) -> None:
        if self.mm is not None and self.writable:
            self.mm.flush()

    def close(self) -> None:
        """Trim and unmap; the file then holds exactly its entries."""
        self.trim_to_valid_size()
        if self.mm is not None:
            self.mm.close()
            self.mm = None

    def rename(self, new_path: str) -> None:
        if os.path.exists(self.path):
            os.replace(self.path, new_path)
        self.path = new_path

    def delete(self) -> None:
        if self.mm is not None:
            self.mm.close()
            self.mm = None
        if os.path.exists(self.path):
            os.unlink(self.path)

    def _check_writable(self) -> None:
        if not self.writable or self.mm is None:
            raise CorruptIndexError(f"index {self.path} is not open for writing")

    def _raw(self, slot: int, fmt_unpack: Callable[[mmap.mmap, int], tuple[int, ...]]) -> tuple[int, ...]:
        if not 0 <= slot < self.entries:
            # Kafka's AbstractIndex.entry: a slot past the entries is an error, not a zeroed preallocated slot.
            raise IndexError(f"attempt to fetch entry {slot} from index {self.path}, which has {self.entries} entries")
        if self.mm is None:
            raise CorruptIndexError(f"index {self.path} has no entries")
        return fmt_unpack(self.mm, slot * self.entry_size)
