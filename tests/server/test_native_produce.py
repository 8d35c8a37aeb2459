"""A one-record Produce answered in one C call (native_produce.py) is the handler's answer, byte for byte.

Two brokers run side by side on one event loop (native_util.py): one as `shale serve` runs it, whose plain
connections answer a one-partition Produce natively, and one whose Produce handler is wrapped (as an authorizer
wraps it), which keeps every request on the Python path. Raw socket clients send both the same frames; the
answers, the logs' files and the order of answers on a connection must be the same. A counting wrapper around
the C call shows which requests it answered, so the comparison cannot pass by comparing the Python path with
itself. Every test runs twice: with the I/O thread serving the connections it is lent (io_thread.py), and with
the event loop making every native call.
"""

from __future__ import annotations

import os
import struct
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from native_util import HI, LO, NOW, Brokers, batch, brokers, exchange, fetch, produce, read_frame

from shale.sidecar.log.compression import Compression
from shale.sidecar.log.free_space import DirSpace, FreeFloor
from shale.sidecar.log.records import Record, encode_batch
from shale.sidecar.log.topic_partition import TopicPartition
from shale.sidecar.protocol.client_codec import decode_response
from shale.sidecar.protocol.error_codes import KAFKA_STORAGE_ERROR
from shale.sidecar.server.network import native_produce
from shale.sidecar.server.network.handler import API_PRODUCE


@pytest.fixture(autouse=True, params=[True, False], ids=["io thread", "event loop"])
def io_thread(request, monkeypatch) -> bool:
    monkeypatch.setattr(Brokers, "io_thread", request.param)
    return request.param


@pytest.fixture
def answered(monkeypatch) -> list:
    """Every answer of the C call (None: declined), in order; the brokers' paths are built after this patch."""
    calls: list = []
    real = native_produce._produce

    def counted(*args):
        calls.append(real(*args))
        return calls[-1]
    monkeypatch.setattr(native_produce, "_produce", counted)
    return calls


@pytest.mark.parametrize("version", range(native_produce.FIRST_BATCH_VERSION, HI + 1))
def test_each_version_is_answered_as_the_handler_answers(tmp_path, answered, version):
    frames = [produce(version, i, batch(i)) for i in range(12)]
    with brokers(tmp_path) as pair:
        got = exchange(pair, frames)
        assert got["native"] == got["handler"]
        assert pair.files("native") == pair.files("handler")
        # answers after the first native one are copies of the encoder's layout with the numbers written in
        assert (version, "t", 0) in pair.brokers["native"]._native.answers
    taken = [a for a in answered if a is not None]
    # The first append to an empty segment is Python's (the rolling timestamp); the rest are the C call's,
    # one index entry (the page's first, allocated by Python) aside; the handler broker never calls it.
    assert len(answered) == len(frames) and len(taken) >= len(frames) - 2
    assert taken[-1] == b"".join([struct.pack(">i", len(got["native"][-1])), got["native"][-1]])
    base = decode_response(API_PRODUCE, version, got["native"][-1]).body.responses[0].partition_responses[0].base_offset
    assert base == len(frames) - 1


@pytest.mark.parametrize("version", range(LO, native_produce.FIRST_BATCH_VERSION))
def test_produce_before_v3_is_left_to_the_handler(tmp_path, answered, version):
    """v0-2 carry message format v0/v1: the handler refuses them (UNSUPPORTED_VERSION), the C call never tries."""
    frames = [produce(version, i, batch(i)) for i in range(3)]
    with brokers(tmp_path) as pair:
        got = exchange(pair, frames)
        assert got["native"] == got["handler"]
        assert pair.brokers["native"].registry.local_log("t", 0).log_end_offset == 0
    assert answered == [None] * 3


def test_acks_zero_gets_no_answer_and_is_appended(tmp_path, answered):
    frames = [produce(9, 1, batch(1), acks=0), produce(9, 2, batch(2), acks=0), produce(9, 3, batch(3), acks=1)]
    with brokers(tmp_path) as pair:
        got = exchange(pair, frames, silent=(0, 1))
        assert got["native"] == got["handler"]
        assert struct.unpack_from(">i", got["native"][0])[0] == 3
        assert pair.files("native") == pair.files("handler")
        log = pair.brokers["native"].registry.local_log("t", 0)
        assert log.log_end_offset == 3
    assert [a for a in answered if a is not None][:1] == [b""]  # the second acks=0 request, answered natively


