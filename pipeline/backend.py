"""The two places a topic can be read from — a server over the Kafka protocol, or a data directory's
files — behind one small interface, plus the read of one offset range into Arrow record batches.
"""

from __future__ import annotations

import json
import os
import uuid
from typing import Iterator, Protocol

import pyarrow as pa

from .files import DataDirectory, ScanStats
from .options import SourceOptions
from .ranges import OffsetRange
from .schema import BatchBuilder
from .wire import WireCluster
from .wire import read_range as read_wire_range

TP = tuple[str, int]


class Catalog(Protocol):
    """What planning needs: topics, offsets, and offsets by time."""

    def topics(self, names: list[str] | None = None) -> dict[str, list[int]]: ...

    def watermarks(self, tps: list[TP]) -> dict[TP, tuple[int, int]]: ...

    def offsets_for_timestamp(self, stamps: dict[TP, int]) -> dict[TP, int | None]: ...

    def close(self) -> None: ...


class FileCatalog:
    """A data directory as a Catalog: log start and end offsets and timestamp lookups from the files."""

    def __init__(self, path: str) -> None:
        self.dir = DataDirectory(path)

    def topics(self, names: list[str] | None = None) -> dict[str, list[int]]:
        out: dict[str, list[int]] = {}
        for tp in self.dir.topic_partitions():
            if names is None or tp.topic in names:
                out.setdefault(tp.topic, []).append(tp.partition)
        return out

    def watermarks(self, tps: list[TP]) -> dict[TP, tuple[int, int]]:
        out = {}
        for t, p in tps:
            files = self.dir.partition(t, p)
            out[(t, p)] = (files.log_start_offset(), files.log_end_offset())
        return out

    def offsets_for_timestamp(self, stamps: dict[TP, int]) -> dict[TP, int | None]:
        return {(t, p): self.dir.partition(t, p).offset_for_timestamp(ts) for (t, p), ts in stamps.items()}

    def close(self) -> None:
        pass


def open_catalog(opts: SourceOptions) -> Catalog:
    if opts.bootstrap_servers:
        return WireCluster(opts)
    return FileCatalog(opts.path)


def read_batches(opts: SourceOptions, r: OffsetRange, rows_per_batch: int = 65536) -> Iterator[pa.RecordBatch]:
    """The records of one offset range as record batches of the source schema, streamed.

    With `scanReportDir` set, one JSON file per range records what was opened and read, so that
    pruning can be seen (and tested) from outside the executor.
    """
    builder = BatchBuilder(r.topic, r.partition, opts.include_headers, rows=rows_per_batch)
    if opts.bootstrap_servers:
        info: dict = {}
        yield from read_wire_range(opts, r, builder, info)
        details = {"source": "wire", **info}
    else:
        stats = ScanStats()
        files = DataDirectory(opts.path).partition(r.topic, r.partition)
        yield from files.read(r.start, r.end, r.min_timestamp, builder, stats)
        details = {"source": "files", **stats.__dict__}
    last = builder.take()
    if last is not None:
        yield last
    _write_report(opts, r, details)


def _write_report(opts: SourceOptions, r: OffsetRange, details: dict) -> None:
    if not opts.scan_report_dir:
        return
    os.makedirs(opts.scan_report_dir, exist_ok=True)
    doc = {"topic": r.topic, "partition": r.partition, "start": r.start, "end": r.end,
           "min_timestamp": r.min_timestamp, **details}
    path = os.path.join(opts.scan_report_dir, f"scan-{uuid.uuid4().hex}.json")
    with open(path + ".tmp", "w") as f:
        json.dump(doc, f)
    os.replace(path + ".tmp", path)
