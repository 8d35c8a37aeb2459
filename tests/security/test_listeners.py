"""Listener settings: Kafka's own cases (KafkaConfigTest) and messages."""

from __future__ import annotations

import pytest

from shale.sidecar.security.listeners import (
    Endpoint,
    ListenerConfig,
    ListenerConfigError,
    SecurityProtocol,
    config_prefix,
    parse_endpoints,
    parse_protocol_map,
)


def config(**settings: str) -> ListenerConfig:
    return ListenerConfig.from_settings({k.replace("_", "."): v for k, v in settings.items()})


def refused(match: str, **settings: str) -> None:
    with pytest.raises(ListenerConfigError, match=match):
        config(**settings)


def test_default_is_one_plaintext_listener_on_every_interface():
    c = config()
    assert c.listeners == (Endpoint("PLAINTEXT", SecurityProtocol.PLAINTEXT, None, 9092),)
    assert c.advertised == c.listeners and c.inter_broker_listener == "PLAINTEXT"


def test_default_map_names_every_protocol_after_itself():
    assert parse_protocol_map(None) == {p.name: p for p in SecurityProtocol}
    assert [p.value for p in SecurityProtocol] == [0, 1, 2, 3]
    assert [p.name for p in SecurityProtocol if p.uses_tls] == ["SSL", "SASL_SSL"]
    assert [p.name for p in SecurityProtocol if p.uses_sasl] == ["SASL_PLAINTEXT", "SASL_SSL"]


def test_named_listeners_through_the_map():
    c = config(listeners="CLIENT://:9093,replication://10.0.0.1:9094",
               listener_security_protocol_map="CLIENT:SASL_SSL,REPLICATION:ssl",
               advertised_listeners="CLIENT://kafka-0.example:9093,REPLICATION://10.0.0.1:9094",
               inter_broker_listener_name="replication")
    assert [(e.listener, e.protocol, e.host, e.port) for e in c.listeners] == [
        ("CLIENT", SecurityProtocol.SASL_SSL, None, 9093), ("REPLICATION", SecurityProtocol.SSL, "10.0.0.1", 9094)]
    assert c.advertised[0].host == "kafka-0.example" and c.inter_broker_listener == "REPLICATION"
    assert c.listener("client").port == 9093 and str(c.advertised[1]) == "REPLICATION://10.0.0.1:9094"
    assert config_prefix("CLIENT") == "listener.name.client."


def test_duplicate_port_and_duplicate_name():
    refused("Each listener must have a different port", listeners="PLAINTEXT://localhost:9091,SSL://localhost:9091")
    refused("Each listener must have a different name", listeners="PLAINTEXT://localhost:9091,PLAINTEXT://localhost:9092")
    refused("values must not be duplicated", listeners="PLAINTEXT://:9092,PLAINTEXT://:9092")


def test_advertised_listeners_may_share_a_port_but_not_a_name():
    base = dict(listener_security_protocol_map="HOST:SASL_SSL,LB:SASL_SSL", inter_broker_listener_name="HOST",
                listeners="HOST://localhost:9091,LB://localhost:9092")
    assert config(**base, advertised_listeners="HOST://localhost:9091,LB://localhost:9091").advertised[1].port == 9091
    refused("Each listener must have a different name", **base,
            advertised_listeners="HOST://localhost:9091,HOST://localhost:9092")


def test_one_port_for_an_ipv4_and_an_ipv6_address_only():
    c = config(listeners="PLAINTEXT://127.0.0.1:9092,SSL://[::1]:9092")
    assert [(e.host, e.port) for e in c.listeners] == [("127.0.0.1", 9092), ("::1", 9092)]
    assert str(c.listeners[1]) == "SSL://[::1]:9092"
    refused("one needs to be IPv4 and the other IPv6", listeners="PLAINTEXT://127.0.0.1:9092,SSL://127.0.0.2:9092")
    refused("one needs to be IPv4 and the other IPv6",
            listeners="PLAINTEXT://127.0.0.1:9092,SSL://[::1]:9092,SASL_SSL://myhost:9092")
    refused("unless exactly one listener has an IPv4 address", listeners="PLAINTEXT://127.0.0.1:9092,SSL://myhost:9092")
    assert len(config(listeners="PLAINTEXT://:0,SSL://:0").listeners) == 2  # ephemeral ports never collide


