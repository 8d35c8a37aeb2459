"""Opening a partition directory the way Kafka's LogLoader does.

Order matters for crash safety: delete `.deleted` files, settle `.cleaned`/`.swap`
leftovers of an interrupted compaction, delete orphan indexes, open the segments,
and — only after an unclean shutdown — recover every segment from the one holding
the recovery point, truncating at the first invalid batch.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Callable

from .records import BatchHeader
from .segment import (
    CLEANED_SUFFIX,
    DELETED_SUFFIX,
    INDEX_SUFFIX,
    INDEX_SUFFIXES,
    LOG_SUFFIX,
    SWAP_SUFFIX,
    TIME_INDEX_SUFFIX,
    LogSegment,
    offset_from_filename,
)

log = logging.getLogger(__name__)

SegmentFactory = Callable[[int, str], LogSegment]  # (base offset, file suffix) -> segment


@dataclass
class LoadResult:
    segments: list[LogSegment]
    recovery_point: int
    log_start_offset: int
    bytes_truncated: int
    recovered_from: int | None  # base offset of the first segment recovered for an unclean shutdown


def _is_segment_file(name: str) -> bool:
    return name[:20].isdigit() and len(name) > 20 and name[20] == "."


def remove_temp_files_and_collect_swaps(directory: str, where: str) -> list[str]:
    """Delete `.deleted` and `.cleaned` files and the swaps of an unfinished split; return the swap files left."""
    swaps: list[str] = []
    cleaned: list[str] = []
    for name in sorted(os.listdir(directory)):
        path = os.path.join(directory, name)
        if not _is_segment_file(name):
            continue
        if name.endswith(DELETED_SUFFIX):
            log.info("%s: deleting stray temporary file %s", where, name)
            os.unlink(path)
        elif name.endswith(CLEANED_SUFFIX):
            cleaned.append(name)
        elif name.endswith(SWAP_SUFFIX):
            swaps.append(name)
    min_cleaned = min((offset_from_filename(n) for n in cleaned), default=None)
    kept = []
    for name in swaps:
        # A swap at or after a .cleaned file belongs to a split that never finished (KAFKA-6264).
        if min_cleaned is not None and offset_from_filename(name) >= min_cleaned:
            log.info("%s: deleting swap file %s of an incomplete split", where, name)
            os.unlink(os.path.join(directory, name))
        else:
            kept.append(name)
    for name in cleaned:
        log.info("%s: deleting leftover cleaned file %s", where, name)
        os.unlink(os.path.join(directory, name))
    return kept


def complete_swaps(directory: str, swaps: list[str], open_segment: SegmentFactory, where: str) -> None:
    """Finish an interrupted replace: delete the segments a swap replaces, then drop the `.swap` suffix."""
    for name in swaps:
        if not name.endswith(LOG_SUFFIX + SWAP_SUFFIX):
            continue
        base = offset_from_filename(name)
        seg = open_segment(base, SWAP_SUFFIX)
        end = seg.next_offset
        seg.close_handles()
        for other in sorted(os.listdir(directory)):
            if not _is_segment_file(other) or other.endswith(SWAP_SUFFIX):
                continue
            if base <= offset_from_filename(other) < end:
                log.info("%s: deleting %s, replaced by swap segment %s", where, other, name)
                os.unlink(os.path.join(directory, other))
    for name in swaps:
        os.replace(os.path.join(directory, name), os.path.join(directory, name[: -len(SWAP_SUFFIX)]))


def load(
    directory: str,
    open_segment: SegmentFactory,
    *,
    recovery_point: int,
    log_start_offset: int,
    had_clean_shutdown: bool,
    max_index_size: int,
    delete_segment: Callable[[LogSegment], None],
    where: str,
    on_recovered_batch: Callable[[BatchHeader], None] | None = None,
) -> LoadResult:
    """Load and, if needed, recover the segments of one partition directory.

    `on_recovered_batch` sees, in order, the header of every valid batch from the recovery point's
    segment on, when an unclean shutdown makes them recovered.
    """
    swaps = remove_temp_files_and_collect_swaps(directory, where)
    complete_swaps(directory, swaps, open_segment, where)

    names = sorted(n for n in os.listdir(directory) if _is_segment_file(n))
    bases = {offset_from_filename(n) for n in names if n.endswith(LOG_SUFFIX)}
    for name in names:
        if name.endswith(INDEX_SUFFIXES) and offset_from_filename(name) not in bases:
            log.warning("%s: found an orphaned index file %s, deleting it", where, name)
            os.unlink(os.path.join(directory, name))

    segments: list[LogSegment] = []
    needs_recovery: set[int] = set()
    for base in sorted(bases):
        index_missing = not os.path.exists(os.path.join(directory, f"{base:020d}{INDEX_SUFFIX}"))
        time_index_missing = not os.path.exists(os.path.join(directory, f"{base:020d}{TIME_INDEX_SUFFIX}"))
        seg = open_segment(base, "")
        segments.append(seg)
        if index_missing:
            needs_recovery.add(base)
        if time_index_missing:
            # Kafka's sanityCheck(timeIndexFileNewlyCreated): an empty file, not a preallocated one that a
            # crash would leave behind as zero entries; recovery (or becoming active) sizes it again.
            seg.time_index.resize(0)

    truncated = 0
    start = len(segments)
    if not had_clean_shutdown:
        start = _segment_index_for(segments, recovery_point)
        for i in range(start, len(segments)):
            needs_recovery.add(segments[i].base_offset)
    recovered_from = segments[start].base_offset if start < len(segments) else None
    for i, seg in enumerate(list(segments)):
        if seg.base_offset not in needs_recovery:
            continue
        n = seg.recover(on_recovered_batch if i >= start else None)
        if n > 0:
            log.warning("%s: truncated %d invalid bytes at offset %d in segment %s", where, n, seg.next_offset, seg.log_path)
            truncated += n
            for later in segments[i + 1 :]:
                log.warning("%s: deleting segment %s, which follows truncated data", where, later.log_path)
                delete_segment(later)
            del segments[i + 1 :]
            break

    log_end = segments[-1].next_offset if segments else 0
    if segments and log_end < log_start_offset:
        log.warning("%s: log end offset %d is below the checkpointed log start offset %d; deleting all segments",
                    where, log_end, log_start_offset)
        for seg in segments:
            delete_segment(seg)
        segments = []
    if not segments:
        segments.append(open_segment(log_start_offset, ""))
        log_end = log_start_offset
    segments[-1].resize_indexes(max_index_size)
    return LoadResult(
        segments=segments,
        recovery_point=log_end if had_clean_shutdown else min(recovery_point, log_end),
        log_start_offset=max(log_start_offset, segments[0].base_offset),
        bytes_truncated=truncated,
        recovered_from=recovered_from,
    )


def _segment_index_for(segments: list[LogSegment], offset: int) -> int:
    """Index of the segment that holds `offset` (the floor by base offset), or 0."""
    idx = 0
    for i, seg in enumerate(segments):
        if seg.base_offset <= offset:
            idx = i
    return idx
