"""The replica fetcher (sidecar/replication/replica_fetcher.py, follower.py) on real Logs over real sockets:
a follower copies its leader byte for byte, cuts a divergent tail by the leader's DivergingEpoch, resets after
OFFSET_OUT_OF_RANGE, backs off on fencing errors and lost connections, and drops answers that a new state made
stale. The leader is `log_leader.LogLeader` (real Logs, the node's codec, Kafka's leader rules)."""

from __future__ import annotations

import asyncio
import os
import socket
import struct
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from log_leader import LedPartition, LogLeader

from shale.sidecar.log.errors import CorruptRecordError
from shale.sidecar.log.free_space import DirSpace, FreeFloor
from shale.sidecar.log.log import Log
from shale.sidecar.log.records import BatchHeader, Record, encode_batch
from shale.sidecar.log.topic_partition import TopicPartition
from shale.sidecar.protocol.client_codec import decode_response
from shale.sidecar.protocol.codec import encode_response
from shale.sidecar.replication.follower import apply_fetched, apply_reset, start_following, whole_batches
from shale.sidecar.replication.replica_fetcher import FetcherConfig, LeaderUnreachable, ReplicaFetchers, _Connection
from shale.sidecar.replication.store_records import NodeRegistration
from shale.sidecar.server_config import ServerConfig
from shale.sidecar.topic_config import TopicConfig

TP = TopicPartition("orders", 0)


def fetcher_config(**overrides) -> FetcherConfig:
    """Broker settings as `--override` gives them; short waits so that the tests do not sit in long polls."""
    settings = {"replica.fetch.wait.max.ms": 50, "replica.fetch.backoff.ms": 50, "replica.socket.timeout.ms": 2000,
                **overrides}
    return FetcherConfig.from_server_config(ServerConfig.from_mapping({k: str(v) for k, v in settings.items()}))


FAST = fetcher_config()


def new_log(path, tp: TopicPartition = TP, **config) -> Log:
    log = Log(str(path / f"{tp.topic}-{tp.partition}"), TopicConfig.from_mapping(config))
    log.replicated = True
    return log


def batch(records: int = 1, value: bytes = b"v") -> bytes:
    return encode_batch([Record(i, 1_700_000_000_000 + i, b"k%d" % i, value) for i in range(records)])


def lead(log: Log, epoch: int, *sizes: int, value: bytes = b"v") -> None:
    """Write as the leader of `epoch` does: the epoch begins at the log end, then each batch is stamped."""
    log.leader_epoch_cache.assign(epoch, log.log_end_offset)
    for size in sizes:
        log.append(batch(size, value), leader_epoch=epoch)


def log_bytes(log: Log) -> bytes:
    return b"".join(seg.read_bytes(0, seg.size) for seg in log.segments)


def node(leader: LogLeader, node_id: int = 1, incarnation: str = "a") -> NodeRegistration:
    return NodeRegistration(node_id, incarnation, "127.0.0.1", leader.port)


async def until(predicate, what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.01)


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 60))


# -- one answer, applied (follower.py) --------------------------------------------------------------------------


def test_whole_batches_stop_before_a_partial_tail(tmp_path):
    data = batch(3) + batch(2)
    found = whole_batches(data + data[:40], "t")
    assert [(pos, h.records_count) for pos, h in found] == [(0, 3), (len(batch(3)), 2)]
    assert whole_batches(data[:60], "t") == []  # not even a header


def test_a_log_without_epochs_keeps_its_records_and_checks_them_against_the_leader_first(tmp_path):
    """Kafka cuts a log without epochs to its high watermark; here its records were written before replication
    and are kept: the first fetch asks for the last of them, to compare with the leader's (issue 15)."""
    log = new_log(tmp_path)
    log.append(batch(4))  # a producer's batch, no leader epoch stamped
    log.append(batch(2))
    log.update_high_watermark(4)
    assert log.latest_epoch is None
    state = start_following(TP, log, NodeRegistration(1, "a", "h", 1), 3)
    assert (log.log_end_offset, state.fetch_offset, state.last_fetched_epoch, state.verify_below) == (6, 5, None, 6)


def test_a_log_with_epochs_keeps_its_tail_for_the_leader_to_judge(tmp_path):
    log = new_log(tmp_path)
    lead(log, 2, 3, 3)
    state = start_following(TP, log, NodeRegistration(1, "a", "h", 1), 3)
    assert (log.log_end_offset, state.fetch_offset, state.last_fetched_epoch) == (6, 6, 2)


