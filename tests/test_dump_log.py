"""`shale dump-log` against real kafka-dump-log.sh output of broker-written segments, and against our own files."""

from __future__ import annotations

import io
import json
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shale.sidecar.dump_log import dump_files
from shale.sidecar.log.log import Log
from shale.sidecar.log.records import (
    ControlType,
    Record,
    compute_crc,
    decode_batch,
    encode_batch,
    encode_control_key,
)
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
    return rc, _lines(out.getvalue()), _lines(err.getvalue())


def _lines(text: str) -> list[str]:
    """Lines as printed: split at newlines only (a payload may hold form feeds and other line breaks)."""
    return text[:-1].split("\n") if text else []


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

    # Point the first index entry below its batch (a lookup of that offset would start past it): the mismatch is
    # reported on stderr with Kafka's wording.
    data = bytearray(index.read_bytes())
    data[0:4] = (int.from_bytes(data[0:4], "big") - 1).to_bytes(4, "big")
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


# -- arguments that cannot be dumped -----------------------------------------------------------------

def test_missing_files_directories_and_bad_names_are_one_line_each_and_exit_2(tmp_path: Path) -> None:
    not_a_segment = tmp_path / "notes.log"
    not_a_segment.write_bytes(b"x")
    bad_snapshot = tmp_path / "snapshot.checkpoint"
    bad_snapshot.write_bytes(b"")
    rc, lines, err = _dump([tmp_path / "00000000000000000000.log", tmp_path, not_a_segment, bad_snapshot])
    assert rc == 2 and lines == []
    assert err == [
        f"shale dump-log: {tmp_path / '00000000000000000000.log'}: no such file",
        f"shale dump-log: {tmp_path}: is a directory; give the files in it, e.g. {tmp_path / '*.log'}",
        f"shale dump-log: {not_a_segment}: not a segment file name: Kafka names a segment's files by its base "
        "offset (00000000000000000000.log)",
        f"shale dump-log: {bad_snapshot}: not a KRaft snapshot name: <end offset, 20 digits>-<epoch, 10 digits>"
        ".checkpoint or bootstrap.checkpoint",
    ]


def test_cli_gives_one_line_and_exit_2_for_a_missing_file(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "shale.sidecar.cli", "dump-log", str(tmp_path / "nonexistent.log")],
                          capture_output=True, text=True)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr == f"shale dump-log: {tmp_path / 'nonexistent.log'}: no such file\n"


def test_help_lists_the_differences_from_kafkas_tool() -> None:
    proc = subprocess.run([sys.executable, "-m", "shale.sidecar.cli", "dump-log", "--help"],
                          capture_output=True, text=True, check=True)
    assert "Differences from kafka-dump-log.sh" in proc.stdout
    assert "Kafka 2.x-3.6" in proc.stdout and "KAFKA-806" in proc.stdout and "exit status" in proc.stdout


# -- index files of an active segment ----------------------------------------------------------------

def test_empty_active_segment_indexes_are_empty_not_a_mismatch(tmp_path: Path) -> None:
    """An open Log's segment: `.index`/`.timeindex` preallocated to 10 MiB of zeros, the `.log` empty or small."""
    empty = Log(str(tmp_path / "e-0"), TopicConfig.from_mapping({}))
    small = Log(str(tmp_path / "s-0"), TopicConfig.from_mapping({}))
    small.append(encode_batch([Record(0, 1000, b"k", b"v")]))
    small.flush()
    for log in (empty, small):
        index = Path(log.dir) / "00000000000000000000.index"
        timeindex = Path(log.dir) / "00000000000000000000.timeindex"
        assert index.stat().st_size == 10 * 1024 * 1024
        rc, lines, err = _dump([index, timeindex], verify_index_only=True)
        assert (rc, err) == (0, [])
        rc, lines, err = _dump([index, timeindex])
        assert (rc, err) == (0, [])
        assert lines == [f"Dumping {index}", f"{index} is empty.", f"Dumping {timeindex}"]
    empty.close()
    small.close()


# -- files in layouts that older Kafka versions wrote ------------------------------------------------

def _write_segment(directory: Path, batches: list[bytes], index: list[tuple[int, int]],
                   timeindex: list[tuple[int, int]]) -> tuple[Path, Path, Path]:
    """A segment at base offset 0 laid out by hand: the batches, and index entries in Kafka's byte layout."""
    directory.mkdir(exist_ok=True)
    log = directory / "00000000000000000000.log"
    log.write_bytes(b"".join(batches))
    idx = directory / "00000000000000000000.index"
    idx.write_bytes(b"".join(struct.pack(">ii", offset, position) for offset, position in index))
    tidx = directory / "00000000000000000000.timeindex"
    tidx.write_bytes(b"".join(struct.pack(">qi", ts, offset) for ts, offset in timeindex))
    return log, idx, tidx


