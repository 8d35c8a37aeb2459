"""The coordinator's pure state machine (Kafka's TransactionMetadata / TransactionCoordinator rules).

Each test is one row of docs/transactions.md's coordinator table or one of its failure cases, at the level of the
state machine; a hypothesis model then drives random request sequences (several producer instances, timeouts,
completions, epoch exhaustion) and checks Kafka's invariants and the codec on every state reached.
"""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shale.sidecar.protocol.error_codes import (
    CONCURRENT_TRANSACTIONS,
    INVALID_PRODUCER_ID_MAPPING,
    INVALID_TRANSACTION_TIMEOUT,
    INVALID_TXN_STATE,
    NONE,
    PRODUCER_FENCED,
)
from shale.sidecar.server.coordinator.transaction.transaction_records import decode_value, encode_value
from shale.sidecar.server.coordinator.transaction.transaction_state import (
    INT16_MAX,
    VALID_PREVIOUS,
    IllegalTransition,
    Refused,
    TxnMetadata,
    TxnState,
    add_partitions,
    complete,
    end_transaction,
    expired,
    fence,
    init_producer_id,
    marker_outcome,
    new_metadata,
    remove,
    timed_out,
)

MAX_TIMEOUT = 900_000
P0, P1, OFFSETS = ("out", 0), ("out", 1), ("__consumer_offsets", 7)


def fresh_ids():
    counter = itertools.count(5000)
    return lambda: next(counter)


def initialized(now=0, timeout=60_000) -> TxnMetadata:
    meta = init_producer_id(new_metadata("app-1", 1000, timeout, now), timeout, MAX_TIMEOUT, now, fresh_ids())
    assert isinstance(meta, TxnMetadata)
    return meta


def ongoing(now=10) -> TxnMetadata:
    meta = add_partitions(initialized(), 1000, 0, frozenset({P0}), now)
    assert isinstance(meta, TxnMetadata)
    return meta


def test_first_init_producer_id_is_epoch_zero_and_each_init_bumps_it():
    meta = initialized()
    assert (meta.state, meta.producer_id, meta.producer_epoch) == (TxnState.EMPTY, 1000, 0)
    again = init_producer_id(meta, 60_000, MAX_TIMEOUT, 5, fresh_ids())
    assert (again.state, again.producer_epoch, again.last_update_timestamp_ms) == (TxnState.EMPTY, 1, 5)


def test_transaction_timeout_above_the_maximum_is_invalid_transaction_timeout():
    meta = new_metadata("app-1", 1000, 60_000, 0)
    assert init_producer_id(meta, MAX_TIMEOUT + 1, MAX_TIMEOUT, 0, fresh_ids()) == Refused(INVALID_TRANSACTION_TIMEOUT)
    assert init_producer_id(meta, 0, MAX_TIMEOUT, 0, fresh_ids()) == Refused(INVALID_TRANSACTION_TIMEOUT)


def test_add_partitions_starts_the_transaction_and_repeats_write_nothing():
    meta = ongoing(now=10)
    assert (meta.state, meta.partitions, meta.start_timestamp_ms) == (TxnState.ONGOING, frozenset({P0}), 10)
    assert add_partitions(meta, 1000, 0, frozenset({P0}), 20) == Refused(NONE)
    more = add_partitions(meta, 1000, 0, frozenset({P1, OFFSETS}), 30)
    assert more.partitions == {P0, P1, OFFSETS} and more.start_timestamp_ms == 10  # the start stays the first add's


def test_commit_prepares_then_completes_with_the_partitions_cleared():
    prepared = end_transaction(ongoing(), 1000, 0, True, 40)
    assert prepared.state == TxnState.PREPARE_COMMIT and prepared.partitions == {P0} and marker_outcome(prepared)
    assert end_transaction(prepared, 1000, 0, True, 41) == Refused(CONCURRENT_TRANSACTIONS)  # markers in flight
    assert end_transaction(prepared, 1000, 0, False, 41) == Refused(INVALID_TXN_STATE)
    assert add_partitions(prepared, 1000, 0, frozenset({P1}), 41) == Refused(CONCURRENT_TRANSACTIONS)
    assert init_producer_id(prepared, 60_000, MAX_TIMEOUT, 41, fresh_ids()) == Refused(CONCURRENT_TRANSACTIONS)
    done = complete(prepared, 50)
    assert (done.state, done.partitions, done.producer_epoch) == (TxnState.COMPLETE_COMMIT, frozenset(), 0)
    assert end_transaction(done, 1000, 0, True, 60) == Refused(NONE)  # a retried EndTxn
    assert end_transaction(done, 1000, 0, False, 60) == Refused(INVALID_TXN_STATE)
    # The next transaction of the same producer starts from CompleteCommit without a new InitProducerId.
    assert add_partitions(done, 1000, 0, frozenset({P1}), 70).start_timestamp_ms == 70