class Answer:
    """One partition of a Fetch answer, with the attributes the decoded message has."""

    def __init__(self, records=b"", high_watermark=-1, log_start_offset=0, diverging_epoch=None):
        self.error_code = 0
        self.records, self.high_watermark, self.log_start_offset = records, high_watermark, log_start_offset
        self.diverging_epoch = diverging_epoch


def test_an_answer_larger_than_a_segment_is_appended_in_pieces(tmp_path):
    leader, follower = new_log(tmp_path / "l"), new_log(tmp_path / "f", **{"segment.bytes": 1024})
    lead(leader, 0, *[5] * 30, value=b"x" * 40)
    state = start_following(TP, follower, NodeRegistration(1, "a", "h", 1), 0)
    records = leader.read(0, 1 << 20).read()
    assert len(records) > 3 * 1024
    applied = apply_fetched(state, follower, Answer(records, high_watermark=120), max_append_bytes=1 << 20)
    assert applied.appended_batches == 30 and applied.appended_bytes == len(records)
    assert log_bytes(follower) == log_bytes(leader) and len(follower.segments) > 3
    assert (state.fetch_offset, follower.high_watermark, state.lag) == (150, 120, 0)


def test_a_refused_piece_keeps_the_pieces_before_it_and_the_state_at_the_log_end(tmp_path):
    leader, follower = new_log(tmp_path / "l"), new_log(tmp_path / "f", **{"segment.bytes": 1024})
    lead(leader, 0, *[5] * 12, value=b"x" * 40)
    records = bytearray(leader.read(0, 1 << 20).read())
    records[-1] ^= 0x40  # the last batch's CRC-32C no longer matches
    state = start_following(TP, follower, NodeRegistration(1, "a", "h", 1), 0)
    with pytest.raises(CorruptRecordError):
        apply_fetched(state, follower, Answer(bytes(records), high_watermark=60), max_append_bytes=1 << 20)
    assert 0 < follower.log_end_offset < 60 and follower.log_end_offset % 5 == 0
    assert (state.fetch_offset, state.last_fetched_epoch) == (follower.log_end_offset, 0)
    assert log_bytes(follower) == bytes(records[: len(log_bytes(follower))])


def test_a_batch_straddling_our_end_cuts_to_its_start(tmp_path):
    """Our end inside a leader's batch means our tail came from other batches of another leader."""
    leader, follower = new_log(tmp_path / "l"), new_log(tmp_path / "f")
    lead(leader, 0, 4)
    lead(follower, 0, 2)  # same epoch number, other batches: not a Kafka history, but the check must hold
    state = start_following(TP, follower, NodeRegistration(1, "a", "h", 1), 0)
    state.fetch_offset = follower.log_end_offset
    apply_fetched(state, follower, Answer(leader.read(0, 1 << 20).read(), high_watermark=4), 1 << 20)
    assert log_bytes(follower) == log_bytes(leader)


# -- fetching from a leader over a socket (replica_fetcher.py) -------------------------------------------------


def test_a_follower_copies_its_leader_byte_for_byte_in_several_fetches(tmp_path):
    async def scenario():
        leader_log, follower_log = new_log(tmp_path / "l"), new_log(tmp_path / "f")
        lead(leader_log, 0, 3, 1, 4)
        lead(leader_log, 2, 2, 5)
        leader = await LogLeader({TP: LedPartition(leader_log, epoch=2, high_watermark=12)}).start()
        fetchers = ReplicaFetchers(7, {TP: follower_log}.get, fetcher_config(**{"replica.fetch.max.bytes": 200}))
        fetchers.follow(TP, node(leader), 2)
        await until(lambda: follower_log.log_end_offset == 15, "the follower to catch up")
        assert log_bytes(follower_log) == log_bytes(leader_log)
        assert follower_log.leader_epoch_cache.entries == leader_log.leader_epoch_cache.entries
        assert follower_log.high_watermark == 12 and fetchers.lag(TP) == 0
        lead(leader_log, 2, 2)  # more while the follower long-polls
        leader.partitions[TP].high_watermark = 17
        await until(lambda: follower_log.high_watermark == 17, "the new high watermark")
        assert log_bytes(follower_log) == log_bytes(leader_log)
        fetches = [body for key, body in leader.requests if key == 1]
        assert fetches[0].replica_id == 7 and fetches[0].topics[0].partitions[0].current_leader_epoch == 2
        assert len(fetches) > 3  # max_bytes 200 made it take several rounds
        await fetchers.close()
        await leader.stop()
    run(scenario())


