"""The README's first command: `shale serve` on a local directory, and the seed walkthrough through a real client.

It writes a `Topic` manifest for `latest-product-price` (compacted, segments rolled every 100 ms),
starts `shale serve` as a child process, produces the price updates with kafka-python (an
unmodified Kafka client, idempotent with acks=all by default), waits until the node's `/status`
reports that the cleaner compacted everything below the active segment, then consumes the topic from
the beginning and prints what is left: one record per product, its latest price. Kafka never cleans
the active segment, and rolls it (`segment.ms`) only when a later record arrives; so the walkthrough
ends with the first price of a new product, whose arrival rolls the segment holding the last update
of the others into the cleaner's reach. Then the node keeps serving until Ctrl-C, for kcat or any
other client.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
import urllib.request
from typing import TextIO

import yaml

TOPIC = "latest-product-price"
CONFIG = {"cleanup.policy": "compact", "segment.ms": "100", "min.cleanable.dirty.ratio": "0.01",
          "delete.retention.ms": "100"}
UPDATES = [("p3", "10$"), ("p5", "7$"), ("p3", "11$"), ("p6", "25$"), ("p6", "12$"), ("p5", "14$"), ("p5", "17$"),
           ("p7", "9$")]  # a new product last: the active segment then holds no older price of anything
# The demo should not wait Kafka's 15 s cleaner back-off.
OVERRIDES = {"log.cleaner.backoff.ms": "200"}


def manifest() -> dict:
    return {"apiVersion": "shale.dev/v1alpha1", "kind": "Topic", "metadata": {"name": TOPIC},
            "spec": {"partitions": 1, "config": CONFIG}}


def run_demo(workdir: str, out: TextIO, *, listen: str = "127.0.0.1:9092", http: str = "127.0.0.1:8080",
             keep_serving: bool = True, timeout_s: float = 60.0) -> int:
    topics_dir = os.path.join(workdir, "topics")
    os.makedirs(topics_dir, exist_ok=True)
    with open(os.path.join(topics_dir, f"{TOPIC}.yaml"), "w", encoding="utf-8") as f:
        yaml.safe_dump(manifest(), f, sort_keys=False)
    command = [sys.executable, "-m", "shale.sidecar.cli", "serve", "--data-dir", os.path.join(workdir, "data"),
               "--topics", topics_dir, "--listen", listen, "--http", http]
    for key, value in OVERRIDES.items():
        command += ["--override", f"{key}={value}"]
    log_path = os.path.join(workdir, "serve.log")
    print("$ shale serve " + " ".join(command[4:]) + f"    (its log: {log_path})", file=out, flush=True)
    with open(log_path, "ab") as log:
        server = subprocess.Popen(command, stdout=log, stderr=log)
    try:
        _wait_ready(http, server, timeout_s)
        _walkthrough(listen, http, out, timeout_s)
        if keep_serving:
            print(f"\nshale serve keeps running on {listen} (metrics and status on http://{http}); "
                  f"try: kcat -b {listen} -C -t {TOPIC} -e -f '%k=%s @%o\\n'   Ctrl-C stops it.", file=out, flush=True)
            try:
                server.wait()
            except KeyboardInterrupt:
                pass
    finally:
        if server.poll() is None:
            server.send_signal(signal.SIGTERM)  # graceful: flush, checkpoints, clean-shutdown marker
            server.wait(30)
    return 0 if server.returncode in (0, -signal.SIGTERM) else 1


def _get_json(http: str, path: str) -> dict:
    with urllib.request.urlopen(f"http://{http}{path}", timeout=2) as resp:
        return json.load(resp)


def _wait_ready(http: str, server: subprocess.Popen, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise SystemExit(f"shale serve exited with status {server.returncode}; see its log")
        try:
            with urllib.request.urlopen(f"http://{http}/readyz", timeout=1) as resp:
                if resp.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.1)
    raise SystemExit(f"shale serve was not ready after {timeout_s:.0f} s")


def _walkthrough(listen: str, http: str, out: TextIO, timeout_s: float) -> None:
    from kafka import KafkaConsumer, KafkaProducer, TopicPartition

    logging.getLogger("kafka").setLevel(logging.WARNING)  # the client's connection chatter is not the story

    producer = KafkaProducer(bootstrap_servers=listen, acks="all")
    try:
        for key, value in UPDATES:
            # One batch per update, more than segment.ms apart: each lands in a new segment, so the
            # cleaner has inactive segments to compact, as in the seed's walkthrough.
            meta = producer.send(TOPIC, key=key.encode(), value=value.encode()).get(timeout=10)
            print(f"produced {key}:{value} at offset {meta.offset}", file=out, flush=True)
            time.sleep(0.15)
    finally:
        producer.close(5)
    _wait_for_cleaning(http, timeout_s)
    key, value = UPDATES[-1]
    print(f"\nthe cleaner compacted {TOPIC}-0 (dirty ratio now 0.00, /status): every segment but the active "
          f"one, which Kafka never cleans and which {key}:{value} started; consuming from the beginning, "
          "one record per product, its latest price:", file=out)
    consumer = KafkaConsumer(bootstrap_servers=listen, enable_auto_commit=False, group_id=None)
    try:
        tp = TopicPartition(TOPIC, 0)
        consumer.assign([tp])
        consumer.seek_to_beginning(tp)
        end = consumer.end_offsets([tp])[tp]
        while consumer.position(tp) < end:
            for records in consumer.poll(timeout_ms=500).values():
                for r in records:
                    print(f"  offset {r.offset}: {r.key.decode()}:{r.value.decode()}", file=out)
    finally:
        consumer.close()


def _wait_for_cleaning(http: str, timeout_s: float) -> None:
    """Poll `/status` until the cleaner has compacted everything below the active segment (dirty ratio 0).

    A pass that ran while the updates were still arriving is not enough: the wait is for the pass that
    covers the last roll, after which the partition has nothing dirty left.
    """
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        partition = _get_json(http, "/status")["topics"][TOPIC]["partitions"][0]
        if (partition["last_clean_ms"] is not None and partition["cleaning"]["state"] == "idle"
                and partition["dirty_ratio"] == 0):
            return
        time.sleep(0.2)
    raise SystemExit(f"the cleaner did not compact {TOPIC}-0 below its active segment within {timeout_s:.0f} s")
