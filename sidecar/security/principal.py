"""Who a connection is: Kafka's `KafkaPrincipal` and the TLS mapping rules `ssl.principal.mapping.rules`.

A principal is `type:name` ("User:alice"). Kafka's default principal builder gives PLAINTEXT connections
`User:ANONYMOUS`, SASL connections `User:<authorization id>`, and SSL connections `User:<mapped DN>` when
the client presented a verified certificate (ANONYMOUS otherwise). The DN is the RFC 2253 string Java's
`X500Principal.getName()` returns, mapped by the first rule that matches (`SslPrincipalMapper`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

USER_TYPE = "User"


@dataclass(frozen=True)
class KafkaPrincipal:
    principal_type: str
    name: str

    @classmethod
    def parse(cls, text: str) -> KafkaPrincipal:
        """`type:name`, split at the first colon (Kafka's `SecurityUtils.parseKafkaPrincipal`)."""
        if not text or ":" not in text:
            raise ValueError(f"expected a string in format principalType:principalName but got {text}")
        principal_type, name = text.split(":", 1)
        return cls(principal_type, name)

    @classmethod
    def user(cls, name: str) -> KafkaPrincipal:
        return cls(USER_TYPE, name)

    def __str__(self) -> str:
        return f"{self.principal_type}:{self.name}"


ANONYMOUS = KafkaPrincipal.user("ANONYMOUS")


def parse_super_users(value: str) -> frozenset[KafkaPrincipal]:
    """`super.users`: `;`-separated, because a DN inside a principal holds commas."""
    return frozenset(KafkaPrincipal.parse(p.strip()) for p in value.split(";") if p.strip())


# --- ssl.principal.mapping.rules -------------------------------------------------------------------

DEFAULT_RULES = "DEFAULT"
_RULE = r"(DEFAULT)|RULE:((\\.|[^\\/])*)/((\\.|[^\\/])*)/([LU]?).*?|(.*?)"
_SPLITTER = re.compile(r"\s*(" + _RULE + r")\s*(,\s*|$)")
_PARSER = re.compile(_RULE)
_BACK_REFERENCE = re.compile(r"\$(\d+)")


class NoMatchingRule(ValueError):
    """No rule maps this DN: Kafka refuses the connection's authentication."""


@dataclass(frozen=True)
class MappingRule:
    """One rule; `pattern` None is DEFAULT (the DN as it is)."""

    pattern: re.Pattern[str] | None
    replacement: str = ""
    case: str = ""  # "L", "U" or ""

    def apply(self, dn: str) -> str | None:
        if self.pattern is None:
            return dn
        if not self.pattern.fullmatch(dn):
            return None
        groups = self.pattern.groups
        replacement = _escape_missing_groups(self.replacement, groups)
        result = self.pattern.sub(lambda m: _expand_java(replacement, m), dn)
        return result.lower() if self.case == "L" else result.upper() if self.case == "U" else result

    def __str__(self) -> str:
        if self.pattern is None:
            return "DEFAULT"
        return f"RULE:{self.pattern.pattern}/{self.replacement}" + (f"/{self.case}" if self.case else "")


def _escape_missing_groups(replacement: str, groups: int) -> str:
    """Kafka (after NiFi) treats `$n` beyond the pattern's groups as text: `$12` with 1 group is `$1` then `2`."""
    if groups == 0:
        return replacement
    value = replacement
    for m in list(_BACK_REFERENCE.finditer(replacement)):
        digits = m.group(1)
        if digits.startswith("0"):
            continue
        index = int(digits)
        while index > groups and index >= 10:
            index //= 10
        if index > groups:
            # positions shift as escapes are added; find this reference again in the current value
            at = value.find("$" + digits, m.start())
            value = value[:at] + "\\" + value[at:]
    return value


def _expand_java(replacement: str, m: re.Match[str]) -> str:
    """Java's `Matcher.appendReplacement`: `\\x` is a literal x, `$n` a group (as many digits as name a group)."""
    out: list[str] = []
    i, n = 0, len(replacement)
    while i < n:
        c = replacement[i]
        if c == "\\":
            i += 1
            if i == n:
                raise ValueError("character to be escaped is missing")
            out.append(replacement[i])
            i += 1
        elif c == "$":
            i += 1
            if i == n or not replacement[i].isdigit():
                raise ValueError("Illegal group reference")
            ref = int(replacement[i])
            i += 1
            while i < n and replacement[i].isdigit() and ref * 10 + int(replacement[i]) <= m.re.groups:
                ref = ref * 10 + int(replacement[i])
                i += 1
            if ref > m.re.groups:
                raise ValueError(f"No group {ref}")
            out.append(m.group(ref) or "")
        else:
            out.append(c)
            i += 1
    return "".join(out)


@dataclass(frozen=True)
class SslPrincipalMapper:
    rules: tuple[MappingRule, ...]

    @classmethod
    def from_rules(cls, text: str | None) -> SslPrincipalMapper:
        """Parse `ssl.principal.mapping.rules` as Kafka does: comma-separated, empty entries ignored."""
        text = DEFAULT_RULES if text is None else text
        rules: list[MappingRule] = []
        for split in _SPLITTER.finditer(text.strip()):
            rule = split.group(1)
            m = _PARSER.match(rule)
            if m is None:
                raise ValueError(f"Invalid rule: {rule}")
            if m.end() != len(rule):
                raise ValueError(f"Invalid rule: `{rule}`, unmatched substring: `{rule[m.end():]}`")
            if m.group(1) is not None:
                rules.append(MappingRule(None))
            elif m.group(2) is not None:
                try:
                    pattern = re.compile(m.group(2))
                except re.error as e:
                    raise ValueError(f"Invalid rule: `{rule}`: {e}") from None
                rules.append(MappingRule(pattern, m.group(4), m.group(6)))
        return cls(tuple(rules))

    def name(self, dn: str) -> str:
        for rule in self.rules:
            mapped = rule.apply(dn)
            if mapped is not None:
                return mapped
        raise NoMatchingRule(f"No rules apply to {dn}, rules {self}")

    def __str__(self) -> str:
        return "[" + ", ".join(str(r) for r in self.rules) + "]"


# --- the DN of a peer certificate ------------------------------------------------------------------

# `ssl.SSLSocket.getpeercert()` attribute names → the keywords Java's RFC 2253 form uses; other
# attributes are written as `OID=#<hex of the DER value>`, as Java writes them.
_KEYWORDS = {"commonName": "CN", "countryName": "C", "localityName": "L", "stateOrProvinceName": "ST",
             "organizationName": "O", "organizationalUnitName": "OU", "streetAddress": "STREET",
             "domainComponent": "DC", "userId": "UID"}
_OIDS = {"emailAddress": ("1.2.840.113549.1.9.1", 0x16), "serialNumber": ("2.5.4.5", 0x13),
         "title": ("2.5.4.12", 0x0C), "givenName": ("2.5.4.42", 0x0C), "surname": ("2.5.4.4", 0x0C)}


def _escape_value(value: str) -> str:
    out = "".join("\\" + c if c in ',+"\\<>;' else c for c in value)
    if out.startswith((" ", "#")):
        out = "\\" + out
    if out.endswith(" ") and not out.endswith("\\ "):
        out = out[:-1] + "\\ "
    return out


def _der_hex(tag: int, value: str) -> str:
    data = value.encode("utf-8")
    if len(data) < 0x80:
        length = bytes([len(data)])
    else:
        size = len(data).to_bytes((len(data).bit_length() + 7) // 8, "big")
        length = bytes([0x80 | len(size)]) + size
    return "#" + (bytes([tag]) + length + data).hex()


def rfc2253_name(subject: tuple[tuple[tuple[str, str], ...], ...]) -> str:
    """The RFC 2253 DN of a `getpeercert()["subject"]`: RDNs last-first, multi-valued ones joined by `+`."""
    rdns = []
    for rdn in reversed(subject):
        parts = []
        for attribute, value in rdn:
            if attribute in _KEYWORDS:
                parts.append(f"{_KEYWORDS[attribute]}={_escape_value(value)}")
            elif attribute in _OIDS:
                oid, tag = _OIDS[attribute]
                parts.append(f"{oid}={_der_hex(tag, value)}")
            else:
                raise ValueError(f"certificate subject attribute {attribute!r} has no RFC 2253 form here")
        rdns.append("+".join(parts))
    return ",".join(rdns)


def ssl_principal(subject: tuple[tuple[tuple[str, str], ...], ...] | None,
                  mapper: SslPrincipalMapper) -> KafkaPrincipal:
    """The principal of an SSL connection: the mapped DN of a verified client certificate, else ANONYMOUS."""
    if not subject:
        return ANONYMOUS
    return KafkaPrincipal.user(mapper.name(rfc2253_name(subject)))