def test_abort_prepares_abort_markers():
    prepared = end_transaction(ongoing(), 1000, 0, False, 40)
    assert prepared.state == TxnState.PREPARE_ABORT and not marker_outcome(prepared)
    assert complete(prepared, 50).state == TxnState.COMPLETE_ABORT


def test_end_txn_without_a_transaction_is_invalid_txn_state():
    assert end_transaction(initialized(), 1000, 0, True, 5) == Refused(INVALID_TXN_STATE)


def test_wrong_producer_id_is_invalid_producer_id_mapping():
    assert add_partitions(ongoing(), 999, 0, frozenset({P1}), 5) == Refused(INVALID_PRODUCER_ID_MAPPING)
    assert end_transaction(ongoing(), 999, 0, True, 5) == Refused(INVALID_PRODUCER_ID_MAPPING)


def test_restarted_client_aborts_its_predecessors_transaction():
    # A new instance's InitProducerId while its predecessor's transaction is Ongoing: PrepareAbort at epoch + 1
    # (the predecessor is fenced); the new instance is answered CONCURRENT_TRANSACTIONS until the abort
    # completes, then gets epoch + 2.
    fenced = init_producer_id(ongoing(), 60_000, MAX_TIMEOUT, 20, fresh_ids())
    assert (fenced.state, fenced.producer_epoch, fenced.partitions) == (TxnState.PREPARE_ABORT, 1, {P0})
    assert init_producer_id(fenced, 60_000, MAX_TIMEOUT, 21, fresh_ids()) == Refused(CONCURRENT_TRANSACTIONS)
    new = init_producer_id(complete(fenced, 22), 60_000, MAX_TIMEOUT, 23, fresh_ids())
    assert (new.state, new.producer_id, new.producer_epoch) == (TxnState.EMPTY, 1000, 2)


def test_zombie_producer_is_fenced():
    new = init_producer_id(initialized(), 60_000, MAX_TIMEOUT, 5, fresh_ids())  # a second instance: epoch 1
    assert add_partitions(new, 1000, 0, frozenset({P0}), 6) == Refused(PRODUCER_FENCED)
    running = add_partitions(new, 1000, 1, frozenset({P0}), 6)
    assert end_transaction(running, 1000, 0, True, 7) == Refused(PRODUCER_FENCED)
    assert end_transaction(running, 1000, 2, True, 7) == Refused(PRODUCER_FENCED)  # a future epoch is no better


def test_client_killed_mid_transaction_is_aborted_on_timeout():
    meta = ongoing(now=10)
    assert not timed_out(meta, 10 + 60_000)  # Kafka: start + timeout < now
    assert timed_out(meta, 10 + 60_001)
    aborted = fence(meta, 60_011)
    assert (aborted.state, aborted.producer_epoch) == (TxnState.PREPARE_ABORT, 1)
    assert end_transaction(aborted, 1000, 0, True, 60_012) == Refused(PRODUCER_FENCED)  # the producer is fenced
    assert not timed_out(aborted, 10**9)  # only Ongoing times out


def test_coordinator_killed_while_fencing_leaves_ongoing_and_fences_again():
    # PrepareEpochFence is never written: the log still holds Ongoing at the old epoch, and the retried
    # InitProducerId after a reload fences exactly as the first one would have.
    meta = ongoing()
    reloaded = decode_value(meta.transactional_id, encode_value(meta))
    assert init_producer_id(reloaded, 60_000, MAX_TIMEOUT, 20, fresh_ids()) == fence(meta, 20)


def test_retried_init_producer_id_with_the_old_epoch_gets_the_same_answer():
    # KIP-360: the producer sends its (id, epoch); a retry after a lost response, still naming the old epoch,
    # gets the already-bumped epoch, not a second bump; an unrelated epoch is fenced.
    meta = init_producer_id(initialized(), 60_000, MAX_TIMEOUT, 5, fresh_ids(), expected=(1000, 0))
    assert (meta.producer_epoch, meta.last_producer_epoch) == (1, 0)
    retry = init_producer_id(meta, 60_000, MAX_TIMEOUT, 6, fresh_ids(), expected=(1000, 0))
    assert retry.producer_epoch == 1
    assert init_producer_id(meta, 60_000, MAX_TIMEOUT, 6, fresh_ids(), expected=(1000, 7)) == Refused(PRODUCER_FENCED)
    assert init_producer_id(meta, 60_000, MAX_TIMEOUT, 6, fresh_ids(), expected=(42, 1)) == Refused(PRODUCER_FENCED)


