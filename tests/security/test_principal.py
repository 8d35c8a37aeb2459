"""Principals and `ssl.principal.mapping.rules`: Kafka's SslPrincipalMapperTest, and the DN of a real
client certificate read through a real TLS handshake."""

from __future__ import annotations

import socket
import ssl
import subprocess
import threading

import pytest

from shale.sidecar.security.principal import (
    ANONYMOUS,
    KafkaPrincipal,
    NoMatchingRule,
    SslPrincipalMapper,
    parse_super_users,
    rfc2253_name,
    ssl_principal,
)


@pytest.mark.parametrize("rules", [
    "DEFAULT",
    "RULE:^CN=(.*?),OU=ServiceUsers.*$/$1/",
    "RULE:^CN=(.*?),OU=ServiceUsers.*$/$1/L, DEFAULT",
    "RULE:^CN=(.*?),OU=(.*?),O=(.*?),L=(.*?),ST=(.*?),C=(.*?)$/$1@$2/",
    "RULE:^.*[Cc][Nn]=([a-zA-Z0-9.]*).*$/$1/L",
    "RULE:^cn=(.?),ou=(.?),dc=(.?),dc=(.?)$/$1@$2/U",
    "RULE:^CN=([^,ADEFLTU,]+)(,.*|$)/$1/",
    "RULE:^CN=([^,DEFAULT,]+)(,.*|$)/$1/",
])
def test_valid_rules(rules):
    SslPrincipalMapper.from_rules(rules)


@pytest.mark.parametrize("rules", [
    "default", "DEFAUL", "DEFAULT/L", "DEFAULT/U",
    "RULE:CN=(.*?),OU=ServiceUsers.*/$1",
    "rule:^CN=(.*?),OU=ServiceUsers.*$/$1/",
    "RULE:^CN=(.*?),OU=ServiceUsers.*$/$1/L/U",
    "RULE:^CN=(.*?),OU=ServiceUsers.*$/L",
    "RULE:^CN=(.*?),OU=ServiceUsers.*$/U",
    "RULE:^CN=(.*?),OU=ServiceUsers.*$/LU",
])
def test_invalid_rules(rules):
    with pytest.raises(ValueError, match="Invalid rule"):
        SslPrincipalMapper.from_rules(rules)


def test_ssl_principal_mapper():
    mapper = SslPrincipalMapper.from_rules(", ".join([
        "RULE:^CN=(.*?),OU=ServiceUsers.*$/$1/L",
        "RULE:^CN=(.*?),OU=(.*?),O=(.*?),L=(.*?),ST=(.*?),C=(.*?)$/$1@$2/L",
        "RULE:^cn=(.*?),ou=(.*?),dc=(.*?),dc=(.*?)$/$1@$2/U",
        "RULE:^.*[Cc][Nn]=([a-zA-Z0-9.]*).*$/$1/U",
        "DEFAULT"]))
    assert mapper.name("CN=Duke,OU=ServiceUsers,O=Org,C=US") == "duke"
    assert mapper.name("CN=Duke,OU=SME,O=mycp,L=Fulton,ST=MD,C=US") == "duke@sme"
    assert mapper.name("cn=duke,ou=sme,dc=mycp,dc=com") == "DUKE@SME"
    assert mapper.name("cN=duke,OU=JavaSoft,O=Sun Microsystems") == "DUKE"
    assert mapper.name("OU=JavaSoft,O=Sun Microsystems,C=US") == "OU=JavaSoft,O=Sun Microsystems,C=US"


@pytest.mark.parametrize("expected, rules", [
    ("[]", ""),
    ("[DEFAULT]", "DEFAULT"),
    ("[RULE:/]", "RULE://"),
    ("[RULE:/.*]", "RULE:/.*/"),
    ("[RULE:/.*/L]", "RULE:/.*/L"),
    ("[RULE:/, DEFAULT]", "RULE://,DEFAULT"),
    ("[RULE:/, DEFAULT]", "  RULE:// ,  DEFAULT  "),
    ("[RULE:   /     , DEFAULT]", "  RULE:   /     / ,  DEFAULT  "),
    ("[RULE:  /     /U, DEFAULT]", "  RULE:  /     /U   ,DEFAULT  "),
    ("[RULE:([A-Z]*)/$1/U, RULE:([a-z]+)/$1, DEFAULT]", "  RULE:([A-Z]*)/$1/U   ,RULE:([a-z]+)/$1/,   DEFAULT  "),
    ("[]", ",   , , ,      , , ,   "),
    ("[RULE:/, DEFAULT]", ",,RULE://,,,DEFAULT,,"),
    ("[RULE: /   , DEFAULT]", ",  , RULE: /   /    ,,,   DEFAULT, ,   "),
    ("[RULE:   /  /U, DEFAULT]", "     ,  , RULE:   /  /U    ,,  ,DEFAULT, ,"),
    ("[RULE:\\/\\\\\\(\\)\\n\\t/\\/\\/]", "RULE:\\/\\\\\\(\\)\\n\\t/\\/\\//"),
    ("[RULE:\\**\\/+/*/L, RULE:\\/*\\**/**]", "RULE:\\**\\/+/*/L,RULE:\\/*\\**/**/"),
    ("[RULE:,RULE:,/,RULE:,\\//U, RULE:,/RULE:,, RULE:,RULE:,/L,RULE:,/L, RULE:, DEFAULT, /DEFAULT, DEFAULT]",
     "RULE:,RULE:,/,RULE:,\\//U,RULE:,/RULE:,/,RULE:,RULE:,/L,RULE:,/L,RULE:, DEFAULT, /DEFAULT/,DEFAULT"),
])
def test_rules_splitting(expected, rules):
    assert str(SslPrincipalMapper.from_rules(rules)) == expected


