"""Shale topics as Spark DataFrames: the `shale` PySpark data source, the latest view, the example pipeline."""

from __future__ import annotations


def register(spark) -> None:
    """Make `format("shale")` available in this SparkSession, unless PySpark already registered it.

    An installed Shale is registered by PySpark itself (the top-level package `pyspark_shale`);
    registering over that works but makes Spark warn that a statically registered source was replaced.
    """
    from .source import NAME, ShaleDataSource

    if not _registered(spark, NAME):
        spark.dataSource.register(ShaleDataSource)


def _registered(spark, name: str) -> bool:
    try:  # the JVM's DataSourceManager (a Spark Connect session has no JVM here: register then)
        return bool(spark._jsparkSession.sessionState().dataSourceManager().dataSourceExists(name))
    except Exception:
        return False


def __getattr__(name: str):
    # Lazy, so that `shale.pipeline.files` and friends import without pyspark loaded.
    if name in ("latest_view", "read"):
        from . import latest

        return getattr(latest, name)
    if name == "ShaleDataSource":
        from .source import ShaleDataSource

        return ShaleDataSource
    raise AttributeError(name)
