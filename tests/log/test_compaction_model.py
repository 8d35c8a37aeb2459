"""A stateful test of log compaction against a reference model (spec 7, 2.10, 12).

The machine drives a compacted topic in a real `LogDir` (tiny segments, so rolls happen) through
keyed writes, tombstones, clock steps, rolls, cleaning passes (Cleaner directly via the
CleanerManager, or LogCleaner.clean_once), small offset maps (partial cleaning), pause/resume,
unclean reopens and crashes in the middle of a cleaning swap (a real process crash is simulated by
snapshotting the directory at the N-th `os.replace` of the pass and restoring that snapshot).

The reference model is Kafka's rule, written out independently of the engine: which records a
pass keeps (`shouldRetainRecord`), which batches it keeps empty (`batch.nextOffset == upperBound`),
where the offset map stops (`map.size >= maxDesiredMapSize`, checked before every put), which
segments it recopies (`[0, endOffset)`), where the dirty section ends (active segment,
min.compaction.lag.ms) and when a log is eligible (ratio strictly above min.cleanable.dirty.ratio).
After every step the log on disk must equal the model batch for batch (offsets, keys, values,
timestamps, delete horizons); on top of that the brief's invariants are asserted directly against
the files, so that a mistake shared by the model and the engine would still be caught.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass
from typing import Optional

import pytest
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from shale.sidecar.log.cleaner import Cleaner
from shale.sidecar.log.cleaner_manager import CleanerManager, CleaningState, CleaningStateError
from shale.sidecar.log.compression import Compression
from shale.sidecar.log.log_cleaner import CleanerConfig, LogCleaner
from shale.sidecar.log.log_dir import LogDir
from shale.sidecar.log.offset_map import SLOT_SIZE, OffsetMap, default_hash
from shale.sidecar.log.records import Record, encode_batch
from shale.sidecar.log.topic_partition import TopicPartition
from support.logtest_util import FakeClock, dir_snapshot, make_config, segment_batches

TP = TopicPartition("compacted", 0)

# Short keys are stored inline in the offset map (<= 19 bytes, compared exactly); long keys as a digest.
# The pool holds the edge cases: the empty key, keys that differ only by a trailing NUL (inline slots
# are NUL-padded), and keys of exactly 19 and 20 bytes on either side of the inline limit.
SHORT_KEYS = [b"", b"a", b"a\x00", b"k1", b"k2", b"s" * 19]
LONG_KEYS = [b"t" * 20, b"t" * 20 + b"\x00", b"long-key-0-" + b"z" * 20, b"long-key-1-" + b"z" * 20,
             b"long-key-0-" + b"z" * 21]
assert all(len(k) <= 19 for k in SHORT_KEYS) and all(len(k) > 19 for k in LONG_KEYS)

key_st = st.sampled_from(SHORT_KEYS) | st.sampled_from(LONG_KEYS)
# None = tombstone; b"" is an empty value, which is NOT a tombstone.
value_st = st.one_of(st.none(), st.just(b""), st.binary(min_size=1, max_size=12), st.binary(min_size=1, max_size=12))
CODECS = [Compression.NONE] * 3 + [Compression.GZIP, Compression.SNAPPY, Compression.LZ4, Compression.ZSTD]
# Slots of the offset map for one pass: max entries = int(slots * 0.9) = 1, 2, 4, 7, 900.
SLOTS = [2, 3, 5, 8, 1000]


class Crash(BaseException):
    """The simulated process death (a BaseException, so that no `except Exception` swallows it)."""


@dataclass(frozen=True)
class MBatch:
    """A batch as the model (and the files) see it."""

    base: int
    last: int
    horizon: Optional[int]
    max_ts: int
    recs: tuple  # ((offset, key, value, timestamp), ...)


@dataclass(frozen=True)
class SegView:
    base: int
    size: int
    batches: tuple
    mtime_ms: int


@dataclass(frozen=True)
class GrabPrediction:
    first_dirty: int
    first_uncleanable: int
    clean_bytes: int
    cleanable_bytes: int
    eligible: bool


def in_range(segs, start: int, end: int):
    """Kafka's `logSegments(from, to)`: from the floor segment of `start`, while base < `end` (model copy)."""
    first = 0
    for i, s in enumerate(segs):
        if s.base <= start:
            first = i
    return [s for s in segs[first:] if s.base < end]


