"""A node registration carries every advertised listener (name -> host:port) and still reads the registrations
written before the field existed (host and port alone) — in etcd keys and Kubernetes annotations alike."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shale.sidecar.replication.store_records import ListenerAddress, NodeRegistration, RecordError

names = st.text(st.characters(min_codepoint=33, max_codepoint=0x2FFF), min_size=1, max_size=12)
hosts = st.text(min_size=1, max_size=30) | st.sampled_from(["127.0.0.2", "::1", "fe80::1%eth0", "node-0.svc"])
ports = st.integers(1, 65535)
listener_sets = st.dictionaries(names, st.tuples(hosts, ports), max_size=4).map(
    lambda found: tuple(sorted(ListenerAddress(name, host, port) for name, (host, port) in found.items())))
registrations = st.builds(NodeRegistration, st.integers(0, 2**31 - 1), st.text(max_size=20), hosts, ports,
                          st.none() | st.text(max_size=10), st.just(()), listener_sets)


@given(registrations)
def test_every_listener_survives_the_round_trip(node):
    again = NodeRegistration.from_json(node.to_json(), "/shale/c/nodes/0")
    assert again == node
    for address in node.listeners:
        assert again.endpoint(address.name) == (address.host, address.port)
    assert again.endpoint("NOT-A-LISTENER" * 2) is None


def test_a_registration_without_listeners_is_as_short_as_before_and_reads_as_before():
    old = '{"host": "10.0.0.7", "incarnation": "abc", "node_id": 3, "port": 9092, "rack": null}'
    node = NodeRegistration.from_json(old, "/shale/c/nodes/3")
    assert (node.host, node.port, node.listeners) == ("10.0.0.7", 9092, ())
    assert node.endpoint("PLAINTEXT") is None
    assert json.loads(node.to_json()) == json.loads(old)


def test_the_listeners_are_written_as_kafka_names_them():
    node = NodeRegistration(1, "i", "127.0.0.2", 9094, listeners=(
        ListenerAddress("CLIENT", "127.0.0.1", 9093), ListenerAddress("REPLICATION", "127.0.0.2", 9094)))
    assert json.loads(node.to_json())["listeners"] == {"CLIENT": "127.0.0.1:9093", "REPLICATION": "127.0.0.2:9094"}


@pytest.mark.parametrize("listeners", [["CLIENT:1"], {"CLIENT": "no-port"}, {"CLIENT": ":9092"},
                                       {"CLIENT": "h:0"}, {"CLIENT": "h:70000"}, {"CLIENT": 9092}, {"C": "h:-1"}])
def test_a_damaged_listener_is_a_record_error_naming_the_key(listeners):
    raw = {"host": "h", "incarnation": "i", "node_id": 0, "port": 1, "listeners": listeners}
    with pytest.raises(RecordError, match=r"^/shale/c/nodes/0: not a node registration"):
        NodeRegistration.from_json(json.dumps(raw), "/shale/c/nodes/0")
