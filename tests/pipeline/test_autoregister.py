"""`format("shale")` without `register(spark)`: PySpark's own lookup of `pyspark_*` packages finds the
source, in a fresh SparkSession (its own JVM) of a venv where Shale is installed from its wheel, whose
driver never imports `shale.pipeline` and whose Python workers start in the repository root (where a
top-level folder must not shadow anything: tests/test_layout.py)."""

from __future__ import annotations

import json
import os

from shale.sidecar.log.log_dir import LogDir
from shale.sidecar.log.records import Record, encode_batch
from shale.sidecar.log.topic_partition import TopicPartition
from shale.sidecar.topic_config import TopicConfig

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


def test_pyspark_finds_the_source_by_itself(tmp_path, wheel_venv):
    data = tmp_path / "data"
    d = LogDir(str(data), lambda topic: TopicConfig.from_mapping({}))
    log = d.get_or_create(TopicPartition("auto", 0))
    log.append(encode_batch([Record(i, 1_700_000_000_000 + i, b"k%d" % i, b"v%d" % i) for i in range(5)]))
    d.close()
    env = {**os.environ, "PYSPARK_PYTHON": str(wheel_venv.python), "SPARK_LOCAL_IP": "127.0.0.1"}
    run = wheel_venv.run("python", "-c", DRIVER, data, env=env)
    assert run.returncode == 0, run.stderr[-3000:]
    out = json.loads(run.stdout.strip().splitlines()[-1])
    assert out["rows"] == [[i, f"k{i}", f"v{i}"] for i in range(5)]
    assert out["columns"] == ["key", "value", "topic", "partition", "offset", "timestamp", "timestampType"]
    assert not out["driver_imported_shale"], "the driver registered nothing itself"

