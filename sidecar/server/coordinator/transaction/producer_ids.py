"""Producer ids for idempotent producers, and the InitProducerId (API 22) response.

Kafka's controller hands brokers producer ids in blocks and records each block before it is
used; the sidecar does the same in one file of its data directory, so that ids stay unique
across restarts and a crash only skips the rest of a block, never reuses an id. Several nodes of
one cluster have no controller to share: each node hands out only the ids congruent to its node id
modulo `NODE_STRIDE`, so a producer's id is unique on every partition it writes to.
"""

from __future__ import annotations

import os
import threading

from ....log.atomic_file import atomic_write
from ....protocol.error_codes import COORDINATOR_NOT_AVAILABLE, INVALID_REQUEST, NONE

PRODUCER_ID_BLOCK_FILE = "producer-id-block"
_FILE_VERSION = 0
INT16_MAX = 2**15 - 1
INT64_MAX = 2**63 - 1
NO_PRODUCER_ID = -1
NO_PRODUCER_EPOCH = -1
NODE_STRIDE = 1024  # node ids 0..1023 each own one residue class of producer ids



class ProducerIdAllocatorError(Exception):
    """The block file is unreadable or the id space is spent; handing out ids could repeat one."""


class ProducerIdAllocator:
    """Unique producer ids across restarts of the sidecar; `next_id` is thread-safe.

    `producer-id-block` holds (after a version line) the first id of the next block. It is
    rewritten atomically before any id of a new block is handed out.
    """

    def __init__(self, data_dir: str, block_size: int = 1000, node_id: int = 0) -> None:
        if block_size < 1:
            raise ValueError(f"producer id block size must be positive, not {block_size}")
        if not 0 <= node_id < NODE_STRIDE:
            raise ValueError(f"node id {node_id} is outside 0..{NODE_STRIDE - 1}, the range producer ids allow")
        self.node_id = node_id
        self.path = os.path.join(data_dir, PRODUCER_ID_BLOCK_FILE)
        self.block_size = block_size
        self._lock = threading.Lock()
        self._next = self._block_end = self._read()

    def _read(self) -> int:
        try:
            with open(self.path, encoding="ascii") as f:
                text = f.read()
        except FileNotFoundError:
            return 0
        lines = text.split("\n")
        if len(lines) != 3 or lines[0] != str(_FILE_VERSION) or lines[2] != "" or not lines[1].isdigit():
            raise ProducerIdAllocatorError(f"{self.path}: not a producer id block file: {text[:80]!r}")
        return int(lines[1])

    def next_id(self) -> int:
        with self._lock:
            if self._next == self._block_end:
                end = min(self._next + self.block_size, INT64_MAX // NODE_STRIDE)
                if end == self._next:
                    raise ProducerIdAllocatorError(f"{self.path}: producer ids are exhausted")
                atomic_write(self.path, f"{_FILE_VERSION}\n{end}\n".encode("ascii"))
                self._block_end = end
            pid = self._next * NODE_STRIDE + self.node_id
            self._next += 1
            return pid

    def was_issued(self, producer_id: int) -> bool:
        """Whether this sidecar may have handed out `producer_id` (every id below the current one)."""
        with self._lock:
            return producer_id >= 0 and producer_id % NODE_STRIDE == self.node_id and \
                producer_id // NODE_STRIDE < self._next


def init_producer_id(allocator: ProducerIdAllocator, version: int, body) -> dict:
    """The InitProducerId response body for a decoded request (`body`: kafka-python's request object)."""
    if body.transactional_id is not None:
        # A transactional id is the transaction coordinator's (transaction/coordinator.py), which calls this
        # only without one. Answered as Kafka answers when its coordinator cannot serve: the client retries.
        return _response(COORDINATOR_NOT_AVAILABLE)
    # v0-2 have no producer id and epoch fields (kafka-protocol.md G7).
    pid = body.producer_id if version >= 3 else NO_PRODUCER_ID
    epoch = body.producer_epoch if version >= 3 else NO_PRODUCER_EPOCH
    if (pid == NO_PRODUCER_ID) != (epoch == NO_PRODUCER_EPOCH):
        return _response(INVALID_REQUEST)  # Kafka's KafkaApis: both or neither
    # KIP-360: a producer that lost its sequence state asks for a bumped epoch of its id, after which its
    # partitions accept it from sequence 0. Kafka itself gives a fresh id to non-transactional producers;
    # either answer is valid for clients. An id this sidecar never issued is not bumped: it is due to be
    # handed to another producer, which would then be fenced by the bumped epoch.
    if pid >= 0 and 0 <= epoch < INT16_MAX and allocator.was_issued(pid):
        return _response(NONE, pid, epoch + 1)
    return _response(NONE, allocator.next_id(), 0)


def _response(error_code: int, producer_id: int = NO_PRODUCER_ID, producer_epoch: int = NO_PRODUCER_EPOCH) -> dict:
    return {"throttle_time_ms": 0, "error_code": error_code, "producer_id": producer_id,
            "producer_epoch": producer_epoch}
