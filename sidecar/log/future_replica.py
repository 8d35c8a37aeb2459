"""A partition's future replica in another log dir: the copy, the crash-safe swap and its recovery at load.

Kafka's AlterReplicaLogDirs copies a partition into `<topic>-<p>.<uuid>-future` in the target dir and swaps it
in once caught up (docs/moves.md, section 3). Here the copy is of the partition's files, byte for byte: sealed
segments and their indexes once, the `.log` files incrementally as they grow, the rest (the active segment's
indexes, producer snapshots, `leader-epoch-checkpoint`, `partition.metadata`) at the end, with the source
log closed, so the swapped-in directory is the source's exactly. Cleaning of the partition is paused
meanwhile by the move (its owner), so no sealed segment is rewritten under the copy; retention may still
delete segments, and the copy follows.

The swap is three renames, each inside one dir and made durable before the next:
`S/<tp>` → `S/<tp>.<uuid>-swapout`, `D/<tp>.<uuid>-future` → `D/<tp>`, `S/<tp>.<uuid>-swapout` →
`S/<tp>.<uuid>-delete` (removed). `recover_moves` finishes or undoes a swap cut by a crash at any point.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import threading
from dataclasses import dataclass, field
from typing import Callable

from .atomic_file import fsync_dir
from .segment import (
    CLEANED_SUFFIX,
    DELETED_SUFFIX,
    INDEX_SUFFIX,
    LOG_SUFFIX,
    SWAP_SUFFIX,
    TIME_INDEX_SUFFIX,
    TXN_INDEX_SUFFIX,
    filename_prefix,
)
from .topic_partition import TopicPartition

logger = logging.getLogger(__name__)

FUTURE_SUFFIX = "-future"
SWAPOUT_SUFFIX = "-swapout"
DELETE_SUFFIX = "-delete"
MAX_DIR_NAME = 255
CHUNK_BYTES = 256 * 1024
_MOVE_DIR = re.compile(r"^(?P<tp>.+-\d+)\.(?P<id>[0-9a-f]{32})(?P<suffix>-future|-swapout)$")
_TRANSIENT = (DELETED_SUFFIX, CLEANED_SUFFIX, SWAP_SUFFIX, ".tmp")  # never copied: the source's own leftovers


class MoveCancelled(Exception):
    """The move was cancelled (another AlterReplicaLogDirs, its topic deleted, the node stopping)."""


@dataclass(frozen=True, slots=True)
class MoveDir:
    """A directory a move left in a log dir: its partition, the move's id and whether it is the future or the swap-out."""

    tp: TopicPartition
    move_id: str
    suffix: str

    @property
    def name(self) -> str:
        return f"{self.tp}.{self.move_id}{self.suffix}"


def future_dir_name(tp: TopicPartition, move_id: str) -> str:
    """Kafka's logFutureDirName; ValueError when the name would not fit a file name (topics of 214+ characters)."""
    name = f"{tp}.{move_id}{FUTURE_SUFFIX}"
    if len(name.encode()) > MAX_DIR_NAME:
        raise ValueError(f"{tp}: the future replica's directory name would have {len(name)} bytes, above "
                         f"{MAX_DIR_NAME}: this partition cannot be moved between log dirs")
    return name


def parse_move_dir(name: str) -> MoveDir | None:
    m = _MOVE_DIR.match(name)
    if m is None:
        return None
    return MoveDir(TopicPartition.parse_dir_name(m["tp"]), m["id"], m["suffix"])


def _copyable(name: str) -> bool:
    return not name.endswith(_TRANSIENT)


def _is_index(name: str) -> bool:
    return name.endswith((INDEX_SUFFIX, TIME_INDEX_SUFFIX, TXN_INDEX_SUFFIX))


