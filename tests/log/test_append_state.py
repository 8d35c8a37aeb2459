"""The C append reads and writes only the state append_state.py declares.

`declare_state` takes the declared classes once (log.py, at import); a field the C code names that a class does
not declare as a slot is refused there, and a refused declaration leaves the one in force unchanged. The C append
refuses an object that is not of its declared class, and a log's limits follow its config.
"""

from __future__ import annotations

import pytest

from shale.sidecar.log._append_kernel import declare_state
from shale.sidecar.log.append_state import (
    AppendLimits,
    EpochCacheAppendState,
    IndexAppendState,
    LogAppendState,
    SegmentAppendState,
)
from shale.sidecar.log.log import Log, append_in_c_call
from shale.sidecar.log.records import Record, encode_batch
from shale.sidecar.topic_config import TopicConfig

NOW = 1_800_000_000_000


def _batch() -> bytes:
    return bytes(encode_batch([Record(0, NOW, b"k", b"v")]))


def _log(tmp_path) -> Log:
    return Log(str(tmp_path / "t-0"), TopicConfig.from_mapping({}), clock=lambda: NOW)


def test_a_field_the_c_append_names_must_be_a_declared_slot_and_a_refusal_changes_nothing(tmp_path):
    log = _log(tmp_path)
    log.append(_batch())  # a segment's first batch is Python's

    class SegmentAppendState:  # the name declare_state checks
        __slots__ = ("file", "base_offset")
        size = 0  # a class attribute, not a slot

    rest = (IndexAppendState, EpochCacheAppendState, AppendLimits)
    with pytest.raises(TypeError, match="not a slot"):
        declare_state(LogAppendState, SegmentAppendState, *rest)
    del SegmentAppendState.size
    with pytest.raises(AttributeError):
        declare_state(LogAppendState, SegmentAppendState, *rest)
    with pytest.raises(TypeError, match="not AppendLimits"):
        declare_state(LogAppendState, SegmentAppendState, IndexAppendState, EpochCacheAppendState, dict)
    info = log.append_in_c(_batch())
    assert info is not None and info.first_offset == 1 and log.log_end_offset == 2
    assert log.active_segment.size == 2 * len(_batch())


def test_the_c_append_refuses_what_is_not_a_declared_log(tmp_path):
    class Pretender:
        lock = None

    with pytest.raises(TypeError, match="LogAppendState"):
        append_in_c_call()(Pretender(), _batch(), False)


def test_a_logs_limits_follow_its_config(tmp_path):
    log = _log(tmp_path)
    assert log.limits == AppendLimits.of(log.config)
    log.config = TopicConfig.from_mapping({"cleanup.policy": "compact", "segment.ms": "1000",
                                           "max.compaction.lag.ms": "500", "message.timestamp.type": "LogAppendTime"})
    assert (log.limits.compact, log.limits.max_segment_ms, log.limits.create_time) == (True, 500, False)
    assert log.max_segment_ms == 500
    log.config = TopicConfig.from_mapping({"cleanup.policy": "compact", "segment.ms": "1000",
                                           "max.compaction.lag.ms": "5000"})
    assert (log.limits.max_segment_ms, log.limits.create_time) == (1000, True)
    assert isinstance(log, LogAppendState) and isinstance(log.active_segment, SegmentAppendState)
