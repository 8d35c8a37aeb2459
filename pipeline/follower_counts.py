"""The example pipeline: per-user follower counts kept in a compacted topic, and their restore.

- `follow-events`: the event stream, one record per follow or unfollow, keyed by the followed user,
  value JSON `{"follower": "u7", "followee": "u3", "op": "follow"}`. The application emits an
  unfollow only for an existing follow, so a user's count is follows minus unfollows.
- The stream job reads it with `readStream.format("shale")`, sums +1/-1 per followed user in Spark's
  state store (exactly once, in the checkpoint), and every few minutes writes the counts that
  changed to `follower-counts`, keyed by user id, value `{"user": "u3", "followers": 12}` — or a
  tombstone when the count drops to 0. That topic is compacted: it holds the latest count of every
  user, whatever its age.
- The restore job rebuilds the whole table from the latest view of `follower-counts` — after a crash
  of whatever held the counts (a cache, a serving store), or to seed a new one — over the Kafka
  protocol, or from a copy of the data directory with no server running.

`python -m shale.pipeline.follower_counts demo` runs it all on one machine against `shale serve`.
The same functions run on a Spark cluster: only the SparkSession differs.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, TypeVar

EVENTS_TOPIC = "follow-events"
COUNTS_TOPIC = "follower-counts"
EVENT_SCHEMA = "follower string, followee string, op string"
T = TypeVar("T")


@dataclass(frozen=True)
class Event:
    follower: str
    followee: str
    op: str  # "follow" | "unfollow"

    def to_json(self) -> bytes:
        return json.dumps({"follower": self.follower, "followee": self.followee, "op": self.op}).encode()


def topic_manifests(partitions: int = 3, *, demo: bool = False) -> list[dict]:
    """The two Topic manifests; `demo` rolls segments every second so that compaction shows quickly."""
    counts_config = {"cleanup.policy": "compact"}
    if demo:
        counts_config.update({"segment.ms": "1000", "min.cleanable.dirty.ratio": "0.01"})

    def manifest(name: str, config: dict) -> dict:
        return {"apiVersion": "shale.dev/v1alpha1", "kind": "Topic", "metadata": {"name": name},
                "spec": {"partitions": partitions, "config": config}}

    return [manifest(EVENTS_TOPIC, {}), manifest(COUNTS_TOPIC, counts_config)]


def generate_events(n: int, users: int, seed: int = 0) -> list[Event]:
    """`n` consistent events among `users` users: an unfollow only ever undoes a follow."""
    rng = random.Random(seed)
    edges: set[tuple[str, str]] = set()
    events = []
    while len(events) < n:
        a, b = f"u{rng.randrange(users)}", f"u{rng.randrange(users)}"
        if a == b:
            continue
        if (a, b) in edges and rng.random() < 0.5:
            edges.discard((a, b))
            events.append(Event(a, b, "unfollow"))
        elif (a, b) not in edges:
            edges.add((a, b))
            events.append(Event(a, b, "follow"))
    return events


def expected_counts(events: list[Event]) -> dict[str, int]:
    """The model: followers per user after the events, users with none left out."""
    counts: dict[str, int] = {}
    for e in events:
        counts[e.followee] = counts.get(e.followee, 0) + (1 if e.op == "follow" else -1)
    return {u: n for u, n in counts.items() if n}


def produce_events(bootstrap: str, events: list[Event], topic: str = EVENTS_TOPIC) -> None:
    """Produce keyed by the followed user, so each user's events stay in order in one partition."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True,
                         "partitioner": "murmur2_random", "linger.ms": 5})
    errors = []
    for e in events:
        while True:
            try:
                producer.produce(topic, e.to_json(), e.followee.encode(),
                                 on_delivery=lambda err, msg: err and errors.append(f"{msg.topic()}-{msg.partition()}: {err}"))
                break
            except BufferError:
                producer.poll(0.05)
    if producer.flush(60) or errors:
        raise RuntimeError(f"producing events to {topic} at {bootstrap} failed: {errors[:3]}")


