"""A stateful test of `Log` against an in-memory model: appends, rolls, clean and unclean reopens,
truncation, log-start moves, reads and timestamp lookups, with the on-disk invariants checked after
every step (spec 2, 4, 5)."""

from __future__ import annotations

import os
import re
import shutil
import tempfile

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from shale.sidecar.log.compression import Compression
from shale.sidecar.log.errors import OffsetOutOfRangeError, RecordTooLargeError
from shale.sidecar.log.log import MAX_TIMESTAMP, Log
from shale.sidecar.log.records import Record, decode_batch, encode_batch
from support.logtest_util import T0, FakeClock, make_config, segment_batches

FILE_NAME = re.compile(r"^(\d{20})\.(log|index|timeindex)(\.deleted)?$")
CODECS = [Compression.NONE] * 4 + [Compression.GZIP, Compression.SNAPPY, Compression.LZ4, Compression.ZSTD]

record_st = st.tuples(st.sampled_from([b"a", b"b", b"c", None]), st.none() | st.binary(max_size=60),
                      st.integers(-500, 500))
# One-record appends done before a rule's action, so that every kind of step also grows the log.
pre_st = st.lists(st.tuples(st.integers(T0, T0 + 100_000), st.binary(max_size=40)), max_size=6)
batch_st = st.tuples(st.sampled_from(CODECS), st.integers(T0, T0 + 100_000), st.lists(record_st, min_size=1, max_size=5))


