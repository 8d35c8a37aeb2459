"""How a node connects to the other nodes' inter-broker listener (the replica fetcher's connections).

The inter-broker listener (`inter.broker.listener.name`, or `security.inter.broker.protocol`) decides the
protocol. With TLS the node trusts its listener's `ssl.truststore.location`, presents its own keystore (mutual
TLS, as Kafka's inter-broker client does) and checks the leader's host name unless
`ssl.endpoint.identification.algorithm` is empty. With SASL it authenticates with
`sasl.mechanism.inter.broker.protocol` (PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512; Kafka's GSSAPI default is not
available, so it must be set) as the user of the JAAS line Kafka reads,
`listener.name.<listener>.<mechanism>.sasl.jaas.config` or `sasl.jaas.config`:

    org.apache.kafka.common.security.scram.ScramLoginModule required username="node" passwordFile="/etc/pw";

`password="…"` works as in Kafka; `passwordFile` (a Shale option) reads the password from a file (a mounted
Secret), so it is in neither argv nor a log line. The user needs a SCRAM credential on every node
(`shale scram-credential`) and, with an authorizer, CLUSTER_ACTION (make it a super user).
"""

from __future__ import annotations

import asyncio
import re
import ssl
import struct
from dataclasses import dataclass, field
from typing import Mapping

from kafka.net.sasl.scram import ScramClient

from ...protocol import error_codes
from ...protocol.client_codec import decode_response, encode_request
from ...security.listeners import ListenerConfig, ListenerConfigError, config_prefix
from ...security.sasl import PLAIN, SASL_AUTHENTICATE, SASL_HANDSHAKE, SUPPORTED_MECHANISMS
from .listener_security import (
    SASL_INTER_BROKER_MECHANISM,
    SASL_JAAS_CONFIG,
    SSL_ENDPOINT_IDENTIFICATION,
    listener_setting,
    tls_files,
)

_SIZE = struct.Struct(">i")
_JAAS = re.compile(r"\s*(\S+)\s+(required|requisite|sufficient|optional)\s*(.*?)\s*;?\s*", re.S)
_OPTION = re.compile(r'\s*([\w.-]+)\s*=\s*"((?:[^"\\]|\\.)*)"\s*')


class AuthenticationRefused(ConnectionError):
    """The leader refused this node's TLS or SASL credentials (its message, never ours)."""


def parse_jaas_options(text: str, setting: str) -> dict[str, str]:
    """The `key="value"` options of a one-module JAAS line (Kafka's JaasConfig grammar, quoted values)."""
    m = _JAAS.fullmatch(text)
    if m is None:
        raise ListenerConfigError(f"{setting}: expected 'LoginModule required key=\"value\" ...;'")
    options, rest = {}, m.group(3)
    while rest:
        o = _OPTION.match(rest)
        if o is None:
            raise ListenerConfigError(f"{setting}: cannot read the options from {rest[:20]!r}...: "
                                      'expected key="value"')
        options[o.group(1)] = re.sub(r"\\(.)", r"\1", o.group(2))
        rest = rest[o.end():]
    return options


