"""Which partition the cleaner works on, and each partition's cleaning state (Kafka's LogCleanerManager).

States, each with the time it was entered: idle, in progress, aborted, paused(n)
and uncleanable, with the reason, when a pass failed. A pause belongs to a named owner
(`pause_owners.py`): n is the number of owners, a resume releases only its owner's pause,
and the owners that outlive a restart are kept in `cleaner-pauses.json` and checked at
load — the lesson of KAFKA-9087 and its relatives, whose anonymous count leaked
(docs/moves.md). Uncleanable partitions are skipped by cleaning and by compacted-topic
retention, and reported, never retried in a loop. The first dirty offset of each
partition lives in `cleaner-offset-checkpoint` of the log dir holding it, in Kafka's format.
"""

from __future__ import annotations

import enum
import itertools
import logging
import os
import threading
from dataclasses import dataclass, replace
from typing import Callable, Mapping, Sequence

from .atomic_file import atomic_write
from .checkpoint import CLEANER_OFFSET_CHECKPOINT, CheckpointError, read_offsets, write_offsets
from .cleaner import CleaningAbortedError, LogToClean, segments_in_range
from .pause_owners import ANONYMOUS, PAUSES_FILE, SHUTDOWN, PauseFileError, PauseOwner, decode_pauses, encode_pauses
from .topic_partition import TopicPartition

logger = logging.getLogger(__name__)


class CleaningState(str, enum.Enum):
    IDLE = "idle"
    IN_PROGRESS = "in-progress"
    ABORTED = "aborted"
    PAUSED = "paused"
    UNCLEANABLE = "uncleanable"


@dataclass(frozen=True, slots=True)
class PartitionCleaning:
    """One partition's cleaning state, when it was entered, its pause owners and, if uncleanable, why.

    Aborted carries the owners that asked for the abort: they hold the pause once the pass ends.
    """

    state: CleaningState
    since_ms: int
    owners: tuple[PauseOwner, ...] = ()
    reason: str = ""

    @property
    def pause_count(self) -> int:
        """Kafka's LogCleaningPaused(n): the number of owners, 0 unless paused."""
        return len(self.owners) if self.state is CleaningState.PAUSED else 0


class CleaningStateError(RuntimeError):
    """A state transition Kafka forbids (resume without pause, done-cleaning when not cleaning...)."""


class LogCleaningError(RuntimeError):
    """Kafka's LogCleaningException: selecting a log failed; the cleaner marks `tp` uncleanable."""

    def __init__(self, tp: TopicPartition, message: str) -> None:
        super().__init__(message)
        self.tp = tp


@dataclass(frozen=True, slots=True)
class CleanableOffsets:
    first_dirty: int
    first_uncleanable: int
    force_checkpoint_update: bool