class LogModel(RuleBasedStateMachine):
    """The model: a list of batches [(base, last, [(offset, key, value, ts)])], the log end and the log start."""

    def __init__(self) -> None:
        super().__init__()
        self.tmp = tempfile.mkdtemp(prefix="shale-model-")
        self.dir = os.path.join(self.tmp, "model-0")
        self.clock = FakeClock()
        self.log: Log | None = None

    # -- setup / teardown -------------------------------------------------------------------------

    @initialize(segment_bytes=st.integers(250, 1200), interval=st.integers(0, 400),
                index_bytes=st.sampled_from([60, 96, 240, 4096]),
                flush=st.sampled_from([1, 5, 2**63 - 1, 2**63 - 1]),
                segment_ms=st.sampled_from([30_000, 604_800_000]), preallocate=st.booleans())
    def setup(self, segment_bytes, interval, index_bytes, flush, segment_ms, preallocate) -> None:
        self.cfg = make_config({
            "segment.bytes": segment_bytes, "index.interval.bytes": interval, "segment.index.bytes": index_bytes,
            "flush.messages": flush, "segment.ms": segment_ms, "preallocate": preallocate,
            "file.delete.delay.ms": 0,
        })
        self.log = Log(self.dir, self.cfg, clock=self.clock)
        self.batches: list[tuple[int, int, list[tuple[int, bytes | None, bytes | None, int]]]] = []
        self.leo = 0
        self.start = 0

    def teardown(self) -> None:
        if self.log is not None:
            self._drop()
        shutil.rmtree(self.tmp, ignore_errors=True)

    def _drop(self) -> None:
        for seg in self.log.segments:
            seg.close_handles()
        for _t, seg in self.log._pending_deletes:
            seg.close_handles()

    def _read_every_batch(self) -> None:
        """Every record of the model is served by `Log.read` at its offset (after a reload, via the loaded
        or rebuilt indexes)."""
        for base, last, recs in self.batches:
            if last < self.start:
                continue
            for offset in {max(base, self.start), last}:
                raw = self.log.read(offset, 1, min_one_message=True).read()
                got = decode_batch(raw[: 12 + int.from_bytes(raw[8:12], "big")])
                assert [(r.offset, r.key, r.value, r.timestamp) for r in got.records] == recs

    @property
    def records(self):
        return [r for _b, _l, recs in self.batches for r in recs]

    # -- rules --------------------------------------------------------------------------------------

    @rule(batches=st.lists(batch_st, min_size=1, max_size=3))
    def append(self, batches) -> None:
        self._append(batches)

    @rule(appends=st.lists(st.tuples(st.integers(T0, T0 + 100_000), st.binary(max_size=40)), min_size=1,
                           max_size=15))
    def append_burst(self, appends) -> None:
        """Many one-record appends, as a producer with linger.ms=0 sends them: segments fill and roll."""
        self._burst(appends)

    def _burst(self, appends) -> None:
        for ts, value in appends:
            self._append([(Compression.NONE, ts, [(b"k", value, 0)])])

    def _append(self, batches) -> None:
        parts, expected = [], []
        off = self.leo
        for codec, base_ts, recs in batches:
            records = [Record(i, base_ts + dts, k, v) for i, (k, v, dts) in enumerate(recs)]
            parts.append(encode_batch(records, compression=codec))
            expected.append((off, off + len(records) - 1, [(off + i, r.key, r.value, r.timestamp)
                                                           for i, r in enumerate(records)]))
            off += len(records)
        data = b"".join(parts)
        self.clock.sleep(7)
        if len(data) > self.cfg.segment_bytes:
            with pytest.raises(RecordTooLargeError):
                self.log.append(data)
            return
        info = self.log.append(data)
        assert (info.first_offset, info.last_offset) == (self.leo, off - 1)
        assert info.max_timestamp == max(r[3] for _b, _l, recs in expected for r in recs)
        self.batches += expected
        self.leo = off
        if self.cfg.flush_messages == 1:
            assert self.log.recovery_point == self.leo

    @rule(pre=pre_st)
    def roll(self, pre) -> None:
        self._burst(pre)
        self.log.roll()
        assert self.log.active_segment.base_offset == self.leo
        assert self.log.recovery_point == self.leo, "a roll flushes up to the new segment's base"

    @rule(pre=pre_st)
    def reopen_clean(self, pre) -> None:
        self._burst(pre)
        self.log.close()
        assert self.log.recovery_point == self.leo
        for seg in self.log.segments:  # everything trimmed
            assert os.path.getsize(seg.offset_index.path) == 8 * seg.offset_index.entries
            assert os.path.getsize(seg.time_index.path) == 12 * seg.time_index.entries
            assert os.path.getsize(seg.log_path) == seg.size
        self.log = Log(self.dir, self.cfg, recovery_point=self.leo, log_start_offset=self.start,
                       had_clean_shutdown=True, clock=self.clock)
        assert self.log.bytes_truncated_on_load == 0
        self._read_every_batch()

    @rule(pre=pre_st, from_checkpoint=st.booleans(), closed_first=st.booleans())
    def reopen_unclean(self, pre, from_checkpoint, closed_first) -> None:
        self._burst(pre)
        rp = self.log.recovery_point if from_checkpoint else 0
        if closed_first:
            self.log.close()
        else:
            self._drop()  # a crash: no flush, no trim, nothing closed
        self.log = Log(self.dir, self.cfg, recovery_point=rp, log_start_offset=self.start,
                       had_clean_shutdown=False, clock=self.clock)
        if not self.cfg.preallocate or closed_first:
            assert self.log.bytes_truncated_on_load == 0, "nothing was torn"
        assert self.log.recovery_point == min(rp, self.leo)
        self._read_every_batch()

    @rule(pre=pre_st, data=st.data())
    def truncate(self, pre, data) -> None:
        self._burst(pre)
        if data.draw(st.integers(0, 2), label="skip"):
            return  # rarer than appends
        target = data.draw(st.integers(0, self.leo + 2), label="truncate_to")
        first_base = self.log.segments[0].base_offset
        self.log.truncate_to(target)
        if target >= self.leo:
            return
        if target < first_base:
            self.batches, self.leo, self.start = [], target, target
            return
        kept = [b for b in self.batches if b[1] < target]
        # The batch holding `target` goes whole; the log end is where the remaining data ends.
        self.leo = self.batches[len(kept)][0] if len(kept) < len(self.batches) else self.leo
        self.batches = kept
        self.start = min(self.start, self.leo)

    @rule(pre=pre_st, gap=st.integers(0, 30), act=st.integers(0, 3))
    def truncate_fully_and_start_at(self, pre, gap, act) -> None:
        self._burst(pre)
        if act:  # rarer than the other rules, so that logs grow several segments
            return
        self.log.truncate_fully_and_start_at(self.leo + gap)
        self.batches, self.leo, self.start = [], self.leo + gap, self.leo + gap

    @rule(pre=pre_st, data=st.data())
    def increment_log_start_offset(self, pre, data) -> None:
        self._burst(pre)
        target = data.draw(st.integers(self.start, self.leo), label="new_start")
        self.log.increment_log_start_offset(target)
        self.start = target

    @rule(pre=pre_st)
    def delete_expired_files(self, pre) -> None:
        self._burst(pre)
        self.log.delete_expired_files()
        assert not [n for n in os.listdir(self.dir) if n.endswith(".deleted")]

    @rule(data=st.data())
    def read(self, data) -> None:
        offset = data.draw(st.integers(max(self.start - 2, -1), self.leo + 2), label="read_at")
        if offset < self.start or offset > self.leo:
            with pytest.raises(OffsetOutOfRangeError):
                self.log.read(offset, 100)
            return
        sl = self.log.read(offset, data.draw(st.integers(1, 3000)), min_one_message=True)
        if offset == self.leo:
            assert sl is None
            return
        raw = sl.read()
        size = 12 + int.from_bytes(raw[8:12], "big")
        got = decode_batch(raw[:size])
        want = next(b for b in self.batches if b[1] >= offset)
        assert (got.header.base_offset, got.header.last_offset) == want[:2]
        assert [(r.offset, r.key, r.value, r.timestamp) for r in got.records] == want[2]

    @rule(data=st.data())
    def offset_for_timestamp(self, data) -> None:
        recs = self.records
        choices = [st.integers(T0 - 1000, T0 + 101_000)]
        if recs:
            choices.append(st.sampled_from([r[3] + d for r in recs for d in (-1, 0, 1)]))
        for target in data.draw(st.lists(st.one_of(*choices), min_size=1, max_size=5), label="targets"):
            got = self.log.offset_for_timestamp(target)
            assert got == self._kafka_answer(target), target
            if all(r[0] >= self.start for r in recs):
                # With nothing below the log start, that is simply the first record at or after the target.
                assert got == next(((r[0], r[3]) for r in recs if r[3] >= target), None)

    def _kafka_answer(self, target: int):
        """UnifiedLog.searchOffsetInLocalLog: the first segment whose largest timestamp >= target, then in it
        the first record with timestamp >= target at or after the log start offset."""
        bases = [s.base_offset for s in self.log.segments]
        recs = self.records
        for i, base in enumerate(bases):
            end = bases[i + 1] if i + 1 < len(bases) else 2**63
            in_seg = [r for r in recs if base <= r[0] < end]
            if not in_seg:
                assert i == len(bases) - 1, "only the active segment can be empty"
                return None  # its largest timestamp is the file's mtime: chosen, holds nothing
            if max(r[3] for r in in_seg) >= target:
                return next(((r[0], r[3]) for r in in_seg if r[3] >= target and r[0] >= self.start), None)
        return None

    # -- invariants -----------------------------------------------------------------------------------

    @invariant()
    def offsets_and_points(self) -> None:
        if self.log is None:
            return
        assert self.log.log_end_offset == self.leo
        assert self.log.log_start_offset == self.start
        assert self.start <= self.leo
        assert 0 <= self.log.recovery_point <= self.leo

    @invariant()
    def files_hold_the_model(self) -> None:
        if self.log is None:
            return
        segs = self.log.segments
        bases = [s.base_offset for s in segs]
        assert bases == sorted(set(bases))
        assert bases[0] <= self.start
        got = []
        for i, seg in enumerate(segs):
            batches = segment_batches(seg)
            end = bases[i + 1] if i + 1 < len(segs) else self.leo + 1
            for _pos, b in batches:
                assert seg.base_offset <= b.header.base_offset and b.header.last_offset < end
                got.append((b.header.base_offset, b.header.last_offset,
                            [(r.offset, r.key, r.value, r.timestamp) for r in b.records]))
            if i < len(segs) - 1:
                assert batches, "only the active segment may be empty"
            self._check_indexes(seg, [(p, b.header) for p, b in batches], active=(i == len(segs) - 1))
        assert got == self.batches

    def _check_indexes(self, seg, batches, active: bool) -> None:
        positions = {p: j for j, (p, _h) in enumerate(batches)}
        oi, ti = seg.offset_index, seg.time_index
        last_off, last_pos = -1, -1
        for k in range(oi.entries):
            off, pos = oi.entry(k)
            assert off > last_off and pos > last_pos, "entries strictly increase"
            last_off, last_pos = off, pos
            assert pos in positions, f"index entry {k} of {seg} points inside a batch"
            j = positions[pos]
            assert batches[j][1].base_offset <= off <= batches[-1][1].last_offset
            if j:
                assert batches[j - 1][1].last_offset < off, "a lookup would skip data"
        by_last = {h.last_offset: j for j, (_p, h) in enumerate(batches)}
        last_ts, last_o = -1, -1
        for k in range(ti.entries):
            ts, off = ti.entry(k)
            assert ts > last_ts and off >= last_o
            last_ts, last_o = ts, off
            assert off in by_last, f"time index entry {k} of {seg} is not a batch's last offset"
            j = by_last[off]
            assert batches[j][1].max_timestamp == ts
            assert all(h.max_timestamp < ts for _p, h in batches[:j]), "not the first batch with that maximum"
        if batches:
            top = max(h.max_timestamp for _p, h in batches)
            first = next(h.last_offset for _p, h in batches if h.max_timestamp == top)
            assert seg.max_timestamp_and_offset == (top, first)
            if not active:
                assert ti.last_entry == (top, first), "the roll entry is the segment's max"
        max_size = self.cfg.segment_index_bytes
        if active:
            assert os.path.getsize(oi.path) == max_size - max_size % 8
            assert os.path.getsize(ti.path) == max_size - max_size % 12
            assert os.path.getsize(seg.log_path) >= seg.size
        else:
            assert os.path.getsize(oi.path) == 8 * oi.entries
            assert os.path.getsize(ti.path) == 12 * ti.entries
            assert os.path.getsize(seg.log_path) == seg.size

    @invariant()
    def file_names(self) -> None:
        if self.log is None:
            return
        live = set()
        for seg in self.log.segments:
            for ext in ("log", "index", "timeindex"):
                live.add(f"{seg.base_offset:020d}.{ext}")
        names = os.listdir(self.dir)
        for n in names:
            m = FILE_NAME.match(n)
            assert m, n
            if not m.group(3):
                assert n in live, f"stray file {n}"
        assert live <= set(names)

    @invariant()
    def max_timestamp_lookup(self) -> None:
        if self.log is None:
            return
        got = self.log.offset_for_timestamp(MAX_TIMESTAMP)
        if not self.batches:
            assert got is None
            return
        top = max(r[3] for r in self.records)
        first_batch = next(b for b in self.batches if max(r[3] for r in b[2]) == top)
        assert got == (first_batch[1], top)


LogModel.TestCase.settings = settings(
    max_examples=50, stateful_step_count=40, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
TestLogModel = LogModel.TestCase