def test_records_read_in_place_are_appended_before_the_next_answer_reuses_their_buffer(tmp_path):
    """A Fetch answer's records are views into the connection's one frame buffer (no copy), several partitions
    to an answer with the loop served between them: each partition must still get its own leader's bytes,
    round after round, while the leader writes other values of the same sizes (a stale view would show)."""
    async def scenario():
        tps = [TopicPartition("orders", p) for p in range(3)]
        leaders = {tp: new_log(tmp_path / "l", tp) for tp in tps}
        followers = {tp: new_log(tmp_path / "f", tp) for tp in tps}
        for tp in tps:
            lead(leaders[tp], 0, 2, 3, value=b"%d" % tp.partition * 50)
        leader = await LogLeader({tp: LedPartition(log, epoch=0) for tp, log in leaders.items()}).start()
        fetchers = ReplicaFetchers(7, followers.get, fetcher_config(**{"replica.fetch.max.bytes": 300}))
        for tp in tps:
            fetchers.follow(tp, node(leader), 0)
        for round_ in range(4):
            end = leaders[tps[0]].log_end_offset
            await until(lambda: all(f.log_end_offset == end for f in followers.values()), "the followers to catch up")
            for tp in tps:
                lead(leaders[tp], 0, 1, 2, value=bytes([65 + round_ * 3 + tp.partition]) * 50)
        await until(lambda: all(f.log_end_offset == leaders[tp].log_end_offset for tp, f in followers.items()),
                    "the last round")
        for tp in tps:
            assert log_bytes(followers[tp]) == log_bytes(leaders[tp]), tp
        answers = [b for key, b in leader.requests if key == 1]
        assert len(answers) >= 5 and max(len(b.topics[0].partitions) for b in answers) == 3
        await fetchers.close()
        await leader.stop()
    run(scenario())


def test_a_fetch_answer_read_with_views_is_valid_until_the_next_request(tmp_path):
    """The lifetime the fetcher relies on: `request(..., views=True)` gives records that are the connection's
    frame buffer, which the next answer overwrites (it fits); without `views` they are a copy."""
    async def scenario():
        log = new_log(tmp_path / "l")
        lead(log, 0, 1, value=b"a" * 40)
        lead(log, 0, 1, value=b"b" * 40)
        leader = await LogLeader({TP: LedPartition(log, epoch=0)}).start()
        conn = _Connection(node(leader), "test", 10.0, asyncio.open_connection)

        async def fetch(offset: int, views: bool):
            body = {"replica_id": 3, "max_wait_ms": 0, "min_bytes": 1, "max_bytes": 1 << 20, "topics": [
                {"topic": TP.topic, "partitions": [{"partition": 0, "current_leader_epoch": 0, "fetch_offset": offset,
                                                    "last_fetched_epoch": -1, "partition_max_bytes": 1 << 20}]}]}
            answer = await conn.request(1, 12, body, views=views)
            return answer.responses[0].partitions[0].records

        first = await fetch(0, True)
        assert type(first) is memoryview and first == log.read(0, 1 << 20).read()
        copied = await fetch(1, False)
        assert type(copied) is bytes and copied == log.read(1, 1 << 20).read()
        assert first != log.read(0, 1 << 20).read()  # the second answer was read into the first one's buffer
        again = await fetch(1, True)
        assert again.obj is first.obj and again == copied
        conn.close()
        await leader.stop()
    run(scenario())


def test_a_divergent_tail_is_cut_once_then_the_leaders_log_fetched(tmp_path):
    """Kafka's testTruncateOnFetchDoesNotProcessPartitionData on real logs: the follower wrote offsets 3-5 in
    epoch 4 alone; the leader of epoch 5 has 3-4 of its own. The follower keeps 0-2 and ends as the leader."""
    async def scenario():
        leader_log, follower_log = new_log(tmp_path / "l"), new_log(tmp_path / "f")
        for log in (leader_log, follower_log):
            lead(log, 0, 1, 1)
            lead(log, 2, 1)
        lead(follower_log, 4, 1, 1, 1)
        lead(leader_log, 5, 1, 1)
        follower_log.update_high_watermark(1)
        leader = await LogLeader({TP: LedPartition(leader_log, epoch=5, high_watermark=4)}).start()
        fetchers = ReplicaFetchers(3, {TP: follower_log}.get, FAST)
        fetchers.follow(TP, node(leader), 5)
        await until(lambda: log_bytes(follower_log) == log_bytes(leader_log), "the logs to agree")
        assert follower_log.leader_epoch_cache.entries == leader_log.leader_epoch_cache.entries
        assert follower_log.high_watermark == 4
        fetches = [body.topics[0].partitions[0] for key, body in leader.requests if key == 1]
        assert (fetches[0].fetch_offset, fetches[0].last_fetched_epoch) == (6, 4)
        assert (fetches[1].fetch_offset, fetches[1].last_fetched_epoch) == (3, 2)  # cut once, to 3
        await fetchers.close()
        await leader.stop()
    run(scenario())


