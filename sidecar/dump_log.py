"""`shale dump-log`: Kafka's kafka-dump-log.sh (DumpLogSegments) for Shale's — and Kafka's — files.

Output lines match those of Kafka's current tool, so that people and scripts that know it can read
ours: segments (`.log`), KRaft snapshots (`*.checkpoint` under `__cluster_metadata`, with the JSON
of their control records), `.index` and `.timeindex` checked against the `.log` beside them,
producer snapshots and `.txnindex`. Where it deliberately differs from Kafka's tool is listed in
`shale dump-log --help` (`cli.DUMP_LOG_DIFFERENCES`, kept there so that `shale` starts without
importing the log engine) and in the README.
"""

from __future__ import annotations

import bisect
import os
import re
import struct
from dataclasses import dataclass, field
from typing import Iterator, TextIO

from .log.checkpoint import CheckpointError, parse_offsets, parse_partition_metadata
from .log.control_records import KRAFT_CONTROL_TYPES, describe
from .log.errors import CorruptRecordError, LogError
from .log.file_records import BatchPosition, iter_batches
from .log.offset_index import OffsetIndex
from .log.producer_snapshot import format_entry, parse_snapshot
from .log.records import (
    BATCH_OVERHEAD,
    BatchHeader,
    ControlType,
    check_batch,
    decode_records,
    parse_control_key,
    parse_end_txn_marker,
)
from .log.segment import INDEX_SUFFIX, LOG_SUFFIX, SNAPSHOT_SUFFIX, TIME_INDEX_SUFFIX, TXN_INDEX_SUFFIX
from .log.time_index import TimeIndex
from .log.transaction_index import AbortedTxn, consistency_problems, parse_entries

EXIT_OK, EXIT_FINDINGS, EXIT_USAGE = 0, 1, 2
CHECKPOINT_NAMES = ("recovery-point-offset-checkpoint", "log-start-offset-checkpoint", "cleaner-offset-checkpoint",
                    "replication-offset-checkpoint")
KRAFT_SNAPSHOT_SUFFIX = ".checkpoint"
BOOTSTRAP_SNAPSHOT = "bootstrap.checkpoint"  # what `kafka-storage format` writes
_KRAFT_SNAPSHOT_NAME = re.compile(r"([0-9]{20})-([0-9]{10})\.checkpoint")
_DIGITS = re.compile(r"[0-9]+")
_OFFSET_NAMED = (LOG_SUFFIX, INDEX_SUFFIX, TIME_INDEX_SUFFIX, SNAPSHOT_SUFFIX, TXN_INDEX_SUFFIX)


@dataclass
class _Report:
    """Kafka prints its findings on stderr after all files, grouped by kind in this order."""

    index_mismatches: dict[str, list[tuple[int, int]]] = field(default_factory=dict)
    time_mismatches: dict[str, list[tuple[int, int]]] = field(default_factory=dict)
    time_out_of_order: dict[str, list[tuple[int, int]]] = field(default_factory=dict)
    time_not_found: dict[str, list[tuple[int, int]]] = field(default_factory=dict)
    non_consecutive: dict[str, list[tuple[int, int]]] = field(default_factory=dict)

    def lines(self) -> list[str]:
        out: list[str] = []
        for path, pairs in self.index_mismatches.items():
            out.append(f"Mismatches in :{path}")  # Kafka lists them in descending index offset
            out += [f"  Index offset: {o}, log offset: {lo}" for o, lo in sorted(set(pairs), reverse=True)]
        for path, pairs in self.time_mismatches.items():
            out.append(f"Found timestamp mismatch in :{path}")
            out += [f"  Index timestamp: {ts}, log timestamp: {log_ts}" for ts, log_ts in pairs]
        for path, pairs in self.time_out_of_order.items():
            out.append(f"Found out of order timestamp in :{path}")
            out += [f"  Index timestamp: {ts}, Previously indexed timestamp: {prev}" for ts, prev in pairs]
        for pairs in self.time_not_found.values():
            out.append("The following indexed offsets are not found in the log.")
            out += [f"Indexed offset: {o}, found log offset: {lo}" for o, lo in pairs]
        for path, pairs in self.non_consecutive.items():
            out.append(f"Non-consecutive offsets in {path}")
            out += [f"  {a} is followed by {b}" for a, b in pairs]
        return out


