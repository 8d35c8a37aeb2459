"""Kafka's listener settings: `listeners`, `advertised.listeners`, `listener.security.protocol.map`,
`inter.broker.listener.name`, parsed and checked with Kafka's rules and messages.

A listener is `NAME://host:port`; its name picks the security protocol through the map, whose default
maps each protocol's own name to itself, so `SASL_SSL://:9093` needs no map. Names are upper-cased
(`ListenerName.normalised`), an empty host binds every interface, and per-listener settings take the
prefix `listener.name.<lower-case name>.` (`config_prefix`).
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping
from dataclasses import dataclass
from enum import IntEnum

LISTENERS = "listeners"
ADVERTISED_LISTENERS = "advertised.listeners"
PROTOCOL_MAP = "listener.security.protocol.map"
INTER_BROKER_LISTENER_NAME = "inter.broker.listener.name"
INTER_BROKER_PROTOCOL = "security.inter.broker.protocol"
DEFAULT_LISTENERS = "PLAINTEXT://:9092"

_URI = re.compile(r"(.*)://\[?([0-9a-zA-Z\-%._:]*)\]?:(-?[0-9]+)")


class SecurityProtocol(IntEnum):
    """Kafka's security protocols, with their ids."""

    PLAINTEXT = 0
    SSL = 1
    SASL_PLAINTEXT = 2
    SASL_SSL = 3

    @property
    def uses_tls(self) -> bool:
        return self in (SecurityProtocol.SSL, SecurityProtocol.SASL_SSL)

    @property
    def uses_sasl(self) -> bool:
        return self in (SecurityProtocol.SASL_PLAINTEXT, SecurityProtocol.SASL_SSL)


DEFAULT_PROTOCOL_MAP: dict[str, SecurityProtocol] = {p.name: p for p in SecurityProtocol}


class ListenerConfigError(ValueError):
    """A listener setting Kafka would refuse; the message names the setting and the value."""


@dataclass(frozen=True)
class Endpoint:
    listener: str
    protocol: SecurityProtocol
    host: str | None  # None binds every interface
    port: int

    def __str__(self) -> str:
        host = self.host or ""
        if ":" in host:
            host = f"[{host}]"
        return f"{self.listener}://{host}:{self.port}"


def config_prefix(listener: str) -> str:
    """The prefix of a listener's own settings, e.g. `listener.name.client.sasl.enabled.mechanisms`."""
    return f"listener.name.{listener.lower()}."


def _protocol(name: str, setting: str) -> SecurityProtocol:
    try:
        return SecurityProtocol[name.strip().upper()]
    except KeyError:
        raise ListenerConfigError(f"Invalid security protocol `{name.strip()}` defined in {setting}") from None


def parse_protocol_map(value: str | None) -> dict[str, SecurityProtocol]:
    """`NAME:PROTOCOL,...`; None gives Kafka's default (each protocol's name maps to itself)."""
    if value is None:
        return dict(DEFAULT_PROTOCOL_MAP)
    result: dict[str, SecurityProtocol] = {}
    for entry in _csv(value):
        name, colon, protocol = entry.rpartition(":")
        if not colon or not name.strip():
            raise ListenerConfigError(f"Error parsing configuration property '{PROTOCOL_MAP}': "
                                      f"`{entry}` is not NAME:PROTOCOL")
        listener = name.strip().upper()
        if listener in result:
            raise ListenerConfigError(f"Error parsing configuration property '{PROTOCOL_MAP}': listener {listener} "
                                      "appears more than once; each listener name should only appear once in the map")
        result[listener] = _protocol(protocol, PROTOCOL_MAP)
    return result


def _csv(value: str) -> list[str]:
    return [item.strip() for item in value.split(",") if item.strip()]


def parse_endpoints(value: str, protocol_map: Mapping[str, SecurityProtocol], setting: str = LISTENERS,
                    require_distinct_ports: bool = True) -> list[Endpoint]:
    """A listener list as Kafka parses it (`listenerListToEndPoints`): unique names, and unique ports
    unless two listeners bind one port on an IPv4 and an IPv6 address."""
    items = _csv(value)
    if not items:
        raise ListenerConfigError(f"Configuration '{setting}' must not be empty.")
    if len(set(items)) != len(items):
        raise ListenerConfigError(f"Configuration '{setting}' values must not be duplicated.")
    try:
        endpoints = [_endpoint(item, protocol_map) for item in items]
    except ListenerConfigError as e:
        raise ListenerConfigError(f"Error creating broker listeners from '{value}': {e}") from None
    names = [e.listener for e in endpoints]
    if len(set(names)) != len(names):
        raise ListenerConfigError(f"Each listener must have a different name, listeners: {value}")
    if require_distinct_ports:
        _check_ports(endpoints, value)
    return endpoints


