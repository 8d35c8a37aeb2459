"""The README's first command until the sidecar serves: the seed walkthrough written by the engine, then dumped."""

from __future__ import annotations

import glob
import os
from typing import TextIO

from .dump_log import dump_files
from .log.checkpoint import TopicPartition
from .log.log_dir import LogDir
from .log.records import Record, encode_batch
from .topic_config import TopicConfig

TOPIC = "latest-product-price"
CONFIG = {"cleanup.policy": "compact", "segment.ms": "100", "min.cleanable.dirty.ratio": "0.01",
          "delete.retention.ms": "100"}
UPDATES = [("p3", "10$"), ("p5", "7$"), ("p3", "11$"), ("p6", "25$"), ("p6", "12$"), ("p5", "14$"), ("p5", "17$")]


def run_demo(data_dir: str, out: TextIO) -> int:
    """Append the price updates one batch each, 60 ms of record time apart, so `segment.ms=100` rolls segments."""
    config = TopicConfig.from_mapping(CONFIG)
    logs = LogDir(data_dir, lambda topic: config)
    log = logs.get_or_create(TopicPartition(TOPIC, 0))
    start_ts = max(log.clock(), log.active_segment.max_timestamp_and_offset[0] + 1)
    for i, (key, value) in enumerate(UPDATES):
        info = log.append(encode_batch([Record(0, start_ts + 60 * i, key.encode(), value.encode())]))
        print(f"appended {key}:{value} at offset {info.first_offset}", file=out)
    logs.close()
    files = sorted(glob.glob(os.path.join(data_dir, f"{TOPIC}-0", "*.log")))
    print(f"\n{len(files)} segments in {os.path.join(data_dir, TOPIC + '-0')}; shale dump-log --print-data-log:\n", file=out)
    return dump_files(files, print_data=True, out=out)