@dataclass(frozen=True)
class InterBrokerClient:
    """This node as a client of the others' inter-broker listener."""

    listener: str
    ssl_context: ssl.SSLContext | None = None
    mechanism: str | None = None
    username: str | None = None
    password: str | None = field(default=None, repr=False)

    @classmethod
    def from_settings(cls, settings: Mapping[str, str], config: ListenerConfig | None) -> InterBrokerClient:
        if config is None:
            return cls("PLAINTEXT")
        name = config.inter_broker_listener
        protocol = config.protocol_map[name]
        context = _client_ssl_context(settings, name) if protocol.uses_tls else None
        if not protocol.uses_sasl:
            return cls(name, context)
        mechanism = (settings.get(SASL_INTER_BROKER_MECHANISM) or "").strip().upper()
        if mechanism not in SUPPORTED_MECHANISMS:
            raise ListenerConfigError(f"{SASL_INTER_BROKER_MECHANISM} must be one of {', '.join(SUPPORTED_MECHANISMS)} "
                                      f"when the inter-broker listener {name} uses {protocol.name} (got "
                                      f"{mechanism or 'nothing'}; Kafka's default GSSAPI is not supported)")
        key = f"{config_prefix(name)}{mechanism.lower()}.{SASL_JAAS_CONFIG}"
        setting = key if key in settings else SASL_JAAS_CONFIG
        if setting not in settings:
            raise ListenerConfigError(f"the inter-broker listener {name} uses SASL: set {key} (or "
                                      f"{SASL_JAAS_CONFIG}) to the node's user (username=, passwordFile=)")
        options = parse_jaas_options(settings[setting], setting)
        if "username" not in options:
            raise ListenerConfigError(f"{setting}: no username")
        if "passwordFile" in options:
            try:
                with open(options["passwordFile"], encoding="utf-8") as f:
                    password = f.read().rstrip("\r\n")
            except OSError as exc:
                raise ListenerConfigError(f"{setting}: passwordFile {options['passwordFile']}: {exc.strerror}") \
                    from None
        elif "password" in options:
            password = options["password"]
        else:
            raise ListenerConfigError(f"{setting}: no password (password= or passwordFile=)")
        return cls(name, context, mechanism, options["username"], password)

    async def connect(self, host: str, port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """A connection to a leader's inter-broker listener, authenticated when it uses SASL."""
        reader, writer = await asyncio.open_connection(host, port, ssl=self.ssl_context,
                                                       server_hostname=host if self.ssl_context else None)
        if self.mechanism is not None:
            try:
                await self._authenticate(reader, writer)
            except BaseException:
                writer.close()
                raise
        return reader, writer

    async def _authenticate(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        client_id = f"shale-inter-broker-{self.username}"
        body = await _exchange(reader, writer, SASL_HANDSHAKE, 1, 1, client_id, {"mechanism": self.mechanism})
        if body.error_code != error_codes.NONE:
            raise AuthenticationRefused(f"SaslHandshake {self.mechanism}: {error_codes.name_of(body.error_code)} "
                                        f"(the leader offers {', '.join(body.mechanisms)})")
        if self.mechanism == PLAIN:
            tokens = [b"\0" + self.username.encode() + b"\0" + self.password.encode()]
            scram = None
        else:
            scram = ScramClient(self.username, self.password, self.mechanism)
            tokens = [scram.first_message()]
        step = 0
        while tokens:
            body = await _exchange(reader, writer, SASL_AUTHENTICATE, 2, 2 + step, client_id,
                                   {"auth_bytes": tokens.pop()})
            if body.error_code != error_codes.NONE:
                raise AuthenticationRefused(f"SaslAuthenticate as {self.username!r} with {self.mechanism}: "
                                            f"{error_codes.name_of(body.error_code)}: {body.error_message}")
            if scram is not None and step == 0:
                scram.process_server_first_message(body.auth_bytes)
                tokens.append(scram.final_message())
            elif scram is not None:
                try:
                    scram.process_server_final_message(body.auth_bytes)
                except ValueError as exc:  # the leader does not know our credential: not the node we meant
                    raise AuthenticationRefused(f"the leader's SCRAM signature did not verify: {exc}") from None
            step += 1


async def _exchange(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, api_key: int, version: int,
                    correlation_id: int, client_id: str, body: dict):
    writer.write(encode_request(api_key, version, correlation_id, client_id, body))
    await writer.drain()
    (size,) = _SIZE.unpack(await reader.readexactly(4))
    return decode_response(api_key, version, await reader.readexactly(size)).body


def _client_ssl_context(settings: Mapping[str, str], listener: str) -> ssl.SSLContext:
    """Trust the listener's truststore (the system's without one), present its keystore (mutual TLS)."""
    chain, key, ca = tls_files(settings, listener)
    try:
        context = ssl.create_default_context(cafile=ca)
        if chain is not None:
            context.load_cert_chain(chain, key)
    except (OSError, ssl.SSLError) as exc:
        raise ValueError(f"inter-broker TLS of listener {listener}: {exc}") from None
    context.check_hostname = bool(listener_setting(settings, listener, SSL_ENDPOINT_IDENTIFICATION))
    return context