def _batch(base: int, timestamps: list[int]) -> bytes:
    return encode_batch([Record(base + i, ts, b"k%d" % (base + i), b"v") for i, ts in enumerate(timestamps)])


def test_time_index_entry_inside_a_batch_as_kafka_2x_wrote_it_is_reported_and_passes(tmp_path: Path) -> None:
    """Kafka 2.x-3.6 indexed the offset of the record with the largest timestamp, inside its batch."""
    a, b = _batch(0, [1000, 3000, 2000]), _batch(3, [3500, 3600])
    _, idx, tidx = _write_segment(tmp_path / "t-0", [a, b], [(4, len(a))], [(3000, 1), (3600, 4)])
    rc, lines, err = _dump([idx, tidx])
    assert rc == 0
    assert lines == [f"Dumping {idx}", f"offset: 4 position: {len(a)}",
                     f"Dumping {tidx}", "timestamp: 3000 offset: 1", "timestamp: 3600 offset: 4"]
    assert err == ["The following indexed offsets are not found in the log.", "Indexed offset: 1, found log offset: 2"]

    # The same block for an entry whose record does not carry the indexed timestamp: that one fails.
    _, _, tidx = _write_segment(tmp_path / "u-0", [a, b], [(4, len(a))], [(2500, 1), (3600, 4)])
    rc, _, err = _dump([tidx], verify_index_only=True)
    assert rc == 1
    assert err == ["The following indexed offsets are not found in the log.", "Indexed offset: 1, found log offset: 2"]


def test_time_index_checks_in_kafkas_words(tmp_path: Path) -> None:
    a, b, c = _batch(0, [1000, 2000]), _batch(2, [3000]), _batch(3, [2500])
    _, _, tidx = _write_segment(tmp_path / "t-0", [a, b, c], [], [(2000, 1), (2999, 2), (2999, 3), (4000, 9)])
    rc, _, err = _dump([tidx], verify_index_only=True)
    assert rc == 1
    assert err == [
        f"Found timestamp mismatch in :{tidx}", "  Index timestamp: 2999, log timestamp: 3000",
        "  Index timestamp: 2999, log timestamp: 2500",
        f"Found out of order timestamp in :{tidx}", "  Index timestamp: 2999, Previously indexed timestamp: 2999",
        "The following indexed offsets are not found in the log.", "Indexed offset: 9, found log offset: -1",
    ]


def test_offset_index_entry_of_a_multi_batch_append_is_reported_and_passes(tmp_path: Path) -> None:
    """Before KAFKA-806 an append of many batches (a follower's fetch, a cleaner chunk) got one entry: its
    last offset, at its first batch's position. Kafka's tool reports it; lookups through it are right."""
    batches = [_batch(i, [1000 + i]) for i in range(6)]
    pos = [sum(map(len, batches[:i])) for i in range(6)]
    _, idx, _ = _write_segment(tmp_path / "t-0", batches, [(3, pos[1]), (5, pos[4])], [])
    rc, lines, err = _dump([idx], verify_index_only=True)
    assert rc == 0 and lines == [f"Dumping {idx}"]
    assert err == [f"Mismatches in :{idx}", "  Index offset: 5, log offset: 4", "  Index offset: 3, log offset: 1"]

    # An entry whose offset no batch from its position ends at would send a lookup past its record: a failure.
    _, idx, _ = _write_segment(tmp_path / "u-0", batches, [(3, pos[4])], [])
    rc, _, err = _dump([idx], verify_index_only=True)
    assert rc == 1 and err == [f"Mismatches in :{idx}", "  Index offset: 3, log offset: 4"]


def test_sanity_check_says_why_in_kafkas_words(tmp_path: Path) -> None:
    _, idx, tidx = _write_segment(tmp_path / "t-0", [_batch(0, [5])], [(1, 0)], [(9, 0), (5, 0)])
    with open(idx, "ab") as f:
        f.write(b"\x00\x00\x00")
    rc, lines, _ = _dump([idx, tidx], index_sanity_check=True)
    assert rc == 1
    assert lines[1] == (f"{idx} failed sanity check: Index file {idx} is corrupt, found 11 bytes which is neither "
                        "positive nor a multiple of 8")
    assert lines[3] == (f"{tidx} failed sanity check: Corrupt time index found, time index file ({tidx}) has "
                        "non-zero size but the last timestamp is 5 which is less than the first timestamp 9")


def test_txn_index_dumped_as_kafka_does(tmp_path: Path) -> None:
    txn = tmp_path / "00000000000000000000.txnindex"
    txn.write_bytes(struct.pack(">hqqqq", 0, 7, 10, 12, 13) + struct.pack(">hqqqq", 0, 8, 20, 25, 21) + b"\x00" * 5)
    rc, lines, _ = _dump([txn])
    assert rc == 0
    assert lines[1:] == ["version: 0 producerId: 7 firstOffset: 10 lastOffset: 12 lastStableOffset: 13",
                         "version: 0 producerId: 8 firstOffset: 20 lastOffset: 25 lastStableOffset: 21"]


