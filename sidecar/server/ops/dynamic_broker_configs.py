"""A node's dynamic broker configs, kept across restarts in `dynamic-broker-configs.json` of its first log dir.

Kafka keeps per-broker dynamic configs (IncrementalAlterConfigs on the BROKER resource: the replication
throttles kafka-reassign-partitions sets) in its metadata, so a restarted broker comes back with them; a
throttle lost at a restart would let a move in progress run unthrottled and starve producers. The file
holds the set values as the admin API took them (strings, Kafka's names), written whole and atomically
before a change is applied. A file that cannot be read or parsed is reported (ERROR, naming it) and left
as it is; the node then starts with its command line's values, as it would have without one.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass

from ...log.atomic_file import atomic_write

logger = logging.getLogger(__name__)

FILE = "dynamic-broker-configs.json"


@dataclass(frozen=True)
class DynamicBrokerConfigs:
    """The file of one node's dynamic broker configs."""

    path: str

    @classmethod
    def in_dir(cls, log_dir: str) -> DynamicBrokerConfigs:
        return cls(os.path.join(log_dir, FILE))

    def load(self) -> dict[str, str]:
        """The values last saved; {} when there is no file, or one that cannot be used (logged)."""
        try:
            with open(self.path, "rb") as f:
                data = json.loads(f.read())
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:
            logger.error("%s cannot be read (%s): the dynamic broker configs it holds are not applied; the "
                         "node uses its command line's until the next change rewrites the file", self.path, exc)
            return {}
        configs = data.get("configs") if isinstance(data, dict) else None
        if not isinstance(configs, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                                     for k, v in configs.items()):
            logger.error("%s holds no {\"configs\": {name: value}} object: the dynamic broker configs it holds are "
                         "not applied; the node uses its command line's until the next change rewrites the file",
                         self.path)
            return {}
        return dict(configs)

    def save(self, configs: dict[str, str]) -> None:
        """Replace the file by `configs` (OSError when it cannot be written: the change must then be refused)."""
        atomic_write(self.path, json.dumps({"version": 1, "configs": configs}, indent=2, sort_keys=True).encode())
