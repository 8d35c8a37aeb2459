"""The coordinator runtime (docs/coordinator-runtime.md): loading on election and unloading on resignation, once for
both coordinators, and the two partition writers — each test named after a case of the page's failure table."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shale.sidecar.log.errors import LogError
from shale.sidecar.log.log_dir import LogDir
from shale.sidecar.log.records import Record, encode_batch
from shale.sidecar.log.topic_partition import TopicPartition
from shale.sidecar.protocol.error_codes import NONE, NOT_LEADER_OR_FOLLOWER
from shale.sidecar.replication.replica_manager import ReplicaManager
from shale.sidecar.server.coordinator.runtime import LedPartitions, LocalPartitionWriter, ReplicatedPartitionWriter
from shale.sidecar.topic_config import TopicConfig
from shale.sidecar.topics.registry import NodeAddress, TopicRegistry

TOPIC = "__consumer_offsets"


class Coordinator:
    """What a coordinator gives the runtime: its load and unload of one partition, recorded in order."""

    def __init__(self, local: set[int]) -> None:
        self.logs = {TopicPartition(TOPIC, p): object() for p in local}
        self.calls: list[tuple[str, int]] = []
        self.led = LedPartitions(TOPIC, "group", self.logs, load=self.load, unload=self.unload)  # type: ignore[arg-type]

    def load(self, p: int) -> tuple[int, int]:
        self.calls.append(("load", p))
        return 1, 3

    def unload(self, p: int) -> int:
        self.calls.append(("unload", p))
        return 1


def test_a_led_partition_with_a_local_replica_is_loaded_in_its_epoch():
    c = Coordinator({0, 1})
    assert c.led.follow({0: 4, 1: 2}) == [0, 1]
    assert (c.led.epoch(0), c.led.epoch(1), c.led.epoch(2)) == (4, 2, None)
    assert c.led.follow({0: 4, 1: 2}) == [] and c.calls == [("load", 0), ("load", 1)]  # loaded once


def test_a_resigned_partition_is_unloaded():
    c = Coordinator({0, 1})
    c.led.follow({0: 4, 1: 2})
    assert c.led.follow({1: 2}) == []
    assert c.calls[2:] == [("unload", 0)] and c.led.epoch(0) is None and c.led.epoch(1) == 2


def test_leadership_back_in_a_newer_epoch_unloads_then_loads_again_from_the_log():
    c = Coordinator({0})
    c.led.follow({0: 4})
    assert c.led.follow({0: 6}) == [0]
    assert c.calls == [("load", 0), ("unload", 0), ("load", 0)] and c.led.epoch(0) == 6


def test_a_led_partition_whose_replica_is_not_here_yet_is_loaded_once_it_arrives():
    c = Coordinator(set())
    assert c.led.follow({0: 1}) == [] and c.calls == []
    c.logs[TopicPartition(TOPIC, 0)] = object()
    assert c.led.follow({0: 1}) == [0]


@given(st.lists(st.dictionaries(st.integers(0, 5), st.integers(0, 3), max_size=6), max_size=8),
       st.sets(st.integers(0, 5)))
def test_after_any_elections_the_loaded_partitions_are_those_led_here_in_their_epochs(rounds, local):
    """The model: after each `follow`, exactly the led partitions with a local replica are loaded, each in the
    epoch it is led in; every partition is unloaded before it is loaded again, and never loaded twice in a row."""
    c = Coordinator(local)
    for led in rounds:
        c.led.follow(led)
        assert c.led.epochs == {p: e for p, e in led.items() if p in local}
    state: dict[int, bool] = {}
    for call, p in c.calls:
        assert state.get(p, False) is (call == "unload")
        state[p] = call == "load"


def _batch() -> bytes:
    return encode_batch([Record(offset=0, timestamp=1, key=b"k", value=b"v")], base_offset=0)


def test_the_local_writer_wakes_the_fetches_of_the_partition_it_appended_to_and_commits_at_once(tmp_path: Path):
    log_dir = LogDir(str(tmp_path), lambda _topic: TopicConfig.from_mapping({}))
    tp = TopicPartition(TOPIC, 3)
    log = log_dir.get_or_create(tp)
    woken: list[TopicPartition] = []
    writer = LocalPartitionWriter(woken.append)
    info = writer.append(tp, log, _batch())
    assert (info.last_offset, log.log_end_offset, woken) == (0, 1, [tp])
    assert asyncio.run(writer.replicated(tp, 0)) == NONE
    log_dir.close()


def test_an_append_to_a_partition_not_led_here_is_refused_and_wakes_nothing(tmp_path: Path):
    """The replicated writer: a coordinator's write to a partition this node does not lead (any more) raises
    LogError naming it, appends nothing, and waiting for its replication answers NOT_LEADER_OR_FOLLOWER."""
    log_dir = LogDir(str(tmp_path), lambda _topic: TopicConfig.from_mapping({}))
    registry = TopicRegistry(log_dir, NodeAddress(7, "127.0.0.1", 9000))
    tp = TopicPartition(TOPIC, 3)
    log = log_dir.get_or_create(tp)
    woken: list[TopicPartition] = []
    writer = ReplicatedPartitionWriter(ReplicaManager(registry), 7, woken.append)
    with pytest.raises(LogError, match=r"__consumer_offsets-3 is not led by node 7"):
        writer.append(tp, log, _batch())
    assert (log.log_end_offset, woken) == (0, [])
    assert asyncio.run(writer.replicated(tp, 0)) == NOT_LEADER_OR_FOLLOWER
    log_dir.close()
