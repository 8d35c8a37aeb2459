"""`shale dump-log` against real kafka-dump-log.sh output of broker-written segments, and against our own files."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import pytest

from shale.sidecar.dump_log import dump_files
from shale.sidecar.log.log import Log
from shale.sidecar.log.records import Record, decode_batch, encode_batch
from shale.sidecar.topic_config import TopicConfig

FIXTURES = Path(__file__).parent / "fixtures" / "kafka"
# Goldens whose every line our default decoder must reproduce (the 3.2.3 one says "Starting offset").
GOLDENS = [
    "fvaleri_2025_output-topic-0_segment",
    "fvaleri_2024kraft_my-topic-0_segment",
    "ableasdale_transaction-topic-0_segment",
    "fvaleri_k323_my-topic-0_segment",
]


def _segment(tmp_path: Path, name: str) -> Path:
    path = tmp_path / "00000000000000000000.log"
    path.write_bytes(bytes.fromhex((FIXTURES / f"{name}.hex").read_text()))
    return path


def _dump(paths: list[Path], **kw) -> tuple[int, list[str], list[str]]:
    out, err = io.StringIO(), io.StringIO()
    rc = dump_files([str(p) for p in paths], out=out, err=err, **kw)
    return rc, out.getvalue().splitlines(), err.getvalue().splitlines()


@pytest.mark.parametrize("name", GOLDENS)
def test_dump_matches_real_kafka_output(tmp_path: Path, name: str) -> None:
    seg = _segment(tmp_path, name)
    rc, lines, err = _dump([seg], print_data=True)
    golden = (FIXTURES / f"{name}.dump.txt").read_text().splitlines()
    assert rc == 0 and err == []
    assert lines[0] == f"Dumping {seg}"
    expected = [line.replace("Starting offset:", "Log starting offset:") for line in golden[1:]]
    assert lines[1:] == expected


def test_batch_lines_of_transaction_state_segment(tmp_path: Path) -> None:
    """That golden used Kafka's transaction-log decoder for payloads; batch lines are decoder-independent."""
    name = "fvaleri_2025_transaction_state-30_segment"
    rc, lines, _ = _dump([_segment(tmp_path, name)], print_data=True)
    golden = (FIXTURES / f"{name}.dump.txt").read_text().splitlines()
    assert rc == 0
    assert [x for x in lines if x.startswith("baseOffset")] == [x for x in golden if x.startswith("baseOffset")]


@pytest.mark.parametrize("name", GOLDENS + ["fvaleri_2025_transaction_state-30_segment"])
def test_engine_recovers_and_reads_broker_written_segment(tmp_path: Path, name: str) -> None:
    """A segment a real broker wrote, opened after an unclean shutdown: nothing is truncated, every batch reads back."""
    part = tmp_path / "topic-0"
    part.mkdir()
    _segment(part, name)
    expected = json.loads((FIXTURES / "expected.json").read_text())[name]
    log = Log(str(part), TopicConfig.from_mapping({}), had_clean_shutdown=False)
    assert log.bytes_truncated_on_load == 0
    batches = expected["batches"]
    assert log.log_end_offset == batches[-1]["lastOffset"] + 1
    for b in batches:
        found = log.read(b["baseOffset"], 1, min_one_message=True)
        raw = found.read()[: b["size"]]
        batch = decode_batch(raw)
        assert batch.header.crc == b["crc"]
        assert [r.offset for r in batch.records] == [r["offset"] for r in b["records"]]
        assert [r.timestamp for r in batch.records] == [r["timestamp"] for r in b["records"]]
    log.close()


def _small_log(tmp_path: Path) -> Log:
    cfg = TopicConfig.from_mapping({"index.interval.bytes": "100", "segment.bytes": "2000"})
    log = Log(str(tmp_path / "t-0"), cfg)
    for i in range(40):
        log.append(encode_batch([Record(0, 1000 + i, b"k%d" % i, b"v" * 50)]))
    return log


def test_index_files_checked_against_log(tmp_path: Path) -> None:
    log = _small_log(tmp_path)
    log.close()
    seg_dir = tmp_path / "t-0"
    index = sorted(seg_dir.glob("*.index"))[0]
    timeindex = sorted(seg_dir.glob("*.timeindex"))[0]
    rc, lines, err = _dump([index, timeindex])
    assert rc == 0 and err == []
    assert lines[1].startswith("offset: ") and " position: " in lines[1]
    ts_lines = [x for x in lines if x.startswith("timestamp: ")]
    assert ts_lines and ts_lines[-1].endswith(f"offset: {len(ts_lines) and int(ts_lines[-1].split()[-1])}")

    # Point the first index entry at a wrong offset: the mismatch is reported on stderr with Kafka's wording.
    data = bytearray(index.read_bytes())
    data[0:4] = (int.from_bytes(data[0:4], "big") + 1).to_bytes(4, "big")
    index.write_bytes(bytes(data))
    rc, lines, err = _dump([index], verify_index_only=True)
    assert rc == 1
    assert lines == [f"Dumping {index}"]
    assert err[0] == f"Mismatches in :{index}"
    assert err[1].startswith("  Index offset: ") and ", log offset: " in err[1]


def test_trailing_garbage_reported(tmp_path: Path) -> None:
    seg = _segment(tmp_path, "fvaleri_2025_output-topic-0_segment")
    with open(seg, "ab") as f:
        f.write(b"\x00\x00\x00\x00\x00\x00\x00\x07\x00\x00")
    rc, lines, _ = _dump([seg])
    assert rc == 1
    assert lines[-1] == f"Found 10 invalid bytes at the end of {seg.name}"


def test_corrupt_crc_prints_isvalid_false(tmp_path: Path) -> None:
    seg = _segment(tmp_path, "fvaleri_2025_output-topic-0_segment")
    data = bytearray(seg.read_bytes())
    data[70] ^= 0xFF  # inside the first batch's records
    seg.write_bytes(bytes(data))
    rc, lines, _ = _dump([seg], print_data=True)
    assert rc == 1
    assert lines[2].endswith("isvalid: false")
    assert lines[3].startswith("baseOffset: 1 ")  # the walk goes on to the next batch


def test_checkpoint_and_unknown_files(tmp_path: Path) -> None:
    cp = tmp_path / "recovery-point-offset-checkpoint"
    cp.write_bytes(b"0\n2\nt 0 40\nu-v 3 7\n")
    other = tmp_path / "notes.txt"
    other.write_text("x")
    rc, lines, err = _dump([cp, other])
    assert rc == 0
    assert lines == [f"Dumping {cp}", "version: 0 entries: 2", "topic: t partition: 0 offset: 40",
                     "topic: u-v partition: 3 offset: 7", f"Dumping {other}"]
    assert err == [f"Ignoring unknown file {other}"]


def test_cli_entry_point(tmp_path: Path) -> None:
    seg = _segment(tmp_path, "fvaleri_2024kraft_my-topic-0_segment")
    proc = subprocess.run([sys.executable, "-m", "shale.sidecar.cli", "dump-log", "--print-data-log", str(seg)],
                          capture_output=True, text=True, check=True)
    golden = (FIXTURES / "fvaleri_2024kraft_my-topic-0_segment.dump.txt").read_text().splitlines()
    assert proc.stdout.splitlines()[1:] == golden[1:]
