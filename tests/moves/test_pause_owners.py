"""Cleaning pauses with named owners (docs/moves.md, "Pauses with named owners"): the count is the number of
owners, a resume releases only its owner's pause, lasting owners survive a restart exactly, and a pause whose
owner is gone is released at start, logged and counted."""

from __future__ import annotations

import json
import logging
import urllib.request
from pathlib import Path

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from shale.sidecar.log.cleaner_manager import CleanerManager, CleaningState, CleaningStateError
from shale.sidecar.log.pause_owners import PAUSES_FILE, PauseFileError, PauseOwner, decode_pauses, encode_pauses
from shale.sidecar.log.topic_partition import TopicPartition
from support.node_util import NodeThread, topic_manifest, write_manifests

TP = TopicPartition("orders", 0)
OTHER = TopicPartition("orders", 1)


def manager(directory: Path, logs=(TP, OTHER)) -> CleanerManager:
    return CleanerManager(str(directory), lambda: {tp: object() for tp in logs}, lambda: 1000)


def test_the_count_is_the_number_of_owners_and_one_owner_pauses_once(tmp_path):
    m = manager(tmp_path)
    assert m.pause(TP, "move:aa") == 1
    assert m.pause(TP, "move:aa") == 1  # KAFKA-16709: the same owner again is not a second pause
    assert m.pause(TP, "http:alice") == 2
    assert m.state(TP).pause_count == 2 and [str(o) for o in m.state(TP).owners] == ["move:aa", "http:alice"]
    assert m.resume(TP, "move:aa") == 1
    assert m.state(TP).state is CleaningState.PAUSED
    assert m.resume(TP, "http:alice") == 0
    assert m.state(TP).state is CleaningState.IDLE


def test_a_resume_can_only_release_its_own_owners_pause(tmp_path):
    m = manager(tmp_path)
    m.pause(TP, "move:aa")
    with pytest.raises(CleaningStateError, match="paused by move:aa"):
        m.resume(TP)  # a bare resume (Kafka's) cannot release a move's pause
    with pytest.raises(CleaningStateError, match="for http:bob: it is paused by move:aa"):
        m.resume(TP, "http:bob")
    assert m.state(TP).pause_count == 1  # refused resumes changed nothing
    m.pause(TP)
    m.pause(TP)
    assert m.state(TP).pause_count == 3
    assert m.resume(TP) == 2  # the newest anonymous one
    assert [str(o) for o in m.state(TP).owners] == ["move:aa", "anonymous:1"]


def test_lasting_owners_survive_a_restart_and_transient_ones_do_not(tmp_path):
    m = manager(tmp_path)
    m.pause(TP, "move:aa")
    m.pause(TP, "http:alice")
    m.pause(TP, "deletion")
    m.pause(OTHER)
    on_disk = decode_pauses((tmp_path / PAUSES_FILE).read_bytes(), PAUSES_FILE)
    assert on_disk == {TP: (PauseOwner("http", "alice"), PauseOwner("move", "aa"))}

    again = manager(tmp_path)
    assert again.load_pauses(lambda tp, owner: True) == []
    assert {str(o) for o in again.state(TP).owners} == {"move:aa", "http:alice"}
    assert again.state(OTHER).state is CleaningState.IDLE
    assert again.orphaned_pauses_released == 0


def test_a_pause_whose_owner_or_partition_is_gone_is_released_at_load(tmp_path, caplog):
    (tmp_path / PAUSES_FILE).write_bytes(encode_pauses({
        TP: (PauseOwner("move", "gone"), PauseOwner("http", "alice")),
        TopicPartition("deleted", 3): (PauseOwner("operator", "drain-1"),)}))
    m = manager(tmp_path)
    with caplog.at_level(logging.WARNING):
        released = m.load_pauses(lambda tp, owner: owner.kind != "move")
    assert sorted((str(tp), str(o)) for tp, o in released) == [("deleted-3", "operator:drain-1"),
                                                                ("orders-0", "move:gone")]
    assert m.orphaned_pauses_released == 2
    assert [str(o) for o in m.state(TP).owners] == ["http:alice"]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("topic orders, partition 0" in w and "move:gone" in w for w in warnings), warnings
    assert decode_pauses((tmp_path / PAUSES_FILE).read_bytes(), PAUSES_FILE) == {TP: (PauseOwner("http", "alice"),)}


def test_an_unreadable_pause_file_holds_nothing_and_says_so(tmp_path, caplog):
    (tmp_path / PAUSES_FILE).write_text('{"version": 1, "pauses": {"orders-0": ["nobody:x"]}}')
    with pytest.raises(PauseFileError, match="unknown pause owner kind 'nobody'"):
        decode_pauses((tmp_path / PAUSES_FILE).read_bytes(), str(tmp_path / PAUSES_FILE))
    m = manager(tmp_path)
    with caplog.at_level(logging.ERROR):
        assert m.load_pauses(lambda tp, owner: True) == []
    assert m.state(TP).state is CleaningState.IDLE
    assert any(PAUSES_FILE in r.getMessage() for r in caplog.records if r.levelno == logging.ERROR)


