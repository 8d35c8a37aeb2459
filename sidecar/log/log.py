"""A partition log: ordered segments, offsets assigned on append, reads, lookups, rolls, flushes, truncation.

This is Kafka's UnifiedLog/LocalLog for one replica. The log rewrites only each
batch's base offset on append (outside the CRC), so a producer's bytes reach the
disk unchanged; reads return byte ranges of segment files, ready for sendfile.
"""

from __future__ import annotations

import bisect
import errno
import functools
import logging
import os
import random
import struct
import threading
import time
from dataclasses import dataclass
from typing import Callable, NamedTuple

import crc32c

from ..plural import plural
from .append_state import AppendLimits, EpochCacheAppendState, IndexAppendState, LogAppendState, SegmentAppendState
from .atomic_file import fsync_dir
from .checkpoint import LEADER_EPOCH_CHECKPOINT, CheckpointError, EpochEntry
from .errors import (
    CorruptIndexError,
    CorruptRecordError,
    InvalidRecordError,
    InvalidTimestampError,
    KafkaStorageError,
    OffsetOutOfRangeError,
    RecordTooLargeError,
    TornSegmentError,
)
from .free_space import DirSpace
from .leader_epoch_cache import BatchEpochs, LeaderEpochCache, recovered, truncated_from_end, truncated_from_start
from .loader import load
from .open_files import SEGMENT_FILES
from .producer_state import (
    DEFAULT_PRODUCER_ID_EXPIRATION_MS,
    BatchMetadata,
    CompletedTxn,
    ProducerBatch,
    ProducerStateManager,
)
from .records import (
    BATCH_OVERHEAD,
    LOG_OVERHEAD,
    TIMESTAMP_TYPE_BIT,
    BatchHeader,
    check_batch,
    check_records,
    compute_crc,
    set_base_offset,
    timestamp_bounds,
)
from .segment import CLEANED_SUFFIX, DELETED_SUFFIX, INDEX_SUFFIXES, LOG_SUFFIX, SWAP_SUFFIX, LogSegment, LogSlice
from .topic_partition import TopicPartition
from .transaction_index import AbortedTxn

try:  # a leader's common append in one C call (_append_kernel.c); Log._assign's Python otherwise
    from ._append_kernel import append_produced as _append_produced
    from ._append_kernel import declare_state
    from ._append_kernel import prepare_produce as _prepare_produce
except ImportError:  # pragma: no cover - a checkout without the compiled extension
    _append_produced = _prepare_produce = None
else:  # the slots it reads and writes (append_state.py): a field it names that is not declared fails here
    declare_state(LogAppendState, SegmentAppendState, IndexAppendState, EpochCacheAppendState, AppendLimits)

logger = logging.getLogger(__name__)

EARLIEST_TIMESTAMP = -2
LATEST_TIMESTAMP = -1
MAX_TIMESTAMP = -3


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def append_in_c_call() -> Callable[[Log, bytes | bytearray | memoryview, bool], tuple | None] | None:
    """`Log.append_in_c`'s C call without its Python frame, `(log, data, one_batch) -> AppendInfo's fields or None`,
    for a caller in C (the native Produce path); None without the compiled extension."""
    if _append_produced is None:
        return None
    return functools.partial(_append_produced, SEGMENT_FILES, crc32c.crc32c, now_ms)


@dataclass(slots=True)
class AppendInfo:
    """What an append did: the offsets it assigned and the timestamps the log saw.

    Not frozen: a frozen dataclass's `__init__` sets each field through `object.__setattr__`, and every
    produced batch makes one of these (the one-record Produce path, issue 18).

    `duplicate`: the append was a producer's retry of batches already in the log; nothing was
    written and the offsets (and timestamp) are those of the original append.
    """

    first_offset: int
    last_offset: int
    max_timestamp: int
    offset_of_max_timestamp: int
    log_append_time: int  # -1 unless the topic uses LogAppendTime
    batches: int
    size: int
    duplicate: bool = False


@dataclass(frozen=True, slots=True)
class StorageFailure:
    """The last write of a log that the filesystem refused, kept until a write succeeds (/status, metrics).

    Kafka takes the whole log directory offline on such an error (and stops a broker with no other
    directory); here the failed write is undone, the client gets KAFKA_STORAGE_ERROR, and every
    later write is tried again, so the log takes appends once space is freed. Only a failed write
    that could not be undone (`appends_stopped`) stops appends to the log until a restart.
    """

    errno: int | None
    reason: str
    since_ms: int
    failures: int  # failed writes since the last one that succeeded
    appends_stopped: bool = False  # a failed write could not be undone: no appends until a restart


@dataclass(slots=True)
class _ParsedSet:
    headers: list[tuple[int, BatchHeader]]  # (position in the set, header)
    size: int


class _Assigned(NamedTuple):
    """What `Log._assign` made of an append's bytes: what to write, where, and what the log's state learns."""

    buf: bytes | bytearray | memoryview
    first_offset: int
    last_offset: int
    max_timestamp: int
    max_timestamp_offset: int
    batches: int
    producer_batches: list[ProducerBatch]
    epochs: list[EpochEntry]


_BATCH_LENGTH = struct.Struct(">i")  # a batch's length field, at byte 8