def _txn_log(tmp_path: Path) -> Log:
    """A log with one aborted transaction (producer 7: data at 0, ABORT at 2) and a committed one (8)."""
    log = Log(str(tmp_path / "t-0"), TopicConfig.from_mapping({}), had_clean_shutdown=True)
    for pid, control in ((7, None), (8, None), (7, ControlType.ABORT), (8, ControlType.COMMIT)):
        records = [Record(0, 1, b"k", b"v")] if control is None else \
            [Record(0, 1, encode_control_key(control), b"\x00\x00\x00\x00\x00\x00")]
        log.append(encode_batch(records, producer_id=pid, producer_epoch=0, base_sequence=0, is_transactional=True,
                                is_control=control is not None))
    log.close()
    return log


def test_txn_index_written_by_the_engine_verifies_against_its_log(tmp_path: Path) -> None:
    log = _txn_log(tmp_path)
    txn = Path(log.dir) / "00000000000000000000.txnindex"
    rc, lines, _ = _dump([txn])
    assert rc == 0 and lines[1:] == ["version: 0 producerId: 7 firstOffset: 0 lastOffset: 2 lastStableOffset: 1"]
    assert _dump([txn], verify_index_only=True)[:2] == (0, [f"Dumping {txn}"])
    assert _dump([txn], index_sanity_check=True)[:2] == (0, [f"Dumping {txn}", f"{txn} passed sanity check."])


def test_txn_index_entries_that_disagree_with_the_log_are_findings(tmp_path: Path) -> None:
    log = _txn_log(tmp_path)
    txn = Path(log.dir) / "00000000000000000000.txnindex"
    txn.write_bytes(struct.pack(">hqqqq", 0, 7, 0, 2, 1) + struct.pack(">hqqqq", 0, 8, 1, 3, 4)
                    + struct.pack(">hqqqq", 0, 9, 1, 1, 2))
    rc, lines, _ = _dump([txn], verify_index_only=True)
    assert rc == 1
    assert lines[1:] == [
        f"{txn}: entry 2 has last offset 1, not greater than the previous 3",
        f"{txn}: aborted transaction of producer 8 (first offset 1, last offset 3): the marker at offset 3 is COMMIT, "
        "not ABORT",
        f"{txn}: aborted transaction of producer 9 (first offset 1, last offset 1): the batch at offset 1 is a data "
        "batch of producer 8",
    ]
    rc, lines, _ = _dump([txn], index_sanity_check=True)
    assert rc == 1 and lines[1] == f"{txn} failed sanity check: entry 2 has last offset 1, not greater than the previous 3"


# -- KRaft: snapshots and control records --------------------------------------------------------------

def _control(base: int, ts: int, items: list[tuple[ControlType, bytes]]) -> bytes:
    return encode_batch([Record(base + i, ts, encode_control_key(t), v) for i, (t, v) in enumerate(items)],
                        is_control=True)


HEADER = bytes.fromhex("0000" "0000018bcfe56800" "00")
KRAFT_VERSION = bytes.fromhex("0000" "0001" "00")
VOTERS = bytes.fromhex("0000" "02" "00000001" "0102030405060708090a0b0c0d0e0f10" "02" "0b" + b"CONTROLLER".hex()
                       + "0a" + b"localhost".hex() + "2385" "00" "0000" "0001" "00" "00" "00")
FOOTER = bytes.fromhex("0000" "00")
# A FeatureLevelRecord as KRaft frames metadata records: frame version 1, api key 12, version 0, then the fields.
FEATURE_LEVEL = bytes.fromhex("01" "0c" "00" "11" + b"metadata.version".hex() + "0019" "00")


