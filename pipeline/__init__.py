"""Shale topics as Spark DataFrames: the `shale` PySpark data source, the latest view, the example pipeline."""

from __future__ import annotations


def register(spark) -> None:
    """Make `format("shale")` available in this SparkSession."""
    from .source import ShaleDataSource

    spark.dataSource.register(ShaleDataSource)


def __getattr__(name: str):
    # Lazy, so that `shale.pipeline.files` and friends import without pyspark loaded.
    if name in ("latest_view", "read"):
        from . import latest

        return getattr(latest, name)
    if name == "ShaleDataSource":
        from .source import ShaleDataSource

        return ShaleDataSource
    raise AttributeError(name)
