"""Errors of the log engine; each message names what it is about (topic-partition, offset, file)."""


class LogError(Exception):
    """Base class of log-engine errors."""


class CorruptRecordError(LogError):
    """Bytes that are not a valid record batch (bad CRC, size, magic, codec or framing)."""


class InvalidRecordError(LogError):
    """A well-formed batch that the log refuses (no key on a compacted topic, too large, bad offsets)."""


class InvalidTimestampError(InvalidRecordError):
    """A record timestamp outside the topic's allowed window, or a producer-set LogAppendTime."""


class RecordTooLargeError(LogError):
    """A batch larger than `max.message.bytes` or `segment.bytes` allows."""


class OffsetOutOfRangeError(LogError):
    """A read or truncation at an offset the log does not hold."""


class InvalidIndexEntryError(LogError):
    """An index refused an entry (full, out of order, or a relative offset that overflows int32)."""


class CorruptIndexError(LogError):
    """An index file whose contents contradict its segment."""


class OutOfOrderSequenceError(InvalidRecordError):
    """An idempotent producer's batch whose sequence does not follow its last one (a gap, or a new epoch not at 0)."""

    error_code = 45  # Kafka's OUT_OF_ORDER_SEQUENCE_NUMBER


class InvalidProducerEpochError(InvalidRecordError):
    """A batch from a producer epoch older than the last one the partition saw (a fenced zombie)."""

    error_code = 47  # Kafka's INVALID_PRODUCER_EPOCH


class KafkaStorageError(LogError):
    """A write the filesystem refused (a full disk, an I/O error); the message names partition, offset, file, errno.

    Kafka's KafkaStorageException. The append it interrupted left the log as it was before.
    """

    error_code = 56  # Kafka's KAFKA_STORAGE_ERROR


class TornSegmentError(KafkaStorageError):
    """A failed append whose bytes could not be cut from the segment: the log takes no appends until a restart."""
