"""The fault tests' TCP proxy (tests/support/fault_proxy.py): it must recognise a follower's fetches in real request
frames, and cut exactly those connections, freezing or resetting them, while clients carry on."""

from __future__ import annotations

import socket

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shale.sidecar.protocol.client_codec import decode_response, encode_request
from shale.sidecar.protocol.codec import SUPPORTED_VERSIONS
from support.clients_util import read_frame
from support.fault_proxy import FREEZE, RESET, FaultProxy, fetch_replica_id
from support.node_util import NodeThread

API_FETCH, API_METADATA = 1, 3
FETCH_VERSIONS = range(max(4, SUPPORTED_VERSIONS[API_FETCH][0]), min(14, SUPPORTED_VERSIONS[API_FETCH][1]) + 1)


def fetch_frame(replica_id: int, version: int = 12, client_id: str | None = "replica-fetcher",
                correlation_id: int = 1) -> bytes:
    return encode_request(API_FETCH, version, correlation_id, client_id, {
        "replica_id": replica_id, "max_wait_ms": 0, "min_bytes": 1, "max_bytes": 1 << 20, "isolation_level": 0,
        "session_id": 0, "session_epoch": -1, "rack_id": "",
        "topics": [{"topic": "t", "partitions": [{"partition": 0, "fetch_offset": 0, "partition_max_bytes": 1 << 20,
                                                  "current_leader_epoch": -1, "last_fetched_epoch": -1}]}],
        "forgotten_topics_data": []})


def metadata_frame(correlation_id: int = 1) -> bytes:
    return encode_request(API_METADATA, 9, correlation_id, "client", {"topics": [], "allow_auto_topic_creation": False})


@given(replica=st.integers(0, 2**31 - 1), version=st.sampled_from(FETCH_VERSIONS),
       client_id=st.one_of(st.none(), st.text(max_size=40)))
def test_the_replica_id_is_read_from_any_fetch_frame(replica, version, client_id):
    assert fetch_replica_id(fetch_frame(replica, version, client_id)[4:]) == replica


def test_consumers_fetches_and_other_requests_name_no_replica():
    assert fetch_replica_id(fetch_frame(-1)[4:]) is None
    assert fetch_replica_id(metadata_frame()[4:]) is None
    assert fetch_replica_id(b"\x00\x01") is None


# An RST fails whichever step meets it first: the connect, a send or the read.
RESET_ERRORS = (ConnectionResetError, BrokenPipeError)


def ask(sock: socket.socket, frame: bytes, api_key: int, version: int) -> int:
    """Send a request, return the correlation id of the decoded answer."""
    sock.sendall(frame)
    reply = read_frame(sock)
    assert reply is not None, "the connection was closed instead of answered"
    return decode_response(api_key, version, reply).correlation_id


@pytest.fixture
def proxied_node(tmp_path):
    (tmp_path / "topics").mkdir()
    node = NodeThread(tmp_path / "data", tmp_path / "topics").start()
    proxy = FaultProxy(node.node.broker.port).start()
    try:
        yield proxy
    finally:
        proxy.stop()
        node.stop()


def test_a_frozen_follower_gets_nothing_until_healed_while_clients_carry_on(proxied_node):
    proxy = proxied_node
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=10) as follower, \
            socket.create_connection(("127.0.0.1", proxy.port), timeout=10) as client:
        assert ask(follower, fetch_frame(3, correlation_id=1), API_FETCH, 12) == 1
        assert proxy.replicas_seen() == {3}
        proxy.cut_replica(3, FREEZE)
        assert proxy.cut_count == 1
        follower.sendall(fetch_frame(3, correlation_id=2))
        follower.settimeout(0.5)
        with pytest.raises(socket.timeout):
            follower.recv(1)  # frozen: the request is held, not lost
        assert ask(client, metadata_frame(7), API_METADATA, 9) == 7  # a client of the same node is not cut
        proxy.heal()
        follower.settimeout(10)
        reply = read_frame(follower)
        assert reply is not None and decode_response(API_FETCH, 12, reply).correlation_id == 2


def test_a_reset_closes_the_followers_connections_and_new_ones_once_they_fetch(proxied_node):
    proxy = proxied_node
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=10) as follower:
        assert ask(follower, fetch_frame(4), API_FETCH, 12) == 1
        proxy.cut_replica(4, RESET)
        with pytest.raises(ConnectionResetError):
            follower.recv(1)
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=10) as again:
        assert ask(again, metadata_frame(5), API_METADATA, 9) == 5  # not known as the follower yet
        with pytest.raises(RESET_ERRORS):
            again.sendall(fetch_frame(4, correlation_id=6))
            again.recv(1)
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=10) as other_follower:
        assert ask(other_follower, fetch_frame(5, correlation_id=8), API_FETCH, 12) == 8
    assert proxy.cut_count == 2


def test_cutting_everything_makes_the_node_unreachable_until_healed(proxied_node):
    proxy = proxied_node
    proxy.cut_all(RESET)
    with pytest.raises(RESET_ERRORS), socket.create_connection(("127.0.0.1", proxy.port), timeout=10) as client:
        client.sendall(metadata_frame())
        client.recv(1)
    proxy.heal()
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=10) as client:
        assert ask(client, metadata_frame(3), API_METADATA, 9) == 3
