"""Kafka's `.txnindex`: the aborted transactions whose ABORT marker a segment holds.

A read_committed fetch needs, for the range it returns, the producer id and first offset of
every aborted transaction that overlaps it, so the consumer can drop those batches. Kafka
writes one 34-byte big-endian entry per aborted transaction (no header, no preallocation):
version int16 (0), producerId int64, firstOffset int64, lastOffset int64 (the marker's
offset), lastStableOffset int64 (the LSO once the transaction completed). The entry's
lastStableOffset lets a search stop early: no transaction overlapping a range that ends at or
below it can complete later in the log.

The encoding and the search are pure; `TransactionIndex` owns the file. The file is created on
its first entry and holds no descriptor between writes (aborts are rare; descriptors are not).
"""

from __future__ import annotations

import errno
import os
import struct
from dataclasses import dataclass
from typing import Iterable, Sequence

from .errors import CorruptIndexError

ENTRY = struct.Struct(">hqqqq")
ENTRY_SIZE = ENTRY.size  # 34
CURRENT_VERSION = 0


@dataclass(frozen=True, slots=True)
class AbortedTxn:
    """One aborted transaction: Kafka's AbortedTxn."""

    producer_id: int
    first_offset: int
    last_offset: int  # offset of the ABORT marker
    last_stable_offset: int
    version: int = CURRENT_VERSION

    def encode(self) -> bytes:
        return ENTRY.pack(self.version, self.producer_id, self.first_offset, self.last_offset,
                          self.last_stable_offset)

    def __str__(self) -> str:  # Kafka's DumpLogSegments line
        return (f"version: {self.version} producerId: {self.producer_id} firstOffset: {self.first_offset} "
                f"lastOffset: {self.last_offset} lastStableOffset: {self.last_stable_offset}")


def parse_entries(data: bytes, path: str) -> list[AbortedTxn]:
    """The entries of a `.txnindex` file's bytes; a partial last entry is ignored, as by Kafka.

    An entry of a version this code does not know is CorruptIndexError (Kafka refuses it the same way).
    """
    entries = []
    for pos in range(0, len(data) - ENTRY_SIZE + 1, ENTRY_SIZE):
        version, pid, first, last, lso = ENTRY.unpack_from(data, pos)
        if version > CURRENT_VERSION:
            raise CorruptIndexError(f"Unexpected aborted transaction version {version} in transaction index "
                                    f"{os.path.abspath(path)}, current version is {CURRENT_VERSION}")
        entries.append(AbortedTxn(pid, first, last, lso, version))
    return entries


def encode_entries(entries: Iterable[AbortedTxn]) -> bytes:
    return b"".join(e.encode() for e in entries)


def consistency_problems(entries: Sequence[AbortedTxn], base_offset: int) -> list[str]:
    """What Kafka's TransactionIndex.sanityCheck and append refuse: an entry below the segment's base
    offset, an entry whose first offset follows its marker, and marker offsets that do not increase."""
    problems = []
    previous = None
    for i, e in enumerate(entries):
        if e.last_offset < base_offset:
            problems.append(f"entry {i} has last offset {e.last_offset}, below the base offset {base_offset}")
        if e.first_offset > e.last_offset:
            problems.append(f"entry {i} has first offset {e.first_offset} after its last offset {e.last_offset}")
        if previous is not None and e.last_offset <= previous:
            problems.append(f"entry {i} has last offset {e.last_offset}, not greater than the previous {previous}")
        previous = e.last_offset
    return problems


@dataclass(frozen=True, slots=True)
class TxnIndexSearch:
    """Kafka's TxnIndexSearchResult: the overlapping aborted transactions, and whether the search can stop."""

    aborted: list[AbortedTxn]
    complete: bool


