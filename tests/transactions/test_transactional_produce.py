"""What Produce refuses about transactions (transaction_verification.py) and OffsetFetch's `require_stable`,
through a real `shale serve` with raw requests (txn_util.py): client control batches, transactional batches to a
partition not in the producer's transaction, fenced and unknown producers, transactional records without an id,
and offsets committed by an open transaction."""

from __future__ import annotations

import time

import pytest
from hypothesis import given
from hypothesis import strategies as st
from kafka.protocol.consumer.group import OffsetFetchRequest, OffsetFetchResponse
from kafka.protocol.consumer.offsets import ListOffsetsRequest, ListOffsetsResponse

from shale.sidecar.log.records import ControlType, Record, encode_batch, end_txn_marker_batch
from shale.sidecar.protocol.error_codes import (
    CONCURRENT_TRANSACTIONS,
    COORDINATOR_LOAD_IN_PROGRESS,
    COORDINATOR_NOT_AVAILABLE,
    INVALID_PRODUCER_EPOCH,
    INVALID_PRODUCER_ID_MAPPING,
    INVALID_RECORD,
    INVALID_TXN_STATE,
    NOT_COORDINATOR,
    NOT_ENOUGH_REPLICAS,
    PRODUCER_FENCED,
    TRANSACTION_ABORTABLE,
    TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
    UNSTABLE_OFFSET_COMMIT,
)
from shale.sidecar.server.apis.transaction_verification import produce_error
from support.clients_util import build, call, stored_batches
from support.node_util import ServeProcess, topic_manifest, write_manifests
from support.txn_util import RawTransactions, plain, produce_raw

TOPIC = "txn-checks"


@pytest.fixture
def node(tmp_path):
    topics = write_manifests(tmp_path / "topics", topic_manifest(TOPIC, partitions=2))
    with ServeProcess(tmp_path / "data", topics) as proc:
        yield proc


def log_end(node, partition: int) -> int:
    batches = stored_batches(node.data_dir, TOPIC, partition)
    return batches[-1].header.next_offset if batches else 0


def lso(port: int) -> int:
    req = build(ListOffsetsRequest, {"replica_id": -1, "isolation_level": 1, "topics": [
        {"name": TOPIC, "partitions": [{"partition_index": 0, "timestamp": -1}]}]}, 5)
    return call(port, req, ListOffsetsResponse).topics[0].partitions[0].offset


def test_client_control_batches_are_refused(node):
    """No client can end a transaction: a COMMIT marker in a Produce is INVALID_RECORD and the open transaction
    stays open (the LSO does not move), whoever sends it."""
    p = RawTransactions(node.port, "ctl").init()
    assert p.write(TOPIC, 0, b"open") == 0
    marker = end_txn_marker_batch(p.producer_id, p.epoch, ControlType.COMMIT, int(time.time() * 1000))
    part = produce_raw(node.port, TOPIC, 0, marker, "ctl")
    assert part.error_code == INVALID_RECORD, part
    assert "Clients are not allowed to write control records" in part.error_message
    assert f"{TOPIC}-0" in part.error_message
    # Without a transactional id the marker (transactional by its attributes) fails the whole request first.
    assert produce_raw(node.port, TOPIC, 0, marker, None).error_code == TRANSACTIONAL_ID_AUTHORIZATION_FAILED
    assert log_end(node, 0) == 1 and lso(node.port) == 0  # the transaction is still open
    p.commit()  # the coordinator's marker is the one that counts
    assert [b.header.is_control for b in stored_batches(node.data_dir, TOPIC, 0)] == [False, True]


def test_transactional_batch_needs_its_partition_in_the_transaction(node):
    """Kafka's verification (KIP-890 part 1): a producer's first batch to a partition not added is refused,
    INVALID_TXN_STATE before Produce v11 and TRANSACTION_ABORTABLE from v11; added, it is appended, and later
    batches of the same transaction there are not asked about."""
    p = RawTransactions(node.port, "verify").init()
    refused = p.send(TOPIC, 0, b"not-added")
    assert (refused.error_code, refused.error_message.split(" (")[0]) == (
        INVALID_TXN_STATE, "Partition was not added to the transaction")
    assert p.send(TOPIC, 0, b"not-added", version=11).error_code == TRANSACTION_ABORTABLE
    assert p.send(TOPIC, 0, b"not-added", version=12).error_code == TRANSACTION_ABORTABLE  # no TV2 finalized
    assert log_end(node, 0) == 0
    assert p.write(TOPIC, 0, b"one") == 0
    assert p.send(TOPIC, 0, b"two").error_code == 0  # the log's open transaction vouches for it
    assert p.send(TOPIC, 1, b"other").error_code == INVALID_TXN_STATE  # partition 1 was never added
    assert log_end(node, 1) == 0
    p.commit()
    # The transaction is over: its partitions are emptied, so the next one must add partition 0 again.
    assert p.send(TOPIC, 0, b"late").error_code == INVALID_TXN_STATE
    assert p.write(TOPIC, 0, b"three") == 3


