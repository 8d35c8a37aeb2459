"""Kafka's ByteBufferAccessor: the primitive types of its JSON message schemas, read from one encoded value.

Records whose values are Kafka messages (the `__consumer_offsets` keys and values, KRaft's control
records) are decoded field by field with this reader; kafka-python's codec covers only requests,
responses and the consumer protocol. Sans-I/O: every error is the caller's error class, naming what was
read and the byte where it stopped.
"""

from __future__ import annotations

import struct
from typing import Literal, overload

_I16, _U16, _I32, _I64 = struct.Struct(">h"), struct.Struct(">H"), struct.Struct(">i"), struct.Struct(">q")


class MessageReader:
    """Reads `data` front to back; `what` names the message in errors, raised as `error(text)`.

    `utf8_errors` is how invalid UTF-8 in a string decodes: "strict" makes it an error, "replace" reads
    it as Java's `new String(bytes, UTF_8)` does.
    """

    def __init__(self, data: bytes | memoryview, what: str, error: type[Exception],
                 utf8_errors: str = "strict") -> None:
        self.data, self.pos, self.what, self.error, self.utf8_errors = memoryview(data), 0, what, error, utf8_errors

    def _take(self, n: int) -> memoryview:
        if n < 0 or self.pos + n > len(self.data):
            raise self.error(f"{self.what}: value ends at byte {len(self.data)}, {n} more bytes needed at byte "
                             f"{self.pos} (truncated)")
        out = self.data[self.pos : self.pos + n]
        self.pos += n
        return out

    def int8(self) -> int:
        return int.from_bytes(self._take(1), "big", signed=True)

    def int16(self) -> int:
        value: int = _I16.unpack(self._take(2))[0]
        return value

    def uint16(self) -> int:
        value: int = _U16.unpack(self._take(2))[0]
        return value

    def int32(self) -> int:
        value: int = _I32.unpack(self._take(4))[0]
        return value

    def int64(self) -> int:
        value: int = _I64.unpack(self._take(8))[0]
        return value

    def uuid(self) -> bytes:
        return bytes(self._take(16))

    def uvarint(self) -> int:
        value = shift = 0
        for _ in range(5):
            b = self._take(1)[0]
            value |= (b & 0x7F) << shift
            if not b & 0x80:
                return value
            shift += 7
        raise self.error(f"{self.what}: unsigned varint longer than 5 bytes at byte {self.pos}")

    def _length(self, flexible: bool, wide: bool, field: str, nullable: bool = False) -> int:
        """A length prefix: compact (varint + 1) in flexible versions, int16/int32 before; -1 is null."""
        n = self.uvarint() - 1 if flexible else self.int32() if wide else self.int16()
        if n < 0 and not (nullable and n == -1):
            raise self.error(f"{self.what}: non-nullable field {field} was serialized as null at byte {self.pos}")
        return n

    @overload
    def string(self, flexible: bool, field: str, nullable: Literal[False] = False) -> str: ...

    @overload
    def string(self, flexible: bool, field: str, nullable: bool) -> str | None: ...

    def string(self, flexible: bool, field: str, nullable: bool = False) -> str | None:
        n = self._length(flexible, False, field, nullable)
        if n < 0:
            return None
        if n > 0x7FFF:
            raise self.error(f"{self.what}: string field {field} had invalid length {n}")
        try:
            return str(self._take(n), "utf-8", self.utf8_errors)
        except UnicodeDecodeError as exc:
            raise self.error(f"{self.what}: invalid UTF-8 in string field {field}: {exc}") from None

    def bytes_(self, flexible: bool, field: str) -> bytes:
        return bytes(self._take(self._length(flexible, True, field)))

    def raw(self, n: int) -> bytes:
        """`n` bytes as they are (a tagged field's body, read with a reader of its own)."""
        return bytes(self._take(n))

    def array_length(self, flexible: bool, field: str, nullable: bool = False) -> int:
        return self._length(flexible, True, field, nullable)

    def skip_tagged_fields(self) -> None:
        """Tagged fields none of the schemas read here declares: skipped, as Kafka keeps unknown ones aside."""
        for _ in range(self.uvarint()):
            self.uvarint()  # tag
            self._take(self.uvarint())
