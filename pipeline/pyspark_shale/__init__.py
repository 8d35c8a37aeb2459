"""Makes `format("shale")` work in every SparkSession without `shale.pipeline.session.register(spark)`.

When a session first resolves a data source name, PySpark (4.0+, `pyspark.sql.worker.lookup_data_sources`)
imports, in a Python worker, every top-level module whose name starts with `pyspark_` and registers
its `DefaultSource` under `DefaultSource.name()`. pyproject.toml installs this folder as the
top-level package `pyspark_shale`, so an installed Shale is found that way — on a cluster too, where
the driver's Python has Shale installed.

PySpark lists top-level modules with `pkgutil.iter_modules()`, which sees packages on `sys.path`
(a wheel install) but not those served by setuptools' editable finder (`pip install -e`, the
repository's `.venv`): there, call `register(spark)` (`local_session` does).
"""

import warnings

try:
    from shale.pipeline.source import ShaleDataSource as DefaultSource

    __all__ = ["DefaultSource"]
except ImportError as e:
    # Shale installed without its `spark` extra next to a pyspark: PySpark's lookup imports every
    # `pyspark_*` module in one go, and an error here would cost every other source its registration.
    warnings.warn(f'format("shale") is not available: {e} (pip install "shale[spark]")', stacklevel=1)