def usage_errors(paths: list[str]) -> list[str]:
    """Why arguments cannot be dumped at all: missing, a directory, or a segment name without an offset."""
    errors = []
    for path in paths:
        name = os.path.basename(path)
        if not os.path.lexists(path):
            errors.append(f"{path}: no such file")
        elif os.path.isdir(path):
            errors.append(f"{path}: is a directory; give the files in it, e.g. {os.path.join(path, '*.log')}")
        elif name.endswith(_OFFSET_NAMED) and not _DIGITS.fullmatch(name[: name.index(".")]):
            errors.append(f"{path}: not a segment file name: Kafka names a segment's files by its base offset "
                          f"(00000000000000000000{os.path.splitext(name)[1]})")
        elif name.endswith(KRAFT_SNAPSHOT_SUFFIX) and name != BOOTSTRAP_SNAPSHOT \
                and not _KRAFT_SNAPSHOT_NAME.fullmatch(name):
            errors.append(f"{path}: not a KRaft snapshot name: <end offset, 20 digits>-<epoch, 10 digits>.checkpoint "
                          f"or {BOOTSTRAP_SNAPSHOT}")
    return errors


def _offset_of(path: str) -> int:
    name = os.path.basename(path)
    return int(name[: name.index(".")])


def dump_files(paths: list[str], *, print_data: bool = False, deep_iteration: bool = False,
               verify_index_only: bool = False, index_sanity_check: bool = False, max_bytes: int | None = None,
               out: TextIO, err: TextIO | None = None) -> int:
    """Dump each file; return the exit status: EXIT_OK, EXIT_FINDINGS or EXIT_USAGE (`shale dump-log --help`)."""
    err = err if err is not None else out
    errors = usage_errors(paths)
    if errors:
        for line in errors:
            print(f"shale dump-log: {line}", file=err)
        return EXIT_USAGE
    report = _Report()
    problems = 0
    deep_iteration = deep_iteration or print_data
    for path in paths:
        name = os.path.basename(path)
        print(f"Dumping {path}", file=out)
        try:
            if name.endswith(LOG_SUFFIX):
                print(f"Log starting offset: {_offset_of(path)}", file=out)
                problems += _dump_batches(path, deep_iteration, print_data, max_bytes, out, report)
            elif name.endswith(KRAFT_SNAPSHOT_SUFFIX):
                match = _KRAFT_SNAPSHOT_NAME.fullmatch(name)
                print("KRaft bootstrap snapshot" if match is None
                      else f"Snapshot end offset: {int(match[1])}, epoch: {int(match[2])}", file=out)
                problems += _dump_batches(path, deep_iteration, print_data, max_bytes, out, report)
            elif name.endswith(INDEX_SUFFIX):
                problems += _dump_offset_index(path, verify_index_only, index_sanity_check, out, report)
            elif name.endswith(TIME_INDEX_SUFFIX):
                problems += _dump_time_index(path, verify_index_only, index_sanity_check, out, report)
            elif name.endswith(SNAPSHOT_SUFFIX):
                with open(path, "rb") as f:
                    for entry in parse_snapshot(f.read(), path):
                        print(format_entry(entry), file=out)
            elif name.endswith(TXN_INDEX_SUFFIX):
                problems += _dump_txn_index(path, verify_index_only, index_sanity_check, out)
            elif name in CHECKPOINT_NAMES:
                problems += _dump_checkpoint(path, out)
            elif name == "partition.metadata":
                with open(path, "rb") as f:
                    print(f"topic_id: {parse_partition_metadata(f.read(), path)}", file=out)
            else:
                print(f"Ignoring unknown file {path}", file=err)
        except (OSError, LogError, CheckpointError) as e:
            print(f"Could not read {path}: {e}", file=err)
            problems += 1
    for line in report.lines():
        print(line, file=err)
    return EXIT_FINDINGS if problems else EXIT_OK


