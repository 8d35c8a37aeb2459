"""Memory and descriptors of a real `shale serve` are bounded (issue 12, item 3).

A request costs the bytes that actually arrive, not what its header announces; the bytes in flight over all
connections stop at `queued.max.request.bytes` (back-pressure, then every request still completes); a frame
above `socket.request.max.bytes` closes only its own connection; segment files are opened on use and the
least recently used closed, so a node with more partitions than descriptors serves and restarts; a topic
the process cannot hold is refused whole; and accept() out of descriptors backs off without flooding the log.
"""

from __future__ import annotations

import json
import os
import socket
import struct
import subprocess
import threading
import time
from pathlib import Path

from confluent_kafka import Consumer, Producer
from confluent_kafka import TopicPartition as CTP
from confluent_kafka.admin import AdminClient, NewTopic
from kafka.protocol.metadata.api_versions import ApiVersionsRequest, ApiVersionsResponse
from kafka.protocol.producer.produce import ProduceRequest, ProduceResponse

from shale.sidecar.log.records import Record, encode_batch
from shale.sidecar.protocol.error_codes import NONE, POLICY_VIOLATION
from support.clients_util import build, call, closes_without_reply, read_frame, request_frame
from support.http_util import request, scrape
from support.node_util import ServeProcess, topic_manifest, wait_for, write_manifests

MiB = 1 << 20
DEFAULT_MAX_FRAME = 100 * MiB  # socket.request.max.bytes


def serve(tmp_path: Path, *manifests: dict, overrides: dict[str, object] | None = None,
          nofile: int | None = None) -> ServeProcess:
    """A `shale serve` with one small __consumer_offsets partition, under `ulimit -n nofile` if given."""
    if manifests:
        write_manifests(tmp_path / "topics" / "topics.yaml", *manifests)
    else:
        (tmp_path / "topics").mkdir(exist_ok=True)
    settings = {"offsets.topic.num.partitions": 1, **(overrides or {})}
    extra = [arg for k, v in settings.items() for arg in ("--override", f"{k}={v}")]
    node = ServeProcess(tmp_path / "data", tmp_path / "topics", *extra)
    if nofile is not None:
        node.args = ["prlimit", f"--nofile={nofile}", *node.args]  # prlimit execs: the pid is the node's
    return node


def metric(node: ServeProcess, name: str) -> float:
    return scrape(node.http_port)[(name, frozenset())]


def status(node: ServeProcess) -> dict:
    code, body, _ = request(node.http_port, "/status")
    assert code == 200
    return json.loads(body)


def proc_status(pid: int, field: str) -> int:
    """A `kB` figure of /proc/PID/status (VmRSS, VmSize), in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no {field} in /proc/{pid}/status")


def produce(bootstrap: str, topic: str, records: dict[int, bytes]) -> None:
    """One record per partition, acknowledged by the node (acks=all)."""
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5})
    failures: list[str] = []
    for partition, value in records.items():
        producer.produce(topic, value, partition=partition,
                         on_delivery=lambda err, _msg: failures.append(str(err)) if err else None)
    assert producer.flush(60) == 0 and failures == []


def read_back(bootstrap: str, topic: str, partitions: int) -> dict[int, list[bytes]]:
    """Every record of every partition, from the beginning."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"read-{topic}-{time.monotonic_ns()}",
                         "enable.auto.commit": False, "enable.partition.eof": True})
    consumer.assign([CTP(topic, p, 0) for p in range(partitions)])
    out: dict[int, list[bytes]] = {p: [] for p in range(partitions)}
    at_end: set[int] = set()
    deadline = time.monotonic() + 120
    try:
        while len(at_end) < partitions and time.monotonic() < deadline:
            msg = consumer.poll(1.0)
            if msg is None:
                continue
            if msg.error():
                assert msg.error().code() == -191, msg.error()  # _PARTITION_EOF
                at_end.add(msg.partition())
                continue
            out[msg.partition()].append(msg.value())
    finally:
        consumer.close()
    assert len(at_end) == partitions, f"read {len(at_end)} of {partitions} partitions to their end"
    return out


