"""The README's first command until the sidecar serves: the seed walkthrough run by the engine itself.

It appends the `latest-product-price` updates, dumps the segments, runs one cleaner pass
(Kafka's compaction), and dumps them again: each key's latest price remains, and duplicates
only in the active segment.
"""

from __future__ import annotations

import glob
import os
from typing import TextIO

from .dump_log import dump_files
from .log.checkpoint import TopicPartition
from .log.cleaner_manager import CleanerManager
from .log.log_cleaner import CleanerConfig, LogCleaner
from .log.log_dir import LogDir
from .log.records import Record, encode_batch
from .topic_config import TopicConfig

TOPIC = "latest-product-price"
CONFIG = {"cleanup.policy": "compact", "segment.ms": "100", "min.cleanable.dirty.ratio": "0.01",
          "delete.retention.ms": "100"}
UPDATES = [("p3", "10$"), ("p5", "7$"), ("p3", "11$"), ("p6", "25$"), ("p6", "12$"), ("p5", "14$"), ("p5", "17$")]


def run_demo(data_dir: str, out: TextIO) -> int:
    """Append the updates one batch each, 60 ms of record time apart, so `segment.ms=100` rolls segments."""
    config = TopicConfig.from_mapping(CONFIG)
    logs = LogDir(data_dir, lambda topic: config)
    log = logs.get_or_create(TopicPartition(TOPIC, 0))
    start_ts = max(log.clock(), log.active_segment.max_timestamp_and_offset[0] + 1)
    for i, (key, value) in enumerate(UPDATES):
        info = log.append(encode_batch([Record(0, start_ts + 60 * i, key.encode(), value.encode())]))
        print(f"appended {key}:{value} at offset {info.first_offset}", file=out)
    partition_dir = os.path.join(data_dir, f"{TOPIC}-0")
    _dump(partition_dir, "before cleaning", out)

    manager = CleanerManager(logs.path, lambda: logs.logs, clock=log.clock)
    cleaner = LogCleaner(manager, lambda: logs.logs, CleanerConfig(dedupe_buffer_size=1 << 20), clock=log.clock)
    cleaner.clean_once(cleaner.cleaners[0])
    log.delete_expired_files()
    logs.close()
    return _dump(partition_dir, "after one cleaner pass", out)


def _dump(partition_dir: str, when: str, out: TextIO) -> int:
    files = sorted(glob.glob(os.path.join(partition_dir, "*.log")))
    print(f"\n{when}: {len(files)} segments in {partition_dir}; shale dump-log --print-data-log:\n", file=out)
    return dump_files(files, print_data=True, out=out)
