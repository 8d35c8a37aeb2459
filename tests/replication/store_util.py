"""What the store tests share: a partition, a record, node registrations, and the check that every call of a
store gives up with StoreUnavailable while its engine is down."""

from __future__ import annotations

from typing import Callable

import pytest

from shale.sidecar.log.topic_partition import TopicPartition
from shale.sidecar.replication.control_store import ControlStore, StoreUnavailable
from shale.sidecar.replication.store_records import NodeRegistration, PartitionRecord
from shale.sidecar.replication.topic_record import TopicRecord

TP = TopicPartition("orders", 3)
RECORD = PartitionRecord(replicas=(1, 2, 3), isr=(1, 2, 3), leader=1, leader_incarnation="a")


def node(node_id: int, incarnation: str) -> NodeRegistration:
    return NodeRegistration(node_id, incarnation, "127.0.0.1", 9092 + node_id, rack=f"r{node_id % 2}")


def assert_unavailable(store: ControlStore, version: str) -> None:
    calls: dict[str, Callable[[], object]] = {
        "keepalive": store.keepalive, "view": store.view,
        "wait_for_change": lambda: store.wait_for_change("1", 30.0),
        "create_partition": lambda: store.create_partition(TopicPartition("x", 0), RECORD),
        "update_partition": lambda: store.update_partition(TP, RECORD.changed(isr=(1,)), version),
        "delete_partition": lambda: store.delete_partition(TP),
        "create_topic": lambda: store.create_topic(TopicRecord("t", "id", ((1,),))),
        "update_topic": lambda: store.update_topic(TopicRecord("t", "id", ((1,),)), version),
        "delete_topic": lambda: store.delete_topic("t", version),
        "open_session": lambda: store.open_session(node(5, "z"), 5000),
    }
    for name, call in calls.items():
        with pytest.raises(StoreUnavailable):
            call()
            pytest.fail(f"{name} answered with the store down")