def produce_frame(topic: str, value: bytes, correlation_id: int) -> bytes:
    batch = encode_batch([Record(0, int(time.time() * 1000), None, value)])
    req = build(ProduceRequest, {"transactional_id": None, "acks": -1, "timeout_ms": 30000, "topic_data": [
        {"name": topic, "partition_data": [{"index": 0, "records": batch}]}]}, 9)
    return request_frame(req, correlation_id, "bulk-producer")


def api_versions_frame(correlation_id: int) -> bytes:
    return request_frame(ApiVersionsRequest(version=3, client_software_name="t", client_software_version="1"),
                         correlation_id)


# -- memory ---------------------------------------------------------------------------------------


def test_a_flood_of_announced_frames_costs_only_the_bytes_that_arrived(tmp_path):
    """50 connections each announce a 100 MiB frame and send 3 bytes of it: the node holds their 350 bytes
    (it used to allocate the 100 MiB per connection: 5 GB here), keeps serving everyone else, and lets go
    of the bytes when the connections close."""
    with serve(tmp_path, topic_manifest("events")) as node:
        produce(node.bootstrap, "events", {0: b"before"})
        assert metric(node, "shale_request_bytes_in_flight") == 0
        rss_before = proc_status(node.proc.pid, "VmRSS")
        flood = [socket.create_connection(("127.0.0.1", node.port)) for _ in range(50)]
        try:
            for sock in flood:
                sock.sendall(struct.pack(">i", DEFAULT_MAX_FRAME) + b"abc")
            wait_for(lambda: metric(node, "shale_request_bytes_in_flight") == 50 * 7, 30,
                     what="the node to receive the 7 bytes of each connection")
            grown = proc_status(node.proc.pid, "VmRSS") - rss_before
            assert grown < DEFAULT_MAX_FRAME // 4, f"RSS grew {grown} bytes for 350 bytes received"
            produce(node.bootstrap, "events", {0: b"during"})  # other clients are served meanwhile
            assert read_back(node.bootstrap, "events", 1) == {0: [b"before", b"during"]}
        finally:
            for sock in flood:
                sock.close()
        wait_for(lambda: metric(node, "shale_request_bytes_in_flight") == 0, 30,
                 what="the closed connections' bytes to be released")
        assert metric(node, "shale_request_bytes_limit") == DEFAULT_MAX_FRAME  # queued.max.request.bytes -1


def test_requests_in_flight_stop_at_the_limit_and_all_complete(tmp_path):
    """Six clients each send 1 MiB of a 1.5 MiB Produce and wait: the node reads until 4 MiB are in flight
    (queued.max.request.bytes) and stops reading; a seventh client's small request waits behind them. When
    the six send the rest, every request is answered: half-received frames never wait on each other."""
    limit, value = 4 * MiB, 3 * MiB // 2
    manifests = [topic_manifest(f"bulk{i}", 1, {"max.message.bytes": 4 * MiB}) for i in range(6)]
    with serve(tmp_path, *manifests, overrides={"queued.max.request.bytes": limit}) as node:
        frames = [produce_frame(f"bulk{i}", bytes([i]) * value, 100 + i) for i in range(6)]
        go_on = threading.Event()
        answers: dict[int, object] = {}

        def client(i: int) -> None:
            with socket.create_connection(("127.0.0.1", node.port), timeout=120) as sock:
                sock.sendall(frames[i][:MiB])
                go_on.wait(120)
                sock.sendall(frames[i][MiB:])
                answers[i] = ProduceResponse.decode(read_frame(sock), version=9, header=True)

        def small_client() -> None:
            answers[6] = call(node.port, ApiVersionsRequest(version=3, client_software_name="t",
                                                            client_software_version="1"), ApiVersionsResponse)

        threads = [threading.Thread(target=client, args=(i,)) for i in range(6)]
        for t in threads:
            t.start()
        try:
            wait_for(lambda: metric(node, "shale_request_memory_waits_total") >= 1
                     and metric(node, "shale_request_bytes_in_flight") >= limit, 60,
                     what="the bytes in flight to reach queued.max.request.bytes")
            held = metric(node, "shale_request_bytes_in_flight")
            assert limit <= held <= limit + 2 * len(frames[0]), held  # the limit, the frame that reads on, one read
            assert held < sum(len(f[:MiB]) for f in frames)  # not everything sent was read
            threads.append(threading.Thread(target=small_client))
            threads[-1].start()
        finally:
            go_on.set()
            for t in threads:
                t.join(120)
        assert not any(t.is_alive() for t in threads)
        assert answers[6].error_code == NONE
        for i in range(6):
            [part] = answers[i].responses[0].partition_responses
            assert (part.error_code, part.base_offset) == (NONE, 0), (i, part)
        assert {i: [len(v) for v in vs] for i, vs in enumerate(
            read_back(node.bootstrap, f"bulk{i}", 1)[0] for i in range(6))} == {i: [value] for i in range(6)}
        wait_for(lambda: metric(node, "shale_request_bytes_in_flight") == 0, 30, what="every request released")


