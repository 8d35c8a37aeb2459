"""A SparkSession for running the pipeline on one machine (and for the tests), with the source registered.

On a cluster, build the session as the cluster wants, with `spark.sql.python.filterPushdown.enabled=true`
(pyspark refuses a reader that pushes filters without it); PySpark registers `format("shale")` by
itself where Shale is installed as a package (`pyspark_shale`), `register(spark)` below
does it elsewhere (an editable install).
"""

from __future__ import annotations

import os
import select
import sys
from pathlib import Path

PUSHDOWN_CONF = "spark.sql.python.filterPushdown.enabled"
# Spark's log configuration for local sessions: WARN, without the warnings every local session prints.
LOG4J2_CONFIG = Path(__file__).resolve().with_name("log4j2.properties")


class _PollSelect:
    """`select.select` for py4j's callback server, done with poll(2).

    py4j's CallbackServer waits for the JVM's connections with `select.select`, which refuses file
    descriptors above 1023: in a driver process that already has that many files open (a long-lived
    service, a test process), the accept thread dies and every call from the JVM into Python — the
    function of `foreachBatch` — waits forever. poll(2) has no such limit.
    """

    @staticmethod
    def select(rlist, wlist, xlist, timeout=None):
        poller = select.poll()
        for s in rlist:
            poller.register(s, select.POLLIN)
        ready = {fd for fd, _ in poller.poll(None if timeout is None else timeout * 1000)}
        return [s for s in rlist if s.fileno() in ready], [], []


def patch_py4j_callback_server() -> None:
    """Make py4j's callback server accept with poll(2) (see `_PollSelect`); `local_session` calls it."""
    import py4j.java_gateway

    py4j.java_gateway.select = _PollSelect  # the module's only select() call is the callback server's accept loop


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


def local_session(app: str = "shale", *, cores: int = 2, shuffle_partitions: int = 4, conf: dict | None = None):
    """`local[cores]` bound to loopback, Python workers on this interpreter, pushdown on, `shale` registered.

    Spark logs at WARN through `log4j2.properties` beside this module, given to the JVM as it starts (a
    `setLogLevel` afterwards would come after the startup lines), and draws no progress bars: the output
    of the program using the session stays readable. A caller's `spark.driver.extraJavaOptions` come
    after ours, so its own `-Dlog4j2.configurationFile` wins.
    """
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # workers need this venv's pyarrow and shale
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")  # never bind another interface
    from pyspark.sql import SparkSession

    patch_py4j_callback_server()
    conf = dict(conf or {})
    java_options = " ".join(filter(None, [f"-Dlog4j2.configurationFile={LOG4J2_CONFIG.as_uri()}",
                                          conf.pop("spark.driver.extraJavaOptions", None)]))
    builder = (SparkSession.builder.appName(app).master(f"local[{cores}]")
               .config("spark.driver.host", "127.0.0.1")
               .config("spark.driver.bindAddress", "127.0.0.1")
               .config("spark.driver.extraJavaOptions", java_options)
               .config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false")
               .config("spark.sql.shuffle.partitions", str(shuffle_partitions))
               .config("spark.sql.session.timeZone", "UTC")
               .config(PUSHDOWN_CONF, "true"))
    for key, value in conf.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    register(spark)
    return spark