def count_stream(spark, bootstrap: str, checkpoint: str, *, every: str | None = "3 minutes",
                 events_topic: str = EVENTS_TOPIC, counts_topic: str = COUNTS_TOPIC,
                 max_offsets_per_trigger: int | None = None):
    """Start the stream job; `every=None` processes what is there now and stops (Trigger.AvailableNow)."""
    from pyspark.sql import functions as F

    reader = (spark.readStream.format("shale").option("bootstrap.servers", bootstrap)
              .option("subscribe", events_topic).option("startingOffsets", "earliest"))
    if max_offsets_per_trigger:
        reader = reader.option("maxOffsetsPerTrigger", str(max_offsets_per_trigger))
    events = reader.load().select(F.from_json(F.col("value").cast("string"), EVENT_SCHEMA).alias("e"))
    deltas = events.select(F.col("e.followee").alias("user"),
                           F.when(F.col("e.op") == "follow", 1).when(F.col("e.op") == "unfollow", -1)
                           .otherwise(0).alias("delta"))
    counts = deltas.groupBy("user").agg(F.sum("delta").alias("followers"))

    def write_changed(batch, batch_id: int) -> None:
        # The counts that changed in this trigger; a replayed trigger writes the same values again.
        (batch.select(F.col("user").alias("key"),
                      F.when(F.col("followers") > 0, F.to_json(F.struct("user", "followers"))).alias("value"))
         .write.format("shale").option("bootstrap.servers", bootstrap).option("topic", counts_topic)
         .mode("append").save())

    writer = (counts.writeStream.outputMode("update").foreachBatch(write_changed)
              .option("checkpointLocation", checkpoint).queryName("follower-counts"))
    writer = writer.trigger(availableNow=True) if every is None else writer.trigger(processingTime=every)
    return writer.start()


def restore_counts(spark, source: dict[str, str], counts_topic: str = COUNTS_TOPIC):
    """The counts table (user, followers) from the latest view of the counts topic.

    `source` is {"bootstrap.servers": ...} or {"path": data directory}.
    """
    from pyspark.sql import functions as F

    from .latest import read

    latest = read(spark, {**source, "subscribe": counts_topic, "latest": "true"})
    parsed = latest.select(F.from_json(F.col("value").cast("string"), "user string, followers long").alias("c"))
    return parsed.select("c.user", "c.followers")


def _serve(workdir: Path, port: int, http_port: int) -> subprocess.Popen:
    import yaml

    manifests = workdir / "topics.yaml"
    manifests.write_text(yaml.safe_dump_all(topic_manifests(demo=True)))
    with open(workdir / "serve.log", "ab") as log:
        # Its own session: a Ctrl-C in the terminal reaches the demo alone, which stops Spark (reading from the
        # server) first and the server after it; stopped together, Spark's readers would fail loudly.
        return subprocess.Popen([sys.executable, "-m", "shale.sidecar.cli", "serve", "--data-dir",
                                 str(workdir / "data"), "--topics", str(manifests), "--listen", f"127.0.0.1:{port}",
                                 "--http", f"127.0.0.1:{http_port}", "--override", "log.cleaner.backoff.ms=200"],
                                stdout=log, stderr=log, start_new_session=True)


def _wait_listening(port: int, proc: subprocess.Popen, timeout: float = 60.0) -> None:
    import socket

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"shale serve exited with {proc.returncode}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"shale serve did not listen on 127.0.0.1:{port} within {timeout:.0f} s")


def demo(events: int, users: int, workdir: str | None) -> int:
    """Serve, produce events, count them with the stream job in two runs, restore and compare; then kill
    the server (SIGKILL, a crash) and restore again from its data directory alone.

    Without `workdir` everything goes to a temporary directory, removed at the end — after an error or
    Ctrl-C too, once Spark and the server have stopped.
    """
    from .session import local_session

    with contextlib.ExitStack() as cleanup:  # unwinds in reverse: Spark, the server, the temporary directory
        if workdir is None:
            work = Path(cleanup.enter_context(tempfile.TemporaryDirectory(prefix="shale-follower-counts-",
                                                                          ignore_cleanup_errors=True)))
        else:
            work = Path(workdir)
            work.mkdir(parents=True, exist_ok=True)
        port, http_port = _free_port(), _free_port()
        server = _serve(work, port, http_port)
        cleanup.callback(_stop, server)
        _wait_listening(port, server)
        bootstrap = f"127.0.0.1:{port}"
        spark = local_session("follower-counts")
        cleanup.callback(_stop_spark, spark)
        # PySpark's SIGINT handler cancels every job first, which fails the running stream query loudly;
        # `_stop_spark` stops it in order instead.
        signal.signal(signal.SIGINT, signal.default_int_handler)
        evs = generate_events(events, users)
        half = len(evs) // 2
        kept = "" if workdir is None else ", kept"
        print(f"shale serve on {bootstrap} (data in {work / 'data'}{kept}); producing {half} events", flush=True)
        produce_events(bootstrap, evs[:half])
        checkpoint = str(work / "checkpoint")
        _in_spark(lambda: count_stream(spark, bootstrap, checkpoint, every=None).awaitTermination())
        print(f"stream run 1 done; producing {len(evs) - half} more events (the stream would run every few minutes)",
              flush=True)
        produce_events(bootstrap, evs[half:])
        _in_spark(lambda: count_stream(spark, bootstrap, checkpoint, every=None).awaitTermination())
        print("stream run 2 done; restoring the counts from the latest view of", COUNTS_TOPIC, flush=True)
        restored = _in_spark(lambda: _collect_counts(spark, {"bootstrap.servers": bootstrap}))
        model = expected_counts(evs)
        top = sorted(restored.items(), key=lambda kv: (-kv[1], kv[0]))[:10]
        print("top users by followers:", ", ".join(f"{u}={n}" for u, n in top), flush=True)
        over_wire = restored == model
        print(f"restored {len(restored)} users over the wire; equal to the counts computed from the events: "
              f"{over_wire}", flush=True)
        server.kill()  # a crash: no flush, no clean shutdown
        server.wait(30)
        from_files = _in_spark(lambda: _collect_counts(spark, {"path": str(work / "data")}))
        print(f"shale serve killed; restored {len(from_files)} users from its data directory alone; equal: "
              f"{from_files == model}", flush=True)
        return 0 if over_wire and from_files == model else 1