def test_kraft_snapshot_prints_its_control_records_as_kafka_does(tmp_path: Path) -> None:
    snap = tmp_path / "00000000000000000100-0000000001.checkpoint"
    ts = 1_700_000_000_000
    snap.write_bytes(
        _control(0, ts, [(ControlType.SNAPSHOT_HEADER, HEADER), (ControlType.KRAFT_VERSION, KRAFT_VERSION),
                         (ControlType.KRAFT_VOTERS, VOTERS)])
        + encode_batch([Record(3, ts, None, FEATURE_LEVEL)])
        + _control(4, ts, [(ControlType.SNAPSHOT_FOOTER, FOOTER)]))
    rc, lines, err = _dump([snap], print_data=True)
    assert (rc, err) == (0, [])
    assert lines[:2] == [f"Dumping {snap}", "Snapshot end offset: 100, epoch: 1"]
    assert lines[2].startswith("baseOffset: 0 lastOffset: 2 count: 3 ") and " isControl: true " in lines[2]
    meta = "CreateTime: 1700000000000 keySize: 4"
    assert lines[3:6] == [
        f"| offset: 0 {meta} valueSize: 11 sequence: -1 headerKeys: [] "
        'SnapshotHeader {"version":0,"lastContainedLogTimestamp":1700000000000}',
        f"| offset: 1 {meta} valueSize: 5 sequence: -1 headerKeys: [] KRaftVersion "
        '{"version":0,"kRaftVersion":1}',
        f"| offset: 2 {meta} valueSize: {len(VOTERS)} sequence: -1 headerKeys: [] KRaftVoters "
        '{"version":0,"voters":[{"voterId":1,"voterDirectoryId":"AQIDBAUGBwgJCgsMDQ4PEA","endpoints":'
        '[{"name":"CONTROLLER","host":"localhost","port":9093}],'
        '"kRaftVersionFeature":{"minSupportedVersion":0,"maxSupportedVersion":1}}]}',
    ]
    assert lines[6].startswith("baseOffset: 3 lastOffset: 3 ") and " isControl: false " in lines[6]
    # Without Kafka's --cluster-metadata-decoder a metadata record's value prints as text, as Kafka's default.
    assert lines[7] == (f"| offset: 3 CreateTime: {ts} keySize: -1 valueSize: {len(FEATURE_LEVEL)} sequence: -1 "
                        f"headerKeys: [] payload: {FEATURE_LEVEL.decode('utf-8', 'replace')}")
    assert lines[9] == f'| offset: 4 {meta} valueSize: 3 sequence: -1 headerKeys: [] SnapshotFooter {{"version":0}}'
    assert len(lines) == 10


def test_bootstrap_snapshot_and_leader_change_in_a_metadata_log(tmp_path: Path) -> None:
    boot = tmp_path / "bootstrap.checkpoint"
    boot.write_bytes(_control(0, 5, [(ControlType.SNAPSHOT_HEADER, HEADER)]))
    log = tmp_path / "00000000000000000000.log"
    leader_change = bytes.fromhex("0000" "00000001" "02" "0000000100" "02" "0000000100" "00")
    log.write_bytes(_control(0, 5, [(ControlType.LEADER_CHANGE, leader_change)])
                    + encode_batch([Record(1, 5, b"\x00\x00\x00\x63", b"")], is_control=True))
    rc, lines, err = _dump([boot, log], deep_iteration=True)
    assert lines[1] == "KRaft bootstrap snapshot"
    assert lines[7].endswith(' LeaderChange: {"version":0,"leaderId":1,"voters":[{"voterId":1}],'
                             '"grantingVoters":[{"voterId":1}]}')
    # An unknown control type prints its own id, as Kafka's `controlType: UNKNOWN(99)`.
    assert lines[9].endswith(" controlType: UNKNOWN(99)")


def test_a_malformed_control_record_is_named_not_a_traceback(tmp_path: Path) -> None:
    log = tmp_path / "00000000000000000000.log"
    log.write_bytes(_control(0, 5, [(ControlType.SNAPSHOT_HEADER, bytes.fromhex("0007" "0000018bcfe56800" "00"))]))
    rc, lines, _ = _dump([log], deep_iteration=True)
    assert rc == 1
    assert lines[-1] == (f"Found a corrupt batch at position 0 of {log}: control record at offset 0: "
                         "Can't write version 7 of SnapshotHeaderRecord")


# -- whatever the bytes, a clear line and never a traceback -----------------------------------------

DUMPABLE = ["00000000000000000000.log", "00000000000000000000.index", "00000000000000000000.timeindex",
            "00000000000000000000.snapshot", "00000000000000000000.txnindex",
            "00000000000000000007-0000000001.checkpoint",
            "recovery-point-offset-checkpoint", "partition.metadata"]


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(name=st.sampled_from(DUMPABLE), data=st.binary(max_size=200), log=st.binary(max_size=200),
       valid_crc=st.booleans(), deep=st.booleans())
def test_any_file_dumps_to_a_status_never_a_traceback(tmp_path: Path, name, data, log, valid_crc, deep) -> None:
    if name.endswith((".log", ".checkpoint")) and len(data) >= 61:
        data = bytearray(data)  # a plausible batch header, so that the walk goes deeper than the first check
        data[8:12] = (len(data) - 12).to_bytes(4, "big")
        data[16] = 2
        if valid_crc:
            struct.pack_into(">I", data, 17, compute_crc(data))
    (tmp_path / "00000000000000000000.log").write_bytes(log)
    path = tmp_path / name
    path.write_bytes(bytes(data))
    rc, _, _ = _dump([path], deep_iteration=deep)
    assert rc in (0, 1)
