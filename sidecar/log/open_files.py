"""A bound on the segment files a process keeps open: opened when used, the least recently used closed first.

Kafka keeps every segment's FileChannel open for the life of the segment, so a broker needs a descriptor
per segment and runs out of them (EMFILE) with enough partitions, then cannot even accept a connection or
start again on its own data directory. Here a segment's `.log` descriptor is an `OpenFile`, opened on use
and kept in a process-wide LRU; above the capacity the least recently used one that nobody is using is
closed. A user pins the descriptor (`acquire`/`release`, `use`) for as long as it holds the number, so a
descriptor is never closed under a reader in another thread and its number never reused under it.

The index files need no descriptor: they are memory maps, and a map outlives the descriptor it was made
from. CPython's `mmap` keeps a duplicate of it anyway (for `size()` and `resize()`, which the indexes never
call), two per segment; `map_file` maps without keeping one (what Python 3.13 calls `trackfd=False`).
"""

from __future__ import annotations

import ctypes
import errno
import logging
import mmap
import os
import resource
import threading
from collections import OrderedDict
from contextlib import contextmanager
from typing import Iterator

log = logging.getLogger(__name__)

MIN_CAPACITY = 16
# CPython 3.11's mmap_object on a 64-bit Unix: PyObject_HEAD (16 bytes), data, size, pos, offset and exports
# (8 bytes each), then `int fd`. map_file checks that what it finds there is a duplicate of the mapped file.
_MMAP_FD_OFFSET = 56
_layout_checked = True  # False once a map showed another layout: maps then keep their descriptor


def map_file(fd: int, length: int, **kwargs) -> mmap.mmap:
    """`mmap.mmap(fd, length, **kwargs)` that holds no descriptor once made (Python 3.13's trackfd=False)."""
    global _layout_checked
    m = mmap.mmap(fd, length, **kwargs)
    if not _layout_checked:
        return m
    slot = ctypes.c_int.from_address(id(m) + _MMAP_FD_OFFSET)
    kept = slot.value
    try:
        duplicate = kept >= 0 and kept != fd and _same_file(os.fstat(kept), os.fstat(fd))
    except OSError:
        duplicate = False
    if not duplicate:
        _layout_checked = False
        log.warning("this Python's mmap objects are laid out differently: each index map keeps a descriptor")
        return m
    os.close(kept)
    slot.value = -1  # mmap.close() then closes nothing; size() and resize(), which need it, are never used
    return m


def _same_file(a: os.stat_result, b: os.stat_result) -> bool:
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def default_capacity() -> int:
    """Half the process's descriptor limit (RLIMIT_NOFILE), read now: the other half is left for sockets,
    indexes being mapped, fetched file ranges and the rest of the process."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return max(MIN_CAPACITY, (soft if soft != resource.RLIM_INFINITY else 1 << 20) // 2)


class OpenFile:
    """One file that `OpenFiles` opens on demand (read-write); `create` only for its first open."""

    __slots__ = ("path", "fd", "pins", "create", "closed")

    def __init__(self, path: str, *, create: bool = False) -> None:
        self.path = path
        self.fd = -1
        self.pins = 0  # users holding the descriptor now: never closed while > 0
        self.create = create
        self.closed = False  # closed for good (the segment was closed or deleted)


class OpenFiles:
    """The LRU of open descriptors; thread-safe (the event loop, cleaner and scheduler threads share it)."""

    def __init__(self, capacity: int | None = None) -> None:
        self._capacity = capacity  # None: default_capacity(), read at each open (the limit may change)
        self._limit = self.capacity  # the capacity at the last open, for release()
        self._lock = threading.Lock()
        self._lru: OrderedDict[OpenFile, None] = OrderedDict()  # open descriptors, least recently used first
        self.evictions = 0  # descriptors closed to stay within the capacity

    @property
    def capacity(self) -> int:
        return self._capacity if self._capacity is not None else default_capacity()

    @capacity.setter
    def capacity(self, value: int | None) -> None:
        """A fixed capacity, or None for half the descriptor limit; applies from the next open."""
        self._capacity = value
        self._limit = self.capacity

    @property
    def open_count(self) -> int:
        return len(self._lru)

    def acquire(self, f: OpenFile) -> int:
        """The file's descriptor, opened if needed and pinned until `release(f)`."""
        with self._lock:
            if f.closed:
                raise OSError(errno.EBADF, "segment file is closed", f.path)
            if f.fd < 0:
                self._open(f)
            else:
                self._lru.move_to_end(f)
            f.pins += 1
            return f.fd

    def release(self, f: OpenFile) -> None:
        with self._lock:
            f.pins -= 1
            if f.pins:
                return
            if f.closed:  # closed while in use: the descriptor goes now that its last user is done
                self._close_now(f)
            while len(self._lru) > self._limit and self._evict_one():
                pass  # over the capacity while every file was held: back under it as they are let go

    @contextmanager
    def use(self, f: OpenFile) -> Iterator[int]:
        fd = self.acquire(f)
        try:
            yield fd
        finally:
            self.release(f)

    def close(self, f: OpenFile) -> None:
        """Close the file for good: a later use is an error (EBADF), as with a closed descriptor. A user holding
        it keeps a working descriptor until it lets go (its number is never reused under it)."""
        with self._lock:
            f.closed = True
            if not f.pins:
                self._close_now(f)

    def _close_now(self, f: OpenFile) -> None:
        if f.fd >= 0:
            self._lru.pop(f, None)
            os.close(f.fd)
            f.fd = -1

    def rename(self, f: OpenFile, path: str) -> None:
        """Rename the file, with no open by its old name in between (an open happens under the same lock)."""
        with self._lock:
            os.replace(f.path, path)
            f.path = path

    def _open(self, f: OpenFile) -> None:
        self._limit = capacity = self.capacity
        while len(self._lru) >= capacity and self._evict_one():
            pass
        flags = os.O_RDWR | (os.O_CREAT if f.create else 0)
        try:
            f.fd = os.open(f.path, flags, 0o644)
        except OSError as exc:
            # Out of descriptors (other users of the process took them): give one back and try once more.
            if exc.errno not in (errno.EMFILE, errno.ENFILE) or not self._evict_one():
                raise
            f.fd = os.open(f.path, flags, 0o644)
        f.create = False
        self._lru[f] = None

    def _evict_one(self) -> bool:
        """Close the least recently used descriptor nobody holds; False if every one is held."""
        for g in self._lru:
            if g.pins == 0:
                self._close_now(g)
                self.evictions += 1
                return True
        return False


SEGMENT_FILES = OpenFiles()  # the `.log` files of every LogSegment in the process
