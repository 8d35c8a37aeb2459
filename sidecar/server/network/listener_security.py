"""The Kafka port's listeners as `shale serve` runs them: Kafka's listener, TLS and SASL settings read from
`--override`, turned into one `ListenerSecurity` per listener (bind address, advertised address, TLS context,
SASL config, principal mapping).

Settings are Kafka's names, each also read with a listener's prefix first (`listener.name.<lower>.ssl.…`),
as Kafka's `ListenerName.configPrefix` lookups do. TLS material is PEM, Kafka's PEM keystore:
`ssl.keystore.type=PEM` (the only type; it may be omitted), `ssl.keystore.location` a PEM file with the private
key and the certificate chain, or — a Shale addition for cert-manager's `tls.crt`/`tls.key` — the chain alone
with the key in `ssl.keystore.key.location`; `ssl.truststore.location` the PEM CA bundle client certificates
are verified against. Encrypted keys (`ssl.key.password`) are refused: a password on the command line is the
secret Shale keeps out of argv and logs. Without `listeners`, the one listener is `PLAINTEXT` on `--listen`
(the embedded default, unchanged).
"""

from __future__ import annotations

import re
import ssl
from dataclasses import dataclass
from typing import Mapping

from ...security.listeners import (
    ADVERTISED_LISTENERS,
    INTER_BROKER_LISTENER_NAME,
    INTER_BROKER_PROTOCOL,
    LISTENERS,
    PROTOCOL_MAP,
    Endpoint,
    ListenerConfig,
    ListenerConfigError,
    SecurityProtocol,
    config_prefix,
)
from ...security.principal import SslPrincipalMapper
from ...security.sasl import SaslConfig
from ...security.scram import CredentialLookup
from ...security.tls import CLIENT_AUTH, server_context

SASL_ENABLED_MECHANISMS = "sasl.enabled.mechanisms"
SASL_INTER_BROKER_MECHANISM = "sasl.mechanism.inter.broker.protocol"
SASL_JAAS_CONFIG = "sasl.jaas.config"
SSL_KEYSTORE_TYPE = "ssl.keystore.type"
SSL_KEYSTORE_LOCATION = "ssl.keystore.location"
SSL_KEYSTORE_KEY_LOCATION = "ssl.keystore.key.location"  # Shale: the key in a file of its own (cert-manager)
SSL_TRUSTSTORE_TYPE = "ssl.truststore.type"
SSL_TRUSTSTORE_LOCATION = "ssl.truststore.location"
SSL_CLIENT_AUTH = "ssl.client.auth"
SSL_PRINCIPAL_MAPPING_RULES = "ssl.principal.mapping.rules"
SSL_ENDPOINT_IDENTIFICATION = "ssl.endpoint.identification.algorithm"
SSL_KEY_PASSWORD = "ssl.key.password"
FAILED_AUTHENTICATION_DELAY_MS = "connection.failed.authentication.delay.ms"
MAX_REAUTH_MS = "connections.max.reauth.ms"

# Kafka's defaults where Shale can follow them: sasl.enabled.mechanisms defaults to GSSAPI in Kafka, which
# Shale does not have; the SCRAM mechanisms are the default here (PLAIN sends the password itself: opt in).
DEFAULTS = {SASL_ENABLED_MECHANISMS: "SCRAM-SHA-512,SCRAM-SHA-256", SSL_CLIENT_AUTH: "none",
            SSL_ENDPOINT_IDENTIFICATION: "https", FAILED_AUTHENTICATION_DELAY_MS: "100", MAX_REAUTH_MS: "0",
            SSL_PRINCIPAL_MAPPING_RULES: "DEFAULT"}
PER_LISTENER = (SASL_ENABLED_MECHANISMS, SSL_KEYSTORE_TYPE, SSL_KEYSTORE_LOCATION, SSL_KEYSTORE_KEY_LOCATION,
                SSL_TRUSTSTORE_TYPE, SSL_TRUSTSTORE_LOCATION, SSL_CLIENT_AUTH, SSL_PRINCIPAL_MAPPING_RULES,
                SSL_ENDPOINT_IDENTIFICATION, SSL_KEY_PASSWORD, MAX_REAUTH_MS)