def test_fenced_and_unknown_producers_are_refused_before_the_log(node):
    old = RawTransactions(node.port, "fence").init()
    assert old.add(TOPIC, 1) == 0
    new = RawTransactions(node.port, "fence")
    # The new instance fences the old one: its open (empty-here) transaction is aborted, the epoch bumped.
    deadline = time.monotonic() + 30
    while True:
        try:
            new.init()
            break
        except AssertionError:  # CONCURRENT_TRANSACTIONS while the fencing abort completes
            assert time.monotonic() < deadline
            time.sleep(0.1)
    assert new.epoch > old.epoch
    assert old.send(TOPIC, 1, b"zombie").error_code == INVALID_PRODUCER_EPOCH
    stranger = RawTransactions(node.port, "fence", producer_id=new.producer_id + 1000, epoch=new.epoch)
    assert stranger.send(TOPIC, 1, b"stranger").error_code == INVALID_PRODUCER_ID_MAPPING
    # Only the coordinator's ABORT marker of the fenced transaction is in the partition.
    assert [b.header.is_control for b in stored_batches(node.data_dir, TOPIC, 1)] == [True]


def test_transactional_records_need_a_transactional_id(node):
    """Kafka's KafkaApis: transactional records in a Produce without a transactional id fail the whole request."""
    batch = encode_batch([Record(0, int(time.time() * 1000), b"k", b"v")], producer_id=7, producer_epoch=0,
                         base_sequence=0, is_transactional=True)
    assert produce_raw(node.port, TOPIC, 0, batch, None).error_code == TRANSACTIONAL_ID_AUTHORIZATION_FAILED
    assert plain(node.port, TOPIC, b"plain") == 0  # the same request without transactional records is fine


@given(st.sampled_from([PRODUCER_FENCED, TRANSACTION_ABORTABLE, CONCURRENT_TRANSACTIONS,
                        COORDINATOR_LOAD_IN_PROGRESS, COORDINATOR_NOT_AVAILABLE, NOT_COORDINATOR,
                        INVALID_PRODUCER_ID_MAPPING]), st.integers(3, 13))
def test_produce_answers_verification_errors_as_kafka(error, version):
    """AddPartitionsToTxnManager's and ReplicaManager's translations: what a Produce of `version` gets back."""
    code, message = produce_error(version, error)
    if error == PRODUCER_FENCED:
        assert code == INVALID_PRODUCER_EPOCH
    elif error == TRANSACTION_ABORTABLE:
        assert (code, message) == (TRANSACTION_ABORTABLE if version >= 11 else INVALID_TXN_STATE,
                                   "Partition was not added to the transaction")
    elif error == INVALID_PRODUCER_ID_MAPPING:
        assert code == INVALID_PRODUCER_ID_MAPPING
    else:  # retriable without a metadata refresh, naming the coordinator's error
        assert code == NOT_ENOUGH_REPLICAS and message.startswith("Unable to verify the partition has been added")


def offset_fetch(port: int, group: str, partition: int, version: int, require_stable: bool) -> tuple[int, int]:
    """(error code, committed offset) of one partition."""
    if version >= 8:
        req = build(OffsetFetchRequest, {"groups": [{"group_id": group, "topics": [
            {"name": TOPIC, "partition_indexes": [partition]}]}], "require_stable": require_stable}, version)
        [part] = call(port, req, OffsetFetchResponse).groups[0].topics[0].partitions
    else:
        req = build(OffsetFetchRequest, {"group_id": group, "topics": [
            {"name": TOPIC, "partition_indexes": [partition]}], "require_stable": require_stable}, version)
        [part] = call(port, req, OffsetFetchResponse).topics[0].partitions
    return part.error_code, part.committed_offset


@pytest.mark.parametrize("version", [7, 8])
def test_offset_fetch_require_stable_waits_for_the_transaction(node, version):
    """Kafka's getOffsets: while an open transaction has committed a partition's offset, `require_stable` answers
    UNSTABLE_OFFSET_COMMIT for it (clients retry); without it the last committed offset is answered; after the
    COMMIT marker both see the transaction's offset, and after an ABORT the old one."""
    p = RawTransactions(node.port, "offsets").init()
    p.commit_offset("g", TOPIC, 0, 5)
    assert offset_fetch(node.port, "g", 0, version, True) == (UNSTABLE_OFFSET_COMMIT, -1)
    assert offset_fetch(node.port, "g", 0, version, False) == (0, -1)
    assert offset_fetch(node.port, "g", 1, version, True) == (0, -1)  # another partition is stable
    p.commit()
    assert offset_fetch(node.port, "g", 0, version, True) == (0, 5)
    p.commit_offset("g", TOPIC, 0, 9)
    assert offset_fetch(node.port, "g", 0, version, True) == (UNSTABLE_OFFSET_COMMIT, -1)
    p.abort()
    assert offset_fetch(node.port, "g", 0, version, True) == (0, 5)
