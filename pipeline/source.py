"""`format("shale")`: the PySpark data source that reads and writes Shale topics.

PySpark registers it by itself where Shale is installed (the `pyspark_shale` package); in an editable
install call `shale.pipeline.session.register(spark)` once per session. Then:

    spark.read.format("shale").option("bootstrap.servers", "127.0.0.1:9092").option("subscribe", "prices").load()
    spark.read.format("shale").option("path", "/var/lib/shale").option("subscribe", "prices").load()
    df.write.format("shale").option("bootstrap.servers", ...).option("topic", "prices").mode("append").save()

See docs/pipeline.md for the options.
"""

from __future__ import annotations

from pyspark.sql.datasource import DataSource
from pyspark.sql.types import StructType

from .options import OptionError, SourceOptions, include_headers
from .reader import ShaleBatchReader
from .schema import spark_ddl
from .stream_reader import ShaleStreamReader
from .writer import ShaleStreamWriter, ShaleWriter, check_schema

NAME = "shale"


class ShaleDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return NAME

    def schema(self) -> str:
        return spark_ddl(include_headers(self.options))

    def reader(self, schema: StructType) -> ShaleBatchReader:
        return ShaleBatchReader(SourceOptions.parse(self.options))

    def streamReader(self, schema: StructType) -> ShaleStreamReader:
        return ShaleStreamReader(SourceOptions.parse(self.options, streaming=True))

    def writer(self, schema: StructType, overwrite: bool) -> ShaleWriter:
        return ShaleWriter(self._write_options(schema, overwrite))

    def streamWriter(self, schema: StructType, overwrite: bool) -> ShaleStreamWriter:
        return ShaleStreamWriter(self._write_options(schema, overwrite))

    def _write_options(self, schema: StructType, overwrite: bool) -> SourceOptions:
        if overwrite:
            raise OptionError("the shale sink appends to a topic; mode overwrite is not supported (use append)")
        opts = SourceOptions.parse(self.options, for_write=True)
        check_schema(schema, opts)
        return opts
