"""Helpers shared by the log-engine tests: configs, a fake clock, batch builders, directory snapshots."""

from __future__ import annotations

import os
import types
from typing import Iterable, Mapping

from shale.sidecar.log.compression import Compression
from shale.sidecar.log.records import Record, RecordBatch, decode_batch, encode_batch

T0 = 1_700_000_000_000  # a realistic epoch-ms wall clock for the fake clock

# Kafka's topic defaults (spec section 9) for the attributes `Log` reads.
KAFKA_DEFAULTS: dict[str, object] = {
    "segment.bytes": 1073741824,
    "segment.ms": 604800000,
    "segment.jitter.ms": 0,
    "segment.index.bytes": 10485760,
    "index.interval.bytes": 4096,
    "preallocate": False,
    "cleanup.policy": "delete",
    "max.compaction.lag.ms": 2**63 - 1,
    "message.timestamp.type": "CreateTime",
    "message.timestamp.before.max.ms": 2**63 - 1,
    "message.timestamp.after.max.ms": 2**63 - 1,
    "max.message.bytes": 1048588,
    "flush.messages": 2**63 - 1,
    "flush.ms": 2**63 - 1,
    "file.delete.delay.ms": 60000,
}


def make_config(props: Mapping[str, object] | None = None):
    """A topic config from Kafka-named settings (values as str or native)."""
    merged = dict(KAFKA_DEFAULTS)
    merged.update(props or {})

    def num(name: str) -> int:
        return int(merged[name])  # type: ignore[arg-type]

    return types.SimpleNamespace(
        segment_bytes=num("segment.bytes"),
        segment_ms=num("segment.ms"),
        segment_jitter_ms=num("segment.jitter.ms"),
        segment_index_bytes=num("segment.index.bytes"),
        index_interval_bytes=num("index.interval.bytes"),
        preallocate=str(merged["preallocate"]).lower() == "true",
        compact="compact" in str(merged["cleanup.policy"]),
        max_compaction_lag_ms=num("max.compaction.lag.ms"),
        message_timestamp_type=str(merged["message.timestamp.type"]),
        message_timestamp_before_max_ms=num("message.timestamp.before.max.ms"),
        message_timestamp_after_max_ms=num("message.timestamp.after.max.ms"),
        max_message_bytes=num("max.message.bytes"),
        flush_messages=num("flush.messages"),
        flush_ms=num("flush.ms"),
        file_delete_delay_ms=num("file.delete.delay.ms"),
    )


class FakeClock:
    """A settable millisecond clock (Kafka's MockTime)."""

    def __init__(self, start: int = T0) -> None:
        self.now = start

    def __call__(self) -> int:
        return self.now

    def sleep(self, ms: int) -> None:
        self.now += ms


def simple_batch(value: bytes = b"test", *, ts: int = -1, key: bytes | None = None, offset: int = 0,
                 compression: Compression = Compression.NONE, **kw) -> bytes:
    """Kafka's TestUtils.singletonRecords: one record, as a producer sends it."""
    return encode_batch([Record(offset, ts, key, value)], compression=compression, **kw)


def records_batch(items: Iterable[tuple[bytes | None, bytes | None, int]], *, offset: int = 0,
                  compression: Compression = Compression.NONE, **kw) -> bytes:
    """A batch of (key, value, timestamp) records with consecutive offsets from `offset`."""
    recs = [Record(offset + i, ts, k, v) for i, (k, v, ts) in enumerate(items)]
    return encode_batch(recs, compression=compression, **kw)


def dir_snapshot(path: str) -> dict[str, bytes]:
    """Every file under `path` with its bytes (for "the log is untouched" checks)."""
    out = {}
    for root, _dirs, files in os.walk(path):
        for name in files:
            full = os.path.join(root, name)
            with open(full, "rb") as f:
                out[os.path.relpath(full, path)] = f.read()
    return out


def segment_batches(seg) -> list[tuple[int, RecordBatch]]:
    """(position, decoded batch) of every batch in a segment's `.log`."""
    return [(b.position, decode_batch(seg.read_bytes(b.position, b.size))) for b in seg.batches()]


def all_records(log) -> list[Record]:
    """Every record of every segment of `log`, decoded straight from the files."""
    out = []
    for seg in log.segments:
        for _pos, batch in segment_batches(seg):
            out.extend(batch.records)
    return out


def read_batch_at(log, offset: int) -> RecordBatch | None:
    """The first batch `Log.read` returns for `offset` (None at the log end)."""
    sl = log.read(offset, 1, min_one_message=True)
    if sl is None:
        return None
    data = sl.read()
    size = 12 + int.from_bytes(data[8:12], "big")
    return decode_batch(data[:size])


def file_size(path: str) -> int:
    return os.path.getsize(path)
