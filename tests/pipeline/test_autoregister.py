"""`format("shale")` without `register(spark)`: PySpark's own lookup of `pyspark_*` packages finds the
source, in a fresh SparkSession (its own JVM) whose Python path holds `pyspark_shale` the way a wheel
install puts it, and whose driver never imports `shale.pipeline`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

from shale.sidecar.log.checkpoint import TopicPartition
from shale.sidecar.log.log_dir import LogDir
from shale.sidecar.log.records import Record, encode_batch
from shale.sidecar.topic_config import TopicConfig

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "pipeline" / "pyspark_shale"

DRIVER = """
import json, os, sys
from pyspark.sql import SparkSession

spark = (SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false")
         .config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
         .config("spark.sql.python.filterPushdown.enabled", "true").getOrCreate())
rows = (spark.read.format("shale").option("path", sys.argv[1]).option("subscribe", "auto").load()
        .orderBy("offset").collect())
print(json.dumps({"rows": [[r.offset, bytes(r.key).decode(), bytes(r.value).decode()] for r in rows],
                  "columns": spark.read.format("shale").option("path", sys.argv[1]).option("subscribe", "auto")
                  .load().columns,
                  "driver_imported_shale": any(m.startswith("shale") for m in sys.modules)}))
spark.stop()
"""


def test_pyspark_finds_the_source_by_itself(tmp_path):
    data = tmp_path / "data"
    d = LogDir(str(data), lambda topic: TopicConfig.from_mapping({}))
    log = d.get_or_create(TopicPartition("auto", 0))
    log.append(encode_batch([Record(i, 1_700_000_000_000 + i, b"k%d" % i, b"v%d" % i) for i in range(5)]))
    d.close()
    site = tmp_path / "site-packages"
    site.mkdir()
    (site / "pyspark_shale").symlink_to(PACKAGE, target_is_directory=True)
    env = {**os.environ, "PYTHONPATH": str(site), "PYSPARK_PYTHON": sys.executable, "SPARK_LOCAL_IP": "127.0.0.1"}
    run = subprocess.run([sys.executable, "-c", DRIVER, str(data)], env=env, cwd=tmp_path, capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    out = json.loads(run.stdout.strip().splitlines()[-1])
    assert out["rows"] == [[i, f"k{i}", f"v{i}"] for i in range(5)]
    assert out["columns"] == ["key", "value", "topic", "partition", "offset", "timestamp", "timestampType"]
    assert not out["driver_imported_shale"], "the driver registered nothing itself"


def test_the_package_is_installed_top_level():
    """What makes a wheel install put `pyspark_shale` where PySpark's lookup looks (site-packages' top level)."""
    tool = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert "pyspark_shale" in tool["packages"]
    assert ROOT / tool["package-dir"]["pyspark_shale"] == PACKAGE
    assert "DefaultSource" in (PACKAGE / "__init__.py").read_text()
