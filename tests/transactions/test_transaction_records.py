"""The `__transaction_state` record codec against Kafka's layout: golden bytes, round trips, an independent oracle.

The oracle is kafka-python's schema-driven encoder fed with Kafka's TransactionLogValue.json (field list below is
Kafka's; the tagged fields also carry "versions", which Kafka's generator defaults to their taggedVersions and
kafka-python requires). TransactionLogKey.json is one string field behind the int16 record type 0.
"""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shale.sidecar.server.coordinator.transaction.transaction_records import (
    TransactionRecordError,
    decode_key,
    decode_value,
    encode_key,
    encode_value,
)
from shale.sidecar.server.coordinator.transaction.transaction_state import TxnMetadata, TxnState
from support.kafka_schema_util import message_classes

KAFKA_SCHEMAS = {
    "TransactionLogKey": {"type": "data", "name": "TransactionLogKey", "validVersions": "0", "flexibleVersions": "none",
                          "fields": [{"name": "TransactionalId", "type": "string", "versions": "0"}]},
    "TransactionLogValue": {
        "type": "data", "name": "TransactionLogValue", "validVersions": "0-1", "flexibleVersions": "1+",
        "fields": [
            {"name": "ProducerId", "type": "int64", "versions": "0+"},
            {"name": "PreviousProducerId", "type": "int64", "versions": "1+", "taggedVersions": "1+", "tag": 0,
             "default": -1},
            {"name": "NextProducerId", "type": "int64", "versions": "1+", "taggedVersions": "1+", "tag": 1,
             "default": -1},
            {"name": "ProducerEpoch", "type": "int16", "versions": "0+"},
            {"name": "TransactionTimeoutMs", "type": "int32", "versions": "0+"},
            {"name": "TransactionStatus", "type": "int8", "versions": "0+"},
            {"name": "TransactionPartitions", "type": "[]PartitionsSchema", "versions": "0+",
             "nullableVersions": "0+", "fields": [
                 {"name": "Topic", "type": "string", "versions": "0+"},
                 {"name": "PartitionIds", "type": "[]int32", "versions": "0+"}]},
            {"name": "TransactionLastUpdateTimestampMs", "type": "int64", "versions": "0+"},
            {"name": "TransactionStartTimestampMs", "type": "int64", "versions": "0+"},
            {"name": "ClientTransactionVersion", "type": "int16", "default": 0, "versions": "1+",
             "taggedVersions": "1+", "tag": 2}]},
}


@pytest.fixture(scope="module")
def kafka():
    return message_classes(KAFKA_SCHEMAS)


def meta(state=TxnState.ONGOING, partitions=(("b", 3), ("a", 1), ("a", 0)), **kw) -> TxnMetadata:
    fields = dict(transactional_id="t1", producer_id=1000, producer_epoch=2, timeout_ms=60000, state=state,
                  partitions=frozenset(partitions), start_timestamp_ms=1500, last_update_timestamp_ms=2000)
    return TxnMetadata(**(fields | kw))


# -- golden bytes ---------------------------------------------------------------------------------------------


def test_key_golden_bytes():
    # int16 record type 0 (TRANSACTION_LOG), then TransactionalId "t1" = int16 length 2 + 7431.
    golden = bytes.fromhex("0000" "0002" "7431")
    assert encode_key("t1") == golden
    assert decode_key(golden) == "t1"
    assert decode_key(bytes.fromhex("0001" "0002" "7431")) is None  # another coordinator's record: skipped


def test_ongoing_value_v0_golden_bytes():
    # v0: producer id int64 1000, epoch int16 2, timeout int32 60000, status int8 1 (Ongoing), partitions
    # int32 count 2: "a" [0, 1], "b" [3] (topics and ids sorted), last update int64 2000, start int64 1500.
    golden = bytes.fromhex(
        "0000" "00000000000003e8" "0002" "0000ea60" "01"
        "00000002" "0001" "61" "00000002" "00000000" "00000001" "0001" "62" "00000001" "00000003"
        "00000000000007d0" "00000000000005dc")
    assert encode_value(meta()) == golden
    assert decode_value("t1", golden) == meta()


def test_empty_value_has_null_partitions_as_kafka_writes():
    empty = meta(TxnState.EMPTY, (), start_timestamp_ms=-1)
    golden = bytes.fromhex("0000" "00000000000003e8" "0002" "0000ea60" "00" "ffffffff"
                           "00000000000007d0" "ffffffffffffffff")
    assert encode_value(empty) == golden
    assert decode_value("t1", golden) == empty