def test_protocols_and_names_that_do_not_exist():
    refused(r"Invalid security protocol `TLS` defined in listener.security.protocol.map",
            listener_security_protocol_map="CLIENT:TLS", listeners="CLIENT://:9092")
    refused("No security protocol defined for listener CLIENT", listeners="CLIENT://:9092")
    refused(r"Error parsing configuration property 'listener.security.protocol.map'",
            listener_security_protocol_map="CLIENT", listeners="PLAINTEXT://:9092")
    refused("should only appear once", listener_security_protocol_map="A:SSL,a:SASL_SSL", listeners="A://:1")


def test_unparsable_endpoints_name_the_value():
    refused(r"Error creating broker listeners from 'PLAINTEXT:/localhost:9092': Unable to parse "
            r"PLAINTEXT:/localhost:9092 to a broker endpoint", listeners="PLAINTEXT:/localhost:9092")
    refused("Unable to parse PLAINTEXT://localhost to a broker endpoint", listeners="PLAINTEXT://localhost")
    refused("Port 70000", listeners="PLAINTEXT://:70000")
    refused("must not be empty", listeners=" , ")


def test_advertised_listeners_rules():
    refused("cannot use the nonroutable meta-address 0.0.0.0", listeners="PLAINTEXT://0.0.0.0:9092")
    assert config(listeners="PLAINTEXT://0.0.0.0:9092", advertised_listeners="PLAINTEXT://kafka:9092")
    refused("advertised.listeners listener names must be equal to or a subset of the ones defined in listeners. "
            "Found PLAINTEXT,SSL", listeners="PLAINTEXT://:9092", advertised_listeners="PLAINTEXT://a:9092,SSL://a:9093")


def test_inter_broker_listener_rules():
    refused("inter.broker.listener.name must be a listener name defined in advertised.listeners. The valid options "
            "based on currently configured listeners are SASL_SSL", listeners="SASL_SSL://:9093")
    assert config(listeners="SASL_SSL://:9093", security_inter_broker_protocol="SASL_SSL").inter_broker_listener \
        == "SASL_SSL"
    refused("Only one of inter.broker.listener.name and security.inter.broker.protocol should be set.",
            listeners="SSL://:9093", inter_broker_listener_name="SSL", security_inter_broker_protocol="SSL")
    refused("Listener with name NOPE defined in inter.broker.listener.name not found in listener.security.protocol.map.",
            listeners="SSL://:9093", inter_broker_listener_name="nope")


def test_parse_endpoints_keeps_order_and_trims():
    eps = parse_endpoints(" SSL://a:1 , PLAINTEXT://b:2 ", parse_protocol_map(None))
    assert [str(e) for e in eps] == ["SSL://a:1", "PLAINTEXT://b:2"]


@pytest.mark.parametrize("listeners, message", [  # KafkaConfigTest.testIPv4AndIPv6SamePortListeners
    ("PLAINTEXT://127.0.0.1:9092,SSL://[::1]:9092", None),
    ("SSL://[::1]:9096,PLAINTEXT://127.0.0.1:9096", None),
    ("PLAINTEXT://[::1]:9092,SSL://[::1]:9092", "one needs to be IPv4 and the other IPv6"),
    ("PLAINTEXT://127.0.0.1:9092,SSL://127.0.0.1:9092", "one needs to be IPv4 and the other IPv6"),
    ("SSL://[::1]:9096,PLAINTEXT://127.0.0.1:9096,SASL_SSL://:9096", "one needs to be IPv4 and the other IPv6"),
    ("PLAINTEXT://127.0.0.1:9092,SSL://[::1]:9092,SASL_SSL://127.0.0.1:9092",
     "unless exactly one listener has an IPv4 address and the other IPv6 address"),
    ("PLAINTEXT://localhost:9092,SSL://localhost:9092", "Each listener must have a different port"),
])
def test_kafkas_same_port_cases(listeners, message):
    if message is None:
        assert len(config(listeners=listeners).listeners) == 2
    else:
        refused(message, listeners=listeners)