def test_every_epoch_different_converges_through_several_cuts(tmp_path):
    """Kafka's testTruncation: follower epochs 0, 2, 4 against leader epochs 1, 3, 5 at the same offsets."""
    async def scenario():
        leader_log, follower_log = new_log(tmp_path / "l"), new_log(tmp_path / "f")
        for epoch in (0, 2, 4):
            lead(follower_log, epoch, 1)
        for epoch in (1, 3, 5):
            lead(leader_log, epoch, 1)
        leader = await LogLeader({TP: LedPartition(leader_log, epoch=5)}).start()
        fetchers = ReplicaFetchers(3, {TP: follower_log}.get, FAST)
        fetchers.follow(TP, node(leader), 5)
        await until(lambda: log_bytes(follower_log) == log_bytes(leader_log), "the logs to agree")
        assert [e.epoch for e in follower_log.leader_epoch_cache.entries] == [1, 3, 5]
        await fetchers.close()
        await leader.stop()
    run(scenario())


def test_a_shorter_uncleanly_elected_leader_cuts_the_follower_to_its_end(tmp_path):
    """The old leader (epochs 0-1, offsets 0-5) follows a replica elected uncleanly in epoch 2 that had only
    offsets 0-1; the new leader wrote two batches since. Offsets 2-5 of the old leader are lost, as in Kafka."""
    async def scenario():
        leader_log, follower_log = new_log(tmp_path / "l"), new_log(tmp_path / "f")
        for log in (leader_log, follower_log):
            lead(log, 0, 2)
        lead(follower_log, 1, 2, 2)
        lead(leader_log, 2, 3, 3)
        leader = await LogLeader({TP: LedPartition(leader_log, epoch=2)}).start()
        fetchers = ReplicaFetchers(3, {TP: follower_log}.get, FAST)
        fetchers.follow(TP, node(leader), 2)
        await until(lambda: log_bytes(follower_log) == log_bytes(leader_log), "the logs to agree")
        assert follower_log.log_end_offset == 8
        await fetchers.close()
        await leader.stop()
    run(scenario())


def test_a_leader_whose_log_starts_past_ours_restarts_our_log_at_its_start(tmp_path):
    """Kafka's testFollowerFetchOutOfRangeLow: retention on the leader removed what the follower lacks."""
    async def scenario():
        leader_log, follower_log = new_log(tmp_path / "l"), new_log(tmp_path / "f")
        lead(follower_log, 0, 1)
        lead(leader_log, 0, 1, 1, 1)
        lead(leader_log, 4, 1, 1)
        leader_log.update_high_watermark(5)
        leader_log.increment_log_start_offset(3)
        leader = await LogLeader({TP: LedPartition(leader_log, epoch=4)}).start()
        fetchers = ReplicaFetchers(3, {TP: follower_log}.get, FAST)
        fetchers.follow(TP, node(leader), 4)
        await until(lambda: follower_log.log_end_offset == 5, "the follower to catch up")
        assert follower_log.log_start_offset == 3
        assert log_bytes(follower_log) == leader_log.read(3, 1 << 20).read()
        assert [key for key, _ in leader.requests].count(2) == 2  # ListOffsets latest, then earliest
        await fetchers.close()
        await leader.stop()
    run(scenario())


