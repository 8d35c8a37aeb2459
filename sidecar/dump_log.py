"""`shale dump-log`: Kafka's kafka-dump-log.sh (DumpLogSegments) for Shale's — and Kafka's — files.

Output lines match Kafka's so that people and scripts that know Kafka's tool can
read ours. Index files are checked against the `.log` beside them.
"""

from __future__ import annotations

import os
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
from .log.segment import INDEX_SUFFIX, LOG_SUFFIX, TIME_INDEX_SUFFIX, offset_from_filename
from .log.time_index import TimeIndex

CHECKPOINT_NAMES = ("recovery-point-offset-checkpoint", "log-start-offset-checkpoint", "cleaner-offset-checkpoint",
                    "replication-offset-checkpoint")


def dump_files(paths: list[str], *, print_data: bool = False, verify_index_only: bool = False,
               index_sanity_check: bool = False, max_bytes: int = 2**31 - 1, out: TextIO) -> int:
    """Dump each file; return 1 if any file held corrupt data or an index disagreed with its log, else 0."""
    problems = 0
    for path in paths:
        name = os.path.basename(path)
        print(f"Dumping {path}", file=out)
        try:
            if name.endswith(LOG_SUFFIX):
                problems += _dump_log(path, print_data, max_bytes, out)
            elif name.endswith(INDEX_SUFFIX):
                problems += _dump_offset_index(path, verify_index_only, index_sanity_check, out)
            elif name.endswith(TIME_INDEX_SUFFIX):
                problems += _dump_time_index(path, verify_index_only, index_sanity_check, out)
            elif name in CHECKPOINT_NAMES:
                problems += _dump_checkpoint(path, out)
            elif name == "partition.metadata":
                with open(path, "rb") as f:
                    print(f"topic_id: {parse_partition_metadata(f.read(), path)}", file=out)
            else:
                print(f"Ignoring unknown file {path}", file=out)
        except (OSError, LogError, CheckpointError) as e:
            print(f"Could not read {path}: {e}", file=out)
            problems += 1
    return 1 if problems else 0


def _dump_log(path: str, print_data: bool, max_bytes: int, out: TextIO) -> int:
    print(f"Log starting offset: {offset_from_filename(os.path.basename(path))}", file=out)
    fd = os.open(path, os.O_RDONLY)
    try:
        end = min(os.fstat(fd).st_size, max_bytes)
        valid_bytes = 0
        problems = 0
        try:
            for b in iter_batches(fd, 0, end, path):
                raw = os.pread(fd, b.size, b.position)
                print(format_batch(b.header, b.position, _is_valid(raw)), file=out)
                if not _is_valid(raw):
                    problems += 1
                elif print_data:
                    for line in format_records(b.header, raw):
                        print(line, file=out)
                valid_bytes = b.end
        except CorruptRecordError as e:
            print(f"Found a corrupt batch at position {valid_bytes} of {path}: {e}", file=out)
            problems += 1
        if valid_bytes < end:
            print(f"Found {end - valid_bytes} invalid bytes at the end of {os.path.basename(path)}", file=out)
            problems += 1
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


def format_records(h: BatchHeader, raw: bytes) -> Iterator[str]:
    """Kafka's `| offset: …` record lines; keys and values printed as UTF-8 text, as its default decoder does."""
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
        else:
            if r.key is not None:
                line += f" key: {r.key.decode('utf-8', 'replace')}"
            if r.value is not None:
                line += f" payload: {r.value.decode('utf-8', 'replace')}"
        yield line


def _segment_log_fd(index_path: str, suffix: str) -> int | None:
    log_path = index_path[: -len(suffix)] + LOG_SUFFIX
    return os.open(log_path, os.O_RDONLY) if os.path.exists(log_path) else None


def _batch_at(fd: int, position: int) -> BatchHeader | None:
    head = os.pread(fd, BATCH_OVERHEAD, position)
    return BatchHeader.parse(head) if len(head) == BATCH_OVERHEAD else None


def _dump_offset_index(path: str, verify_only: bool, sanity_only: bool, out: TextIO) -> int:
    index = OffsetIndex(path, offset_from_filename(os.path.basename(path)), 0, writable=False)
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
        print(f"Mismatches in :{path}", file=out)
        for offset, log_offset in mismatches:
            print(f"  Index offset: {offset}, log offset: {log_offset}", file=out)
    return len(mismatches)


def _dump_time_index(path: str, verify_only: bool, sanity_only: bool, out: TextIO) -> int:
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
                log_ts = next((b.header.max_timestamp for b in iter_batches(fd, start, os.fstat(fd).st_size)
                               if b.header.last_offset >= offset), -1)
                if log_ts != ts:
                    mismatches.append((ts, log_ts))
            if ts <= previous:
                out_of_order.append((ts, previous))
            previous = ts
    finally:
        if fd is not None:
            os.close(fd)
    if mismatches:
        print(f"Found timestamp mismatch in :{path}", file=out)
        for ts, log_ts in mismatches:
            print(f"  Index timestamp: {ts}, log timestamp: {log_ts}", file=out)
    if out_of_order:
        print(f"Found out of order timestamp in :{path}", file=out)
        for ts, prev in out_of_order:
            print(f"  Index timestamp: {ts}, Previously indexed timestamp: {prev}", file=out)
    return len(mismatches) + len(out_of_order)


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
