"""A writer process for the crash tests: appends keyed batches to a LogDir until it is killed.

Run as `python crash_writer.py DIR --mode flush|noflush [--preallocate] --seed N ...`.

Protocol on stdout (flushed after every line group):
  `start <log end offset> <recovery point>`  once the LogDir is open (recovery done);
  `<offset> <key> <digest>`                   one line per record of an append, written
                                              only after `append()` returned (in flush mode
                                              `flush.messages=1` makes the append fsync first),
                                              all lines of one append in one write;
  `closed`                                    after a clean `LogDir.close()` on SIGTERM;
  `done`                                      after `--appends N --hang`, which then waits to be killed.

`digest` is blake2b of key + NUL + value (`-` for a null value), so the test can verify
a record read back without knowing the random value. The test imports this module for
the config and the digest.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import random
import signal
import sys
import time

TOPIC = "crash"
PARTITION = 0
T0 = 1_700_000_000_000  # record timestamps: T0 + offset * 7 + jitter, so they are not monotonic


def make_config(props: dict[str, str]):
    """The topic config for `props` (Kafka names, string values) over Kafka's defaults."""
    from shale.sidecar.topic_config import TopicConfig

    return TopicConfig.from_mapping(dict(props))


SEGMENT_BYTES = 16384


def crash_props(mode: str, preallocate: bool) -> dict[str, str]:
    """Small segments and a small index interval so that segments roll and indexes get entries."""
    props = {
        "segment.bytes": str(SEGMENT_BYTES),
        "index.interval.bytes": "300",
        "segment.index.bytes": "4096",
        "preallocate": "true" if preallocate else "false",
    }
    if mode == "flush":
        props["flush.messages"] = "1"
    return props


def digest(key: bytes, value: bytes | None) -> str:
    return hashlib.blake2b(key + b"\0" + (b"-" if value is None else b"+" + value), digest_size=12).hexdigest()


def _value(rng: random.Random, budget: int) -> bytes | None:
    roll = rng.random()
    if roll < 0.05:
        return None
    size = rng.randint(0, budget)
    if rng.random() < 0.5:  # compressible
        pattern = rng.randbytes(rng.randint(1, 16))
        return (pattern * (size // len(pattern) + 1))[:size]
    return rng.randbytes(size)


def build_append(rng: random.Random, seed: int, seq: int, next_offset: int):
    """One append: one or (sometimes) two batches; returns (bytes, [(key, value)] in offset order)."""
    from shale.sidecar.log.compression import Compression
    from shale.sidecar.log.records import Record, encode_batch

    parts = []
    records = []
    for b in range(2 if rng.random() < 0.15 else 1):
        n = rng.choice((1, 1, 2, 3, 5, 8, 12))
        budget = rng.choice((16, 200, 1000, 2500, 6000)) // n  # batches of ~100 B to ~6 KB
        batch = []
        for i in range(n):
            key = f"k{seed}.{seq}.{b}.{i}".encode()
            if rng.random() < 0.2:
                key = f"hot{rng.randrange(10)}".encode()  # repeated keys, as on a compacted topic
            value = _value(rng, budget)
            ts = T0 + (next_offset + len(records)) * 7 + rng.randint(-100, 100)
            batch.append(Record(i, ts, key, value))
            records.append((key, value))
        codec = rng.choice((Compression.NONE, Compression.NONE, Compression.GZIP, Compression.SNAPPY,
                            Compression.LZ4, Compression.ZSTD))
        parts.append(encode_batch(batch, compression=codec))
    return b"".join(parts), records


def main(argv: list[str] | None = None) -> None:
    from shale.sidecar.log.log_dir import LogDir
    from shale.sidecar.log.topic_partition import TopicPartition

    p = argparse.ArgumentParser()
    p.add_argument("dir")
    p.add_argument("--mode", choices=("flush", "noflush"), required=True)
    p.add_argument("--preallocate", action="store_true")
    p.add_argument("--seed", type=int, required=True)
    p.add_argument("--appends", type=int, default=0, help="stop after this many appends (0: until killed)")
    p.add_argument("--checkpoint-every", type=int, default=0,
                   help="write the recovery-point checkpoint every N appends, as Kafka's periodic task does")
    p.add_argument("--checkpoint-at", type=int, default=-1, help="write the checkpoint once, after append N")
    p.add_argument("--clean-exit", action="store_true", help="close the LogDir cleanly after --appends")
    p.add_argument("--hang", action="store_true", help="after --appends, print `done` and wait to be killed")
    args = p.parse_args(argv)

    stop = False

    def on_term(signum, frame):  # a clean shutdown: finish the current append, then close
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_term)
    out = sys.stdout.buffer
    config = make_config(crash_props(args.mode, args.preallocate))
    log_dir = LogDir(args.dir, lambda topic: config)
    log = log_dir.get_or_create(TopicPartition(TOPIC, PARTITION))
    out.write(f"start {log.log_end_offset} {log.recovery_point}\n".encode())
    out.flush()
    rng = random.Random(args.seed)
    seq = 0
    while not stop and (args.appends == 0 or seq < args.appends):
        data, records = build_append(rng, args.seed, seq, log.log_end_offset)
        info = log.append(data)
        if info.last_offset - info.first_offset + 1 != len(records):
            raise SystemExit(f"append returned {info} for {len(records)} records")
        out.write("".join(f"{info.first_offset + i} {k.decode()} {digest(k, v)}\n"
                          for i, (k, v) in enumerate(records)).encode())
        out.flush()
        seq += 1
        if (args.checkpoint_every and seq % args.checkpoint_every == 0) or seq == args.checkpoint_at:
            log_dir.checkpoint()
    if stop or args.clean_exit:
        log_dir.close()
        out.write(b"closed\n")
        out.flush()
        return
    if args.hang:
        out.write(b"done\n")
        out.flush()
        while True:
            time.sleep(60)
    # A bounded run that ends like a crash: no close, no marker, files as the process left them.
    os._exit(0)


if __name__ == "__main__":
    main()
