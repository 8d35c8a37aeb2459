"""Fixtures of the PySpark data source tests: one local SparkSession per test process, loopback only.

Spark needs a Java 17+ runtime; `make test` installs Debian's openjdk-17-jre-headless when `java`
is missing. Without one these tests fail (they are never skipped).
"""

from __future__ import annotations

import shutil

import pytest


@pytest.fixture(scope="session")
def spark():
    if shutil.which("java") is None:
        pytest.fail("Spark needs a Java 17+ runtime on PATH (`make test` installs openjdk-17-jre-headless)")
    from shale.pipeline.session import local_session

    session = local_session("shale-tests", cores=2, shuffle_partitions=2,
                            conf={"spark.default.parallelism": "2", "spark.sql.adaptive.enabled": "false"})
    yield session
    session.stop()