def _endpoint(item: str, protocol_map: Mapping[str, SecurityProtocol]) -> Endpoint:
    m = _URI.fullmatch(item)
    if m is None:
        raise ListenerConfigError(f"Unable to parse {item} to a broker endpoint")
    listener = m.group(1).upper()
    port = int(m.group(3))
    if not 0 <= port <= 65535:
        raise ListenerConfigError(f"Port {port} of {item} is not in 0..65535")
    if listener not in protocol_map:
        raise ListenerConfigError(f"No security protocol defined for listener {listener}")
    return Endpoint(listener, protocol_map[listener], m.group(2) or None, port)


def _ip_version(host: str | None) -> int | None:
    try:
        return ipaddress.ip_address(host).version if host else None
    except ValueError:
        return None


def _check_ports(endpoints: list[Endpoint], value: str) -> None:
    by_port: dict[int, list[Endpoint]] = {}
    for e in endpoints:
        if e.port != 0:  # an ephemeral port never collides
            by_port.setdefault(e.port, []).append(e)
    for port, same in by_port.items():
        if len(same) < 2:
            continue
        with_ip = [e for e in same if _ip_version(e.host) is not None]
        without_ip = [e for e in same if _ip_version(e.host) is None]
        if len(without_ip) > 1:
            raise ListenerConfigError(f"Each listener must have a different port, listeners: {value}")
        if len(with_ip) == 2:
            if {_ip_version(e.host) for e in with_ip} != {4, 6} or without_ip:
                raise ListenerConfigError("If you have two listeners on the same port then one needs to be IPv4 "
                                          f"and the other IPv6, listeners: {value}, port: {port}")
        elif with_ip:  # one IP host beside a name, or three IPs: Kafka refuses both
            raise ListenerConfigError("Each listener must have a different port unless exactly one listener has "
                                      f"an IPv4 address and the other IPv6 address, listeners: {value}, port: {port}")


@dataclass(frozen=True)
class ListenerConfig:
    listeners: tuple[Endpoint, ...]
    advertised: tuple[Endpoint, ...]
    protocol_map: Mapping[str, SecurityProtocol]
    inter_broker_listener: str

    @classmethod
    def from_settings(cls, settings: Mapping[str, str]) -> ListenerConfig:
        """The listener settings of a broker (Kafka's names), checked as `KafkaConfig` checks them."""
        protocol_map = parse_protocol_map(settings.get(PROTOCOL_MAP))
        listeners = parse_endpoints(settings.get(LISTENERS, DEFAULT_LISTENERS), protocol_map)
        advertised_value = settings.get(ADVERTISED_LISTENERS)
        advertised = listeners if advertised_value is None else parse_endpoints(
            advertised_value, protocol_map, ADVERTISED_LISTENERS, require_distinct_ports=False)
        if any(e.host == "0.0.0.0" for e in advertised):
            raise ListenerConfigError(f"{ADVERTISED_LISTENERS} cannot use the nonroutable meta-address 0.0.0.0. "
                                      "Use a routable IP address.")
        names = [e.listener for e in listeners]
        advertised_names = [e.listener for e in advertised]
        if not set(advertised_names) <= set(names):
            raise ListenerConfigError(
                f"{ADVERTISED_LISTENERS} listener names must be equal to or a subset of the ones defined in "
                f"{LISTENERS}. Found {','.join(advertised_names)}. The valid options based on the current "
                f"configuration are {','.join(names)}")
        inter_broker = cls._inter_broker_listener(settings, protocol_map)
        if inter_broker not in advertised_names:
            raise ListenerConfigError(
                f"{INTER_BROKER_LISTENER_NAME} must be a listener name defined in {ADVERTISED_LISTENERS}. "
                f"The valid options based on currently configured listeners are {','.join(advertised_names)}")
        return cls(tuple(listeners), tuple(advertised), protocol_map, inter_broker)

    @staticmethod
    def _inter_broker_listener(settings: Mapping[str, str], protocol_map: Mapping[str, SecurityProtocol]) -> str:
        name = settings.get(INTER_BROKER_LISTENER_NAME)
        if name is None:
            return _protocol(settings.get(INTER_BROKER_PROTOCOL, "PLAINTEXT"), INTER_BROKER_PROTOCOL).name
        if INTER_BROKER_PROTOCOL in settings:
            raise ListenerConfigError(f"Only one of {INTER_BROKER_LISTENER_NAME} and {INTER_BROKER_PROTOCOL} "
                                      "should be set.")
        listener = name.strip().upper()
        if listener not in protocol_map:
            raise ListenerConfigError(f"Listener with name {listener} defined in {INTER_BROKER_LISTENER_NAME} "
                                      f"not found in {PROTOCOL_MAP}.")
        return listener

    def listener(self, name: str) -> Endpoint:
        for e in self.listeners:
            if e.listener == name.upper():
                return e
        raise KeyError(name)
