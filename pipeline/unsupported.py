"""The options Spark's Kafka source has that `format("shale")` refuses, and why each is refused.

Spark users carry their options over from `format("kafka")`; one that this source would silently
ignore could change what a query reads (a Kafka client setting that decides where reading starts)
or hide a mistake. So each is refused while the query is analysed, naming the option and what to
do instead. Spark hands options over case-insensitively: `o` has lower-case names, messages use
Spark's spelling.
"""

from __future__ import annotations

from typing import Mapping

# Spark's Kafka source options this source does not implement.
SOURCE_OPTIONS = {
    "fetchOffset.numRetries": "offset lookups go through librdkafka, which retries them itself "
                              "(tune kafka.retry.backoff.ms and kafka.socket.timeout.ms instead)",
    "fetchOffset.retryIntervalMs": "offset lookups go through librdkafka, which retries them itself "
                                   "(tune kafka.retry.backoff.ms instead)",
}

# Kafka client settings (`kafka.` + name) that would take over what the source decides; Spark's Kafka
# source refuses the first five too.
CLIENT_SETTINGS = {
    "auto.offset.reset": "set startingOffsets (and failOnDataLoss for offsets that are gone) instead",
    "enable.auto.commit": "the source never commits offsets: a query's position lives in its checkpoint",
    "key.deserializer": "keys are always binary: cast or parse the key column in Spark",
    "value.deserializer": "values are always binary: cast or parse the value column in Spark",
    "interceptor.classes": "interceptors are Java classes; librdkafka has none",
    "enable.auto.offset.store": "the source never stores offsets in the server",
    "enable.partition.eof": "the reader needs it to see where a partition ends",
}

SINK_CLIENT_SETTINGS = {
    "key.serializer": "write the key column as string or binary instead",
    "value.serializer": "write the value column as string or binary instead",
}

# Options that configure the Kafka client: meaningless (so refused) when reading a data directory.
WIRE_ONLY = ("groupIdPrefix", "kafkaConsumer.pollTimeoutMs")

# Batch-only options a stream refuses (as Spark's Kafka source does).
BATCH_ONLY = ("endingOffsets", "endingTimestamp", "endingOffsetsByTimestamp")


def refused(o: Mapping[str, str], *, streaming: bool, for_write: bool, path_read: bool) -> str | None:
    """Why the lower-cased options `o` cannot be used together, or None if they can."""
    for name, why in SOURCE_OPTIONS.items():
        if name.lower() in o and not for_write:
            return f"option {name} is not supported: {why}"
    settings = {**CLIENT_SETTINGS, **(SINK_CLIENT_SETTINGS if for_write else {})}
    for name, why in settings.items():
        if f"kafka.{name}" in o:
            return f"Kafka option kafka.{name} is not supported: {why}"
    if path_read:
        client = [k for k in o if k.startswith("kafka.") and k != "kafka.bootstrap.servers"]
        client += [k for k in WIRE_ONLY if k.lower() in o]
        if client:
            return (f"option {client[0]} configures the Kafka client, and reading a data directory (path) uses "
                    "none: drop it, or read over the Kafka protocol with bootstrap.servers")
    if streaming:
        batch = [k for k in BATCH_ONLY if k.lower() in o]
        if batch:
            return f"option {batch[0]} is for batch queries only; a stream keeps reading"
    return None