@pytest.mark.parametrize("frame", [
    produce(9, 7, batch(1) + batch(2)),  # two batches: INVALID_RECORD, from the handler
    produce(9, 7, batch(1), partitions=(0, 1)),  # two partitions
    produce(9, 7, batch(1), topic="unknown"),
    produce(9, 7, batch(1), acks=2),
    produce(9, 7, None),
    produce(9, 7, batch(1, producer_id=5, producer_epoch=0, base_sequence=0)),  # producer state is Python's
    produce(9, 7, batch(1, compression=Compression.GZIP)),
    produce(9, 7, batch(1, is_control=True)),
    produce(9, 7, batch(1)[:-1] + b"\x01"),  # a CRC that does not match
    produce(9, 7, batch(1), transactional_id="txn"),
], ids=["two batches", "two partitions", "unknown topic", "acks 2", "null records", "idempotent", "compressed",
        "control", "bad crc", "transactional id"])
def test_what_the_c_call_declines_gets_the_handlers_answer(tmp_path, answered, frame):
    warm = [produce(9, i, batch(i)) for i in range(3)]  # a segment with a batch: the C append could take more
    with brokers(tmp_path) as pair:
        got = exchange(pair, warm + [frame])
        assert got["native"] == got["handler"]
        assert pair.files("native") == pair.files("handler")
    assert answered[-1] is None


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.integers(native_produce.FIRST_BATCH_VERSION, HI), st.sampled_from([-1, 1]), st.integers(1, 3),
                          st.binary(max_size=300)), min_size=1, max_size=8))
def test_any_sequence_of_one_partition_produces_is_answered_as_the_handler_answers(tmp_path_factory, requests):
    frames = [produce(version, i, encode_batch([Record(0, NOW + i, b"k%d" % r, value) for r in range(count)]),
                      acks=acks) for i, (version, acks, count, value) in enumerate(requests)]
    with brokers(tmp_path_factory.mktemp("pair")) as pair:
        got = exchange(pair, frames)
        assert got["native"] == got["handler"]
        assert pair.files("native") == pair.files("handler")


def test_a_native_append_wakes_a_parked_fetch(tmp_path, answered):
    with brokers(tmp_path) as pair, pair.connect("native") as producer, pair.connect("native") as consumer:
        producer.sendall(produce(9, 0, batch(0)))  # the segment's first batch: Python's
        read_frame(producer)
        consumer.sendall(fetch(5, partition=0, offset=1, max_wait_ms=30000))
        tp = TopicPartition("t", 0)
        for _ in range(100):  # until the fetch is parked at the broker
            if pair.brokers["native"].purgatory.events.get(tp):
                break
            time.sleep(0.05)
        assert pair.brokers["native"].purgatory.events.get(tp), "the fetch did not park"
        producer.sendall(produce(9, 1, batch(1)))
        read_frame(producer)
        assert answered[-1] is not None  # appended by the C call
        answer = decode_response(1, 12, read_frame(consumer)).body  # within the socket's 10 s, not the fetch's 30 s
        records = answer.responses[0].partitions[0].records
        assert b"value-1" in bytes(records)


def test_answers_leave_in_request_order_behind_a_parked_fetch(tmp_path, answered):
    """A Produce pipelined behind a Fetch that waits is not answered ahead of it, natively or otherwise."""
    with brokers(tmp_path) as pair, pair.connect("native") as sock:
        sock.sendall(produce(9, 0, batch(0)))
        read_frame(sock)
        sock.sendall(fetch(1, partition=1, offset=0, max_wait_ms=500) + produce(9, 2, batch(1)))
        order = [struct.unpack_from(">i", read_frame(sock))[0] for _ in range(2)]
        assert order == [1, 2]
        assert pair.brokers["native"].registry.local_log("t", 0).log_end_offset == 2
        assert pair.brokers["native"].memory.used == 0


