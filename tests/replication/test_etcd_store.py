"""What only EtcdStore does, against a real etcd (tests/support/etcd_util.py): the keys a person sees with etcdctl,
unreadable values, a frozen etcd, several endpoints. The contract both stores share is in
test_control_stores.py."""

from __future__ import annotations

import base64
import logging
import re
import socket
import urllib.request

import etcd3gw
import pytest
from store_util import RECORD, TP, assert_unavailable, node

from shale.sidecar.log.topic_partition import TopicPartition
from shale.sidecar.replication.control_store import session_ttl_seconds
from shale.sidecar.replication.store.etcd_store import EtcdStore, parse_endpoints
from support.etcd_util import EtcdServer, PortTaken
from support.node_util import free_port, wait_for


def raw_client(etcd: EtcdServer) -> etcd3gw.Etcd3Client:
    return etcd3gw.Etcd3Client("127.0.0.1", etcd.port, timeout=5)


def test_raw_keys_are_the_documented_ones(etcd):
    """docs/replication.md's keys and values, as `etcdctl get --prefix /shale/` shows them."""
    store = EtcdStore([etcd.endpoint], "prod")
    me = node(1, "a")
    store.open_session(me, 5000)
    assert store.create_partition(TP, RECORD)
    stored = {base64.b64decode(meta["key"]) if isinstance(meta["key"], str) else meta["key"]: value
              for value, meta in raw_client(etcd).get_prefix("/shale/")}
    assert stored == {b"/shale/prod/nodes/1": me.to_json().encode(),
                      b"/shale/prod/partitions/orders/3": RECORD.to_json().encode()}
    assert raw_client(etcd).get("/shale/prod/nodes/1", metadata=True)[0][1]["lease"] != "0"  # bound to a lease


def test_unreadable_values_are_skipped_loudly_and_kept(etcd, caplog):
    store = EtcdStore([etcd.endpoint], "c1")
    assert store.create_partition(TP, RECORD)
    raw_client(etcd).put("/shale/c1/partitions/broken/0", "{not json")
    raw_client(etcd).put("/shale/c1/partitions/binary/0", b"\xff\xfe")
    raw_client(etcd).put("/shale/c1/nodes/7", '{"node_id": 7}')
    raw_client(etcd).put("/shale/c1/nodes/8", node(9, "a").to_json())
    with caplog.at_level(logging.ERROR):
        view = store.view()
    assert set(view.partitions) == {TP} and view.nodes == {}
    for key in ("partitions/broken/0", "partitions/binary/0", "nodes/7", "nodes/8: holds the registration of node 9"):
        assert f"/shale/c1/{key}" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.ERROR):
        assert store.view().partitions.keys() == {TP}
    assert caplog.text == ""  # once per version of a damaged value, not on every view
    assert not store.create_partition(TopicPartition("broken", 0), RECORD)  # nothing overwritten
    assert raw_client(etcd).get("/shale/c1/partitions/broken/0") == [b"{not json"]


def etcd_watches(etcd: EtcdServer) -> tuple[int, int]:
    """(watch streams opened since etcd started, watch streams open now), from etcd's /metrics."""
    text = urllib.request.urlopen(f"{etcd.endpoint}/metrics", timeout=5).read().decode()
    started = re.search(r'^grpc_server_started_total\{grpc_method="Watch",grpc_service="etcdserverpb.Watch"[^}]*\} '
                        r'(\d+)', text, re.M)
    open_now = re.search(r"^etcd_debugging_mvcc_watch_stream_total (\d+)", text, re.M)
    assert started and open_now, "etcd's /metrics has no watch figures"
    return int(started[1]), int(open_now[1])


