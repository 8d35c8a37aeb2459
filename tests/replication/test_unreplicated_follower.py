"""A follower holding records written before replication (no leader epoch) never loses them to follow a leader
(follower.py, docs/replication.md "Failures"): it follows a leader holding the same records, and refuses —
keeping every byte, fetching no more, saying why in its fetch error — a leader that lacks them or holds others.

Real logs on disk, a real leader answering Fetch and ListOffsets over TCP (log_leader.py), real fetchers.
"""

from __future__ import annotations

import asyncio

from log_leader import LedPartition, LogLeader
from test_replica_fetcher import FAST, TP, batch, lead, log_bytes, new_log, node, run, until

from shale.sidecar.replication.follower import holds_unreplicated, unreplicated_end
from shale.sidecar.replication.replica_fetcher import ReplicaFetchers


def unreplicated_log(path, *sizes: int, value: bytes = b"old"):
    """A log as a single node wrote it: producers' batches, no leader epoch."""
    log = new_log(path)
    for size in sizes:
        log.append(batch(size, value))
    assert holds_unreplicated(log) and unreplicated_end(log) == log.log_end_offset
    return log


def follow_once(leader_log, follower_log, epoch: int, *, follows: bool):
    async def scenario():
        leader = await LogLeader({TP: LedPartition(leader_log, epoch=epoch)}).start()
        fetchers = ReplicaFetchers(3, {TP: follower_log}.get, FAST)
        try:
            fetchers.follow(TP, node(leader), epoch)
            if follows:
                await until(lambda: log_bytes(follower_log) == log_bytes(leader_log), "the logs to agree")
                return None
            await until(lambda: (fetchers.error(TP) or "").startswith("refused:"), "the follower to refuse")
            asked = len(leader.requests)
            await asyncio.sleep(6 * FAST.backoff_ms / 1000)  # six backoffs: a partition that retried would ask
            assert len(leader.requests) == asked, "a refused partition is fetched no more"
            return fetchers.error(TP)
        finally:
            await fetchers.close()
            await leader.stop()
    return run(scenario())


def test_a_copy_of_the_leaders_unreplicated_records_follows_it(tmp_path):
    """A follower restarted halfway through copying the holder's old records: the same bytes, so it goes on."""
    leader_log = unreplicated_log(tmp_path / "l", 4, 3, 2)
    lead(leader_log, 0, 2, 2)
    follower_log = unreplicated_log(tmp_path / "f", 4, 3)
    follow_once(leader_log, follower_log, 0, follows=True)
    assert follower_log.log_end_offset == 13 and follower_log.latest_epoch == 0


def test_a_holder_refuses_a_leader_whose_log_is_shorter_and_keeps_every_record(tmp_path):
    """The record was created by an empty replica while the holder was away: following would truncate."""
    leader_log = new_log(tmp_path / "l")
    lead(leader_log, 0, 2)
    follower_log = unreplicated_log(tmp_path / "f", 4, 2)
    before = log_bytes(follower_log)
    error = follow_once(leader_log, follower_log, 0, follows=False)
    assert log_bytes(follower_log) == before and follower_log.log_end_offset == 6
    assert "orders-0: keeps its records 0-5 written before replication" in error
    assert "will not follow node 1 in leader epoch 0" in error


def test_a_holder_refuses_a_longer_leader_whose_records_are_others(tmp_path):
    """The leader has offsets beyond ours, written in its own epoch: appending them after ours would splice
    two histories (Fetch cannot see it: our records have no epoch to compare)."""
    leader_log = new_log(tmp_path / "l")
    lead(leader_log, 0, 3, 3, 3)
    follower_log = unreplicated_log(tmp_path / "f", 4)
    before = log_bytes(follower_log)
    error = follow_once(leader_log, follower_log, 0, follows=False)
    assert log_bytes(follower_log) == before
    assert "is not ours 0-3" in error
