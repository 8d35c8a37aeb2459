"""A topic with Kafka's longest name (249 characters) lives and is deleted through a real node, for good."""

from __future__ import annotations

from confluent_kafka import Producer

from support.node_util import NodeThread, topic_manifest, wait_for, write_manifests

LONGEST = "n" + "o" * 248


def test_a_topic_with_the_longest_name_is_deleted_and_stays_deleted(tmp_path):
    data, topics = tmp_path / "data", tmp_path / "topics"
    write_manifests(topics / "keep.yaml", topic_manifest("keep"))
    manifest = write_manifests(topics / "long.yaml", topic_manifest(LONGEST, 2))
    with NodeThread(data, topics) as node:
        producer = Producer({"bootstrap.servers": node.bootstrap, "acks": "all"})
        delivered = []
        for partition in (0, 1):
            producer.produce(LONGEST, value=b"v", partition=partition,
                             on_delivery=lambda err, msg: delivered.append(err or msg.offset()))
        assert producer.flush(15) == 0 and delivered == [0, 0]
        del producer
        assert (data / f"{LONGEST}-1").is_dir()
        manifest.unlink()
        wait_for(lambda: not any(p.name.startswith(LONGEST[:200]) for p in data.iterdir()),
                 what="the partition directories to be renamed and removed")
        assert LONGEST not in node.node.registry.topics
    with NodeThread(data, topics) as node:  # the next start does not bring it back
        assert LONGEST not in node.node.registry.topics
        assert not any(p.name.startswith(LONGEST[:200]) for p in data.iterdir())
        assert (data / "keep-0").is_dir()
