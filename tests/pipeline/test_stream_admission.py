"""The stream reader's admission control driven the way Spark drives it (initialOffset, then latestOffset
and partitions per trigger), over a real data directory the engine keeps appending to: minOffsetsPerTrigger
holds triggers back until enough offsets wait or maxTriggerDelay has passed (Spark's rule), AvailableNow
ignores it, and maxRecordsPerPartition caps each task of a micro-batch. No Spark needed: the reader's
contract is Python's, and the clock is the test's."""

from __future__ import annotations

import pytest
from pyspark.sql.streaming.datasource import ReadAllAvailable

from shale.pipeline.options import OptionError, SourceOptions
from shale.pipeline.stream_reader import ShaleStreamReader
from shale.sidecar.log.log_dir import LogDir
from shale.sidecar.log.records import Record, encode_batch
from shale.sidecar.log.topic_partition import TopicPartition
from shale.sidecar.topic_config import TopicConfig

HOUR_S = 3600.0


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def topic(tmp_path):
    """A live data directory with topic `t` (2 partitions) and an `append(n)` that writes n records to each."""
    d = LogDir(str(tmp_path / "data"), lambda name: TopicConfig.from_mapping({}))
    logs = [d.get_or_create(TopicPartition("t", p)) for p in (0, 1)]

    def append(n: int) -> None:
        for log in logs:
            start = log.log_end_offset
            log.append(encode_batch([Record(i, 1_700_000_000_000, b"k", b"v") for i in range(n)]))
            assert log.log_end_offset == start + n

    yield d.path, append
    d.close()


def reader(path: str, clock: Clock, **options) -> ShaleStreamReader:
    opts = SourceOptions.parse({"path": path, "subscribe": "t", "startingOffsets": "earliest", **options},
                               streaming=True)
    return ShaleStreamReader(opts, clock=clock)


def waiting(start: dict, end: dict) -> int:
    return sum(end["t"][p] - start["t"][p] for p in end["t"])


def test_min_offsets_per_trigger_waits_for_enough_offsets_or_the_delay(topic):
    path, append = topic
    clock = Clock()
    r = reader(path, clock, minOffsetsPerTrigger="100", maxTriggerDelay="1h")
    start = r.initialOffset()
    assert start == {"t": {"0": 0, "1": 0}}
    append(10)
    end = r.latestOffset(start, r.getDefaultReadLimit())
    assert waiting(start, end) == 20, "the first trigger always runs (Spark's lastTriggerMillis starts at 0)"

    start = end
    append(30)  # 60 waiting: fewer than 100
    assert r.latestOffset(start, ReadAllAvailable()) == start, "held back: Spark runs no micro-batch"
    clock.now += HOUR_S - 1
    assert r.latestOffset(start, ReadAllAvailable()) == start
    clock.now += 1  # maxTriggerDelay since the last trigger: it runs with what there is
    end = r.latestOffset(start, ReadAllAvailable())
    assert waiting(start, end) == 60

    start = end
    append(50)  # 100 waiting: enough at once, whatever the clock says
    end = r.latestOffset(start, ReadAllAvailable())
    assert waiting(start, end) == 100
    assert [(p.range.partition, p.range.start, p.range.end) for p in r.partitions(start, end)] == [
        (0, 40, 90), (1, 40, 90)]

    start = end
    append(5)
    assert r.latestOffset(start, ReadAllAvailable()) == start
    r.prepareForTriggerAvailableNow()  # AvailableNow reads what is there and stops: no holding back
    assert waiting(start, r.latestOffset(start, ReadAllAvailable())) == 10
    r.stop()


def test_without_min_offsets_every_trigger_takes_what_waits(topic):
    path, append = topic
    r = reader(path, Clock())
    start = r.initialOffset()
    for n in (1, 7):
        append(n)
        end = r.latestOffset(start, r.getDefaultReadLimit())
        assert waiting(start, end) == 2 * n
        start = end
    r.stop()


def test_max_records_per_partition_caps_each_task_of_a_micro_batch(topic):
    path, append = topic
    append(25)
    r = reader(path, Clock(), maxRecordsPerPartition="10")
    start = r.initialOffset()
    end = r.latestOffset(start, r.getDefaultReadLimit())
    tasks = [(p.range.partition, p.range.start, p.range.end) for p in r.partitions(start, end)]
    assert tasks == [(0, 0, 8), (0, 8, 16), (0, 16, 25), (1, 0, 8), (1, 8, 16), (1, 16, 25)]
    r.stop()


def test_a_stream_starts_where_the_offset_options_say(topic):
    """startingOffsets per partition (-2 earliest, -1 latest; every partition named, as Spark requires)."""
    path, append = topic
    append(12)
    assert reader(path, Clock(), startingOffsets='{"t": {"0": 5, "1": -1}}').initialOffset() == {"t": {"0": 5, "1": 12}}
    with pytest.raises(OptionError, match="you must specify all TopicPartitions.*Specified: t-0. Assigned: t-0, t-1"):
        reader(path, Clock(), startingOffsets='{"t": {"0": 5}}').initialOffset()
    assert reader(path, Clock(), startingOffsets='{"t": {"0": -1, "1": -2}}').initialOffset() == {"t": {"0": 12, "1": 0}}
    assert reader(path, Clock(), startingTimestamp=str(1_700_000_000_000)).initialOffset() == {"t": {"0": 0, "1": 0}}
    with pytest.raises(OptionError, match="no record at or after timestamp 1800000000000"):
        reader(path, Clock(), startingTimestamp=str(1_800_000_000_000)).initialOffset()
