"""The example pipeline against a real `shale serve`: the stream job's counts in the compacted topic, and
the restore job rebuilding them from the latest view (over the wire and from the files, before and
after the cleaner compacted the topic), equal the counts computed from the events."""

from __future__ import annotations

import time

import pytest
from spark_util import consume_all, set_cleaning, start_serve, wait_for_clean

from shale.pipeline.follower_counts import (
    COUNTS_TOPIC, count_stream, expected_counts, generate_events, produce_events, restore_counts, topic_manifests,
)


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    work = tmp_path_factory.mktemp("followers")
    node = start_serve(work, topic_manifests(demo=True), "--override", "log.cleaner.backoff.ms=100")
    yield node
    node.terminate()


def run_to_end(query) -> None:
    try:
        assert query.awaitTermination(180), "the AvailableNow run did not finish in 180 s"
    finally:
        query.stop()
    assert query.exception() is None


def test_generated_events_are_consistent():
    events = generate_events(5000, 30, seed=3)
    following: set = set()
    for e in events:
        edge = (e.follower, e.followee)
        assert e.follower != e.followee
        assert (edge in following) == (e.op == "unfollow"), "an unfollow only undoes a follow"
        following.symmetric_difference_update({edge})
    counts = expected_counts(events)
    assert counts == {u: n for u in {b for _, b in following}
                      if (n := sum(1 for _, b in following if b == u))}


def test_stream_then_restore_equals_the_model(spark, node, tmp_path):
    events = generate_events(3000, 60, seed=1)
    checkpoint = str(tmp_path / "checkpoint")
    set_cleaning(node, COUNTS_TOPIC, 3, "pause")  # first the restore from an uncompacted topic
    produce_events(node.bootstrap, events[:2000])
    run_to_end(count_stream(spark, node.bootstrap, checkpoint, every=None, max_offsets_per_trigger=700))
    produce_events(node.bootstrap, events[2000:])
    run_to_end(count_stream(spark, node.bootstrap, checkpoint, every=None))
    model = expected_counts(events)
    assert any(n > 1 for n in model.values())

    written = consume_all(node.bootstrap, COUNTS_TOPIC)
    users = {r.key for r in written}
    assert len(written) > len(users), "several triggers wrote counts of the same users"

    def restored(source: dict) -> dict:
        return {r.user: r.followers for r in restore_counts(spark, source).collect()}

    assert restored({"bootstrap.servers": node.bootstrap}) == model
    assert restored({"path": node.data_dir}) == model

    resumed = int(time.time() * 1000)
    set_cleaning(node, COUNTS_TOPIC, 3, "resume")
    wait_for_clean(node, COUNTS_TOPIC, resumed)
    assert len(consume_all(node.bootstrap, COUNTS_TOPIC)) < len(written), "compaction dropped old counts"
    assert restored({"bootstrap.servers": node.bootstrap}) == model
    assert restored({"path": node.data_dir}) == model