@pytest.mark.timeout(60)
def test_idle_waits_share_one_watch_and_a_change_ends_it(etcd):
    """The controller waits in 100 ms slices: an unchanged store costs etcd one watch, not one per slice."""
    store = EtcdStore([etcd.endpoint], "c1")
    revision = store.view().revision
    for _ in range(20):
        store.wait_for_change(revision, 0.01)
    assert etcd_watches(etcd) == (1, 1)

    assert store.create_partition(TP, RECORD)
    store.wait_for_change(revision, 60.0)  # the kept stream delivers the change (a 60 s wait trips the timeout)
    store.wait_for_change(revision, 60.0)  # and asked again about the same revision, a new watch says it too
    assert etcd_watches(etcd)[0] == 2
    newer = store.view().revision
    for _ in range(5):
        store.wait_for_change(newer, 0.01)
    wait_for(lambda: etcd_watches(etcd) == (3, 1), timeout=10, what="one watch open, from the newer revision")
    store.close()
    wait_for(lambda: etcd_watches(etcd)[1] == 0, timeout=10, what="the closed store's watch to end at etcd")


@pytest.mark.timeout(60)
def test_store_frozen_every_call_gives_up_within_its_own_timeout(etcd):
    store = EtcdStore([etcd.endpoint], "c1")
    store.open_session(node(1, "a"), 20_000)
    assert store.create_partition(TP, RECORD)
    version = store.view().partitions[TP].version
    etcd.sigstop()  # connections open, nothing answers: only the client's own timeouts bound each call
    try:
        assert_unavailable(store, version)
    finally:
        etcd.sigcont()
    # The session outlived the freeze: every call gave up within its bound, none waited for etcd.
    store.keepalive()
    assert store.view().is_live(1, "a")
    # The writes that timed out were still in etcd's socket buffers and may land now: "nothing is known
    # about the write" (StoreUnavailable), which is why a writer settles a lost answer by re-reading.


def test_a_dead_endpoint_is_skipped(etcd):
    store = EtcdStore([f"http://127.0.0.1:{free_port()}", etcd.endpoint], "c1")
    store.open_session(node(1, "a"), 5000)
    store.keepalive()
    assert store.create_partition(TP, RECORD)
    assert store.view().is_live(1, "a")


def test_etcd_grants_the_one_second_sessions_asked_for(etcd):
    """The fixture's short election timeout is what lets etcd grant 1 s leases (its minimum is 1.5
    election timeouts): with etcd's defaults a 1 s session would silently last 2 s."""
    store = EtcdStore([etcd.endpoint], "c1")
    store.open_session(node(1, "a"), 1000)
    (_, meta), = raw_client(etcd).get("/shale/c1/nodes/1", metadata=True)
    lease = raw_client(etcd).post(raw_client(etcd).get_url("/kv/lease/timetolive"), json={"ID": int(meta["lease"])})
    assert lease["grantedTTL"] == "1"


def test_session_ttl_is_whole_seconds_rounded_up():
    assert [session_ttl_seconds(ms) for ms in (1, 999, 1000, 1001, 2000, 2500)] == [1, 1, 1, 2, 2, 3]


def test_endpoints_from_the_store_url():
    assert parse_endpoints("etcd://127.0.0.1:2379,10.0.0.2:2379") == ["http://127.0.0.1:2379", "http://10.0.0.2:2379"]
    assert parse_endpoints("https://e:1") == ["https://e:1"]
    with pytest.raises(ValueError, match="no etcd endpoint"):
        parse_endpoints("etcd://")
    with pytest.raises(ValueError, match="expected http://host:port"):
        EtcdStore(["ftp://h:1"], "c")
    with pytest.raises(ValueError, match="cluster id"):
        EtcdStore(["http://h:1"], "a/b")


def test_etcd_server_moves_off_a_taken_port_on_first_start_only(tmp_path):
    """tests/support/etcd_util.py: free_port() races with other processes; a restart must keep its address."""
    with socket.socket() as blocker:
        blocker.bind(("127.0.0.1", 0))
        blocker.listen()
        taken = blocker.getsockname()[1]
        server = EtcdServer(tmp_path, port=taken).start()
        try:
            assert server.port != taken
            server.stop()
            server.port = taken
            with pytest.raises(PortTaken, match="address already in use"):
                server.start()
        finally:
            server.kill()
