"""WriteTxnMarkers' bodies (`txn_markers.py`): what the coordinator encodes is what a leader decodes, and the
leader's answer reaches the coordinator partition by partition, for any marker and set of partitions."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from shale.sidecar.log.records import decode_batch, parse_control_key, parse_end_txn_marker
from shale.sidecar.log.topic_partition import TopicPartition
from shale.sidecar.protocol import codec
from shale.sidecar.protocol.client_codec import decode_response, encode_request
from shale.sidecar.server.coordinator.transaction.txn_markers import (
    API_WRITE_TXN_MARKERS,
    REQUEST_VERSION,
    Marker,
    request_body,
    request_partitions,
    response_markers,
)

markers = st.builds(Marker, st.integers(0, 2**63 - 1), st.integers(0, 2**15 - 1), st.booleans(),
                    st.integers(0, 2**31 - 1))
partitions = st.sets(st.builds(TopicPartition, st.sampled_from(["a", "b", "__consumer_offsets", "t-ü"]),
                               st.integers(0, 2**31 - 1)), min_size=1, max_size=20)


@given(markers, partitions)
def test_a_leader_decodes_the_marker_and_partitions_the_coordinator_sent(marker, tps):
    frame = encode_request(API_WRITE_TXN_MARKERS, REQUEST_VERSION, 9, "coordinator", request_body(marker, tps))
    (decoded,) = codec.decode_request(frame[4:]).body.markers
    assert Marker(decoded.producer_id, decoded.producer_epoch, decoded.transaction_result,
                  decoded.coordinator_epoch) == marker
    assert sorted(request_partitions(decoded)) == sorted(tps)


@given(st.integers(0, 2**63 - 1), partitions, st.data())
def test_the_coordinator_reads_each_partitions_answer(producer_id, tps, data):
    codes = {tp: data.draw(st.sampled_from([0, 6, 3, 47, 52, 56])) for tp in tps}
    frame = codec.encode_response(API_WRITE_TXN_MARKERS, REQUEST_VERSION, 9,
                                  {"markers": response_markers([(producer_id, codes)])})
    (m,) = decode_response(API_WRITE_TXN_MARKERS, REQUEST_VERSION, frame).body.markers
    assert m.producer_id == producer_id
    assert {TopicPartition(t.name, p.partition_index): p.error_code for t in m.topics for p in t.partitions} == codes


@given(markers, st.integers(0, 2**40))
def test_the_marker_batch_is_the_producers_control_batch_with_the_coordinator_epoch(marker, timestamp):
    batch = decode_batch(marker.batch(timestamp))
    assert batch.header.is_control and batch.header.is_transactional
    assert (batch.header.producer_id, batch.header.producer_epoch) == (marker.producer_id, marker.producer_epoch)
    (record,) = batch.records
    assert parse_control_key(record.key) is marker.control
    assert parse_end_txn_marker(record.value) == marker.coordinator_epoch
