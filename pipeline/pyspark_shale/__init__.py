"""Makes `format("shale")` work in any SparkSession without `shale.pipeline.register(spark)`.

PySpark (4.0+) looks for Python data sources when a session first resolves a format name it does
not know: in a Python worker it imports every top-level module whose name starts with `pyspark_`
and registers its `DefaultSource` under `DefaultSource.name()`. Installed from a wheel, this package
is such a top-level module (pyproject.toml maps it out of `pipeline/`).
"""

from shale.pipeline.source import ShaleDataSource as DefaultSource

__all__ = ["DefaultSource"]
