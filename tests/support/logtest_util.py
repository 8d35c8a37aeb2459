"""Helpers shared by the log-engine tests: configs, a fake clock, batch builders, directory snapshots."""

from __future__ import annotations

import os
from typing import Iterable, Mapping

from shale.sidecar.log.compression import Compression
from shale.sidecar.log.records import Record, RecordBatch, decode_batch, encode_batch
from shale.sidecar.topic_config import TopicConfig

T0 = 1_700_000_000_000  # a realistic epoch-ms wall clock for the fake clock


def make_config(props: Mapping[str, object] | None = None):
    """A topic config from Kafka-named settings (values as str or native), validated as Kafka would."""
    return TopicConfig.from_mapping(dict(props or {}))


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


def drop_unclosed(log) -> None:
    """Drop a Log as a SIGKILL would: descriptors and maps released, nothing flushed, trimmed or written.

    The segments would release their descriptors when collected; a test that simulates a crash and
    then reopens the same files releases them now, so that the old and new Log never overlap.
    """
    for seg in [*log.segments, *(seg for _, seg in log._pending_deletes)]:  # and those renamed to `.deleted`
        seg.close_handles()


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


# --- hypothesis: arbitrary v2 batches -----------------------------------------------------------

from hypothesis import strategies as st  # noqa: E402

from shale.sidecar.log.records import (  # noqa: E402
    ControlType,
    Header,
    TimestampType,
    encode_control_key,
    encode_end_txn_marker,
)

_INT32_MAX = 2**31 - 1
_INT64_MAX = 2**63 - 1

headers_st = st.lists(
    st.builds(Header, st.text(max_size=8), st.none() | st.binary(max_size=16)), max_size=3
).map(tuple)


@st.composite
def batch_specs(draw: st.DrawFn, *, allow_empty: bool = True, codecs=tuple(Compression)):
    """(encode_batch kwargs, records) for one arbitrary v2 batch: null keys/values, headers, gaps in
    offsets, negative timestamp deltas, large offsets, every codec, control/transactional batches,
    a delete horizon, LogAppendTime and empty batches."""
    is_control = draw(st.booleans())
    n = 1 if is_control else draw(st.integers(0 if allow_empty else 1, 12))
    base_offset = draw(st.integers(0, 2**62) | st.sampled_from([0, 2**31 - 1, 2**31, 2**62]))
    first_delta = draw(st.integers(0, 3))
    gaps = draw(st.lists(st.integers(1, 1000), min_size=max(n - 1, 0), max_size=max(n - 1, 0)))
    deltas = [first_delta]
    for g in gaps:
        deltas.append(deltas[-1] + g)
    base_ts = draw(st.integers(0, 2**45))
    ts_deltas = draw(st.lists(st.integers(-(10**7), 10**7), min_size=n, max_size=n))
    records = []
    for i in range(n):
        if is_control:  # one control record: version/type key, end-transaction-marker value
            key = encode_control_key(draw(st.sampled_from([ControlType.ABORT, ControlType.COMMIT])))
            value = encode_end_txn_marker(draw(st.integers(0, _INT32_MAX)))
            headers = ()
        else:
            key = draw(st.none() | st.binary(max_size=24))
            value = draw(st.none() | st.binary(max_size=120) | st.just(b"v" * 300))
            headers = draw(headers_st)
        records.append(Record(base_offset + deltas[i], base_ts + ts_deltas[i], key, value, headers))
    kw = dict(
        base_offset=base_offset,
        compression=draw(st.sampled_from(list(codecs))),
        timestamp_type=draw(st.sampled_from(list(TimestampType))),
        producer_id=draw(st.sampled_from([-1]) | st.integers(0, _INT64_MAX)),
        producer_epoch=draw(st.sampled_from([-1]) | st.integers(0, 2**15 - 1)),
        base_sequence=draw(st.sampled_from([-1, _INT32_MAX]) | st.integers(0, _INT32_MAX)),
        partition_leader_epoch=draw(st.sampled_from([-1]) | st.integers(0, _INT32_MAX)),
        is_transactional=draw(st.booleans()),
        is_control=is_control,
        delete_horizon_ms=draw(st.none() | st.integers(0, 2**45)),
    )
    if kw["timestamp_type"] is TimestampType.LOG_APPEND_TIME:
        kw["max_timestamp"] = draw(st.integers(0, 2**45))
    if n == 0:
        # An empty batch (what compaction leaves) keeps its offset span and max timestamp.
        kw["last_offset_delta"] = draw(st.integers(0, 1000))
        kw["max_timestamp"] = draw(st.integers(-1, 2**45))
    return kw, records