def parse_batch_set(data: bytes | bytearray | memoryview, where: str) -> _ParsedSet:
    """Split a produce payload into whole, valid batches; anything else is corrupt and nothing is appended."""
    headers: list[tuple[int, BatchHeader]] = []
    pos = 0
    view = memoryview(data)
    end = len(view)
    while pos < end:
        if end - pos < LOG_OVERHEAD:
            raise CorruptRecordError(f"truncated batch header at byte {pos} of the append ({where})")
        size = LOG_OVERHEAD + _BATCH_LENGTH.unpack_from(view, pos + 8)[0]
        if size < BATCH_OVERHEAD or pos + size > end:
            raise CorruptRecordError(
                f"batch at byte {pos} of the append declares {size} bytes, {end - pos} present ({where})"
            )
        try:  # one batch filling the append (every Produce v3+) is checked without a second view
            headers.append((pos, check_batch(view if size == end else view[pos : pos + size])))
        except CorruptRecordError as e:  # the where is formatted only for a refused batch
            raise CorruptRecordError(f"{e} ({where}, byte {pos} of the append)") from None
        pos += size
    if not headers:
        raise CorruptRecordError(f"append with no record batch ({where})")
    return _ParsedSet(headers, pos)


class Log(LogAppendState):
    """One partition's log in one directory (the fields the C append reads and writes declared in append_state.py)."""

    def __init__(
        self,
        directory: str,
        config,
        *,
        recovery_point: int = 0,
        log_start_offset: int = 0,
        had_clean_shutdown: bool = True,
        clock: Callable[[], int] = now_ms,
        rng: random.Random | None = None,
        producer_id_expiration_ms: int = DEFAULT_PRODUCER_ID_EXPIRATION_MS,
        space: DirSpace | None = None,
    ) -> None:
        self.dir = directory
        # The free space of the log dir this log is in: the Produce paths ask it; the log's own appends do not.
        self.space = space
        self.name = os.path.basename(directory)
        self.config = config
        self.clock = clock
        self._rng = rng or random.Random()
        self.lock = threading.RLock()
        self.storage_failure: StorageFailure | None = None
        self._pending_deletes: list[tuple[int, LogSegment]] = []
        os.makedirs(directory, exist_ok=True)
        batch_epochs = BatchEpochs()
        result = load(
            directory,
            self._open_segment,
            recovery_point=recovery_point,
            log_start_offset=log_start_offset,
            had_clean_shutdown=had_clean_shutdown,
            max_index_size=config.segment_index_bytes,
            delete_segment=self._delete_segment_files_now,
            where=self.name,
            on_recovered_batch=batch_epochs,
        )
        self.segments: list[LogSegment] = result.segments
        self._bases = [s.base_offset for s in self.segments]
        self.log_end_offset = self.active_segment.next_offset
        self.recovery_point = result.recovery_point
        self.log_start_offset = result.log_start_offset
        self.bytes_truncated_on_load = result.bytes_truncated
        self.last_flush_ms = clock()
        self._ts_prefix: list[int] | None = None  # running max of inactive segments' largest timestamps
        self.producer_state = ProducerStateManager(directory, self.name,
                                                   producer_id_expiration_ms=producer_id_expiration_ms)
        self.producer_state.load(self.segments, log_start_offset=self.log_start_offset,
                                 log_end_offset=self.log_end_offset, now_ms=clock(),
                                 had_clean_shutdown=had_clean_shutdown)
        rebuild_from = self._first_untrusted_txn_index(result.recovered_from)
        if rebuild_from is not None:  # the recovered segments' `.txnindex` is rebuilt from their markers
            for seg in self.segments[self._floor_segment(rebuild_from):]:
                seg.txn_index.reset()
            self.producer_state.replay_transactions(
                self.segments, log_start_offset=self.log_start_offset, log_end_offset=self.log_end_offset,
                now_ms=clock(), replay_from=rebuild_from, on_completed=self._index_recovered_abort)
        self.leader_epoch_cache = self._load_leader_epochs(result.recovered_from, batch_epochs.entries)
        self._replicated = False
        # Kept while not replicated too: a checkpointed high watermark waits here for the log to become replicated.
        self._high_watermark: int | None = None

    def _load_leader_epochs(self, recovered_from: int | None, batch_epochs: list[EpochEntry]) -> LeaderEpochCache:
        """The leader-epoch cache, made to agree with the log as loaded (Kafka's LogLoader).

        After an unclean shutdown the epochs of the recovered segments (from `recovered_from`) are
        taken again from their batches, as recovery read them; an unreadable file is rebuilt from
        every batch (Kafka would take the whole log directory offline; the batches hold the same
        facts). Entries at or past the log end go, and the first epoch starts at the log start offset.
        """
        path = os.path.join(self.dir, LEADER_EPOCH_CHECKPOINT)
        try:
            cache = LeaderEpochCache(path, self.name)
        except (CheckpointError, OSError) as e:
            logger.error("%s: cannot read %s (%s); rebuilding the leader epochs from the partition leader epochs "
                         "of the batches from offset %d", self.name, path, e, self.log_start_offset)
            cache = LeaderEpochCache(path, self.name, entries=())
            cache.dirty = True  # the unreadable file is replaced even if no batch carries an epoch
            every_batch = BatchEpochs()
            for seg in self.segments:
                for b in seg.batches():
                    every_batch(b.header)
            recovered_from, batch_epochs = self.segments[0].base_offset, every_batch.entries
        entries = tuple(cache.entries)
        if recovered_from is not None:
            entries = recovered(entries, recovered_from, batch_epochs)
        cache.replace(truncated_from_start(truncated_from_end(entries, self.log_end_offset), self.log_start_offset),
                      "loading the log")
        return cache

    def _first_untrusted_txn_index(self, recovered_from: int | None) -> int | None:
        """Where the `.txnindex` files must be rebuilt from: the recovered segments, or an earlier segment whose
        file fails Kafka's sanity check (Kafka recovers such a segment at load)."""
        for seg in self.segments:
            if recovered_from is not None and seg.base_offset >= recovered_from:
                break
            problem = seg.txn_index.sanity_problem() if os.path.exists(seg.txn_index.path) else None
            if problem is not None:
                logger.warning("%s: found a corrupted transaction index %s (%s); rebuilding the transaction indexes "
                               "from offset %d", self.name, seg.txn_index.path, problem, seg.base_offset)
                return seg.base_offset
        return recovered_from

    def _index_recovered_abort(self, txn: CompletedTxn) -> None:
        if txn.is_abort:
            self.segments[self._floor_segment(txn.last_offset)].txn_index.append(txn.aborted_txn())

    # -- segments --------------------------------------------------------------------------------

    def _open_segment(self, base_offset: int, suffix: str = "", new: bool = False) -> LogSegment:
        cfg = self.config
        jitter = 0
        if cfg.segment_jitter_ms > 0:
            jitter = self._rng.randrange(2**31) % min(cfg.segment_jitter_ms, cfg.segment_ms)
        return LogSegment(
            self.dir,
            base_offset,
            index_interval_bytes=cfg.index_interval_bytes,
            max_index_size=cfg.segment_index_bytes,
            now_ms=self.clock,
            roll_jitter_ms=jitter,
            preallocate_bytes=cfg.segment_bytes if (new and cfg.preallocate) else 0,
            suffix=suffix,
            where=self.name,
        )

    @property
    def topic_partition(self) -> TopicPartition:
        return TopicPartition.parse_dir_name(self.name)

    @property
    def active_segment(self) -> LogSegment:
        return self.segments[-1]

    def _set_segments(self, segments: list[LogSegment]) -> None:
        self.segments = segments
        self._bases = [s.base_offset for s in segments]
        self._ts_prefix = None

    def _floor_segment(self, offset: int) -> int:
        """Index of the segment with the largest base offset <= `offset` (clamped to 0)."""
        return max(0, bisect.bisect_right(self._bases, offset) - 1)

    @property
    def size_in_bytes(self) -> int:
        return sum(s.size for s in self.segments)

    @property
    def config(self):
        """The topic's TopicConfig (topic_config.py, a layer above the log engine)."""
        return self._config

    @config.setter
    def config(self, config) -> None:
        """Read at every append, roll and retention check: a new config takes effect with the next; the C append
        reads its limits (`limits`), made here."""
        self._config = config
        self.limits = AppendLimits.of(config)

    @property
    def max_segment_ms(self) -> int:
        """`max.compaction.lag.ms` caps `segment.ms` on compacted topics so dirty data becomes cleanable."""
        return self.limits.max_segment_ms

    # -- append ----------------------------------------------------------------------------------

    def append(self, data: bytes | bytearray | memoryview, *, assign_offsets: bool = True,
               leader_epoch: int | None = None) -> AppendInfo:
        """Validate and append a set of v2 batches; return the offsets given to them.

        Every batch is checked (size, magic, CRC, limits, keys on compacted topics,
        timestamps, producer epochs and sequences) before a byte is written, so a bad append
        leaves the log untouched. A producer's retry of a batch already in the log writes
        nothing and returns the original offsets, with `duplicate` set.

        `leader_epoch` (a leader's append) is stamped into every batch; a follower's batches keep
        the leader's. Either way each batch's epoch, when set, goes to the leader-epoch cache at its
        base offset before the bytes go to the segment, as in Kafka.

        Only an append that rewrites header fields (offsets, epochs, LogAppendTime) copies `data` first; a
        follower's (neither) writes the caller's buffer as it is, so it must not change until this returns.
        """
        if assign_offsets and leader_epoch is None:
            info = self.append_in_c(data)
            if info is not None:
                return info
        with self.lock:
            if self.storage_failure is not None and self.storage_failure.appends_stopped:
                raise KafkaStorageError(f"{self.name} takes no appends until a restart: {self.storage_failure.reason}")
            now = self.clock()
            # Only the leader stamps LogAppendTime; a follower keeps the replicated bytes as they are.
            log_append = assign_offsets and self.config.message_timestamp_type == "LogAppendTime"
            prepared, buf = None, None
            if assign_offsets and not log_append and _prepare_produce is not None:
                # The common leader's append, checked and given its offsets by one C call (the same rules, the
                # epoch -1 of a single replica included); it declines whatever `_assign` must decide or name,
                # leaving the copy untouched.
                buf = bytearray(data)
                cfg = self.config
                lo, hi = timestamp_bounds(self._timestamp_range(now))
                prepared = _prepare_produce(buf, self.log_end_offset, -1 if leader_epoch is None else leader_epoch,
                                            cfg.segment_bytes, cfg.max_message_bytes, cfg.compact, lo, hi,
                                            crc32c.crc32c)
            if prepared is not None:
                first_offset = self.log_end_offset
                last_offset, max_ts, max_ts_offset, batches, producers = prepared
                producer_batches = [ProducerBatch(*fields, False) for fields in producers] if producers else []
                stamped = leader_epoch is not None and leader_epoch >= 0  # every batch: one entry at the first
                epochs = [EpochEntry(leader_epoch, first_offset)] if stamped else []
            else:
                buf, first_offset, last_offset, max_ts, max_ts_offset, batches, producer_batches, epochs = (
                    self._assign(data, now, assign_offsets, leader_epoch, log_append, buf))
            if not assign_offsets and first_offset < self.log_end_offset:
                raise InvalidRecordError(
                    f"out of order offsets: first offset {first_offset} is below the log end offset "
                    f"{self.log_end_offset} of {self.name}"
                )
            # Batches without a producer id (idempotence off) have no producer state to check or change.
            update = (self.producer_state.prepare(producer_batches, validate=assign_offsets) if producer_batches
                      else None)
            if update is not None and update.duplicates:
                return self._duplicate(update.duplicates, batches)
            epochs_before = self.leader_epoch_cache.entries if epochs else None
            if epochs or self.leader_epoch_cache.dirty:
                try:  # a failed write changes neither the cache nor the log
                    self.leader_epoch_cache.assign_all(epochs)
                except OSError as e:
                    raise self._storage_failed(e, f"leader epoch checkpoint before the append at offset "
                                                  f"{first_offset}") from e
            try:
                # A failure in here leaves the log as it was (the segment cuts a partial write): the producer
                # state and the log end offset move only after the bytes are in the file.
                self._maybe_roll(len(buf), max_ts, first_offset, last_offset, now)
                if update is not None:  # aborts are indexed first: a failed append takes them back below
                    for txn in update.completed:
                        if txn.is_abort:
                            self.active_segment.txn_index.append(txn.aborted_txn())
                self.active_segment.append(last_offset, max_ts, max_ts_offset, buf)  # written as it is: no second copy
            except (OSError, TornSegmentError, CorruptIndexError) as failure:
                error: Exception = failure
                if update is not None and update.completed:
                    try:
                        self.active_segment.txn_index.truncate_to(first_offset)
                    except OSError as again:
                        logger.error("%s: cannot take back the aborted transactions at offset %d from %s: %s",
                                     self.name, first_offset, self.active_segment.txn_index.path, again)
                        error = TornSegmentError(f"{self.name}: {self.active_segment.txn_index.path} keeps aborted "
                                                 f"transactions of a failed append at offset {first_offset}: {again}")
                if epochs_before is not None:
                    self.leader_epoch_cache.replace(tuple(epochs_before), f"the failed append at offset {first_offset}")
                raise self._storage_failed(error, f"append at offset {first_offset}",
                                           stop_appends=isinstance(error, TornSegmentError)) from error
            if update is not None:
                self.producer_state.apply(update)
            self.log_end_offset = last_offset + 1
            if self.storage_failure is not None:
                logger.warning("%s: appends succeed again (log end offset %d) after %s",
                               self.name, self.log_end_offset, plural(self.storage_failure.failures, "failed write"))
                self.storage_failure = None
            if self.log_end_offset - self.recovery_point >= self.config.flush_messages:
                try:
                    self.flush()
                except OSError as e:  # the append is in the log; Kafka's client sees the flush's error too
                    raise self._storage_failed(e, f"flush after the append at offset {first_offset}") from e
            return AppendInfo(first_offset, last_offset, max_ts, max_ts_offset, now if log_append else -1,
                              batches, len(buf))

    def append_in_c(self, data: bytes | bytearray | memoryview, *, one_batch: bool = False) -> AppendInfo | None:
        """A single replica's append of a produced set, made whole by one C call when nothing but the segment's bytes
        and a few counters change; None, with nothing changed, leaves it to `append`, which names every fault.

        Why: a one-record Produce costs the calls made for it (issue 18), and `append`'s Python is a dozen. The C
        call declines a roll, an index entry, a flush, producer ids, LogAppendTime, a storage failure or the lock
        held by another thread. `one_batch`: also decline a set of several batches (a Produce v3+ refuses it).
        """
        if _append_produced is None:
            return None
        done = _append_produced(SEGMENT_FILES, crc32c.crc32c, now_ms, self, data, one_batch)
        return None if done is None else AppendInfo(*done)

    def _assign(self, data: bytes | bytearray | memoryview, now: int, assign_offsets: bool, leader_epoch: int | None,
                log_append: bool, copy: bytearray | None) -> _Assigned:
        """Check `data` and make the bytes to write, in Python. What `prepare_produce` declines (control batches,
        compression, LogAppendTime, faults to name) and every follower's append come here; `copy` is a copy of
        `data` already made."""
        parsed = parse_batch_set(data, self.name)
        self._validate(data, parsed, now, assign_offsets)
        # A follower's batches are written as the leader's bytes: copying them would be a second copy per MB.
        buf = copy if copy is not None else bytearray(data) if assign_offsets or leader_epoch is not None else data
        offset = self.log_end_offset
        max_ts, max_ts_offset = -1, -1
        first_offset = offset if assign_offsets else parsed.headers[0][1].base_offset
        last_offset = -1
        producer_batches: list[ProducerBatch] = []
        epochs: list[EpochEntry] = []
        for pos, h in parsed.headers:
            if assign_offsets:
                set_base_offset(buf, offset, pos)
                base = offset
                offset += h.last_offset_delta + 1
            else:
                base = h.base_offset
            last = base + h.last_offset_delta
            if not assign_offsets and last_offset >= last:
                # Kafka's OffsetsOutOfOrderException: a follower's batches must have increasing last offsets.
                raise InvalidRecordError(
                    f"out of order offsets found in append to {self.name}: batch last offset {last} "
                    f"follows {last_offset}"
                )
            if leader_epoch is not None:
                struct.pack_into(">i", buf, pos + 12, leader_epoch)
            elif assign_offsets and h.partition_leader_epoch != -1:
                # A single replica has no leader epoch: a producer's own value (librdkafka writes 0) must not
                # read as one when an unclean recovery rebuilds the cache from the batches, or these records
                # would pass for replicated ones that a follower may truncate (docs/replication.md).
                struct.pack_into(">i", buf, pos + 12, -1)
            # A producer's own partition leader epoch means nothing to a single-replica leader.
            epoch = leader_epoch if leader_epoch is not None else -1 if assign_offsets else h.partition_leader_epoch
            if epoch >= 0:
                epochs.append(EpochEntry(epoch, base))
            batch_max_ts = h.max_timestamp
            if log_append:
                batch_max_ts = now
                # LogAppendTime changes bytes under the CRC, so (as in Kafka) the CRC is recomputed.
                struct.pack_into(">h", buf, pos + 21, h.attributes | TIMESTAMP_TYPE_BIT)
                struct.pack_into(">q", buf, pos + 35, now)
                struct.pack_into(">I", buf, pos + 17, compute_crc(memoryview(buf)[pos : pos + h.size]))
            if batch_max_ts > max_ts:
                max_ts, max_ts_offset = batch_max_ts, last
            last_offset = last
            if h.producer_id >= 0:
                pb = ProducerBatch.of(h, base, batch_max_ts, memoryview(buf)[pos : pos + h.size], self.name)
                if pb is not None:
                    producer_batches.append(pb)
        return _Assigned(buf, first_offset, last_offset, max_ts, max_ts_offset, len(parsed.headers), producer_batches,
                         epochs)

    def _storage_failed(self, exc: Exception, action: str, stop_appends: bool = False) -> KafkaStorageError:
        """Record a write the filesystem refused and make the client's error; ERROR once per episode."""
        cause = exc if isinstance(exc, OSError) else exc.__cause__
        code = getattr(cause, "errno", None)
        name = f" ({errno.errorcode.get(code, code)})" if code else ""
        reason = f"{action} to {self.name} in {self.dir} failed{name}: {exc}"
        last = self.storage_failure
        self.storage_failure = StorageFailure(code, reason, last.since_ms if last else self.clock(),
                                              (last.failures if last else 0) + 1, stop_appends)
        if last is None or stop_appends:
            logger.error("%s: %s%s", self.name, reason,
                         "; the log takes no appends until a restart" if stop_appends else
                         "; the log is unchanged and takes the next append that the filesystem allows")
        return KafkaStorageError(reason)

    def _duplicate(self, duplicates: list[BatchMetadata], batches: int) -> AppendInfo:
        """The answer to a retry: the original batches' offsets; nothing is written."""
        if len(duplicates) != batches:
            # Kafka takes one batch per produce request, so it never meets this; refusing beats dropping the new part.
            raise InvalidRecordError(
                f"append to {self.name} mixes {len(duplicates)} retried batch(es) (first at offset "
                f"{duplicates[0].first_offset}) with {batches - len(duplicates)} new one(s)"
            )
        first, last = duplicates[0], duplicates[-1]
        # Kafka answers with the stored batch timestamp as log append time even on CreateTime topics; here the
        # retry gets what the original append returned (-1 unless the topic uses LogAppendTime).
        log_append_time = last.timestamp if self.config.message_timestamp_type == "LogAppendTime" else -1
        return AppendInfo(first.first_offset, last.last_offset, last.timestamp, last.last_offset, log_append_time,
                          0, 0, duplicate=True)

    def _validate(self, data: bytes | bytearray | memoryview, parsed: _ParsedSet, now: int,
                  assign_offsets: bool) -> None:
        cfg = self.config
        if parsed.size > cfg.segment_bytes:
            raise RecordTooLargeError(
                f"the append of {parsed.size} bytes to {self.name} is larger than segment.bytes ({cfg.segment_bytes})"
            )
        ts_range = self._timestamp_range(now)
        if not assign_offsets:
            # A follower appends what the leader accepted: Kafka runs no LogValidator and passes
            # ignoreRecordSize=true (appendAsFollower), so keys, timestamps and sizes are not rechecked.
            return
        view = memoryview(data)
        at = f"{self.name} offset {self.log_end_offset}"
        compact = cfg.compact
        for pos, h in parsed.headers:
            size = h.size
            if size > cfg.max_message_bytes:
                raise RecordTooLargeError(
                    f"the batch of {size} bytes for {at} is larger than max.message.bytes ({cfg.max_message_bytes})"
                )
            if h.records_count != h.last_offset_delta + 1:
                raise InvalidRecordError(
                    f"batch for {at} has {h.records_count} records but an offset range of {h.last_offset_delta + 1}"
                )
            if h.attributes & TIMESTAMP_TYPE_BIT:  # LogAppendTime
                raise InvalidTimestampError(f"a producer may not send a LogAppendTime batch ({at})")
            control = h.is_control
            check_records(h, view[pos + BATCH_OVERHEAD : pos + size], at, require_key=compact and not control,
                          timestamp_range=None if control else ts_range)

    def _timestamp_range(self, now: int) -> tuple[int, int] | None:
        """The CreateTime window, None when both bounds are left unlimited (Long.MAX_VALUE, the default)."""
        cfg = self.config
        if cfg.message_timestamp_type != "CreateTime" or min(cfg.message_timestamp_before_max_ms,
                                                                cfg.message_timestamp_after_max_ms) >= 2**63 - 1:
            return None
        return now - cfg.message_timestamp_before_max_ms, now + cfg.message_timestamp_after_max_ms

    def _maybe_roll(self, size: int, max_ts: int, first_offset: int, last_offset: int, now: int) -> None:
        seg = self.active_segment
        if seg.should_roll(max_segment_bytes=self.config.segment_bytes, max_segment_ms=self.max_segment_ms,
                           messages_size=size, max_timestamp=max_ts, max_offset=last_offset, now_ms=now):
            self.roll(max(first_offset, self.log_end_offset))

    def roll(self, new_base: int | None = None) -> LogSegment:
        """Close the active segment for writes and start a new one at `new_base` (default: the log end)."""
        with self.lock:
            new_base = self.log_end_offset if new_base is None else max(new_base, self.log_end_offset)
            old = self.active_segment
            replaced = old.base_offset == new_base
            if replaced:
                if old.size != 0:
                    raise InvalidRecordError(f"trying to roll {self.name} to {new_base}, where a non-empty segment exists")
                # KAFKA-6388: an empty active segment at that base is replaced.
                self._delete_segment_files_now(old)
                segments = self.segments[:-1]
            else:
                old.on_become_inactive()
                segments = list(self.segments)
            for stale in (f"{new_base:020d}{suffix}" for suffix in (LOG_SUFFIX, *INDEX_SUFFIXES)):
                path = os.path.join(self.dir, stale)
                if os.path.exists(path):
                    logger.warning("%s: deleting stale file %s before rolling to offset %d", self.name, stale, new_base)
                    os.unlink(path)
            segments.append(self._open_segment(new_base, new=True))
            self._set_segments(segments)
            # Named by the new base offset, so recovery can start from the snapshot and scan only this segment.
            self.producer_state.take_snapshot(new_base)
            # Kafka flushes asynchronously; the recovery point becomes the new base, also when an empty
            # active segment was replaced (UnifiedLog.roll schedules flushUptoOffsetExclusive either way).
            self.flush(new_base)
            return self.active_segment

    # -- flush -----------------------------------------------------------------------------------

    def flush(self, offset: int | None = None) -> None:
        """fsync every segment holding offsets in [recovery point, offset) and move the recovery point there."""
        with self.lock:
            offset = self.log_end_offset if offset is None else offset
            if offset <= self.recovery_point and offset != self.log_end_offset:
                return
            for seg in self.segments[self._floor_segment(self.recovery_point) :]:
                if seg.base_offset >= offset and seg is not self.active_segment:
                    break
                seg.flush()
            fsync_dir(self.dir)
            self.recovery_point = max(self.recovery_point, offset)
            self.last_flush_ms = self.clock()

    def maybe_flush(self) -> bool:
        """Flush if `flush.ms` has passed since the last flush; the maintenance scheduler calls this."""
        if self.clock() - self.last_flush_ms >= self.config.flush_ms and self.recovery_point < self.log_end_offset:
            self.flush()
            return True
        return False

    # -- reads -----------------------------------------------------------------------------------

    def read(self, offset: int, max_bytes: int, *, max_offset: int | None = None,
             min_one_message: bool = True) -> LogSlice | None:
        """Bytes to send for a fetch at `offset`, from one segment; None at the log end.

        `max_offset` (exclusive, e.g. the high watermark) bounds what is returned.
        """
        with self.lock:
            if offset < self.log_start_offset or offset > self.log_end_offset:
                raise OffsetOutOfRangeError(
                    f"offset {offset} is out of range for {self.name}: log start offset {self.log_start_offset}, "
                    f"log end offset {self.log_end_offset}"
                )
            limit = self.log_end_offset if max_offset is None else min(max_offset, self.log_end_offset)
            if offset >= limit:
                return None
            i = self._floor_segment(offset)
            while i < len(self.segments):
                seg = self.segments[i]
                max_position = None
                bound = self._position_of(limit)
                if bound is not None and bound[0] is seg:
                    max_position = bound[1]
                found = seg.read(offset, max_bytes, max_position, min_one_message)
                if found is not None:
                    return found
                i += 1
            return None

    def _position_of(self, offset: int) -> tuple[LogSegment, int] | None:
        """Segment and byte position where the batch holding `offset` starts (None at the log end)."""
        if offset >= self.log_end_offset:
            return None
        seg = self.segments[self._floor_segment(offset)]
        found = seg.translate_offset(offset)
        return (seg, found.position) if found else None

    def offset_for_timestamp(self, timestamp: int) -> tuple[int, int] | None:
        """Kafka's ListOffsets lookup: (offset, timestamp) of the first record at or after `timestamp`.

        Special targets: -2 earliest, -1 latest, -3 the record with the largest timestamp.
        The segment is found by binary search over the running maximum of the
        segments' largest timestamps, so the cost does not grow with the segment count.
        """
        with self.lock:
            if timestamp == EARLIEST_TIMESTAMP:
                return self.log_start_offset, -1
            if timestamp == LATEST_TIMESTAMP:
                return self.log_end_offset, -1
            if timestamp == MAX_TIMESTAMP:
                best = max(self.segments, key=lambda s: s.max_timestamp_and_offset[0])
                ts, off = best.max_timestamp_and_offset
                return (off, ts) if ts >= 0 else None
            # The first segment whose running maximum reaches the target; past the inactive ones, the active one.
            seg = self.segments[bisect.bisect_left(self._timestamp_prefix(), timestamp)]
            if seg.largest_timestamp < timestamp:
                return None
            return seg.find_offset_by_timestamp(timestamp, self.log_start_offset)

    def _timestamp_prefix(self) -> list[int]:
        if self._ts_prefix is None:
            running = -(2**63)
            prefix = []
            for seg in self.segments[:-1]:
                running = max(running, seg.largest_timestamp)
                prefix.append(running)
            self._ts_prefix = prefix
        return self._ts_prefix

    # -- truncation and start offset -------------------------------------------------------------

    def truncate_to(self, offset: int) -> None:
        """Remove everything at and above `offset` (a replica following a new leader does this).

        The epochs starting there go too, also when no data does: an epoch this replica began as
        leader but never wrote in (Kafka's truncateTo). The high watermark comes down to the new end.
        """
        with self.lock:
            if offset < 0:
                raise OffsetOutOfRangeError(f"cannot truncate {self.name} to a negative offset ({offset})")
            if offset >= self.log_end_offset:
                self.leader_epoch_cache.truncate_from_end(self.log_end_offset)
                return
            if offset < self.segments[0].base_offset:
                self.truncate_fully_and_start_at(offset)
                return
            keep = [s for s in self.segments if s.base_offset <= offset]
            for seg in self.segments[len(keep) :]:
                self._delete_segment(seg)
            keep[-1].truncate_to(offset)
            self._set_segments(keep)
            self.log_end_offset = self.active_segment.next_offset
            self.recovery_point = min(self.recovery_point, self.log_end_offset)
            self.log_start_offset = min(self.log_start_offset, self.log_end_offset)
            self.leader_epoch_cache.truncate_from_end(offset)
            self._clamp_high_watermark()
            self.producer_state.truncate_to(self.segments, log_start_offset=self.log_start_offset,
                                            log_end_offset=self.log_end_offset, now_ms=self.clock())

    def truncate_fully_and_start_at(self, offset: int) -> None:
        """Drop every segment and start an empty log at `offset`, with no epochs and the high watermark there."""
        with self.lock:
            for seg in self.segments:
                self._delete_segment(seg)
            self._set_segments([self._open_segment(offset, new=True)])
            self.producer_state.truncate_fully_and_start_at(offset)
            self.leader_epoch_cache.clear()
            self.log_end_offset = offset
            self.recovery_point = offset
            self.log_start_offset = offset
            self._clamp_high_watermark()

    def increment_log_start_offset(self, offset: int) -> None:
        """Raise the log start offset (DeleteRecords, retention); reads below it then fail.

        Only committed data may go: not past the high watermark (Kafka's rule; the log end when not
        replicated). The first leader epoch then starts at the new log start.
        """
        with self.lock:
            if offset > self.high_watermark:
                raise OffsetOutOfRangeError(
                    f"cannot raise the log start offset of {self.name} to {offset} above the high watermark "
                    f"{self.high_watermark} (log end offset {self.log_end_offset})"
                )
            if offset > self.log_start_offset:
                self.log_start_offset = offset
                self.leader_epoch_cache.truncate_from_start(offset)
                self._clamp_high_watermark()

    # -- deletion --------------------------------------------------------------------------------

    @property
    def last_stable_offset(self) -> int:
        """Kafka's LSO: the first offset of the earliest transaction that is open or whose marker the high watermark
        has not passed, or the high watermark. read_committed readers and the cleaner stop here."""
        with self.lock:
            hw = self.high_watermark
            unstable = self.producer_state.first_unstable_offset(hw)
            return hw if unstable is None else min(hw, unstable)

    def collect_aborted_transactions(self, fetch_offset: int, upper_bound: int) -> list[AbortedTxn]:
        """Kafka's collectAbortedTransactions: the aborted transactions that overlap [fetch_offset, upper_bound),
        from the `.txnindex` of the segment holding `fetch_offset` on, until one says no later one can."""
        with self.lock:
            found: list[AbortedTxn] = []
            for seg in self.segments[self._floor_segment(fetch_offset):]:
                search = seg.txn_index.collect(fetch_offset, upper_bound)
                found += search.aborted
                if search.complete:
                    break
            return found

    def fetch_upper_bound(self, found: LogSlice) -> int:
        """An offset at or past the end of a read slice, to bound its aborted transactions (Kafka's: the first
        offset index entry past the slice, else the next segment's base, else the log end)."""
        with self.lock:
            entry = found.segment.offset_index.fetch_upper_bound(found.position, found.size)
            if entry is not None:
                return entry[0]
            i = self._floor_segment(found.segment.base_offset) + 1
            return self.segments[i].base_offset if i < len(self.segments) else self.log_end_offset

    def remove_expired_producers(self, now: int) -> int:
        """Forget producers idle for `producer.id.expiration.ms`; the maintenance scheduler calls this."""
        with self.lock:
            return self.producer_state.remove_expired_producers(now)

    # -- replication: leader epochs and the high watermark ----------------------------------------

    @property
    def latest_epoch(self) -> int | None:
        """The epoch of the last leader that wrote (or began to lead) this log; None if none is known."""
        return self.leader_epoch_cache.latest_epoch

    def end_offset_for_epoch(self, epoch: int) -> tuple[int, int]:
        """Kafka's endOffsetForEpoch: (largest epoch <= `epoch`, its end offset); (-1, -1) when undefined."""
        with self.lock:
            return self.leader_epoch_cache.end_offset_for(epoch, self.log_end_offset)

    @property
    def replicated(self) -> bool:
        """Whether other replicas exist: only then does the high watermark lag the log end offset."""
        return self._replicated

    @replicated.setter
    def replicated(self, value: bool) -> None:
        """Becoming replicated starts from the checkpointed high watermark, else the log start (Kafka's 0, clamped)."""
        with self.lock:
            if value and not self._replicated:
                self._high_watermark = self.log_start_offset if self._high_watermark is None else self._high_watermark
                self._clamp_high_watermark()
            elif not value:
                self._high_watermark = None
            self._replicated = value

    @property
    def high_watermark(self) -> int:
        """The end of the committed data; with one replica everything appended is committed: the log end offset."""
        hw = self._high_watermark
        return hw if self._replicated and hw is not None else self.log_end_offset

    @property
    def checkpointed_high_watermark(self) -> int | None:
        """What `replication-offset-checkpoint` keeps: a replicated log's high watermark, or one loaded and not yet used."""
        return self._high_watermark

    def update_high_watermark(self, offset: int) -> bool:
        """Raise a replicated log's high watermark to `offset`, clamped to [log start, log end]; True if it rose.

        It never goes back here (Kafka's maybeIncrementHighWatermark / maybeUpdateHighWatermark);
        only a truncation below it lowers it. A log that is not replicated has nothing to raise.
        """
        with self.lock:
            if not self._replicated or self._high_watermark is None:
                return False
            new = min(max(offset, self.log_start_offset), self.log_end_offset)
            if new <= self._high_watermark:
                return False
            self._high_watermark = new
            return True

    def set_high_watermark_on_load(self, offset: int) -> None:
        """Set the high watermark from `replication-offset-checkpoint`, clamped to [log start, log end]."""
        with self.lock:
            self._high_watermark = offset
            self._clamp_high_watermark()

    def _clamp_high_watermark(self) -> None:
        if self._high_watermark is not None:
            self._high_watermark = min(max(self._high_watermark, self.log_start_offset), self.log_end_offset)

    def delete_segments(self, doomed: list[LogSegment], reason: str) -> int:
        """Delete whole segments from the front of the log (retention), raising the log start offset past them.

        If the active segment is among them, a new empty one is rolled first, as Kafka does, so the
        log always has an active segment; an empty active segment itself is never deleted.
        """
        with self.lock:
            live = {id(s) for s in self.segments}
            doomed = [s for s in doomed if id(s) in live]
            if not doomed:
                return 0
            if doomed[-1] is self.active_segment:
                if self.active_segment.size == 0:
                    doomed = doomed[:-1]
                else:
                    self.roll()
            keep = [s for s in self.segments if all(s is not d for d in doomed)]
            self.increment_log_start_offset(keep[0].base_offset)
            self._set_segments(keep)
            self.producer_state.delete_snapshots_below(keep[0].base_offset)  # snapshots go with their segments
            for seg in doomed:
                logger.info("%s: deleting segment %d (%s)", self.name, seg.base_offset, reason)
                self._delete_segment(seg)
            return len(doomed)

    def create_cleaned_segment(self, base_offset: int) -> LogSegment:
        """A fresh `<base>.log.cleaned` segment (leftovers of an aborted pass are removed first)."""
        for name in os.listdir(self.dir):
            if name.startswith(f"{base_offset:020d}.") and name.endswith(CLEANED_SUFFIX):
                os.unlink(os.path.join(self.dir, name))
        return self._open_segment(base_offset, CLEANED_SUFFIX, new=True)

    def replace_segments(self, new: list[LogSegment], old: list[LogSegment]) -> None:
        """Swap cleaned segments in for the ones they replace, crash-safely (Kafka's replaceSegments).

        `.cleaned` → `.swap` (newest first), old → `.deleted`, `.swap` → final name, fsync the
        directory. A crash at any step leaves, after the loader runs, the old log or the new one.
        """
        with self.lock:
            for seg in sorted(new, key=lambda s: s.base_offset, reverse=True):
                seg.change_suffix(seg.suffix, SWAP_SUFFIX)
            fsync_dir(self.dir)
            live = {id(s) for s in self.segments}
            old_live = [s for s in old if id(s) in live]  # retention may have removed some meanwhile
            kept = [s for s in self.segments if all(s is not o for o in old_live)]
            for seg in old_live:
                self._delete_segment(seg)
            for seg in new:
                seg.change_suffix(SWAP_SUFFIX, "")
            fsync_dir(self.dir)
            self._set_segments(sorted(kept + list(new), key=lambda s: s.base_offset))
            self.producer_state.delete_snapshots({s.base_offset for s in old_live} - {s.base_offset for s in new})

    def _delete_segment(self, seg: LogSegment) -> None:
        """Rename to `.deleted` now; the files (and descriptors) go after `file.delete.delay.ms` so in-flight reads finish."""
        seg.change_suffix(seg.suffix, DELETED_SUFFIX)
        self._pending_deletes.append((self.clock() + self.config.file_delete_delay_ms, seg))

    def _delete_segment_files_now(self, seg: LogSegment) -> None:
        seg.delete_files()

    def delete_expired_files(self) -> int:
        """Physically delete `.deleted` segments whose delay has passed; return how many."""
        with self.lock:
            now = self.clock()
            due = [s for t, s in self._pending_deletes if t <= now]
            self._pending_deletes = [(t, s) for t, s in self._pending_deletes if t > now]
        for seg in due:
            seg.delete_files()
        return len(due)

    # -- lifecycle -------------------------------------------------------------------------------

    def close(self) -> bool:
        """Flush through the log end and trim every file; True if a clean start may trust what is on disk.

        The data must be flushed and every file trimmed (an untrimmed index would be read as full of
        zero entries), or this raises. The producer snapshot at the log end comes last, after trimming
        and deleting have given blocks back; if the disk is still too full for it, a clean start can
        still rebuild the producers from an older snapshot and the batches after it, but not from
        nothing: without any snapshot of the producers this returns False (the next start must recover).
        """
        with self.lock:
            self.flush()
            try:
                self.leader_epoch_cache.flush()
            except OSError as e:  # stale entries past the log end or before its start are cut again at load
                logger.warning("%s: cannot write %s: %s", self.name, self.leader_epoch_cache.path, e)
            for seg in self.segments:
                seg.close()
            for _, seg in self._pending_deletes:
                seg.delete_files()
            self._pending_deletes = []
            try:
                self.producer_state.take_snapshot(self.log_end_offset)
            except OSError as e:
                older = self.producer_state.snapshot_offsets  # take_snapshot writes nothing with neither
                logger.warning("%s: cannot write the producer snapshot at offset %d in %s: %s; %s", self.name,
                               self.log_end_offset, self.dir, e,
                               f"the snapshot at offset {older[-1]} and the log after it hold them"
                               if older else "no other snapshot holds the producers")
                return bool(older)
            return True

    def __repr__(self) -> str:
        return f"Log({self.name}, start={self.log_start_offset}, end={self.log_end_offset}, segments={len(self.segments)})"