def _collect_counts(spark, source: dict[str, str]) -> dict[str, int]:
    return {r.user: r.followers for r in restore_counts(spark, source).collect()}


def _in_spark(call: Callable[[], T]) -> T:
    """`call()`, made in a thread of its own while this one waits: Ctrl-C then interrupts the wait, never a
    call into the JVM. py4j does not always survive an interrupted call (the next ones, such as stopping
    Spark, can fail), and `_stop_spark` needs them."""
    from pyspark import InheritableThread  # the thread of pinned-thread mode: the JVM thread ends with it

    outcome: dict[str, object] = {}

    def run() -> None:
        try:
            outcome["value"] = call()
        except BaseException as exc:  # noqa: BLE001 - raised again in the waiting thread
            outcome["error"] = exc

    worker = InheritableThread(run, name="spark-call", daemon=True)
    worker.start()
    worker.join()
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


def _stop_spark(spark) -> None:
    """Stop the stream query an interrupted run leaves running (its call returns), then the session."""
    for query in spark.streams.active:
        query.stop()
    spark.stop()


def _stop(server: subprocess.Popen) -> None:
    """SIGTERM a server still running (a clean stop), and wait for it."""
    if server.poll() is None:
        server.terminate()
        server.wait(30)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m shale.pipeline.follower_counts", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    d = sub.add_parser("demo", help="everything on one machine against a fresh `shale serve`")
    d.add_argument("--events", type=int, default=20000)
    d.add_argument("--users", type=int, default=500)
    d.add_argument("--workdir")
    s = sub.add_parser("stream", help="the stream job (runs until stopped)")
    s.add_argument("--bootstrap-servers", required=True)
    s.add_argument("--checkpoint", required=True)
    s.add_argument("--every", default="3 minutes", help="trigger interval (default: 3 minutes)")
    s.add_argument("--available-now", action="store_true", help="process what is there and stop")
    r = sub.add_parser("restore", help="rebuild the counts table from the latest view")
    src = r.add_mutually_exclusive_group(required=True)
    src.add_argument("--bootstrap-servers")
    src.add_argument("--data-dir", help="read a data directory's files instead (no server needed)")
    r.add_argument("--out", required=True, help="directory for the table (JSON lines)")
    g = sub.add_parser("generate", help="produce random follow events")
    g.add_argument("--bootstrap-servers", required=True)
    g.add_argument("--events", type=int, default=20000)
    g.add_argument("--users", type=int, default=500)
    g.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    if args.command == "demo":
        try:
            return demo(args.events, args.users, args.workdir)
        except KeyboardInterrupt:  # Ctrl-C: everything is stopped and removed by now; no traceback
            print("interrupted", file=sys.stderr)
            return 130
    if args.command == "generate":
        produce_events(args.bootstrap_servers, generate_events(args.events, args.users, args.seed))
        return 0
    from .session import local_session

    spark = local_session(f"follower-counts-{args.command}")
    if args.command == "stream":
        every = None if args.available_now else args.every
        count_stream(spark, args.bootstrap_servers, args.checkpoint, every=every).awaitTermination()
        return 0
    source = {"bootstrap.servers": args.bootstrap_servers} if args.bootstrap_servers else {"path": args.data_dir}
    table = restore_counts(spark, source)
    table.write.mode("overwrite").json(args.out)
    print(f"restored {table.count()} users' follower counts into {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