def test_v1_keeps_kip890_tagged_fields():
    # Flexible v1: compact array (count+1 = 02), compact string "a" (02 61), compact int32 array (03 ...), the
    # struct's empty tag section (00); top-level tags: 2 of them, tag 0 (8 bytes, previous producer id 7) and
    # tag 2 (2 bytes, client transaction version 2).
    value = meta(partitions=(("a", 0), ("a", 1)), previous_producer_id=7, client_transaction_version=2)
    golden = bytes.fromhex(
        "0001" "00000000000003e8" "0002" "0000ea60" "01" "02" "0261" "03" "00000000" "00000001" "00"
        "00000000000007d0" "00000000000005dc" "02" "00" "08" "0000000000000007" "02" "02" "0002")
    assert encode_value(value) == golden
    assert decode_value("t1", golden) == value


def test_dead_is_a_tombstone():
    assert encode_value(meta(TxnState.DEAD, ())) is None
    assert decode_value("t1", None) is None


def test_partitions_of_an_empty_record_are_ignored_as_kafka_reads_them():
    raw = bytearray(encode_value(meta(TxnState.COMPLETE_COMMIT, (("a", 0),))))
    raw[2 + 8 + 2 + 4] = 0  # the status byte: Empty
    assert decode_value("t1", bytes(raw)).partitions == frozenset()


def test_bad_input_is_refused_naming_the_transactional_id():
    good = encode_value(meta())
    with pytest.raises(TransactionRecordError, match="'t1'.*truncated"):
        decode_value("t1", good[:20])
    with pytest.raises(TransactionRecordError, match="'t1'.*version 9"):
        decode_value("t1", b"\x00\x09" + good[2:])
    bad_status = bytearray(good)
    bad_status[16] = 9
    with pytest.raises(TransactionRecordError, match="'t1'.*unknown transaction status 9"):
        decode_value("t1", bytes(bad_status))
    with pytest.raises(TransactionRecordError, match="32767"):
        encode_key("x" * 40000)
    with pytest.raises(TransactionRecordError, match="truncated"):
        decode_key(bytes.fromhex("0000" "0005" "6162"))


# -- round trips and the oracle -----------------------------------------------------------------------------------

int16 = st.integers(-(2**15), 2**15 - 1)
int32 = st.integers(-(2**31), 2**31 - 1)
int64 = st.integers(-(2**63), 2**63 - 1)
topics = st.text(max_size=20)
partition_sets = st.frozensets(st.tuples(topics, int32), max_size=6)


@st.composite
def metadata(draw) -> TxnMetadata:
    state = draw(st.sampled_from([s for s in TxnState if s != TxnState.DEAD]))
    return TxnMetadata(draw(st.text(max_size=20)), draw(int64), draw(int16), draw(int32), state,
                       frozenset() if state == TxnState.EMPTY else draw(partition_sets), draw(int64), draw(int64),
                       previous_producer_id=draw(st.just(-1) | int64), next_producer_id=draw(st.just(-1) | int64),
                       client_transaction_version=draw(st.just(0) | int16))


@settings(deadline=None)  # the machine is shared: no wall-clock limit per example
@given(transactional_id=st.text(max_size=40))
def test_key_round_trip(transactional_id):
    assert decode_key(encode_key(transactional_id)) == transactional_id


@settings(deadline=None)
@given(value=metadata())
def test_value_round_trip(value):
    assert decode_value(value.transactional_id, encode_value(value)) == value


@settings(max_examples=100, deadline=None)
@given(value=metadata())
def test_values_match_kafkas_definitions(kafka, value):
    cls = kafka["TransactionLogValue"]
    partitions_cls = cls._struct.fields["transaction_partitions"].data_class
    ours = encode_value(value)
    version = struct.unpack_from(">h", ours)[0]
    by_topic: dict[str, list[int]] = {}
    for topic, partition in sorted(value.partitions):
        by_topic.setdefault(topic, []).append(partition)
    theirs = cls(version=version, producer_id=value.producer_id, previous_producer_id=value.previous_producer_id,
                 next_producer_id=value.next_producer_id, producer_epoch=value.producer_epoch,
                 transaction_timeout_ms=value.timeout_ms, transaction_status=int(value.state),
                 transaction_partitions=None if value.state == TxnState.EMPTY else [
                     partitions_cls(topic=t, partition_ids=ids) for t, ids in by_topic.items()],
                 transaction_last_update_timestamp_ms=value.last_update_timestamp_ms,
                 transaction_start_timestamp_ms=value.start_timestamp_ms,
                 client_transaction_version=value.client_transaction_version)
    assert ours == bytes(theirs.encode(version=version))


@settings(max_examples=60, deadline=None)
@given(transactional_id=st.text(max_size=40))
def test_keys_match_kafkas_definitions(kafka, transactional_id):
    body = kafka["TransactionLogKey"](version=0, transactional_id=transactional_id).encode(header=False)
    assert encode_key(transactional_id) == struct.pack(">h", 0) + bytes(body)
