"""A leader for the fetcher's tests: real Logs served over a real socket with the node's own codec, answering
follower Fetch and ListOffsets by Kafka's leader rules (spec §2.2) — the part Kafka's AbstractFetcherThreadTest
plays with its MockLeaderEndPoint. The node's own leader path is exercised by the cluster tests; this one lets
a test set the leader's epoch, high watermark and log directly and stop or restart it on the same port."""

from __future__ import annotations

import asyncio
import struct
from dataclasses import dataclass, field

from shale.sidecar.log.log import Log
from shale.sidecar.log.topic_partition import TopicPartition
from shale.sidecar.protocol import error_codes
from shale.sidecar.protocol.codec import decode_request, encode_response

FETCH, LIST_OFFSETS = 1, 2


@dataclass
class LedPartition:
    log: Log
    epoch: int
    high_watermark: int | None = None  # None: the log end


@dataclass
class LogLeader:
    partitions: dict[TopicPartition, LedPartition] = field(default_factory=dict)
    port: int = 0
    requests: list = field(default_factory=list)  # (api_key, body) of every request received
    corrupt_next: bool = False  # flip a bit inside the next record set sent (a CRC-32C the follower must check)
    _server: asyncio.AbstractServer | None = None
    _clients: set = field(default_factory=set)

    async def start(self) -> "LogLeader":
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", self.port)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def stop(self) -> None:
        assert self._server is not None
        self._server.close()
        for writer in list(self._clients):  # a stopped node drops its connections too
            writer.close()
        await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._clients.add(writer)
        try:
            while True:
                (size,) = struct.unpack(">i", await reader.readexactly(4))
                request = decode_request(await reader.readexactly(size))
                self.requests.append((request.api_key, request.body))
                if request.api_key == FETCH:
                    body = await self._fetch(request.body)
                else:
                    body = self._list_offsets(request.body)
                writer.write(encode_response(request.api_key, request.api_version, request.correlation_id, body,
                                             framed=True))
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            self._clients.discard(writer)
            writer.close()

    def _check_epoch(self, led: LedPartition | None, current_leader_epoch: int) -> int:
        if led is None:
            return error_codes.NOT_LEADER_OR_FOLLOWER
        if current_leader_epoch < led.epoch:
            return error_codes.FENCED_LEADER_EPOCH
        if current_leader_epoch > led.epoch:
            return error_codes.UNKNOWN_LEADER_EPOCH
        return error_codes.NONE

    def _partition(self, tp: TopicPartition, p) -> dict:
        led = self.partitions.get(tp)
        out = {"partition_index": tp.partition, "high_watermark": -1, "log_start_offset": -1}
        error = self._check_epoch(led, p.current_leader_epoch)
        if error:
            return {**out, "error_code": error}
        log = led.log
        hw = log.log_end_offset if led.high_watermark is None else led.high_watermark
        out.update(high_watermark=hw, last_stable_offset=hw, log_start_offset=log.log_start_offset)
        if p.last_fetched_epoch >= 0:
            epoch, end = log.end_offset_for_epoch(p.last_fetched_epoch)
            if epoch < 0 or end < 0 or p.fetch_offset < log.log_start_offset:
                return {**out, "error_code": error_codes.OFFSET_OUT_OF_RANGE}
            if epoch < p.last_fetched_epoch or end < p.fetch_offset:
                return {**out, "diverging_epoch": {"epoch": epoch, "end_offset": end}}
        if not log.log_start_offset <= p.fetch_offset <= log.log_end_offset:
            return {**out, "error_code": error_codes.OFFSET_OUT_OF_RANGE}
        found = log.read(p.fetch_offset, p.partition_max_bytes)
        records = found.read() if found is not None else b""
        if records and self.corrupt_next:
            self.corrupt_next = False
            records = records[:-1] + bytes([records[-1] ^ 0x40])
        return {**out, "records": records}

    async def _fetch(self, body) -> dict:
        for _ in range(max(1, body.max_wait_ms // 10)):  # a long poll: answer once there is data
            topics = [{"topic": t.topic, "partitions": [self._partition(TopicPartition(t.topic, p.partition), p)
                                                        for p in t.partitions]} for t in body.topics]
            if any(p.get("records") or p.get("error_code") or p.get("diverging_epoch")
                   for t in topics for p in t["partitions"]):
                break
            await asyncio.sleep(0.01)
        return {"responses": topics}

    def _list_offsets(self, body) -> dict:
        topics = []
        for t in body.topics:
            parts = []
            for p in t.partitions:
                led = self.partitions.get(TopicPartition(t.name, p.partition_index))
                error = self._check_epoch(led, p.current_leader_epoch)
                offset = -1 if error else led.log.log_end_offset if p.timestamp == -1 else led.log.log_start_offset
                parts.append({"partition_index": p.partition_index, "error_code": error, "timestamp": -1,
                              "offset": offset})
            topics.append({"name": t.name, "partitions": parts})
        return {"topics": topics}
