"""The row layout of a topic as a DataFrame, and building Arrow record batches of it column by column.

The columns are those of Spark's own Kafka source (`KafkaRecordToRowConverter`), so a query written
for `format("kafka")` reads a Shale topic unchanged. Batches are built as Arrow columns because
Spark takes `pyarrow.RecordBatch` from a Python data source without converting row by row, and it
checks the batch schema against `to_arrow_schema(schema, "UTC")` exactly — `arrow_schema` is that.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.compute as pc

from shale.sidecar.log.records import RecordColumns

COLUMNS = ("key", "value", "topic", "partition", "offset", "timestamp", "timestampType")
HEADERS = "headers"

_BASE_DDL = ("key binary, value binary, topic string, partition int, offset long, timestamp timestamp, "
             "timestampType int")
_HEADERS_DDL = "headers array<struct<key:string,value:binary>>"

HEADER_STRUCT = pa.struct([pa.field("key", pa.string()), pa.field("value", pa.binary())])
HEADERS_TYPE = pa.list_(pa.field("element", HEADER_STRUCT))
TIMESTAMP_TYPE = pa.timestamp("us", tz="UTC")

CREATE_TIME = 0
LOG_APPEND_TIME = 1


def spark_ddl(include_headers: bool) -> str:
    """The DataFrame schema as a DDL string (what `DataSource.schema()` returns)."""
    return f"{_BASE_DDL}, {_HEADERS_DDL}" if include_headers else _BASE_DDL


def arrow_schema(include_headers: bool) -> pa.Schema:
    """The Arrow schema Spark expects for `spark_ddl(include_headers)`."""
    fields = [
        pa.field("key", pa.binary()), pa.field("value", pa.binary()), pa.field("topic", pa.string()),
        pa.field("partition", pa.int32()), pa.field("offset", pa.int64()), pa.field("timestamp", TIMESTAMP_TYPE),
        pa.field("timestampType", pa.int32()),
    ]
    if include_headers:
        fields.append(pa.field(HEADERS, HEADERS_TYPE))
    return pa.schema(fields)


@dataclass
class BatchBuilder:
    """Records of one topic-partition collected as columns, turned into record batches of `rows` rows.

    Headers are kept flat (all keys, all values, one end position per record) so the list column is
    built from offsets in one call instead of from a Python list of lists of dicts.
    """

    topic: str
    partition: int
    include_headers: bool
    rows: int = 65536
    keys: list = field(default_factory=list)
    values: list = field(default_factory=list)
    offsets: list = field(default_factory=list)
    timestamps: list = field(default_factory=list)
    timestamp_types: list = field(default_factory=list)
    header_ends: list = field(default_factory=lambda: [0])
    header_keys: list = field(default_factory=list)
    header_values: list = field(default_factory=list)

    def __post_init__(self) -> None:
        self.schema = arrow_schema(self.include_headers)

    def __len__(self) -> int:
        return len(self.offsets)

    @property
    def full(self) -> bool:
        return len(self.offsets) >= self.rows

    def add(self, key: bytes | None, value: bytes | None, offset: int, timestamp_ms: int, timestamp_type: int,
            headers=()) -> None:
        """One record; `headers` is a sequence of (key, value) pairs."""
        self.keys.append(key)
        self.values.append(value)
        self.offsets.append(offset)
        self.timestamps.append(timestamp_ms)
        self.timestamp_types.append(timestamp_type)
        if self.include_headers:
            self._add_headers(headers)

    def _add_headers(self, headers) -> None:
        if headers:
            for hk, hv in headers:
                self.header_keys.append(hk)
                self.header_values.append(hv)
        self.header_ends.append(len(self.header_keys))

    def extend(self, cols: RecordColumns, timestamp_type: int) -> None:
        """A whole decoded batch at once: list extends instead of a call per record."""
        self.keys += cols.keys
        self.values += cols.values
        self.offsets += cols.offsets
        self.timestamps += cols.timestamps
        self.timestamp_types += [timestamp_type] * len(cols.offsets)
        if self.include_headers:
            for headers in cols.headers:
                self._add_headers(headers)

    def take(self) -> pa.RecordBatch | None:
        """The collected records as one batch (None if there are none); the builder is empty afterwards."""
        n = len(self.offsets)
        if not n:
            return None
        millis = pa.array(self.timestamps, pa.int64())
        columns = [
            pa.array(self.keys, pa.binary()),
            pa.array(self.values, pa.binary()),
            pa.array([self.topic] * n, pa.string()),
            pa.array([self.partition] * n, pa.int32()),
            pa.array(self.offsets, pa.int64()),
            pc.multiply(millis, 1000).cast(TIMESTAMP_TYPE),
            pa.array(self.timestamp_types, pa.int32()),
        ]
        if self.include_headers:
            structs = pa.StructArray.from_arrays(
                [pa.array(self.header_keys, pa.string()), pa.array(self.header_values, pa.binary())],
                fields=list(HEADER_STRUCT))
            columns.append(pa.ListArray.from_arrays(pa.array(self.header_ends, pa.int32()), structs, type=HEADERS_TYPE))
        batch = pa.RecordBatch.from_arrays(columns, schema=self.schema)
        self.keys, self.values, self.offsets, self.timestamps, self.timestamp_types = [], [], [], [], []
        self.header_ends, self.header_keys, self.header_values = [0], [], []
        return batch