def collect_aborted(entries: Iterable[AbortedTxn], fetch_offset: int, upper_bound: int) -> TxnIndexSearch:
    """Kafka's collectAbortedTxns: transactions with lastOffset >= `fetch_offset` and firstOffset < `upper_bound`;
    complete at the first entry whose lastStableOffset reaches `upper_bound` (later segments need no search)."""
    found = []
    for e in entries:
        if e.last_offset >= fetch_offset and e.first_offset < upper_bound:
            found.append(e)
        if e.last_stable_offset >= upper_bound:
            return TxnIndexSearch(found, True)
    return TxnIndexSearch(found, False)


class TransactionIndex:
    """One segment's `.txnindex` file, its entries cached once read."""

    def __init__(self, path: str, base_offset: int) -> None:
        self.path = path
        self.base_offset = base_offset
        self._entries: list[AbortedTxn] | None = None  # read on first use
        self._dirty = False  # appended since the last flush

    @property
    def entries(self) -> list[AbortedTxn]:
        if self._entries is None:
            try:
                with open(self.path, "rb") as f:
                    self._entries = parse_entries(f.read(), self.path)
            except FileNotFoundError:
                self._entries = []
        return self._entries

    @property
    def last_offset(self) -> int | None:
        return self.entries[-1].last_offset if self.entries else None

    def sanity_problem(self) -> str | None:
        """Why the file cannot be trusted (Kafka's sanityCheck, at load), or None."""
        try:
            problems = consistency_problems(self.entries, self.base_offset)
        except CorruptIndexError as e:
            self._entries = None
            return str(e)
        return "; ".join(problems) or None

    def append(self, txn: AbortedTxn) -> None:
        """Add an entry; its marker offset must follow the last one's (Kafka's IllegalArgumentException)."""
        last = self.last_offset
        if last is not None and txn.last_offset <= last:
            raise CorruptIndexError(f"the last offset of appended transactions must increase sequentially, but "
                                    f"{txn.last_offset} is not greater than current last offset {last} of index "
                                    f"{self.path}")
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            size = os.fstat(fd).st_size
            if size % ENTRY_SIZE:  # a partial entry left by a crash would shift every later entry
                os.ftruncate(fd, size - size % ENTRY_SIZE)
            if os.write(fd, txn.encode()) != ENTRY_SIZE:
                os.ftruncate(fd, size - size % ENTRY_SIZE)
                raise OSError(errno.ENOSPC, "short write of an aborted transaction entry", self.path)
        except OSError as e:
            if e.filename is None:  # write's error names no file
                raise OSError(e.errno, f"{e.strerror} (writing the aborted transaction of producer "
                                       f"{txn.producer_id} at offset {txn.last_offset})", self.path) from None
            raise
        finally:
            os.close(fd)
        self.entries.append(txn)
        self._dirty = True

    def collect(self, fetch_offset: int, upper_bound: int) -> TxnIndexSearch:
        return collect_aborted(self.entries, fetch_offset, upper_bound)

    def truncate_to(self, offset: int) -> None:
        """Drop the entries of transactions whose marker is at or past `offset` (Kafka's truncateTo)."""
        keep = [e for e in self.entries if e.last_offset < offset]
        if len(keep) == len(self.entries):
            return
        self._rewrite_length(keep)

    def reset(self) -> None:
        """Forget every entry (recovery rebuilds them from the batches)."""
        if self._entries or os.path.exists(self.path):  # not read first: the file may be what is unreadable
            self._rewrite_length([])

    def replace(self, entries: list[AbortedTxn]) -> None:
        """Reset and write these entries (recovery's rebuild, the cleaner's copy)."""
        self.reset()
        for e in entries:
            self.append(e)

    def _rewrite_length(self, keep: list[AbortedTxn]) -> None:
        if os.path.exists(self.path):
            os.truncate(self.path, len(keep) * ENTRY_SIZE)
            self._dirty = True
        self._entries = keep

    def flush(self) -> None:
        if self._dirty and os.path.exists(self.path):
            fd = os.open(self.path, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        self._dirty = False

    def rename(self, new_path: str) -> None:
        if os.path.exists(self.path):
            os.replace(self.path, new_path)
        self.path = new_path

    def delete(self) -> None:
        if os.path.exists(self.path):
            os.unlink(self.path)
        self._entries = []