def test_a_frame_above_socket_request_max_bytes_closes_only_its_connection(tmp_path):
    """With socket.request.max.bytes at 1 MiB, a frame announcing one byte more is refused before any of it is
    buffered; a client on another connection keeps its connection and its answers."""
    with serve(tmp_path, topic_manifest("events", 1, {"max.message.bytes": 2 * MiB}),
               overrides={"socket.request.max.bytes": MiB}) as node:
        with socket.create_connection(("127.0.0.1", node.port), timeout=30) as healthy:
            healthy.sendall(api_versions_frame(1))
            assert ApiVersionsResponse.decode(read_frame(healthy), version=3, header=True).error_code == NONE
            assert closes_without_reply(node.port, struct.pack(">i", MiB + 1) + bytes(4 * MiB))
            healthy.sendall(api_versions_frame(2))  # the same connection, after the other was closed
            reply = ApiVersionsResponse.decode(read_frame(healthy), version=3, header=True)
            assert (reply.header.correlation_id, reply.error_code) == (2, NONE)
        just_below = produce_frame("events", b"v" * (MiB - 200), 3)
        assert len(just_below) - 4 <= MiB
        with socket.create_connection(("127.0.0.1", node.port), timeout=30) as sock:
            sock.sendall(just_below)
            [part] = ProduceResponse.decode(read_frame(sock), version=9, header=True).responses[0].partition_responses
            assert (part.error_code, part.base_offset) == (NONE, 0)
        wait_for(lambda: metric(node, "shale_request_bytes_in_flight") == 0, 30, what="every request released")
        assert f"frame size {MiB + 1} outside 0..{MiB} bytes (socket.request.max.bytes)" in node.log()


# -- descriptors ----------------------------------------------------------------------------------


def test_more_partitions_than_descriptors_are_all_readable_and_writable(tmp_path):
    """ulimit -n 256 and a 300-partition topic: every partition takes a record and gives it back, through
    at most 128 open segment files; the node restarts on that data dir (cleanly and after SIGKILL), under
    the same limit, also once the manifest is gone."""
    partitions = 300
    node = serve(tmp_path, topic_manifest("wide", partitions), nofile=256)
    with node:
        wait_for(lambda: len(status(node)["topics"].get("wide", {}).get("partitions", [])) == partitions,
                 60, what="the 300 partitions")
        produce(node.bootstrap, "wide", {p: b"p%d" % p for p in range(partitions)})
        assert read_back(node.bootstrap, "wide", partitions) == {p: [b"p%d" % p] for p in range(partitions)}
        assert metric(node, "shale_open_segment_files_limit") == 128
        assert metric(node, "shale_open_segment_files") <= 128
        assert metric(node, "shale_segment_file_evictions_total") > 0
        assert len(os.listdir(f"/proc/{node.proc.pid}/fd")) < 256
        produce(node.bootstrap, "wide", {p: b"q%d" % p for p in range(partitions)})  # reopened files take appends
    assert node.proc.returncode == 0
    expected = {p: [b"p%d" % p, b"q%d" % p] for p in range(partitions)}
    node.start()  # clean restart
    assert read_back(node.bootstrap, "wide", partitions) == expected
    node.kill()
    node.start()  # recovery of every partition, through the LRU
    assert read_back(node.bootstrap, "wide", partitions) == expected
    node.terminate()
    (tmp_path / "topics" / "topics.yaml").unlink()
    node.start()  # the logs on disk, with no manifest: the node starts on its own data dir
    assert status(node)["phase"] == "serving"
    assert len(list((tmp_path / "data").glob("wide-*"))) == partitions
    node.terminate()
    assert "Too many open files" not in node.log()