def largest_timestamp(seg: SegView) -> int:
    ts = max((b.max_ts for b in seg.batches), default=-1)
    return ts if ts >= 0 else seg.mtime_ms


def by_region(batches, lo: int, hi: float):
    return [b for b in batches if lo <= b.base < hi]


class CompactionModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.tmp = tempfile.mkdtemp(prefix="shale-compaction-")
        self.path = os.path.join(self.tmp, "data")
        self.clock = FakeClock()
        self.logdir: LogDir | None = None

    # -- setup, teardown, reopen ------------------------------------------------------------------

    @initialize(segment_bytes=st.integers(300, 900), ratio=st.sampled_from([0.0, 0.01, 0.3]),
                retention=st.sampled_from([0, 40, 1000, 5000]), lag=st.sampled_from([0, 0, 300, 3000]),
                interval=st.sampled_from([0, 100, 4096]), index_bytes=st.sampled_from([72, 4096]),
                delete_delay=st.sampled_from([0, 60_000]))
    def setup(self, segment_bytes, ratio, retention, lag, interval, index_bytes, delete_delay) -> None:
        self.cfg = make_config({
            "cleanup.policy": "compact", "segment.bytes": segment_bytes, "min.cleanable.dirty.ratio": ratio,
            "delete.retention.ms": retention, "min.compaction.lag.ms": lag, "index.interval.bytes": interval,
            "segment.index.bytes": index_bytes, "file.delete.delay.ms": delete_delay,
        })
        self.batches: list[MBatch] = []  # the model of the log
        self.written: dict[int, tuple] = {}  # offset -> (key, value, timestamp), everything ever written
        self.leo = 0
        self.checkpoint: int | None = None  # cleaner-offset-checkpoint
        self.paused = 0
        self.removed_tombstones: dict[int, tuple[int, int]] = {}  # offset -> (horizon, clock of the removing pass)
        self.passes = 0
        self.crashes = 0
        self._open()

    def _open(self) -> None:
        self.logdir = LogDir(self.path, lambda topic: self.cfg, clock=self.clock)
        self.log = self.logdir.get_or_create(TP)
        self.manager = CleanerManager(self.logdir.path, lambda: self.logdir.logs, self.clock)
        self.log_cleaner = LogCleaner(self.manager, lambda: self.logdir.logs,
                                      CleanerConfig(dedupe_buffer_size=8 * SLOT_SIZE), self.clock)
        self.paused = 0  # cleaning states live in memory only (Kafka's too)

    def _drop(self) -> None:
        """A process death: no flush, no trim, no checkpoint, no clean-shutdown marker."""
        for log in self.logdir.logs.values():
            for seg in log.segments:
                seg.close_handles()
            for _t, seg in log._pending_deletes:
                seg.close_handles()
        os.close(self.logdir._lock_fd)
        self.logdir = None

    def teardown(self) -> None:
        if self.logdir is not None:
            self._drop()
        shutil.rmtree(self.tmp, ignore_errors=True)

    # -- reading the files ------------------------------------------------------------------------

    def seg_views(self) -> list[SegView]:
        out = []
        for seg in self.log.segments:
            bs = tuple(MBatch(b.header.base_offset, b.header.last_offset, b.header.delete_horizon_ms,
                              b.header.max_timestamp, tuple((r.offset, r.key, r.value, r.timestamp) for r in b.records))
                       for _pos, b in segment_batches(seg))
            out.append(SegView(seg.base_offset, seg.size, bs, int(os.stat(seg.log_path).st_mtime * 1000)))
        return out

    def actual(self) -> list[MBatch]:
        return [b for s in self.seg_views() for b in s.batches]

    def segment_files(self, min_base: int, suffixes=(".log", ".index", ".timeindex")) -> dict[str, bytes]:
        part = os.path.join(self.path, str(TP))
        out = {}
        for name in sorted(os.listdir(part)):
            if name[:20].isdigit() and int(name[:20]) >= min_base and any(name.endswith(s) for s in suffixes):
                with open(os.path.join(part, name), "rb") as f:
                    out[name] = f.read()
        return out

    # -- writes, clock, rolls ---------------------------------------------------------------------

    def _write(self, items, ts_back, codec=Compression.NONE) -> None:
        now = self.clock.now
        recs = [Record(i, now - ts_back[i % len(ts_back)], k, v) for i, (k, v) in enumerate(items)]
        info = self.log.append(encode_batch(recs, compression=codec))
        assert info.first_offset == self.leo
        got = tuple((self.leo + i, r.key, r.value, r.timestamp) for i, r in enumerate(recs))
        for o, k, v, ts in got:
            self.written[o] = (k, v, ts)
        self.batches.append(MBatch(self.leo, self.leo + len(recs) - 1, None, max(r.timestamp for r in recs), got))
        self.leo += len(recs)

    @rule(items=st.lists(st.tuples(key_st, value_st), min_size=1, max_size=3),
          ts_back=st.lists(st.integers(0, 20), min_size=1, max_size=3), tick=st.integers(0, 50),
          codec=st.sampled_from(CODECS))
    def write(self, items, ts_back, tick, codec) -> None:
        self.clock.sleep(tick)
        self._write(items, ts_back, codec)

    @rule(items=st.lists(st.tuples(key_st, value_st), min_size=1, max_size=10))
    def write_burst(self, items) -> None:
        for item in items:
            self.clock.sleep(3)
            self._write([item], [0])

    @rule(ms=st.sampled_from([1, 39, 40, 41, 299, 300, 999, 1000, 2999, 3000, 5000, 12_000]))
    def advance_clock(self, ms) -> None:
        self.clock.sleep(ms)

    @rule()
    def roll(self) -> None:
        self.log.roll()
        assert self.log.active_segment.base_offset == self.leo

    @rule()
    def delete_expired_files(self) -> None:
        self.log.delete_expired_files()

    # -- pause / resume ---------------------------------------------------------------------------

    @rule(act=st.integers(0, 2))
    def pause(self, act) -> None:
        if act:  # rarer than the other rules, or most passes would find the partition paused
            return
        assert self.manager.pause(TP) == self.paused + 1
        self.paused += 1

    @rule()
    def resume(self) -> None:
        if self.paused == 0:
            with pytest.raises(CleaningStateError):
                self.manager.resume(TP)
            return
        assert self.manager.resume(TP) == self.paused - 1
        self.paused -= 1

    # -- reopen -----------------------------------------------------------------------------------

    @rule(clean=st.booleans())
    def reopen(self, clean) -> None:
        if clean:
            self.logdir.close()
            self.logdir = None
        else:
            self._drop()
        self._open()
        assert self.log.log_end_offset == self.leo
        assert self.logdir.had_clean_shutdown == clean

    # -- the model of one pass --------------------------------------------------------------------

    def predict_grab(self, segs: list[SegView], now: int) -> GrabPrediction:
        """LogCleanerManager.cleanableOffsets + calculateCleanableBytes + the eligibility test."""
        first_dirty = 0 if self.checkpoint is None else self.checkpoint
        assert 0 <= first_dirty <= self.leo
        active_base = segs[-1].base
        candidates = [self.leo, active_base]  # one replica, no open transaction: LSO = HW = LEO
        lag = self.cfg.min_compaction_lag_ms
        if lag > 0:
            for s in in_range(segs, first_dirty, active_base):
                if largest_timestamp(s) > now - lag:
                    candidates.append(s.base)
                    break
        uncleanable = max(first_dirty, min(candidates))
        # calculateCleanableBytes: nonActiveLogSegmentsFrom(uncleanable).headOption, else the active segment.
        # LogSegments.values(from, to) starts at the floor segment of `from` and is empty when from == to.
        non_active = in_range(segs, uncleanable, active_base) if uncleanable < active_base else []
        limit = non_active[0].base if non_active else active_base
        clean = sum(s.size for s in in_range(segs, -1, first_dirty))
        cleanable = sum(s.size for s in in_range(segs, min(first_dirty, limit), limit))
        total = clean + cleanable
        eligible = total > 0 and cleanable / total > self.cfg.min_cleanable_dirty_ratio
        return GrabPrediction(first_dirty, limit, clean, cleanable, eligible)

    def predict_pass(self, segs: list[SegView], first_dirty: int, upper: int, now: int,
                     max_entries: int) -> tuple[int, dict, list[MBatch]]:
        """(end offset, key -> latest offset in the map, the log after the pass), by Kafka's rules."""
        latest_of: dict[bytes, int] = {}
        latest = -1
        dirty = in_range(segs, first_dirty, upper)
        full = False
        for i, s in enumerate(dirty):
            next_off = min(dirty[i + 1].base if i + 1 < len(dirty) else upper, upper)
            for b in s.batches:
                if b.base >= next_off:
                    break
                for o, k, _v, _ts in b.recs:
                    if o < first_dirty or o >= next_off:
                        continue
                    if len(latest_of) >= max_entries:  # Kafka checks the size before every put, even of a known key
                        full = True
                        break
                    latest_of[k] = o
                    latest = o
                if full:
                    break
                if b.last >= first_dirty:
                    latest = min(b.last, next_off - 1)
            if full:
                break
            latest = next_off - 1
        end = latest + 1
        assert first_dirty < end <= upper, "every pass makes progress and stays below the uncleanable offset"
        horizon_now = now + self.cfg.delete_retention_ms
        after: list[MBatch] = []
        for s in segs:
            if s.base >= end:  # logSegments(0, endOffset): segments from the start up to endOffset are recopied
                after.extend(s.batches)
                continue
            for b in s.batches:
                kept = []
                for r in b.recs:
                    o, k, v, _ts = r
                    if o > end - 1:
                        kept.append(r)  # beyond the map: kept as it is
                    elif o < latest_of.get(k, -1):
                        continue  # a later record of this key exists
                    elif v is not None or b.horizon is None or now < b.horizon:
                        kept.append(r)
                tombstones = any(r[2] is None for r in kept)
                if len(kept) == len(b.recs) and kept and not (tombstones and b.horizon is None):
                    after.append(b)  # copied unchanged
                elif not kept:
                    if b.last + 1 == upper:  # the last batch of the round stays, empty
                        after.append(MBatch(b.base, b.last, None, b.max_ts, ()))
                else:
                    horizon = horizon_now if tombstones and b.horizon is None else b.horizon
                    after.append(MBatch(b.base, b.last, horizon, max(r[3] for r in kept), tuple(kept)))
        return end, latest_of, after

    # -- the cleaning pass ------------------------------------------------------------------------

    @rule(via=st.sampled_from(["cleaner", "log_cleaner"]), slots=st.sampled_from(SLOTS),
          crash_at=st.none() | st.integers(0, 10) | st.just("checkpoint"), py=st.booleans())
    def clean(self, via, slots, crash_at, py=False) -> None:
        now = self.clock.now
        segs = self.seg_views()
        pre = [b for s in segs for b in s.batches]
        assert pre == self.batches
        grab = self.predict_grab(segs, now)
        will_clean = grab.eligible and self.paused == 0
        # The default map hash lets the compiled loops run (when built); BLAKE2b forces the pure-Python ones.
        offset_map = OffsetMap(slots * SLOT_SIZE, hash_fn=default_hash if py else None)
        assert offset_map.max_entries == int(slots * 0.9)
        if will_clean:
            end, _, post = self.predict_pass(segs, grab.first_dirty, grab.first_uncleanable, now,
                                                     offset_map.max_entries)
        else:
            end, post = None, pre
        untouched_before = self.segment_files(grab.first_uncleanable)

        cleaner = Cleaner(offset_map, clock=self.clock,
                          check_aborted=lambda log: self.manager.check_aborted(log.topic_partition))
        snapshot: dict[str, bytes] = {}
        calls = [0]
        real_replace = os.replace

        def crashing_replace(src, dst, *a, **kw):
            if crash_at is not None and not snapshot:
                # "checkpoint": die just before the cleaner checkpoint is renamed into place, i.e. after
                # every swap of the pass: the next pass cleans the same dirty section again.
                at_checkpoint = crash_at == "checkpoint" and str(dst).endswith("cleaner-offset-checkpoint")
                if calls[0] == crash_at or at_checkpoint:
                    snapshot.update(dir_snapshot(self.path))  # what the disk holds when the process dies
                    raise Crash(f"crash before os.replace #{calls[0] + 1} of the pass")
                calls[0] += 1
            if snapshot:
                raise Crash("the process is dead")
            return real_replace(src, dst, *a, **kw)

        os.replace = crashing_replace
        try:
            if via == "cleaner":
                grabbed = self.manager.grab_filthiest_compacted_log()
                assert (grabbed is not None) == will_clean, (grab, self.paused)
                if grabbed is not None:
                    tp, ltc = grabbed
                    assert tp == TP
                    assert (ltc.first_dirty_offset, ltc.first_uncleanable_offset) == (grab.first_dirty,
                                                                                      grab.first_uncleanable)
                    assert (ltc.clean_bytes, ltc.cleanable_bytes) == (grab.clean_bytes, grab.cleanable_bytes)
                    got_end, stats = cleaner.clean(ltc)
                    assert got_end == end
                    assert stats.messages_read == sum(len(b.recs) for s in segs if s.base < end for b in s.batches)
                    self.manager.done_cleaning(tp, got_end)
            else:
                assert self.log_cleaner.clean_once(cleaner) == will_clean
        except Crash:
            assert snapshot, "only the injected crash may interrupt a pass"
        finally:
            os.replace = real_replace

        if crash_at is not None:
            event("crash injected" if snapshot else "crash scheduled past the last rename")
        if snapshot:
            self._after_crash(snapshot, segs, pre, post, grab, end, now)
            return
        state = self.manager.state(TP)
        assert state.state is (CleaningState.PAUSED if self.paused else CleaningState.IDLE), state
        assert state.pause_count == self.paused
        actual = self.actual()
        if not will_clean:
            event("pass skipped: " + ("paused" if self.paused else "not eligible"))
        else:
            event("pass: " + ("partial" if end < grab.first_uncleanable else "whole dirty section"))
            if grab.first_uncleanable < segs[-1].base:
                event("pass: stopped by min.compaction.lag.ms")
            if any(not b.recs for b in actual):
                event("pass: empty batch kept")
            self.passes += 1
            assert self.manager.read_checkpoint()[TP] == end
            self.checkpoint = end
        self._check_pass(pre, actual, now, grab, end)
        assert actual == post
        assert self.segment_files(grab.first_uncleanable) == untouched_before, \
            "nothing at or after the first uncleanable offset may change"
        self.batches = actual

    @rule(ms=st.sampled_from([0, 41, 1001, 5001]), via=st.sampled_from(["cleaner", "log_cleaner"]),
          slots=st.sampled_from(SLOTS), py=st.booleans())
    def later_clean(self, ms, via, slots, py) -> None:
        """Time passes, then a pass: the way tombstones get a horizon and later go."""
        self.clock.sleep(ms)
        self.clean(via=via, slots=slots, crash_at=None, py=py)

    @rule(delta=st.sampled_from([-1, 0]), via=st.sampled_from(["cleaner", "log_cleaner"]),
          slots=st.sampled_from(SLOTS), py=st.booleans())
    def clean_at_horizon(self, delta, via, slots, py) -> None:
        """A pass 1 ms before, or exactly at, the earliest delete horizon still ahead."""
        ahead = [b.horizon + delta for b in self.batches
                 if b.horizon is not None and b.horizon + delta > self.clock.now]
        if ahead:
            self.clock.now = min(ahead)
            self.clean(via=via, slots=slots, crash_at=None, py=py)

    def _check_pass(self, pre: list[MBatch], actual: list[MBatch], now: int, grab: GrabPrediction,
                    end: int | None, completed: bool = True) -> None:
        """The brief's invariants for one pass, straight from the files (the model is not consulted)."""
        retention = self.cfg.delete_retention_ms
        before = {r[0]: (b, r) for b in pre for r in b.recs}
        after = {r[0]: (b, r) for b in actual for r in b.recs}
        assert set(after) <= set(before), "a pass never adds records"
        for o, (b, r) in after.items():
            assert r == before[o][1], f"record {o} changed"
        latest_offset: dict[bytes, int] = {}
        mapped: dict[bytes, int] = {}  # key -> its last offset in the pass's map range [first dirty, end)
        for o, (k, _v, _ts) in sorted(self.written.items()):
            latest_offset[k] = o
            if end is not None and grab.first_dirty <= o < end:
                mapped[k] = o
        for o in sorted(set(before) - set(after)):
            assert end is not None, "a record vanished without a cleaning pass"
            b, (_o, k, v, _ts) = before[o]
            assert o < end, f"record {o} at/after the end offset {end} of the pass was removed"
            if mapped.get(k, -1) > o:
                continue  # superseded by a later record of its key inside the map's range
            assert v is None, (f"value {o} of key {k!r} removed, but no later record of the key was mapped"
                               + (" (it was the key's latest value)" if latest_offset[k] == o else ""))
            # A tombstone goes once its horizon has passed, whether or not a later record of its key exists.
            assert b.horizon is not None, f"tombstone {o} removed by the pass that first copied it"
            assert now >= b.horizon, f"tombstone {o} removed at {now}, before its delete horizon {b.horizon}"
            self.removed_tombstones[o] = (b.horizon, now)
            event("tombstone removed")
        pre_h = {b.base: b.horizon for b in pre}
        for b in actual:
            if b.horizon is not None and pre_h[b.base] is None:
                assert b.horizon == now + retention, "the horizon is the cleaner clock + delete.retention.ms"
                assert any(r[2] is None for r in b.recs), "only a batch with a surviving tombstone gets a horizon"
            elif pre_h[b.base] is not None and b.recs:
                assert b.horizon == pre_h[b.base], "a horizon, once set, never moves"
        if end is not None and completed:
            # Compaction did its job: in [first dirty, end) only each key's last record there survives.
            for o in after:
                if grab.first_dirty <= o < end:
                    assert mapped[self.written[o][0]] == o, f"record {o} survived although its key was mapped later"

    def _after_crash(self, snapshot: dict[str, bytes], segs: list[SegView], pre: list[MBatch],
                     post: list[MBatch], grab: GrabPrediction, end: int, now: int) -> None:
        """Restore the disk to the moment of death, reopen unclean: each old segment is the old or the new."""
        self._drop()
        shutil.rmtree(self.path)
        for rel, data in snapshot.items():
            full = os.path.join(self.path, rel)
            os.makedirs(os.path.dirname(full), exist_ok=True)
            with open(full, "wb") as f:
                f.write(data)
        part = str(TP) + os.sep
        untouched = {n[len(part):]: d for n, d in snapshot.items() if n.startswith(part)}
        self._open()
        assert not self.logdir.had_clean_shutdown
        assert self.log.log_end_offset == self.leo, "no record lost"
        names = os.listdir(os.path.join(self.path, str(TP)))
        assert not [n for n in names if n.endswith((".cleaned", ".swap", ".deleted"))], names
        actual = self.actual()
        bounds = [s.base for s in segs] + [float("inf")]
        states, adopted = [], []
        for lo, hi in zip(bounds, bounds[1:]):
            got, old, new = by_region(actual, lo, hi), by_region(pre, lo, hi), by_region(post, lo, hi)
            assert got in (old, new), f"segment {lo} is neither the pre-pass nor the post-pass log: a mix"
            if old != new:
                states.append("new" if got == new else "old")
            adopted.extend(got)
        assert states == sorted(states, key=lambda s: s == "old"), f"groups are swapped oldest first: {states}"
        event(f"crash: new={states.count('new')} old={states.count('old')}")
        assert actual == adopted
        # The checkpoint moves only after the whole pass, so a pass that died left it where it was.
        assert self.manager.read_checkpoint().get(TP) == self.checkpoint
        for name, data in self.segment_files(grab.first_uncleanable, (".log",)).items():
            assert untouched.get(name) == data, f"{name}, in the uncleanable section, changed in a crash"
        self._check_pass(pre, actual, now, grab, end, completed=False)
        self.batches = actual
        self.crashes += 1

    # -- invariants -------------------------------------------------------------------------------

    @invariant()
    def log_equals_model(self) -> None:
        if self.logdir is None:
            return
        assert self.log.log_end_offset == self.leo
        actual = self.actual()
        assert actual == self.batches
        offsets = [r[0] for b in actual for r in b.recs]
        assert offsets == sorted(set(offsets)), "offsets only increase"
        bases = [b.base for b in actual]
        assert bases == sorted(set(bases))
        for b in actual:
            assert all(b.base <= r[0] <= b.last for r in b.recs)
            for o, k, v, ts in b.recs:
                assert self.written[o] == (k, v, ts), f"record {o} differs from what was written"

    @invariant()
    def latest_values_survive(self) -> None:
        if self.logdir is None:
            return
        present = {r[0]: r for b in self.batches for r in b.recs}
        latest: dict[bytes, int] = {}
        for o in sorted(self.written):
            latest[self.written[o][0]] = o
        for k, o in latest.items():
            key, value, _ts = self.written[o]
            if o in present:
                continue
            assert value is None, f"key {k!r}: latest value at offset {o} lost"
            horizon, removed_at = self.removed_tombstones[o]
            assert removed_at >= horizon

    @invariant()
    def consumers_see_the_latest_state(self) -> None:
        """Reading the log from its start gives, for every key, its latest value, and nothing for a key whose
        tombstone is gone: an older value must never reappear once a tombstone goes (no resurrection)."""
        if self.logdir is None:
            return
        view: dict[bytes, bytes | None] = {}
        truth: dict[bytes, bytes | None] = {}
        for b in self.batches:
            for _o, k, v, _ts in b.recs:
                view[k] = v
        for o in sorted(self.written):
            truth[self.written[o][0]] = self.written[o][1]
        assert {k: v for k, v in view.items() if v is not None} == {k: v for k, v in truth.items() if v is not None}

    @invariant()
    def cleaning_state(self) -> None:
        if self.logdir is None:
            return
        st_ = self.manager.state(TP)
        assert st_.state is not CleaningState.UNCLEANABLE, st_.reason
        assert st_.pause_count == self.paused


CompactionModel.TestCase.settings = settings(
    max_examples=120, stateful_step_count=60, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
TestCompactionModel = CompactionModel.TestCase