def test_a_corrupt_answer_appends_nothing_and_the_partition_fetches_again(tmp_path):
    """Kafka's testCorruptMessage: a record set whose CRC-32C does not match is refused whole by the log; the
    partition backs off and the next fetch brings the batches intact."""
    async def scenario():
        leader_log, follower_log = new_log(tmp_path / "l"), new_log(tmp_path / "f")
        lead(leader_log, 0, 2, 3)
        leader = await LogLeader({TP: LedPartition(leader_log, epoch=0)}, corrupt_next=True).start()
        fetchers = ReplicaFetchers(3, {TP: follower_log}.get, FAST)
        fetchers.follow(TP, node(leader), 0)
        await until(lambda: (fetchers.states()[TP].error or "").startswith("CorruptRecordError"), "the refusal")
        assert follower_log.log_end_offset == 0
        await until(lambda: follower_log.log_end_offset == 5, "the intact fetch")
        assert log_bytes(follower_log) == log_bytes(leader_log)
        await fetchers.close()
        await leader.stop()
    run(scenario())


def test_a_follower_whose_log_dir_is_under_its_free_space_floor_does_not_fetch_until_space_is_back(tmp_path):
    """The reserve is the cleaner's: a follower's appends are the leader's Produce by another road, so under the
    floor it leaves the partition out of its fetches (and falls out of the ISR) instead of filling the disk."""
    async def scenario():
        leader_log, follower_log = new_log(tmp_path / "l"), new_log(tmp_path / "f")
        lead(leader_log, 0, 2, 3)
        disk = {"free": 1 << 20}

        def statvfs(path: str) -> os.statvfs_result:
            return os.statvfs_result((4096, 4096, 16384, disk["free"] // 4096, disk["free"] // 4096, 0, 0, 0, 0, 255))
        follower_log.space = DirSpace(str(tmp_path / "f"), FreeFloor(8 << 20), statvfs=statvfs)
        leader = await LogLeader({TP: LedPartition(leader_log, epoch=0)}).start()
        fetchers = ReplicaFetchers(3, {TP: follower_log}.get, FAST)
        fetchers.follow(TP, node(leader), 0)
        await until(lambda: "under its free-space floor" in (fetchers.states()[TP].error or ""), "the hold")
        await asyncio.sleep(0.3)  # several backoffs
        assert follower_log.log_end_offset == 0
        assert not [t for key, body in leader.requests if key == 1 for t in body.topics if t.partitions]
        disk["free"] = 32 << 20
        await until(lambda: follower_log.log_end_offset == 5, "the fetch once space is back")
        assert log_bytes(follower_log) == log_bytes(leader_log)
        await fetchers.close()
        await leader.stop()
    run(scenario())


def test_a_fenced_follower_waits_for_a_new_epoch_and_then_fetches_at_once(tmp_path):
    async def scenario():
        leader_log, follower_log = new_log(tmp_path / "l"), new_log(tmp_path / "f")
        lead(leader_log, 3, 2)
        leader = await LogLeader({TP: LedPartition(leader_log, epoch=3)}).start()
        fetchers = ReplicaFetchers(3, {TP: follower_log}.get,
                                   fetcher_config(**{"replica.fetch.backoff.ms": 60_000}))
        fetchers.follow(TP, node(leader), 2)
        await until(lambda: fetchers.states()[TP].error == "Fetch: FENCED_LEADER_EPOCH", "the fencing error")
        assert follower_log.log_end_offset == 0
        fetchers.follow(TP, node(leader), 3)  # the store's new record: no backoff left over
        await until(lambda: follower_log.log_end_offset == 2, "the fetch in the new epoch")
        assert fetchers.states()[TP].error is None
        await fetchers.close()
        await leader.stop()
    run(scenario())


def test_a_leader_that_stops_answering_is_retried_after_the_backoff_until_it_is_back(tmp_path):
    async def scenario():
        leader_log, follower_log = new_log(tmp_path / "l"), new_log(tmp_path / "f")
        lead(leader_log, 0, 2)
        leader = await LogLeader({TP: LedPartition(leader_log, epoch=0)}).start()
        fetchers = ReplicaFetchers(3, {TP: follower_log}.get, FAST)
        fetchers.follow(TP, node(leader), 0)
        await until(lambda: follower_log.log_end_offset == 2, "the first fetch")
        await leader.stop()
        await until(lambda: (fetchers.states()[TP].error or "").startswith("node 1 at 127.0.0.1"),
                    "the lost connection to be noticed")
        lead(leader_log, 0, 3)
        leader = await LogLeader(leader.partitions, port=leader.port).start()  # the same node back
        await until(lambda: follower_log.log_end_offset == 5, "fetching to resume")
        assert log_bytes(follower_log) == log_bytes(leader_log)
        await fetchers.close()
        await leader.stop()
    run(scenario())


def test_a_leader_gone_from_its_port_is_lost_and_reported_refused_until_it_is_back(tmp_path):
    async def scenario():
        leader_log, follower_log = new_log(tmp_path / "l"), new_log(tmp_path / "f")
        lead(leader_log, 0, 2)
        leader = await LogLeader({TP: LedPartition(leader_log, epoch=0)}).start()
        refused: list[NodeRegistration] = []
        fetchers = ReplicaFetchers(3, {TP: follower_log}.get, FAST, on_refused=refused.append)
        fetchers.follow(TP, node(leader), 0)
        await until(lambda: follower_log.log_end_offset == 2, "the first fetch")
        assert not fetchers.lost(node(leader)) and refused == []
        await leader.stop()  # nobody listens on its port any more, as after a SIGKILL
        await until(lambda: fetchers.lost(node(leader)), "the closed connection to count as lost")
        await until(lambda: refused, "the refused reconnection to be reported")
        assert set(refused) == {node(leader)}  # the registration followed, for the controller to judge
        leader = await LogLeader(leader.partitions, port=leader.port).start()
        await until(lambda: not fetchers.lost(node(leader)), "the leader to count as reachable again")
        await fetchers.close()
        await leader.stop()
    run(scenario())


def test_a_leader_cut_off_from_this_node_only_is_named_again_once_its_session_would_have_expired(tmp_path):
    """A network cut between this follower and a live leader (every connection reset at its first request,
    tests/support/fault_proxy.py's RESET): lost for at most `broker.session.timeout.ms` — a dead leader's session has
    expired by then, so a leader the store still names live is alive — and not again in the same episode, while
    the fetcher goes on failing. Before, this node's Metadata named no leader for as long as the cut lasted."""
    async def scenario():
        async def reset_at_first_request(reader, writer):
            await reader.read(1)
            writer.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            writer.transport.abort()

        cut = await asyncio.start_server(reset_at_first_request, "127.0.0.1", 0)
        leader = NodeRegistration(1, "a", "127.0.0.1", cut.sockets[0].getsockname()[1])
        fetchers = ReplicaFetchers(3, {TP: new_log(tmp_path / "f")}.get,
                                   fetcher_config(**{"broker.session.timeout.ms": 500,
                                                     "broker.heartbeat.interval.ms": 100}))
        fetchers.follow(TP, leader, 0)
        await until(lambda: fetchers.lost(leader), "the reset connection to count as lost")
        lost_at = time.monotonic()
        await until(lambda: not fetchers.lost(leader), "the loss to stop counting")
        assert time.monotonic() - lost_at >= 0.4
        failures = fetchers.states()[TP].error
        assert failures and failures.startswith("node 1 at 127.0.0.1")
        for _ in range(3):  # reconnections go on failing (FAST backs off 50 ms): the leader stays named
            await asyncio.sleep(0.1)
            assert not fetchers.lost(leader)
        await fetchers.close()
        cut.close()
    run(scenario())


def test_a_connection_the_leader_closed_is_seen_closed_before_the_fetch_task_reads_it():
    async def scenario():
        listener = socket.create_server(("127.0.0.1", 0))  # a plain socket: closing it needs no event loop
        port = listener.getsockname()[1]
        conn = _Connection(NodeRegistration(1, "a", "127.0.0.1", port), "test", 10.0, asyncio.open_connection)
        pending = asyncio.ensure_future(conn.request(1, 12, {"replica_id": 3, "max_wait_ms": 500, "min_bytes": 1,
                                                           "max_bytes": 1000, "topics": []}))
        await asyncio.sleep(0.05)  # connected (the kernel's backlog) and the request sent; no answer will come
        leader_side, _ = listener.accept()
        assert not conn.peer_closed()
        leader_side.close()  # the leader process dies: its kernel closes the connection
        listener.close()
        time.sleep(0.05)  # blocking: the event loop, and so the fetch task, does not run meanwhile
        assert not pending.done() and conn.peer_closed()
        with pytest.raises(LeaderUnreachable):
            await pending
    run(scenario())


def test_moving_to_a_new_leader_drops_the_old_connection_and_answers_for_the_old_state(tmp_path):
    async def scenario():
        old_log, new_log_, follower_log = new_log(tmp_path / "a"), new_log(tmp_path / "b"), new_log(tmp_path / "f")
        lead(old_log, 0, 2)
        lead(new_log_, 0, 2)  # the same two records (copied), then the new leader's epoch
        new_log_.truncate_to(0)
        new_log_.append(old_log.read(0, 1 << 20).read(), assign_offsets=False)
        lead(new_log_, 1, 3)
        old = await LogLeader({TP: LedPartition(old_log, epoch=0)}).start()
        new = await LogLeader({TP: LedPartition(new_log_, epoch=1)}).start()
        fetchers = ReplicaFetchers(3, {TP: follower_log}.get, FAST)
        fetchers.follow(TP, node(old, node_id=1), 0)
        await until(lambda: follower_log.log_end_offset == 2, "fetching from the old leader")
        lead(old_log, 0, 4)  # the deposed leader's unreplicated tail must never reach the follower
        fetchers.follow(TP, node(new, node_id=2), 1)
        await until(lambda: follower_log.log_end_offset == 5, "fetching from the new leader")
        await until(lambda: not old._clients, "the old leader's connection to close")
        assert log_bytes(follower_log) == log_bytes(new_log_)
        fetchers.unfollow(TP)
        assert fetchers.states() == {} and fetchers.lag(TP) is None
        await fetchers.close()
        await old.stop()
        await new.stop()
    run(scenario())


def test_a_leader_node_restarted_elsewhere_is_fetched_over_a_new_connection(tmp_path):
    """The same node id with a new incarnation and port (a restarted process): the old link and its connection
    end, and fetching in the new epoch starts without waiting for the old connection's long poll or backoff."""
    async def scenario():
        leader_log, follower_log = new_log(tmp_path / "l"), new_log(tmp_path / "f")
        lead(leader_log, 0, 2)
        first = await LogLeader({TP: LedPartition(leader_log, epoch=0)}).start()
        fetchers = ReplicaFetchers(3, {TP: follower_log}.get, fetcher_config(**{"replica.fetch.backoff.ms": 60_000}))
        fetchers.follow(TP, node(first, incarnation="a"), 0)
        await until(lambda: follower_log.log_end_offset == 2, "the first fetch")
        lead(leader_log, 1, 3)
        second = await LogLeader({TP: LedPartition(leader_log, epoch=1)}).start()
        fetchers.follow(TP, node(second, incarnation="b"), 1)
        await until(lambda: follower_log.log_end_offset == 5, "fetching from the restarted node")
        await until(lambda: not first._clients, "the old process's connection to close")
        assert fetchers.states()[TP].error is None
        await fetchers.close()
        await first.stop()
        await second.stop()
    run(scenario())


def test_follow_without_a_local_log_is_refused(tmp_path):
    async def scenario():
        fetchers = ReplicaFetchers(3, {}.get, FAST)
        with pytest.raises(KeyError, match="orders-0"):
            fetchers.follow(TP, NodeRegistration(1, "a", "127.0.0.1", 1), 0)
        await fetchers.close()
    run(scenario())


def test_the_fetcher_settings_are_kafkas_by_default_but_the_backoff_and_follow_the_overrides():
    async def scenario():
        fetchers = ReplicaFetchers(3, {}.get)
        assert fetchers.config == FetcherConfig(wait_max_ms=500, min_bytes=1, max_bytes=1048576,
                                                response_max_bytes=10485760, backoff_ms=100, socket_timeout_ms=30000,
                                                session_timeout_ms=2000)
        await fetchers.close()
    run(scenario())
    assert fetcher_config(**{"replica.fetch.response.max.bytes": 4096}).response_max_bytes == 4096


# -- any history, on real logs: followers end with the leader's bytes and never cut what they share ------------


def answer_of(leader: LogLeader, state, max_bytes: int):
    """The leader's answer to `state`'s fetch, through the node's codec both ways (no socket)."""
    asked = SimpleNamespace(current_leader_epoch=state.leader_epoch, fetch_offset=state.fetch_offset,
                            last_fetched_epoch=-1 if state.last_fetched_epoch is None else state.last_fetched_epoch,
                            partition_max_bytes=max_bytes)
    body = {"responses": [{"topic": TP.topic, "partitions": [leader._partition(TP, asked)]}]}
    return decode_response(1, 12, encode_response(1, 12, 1, body)).body.responses[0].partitions[0]


def shared_offsets(a: Log, b: Log) -> int:
    """Offsets below which two logs hold the same batches."""
    end = 0
    for (x, _), (y, _) in zip(batches_of(a), batches_of(b)):
        if x != y:
            break
        end = BatchHeader.parse(x).last_offset + 1
    return end


def written_epochs(log: Log) -> list:
    """The epochs that wrote records (one assigned at the log end may have none yet, on either side)."""
    return [e for e in log.leader_epoch_cache.entries if e.start_offset < log.log_end_offset]


def batches_of(log: Log) -> list[tuple[bytes, int]]:
    data = log_bytes(log)
    return [(data[pos : pos + h.size], pos) for pos, h in whole_batches(data, "test")]


HISTORY = st.lists(st.one_of(
    st.tuples(st.just("elect"), st.integers(0, 2)),
    st.tuples(st.just("append"), st.integers(1, 3)),
    st.tuples(st.just("fetch"), st.integers(0, 2), st.integers(1, 3), st.sampled_from([100, 300, 4096])),
), max_size=25)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(HISTORY)
def test_followers_converge_on_real_logs_whatever_the_history(history):
    with tempfile.TemporaryDirectory() as tmp:
        logs = [new_log(Path(tmp) / str(i)) for i in range(3)]
        leader_id, epoch = 0, 0
        logs[0].leader_epoch_cache.assign(0, 0)
        states: dict[int, object] = {}

        def follower_state(i: int):
            if i not in states or states[i].leader_epoch != epoch:
                states[i] = start_following(TP, logs[i], NodeRegistration(leader_id, "x", "h", 1), epoch)
            return states[i]

        def fetch_once(i: int, max_bytes: int) -> None:
            state, leader = follower_state(i), LogLeader({TP: LedPartition(logs[leader_id], epoch)})
            data = answer_of(leader, state, max_bytes)
            if data.error_code == 1:  # OFFSET_OUT_OF_RANGE
                apply_reset(state, logs[i], logs[leader_id].log_end_offset, logs[leader_id].log_start_offset)
            else:
                assert data.error_code == 0
                apply_fetched(state, logs[i], data, max_bytes)

        for action in history:
            if action[0] == "elect":
                leader_id, epoch = action[1], epoch + 1
                logs[leader_id].leader_epoch_cache.assign(epoch, logs[leader_id].log_end_offset)
                states.pop(leader_id, None)
            elif action[0] == "append":
                logs[leader_id].append(batch(action[1], b"e%d" % epoch), leader_epoch=epoch)
            elif action[1] != leader_id:
                for _ in range(action[2]):
                    shared = shared_offsets(logs[action[1]], logs[leader_id])
                    fetch_once(action[1], action[3])
                    assert logs[action[1]].log_end_offset >= shared
        for i in range(3):
            if i == leader_id:
                continue
            for _ in range(100):
                before = (logs[i].log_end_offset, logs[i].latest_epoch)
                fetch_once(i, 4096)
                if (logs[i].log_end_offset, logs[i].latest_epoch) == before and \
                        logs[i].log_end_offset == logs[leader_id].log_end_offset:
                    break
            assert log_bytes(logs[i]) == log_bytes(logs[leader_id])
            assert logs[i].high_watermark == logs[i].log_end_offset
            assert written_epochs(logs[i]) == written_epochs(logs[leader_id])
        for log in logs:
            log.close()


def test_a_connection_closed_on_this_side_counts_as_closed_not_as_an_error():
    """A Metadata request asks `lost()` in the loop iteration where asyncio has closed the socket but the
    fetch task has not yet run to drop the connection: the closed socket (fileno -1) is a lost leader, not a
    ValueError that failed the client's Metadata and closed its connection (seen in bench/replication.py)."""
    async def scenario():
        listener = socket.create_server(("127.0.0.1", 0))
        port = listener.getsockname()[1]
        conn = _Connection(NodeRegistration(1, "a", "127.0.0.1", port), "test", 10.0, asyncio.open_connection)
        pending = asyncio.ensure_future(conn.request(1, 12, {"replica_id": 3, "max_wait_ms": 500, "min_bytes": 1,
                                                           "max_bytes": 1000, "topics": []}))
        await asyncio.sleep(0.05)
        transport = conn._frames.transport
        transport.close()
        await asyncio.sleep(0)  # the transport's socket is closed; the fetch task has not run since
        assert transport.get_extra_info("socket").fileno() == -1 and not pending.done()
        assert conn.peer_closed()
        with pytest.raises(LeaderUnreachable):
            await pending
        listener.close()
    run(scenario())