def _dump_batches(path: str, deep: bool, print_data: bool, max_bytes: int | None, out: TextIO,
                  report: _Report) -> int:
    """The batches (and with `deep`, the records) of a `.log` or a KRaft snapshot, as Kafka's dumpLog."""
    fd = os.open(path, os.O_RDONLY)
    gaps: list[tuple[int, int]] = []
    try:
        size = os.fstat(fd).st_size
        end = size if max_bytes is None else min(size, max_bytes)
        valid_bytes = 0
        problems = 0
        last_offset: int | None = None
        try:
            for b in iter_batches(fd, 0, end, path):
                raw = os.pread(fd, b.size, b.position)
                valid = _is_valid(raw)
                print(format_batch(b.header, b.position, valid), file=out)
                if not valid:
                    problems += 1
                elif deep:
                    for offset, line in format_records(b.header, raw, print_data):
                        if last_offset is not None and offset != last_offset + 1:
                            gaps.append((last_offset, offset))
                        last_offset = offset
                        print(line, file=out)
                valid_bytes = b.end
        except CorruptRecordError as e:
            print(f"Found a corrupt batch at position {valid_bytes} of {path}: {e}", file=out)
            problems += 1
            valid_bytes = end  # the walk stops here: what follows was not read, so it is not counted as trailing
        if valid_bytes < end and max_bytes is None:
            print(f"Found {end - valid_bytes} invalid bytes at the end of {os.path.basename(path)}", file=out)
            problems += 1
        if gaps:
            report.non_consecutive[os.path.abspath(path)] = gaps
        return problems
    finally:
        os.close(fd)


def _is_valid(raw: bytes) -> bool:
    try:
        check_batch(raw)
        return True
    except CorruptRecordError:
        return False


def format_batch(h: BatchHeader, position: int, valid: bool) -> str:
    """Kafka's batch line (DumpLogSegments, 3.x/4.x)."""
    horizon = h.delete_horizon_ms
    return (
        f"baseOffset: {h.base_offset} lastOffset: {h.last_offset} count: {h.records_count} "
        f"baseSequence: {h.base_sequence} lastSequence: {h.last_sequence} producerId: {h.producer_id} "
        f"producerEpoch: {h.producer_epoch} partitionLeaderEpoch: {h.partition_leader_epoch} "
        f"isTransactional: {str(h.is_transactional).lower()} isControl: {str(h.is_control).lower()} "
        f"deleteHorizonMs: {'OptionalLong.empty' if horizon is None else f'OptionalLong[{horizon}]'} "
        f"position: {position} {h.timestamp_type.kafka_name}: {h.max_timestamp} size: {h.size} magic: {h.magic} "
        f"compresscodec: {h.compression.name.lower()} crc: {h.crc} isvalid: {str(valid).lower()}"
    )


def format_records(h: BatchHeader, raw: bytes, print_data: bool = True) -> Iterator[tuple[int, str]]:
    """Kafka's `| offset: …` record lines, with their offsets; keys and values as UTF-8 text, as its default decoder prints them."""
    for r in decode_records(h, memoryview(raw)[BATCH_OVERHEAD:]):
        line = (
            f"| offset: {r.offset} {h.timestamp_type.kafka_name}: {r.timestamp} "
            f"keySize: {-1 if r.key is None else len(r.key)} valueSize: {-1 if r.value is None else len(r.value)} "
            f"sequence: {r.sequence} headerKeys: [{','.join(x.key for x in r.headers)}]"
        )
        if h.is_control:
            line += " " + _describe_control(r.offset, r.key, r.value)
        elif print_data:
            if r.key is not None:
                line += f" key: {r.key.decode('utf-8', 'replace')}"
            if r.value is not None:
                line += f" payload: {r.value.decode('utf-8', 'replace')}"
        yield r.offset, line


