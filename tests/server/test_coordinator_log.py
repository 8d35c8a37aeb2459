"""The coordinators' internal topic (`coordinator_log`): declared with the setting's partition count when new and
with the count on disk after (a warning names the topic and the setting); the load walk over a real log gives
every batch from the log start to its end exactly once, records below a log start inside a batch left out,
whatever size each read has (a read that ends inside a batch is read again from that batch) and however the
batches fall into segments."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from shale.sidecar.log.log import Log
from shale.sidecar.log.log_dir import LogDir
from shale.sidecar.log.records import ControlType, Record, encode_batch, end_txn_marker_batch, parse_control_key
from shale.sidecar.server.coordinator.coordinator_log import declare_internal_topic, loaded_batches
from shale.sidecar.topic_config import TopicConfig
from shale.sidecar.topics.registry import NodeAddress, TopicRegistry

# A batch: a list of (key, value) data records, or the ControlType of a transaction marker.
batch_plans = st.lists(
    st.one_of(
        st.lists(st.tuples(st.binary(min_size=1, max_size=8), st.one_of(st.none(), st.binary(max_size=40))),
                 min_size=1, max_size=4),
        st.sampled_from([ControlType.COMMIT, ControlType.ABORT]),
    ),
    min_size=1, max_size=12,
)


@settings(max_examples=60, deadline=None)
@given(plans=batch_plans, segment_bytes=st.sampled_from([256, 1024, 1 << 20]), read_bytes=st.integers(1, 400),
       start=st.floats(0, 1))
def test_every_batch_once_from_the_log_start(tmp_path_factory, plans, segment_bytes, read_bytes, start):
    log = Log(str(tmp_path_factory.mktemp("walk") / "__consumer_offsets-0"),
              TopicConfig.from_mapping({"segment.bytes": str(segment_bytes)}), clock=lambda: 1000)
    try:
        data, markers, offset = [], [], 0
        for plan in plans:
            if isinstance(plan, ControlType):
                log.append(end_txn_marker_batch(7, 0, plan, 1000))
                markers.append((offset, plan))
                offset += 1
            else:
                log.append(encode_batch([Record(i, 1000, k, v) for i, (k, v) in enumerate(plan)],
                                        producer_id=7, producer_epoch=0, is_transactional=True))
                data += [(offset + i, k, v) for i, (k, v) in enumerate(plan)]
                offset += len(plan)
        first = int(start * offset)
        log.increment_log_start_offset(first)

        seen_data, seen_markers = [], []
        for batch in loaded_batches(log, read_bytes):
            assert batch.header.next_offset > first
            if batch.header.is_control:
                seen_markers += [(r.offset, parse_control_key(r.key)) for r in batch.records()]
            else:
                seen_data += [(r.offset, r.key, r.value) for r in batch.records()]
                assert all(batch.where(r) == f"__consumer_offsets-0 offset {r.offset}" for r in batch.records())

        assert seen_data == [d for d in data if d[0] >= first]
        assert seen_markers == [m for m in markers if m[0] >= first]
    finally:
        log.close()


def test_the_partition_count_on_disk_wins_over_the_setting(tmp_path, caplog):
    config = {"cleanup.policy": "compact"}

    def declare(partitions: int) -> tuple[int, list[int]]:
        log_dir = LogDir(str(tmp_path / "data"), lambda _t: TopicConfig.from_mapping(config))
        try:
            registry = TopicRegistry(log_dir, NodeAddress(0, "broker0", 9092))
            used = declare_internal_topic(registry, "__transaction_state", partitions, config,
                                          "transaction.state.log.num.partitions")
            assert registry.topics["__transaction_state"].internal
            return used, sorted(tp.partition for tp in log_dir.logs if tp.topic == "__transaction_state")
        finally:
            log_dir.close()

    assert declare(5) == (5, [0, 1, 2, 3, 4])
    assert "keeping them" not in caplog.text
    assert declare(3) == (5, [0, 1, 2, 3, 4])
    assert ("__transaction_state has 5 partitions on disk; keeping them (transaction.state.log.num.partitions is 3)"
            in caplog.text)