class PauseOwnersMachine(RuleBasedStateMachine):
    """CleanerManager against a model: per partition a set of owners; anonymous ones a stack. After any
    sequence, a fresh manager loading the file holds exactly the lasting owners (restart)."""

    OWNERS = st.sampled_from(["move:a", "move:b", "http:x", "operator:y", "deletion", "retention"])

    def __init__(self) -> None:
        super().__init__()
        import tempfile
        self.dir = Path(tempfile.mkdtemp(prefix="pause-owners-"))
        self.m = manager(self.dir)
        self.model: dict[TopicPartition, list[str]] = {TP: [], OTHER: []}

    @rule(tp=st.sampled_from([TP, OTHER]), owner=OWNERS)
    def pause(self, tp, owner):
        count = self.m.pause(tp, owner)
        if owner not in self.model[tp]:
            self.model[tp].append(owner)
        assert count == len(self.model[tp])

    @rule(tp=st.sampled_from([TP, OTHER]))
    def pause_anonymously(self, tp):
        self.m.pause(tp)
        self.model[tp].append(str(self.m.state(tp).owners[-1]))

    @rule(tp=st.sampled_from([TP, OTHER]), owner=OWNERS)
    def resume(self, tp, owner):
        if owner in self.model[tp]:
            assert self.m.resume(tp, owner) == len(self.model[tp]) - 1
            self.model[tp].remove(owner)
        else:
            with pytest.raises(CleaningStateError):
                self.m.resume(tp, owner)

    @precondition(lambda self: any(o.startswith("anonymous:") for owners in self.model.values() for o in owners))
    @rule(tp=st.sampled_from([TP, OTHER]))
    def resume_anonymously(self, tp):
        anonymous = [o for o in self.model[tp] if o.startswith("anonymous:")]
        if anonymous:
            self.m.resume(tp)
            self.model[tp].remove(anonymous[-1])
        else:
            with pytest.raises(CleaningStateError):
                self.m.resume(tp)

    @invariant()
    def counts_and_owners_match(self):
        for tp, owners in self.model.items():
            state = self.m.state(tp)
            assert [str(o) for o in state.owners] == (owners if owners else [])
            assert state.pause_count == len(owners)
            assert state.state is (CleaningState.PAUSED if owners else CleaningState.IDLE)

    @invariant()
    def a_restart_keeps_exactly_the_lasting_owners(self):
        again = manager(self.dir)
        again.load_pauses(lambda tp, owner: True)
        for tp, owners in self.model.items():
            lasting = {o for o in owners if o.split(":")[0] in ("move", "http", "operator")}
            assert {str(o) for o in again.state(tp).owners} == lasting


TestPauseOwnersMachine = PauseOwnersMachine.TestCase
TestPauseOwnersMachine.settings = settings(max_examples=60, stateful_step_count=25, deadline=None)


def _post(port: int, path: str) -> tuple[int, dict]:
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", method="POST")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_orphaned_move_pause_is_released_at_start_and_counted(tmp_path, caplog):
    """A node restarted with `cleaner-pauses.json` naming a move whose future replica is gone: the pause goes
    (WARNING naming topic, partition and owner; /metrics counts it), an HTTP owner's pause stays."""
    topics = write_manifests(tmp_path / "topics" / "t.yaml", topic_manifest("orders", 1, {"cleanup.policy": "compact"}))
    data = tmp_path / "data"
    with NodeThread(data, topics.parent) as node:  # creates orders-0
        status, body = _post(node.node.http_port, "/partitions/orders/0/pause?owner=alice")
        assert status == 200 and body["pause_owners"] == ["http:alice"]
    pauses = json.loads((data / PAUSES_FILE).read_text())
    assert pauses["pauses"] == {"orders-0": ["http:alice"]}
    pauses["pauses"]["orders-0"].append("move:0123456789abcdef0123456789abcdef")
    (data / PAUSES_FILE).write_text(json.dumps(pauses))

    with caplog.at_level(logging.WARNING), NodeThread(data, topics.parent) as node:
        cleaning = node.node.maintenance.manager.state(TP)
        assert [str(o) for o in cleaning.owners] == ["http:alice"] and cleaning.state is CleaningState.PAUSED
        with urllib.request.urlopen(f"http://127.0.0.1:{node.node.http_port}/metrics", timeout=10) as r:
            metrics = r.read().decode()
        assert "shale_cleaning_pauses_released_orphaned_total 1.0" in metrics
        assert 'shale_cleaning_pauses{kind="http"} 1.0' in metrics
        assert 'shale_cleaning_pauses{kind="move"} 0.0' in metrics
        status, body = _post(node.node.http_port, "/partitions/orders/0/resume")
        assert status == 409 and "http:alice" in body["error"]  # a bare resume cannot release alice's pause
        assert _post(node.node.http_port, "/partitions/orders/0/resume?owner=alice")[1]["pause_count"] == 0
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and "releasing" in r.getMessage()]
    assert len(warnings) == 1 and "topic orders, partition 0" in warnings[0]
    assert "move:0123456789abcdef0123456789abcdef" in warnings[0]
