"""Errors of the log engine; each message names what it is about (topic-partition, offset, file)."""


class LogError(Exception):
    """Base class of log-engine errors."""


class CorruptRecordError(LogError):
    """Bytes that are not a valid record batch (bad CRC, size, magic, codec or framing)."""


class InvalidRecordError(LogError):
    """A well-formed batch that the log refuses (no key on a compacted topic, too large, bad offsets)."""


class RecordTooLargeError(LogError):
    """A batch larger than `max.message.bytes` or `segment.bytes` allows."""


class OffsetOutOfRangeError(LogError):
    """A read or truncation at an offset the log does not hold."""


class InvalidIndexEntryError(LogError):
    """An index refused an entry (full, out of order, or a relative offset that overflows int32)."""


class CorruptIndexError(LogError):
    """An index file whose contents contradict its segment."""