def _describe_control(offset: int, key: bytes | None, value: bytes | None) -> str:
    """Kafka's text for a control record: the end-transaction marker, a KRaft record's JSON, or its type id."""
    try:
        ctype = parse_control_key(key)
        if ctype in (ControlType.ABORT, ControlType.COMMIT):
            return f"endTxnMarker: {ctype.name} coordinatorEpoch: {parse_end_txn_marker(value)}"
        if ctype in KRAFT_CONTROL_TYPES:
            return describe(ctype, value)
    except CorruptRecordError as e:
        raise CorruptRecordError(f"control record at offset {offset}: {e}") from None
    return f"controlType: {ctype.name}({struct.unpack_from('>h', key, 2)[0]})"


# -- index files ---------------------------------------------------------------------------------

def _log_fd(index_path: str, suffix: str) -> int:
    log_path = index_path[: -len(suffix)] + LOG_SUFFIX
    if not os.path.exists(log_path):
        raise LogError(f"{log_path} is missing, so the index cannot be checked against its log")
    return os.open(log_path, os.O_RDONLY)


def _batch_at(fd: int, position: int) -> BatchHeader | None:
    head = os.pread(fd, BATCH_OVERHEAD, position) if position >= 0 else b""
    return BatchHeader.parse(head) if len(head) == BATCH_OVERHEAD else None


def _batch_holding(fd: int, position: int, offset: int) -> BatchPosition | None:
    """The first batch from `position` whose last offset reaches `offset` (Kafka's time-index walk)."""
    end = os.fstat(fd).st_size
    return next((b for b in iter_batches(fd, position, end) if b.header.last_offset >= offset), None)


def _offset_entries(index: OffsetIndex) -> list[tuple[int, int]]:
    """The written entries: up to the zeroed tail of a preallocated file (none if slot 0 starts it).

    Kafka stops at the first slot after slot 0 that maps the base offset. Slot 0 can only map the
    base offset when nothing was written there: the first batch of a segment, at position 0, is
    never indexed, so an entry (base offset, 0) followed by zeros (or by nothing) is an active
    segment's preallocated index with no entry yet — not, as Kafka's tool has it, an entry.
    """
    zero = (index.base_offset, 0)
    entries = []
    for slot in range(index.entries):
        entry = index.entry(slot)
        if entry[0] == index.base_offset and (slot > 0 or (entry == zero and _unwritten_after(index, 0, zero))):
            break
        entries.append(entry)
    return entries


def _unwritten_after(index: OffsetIndex | TimeIndex, slot: int, zero: tuple[int, int]) -> bool:
    """True if the slot after `slot` is absent or zero, as in the preallocated tail of an index."""
    return slot + 1 >= index.entries or index.entry(slot + 1) == zero


def _dump_offset_index(path: str, verify_only: bool, sanity_only: bool, out: TextIO, report: _Report) -> int:
    index = OffsetIndex(path, _offset_of(path), 0, writable=False)
    if sanity_only and index.entries:
        return _offset_index_sanity(index, path, out)
    entries = _offset_entries(index)
    if not entries:
        print(f"{path} is empty.", file=out)
        return 0
    fd = _log_fd(path, INDEX_SUFFIX)
    mismatches: list[tuple[int, int]] = []
    problems = 0
    try:
        for offset, position in entries:
            batch = _batch_at(fd, position)
            log_offset = batch.last_offset if batch else -1
            if log_offset != offset:
                mismatches.append((offset, log_offset))
                if not (batch and _ends_a_later_batch(fd, position, offset)):
                    problems += 1
            if not verify_only:
                print(f"offset: {offset} position: {position}", file=out)
    finally:
        os.close(fd)
    if mismatches:
        report.index_mismatches[os.path.abspath(path)] = mismatches
    return problems


def _ends_a_later_batch(fd: int, position: int, offset: int) -> bool:
    """True if a batch from `position` on ends at `offset`: the one entry of a multi-batch append (pre KAFKA-806)."""
    try:
        found = _batch_holding(fd, position, offset)
    except CorruptRecordError:
        return False  # `position` is not at a batch: no lookup through this entry can be right
    return found is not None and found.header.last_offset == offset