GLOBAL = (LISTENERS, ADVERTISED_LISTENERS, PROTOCOL_MAP, INTER_BROKER_LISTENER_NAME, INTER_BROKER_PROTOCOL,
          SASL_INTER_BROKER_MECHANISM, SASL_JAAS_CONFIG, FAILED_AUTHENTICATION_DELAY_MS)
_JAAS_KEY = re.compile(r"listener\.name\.[^.]+\.(plain|scram-sha-256|scram-sha-512)\.sasl\.jaas\.config")


def is_security_setting(name: str) -> bool:
    """Whether an `--override` key is one of the listener settings read here (the rest are ServerConfig's)."""
    if name in GLOBAL or name in PER_LISTENER:
        return True
    if name.startswith("listener.name."):
        rest = name.split(".", 3)[-1] if name.count(".") >= 3 else ""
        return rest in PER_LISTENER or _JAAS_KEY.fullmatch(name) is not None
    return False


def split_settings(overrides: Mapping[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    """(the listener settings, everything else) of `--override`."""
    security = {k: v for k, v in overrides.items() if is_security_setting(k)}
    return security, {k: v for k, v in overrides.items() if k not in security}


def listener_setting(settings: Mapping[str, str], listener: str, name: str) -> str | None:
    """A per-listener setting: `listener.name.<lower>.<name>` first, then `<name>`, then the default."""
    value = settings.get(config_prefix(listener) + name, settings.get(name, DEFAULTS.get(name)))
    return None if value is None else value.strip()


def _int(name: str, value: str | None) -> int:
    try:
        result = int(value if value is not None else DEFAULTS[name])
    except ValueError:
        raise ListenerConfigError(f"Invalid value {value} for configuration {name}: Not a number of type LONG") \
            from None
    if result < 0:
        raise ListenerConfigError(f"Invalid value {result} for configuration {name}: Value must be at least 0")
    return result


@dataclass(frozen=True)
class ListenerSecurity:
    """One listener of the Kafka port: where it binds, what it advertises, and how it authenticates."""

    endpoint: Endpoint
    advertised: Endpoint | None  # None: Metadata on it names the node's registered (inter-broker) address
    ssl_context: ssl.SSLContext | None = None
    sasl: SaslConfig | None = None
    principal_mapper: SslPrincipalMapper = SslPrincipalMapper.from_rules(None)
    failed_authentication_delay_ms: int = 100

    @property
    def name(self) -> str:
        return self.endpoint.listener

    @property
    def protocol(self) -> SecurityProtocol:
        return self.endpoint.protocol

    @classmethod
    def plaintext(cls, host: str, port: int) -> ListenerSecurity:
        """`--listen` without `listeners`: advertised as the node's address (`--advertised-host`/`-port`)."""
        return cls(Endpoint("PLAINTEXT", SecurityProtocol.PLAINTEXT, host, port), None)


def _pem_type(settings: Mapping[str, str], listener: str, name: str) -> None:
    kind = listener_setting(settings, listener, name)
    if kind is not None and kind.upper() != "PEM":
        raise ListenerConfigError(f"{name}={kind} for listener {listener}: only PEM files are read (Kafka's PEM "
                                  "keystore and truststore); convert the store with openssl or keytool")


def tls_files(settings: Mapping[str, str], listener: str) -> tuple[str | None, str | None, str | None]:
    """(certificate chain, private key, CA bundle) of a listener's PEM keystore and truststore."""
    if listener_setting(settings, listener, SSL_KEY_PASSWORD) is not None:
        raise ListenerConfigError(f"{SSL_KEY_PASSWORD} for listener {listener}: encrypted private keys are not "
                                  f"supported (a password in --override is in the process's argv); give "
                                  f"{SSL_KEYSTORE_LOCATION} an unencrypted PEM key from a Secret")
    _pem_type(settings, listener, SSL_KEYSTORE_TYPE)
    _pem_type(settings, listener, SSL_TRUSTSTORE_TYPE)
    chain = listener_setting(settings, listener, SSL_KEYSTORE_LOCATION)
    key = listener_setting(settings, listener, SSL_KEYSTORE_KEY_LOCATION) or chain
    return chain, key, listener_setting(settings, listener, SSL_TRUSTSTORE_LOCATION)


def _server_ssl_context(settings: Mapping[str, str], listener: str) -> ssl.SSLContext:
    chain, key, ca = tls_files(settings, listener)
    if chain is None:
        raise ListenerConfigError(f"listener {listener} uses TLS but has no {SSL_KEYSTORE_LOCATION} "
                                  f"(or {config_prefix(listener)}{SSL_KEYSTORE_LOCATION})")
    client_auth = (listener_setting(settings, listener, SSL_CLIENT_AUTH) or "none").lower()
    if client_auth not in CLIENT_AUTH:
        raise ListenerConfigError(f"Invalid value {client_auth} for configuration {SSL_CLIENT_AUTH} of listener "
                                  f"{listener}: String must be one of: {', '.join(CLIENT_AUTH)}")
    if client_auth != "none" and ca is None:
        raise ListenerConfigError(f"{SSL_CLIENT_AUTH}={client_auth} for listener {listener} needs "
                                  f"{SSL_TRUSTSTORE_LOCATION}, the CA client certificates are verified against")
    return server_context(chain, key, ca, client_auth)


def _sasl_config(settings: Mapping[str, str], listener: str, credentials: CredentialLookup) -> SaslConfig:
    mechanisms = tuple(m.strip().upper() for m in
                       (listener_setting(settings, listener, SASL_ENABLED_MECHANISMS) or "").split(",") if m.strip())
    try:
        return SaslConfig(mechanisms, credentials,
                          _int(MAX_REAUTH_MS, listener_setting(settings, listener, MAX_REAUTH_MS)))
    except ValueError as exc:
        raise ListenerConfigError(f"listener {listener}: {exc}") from None


def listener_securities(settings: Mapping[str, str], listen: tuple[str, int], advertised_host: str | None,
                        credentials: CredentialLookup
                        ) -> tuple[ListenerConfig | None, list[ListenerSecurity]]:
    """Every listener to open, the inter-broker one first. Without `listeners` (and any other listener setting)
    it is `--listen` as PLAINTEXT (config None; `--advertised-host`/`--advertised-port` apply as before). With
    `listeners`, `advertised.listeners` says what is advertised; `--advertised-host` fills an empty host.
    ListenerConfigError or ValueError (a TLS file) names the setting."""
    if not any(k in settings for k in (LISTENERS, ADVERTISED_LISTENERS, PROTOCOL_MAP, INTER_BROKER_LISTENER_NAME,
                                       INTER_BROKER_PROTOCOL)):
        host, port = listen
        return None, [ListenerSecurity.plaintext(host, port)]
    config = ListenerConfig.from_settings(settings)
    delay = _int(FAILED_AUTHENTICATION_DELAY_MS, settings.get(FAILED_AUTHENTICATION_DELAY_MS))
    advertised = {e.listener: e for e in config.advertised}
    out = []
    for endpoint in config.listeners:
        name = endpoint.listener
        shown = advertised.get(name)
        if shown is not None and shown.host is None:  # an empty advertised host: this machine, as told
            shown = Endpoint(name, shown.protocol, advertised_host or "127.0.0.1", shown.port)
        out.append(ListenerSecurity(
            endpoint, shown,
            ssl_context=_server_ssl_context(settings, name) if endpoint.protocol.uses_tls else None,
            sasl=_sasl_config(settings, name, credentials) if endpoint.protocol.uses_sasl else None,
            principal_mapper=_mapper(settings, name), failed_authentication_delay_ms=delay))
    out.sort(key=lambda s: s.name != config.inter_broker_listener)
    return config, out


def _mapper(settings: Mapping[str, str], listener: str) -> SslPrincipalMapper:
    try:
        return SslPrincipalMapper.from_rules(listener_setting(settings, listener, SSL_PRINCIPAL_MAPPING_RULES))
    except ValueError as exc:
        raise ListenerConfigError(f"{SSL_PRINCIPAL_MAPPING_RULES} of listener {listener}: {exc}") from None

