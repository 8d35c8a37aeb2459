"""Producer id allocation across restarts and the InitProducerId response (kafka-protocol.md G7, G11)."""

from __future__ import annotations

import os
import threading
from types import SimpleNamespace

import pytest
from kafka.protocol.producer.transaction import InitProducerIdRequest, InitProducerIdResponse

from shale.sidecar.protocol.codec import decode_request, encode_response
from shale.sidecar.server.coordinator.transaction import producer_ids
from shale.sidecar.server.coordinator.transaction.producer_ids import (
    COORDINATOR_NOT_AVAILABLE,
    INVALID_REQUEST,
    PRODUCER_ID_BLOCK_FILE,
    ProducerIdAllocator,
    ProducerIdAllocatorError,
    init_producer_id,
)
from shale.sidecar.server.coordinator.transaction.producer_ids import (
    NODE_STRIDE as S,
)


def decoded(version: int, transactional_id: str | None = None, producer_id: int = -1, producer_epoch: int = -1):
    """The request body as the broker gets it: encoded by kafka-python, decoded by the sidecar's codec."""
    fields = {"transactional_id": transactional_id, "transaction_timeout_ms": 60_000}
    if version >= 3:
        fields.update(producer_id=producer_id, producer_epoch=producer_epoch)
    req = InitProducerIdRequest[version](**fields)
    req.with_header(correlation_id=9, client_id="test")
    request = decode_request(bytes(req.encode(framed=True, header=True))[4:])
    assert request.api_version == version
    return request.body


def on_the_wire(version: int, body: dict):
    """The response as a client reads it back."""
    out = encode_response(22, version, 9, body)
    return InitProducerIdResponse.decode(out[4 if version < 2 else 5:], version=version)


# --- the allocator ----------------------------------------------------------------------------------

def test_ids_are_unique_across_reopens_with_and_without_a_clean_stop(tmp_path) -> None:
    seen: list[int] = []
    for _ in range(4):  # no close exists: dropping the allocator mid-block is what a crash does
        alloc = ProducerIdAllocator(str(tmp_path), block_size=3)
        seen += [alloc.next_id() for _ in range(4)]
    assert len(set(seen)) == len(seen) == 16
    assert seen[:4] == [0, S, 2 * S, 3 * S] and seen[4] == 6 * S, "a restart skips the rest of the reserved block"


def test_the_block_is_on_disk_before_its_first_id_is_used(tmp_path, monkeypatch) -> None:
    alloc = ProducerIdAllocator(str(tmp_path), block_size=10)
    assert not os.path.exists(tmp_path / PRODUCER_ID_BLOCK_FILE), "nothing reserved before the first id"
    assert alloc.next_id() == 0
    assert (tmp_path / PRODUCER_ID_BLOCK_FILE).read_text() == "0\n10\n"
    for _ in range(9):
        alloc.next_id()

    def crash(*_a, **_k):
        raise OSError("disk gone")

    monkeypatch.setattr(producer_ids, "atomic_write", crash)
    with pytest.raises(OSError):
        alloc.next_id()  # the next block cannot be recorded: no id of it is handed out
    monkeypatch.undo()
    assert ProducerIdAllocator(str(tmp_path)).next_id() == 10 * S


def test_concurrent_callers_get_distinct_ids(tmp_path) -> None:
    alloc = ProducerIdAllocator(str(tmp_path), block_size=7)
    got: list[int] = []
    lock = threading.Lock()

    def worker() -> None:
        mine = [alloc.next_id() for _ in range(500)]
        with lock:
            got.extend(mine)

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(got) == [i * S for i in range(4000)]


def test_nodes_of_one_cluster_hand_out_disjoint_ids(tmp_path) -> None:
    """No controller is shared: node n hands out only ids = n (mod NODE_STRIDE)."""
    for n in (0, 1, 7):
        (tmp_path / str(n)).mkdir()
    allocators = {n: ProducerIdAllocator(str(tmp_path / str(n)), block_size=5, node_id=n) for n in (0, 1, 7)}
    ids = {n: [a.next_id() for _ in range(12)] for n, a in allocators.items()}
    assert ids[7][:3] == [7, S + 7, 2 * S + 7]
    assert len({i for got in ids.values() for i in got}) == 36
    assert allocators[7].was_issued(S + 7) and not allocators[7].was_issued(S + 1)
    assert not allocators[1].was_issued(ids[7][0])
    with pytest.raises(ValueError, match="node id"):
        ProducerIdAllocator(str(tmp_path / "x"), node_id=S)