def test_comma_with_whitespace():
    mapper = SslPrincipalMapper.from_rules("RULE:^CN=((\\\\, *|\\w)+)(,.*|$)/$1/,DEFAULT")
    assert mapper.name("CN=Tkac\\, Adam,OU=ITZ,DC=geodis,DC=cz") == "Tkac\\, Adam"


def test_java_replacement_semantics():
    # $12 with one group is group 1 then "2"; $3 beyond the groups stays text; \$ is a literal dollar
    mapper = SslPrincipalMapper.from_rules(r"RULE:^CN=(\w+).*$/$12-$3-\$1/")
    assert mapper.name("CN=bob,O=x") == "bob2-$3-$1"
    with pytest.raises(NoMatchingRule, match="No rules apply to O=x"):
        SslPrincipalMapper.from_rules("RULE:^CN=(.*)$/$1/").name("O=x")


def test_kafka_principal_and_super_users():
    assert KafkaPrincipal.parse("User:CN=a:b,O=c") == KafkaPrincipal("User", "CN=a:b,O=c")
    assert str(KafkaPrincipal.user("alice")) == "User:alice" and str(ANONYMOUS) == "User:ANONYMOUS"
    with pytest.raises(ValueError, match="principalType:principalName but got alice"):
        KafkaPrincipal.parse("alice")
    assert parse_super_users("User:admin; User:CN=op,O=Shale ;") == {
        KafkaPrincipal.user("admin"), KafkaPrincipal.user("CN=op,O=Shale")}


def test_rfc2253_escaping_order_and_multi_valued_rdns():
    subject = ((("countryName", "US"),), (("organizationName", "Acme, Inc."),),
               (("organizationalUnitName", "ops"), ("userId", "u1")), (("commonName", " #lead+1 "),),
               (("emailAddress", "a@b.c"),))
    assert rfc2253_name(subject) == ("1.2.840.113549.1.9.1=#16056140622e63,CN=\\ #lead\\+1\\ ,OU=ops+UID=u1,"
                                     "O=Acme\\, Inc.,C=US")


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True)


def test_the_principal_of_a_real_client_certificate(tmp_path):
    """A TLS server requiring client certificates maps the verified peer's DN; no certificate: ANONYMOUS."""
    d = tmp_path
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{d}/ca.key", "-out", f"{d}/ca.pem",
             "-days", "1", "-subj", "/CN=test-ca")
    for name, subj in (("server", "/CN=localhost"), ("client", "/C=US/O=Acme, Inc./OU=ServiceUsers/CN=Alice")):
        _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{d}/{name}.key", "-out", f"{d}/{name}.csr",
                 "-subj", subj)
        _openssl("x509", "-req", "-in", f"{d}/{name}.csr", "-CA", f"{d}/ca.pem", "-CAkey", f"{d}/ca.key",
                 "-CAcreateserial", "-out", f"{d}/{name}.pem", "-days", "1")
    mapper = SslPrincipalMapper.from_rules("RULE:^CN=(.*?),OU=ServiceUsers.*$/$1/L,DEFAULT")

    def principal_of(client_cert: bool, required: bool) -> KafkaPrincipal:
        server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        server_ctx.load_cert_chain(f"{d}/server.pem", f"{d}/server.key")
        server_ctx.load_verify_locations(f"{d}/ca.pem")
        server_ctx.verify_mode = ssl.CERT_REQUIRED if required else ssl.CERT_OPTIONAL
        client_ctx = ssl.create_default_context(cafile=f"{d}/ca.pem")
        if client_cert:
            client_ctx.load_cert_chain(f"{d}/client.pem", f"{d}/client.key")
        listener = socket.create_server(("127.0.0.1", 0))
        result: list[KafkaPrincipal] = []

        def serve() -> None:
            conn, _ = listener.accept()
            with server_ctx.wrap_socket(conn, server_side=True) as tls:
                result.append(ssl_principal((tls.getpeercert() or {}).get("subject"), mapper))
                tls.recv(1)

        t = threading.Thread(target=serve)
        t.start()
        with socket.create_connection(listener.getsockname()) as raw, \
                client_ctx.wrap_socket(raw, server_hostname="localhost") as tls:
            tls.sendall(b"x")
        t.join(10)
        listener.close()
        return result[0]

    assert principal_of(client_cert=True, required=True) == KafkaPrincipal.user("alice")
    assert principal_of(client_cert=False, required=False) == ANONYMOUS
    other = SslPrincipalMapper.from_rules("DEFAULT")
    subject = (((("countryName", "US"),), (("organizationName", "Acme, Inc."),),
                (("organizationalUnitName", "ServiceUsers"),), (("commonName", "Alice"),)))
    assert ssl_principal(subject, other) == KafkaPrincipal.user("CN=Alice,OU=ServiceUsers,O=Acme\\, Inc.,C=US")