def _offset_index_sanity(index: OffsetIndex, path: str, out: TextIO) -> int:
    """Kafka's OffsetIndex.sanityCheck: the check that decides at startup whether an index is rebuilt."""
    length = os.path.getsize(path)
    last = index.entry(index.entries - 1)[0] if index.entries else index.base_offset
    if index.entries and last < index.base_offset:
        reason = (f"Corrupt index found, index file {os.path.abspath(path)} has non-zero size but the last offset "
                  f"is {last} which is less than the base offset {index.base_offset}")
    elif length % index.entry_size:
        reason = (f"Index file {os.path.abspath(path)} is corrupt, found {length} bytes which is neither positive "
                  f"nor a multiple of {index.entry_size}")
    else:
        reason = ""
    return _sanity(reason, path, out)


def _time_index_sanity(index: TimeIndex, path: str, out: TextIO) -> int:
    """Kafka's TimeIndex.sanityCheck."""
    length = os.path.getsize(path)
    last_ts, last_offset = index.entry(index.entries - 1) if index.entries else (-1, index.base_offset)
    first_ts = index.entry(0)[0] if index.entries else -1
    abs_path = os.path.abspath(path)
    if index.entries and last_ts < first_ts:
        reason = (f"Corrupt time index found, time index file ({abs_path}) has non-zero size but the last timestamp "
                  f"is {last_ts} which is less than the first timestamp {first_ts}")
    elif index.entries and last_offset < index.base_offset:
        reason = (f"Corrupt time index found, time index file ({abs_path}) has non-zero size but the last offset "
                  f"is {last_offset} which is less than the first offset {index.base_offset}")
    elif length % index.entry_size:
        reason = (f"Time index file {abs_path} is corrupt, found {length} bytes which is neither positive nor a "
                  f"multiple of {index.entry_size}")
    else:
        reason = ""
    return _sanity(reason, path, out)


def _sanity(reason: str, path: str, out: TextIO) -> int:
    print(f"{path} failed sanity check: {reason}" if reason else f"{path} passed sanity check.", file=out)
    return int(bool(reason))


@dataclass
class _TimeIndexCheck:
    """Kafka's checks of `.timeindex` entries against the log, one entry at a time."""

    fd: int
    offsets: list[tuple[int, int]]  # the `.index` entries, for Kafka's lookup of where to start walking
    previous: int = -1  # the previous entry's timestamp (Kafka's prevTimestamp)
    mismatches: list[tuple[int, int]] = field(default_factory=list)
    out_of_order: list[tuple[int, int]] = field(default_factory=list)
    not_found: list[tuple[int, int]] = field(default_factory=list)

    def check(self, ts: int, offset: int) -> int:
        """Record the findings of one entry; return how many fail the exit status."""
        slot = bisect.bisect_right(self.offsets, (offset, 2**63)) - 1
        found = _batch_holding(self.fd, self.offsets[slot][1] if slot >= 0 else 0, offset)
        problems = 0
        if found is None or found.header.last_offset != offset:
            self.not_found.append((offset, -1 if found is None else found.header.last_offset))
            if not (found and self._holds_record(found, offset, ts)):
                problems += 1
        else:
            # Kafka compares with the largest record timestamp; an emptied batch the cleaner kept has its header's.
            log_ts = max((r.timestamp for r in self._records(found)), default=found.header.max_timestamp)
            if log_ts != ts:
                self.mismatches.append((ts, log_ts))
                problems += 1
            if self.previous >= ts:
                self.out_of_order.append((ts, self.previous))
                problems += 1
        self.previous = ts
        return problems

    def _records(self, b: BatchPosition):
        return decode_records(b.header, memoryview(os.pread(self.fd, b.size, b.position))[BATCH_OVERHEAD:])

    def _holds_record(self, b: BatchPosition, offset: int, ts: int) -> bool:
        """Kafka 2.x-3.6 indexed the record with the largest timestamp, which can sit inside its batch."""
        return b.header.base_offset <= offset and any(r.offset == offset and r.timestamp == ts
                                                      for r in self._records(b))


