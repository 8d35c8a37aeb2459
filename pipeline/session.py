"""A SparkSession for running the pipeline on one machine (and for the tests), with the source registered.

On a cluster, build the session as the cluster wants and call `shale.pipeline.register(spark)`;
set `spark.sql.python.filterPushdown.enabled=true` there too, or filters are not pushed
(pyspark refuses `pushFilters` without it).
"""

from __future__ import annotations

import os
import sys

from . import register

PUSHDOWN_CONF = "spark.sql.python.filterPushdown.enabled"


def local_session(app: str = "shale", *, cores: int = 2, shuffle_partitions: int = 4, conf: dict | None = None):
    """`local[cores]` bound to loopback, Python workers on this interpreter, pushdown on, `shale` registered."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # workers need this venv's pyarrow and shale
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")  # never bind another interface
    from pyspark.sql import SparkSession

    builder = (SparkSession.builder.appName(app).master(f"local[{cores}]")
               .config("spark.driver.host", "127.0.0.1")
               .config("spark.driver.bindAddress", "127.0.0.1")
               .config("spark.ui.enabled", "false")
               .config("spark.sql.shuffle.partitions", str(shuffle_partitions))
               .config("spark.sql.session.timeZone", "UTC")
               .config(PUSHDOWN_CONF, "true"))
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    register(spark)
    return spark
