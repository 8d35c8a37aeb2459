"""The free-space floor's decision (sidecar/log/free_space.py): which floor, when a sample is taken, what is refused.

The filesystem and the clock are fakes here; tests/server/test_disk_reserve.py fills a real tmpfs under load.
"""

from __future__ import annotations

import logging
import math
import os

from hypothesis import given
from hypothesis import strategies as st

from shale.sidecar.log.free_space import REFUSAL_LOG_INTERVAL_MS, SAMPLE_INTERVAL_MS, DirSpace, FreeFloor

BLOCK = 4096


class FakeFs:
    """statvfs of a filesystem of `total` bytes with `free` free, counting the calls."""

    def __init__(self, total: int, free: int) -> None:
        self.total, self.free, self.calls = total, free, 0

    def __call__(self, path: str) -> os.statvfs_result:
        self.calls += 1
        blocks, avail = self.total // BLOCK, self.free // BLOCK
        return os.statvfs_result((BLOCK, BLOCK, blocks, avail, avail, 0, 0, 0, 0, 255))


class Clock:
    def __init__(self) -> None:
        self.ms = 1_000

    def __call__(self) -> int:
        return self.ms


def space(total: int, free: int, floor: FreeFloor) -> tuple[DirSpace, FakeFs, Clock]:
    fs, clock = FakeFs(total, free), Clock()
    return DirSpace("/data/d0", floor, clock=clock, statvfs=fs), fs, clock


@given(st.integers(0, 1 << 40), st.floats(0, 0.9), st.integers(0, 1 << 44))
def test_the_floor_is_the_larger_of_bytes_and_ratio(min_bytes, ratio, total):
    floor = FreeFloor(min_bytes, ratio)
    assert floor.bytes_for(total) == max(min_bytes, math.ceil(ratio * total))
    assert floor.off == (min_bytes == 0 and ratio == 0)


def test_the_defaults_keep_five_percent():
    from shale.sidecar.server_config import ServerConfig

    config = ServerConfig.from_mapping({})
    assert config.free_floor() == FreeFloor(0, 0.05)
    assert ServerConfig.from_mapping({"log.dir.min.free.ratio": "0"}).free_floor().off


def test_no_floor_never_reads_the_filesystem():
    s, fs, _ = space(1 << 30, 0, FreeFloor())
    assert s.has_room() and s.produce_refusal("t-0", 1 << 20) is None
    assert fs.calls == 0


@given(st.lists(st.tuples(st.integers(0, 3 * SAMPLE_INTERVAL_MS), st.integers(0, 64), st.integers(0, 8 * BLOCK),
                          st.booleans()), max_size=60))
def test_produce_is_refused_exactly_when_its_bytes_would_leave_less_than_the_floor(steps):
    """Any run of time, free space, request sizes and questions. Each answer is the floor against the last sample
    less the bytes admitted since; a new sample is read exactly when the last is SAMPLE_INTERVAL_MS old or, so
    counted, leaves less than twice the floor. A follower's question (`has_room`) admits nothing."""
    total, floor = 64 * BLOCK, FreeFloor(16 * BLOCK)
    s, fs, clock = space(total, total, floor)
    sampled_at, sampled_free, admitted, samples = None, 0, 0, 0
    for advance, free_blocks, size, produce in steps:
        clock.ms += advance
        fs.free = free_blocks * BLOCK
        if (sampled_at is None or sampled_free - admitted < 2 * floor.bytes_for(total)
                or clock.ms - sampled_at >= SAMPLE_INTERVAL_MS):
            sampled_at, sampled_free, admitted = clock.ms, fs.free, 0
            samples += 1
        fits = sampled_free - admitted - size >= floor.bytes_for(total)
        if produce:
            refused = s.produce_refusal("t-0", size)
            assert (refused is None) == fits
            if refused is None:
                admitted += size
            else:
                assert refused[0].startswith(f"t-0: log dir /data/d0 has {sampled_free - admitted} bytes free; "
                                             f"{size} more would leave less than its floor of {16 * BLOCK} bytes")
        else:
            assert s.has_room(size) == fits
        assert s.last is not None and s.last.at_ms == sampled_at and fs.calls == samples


def test_refusals_name_the_partition_and_dir_and_are_logged_once_per_interval(caplog):
    s, fs, clock = space(100 * BLOCK, 10 * BLOCK, FreeFloor(20 * BLOCK))  # near the floor: sampled at each question
    caplog.set_level(logging.WARNING, logger="shale.sidecar.log.free_space")
    first = s.produce_refusal("prices-3", 100)
    assert first is not None and first[1]
    assert first[0].startswith(f"prices-3: log dir /data/d0 has {10 * BLOCK} bytes free; 100 more would leave "
                               f"less than its floor of {20 * BLOCK} bytes")
    answers = []
    for _ in range(5):
        clock.ms += REFUSAL_LOG_INTERVAL_MS // 4
        answers.append(s.produce_refusal("prices-3", 100))
    assert [a[1] for a in answers] == [False, False, False, True, False]  # one line per interval
    assert "(4 refused in this dir since the last such line)" in answers[3][0]
    assert s.refused == 6
    fs.free = 50 * BLOCK
    clock.ms += SAMPLE_INTERVAL_MS
    assert s.produce_refusal("prices-3", 100) is None and s.has_room()
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2, lines  # under the floor once, above it again once
    assert "at its floor" in lines[0] and "/data/d0" in lines[0] and s.refusing is False
    assert "accepted again (6 refused meanwhile)" in lines[1]


def test_an_unreadable_filesystem_does_not_refuse(caplog):
    def broken(path: str) -> os.statvfs_result:
        raise OSError(5, "Input/output error", path)

    s = DirSpace("/data/d0", FreeFloor(1 << 20), statvfs=broken)
    assert s.has_room() and s.produce_refusal("t-0", 100) is None
    assert "cannot read its free space" in caplog.text