def _dump_time_index(path: str, verify_only: bool, sanity_only: bool, out: TextIO, report: _Report) -> int:
    base = _offset_of(path)
    index = TimeIndex(path, base, 0, writable=False)
    if sanity_only:
        return _time_index_sanity(index, path, out)
    offset_index_path = path[: -len(TIME_INDEX_SUFFIX)] + INDEX_SUFFIX
    offsets = (_offset_entries(OffsetIndex(offset_index_path, base, 0, writable=False))
               if os.path.exists(offset_index_path) else [])
    fd = _log_fd(path, TIME_INDEX_SUFFIX)
    checker = _TimeIndexCheck(fd, offsets)
    problems = 0
    try:
        for slot in range(index.entries):
            ts, offset = index.entry(slot)
            if offset == base and slot > 0:
                break  # the zeroed tail of a preallocated index
            if slot == 0 and (ts, offset) == (0, base) and _unwritten_after(index, 0, (0, base)):
                trial = _TimeIndexCheck(fd, offsets)
                trial.check(ts, offset)
                if trial.mismatches or trial.out_of_order or trial.not_found:
                    break  # a preallocated index with no entry yet (unless the log confirms the entry)
            problems += checker.check(ts, offset)
            if not verify_only:
                print(f"timestamp: {ts} offset: {offset}", file=out)
    finally:
        os.close(fd)
    abs_path = os.path.abspath(path)
    for found, kind in ((checker.mismatches, report.time_mismatches), (checker.out_of_order, report.time_out_of_order),
                        (checker.not_found, report.time_not_found)):
        if found:
            kind[abs_path] = found
    return problems


# -- other files ---------------------------------------------------------------------------------

def _dump_txn_index(path: str, verify_only: bool, sanity_only: bool, out: TextIO) -> int:
    """Kafka's `.txnindex` lines (a partial last entry is ignored, as by Kafka). `--index-sanity-check`: Kafka's
    TransactionIndex.sanityCheck and append rules; `--verify-index-only`: those, and each entry against the `.log`
    beside it (the batch at its last offset is that producer's ABORT marker)."""
    with open(path, "rb") as f:
        entries = parse_entries(f.read(), path)
    problems = consistency_problems(entries, _offset_of(path))
    if sanity_only:
        return _sanity("; ".join(problems), path, out)
    if not verify_only:
        for e in entries:
            print(e, file=out)
        return 0
    fd = _log_fd(path, TXN_INDEX_SUFFIX)
    try:
        problems += [p for e in entries if (p := _abort_marker_problem(fd, e)) is not None]
    finally:
        os.close(fd)
    for problem in problems:
        print(f"{path}: {problem}", file=out)
    return len(problems)


def _abort_marker_problem(fd: int, e: AbortedTxn) -> str | None:
    """Why the log does not hold producer `e.producer_id`'s ABORT marker at `e.last_offset`, or None."""
    found = _batch_holding(fd, 0, e.last_offset)
    where = f"aborted transaction of producer {e.producer_id} (first offset {e.first_offset}, last offset " \
            f"{e.last_offset})"
    if found is None or found.header.base_offset > e.last_offset:
        return f"{where}: no batch holds its last offset"
    h = found.header
    if not h.is_control or h.producer_id != e.producer_id:
        return (f"{where}: the batch at offset {h.base_offset} is {'a control' if h.is_control else 'a data'} "
                f"batch of producer {h.producer_id}")
    raw = os.pread(fd, found.size, found.position)
    records = decode_records(h, memoryview(raw)[BATCH_OVERHEAD:], "") if h.records_count else []
    control = parse_control_key(records[0].key) if records else None
    if control is not ControlType.ABORT:
        return f"{where}: the marker at offset {h.base_offset} is {control.name if control else 'empty'}, not ABORT"
    return None


def _dump_checkpoint(path: str, out: TextIO) -> int:
    with open(path, "rb") as f:
        entries = parse_offsets(f.read(), path)
    print(f"version: 0 entries: {len(entries)}", file=out)
    for tp, offset in entries.items():
        print(f"topic: {tp.topic} partition: {tp.partition} offset: {offset}", file=out)
    return 0