def test_a_topic_the_node_cannot_hold_is_refused_whole(tmp_path):
    """Under an address-space limit with room for ~90 partitions' indexes (2 x 10 MiB each), a manifest for 200
    partitions is refused with the reason in /status and a CreateTopics for 200 gets POLICY_VIOLATION with a
    message; neither leaves a directory, the node keeps serving and accepts a topic that fits, and restarts."""
    with serve(tmp_path, topic_manifest("small")) as node:
        produce(node.bootstrap, "small", {0: b"kept"})
        room = proc_status(node.proc.pid, "VmSize") + 2048 * MiB
        subprocess.run(["prlimit", "--pid", str(node.proc.pid), f"--as={room}:{room}"], check=True)
        write_manifests(tmp_path / "topics" / "topics.yaml", topic_manifest("small"), topic_manifest("huge", 200))
        wait_for(lambda: "huge" in status(node)["errors"]["topics"], 30, what="the refusal of topic huge")
        reason = status(node)["errors"]["topics"]["huge"]
        assert "200 new partitions" in reason and "room for" in reason, reason
        assert metric(node, "shale_topic_errors") == 1
        admin = AdminClient({"bootstrap.servers": node.bootstrap})
        futures = admin.create_topics([NewTopic("huge-api", 200, 1), NewTopic("fits", 10, 1)])
        try:
            futures["huge-api"].result(30)
            raise AssertionError("CreateTopics for 200 partitions was accepted")
        except Exception as exc:  # noqa: BLE001 - confluent's KafkaException carries the broker's error
            error = exc.args[0]
            assert error.code() == POLICY_VIOLATION and "room for" in error.str(), error
        futures["fits"].result(30)
        data = tmp_path / "data"
        assert list(data.glob("huge-*")) == [] and list(data.glob("huge-api-*")) == []
        assert len(list(data.glob("fits-*"))) == 10
        produce(node.bootstrap, "fits", {p: b"f%d" % p for p in range(10)})
        assert read_back(node.bootstrap, "small", 1) == {0: [b"kept"]}
        assert read_back(node.bootstrap, "fits", 10) == {p: [b"f%d" % p] for p in range(10)}
    write_manifests(tmp_path / "topics" / "topics.yaml", topic_manifest("small"))
    with node:  # a new process, without the limit
        assert read_back(node.bootstrap, "small", 1) == {0: [b"kept"]}
        assert status(node)["errors"]["topics"] == {}


def test_accept_out_of_descriptors_backs_off_and_logs_once(tmp_path):
    """ulimit -n 96 and 200 connections: accept() fails with EMFILE; the node retries with a growing pause,
    counts each failure and logs one line (asyncio logged a traceback per try, 100 per wakeup), and takes
    connections again once descriptors are free."""
    node = serve(tmp_path, topic_manifest("events"), nofile=96)
    with node:
        produce(node.bootstrap, "events", {0: b"before"})
        clients = []
        try:
            for _ in range(200):
                clients.append(socket.create_connection(("127.0.0.1", node.port), timeout=30))
            wait_for(lambda: "cannot accept connections" in node.log(), 30, what="accept() to run out of descriptors")
            time.sleep(1.0)  # retries at 10, 20, 40 ... ms: several failures before the descriptors come back
        finally:
            for sock in clients:
                sock.close()
        wait_for(lambda: metric(node, "shale_accept_errors_total") >= 2, 60, what="the node to answer again")
        produce(node.bootstrap, "events", {0: b"after"})
        assert read_back(node.bootstrap, "events", 1) == {0: [b"before", b"after"]}
    log = node.log()
    assert log.count("cannot accept connections") == 1, log[-3000:]
    assert "socket.accept() out of system resource" not in log