def test_an_encoder_failure_after_the_append_is_answered_through_the_codec(tmp_path, answered):
    """The record is in the log once the C append returns: an answer must come (a retry would append it again),
    from codec.encode_response's encoders when the compiled one cannot."""
    with brokers(tmp_path) as pair:
        pair.brokers["native"]._native = None  # built again for the connection below, then broken
        frames = [produce(9, i, batch(i)) for i in range(3)]
        with pair.connect("native") as sock:
            sock.sendall(frames[0])
            first = read_frame(sock)
            broker = pair.brokers["native"]
            broker._native.encoders.clear()
            broker._native.answers.clear()
            sock.sendall(frames[1])
            second = read_frame(sock)
            sock.sendall(frames[2])
            third = read_frame(sock)
        assert answered[-2:] == [struct.pack(">i", len(second)) + second, struct.pack(">i", len(third)) + third]
        expected = exchange(pair, frames, kinds=("handler",))["handler"]
        assert [first, second, third] == expected
        assert broker.registry.local_log("t", 0).log_end_offset == 3


def test_a_failure_after_the_append_closes_the_connection_and_keeps_the_record(tmp_path, answered, caplog,
                                                                               monkeypatch):
    """A bug after the append (here: waking the waiting fetches raises) must not answer twice or lose the record:
    the connection closes, as when a handler fails, and the failure is logged with its traceback."""
    with brokers(tmp_path) as pair, pair.connect("native") as sock:
        sock.sendall(produce(9, 0, batch(0)))
        read_frame(sock)
        broker = pair.brokers["native"]

        def broken(topic, partition):
            raise RuntimeError(f"poke of {topic}-{partition} failed")
        broker._native.poke = broken
        broker.purgatory.events[TopicPartition("t", 1)] = set()  # some fetch waits somewhere: the C call pokes
        sock.sendall(produce(9, 1, batch(1)))
        assert sock.recv(4) == b"", "the connection is closed without an answer"
        assert broker.registry.local_log("t", 0).log_end_offset == 2
        assert broker.memory.used == 0
    assert "the native Produce path failed" in caplog.text and "poke of t-0 failed" in caplog.text


def test_the_request_memory_is_back_to_zero_after_native_answers(tmp_path, answered):
    with brokers(tmp_path) as pair, pair.connect("native") as sock:
        for i in range(20):
            sock.sendall(produce(9, i, batch(i)))
            read_frame(sock)
        sock.sendall(b"".join(produce(9, 20 + i, batch(20 + i)) for i in range(5)))  # pipelined, one read or more
        assert [struct.unpack_from(">i", read_frame(sock))[0] for _ in range(5)] == list(range(20, 25))
        assert pair.brokers["native"].memory.used == 0
    assert sum(a is not None for a in answered) >= 20


def test_a_log_dir_under_its_free_space_floor_is_left_to_the_handler_which_refuses(tmp_path, answered):
    """The floor is Python's (produce_admission.py): the native Produce finds no log while the dir is under it, so
    the handler answers KAFKA_STORAGE_ERROR naming the partition and the dir; above it again, C answers again."""
    warm = [produce(9, i, batch(i)) for i in range(6)]  # the first index page allocated (by Python): C's from here
    with brokers(tmp_path) as pair:
        exchange(pair, warm)
        assert answered[-1] is not None
        disk = {"free": 1 << 20}

        def statvfs(path: str) -> os.statvfs_result:
            return os.statvfs_result((4096, 4096, (64 << 20) // 4096, disk["free"] // 4096, disk["free"] // 4096,
                                      0, 0, 0, 0, 255))
        for kind in ("native", "handler"):
            log = pair.brokers[kind].registry.local_log("t", 0)
            log.space = DirSpace(f"/volumes/{kind}", FreeFloor(8 << 20), statvfs=statvfs)
        refused = exchange(pair, [produce(9, 6, batch(6))])
        assert answered[-1] is None
        answer = decode_response(API_PRODUCE, 9, refused["native"][0]).body.responses[0].partition_responses[0]
        assert answer.error_code == KAFKA_STORAGE_ERROR and answer.base_offset == -1
        assert answer.error_message.startswith("t-0: log dir /volumes/native has 1048576 bytes free; ")
        assert "more would leave less than its floor of 8388608 bytes" in answer.error_message
        assert pair.files("native") == pair.files("handler")
        disk["free"] = 32 << 20
        before = len(answered)
        again = exchange(pair, [produce(9, i, batch(i)) for i in range(7, 11)])
        assert again["native"] == again["handler"] and any(a is not None for a in answered[before:])
        assert pair.brokers["native"].registry.local_log("t", 0).log_end_offset == 10