def test_exhausted_epoch_rotates_the_producer_id():
    meta = TxnMetadata("app-1", 1000, INT16_MAX - 1, 60_000, TxnState.COMPLETE_COMMIT, frozenset(), 0, 0)
    rotated = init_producer_id(meta, 60_000, MAX_TIMEOUT, 5, fresh_ids())
    assert (rotated.producer_id, rotated.producer_epoch, rotated.previous_producer_id) == (5000, 0, 1000)
    # A fence still has Short.MAX to bump to; past it, the coordinator would be wrong.
    fenced = fence(TxnMetadata("app-1", 1000, INT16_MAX - 1, 60_000, TxnState.ONGOING, frozenset({P0}), 0, 0), 1)
    assert fenced.producer_epoch == INT16_MAX
    with pytest.raises(IllegalTransition, match="app-1"):
        fence(TxnMetadata("app-1", 1000, INT16_MAX, 60_000, TxnState.ONGOING, frozenset({P0}), 0, 0), 1)


def test_idle_ids_expire_to_a_tombstone():
    meta = complete(end_transaction(ongoing(), 1000, 0, True, 40), 50)
    assert not expired(meta, 50 + 99, 100) and expired(meta, 50 + 100, 100)
    assert not expired(ongoing(), 10**12, 100)  # an open transaction never expires
    assert encode_value(remove(meta, 200)) is None
    with pytest.raises(IllegalTransition, match="ONGOING -> DEAD"):
        remove(ongoing(), 200)


def test_empty_with_partitions_cannot_exist():
    with pytest.raises(IllegalTransition, match="Empty with partitions"):
        TxnMetadata("app-1", 1000, 0, 60_000, TxnState.EMPTY, frozenset({P0}), -1, 0)


# -- a model: random requests from several instances of one transactional id -------------------------------------

ops = st.lists(st.tuples(st.sampled_from(["init", "add", "commit", "abort", "complete", "tick", "exhaust"]),
                         st.integers(0, 2), st.integers(0, 70_000)), max_size=40)


@settings(max_examples=300, deadline=None)
@given(ops=ops)
def test_random_request_sequences_keep_kafkas_invariants(ops):
    ids = fresh_ids()
    meta = new_metadata("app-1", 1000, 60_000, 0)
    instances: dict[int, tuple[int, int]] = {}  # instance -> the (producer id, epoch) it was given
    now = 0
    for op, who, dt in ops:
        now += dt
        before = meta
        if op == "init":
            out = init_producer_id(meta, 60_000, MAX_TIMEOUT, now, ids)
        elif op == "add" and who in instances:
            out = add_partitions(meta, *instances[who], frozenset({(f"t{dt % 3}", 0)}), now)
        elif op in ("commit", "abort") and who in instances:
            out = end_transaction(meta, *instances[who], op == "commit", now)
        elif op == "complete" and meta.state in (TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT):
            out = complete(meta, now)
        elif op == "tick" and timed_out(meta, now):
            out = fence(meta, now)
        elif op == "exhaust" and meta.state == TxnState.EMPTY:
            out = meta = TxnMetadata("app-1", meta.producer_id, INT16_MAX - 1, 60_000, TxnState.EMPTY, frozenset(),
                                     -1, now)
            continue
        else:
            continue
        if isinstance(out, Refused):
            continue
        meta = out
        assert before.state in VALID_PREVIOUS[meta.state]
        # Epochs only grow for one producer id; a new id starts at 0 and remembers the old one.
        if meta.producer_id == before.producer_id:
            assert meta.producer_epoch >= before.producer_epoch
        else:
            assert (meta.producer_epoch, meta.previous_producer_id) == (0, before.producer_id)
        if op == "init" and meta.state == TxnState.EMPTY:
            instances = {k: v for k, v in instances.items() if v[0] == meta.producer_id} | {
                who: (meta.producer_id, meta.producer_epoch)}
        # Whoever holds an older epoch is fenced from every coordinator API from now on.
        for pid, epoch in instances.values():
            if pid == meta.producer_id and epoch < meta.producer_epoch:
                assert add_partitions(meta, pid, epoch, frozenset({P0}), now) == Refused(PRODUCER_FENCED)
                assert end_transaction(meta, pid, epoch, True, now) == Refused(PRODUCER_FENCED)
        if meta.state != TxnState.ONGOING and meta.state not in (TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT):
            assert meta.partitions == frozenset()
        assert decode_value("app-1", encode_value(meta)) == meta.__class__(
            **{f: getattr(meta, f) for f in meta.__dataclass_fields__} | {"last_producer_epoch": -1})