class CleanerManager:
    """Selection, states and checkpoints of the logs in a node's log directories (one or several, JBOD).

    `dir_of`: the log dir holding a partition now (None: unknown, the first dir); its checkpoint
    entry and lasting pauses are kept there, and nowhere else (KAFKA-8362).
    """

    def __init__(self, log_dir: str | Sequence[str], logs: Callable[[], Mapping[TopicPartition, object]],
                 clock: Callable[[], int], dir_of: Callable[[TopicPartition], str | None] | None = None) -> None:
        self.dirs = [log_dir] if isinstance(log_dir, str) else list(log_dir)
        self.dir = self.dirs[0]
        self._dir_of = dir_of or (lambda tp: None)
        self._logs = logs
        self.clock = clock
        self._lock = threading.Condition()
        self._states: dict[TopicPartition, PartitionCleaning] = {}
        # Uncleanable is kept apart, as Kafka keeps its set: a partition can be uncleanable and also
        # paused (truncation, deletion), and each pause still needs its resume.
        self._uncleanable: dict[TopicPartition, PartitionCleaning] = {}
        self._anonymous = itertools.count(1)
        self.orphaned_pauses_released = 0  # shale_cleaning_pauses_released_orphaned_total
        self.last_run_ms = clock()
        self.max_dirty_ratio = 0.0
        self.max_compaction_delay_ms = 0

    def logs(self) -> dict[TopicPartition, object]:
        """A snapshot: partitions are created and deleted while the cleaner iterates."""
        return dict(self._logs())

    # -- states ----------------------------------------------------------------------------------

    def _base(self, tp: TopicPartition) -> PartitionCleaning:
        """The state without the uncleanable mark: what transitions work on."""
        return self._states.get(tp) or PartitionCleaning(CleaningState.IDLE, self.last_run_ms)

    def state(self, tp: TopicPartition) -> PartitionCleaning:
        """The state to report: an idle uncleanable partition shows as uncleanable; any state carries the reason."""
        with self._lock:
            base = self._base(tp)
            mark = self._uncleanable.get(tp)
            if mark is None:
                return base
            return mark if base.state is CleaningState.IDLE else replace(base, reason=mark.reason)

    def states(self) -> dict[TopicPartition, PartitionCleaning]:
        with self._lock:
            return {tp: self.state(tp) for tp in self.logs()}

    def _set(self, tp: TopicPartition, state: CleaningState, owners: tuple[PauseOwner, ...] = (),
             reason: str = "") -> None:
        persisted = any(o.persisted for o in owners + self._base(tp).owners)
        self._states[tp] = PartitionCleaning(state, self.clock(), owners, reason)
        self._lock.notify_all()
        if persisted:
            self._write_pauses()

    def _owner(self, owner: PauseOwner | str | None) -> PauseOwner:
        if owner is None:  # Kafka's bare count: a new owner each time
            return PauseOwner(ANONYMOUS, str(next(self._anonymous)))
        return owner if isinstance(owner, PauseOwner) else PauseOwner.parse(owner)

    def pause(self, tp: TopicPartition, owner: PauseOwner | str | None = None) -> int:
        """Kafka's abortAndPauseCleaning for `owner`: stop a running pass (waiting for it), add the owner.

        Returns the pause count. An owner that holds a pause already is not counted twice (KAFKA-16709).
        """
        owner = self._owner(owner)
        with self._lock:
            cur = self._base(tp)
            if cur.state is CleaningState.IN_PROGRESS:
                self._set(tp, CleaningState.ABORTED, (owner,))
                while self._base(tp).state is CleaningState.ABORTED:
                    self._lock.wait()
                return self._base(tp).pause_count
            if cur.state is CleaningState.ABORTED:
                raise CleaningStateError(f"cleaning of {tp} is being aborted; it cannot be paused now")
            if cur.state is not CleaningState.PAUSED:
                self._set(tp, CleaningState.PAUSED, (owner,))
            elif owner not in cur.owners:
                self._states[tp] = replace(cur, owners=cur.owners + (owner,))
                if owner.persisted:
                    self._write_pauses()
            return self._base(tp).pause_count

    def resume(self, tp: TopicPartition, owner: PauseOwner | str | None = None) -> int:
        """Release `owner`'s pause (None: the newest anonymous one); return the remaining count.

        CleaningStateError, changing nothing, when the partition is not paused or not by that owner:
        one owner's resume can never release another's pause.
        """
        with self._lock:
            cur = self._base(tp)
            if cur.state is not CleaningState.PAUSED:
                raise CleaningStateError(f"cannot resume cleaning of {tp}: it is {cur.state.value}, not paused")
            held = ", ".join(map(str, cur.owners))
            if owner is None:
                anonymous = [o for o in cur.owners if o.kind == ANONYMOUS]
                if not anonymous:
                    raise CleaningStateError(f"cannot resume cleaning of {tp} without naming an owner: "
                                             f"it is paused by {held}")
                owner = anonymous[-1]
            owner = self._owner(owner)
            if owner not in cur.owners:
                raise CleaningStateError(f"cannot resume cleaning of {tp} for {owner}: it is paused by {held}")
            rest = tuple(o for o in cur.owners if o != owner)
            if rest:
                self._states[tp] = replace(cur, owners=rest)
                if owner.persisted:
                    self._write_pauses()
            else:
                self._set(tp, CleaningState.IDLE)
            return len(rest)

    def abort_in_progress(self) -> list[TopicPartition]:
        """Ask every running pass to stop (shutdown); no waiting, the threads notice at their next check.

        Returns the partitions aborted: each ends paused by `shutdown`, which the caller resumes once
        its threads have stopped, so that the pause is not leaked.
        """
        with self._lock:
            aborted = [tp for tp, cur in self._states.items() if cur.state is CleaningState.IN_PROGRESS]
            for tp in aborted:
                self._set(tp, CleaningState.ABORTED, (PauseOwner(SHUTDOWN),))
            return aborted

    def mark_uncleanable(self, tp: TopicPartition, reason: str) -> None:
        with self._lock:
            logger.warning("Marking %s as uncleanable: %s", tp, reason)
            self._uncleanable[tp] = PartitionCleaning(CleaningState.UNCLEANABLE, self.clock(), (), reason)
            self._lock.notify_all()

    def check_aborted(self, tp: TopicPartition) -> None:
        """Called by the cleaner between steps; raises once someone asked to abort."""
        if self._base(tp).state is CleaningState.ABORTED:
            raise CleaningAbortedError(f"cleaning of {tp} was aborted")

    def forget(self, tp: TopicPartition) -> None:
        """The partition left this node (deleted): drop its state, its pauses and its checkpoint entry."""
        with self._lock:
            old = self._states.pop(tp, None)
            self._uncleanable.pop(tp, None)
            if old is not None and any(o.persisted for o in old.owners):
                self._write_pauses()
            self.update_checkpoint(tp, None)

    # -- lasting pauses --------------------------------------------------------------------------

    def _home(self, tp: TopicPartition) -> str:
        return self._dir_of(tp) or self.dir

    def _write_pauses(self) -> None:
        """Rewrite `cleaner-pauses.json` of every dir (they are small): each holds its partitions' lasting owners."""
        by_dir: dict[str, dict[TopicPartition, tuple[PauseOwner, ...]]] = {d: {} for d in self.dirs}
        for tp, cur in self._states.items():
            if any(o.persisted for o in cur.owners):
                by_dir.setdefault(self._home(tp), {})[tp] = cur.owners
        for d, pauses in by_dir.items():
            path = os.path.join(d, PAUSES_FILE)
            if pauses or os.path.exists(path):
                atomic_write(path, encode_pauses(pauses))

    def load_pauses(self, owner_exists: Callable[[TopicPartition, PauseOwner], bool]) -> list[tuple[TopicPartition,
                                                                                                      PauseOwner]]:
        """At start: hold every persisted pause whose partition and owner still exist; release the others.

        Each released one is logged at WARNING and counted; returns them. An unreadable file holds nothing
        (logged at ERROR): a pause kept by mistake would stop the cleaner for good, one lost only until its
        owner pauses again, which a resumed move does.
        """
        released: list[tuple[TopicPartition, PauseOwner]] = []
        logs = self.logs()
        with self._lock:
            for d in self.dirs:
                path = os.path.join(d, PAUSES_FILE)
                try:
                    with open(path, "rb") as f:
                        pauses = decode_pauses(f.read(), path)
                except FileNotFoundError:
                    continue
                except (OSError, PauseFileError) as e:
                    logger.error("cannot read the cleaning pauses in %s, holding none of them: %s", path, e)
                    continue
                for tp, owners in pauses.items():
                    for owner in owners:
                        if tp in logs and owner_exists(tp, owner):
                            cur = self._base(tp)
                            if owner not in cur.owners:
                                self._states[tp] = PartitionCleaning(CleaningState.PAUSED, self.clock(),
                                                                     cur.owners + (owner,))
                            logger.info("cleaning of %s stays paused by %s (from %s)", tp, owner, path)
                            continue
                        why = "its partition is gone" if tp not in logs else "its owner no longer exists"
                        logger.warning("releasing the cleaning pause of %s (topic %s, partition %d) held by %s in %s: "
                                       "%s", tp, tp.topic, tp.partition, owner, path, why)
                        released.append((tp, owner))
            self.orphaned_pauses_released += len(released)
            self._write_pauses()
        return released

    def owners(self) -> dict[TopicPartition, tuple[PauseOwner, ...]]:
        """The owners of every paused partition."""
        with self._lock:
            return {tp: cur.owners for tp, cur in self._states.items() if cur.state is CleaningState.PAUSED}

    # -- checkpoint ------------------------------------------------------------------------------

    def _read_checkpoint_of(self, d: str) -> dict[TopicPartition, int]:
        path = os.path.join(d, CLEANER_OFFSET_CHECKPOINT)
        try:
            return read_offsets(path)
        except (CheckpointError, OSError, UnicodeDecodeError) as e:
            logger.warning("error reading %s, cleaning all logs from their start: %s", path, e)
            return {}

    def read_checkpoint(self) -> dict[TopicPartition, int]:
        """Every dir's entries; a partition's own dir wins over a stale entry left elsewhere (KAFKA-8362)."""
        merged: dict[TopicPartition, int] = {}
        per_dir = {d: self._read_checkpoint_of(d) for d in self.dirs}
        for d, offsets in per_dir.items():
            for tp, offset in offsets.items():
                if tp not in merged or self._home(tp) == d:
                    merged[tp] = offset
        return merged

    def update_checkpoint(self, tp: TopicPartition, offset: int | None) -> None:
        """Set (or with None remove) one partition's first dirty offset in its dir, removing it from the others.

        Only live partitions are kept.
        """
        with self._lock:
            live = self.logs()
            home = self._home(tp)
            for d in self.dirs:
                current = self._read_checkpoint_of(d)
                if d == home and offset is not None:
                    current[tp] = offset
                elif tp in current:
                    current.pop(tp)
                elif d != home:
                    continue
                write_offsets(os.path.join(d, CLEANER_OFFSET_CHECKPOINT),
                              {k: v for k, v in current.items() if k in live})

    def maybe_truncate_checkpoint(self, tp: TopicPartition, offset: int) -> None:
        """After a truncation: a first dirty offset above the new end would skip data."""
        with self._lock:
            current = self.read_checkpoint().get(tp)
            if current is not None and current > offset:
                self.update_checkpoint(tp, offset)

    # -- selection -------------------------------------------------------------------------------

    def cleanable_offsets(self, tp: TopicPartition, log, checkpoint: int | None, now: int) -> CleanableOffsets:
        """First dirty offset (the checkpoint, reset when out of range) and first uncleanable offset."""
        force = False
        first_dirty = log.log_start_offset if checkpoint is None else checkpoint
        if checkpoint is not None and checkpoint < log.log_start_offset:
            if not log.config.delete:
                logger.warning("Resetting first dirty offset of %s to log start offset %d since the checkpointed "
                               "offset %d is invalid", tp, log.log_start_offset, checkpoint)
            first_dirty, force = log.log_start_offset, True
        elif checkpoint is not None and checkpoint > log.log_end_offset:
            logger.warning("The last checkpoint dirty offset for partition %s is %d, which is larger than the log "
                           "end offset %d. Resetting to the log start offset %d.", tp, checkpoint,
                           log.log_end_offset, log.log_start_offset)
            first_dirty, force = log.log_start_offset, True
        with log.lock:
            segments = list(log.segments)
            active_base = log.active_segment.base_offset
            stable = log.last_stable_offset
        candidates = [stable, active_base]
        lag = log.config.min_compaction_lag_ms
        if lag > 0:
            for seg in segments_in_range(segments, first_dirty, active_base):
                if seg.largest_timestamp > now - lag:
                    candidates.append(seg.base_offset)
                    break
        return CleanableOffsets(first_dirty, max(first_dirty, min(candidates)), force)

    def log_to_clean(self, log, offsets: CleanableOffsets, now: int) -> LogToClean:
        with log.lock:
            segments = list(log.segments)
        first_dirty, uncleanable = offsets.first_dirty, offsets.first_uncleanable
        clean_bytes = sum(s.size for s in segments_in_range(segments, -1, first_dirty))
        # Kafka's calculateCleanableBytes: nonActiveLogSegmentsFrom(uncleanable).headOption, i.e. the segment
        # *holding* the uncleanable offset (the floor segment), so e.g. a segment with an open transaction
        # in its middle is not cleaned at all.
        active_base = segments[-1].base_offset
        non_active = segments_in_range(segments[:-1], uncleanable, active_base) if uncleanable < active_base else []
        limit = (non_active[0] if non_active else segments[-1]).base_offset
        cleanable_bytes = sum(s.size for s in segments_in_range(segments, min(first_dirty, limit), limit))
        return LogToClean(log, first_dirty, limit, clean_bytes, cleanable_bytes,
                          self._compaction_delay(log, segments, first_dirty, now))

    @staticmethod
    def _compaction_delay(log, segments, first_dirty: int, now: int) -> int:
        """Kafka's maxCompactionDelay: how far past max.compaction.lag.ms the oldest dirty record is."""
        active_base = segments[-1].base_offset  # nonActiveLogSegmentsFrom: nothing when first_dirty >= active base
        dirty = segments_in_range(segments[:-1], first_dirty, active_base) if first_dirty < active_base else []
        stamps = [ts for s in dirty if (ts := s.first_batch_timestamp) > 0]
        earliest = min(stamps, default=2**63 - 1)
        clean_until = now - max(log.config.max_compaction_lag_ms, 0)
        return clean_until - earliest if earliest < clean_until else 0

    def grab_filthiest_compacted_log(self) -> tuple[TopicPartition, LogToClean] | None:
        """Pick the compacted log with the highest dirty ratio above its minimum (or forced by the max lag)."""
        now = self.clock()
        with self._lock:
            self.last_run_ms = now
            checkpoint = self.read_checkpoint()
            ranked: list[tuple[TopicPartition, LogToClean]] = []
            max_delay = 0
            for tp, log in self.logs().items():
                if not log.config.compact or self.state(tp).state is not CleaningState.IDLE:
                    continue
                try:
                    offsets = self.cleanable_offsets(tp, log, checkpoint.get(tp), now)
                    if offsets.force_checkpoint_update:
                        self.update_checkpoint(tp, offsets.first_dirty)
                    ltc = self.log_to_clean(log, offsets, now)
                except Exception as e:
                    raise LogCleaningError(
                        tp, f"Failed to calculate log cleaning stats for partition {tp}: {type(e).__name__}: {e}"
                    ) from e
                max_delay = max(max_delay, ltc.max_compaction_delay_ms)
                if ltc.total_bytes > 0:
                    ranked.append((tp, ltc))
            self.max_dirty_ratio = max((ltc.cleanable_ratio for _, ltc in ranked), default=0.0)
            self.max_compaction_delay_ms = max_delay
            eligible = [
                (tp, ltc) for tp, ltc in ranked
                if (ltc.max_compaction_delay_ms > 0 and ltc.cleanable_bytes > 0)
                or ltc.cleanable_ratio > ltc.log.config.min_cleanable_dirty_ratio
            ]
            if not eligible:
                return None
            tp, ltc = max(eligible, key=lambda item: item[1].cleanable_ratio)
            self._set(tp, CleaningState.IN_PROGRESS)
            return tp, ltc

    def done_cleaning(self, tp: TopicPartition, end_offset: int | None) -> None:
        """In progress → idle with the checkpoint moved to `end_offset`; aborted → paused(1), checkpoint untouched."""
        with self._lock:
            cur = self._base(tp).state
            if cur is CleaningState.IN_PROGRESS:
                if end_offset is not None:
                    self.update_checkpoint(tp, end_offset)
                self._set(tp, CleaningState.IDLE)
            elif cur is CleaningState.ABORTED:
                self._set(tp, CleaningState.PAUSED, self._base(tp).owners)
            else:
                raise CleaningStateError(f"in-progress partition {tp} cannot be in {cur.value} state")

    # -- retention of compacted logs -------------------------------------------------------------

    def deletable_logs(self) -> list[tuple[TopicPartition, object]]:
        """Compacted logs the cleaner thread runs retention on; they are marked in progress meanwhile."""
        with self._lock:
            out = [(tp, log) for tp, log in self.logs().items()
                   if log.config.compact and self.state(tp).state is CleaningState.IDLE]
            for tp, _ in out:
                self._set(tp, CleaningState.IN_PROGRESS)
            return out

    def done_deleting(self, tps: list[TopicPartition]) -> None:
        with self._lock:
            for tp in tps:
                cur = self._base(tp).state
                if cur is CleaningState.IN_PROGRESS:
                    self._set(tp, CleaningState.IDLE)
                elif cur is CleaningState.ABORTED:
                    self._set(tp, CleaningState.PAUSED, self._base(tp).owners)

    # -- figures ---------------------------------------------------------------------------------

    def uncleanable(self) -> dict[TopicPartition, PartitionCleaning]:
        with self._lock:
            return dict(self._uncleanable)

    def uncleanable_bytes(self) -> int:
        """Cleanable bytes stuck in uncleanable partitions (Kafka's uncleanable-bytes gauge)."""
        now = self.clock()
        checkpoint = self.read_checkpoint()
        logs = self.logs()
        total = 0
        for tp in self.uncleanable():
            log = logs.get(tp)
            if log is not None:
                offsets = self.cleanable_offsets(tp, log, checkpoint.get(tp), now)
                total += self.log_to_clean(log, offsets, now).cleanable_bytes
        return total
