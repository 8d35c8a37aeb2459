"""A log directory: the partitions in it, its checkpoint files and its clean-shutdown marker.

This is the slice of Kafka's LogManager that owns one `log.dirs` entry: it loads
every `<topic>-<partition>` directory (recovering after an unclean shutdown),
persists recovery points, log start offsets and the high watermarks of replicated logs
(ReplicaManager's `replication-offset-checkpoint`), and deletes topics Kafka's way (rename
to `-delete`, remove later).
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import shutil
import threading
import uuid
from typing import Callable

from ..plural import plural
from .atomic_file import atomic_write, create_empty, fsync_dir
from .checkpoint import (
    LOG_START_OFFSET_CHECKPOINT,
    PARTITION_METADATA,
    RECOVERY_POINT_CHECKPOINT,
    REPLICATION_OFFSET_CHECKPOINT,
    CheckpointError,
    encode_partition_metadata,
    new_topic_id,
    parse_partition_metadata,
    read_offsets,
    write_offsets,
)
from .errors import LogError
from .free_space import DirSpace, FreeFloor
from .future_replica import parse_move_dir
from .log import Log, now_ms
from .producer_state import DEFAULT_PRODUCER_ID_EXPIRATION_MS
from .topic_partition import TopicPartition

logger = logging.getLogger(__name__)

CLEAN_SHUTDOWN_FILE = ".kafka_cleanshutdown"
LOCK_FILE = ".lock"
DELETE_DIR_SUFFIX = "-delete"
MAX_DIR_NAME = 255  # a file name's limit on Linux filesystems, in bytes; topic names are ASCII


def delete_dir_name(tp: TopicPartition) -> str:
    """Kafka's logDeleteDirName: `<topic>-<partition>.<uuid>-delete`, the topic cut so that the name fits.

    A topic name may have 249 characters: uncut, its rename fails (ENAMETOOLONG) and the topic comes
    back at the next start. Loading removes any directory ending in `-delete`, cut or not.
    """
    suffix = f"-{tp.partition}.{uuid.uuid4().hex}{DELETE_DIR_SUFFIX}"
    return tp.topic[: MAX_DIR_NAME - len(suffix)] + suffix


class LogDirLockedError(RuntimeError):
    """Another process holds this log directory."""


class LogDir:
    """All partition logs of one data directory."""

    def __init__(self, path: str, config_for: Callable[[str], object], *, clock: Callable[[], int] = now_ms,
                 producer_id_expiration_ms: int = DEFAULT_PRODUCER_ID_EXPIRATION_MS, load: bool = True,
                 floor: FreeFloor = FreeFloor()) -> None:
        """Lock the directory and (unless `load` is False: `LogDirs` recovers moves over all its dirs first) load it."""
        self.path = os.path.abspath(path)
        self.space = DirSpace(self.path, floor)  # its free space under the floor refuses clients' Produce
        self.config_for = config_for
        self.clock = clock
        self.producer_id_expiration_ms = producer_id_expiration_ms  # a broker setting, given to every Log
        self.logs: dict[TopicPartition, Log] = {}
        self.lock = threading.RLock()
        os.makedirs(self.path, exist_ok=True)
        # Nothing here yet (a `.lock` alone is an earlier start that wrote nothing): a new directory, not a
        # recovery, whatever the missing clean-shutdown marker would otherwise mean.
        self.is_new = not set(os.listdir(self.path)) - {LOCK_FILE}
        self._lock_fd = os.open(os.path.join(self.path, LOCK_FILE), os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self._lock_fd)
            raise LogDirLockedError(f"log directory {self.path} is in use by another process") from None
        try:
            self.had_clean_shutdown = self._consume_clean_shutdown_marker()
        except BaseException:
            self.release()
            raise
        if load:
            self.load()

    def load(self) -> None:
        """Load every partition; on failure release what was opened and the lock (the directory stays as it was)."""
        try:
            self._load_logs()
        except BaseException:
            self.release()
            raise

    def release(self) -> None:
        """Close what was opened and let go of the lock, so that a retry in this process can take it."""
        for log in self.logs.values():
            for seg in log.segments:
                seg.close_handles()
        if self._lock_fd >= 0:
            os.close(self._lock_fd)
            self._lock_fd = -1

    def _consume_clean_shutdown_marker(self) -> bool:
        """Delete the marker before loading, so that a crash during loading counts as unclean (KAFKA-10471)."""
        marker = os.path.join(self.path, CLEAN_SHUTDOWN_FILE)
        if not os.path.exists(marker):
            return False
        os.unlink(marker)
        fsync_dir(self.path)
        return True

    def _read_checkpoint(self, name: str) -> dict[TopicPartition, int]:
        try:
            return read_offsets(os.path.join(self.path, name))
        except (CheckpointError, OSError, UnicodeDecodeError) as e:
            logger.warning("error reading %s in %s, using an empty map: %s", name, self.path, e)
            return {}

    def _load_logs(self) -> None:
        recovery_points = self._read_checkpoint(RECOVERY_POINT_CHECKPOINT)
        start_offsets = self._read_checkpoint(LOG_START_OFFSET_CHECKPOINT)
        high_watermarks = self._read_checkpoint(REPLICATION_OFFSET_CHECKPOINT)
        for name in sorted(os.listdir(self.path)):
            full = os.path.join(self.path, name)
            if not os.path.isdir(full):
                continue
            if name.endswith(DELETE_DIR_SUFFIX):
                logger.info("removing %s, a partition deleted before the last shutdown", full)
                shutil.rmtree(full, ignore_errors=True)
                continue
            if parse_move_dir(name) is not None:
                continue  # a log-dir move's: recovered and resumed by LogDirs (future_replica.recover_moves)
            try:
                tp = TopicPartition.parse_dir_name(name)
            except ValueError as e:
                logger.warning("skipping %s in %s: %s", name, self.path, e)
                continue
            log = Log(
                full,
                self.config_for(tp.topic),
                recovery_point=recovery_points.get(tp, 0),
                log_start_offset=start_offsets.get(tp, 0),
                had_clean_shutdown=self.had_clean_shutdown,
                clock=self.clock,
                producer_id_expiration_ms=self.producer_id_expiration_ms,
                space=self.space,
            )
            if tp in high_watermarks:
                log.set_high_watermark_on_load(high_watermarks[tp])
            if log.bytes_truncated_on_load:
                logger.warning("%s: recovery truncated %s; log end offset is now %d",
                               tp, plural(log.bytes_truncated_on_load, "byte"), log.log_end_offset)
            self.logs[tp] = log

    def get_or_create(self, tp: TopicPartition, topic_id: str | None = None, config=None) -> Log:
        """The partition's log, created empty (with `partition.metadata`) if it does not exist.

        `config`: the topic's, when the caller has it before `config_for` does (a topic being created);
        the first segment keeps the index settings it is created with.
        """
        with self.lock:
            if tp in self.logs:
                return self.logs[tp]
            directory = os.path.join(self.path, str(tp))
            existed = os.path.exists(directory)
            log = None
            try:
                config = config if config is not None else self.config_for(tp.topic)
                log = Log(directory, config, clock=self.clock,
                          producer_id_expiration_ms=self.producer_id_expiration_ms, space=self.space)
                atomic_write(os.path.join(directory, PARTITION_METADATA),
                             encode_partition_metadata(topic_id or new_topic_id()))
                fsync_dir(self.path)
            except BaseException:
                if not existed:  # a partition that failed to come into being (e.g. out of descriptors) leaves nothing
                    for seg in log.segments if log is not None else ():
                        seg.close_handles()
                    shutil.rmtree(directory, ignore_errors=True)
                raise
            self.logs[tp] = log
            return log

    @property
    def paths(self) -> list[str]:
        """The dirs' paths, as `LogDirs.paths`: one."""
        return [self.path]

    @property
    def spaces(self) -> list[DirSpace]:
        """The dirs' free space, as `LogDirs.spaces`: one."""
        return [self.space]

    def dir_of(self, tp: TopicPartition) -> str | None:
        return self.path if tp in self.logs else None

    def open_log(self, tp: TopicPartition, *, recovery_point: int, log_start_offset: int) -> Log:
        """Open a partition directory that came into this dir whole (a log-dir move's swap) and serve it.

        Its files are final and flushed, so it loads as after a clean shutdown.
        """
        with self.lock:
            log = Log(os.path.join(self.path, str(tp)), self.config_for(tp.topic), recovery_point=recovery_point,
                      log_start_offset=log_start_offset, had_clean_shutdown=True, clock=self.clock,
                      producer_id_expiration_ms=self.producer_id_expiration_ms, space=self.space)
            self.logs[tp] = log
            return log

    def topic_id(self, tp: TopicPartition) -> str | None:
        path = os.path.join(self.path, str(tp), PARTITION_METADATA)
        if not os.path.exists(path):
            return None
        with open(path, "rb") as f:
            return parse_partition_metadata(f.read(), path)

    def delete(self, tp: TopicPartition) -> None:
        """Kafka's async delete: rename to `delete_dir_name(tp)` now, remove the files afterwards."""
        with self.lock:
            log = self.logs.pop(tp)
            log.close()
            doomed = os.path.join(self.path, delete_dir_name(tp))
            os.replace(log.dir, doomed)
            fsync_dir(self.path)
            try:
                self.checkpoint()
            except OSError as e:  # a full disk: deleting is how space comes back, so delete first, then retry
                logger.warning("cannot write the checkpoints before removing %s (%s); removing it first", doomed, e)
                shutil.rmtree(doomed, ignore_errors=True)
                self.checkpoint()
        shutil.rmtree(doomed, ignore_errors=True)

    def checkpoint(self) -> None:
        """Persist every log's recovery point, the log start offsets above their first segment, the high watermarks."""
        with self.lock:  # held while writing: two writers would share the same `.tmp` files
            write_offsets(os.path.join(self.path, RECOVERY_POINT_CHECKPOINT), self._recovery_points())
            write_offsets(os.path.join(self.path, LOG_START_OFFSET_CHECKPOINT), self._log_start_offsets())
            self._write_high_watermarks()

    def _write_high_watermarks(self) -> None:
        """`replication-offset-checkpoint`, only once some log is replicated: a single-replica directory has none."""
        path = os.path.join(self.path, REPLICATION_OFFSET_CHECKPOINT)
        high_watermarks = {tp: hw for tp, log in self.logs.items()
                           if (hw := log.checkpointed_high_watermark) is not None}
        if high_watermarks or os.path.exists(path):
            write_offsets(path, high_watermarks)

    def _recovery_points(self) -> dict[TopicPartition, int]:
        return {tp: log.recovery_point for tp, log in self.logs.items()}

    def _log_start_offsets(self) -> dict[TopicPartition, int]:
        return {tp: log.log_start_offset for tp, log in self.logs.items()
                if log.log_start_offset > log.segments[0].base_offset}

    def close(self) -> bool:
        """Clean shutdown: flush and trim every log, write the checkpoints, then the clean-shutdown marker.

        Returns True if the shutdown was clean: the marker is written, and it is honest, only when every
        log is flushed and trimmed and its producers can be rebuilt (`Log.close`). On a full disk the
        checkpoints may not fit: a clean start does not need the recovery points (it takes each log's end
        as its recovery point, as Kafka does), so their loss costs nothing; log start offsets it does
        need, independently of the marker, so failing to write changed ones makes the shutdown unclean
        (records below them would be readable again). The marker is Kafka's JSON, or, when no block
        is left for it, the empty file Kafka wrote before 3.7, which needs no data block.
        """
        with self.lock:
            clean = True
            for tp, log in self.logs.items():
                try:
                    if not log.close():
                        logger.error("%s: its producers are in no snapshot, so the next start must recover", tp)
                        clean = False
                except (OSError, LogError) as e:
                    logger.error("%s: not closed cleanly (%s): %s", tp, log.dir, e)
                    clean = False
            try:
                write_offsets(os.path.join(self.path, RECOVERY_POINT_CHECKPOINT), self._recovery_points())
            except OSError as e:
                logger.warning("cannot write %s in %s (%s); %s", RECOVERY_POINT_CHECKPOINT, self.path, e,
                               "a clean start does not read it" if clean else "the next start recovers more")
            try:
                self._write_high_watermarks()
            except OSError as e:  # the leader's high watermark is re-learnt from the followers, a follower's from it
                logger.warning("cannot write %s in %s (%s); the high watermarks start lower", REPLICATION_OFFSET_CHECKPOINT,
                               self.path, e)
            starts = self._log_start_offsets()
            path = os.path.join(self.path, LOG_START_OFFSET_CHECKPOINT)
            try:
                write_offsets(path, starts)
            except OSError as e:
                if self._read_checkpoint(LOG_START_OFFSET_CHECKPOINT) == starts:
                    logger.warning("cannot write %s (%s); the file holds these offsets already", path, e)
                else:
                    logger.error("cannot write %s (%s): the log start offsets %s are lost, records below them "
                                 "will be readable again", path, e, {str(tp): o for tp, o in starts.items()})
                    clean = False
            if clean:
                clean = self._write_clean_shutdown_marker()
            os.close(self._lock_fd)
            self._lock_fd = -1
            return clean

    def _write_clean_shutdown_marker(self) -> bool:
        marker = os.path.join(self.path, CLEAN_SHUTDOWN_FILE)
        try:
            atomic_write(marker, json.dumps({"version": 0, "brokerEpoch": -1}, separators=(",", ":")).encode())
            return True
        except OSError as e:
            logger.warning("cannot write the clean-shutdown marker %s (%s); writing it empty", marker, e)
        try:
            create_empty(marker)
            return True
        except OSError as e:
            logger.error("cannot create the clean-shutdown marker %s (%s): the next start recovers", marker, e)
            return False
