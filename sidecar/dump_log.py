"""`shale dump-log`: Kafka's kafka-dump-log.sh (DumpLogSegments) for Shale's — and Kafka's — files.

Output lines match Kafka's so that people and scripts that know Kafka's tool can
read ours. Index files are checked against the `.log` beside them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Iterator, TextIO

from .log.checkpoint import CheckpointError, parse_offsets, parse_partition_metadata
from .log.errors import CorruptRecordError, LogError
from .log.file_records import iter_batches
from .log.offset_index import OffsetIndex
from .log.records import (
    BATCH_OVERHEAD,
    BatchHeader,
    ControlType,
    check_batch,
    decode_records,
    parse_control_key,
    parse_end_txn_marker,
)
from .log.producer_snapshot import format_entry, parse_snapshot
from .log.segment import INDEX_SUFFIX, LOG_SUFFIX, SNAPSHOT_SUFFIX, TIME_INDEX_SUFFIX, offset_from_filename
from .log.time_index import TimeIndex

CHECKPOINT_NAMES = ("recovery-point-offset-checkpoint", "log-start-offset-checkpoint", "cleaner-offset-checkpoint",
                    "replication-offset-checkpoint")


@dataclass
class _Report:
    """Kafka prints its findings on stderr after all files, in this order."""

    index_mismatches: list[str] = field(default_factory=list)
    time_index_errors: list[str] = field(default_factory=list)
    non_consecutive: list[str] = field(default_factory=list)

    def lines(self) -> list[str]:
        return self.index_mismatches + self.time_index_errors + self.non_consecutive


def dump_files(paths: list[str], *, print_data: bool = False, deep_iteration: bool = False,
               verify_index_only: bool = False, index_sanity_check: bool = False, max_bytes: int | None = None,
               out: TextIO, err: TextIO | None = None) -> int:
    """Dump each file; return 1 if any file held corrupt data or an index disagreed with its log, else 0.

    Kafka's tool always exits 0; a non-zero exit on a finding makes ours usable in scripts.
    """
    err = err if err is not None else out
    report = _Report()
    problems = 0
    deep_iteration = deep_iteration or print_data
    for path in paths:
        name = os.path.basename(path)
        print(f"Dumping {path}", file=out)
        try:
            if name.endswith(LOG_SUFFIX):
                problems += _dump_log(path, deep_iteration, print_data, max_bytes, out, report)
            elif name.endswith(INDEX_SUFFIX):
                problems += _dump_offset_index(path, verify_index_only, index_sanity_check, out, report)
            elif name.endswith(TIME_INDEX_SUFFIX):
                problems += _dump_time_index(path, verify_index_only, index_sanity_check, out, report)
            elif name.endswith(SNAPSHOT_SUFFIX):
                with open(path, "rb") as f:
                    for entry in parse_snapshot(f.read(), path):
                        print(format_entry(entry), file=out)
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
    return 1 if problems else 0


def _dump_log(path: str, deep: bool, print_data: bool, max_bytes: int | None, out: TextIO, report: _Report) -> int:
    print(f"Log starting offset: {offset_from_filename(os.path.basename(path))}", file=out)
    fd = os.open(path, os.O_RDONLY)
    gaps: list[str] = []
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
                            gaps.append(f"  {last_offset} is followed by {offset}")
                        last_offset = offset
                        print(line, file=out)
                valid_bytes = b.end
        except CorruptRecordError as e:
            print(f"Found a corrupt batch at position {valid_bytes} of {path}: {e}", file=out)
            problems += 1
        if valid_bytes < end and max_bytes is None:
            print(f"Found {end - valid_bytes} invalid bytes at the end of {os.path.basename(path)}", file=out)
            problems += 1
        if gaps:
            report.non_consecutive += [f"Non-consecutive offsets in {os.path.abspath(path)}", *gaps]
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
            ctype = parse_control_key(r.key)
            if ctype in (ControlType.ABORT, ControlType.COMMIT):
                line += f" endTxnMarker: {ctype.name} coordinatorEpoch: {parse_end_txn_marker(r.value)}"
            else:
                line += f" controlType: {ctype.name}({int(ctype)})"
        elif print_data:
            if r.key is not None:
                line += f" key: {r.key.decode('utf-8', 'replace')}"
            if r.value is not None:
                line += f" payload: {r.value.decode('utf-8', 'replace')}"
        yield r.offset, line


def _segment_log_fd(index_path: str, suffix: str) -> int | None:
    log_path = index_path[: -len(suffix)] + LOG_SUFFIX
    return os.open(log_path, os.O_RDONLY) if os.path.exists(log_path) else None


def _batch_at(fd: int, position: int) -> BatchHeader | None:
    head = os.pread(fd, BATCH_OVERHEAD, position)
    return BatchHeader.parse(head) if len(head) == BATCH_OVERHEAD else None


def _dump_offset_index(path: str, verify_only: bool, sanity_only: bool, out: TextIO, report: _Report) -> int:
    index = OffsetIndex(path, offset_from_filename(os.path.basename(path)), 0, writable=False)
    if index.entries == 0:
        print(f"{path} is empty.", file=out)
        return 0
    if sanity_only:
        return _sanity(index.entries and index.last_offset < index.base_offset, path, out)
    fd = _segment_log_fd(path, INDEX_SUFFIX)
    mismatches: list[tuple[int, int]] = []
    try:
        for slot in range(index.entries):
            offset, position = index.entry(slot)
            if offset == index.base_offset and slot > 0:
                break  # the zeroed tail of a preallocated index that was never trimmed
            if not verify_only:
                print(f"offset: {offset} position: {position}", file=out)
            if fd is not None:
                batch = _batch_at(fd, position)
                log_offset = batch.last_offset if batch else -1
                if log_offset != offset:
                    mismatches.append((offset, log_offset))
    finally:
        if fd is not None:
            os.close(fd)
    if mismatches:
        report.index_mismatches.append(f"Mismatches in :{os.path.abspath(path)}")
        report.index_mismatches += [f"  Index offset: {o}, log offset: {lo}" for o, lo in mismatches]
    return len(mismatches)


def _dump_time_index(path: str, verify_only: bool, sanity_only: bool, out: TextIO, report: _Report) -> int:
    base = offset_from_filename(os.path.basename(path))
    index = TimeIndex(path, base, 0, writable=False)
    if sanity_only:
        bad = index.entries > 1 and index.entry(index.entries - 1)[0] < index.entry(0)[0]
        return _sanity(bad, path, out)
    offset_index_path = path[: -len(TIME_INDEX_SUFFIX)] + INDEX_SUFFIX
    offsets = OffsetIndex(offset_index_path, base, 0, writable=False) if os.path.exists(offset_index_path) else None
    fd = _segment_log_fd(path, TIME_INDEX_SUFFIX)
    mismatches: list[tuple[int, int]] = []
    out_of_order: list[tuple[int, int]] = []
    not_found: list[tuple[int, int]] = []
    previous = -1
    try:
        for slot in range(index.entries):
            ts, offset = index.entry(slot)
            if offset == base and slot > 0:
                break
            if not verify_only:
                print(f"timestamp: {ts} offset: {offset}", file=out)
            if fd is not None:
                start = offsets.lookup(offset)[1] if offsets else 0
                batch = next((b.header for b in iter_batches(fd, start, os.fstat(fd).st_size)
                              if b.header.last_offset >= offset), None)
                if batch is None or batch.last_offset != offset:
                    not_found.append((offset, -1 if batch is None else batch.last_offset))
                else:
                    if batch.max_timestamp != ts:
                        mismatches.append((ts, batch.max_timestamp))
                    if previous >= ts:
                        out_of_order.append((ts, previous))
            previous = ts
    finally:
        if fd is not None:
            os.close(fd)
    lines = report.time_index_errors
    if mismatches:
        lines.append(f"Found timestamp mismatch in :{os.path.abspath(path)}")
        lines += [f"  Index timestamp: {ts}, log timestamp: {log_ts}" for ts, log_ts in mismatches]
    if out_of_order:
        lines.append(f"Found out of order timestamp in :{os.path.abspath(path)}")
        lines += [f"  Index timestamp: {ts}, Previously indexed timestamp: {prev}" for ts, prev in out_of_order]
    if not_found:
        lines.append("The following indexed offsets are not found in the log.")
        lines += [f"Indexed offset: {o}, found log offset: {lo}" for o, lo in not_found]
    return len(mismatches) + len(out_of_order) + len(not_found)


def _sanity(bad: bool, path: str, out: TextIO) -> int:
    print(f"{path} passed sanity check." if not bad else f"{path} failed sanity check.", file=out)
    return int(bool(bad))


def _dump_checkpoint(path: str, out: TextIO) -> int:
    with open(path, "rb") as f:
        entries = parse_offsets(f.read(), path)
    print(f"version: 0 entries: {len(entries)}", file=out)
    for tp, offset in entries.items():
        print(f"topic: {tp.topic} partition: {tp.partition} offset: {offset}", file=out)
    return 0