@dataclass
class FutureCopy:
    """The incremental copy of one partition's files into its future dir.

    `throttle(n)` is called after each chunk (it may sleep); `cancelled` is checked between chunks.
    """

    source: str  # the partition's directory now
    target: str  # the future directory
    throttle: Callable[[int], None] = lambda n: None
    cancelled: threading.Event = field(default_factory=threading.Event)
    _copied: dict[str, int] = field(default_factory=dict)  # file name -> bytes copied

    def create(self, partition_metadata: bytes | None) -> None:
        os.mkdir(self.target)
        if partition_metadata is not None:
            with open(os.path.join(self.target, "partition.metadata"), "wb") as f:
                f.write(partition_metadata)
        fsync_dir(os.path.dirname(self.target))

    def plan(self, log) -> tuple[dict[str, int], int]:
        """Under the log's lock: every segment's `.log` length and the sealed segments' indexes; and the bytes left."""
        with log.lock:
            segments = list(log.segments)
        wanted: dict[str, int] = {}
        for seg in segments:
            base = filename_prefix(seg.base_offset) + LOG_SUFFIX
            wanted[base] = seg.size
            if seg is not segments[-1]:
                stem = base[: -len(LOG_SUFFIX)]
                for suffix in (INDEX_SUFFIX, TIME_INDEX_SUFFIX, TXN_INDEX_SUFFIX):
                    path = os.path.join(self.source, stem + suffix)
                    if os.path.exists(path):
                        wanted[stem + suffix] = os.path.getsize(path)
        remaining = sum(max(size - self._copied.get(name, 0), 0) for name, size in wanted.items())
        return wanted, remaining

    def copied_through(self, log) -> int:
        """The offset below which every batch is copied (segment granularity): the future replica's log end."""
        with log.lock:
            segments = list(log.segments)
            end = log.log_end_offset
        for seg in segments:
            if self._copied.get(filename_prefix(seg.base_offset) + LOG_SUFFIX, 0) < seg.size:
                return seg.base_offset
        return end

    def step(self, log) -> int:
        """One round: copy what the source has that the future lacks; drop files retention removed. Bytes copied."""
        wanted, _ = self.plan(log)
        copied = 0
        for name, size in sorted(wanted.items()):
            copied += self._copy(name, size, whole=_is_index(name))
        for name in list(self._copied):
            if name not in wanted and not os.path.exists(os.path.join(self.source, name)):
                self._copied.pop(name)  # the source deleted it (retention): so does the future
                _unlink(os.path.join(self.target, name))
        return copied

    def finish(self) -> None:
        """With the source log closed (its files final): make the future dir equal to the source dir, durably."""
        names = {n for n in os.listdir(self.source) if _copyable(n) and os.path.isfile(os.path.join(self.source, n))}
        for name in sorted(names):
            size = os.path.getsize(os.path.join(self.source, name))
            if not name.endswith(LOG_SUFFIX) and not _is_index(name):
                self._copied.pop(name, None)  # small files whose content may change at the same size
            self._copy(name, size, whole=not name.endswith(LOG_SUFFIX))
        for name in os.listdir(self.target):
            if name not in names:
                _unlink(os.path.join(self.target, name))
        for name in names:
            fd = os.open(os.path.join(self.target, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        fsync_dir(self.target)

    def _copy(self, name: str, size: int, *, whole: bool) -> int:
        """Copy `name` up to `size` bytes: the appended bytes of a grown `.log`, else the whole file (unless copied
        at this size already: a sealed segment's index does not change while cleaning is paused)."""
        done = self._copied.get(name)
        if done == size:
            return 0
        start = done if (done is not None and done < size and not whole) else 0
        src_path, dst_path = os.path.join(self.source, name), os.path.join(self.target, name)
        copied = 0
        try:
            with open(src_path, "rb") as src, open(dst_path, "r+b" if start else "wb") as dst:
                src.seek(start)
                dst.seek(start)
                dst.truncate(start)
                while copied < size - start:
                    if self.cancelled.is_set():
                        raise MoveCancelled(f"the copy of {self.source} into {self.target} was cancelled")
                    chunk = src.read(min(CHUNK_BYTES, size - start - copied))
                    if not chunk:
                        break  # the source shrank under us (a truncation): the next round starts it again
                    dst.write(chunk)
                    copied += len(chunk)
                    self.throttle(len(chunk))
        except FileNotFoundError:
            if os.path.exists(src_path):
                raise
            return copied  # retention deleted it meanwhile
        self._copied[name] = start + copied
        return copied


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def _rename(src: str, dst: str) -> None:
    os.rename(src, dst)
    fsync_dir(os.path.dirname(dst))


def swap_out(source_parent: str, tp: TopicPartition, move_id: str) -> str:
    """Step 1: the current directory becomes the swap-out; returns its path."""
    out = os.path.join(source_parent, f"{tp}.{move_id}{SWAPOUT_SUFFIX}")
    _rename(os.path.join(source_parent, str(tp)), out)
    return out


def swap_in(target_parent: str, tp: TopicPartition, move_id: str) -> str:
    """Step 2: the future directory becomes the partition's; returns its path."""
    current = os.path.join(target_parent, str(tp))
    _rename(os.path.join(target_parent, future_dir_name(tp, move_id)), current)
    return current


def drop_swapped_out(source_parent: str, tp: TopicPartition, move_id: str) -> None:
    """Step 3: the old copy goes Kafka's way (`-delete`), removed at once."""
    doomed = os.path.join(source_parent, f"{tp}.{move_id}{DELETE_SUFFIX}")
    _rename(os.path.join(source_parent, f"{tp}.{move_id}{SWAPOUT_SUFFIX}"), doomed)
    shutil.rmtree(doomed, ignore_errors=True)


def remove_future(target_parent: str, tp: TopicPartition, move_id: str) -> None:
    """A cancelled or failed move: its future directory goes (through `-delete`, so a crash cannot resurrect it)."""
    future = os.path.join(target_parent, f"{tp}.{move_id}{FUTURE_SUFFIX}")
    if not os.path.exists(future):
        return
    doomed = os.path.join(target_parent, f"{tp}.{move_id}-f{DELETE_SUFFIX}")
    _rename(future, doomed)
    shutil.rmtree(doomed, ignore_errors=True)


@dataclass(frozen=True, slots=True)
class PendingMove:
    """A future replica found at load whose move resumes: its partition, id and target dir."""

    tp: TopicPartition
    move_id: str
    target: str


def recover_moves(dirs: list[str]) -> list[PendingMove]:
    """Before the logs load: finish or undo every swap a crash cut (docs/moves.md's table); return the moves to resume.

    Every decision is logged with the partition, the move and the directories.
    """
    found: dict[TopicPartition, dict[str, list[tuple[str, MoveDir]]]] = {}
    current: dict[TopicPartition, list[str]] = {}
    for d in dirs:
        for name in sorted(os.listdir(d)):
            if not os.path.isdir(os.path.join(d, name)):
                continue
            move = parse_move_dir(name)
            if move is not None:
                found.setdefault(move.tp, {}).setdefault(move.suffix, []).append((d, move))
                continue
            try:
                current.setdefault(TopicPartition.parse_dir_name(name), []).append(d)
            except ValueError:
                continue
    pending: list[PendingMove] = []
    for tp, kinds in sorted(found.items(), key=lambda item: str(item[0])):
        futures = kinds.get(FUTURE_SUFFIX, [])
        for src, out in kinds.get(SWAPOUT_SUFFIX, []):
            mine = [(d, m) for d, m in futures if m.move_id == out.move_id]
            if mine:  # crash between steps 1 and 2: finish
                dst = mine[0][0]
                logger.warning("%s: move %s was cut between its renames; finishing it: %s -> %s", tp, out.move_id,
                               src, dst)
                swap_in(dst, tp, out.move_id)
                drop_swapped_out(src, tp, out.move_id)
                futures = [f for f in futures if f[1].move_id != out.move_id]
                current[tp] = [dst]
            elif current.get(tp):  # crash between steps 2 and 3: the new copy is in place
                logger.warning("%s: move %s had swapped in %s; removing the old copy in %s", tp, out.move_id,
                               current[tp][0], src)
                drop_swapped_out(src, tp, out.move_id)
            else:  # the target's copy is gone: the old one is the partition again
                logger.warning("%s: move %s left only its old copy in %s; restoring it", tp, out.move_id, src)
                _rename(os.path.join(src, out.name), os.path.join(src, str(tp)))
                current[tp] = [src]
        for dst, fut in futures:
            if not current.get(tp):
                logger.warning("%s: removing the future replica of move %s in %s: the partition is gone", tp,
                               fut.move_id, dst)
                remove_future(dst, tp, fut.move_id)
            elif dst in current[tp] or any(p.tp == tp for p in pending):
                logger.warning("%s: removing the future replica of move %s in %s: %s", tp, fut.move_id, dst,
                               "it is in the partition's own dir" if dst in current[tp] else "another move resumes")
                remove_future(dst, tp, fut.move_id)
            else:
                logger.info("%s: move %s to %s resumes", tp, fut.move_id, dst)
                pending.append(PendingMove(tp, fut.move_id, dst))
    return pending