def test_a_damaged_block_file_stops_allocation(tmp_path) -> None:
    (tmp_path / PRODUCER_ID_BLOCK_FILE).write_text("0\nbanana\n")
    with pytest.raises(ProducerIdAllocatorError, match=PRODUCER_ID_BLOCK_FILE):
        ProducerIdAllocator(str(tmp_path))
    with pytest.raises(ValueError):
        ProducerIdAllocator(str(tmp_path / "x"), block_size=0)


# --- InitProducerId -----------------------------------------------------------------------------------

def test_v0_gets_a_new_id_at_epoch_zero(tmp_path) -> None:
    alloc = ProducerIdAllocator(str(tmp_path))
    body = decoded(0)
    first = init_producer_id(alloc, 0, body)
    assert first == {"throttle_time_ms": 0, "error_code": 0, "producer_id": 0, "producer_epoch": 0}
    assert init_producer_id(alloc, 0, body)["producer_id"] == S
    # v0-2 carry no producer id or epoch (G7): whatever the object holds is not read.
    bare = SimpleNamespace(transactional_id=None, transaction_timeout_ms=1, producer_id=0, producer_epoch=3)
    assert init_producer_id(alloc, 2, bare)["producer_epoch"] == 0
    wire = on_the_wire(0, first)
    assert (wire.error_code, wire.producer_id, wire.producer_epoch) == (0, 0, 0)


def test_v4_bumps_the_epoch_of_an_existing_producer(tmp_path) -> None:
    alloc = ProducerIdAllocator(str(tmp_path))
    fresh = init_producer_id(alloc, 4, decoded(4))
    assert (fresh["producer_id"], fresh["producer_epoch"]) == (0, 0)
    bumped = init_producer_id(alloc, 4, decoded(4, producer_id=0, producer_epoch=0))
    assert bumped == {"throttle_time_ms": 0, "error_code": 0, "producer_id": 0, "producer_epoch": 1}
    wire = on_the_wire(4, bumped)
    assert (wire.error_code, wire.producer_id, wire.producer_epoch) == (0, 0, 1)
    # At the last epoch a new id is handed out instead of overflowing Int16.
    exhausted = init_producer_id(alloc, 4, decoded(4, producer_id=0, producer_epoch=32767))
    assert (exhausted["producer_id"], exhausted["producer_epoch"]) == (S, 0)
    assert init_producer_id(alloc, 4, decoded(4, producer_id=0, producer_epoch=32766))["producer_epoch"] == 32767


def test_v4_bump_survives_a_restart_but_unknown_ids_get_a_new_one(tmp_path) -> None:
    init_producer_id(ProducerIdAllocator(str(tmp_path)), 4, decoded(4))
    alloc = ProducerIdAllocator(str(tmp_path))
    assert init_producer_id(alloc, 4, decoded(4, producer_id=0, producer_epoch=5))["producer_epoch"] == 6
    # An id this sidecar never issued (e.g. from a wiped cluster) would later go to another producer.
    stranger = init_producer_id(alloc, 4, decoded(4, producer_id=123_456, producer_epoch=2))
    assert stranger["producer_id"] == 1000 * S and stranger["producer_epoch"] == 0


def test_half_given_producer_id_and_epoch_is_an_invalid_request(tmp_path) -> None:
    alloc = ProducerIdAllocator(str(tmp_path))
    for pid, epoch in ((5, -1), (-1, 0)):
        assert init_producer_id(alloc, 4, decoded(4, producer_id=pid, producer_epoch=epoch)) == {
            "throttle_time_ms": 0, "error_code": INVALID_REQUEST, "producer_id": -1, "producer_epoch": -1}
    assert not os.path.exists(tmp_path / PRODUCER_ID_BLOCK_FILE), "no id spent on a bad request"


@pytest.mark.parametrize("version", [0, 4])
def test_a_transactional_id_is_refused(tmp_path, version) -> None:
    alloc = ProducerIdAllocator(str(tmp_path))
    resp = init_producer_id(alloc, version, decoded(version, transactional_id="txn-1"))
    assert resp == {"throttle_time_ms": 0, "error_code": COORDINATOR_NOT_AVAILABLE, "producer_id": -1,
                    "producer_epoch": -1}
    assert on_the_wire(version, resp).error_code == 15
    assert not os.path.exists(tmp_path / PRODUCER_ID_BLOCK_FILE)
