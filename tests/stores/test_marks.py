"""Conformance: block membership, delete-at-height, locked, conflicting, preservation (every backend)."""

from __future__ import annotations

import pytest

from stores.utxo import (
    BlockInfo,
    ProcessingError,
    SpendInfo,
    SpendStatus,
    TxNotFound,
    UtxoMismatch,
    UtxoStore,
)
from tests.stores.helpers import as_record, child, coinbase, created, funding, uhash

RET = 288


def test_set_mined_twice_is_a_noop(store: UtxoStore) -> None:
    f = funding()
    created(store, f)
    assert store.set_mined_multi([f.txid], 7, 101, 2) == [[7]]
    assert store.set_mined_multi([f.txid], 7, 101, 2) == [[7]]
    got = store.get(f.txid)
    assert (got.block_ids, got.block_heights, got.subtree_idxs) == ([7], [101], [2])
    assert got.unmined_since is None


def test_mined_in_two_blocks_then_unset_one(store: UtxoStore) -> None:
    f = funding()
    created(store, f)
    store.set_mined_multi([f.txid], 7, 101)
    assert store.set_mined_multi([f.txid], 8, 101, 1) == [[7, 8]]
    assert store.set_mined_multi([f.txid], 7, 101, unset=True) == [[8]]
    got = store.get(f.txid)
    assert got.block_ids == [8] and got.unmined_since is None
    store.set_mined_multi([f.txid], 8, 101, unset=True)
    got = store.get(f.txid)
    assert got.block_ids == [] and got.unmined_since == 101


def test_set_mined_clears_locked_and_creating_and_reports_missing(store: UtxoStore) -> None:
    f = funding()
    store.create(f, 100, locked=True)
    res = store.set_mined_multi([f.txid, b"\x09" * 32], 3, 101)
    assert res[0] == [3] and isinstance(res[1], TxNotFound)
    got = store.get(f.txid)
    assert not got.locked and not got.creating


def test_mined_off_the_longest_chain_stays_unmined(store: UtxoStore) -> None:
    f = funding()
    created(store, f)
    store.set_mined_multi([f.txid], 4, 101, on_longest_chain=False)
    got = store.get(f.txid)
    assert got.block_ids == [4] and got.unmined_since == 100
    store.mark_on_longest_chain([f.txid], True)
    assert store.get(f.txid).unmined_since is None
    store.set_block_height(150)
    store.mark_on_longest_chain([f.txid], False)
    assert store.get(f.txid).unmined_since == 150


def test_standing_says_held_mined_and_conflicting_as_the_single_reads_do(store: UtxoStore) -> None:
    mempool, mined, off_chain, rival, absent = (funding() for _ in range(5))
    for f in (mempool, mined, off_chain):
        created(store, f)
    store.create(rival, 100, conflicting=True)
    store.set_mined_multi([mined.txid], 4, 101)
    store.set_mined_multi([off_chain.txid], 5, 101, on_longest_chain=False)
    txids = [t.txid for t in (mempool, mined, off_chain, rival, absent)] + [mined.txid]  # twice
    got = store.standing(txids)
    assert got == {
        mempool.txid: (False, False), mined.txid: (True, False), off_chain.txid: (False, False),
        rival.txid: (False, True),
    }
    assert set(got) == store.existing(txids)
    assert {t for t, s in got.items() if s.mined} == store.mined(txids)
    assert {t for t, s in got.items() if s.conflicting} == store.existing(txids, conflicting=True)
    assert store.standing([]) == {}


def test_dah_set_when_all_spent_and_mined(store: UtxoStore) -> None:
    store.set_block_height(100)
    f = funding(2)
    created(store, f, mined=True)
    store.spend(child((f, 0)), 100)
    assert store.get(f.txid).delete_at_height is None
    store.spend(child((f, 1)), 100)
    assert store.get(f.txid).delete_at_height == 100 + RET
    assert store.query_dah(100 + RET) == [f.txid]
    assert store.query_dah(100 + RET - 1) == []


def test_dah_not_set_while_unmined_then_set_by_mining(store: UtxoStore) -> None:
    store.set_block_height(100)
    f = funding(1)
    created(store, f)
    store.spend(child((f, 0)), 101)
    assert store.get(f.txid).delete_at_height is None
    store.set_block_height(102)
    store.set_mined_multi([f.txid], 1, 102)
    assert store.get(f.txid).delete_at_height == 102 + 1 + RET  # (the tip's next block: see below)
    store.set_mined_multi([f.txid], 1, 102, unset=True)  # unset-mined clears it again
    assert store.get(f.txid).delete_at_height is None


@pytest.mark.parametrize("block_height", [101, 102, 107])
def test_set_mined_counts_the_dah_from_the_block_after_the_tip_or_the_block(
    store: UtxoStore, block_height: int
) -> None:
    """Teranode's setMined counts from the store's height + 1 (the block being mined, in step);
    where the store lags behind the block (a catch-up), from the block's own height."""
    store.set_block_height(102)
    f = funding(1)
    created(store, f)
    store.spend(child((f, 0)), 102)
    store.set_mined_multi([f.txid], 1, block_height)
    assert store.get(f.txid).delete_at_height == max(103, block_height) + RET


def test_dah_cleared_by_unspend(store: UtxoStore) -> None:
    store.set_block_height(100)
    f = funding(1)
    created(store, f, mined=True)
    (s,) = store.spend(child((f, 0)), 100)
    assert store.get(f.txid).delete_at_height == 100 + RET
    store.unspend([s])
    assert store.get(f.txid).delete_at_height is None


def test_dah_immediate_for_conflicting_and_children_recorded(store: UtxoStore) -> None:
    store.set_block_height(100)
    f = funding(2)
    created(store, f)
    c = child((f, 0))
    created(store, c)
    store.set_conflicting([c.txid], True)
    got = store.get(c.txid)
    assert got.conflicting and got.delete_at_height == 100 + RET
    parent = store.get(f.txid)
    assert parent.conflicting_children == [c.txid]
    store.set_conflicting([c.txid], True)  # recorded once
    assert store.get(f.txid).conflicting_children == [c.txid]
    store.set_conflicting([c.txid], False)
    assert store.get(f.txid).conflicting_children == [c.txid]  # Teranode keeps it listed
    assert store.get(c.txid).delete_at_height is None


def test_dah_held_off_by_preserve_until_expiry(store: UtxoStore) -> None:
    store.set_block_height(100)
    f = funding(1)
    created(store, f, mined=True)
    store.preserve_transactions([f.txid], 500)
    store.spend(child((f, 0)), 101)
    got = store.get(f.txid)
    assert got.preserve_until == 500 and got.delete_at_height is None
    assert store.process_expired_preservations(499) == 0
    assert store.get(f.txid).delete_at_height is None
    store.set_block_height(500)
    assert store.process_expired_preservations(500) == 1
    got = store.get(f.txid)
    assert got.preserve_until is None and got.delete_at_height == 500 + RET


def test_preserve_clears_an_existing_dah(store: UtxoStore) -> None:
    store.set_block_height(100)
    f = funding(1)
    created(store, f, mined=True)
    store.spend(child((f, 0)), 100)
    assert store.get(f.txid).delete_at_height == 100 + RET
    store.preserve_transactions([f.txid], 1000)
    assert store.get(f.txid).delete_at_height is None


def test_set_locked_true_clears_dah(store: UtxoStore) -> None:
    store.set_block_height(100)
    f = funding(1)
    created(store, f, mined=True)
    store.spend(child((f, 0)), 101)
    store.set_locked([f.txid], True)
    got = store.get(f.txid)
    assert got.locked and got.delete_at_height is None
    store.set_locked([f.txid], False)
    assert store.get(f.txid).delete_at_height == 100 + RET
    with pytest.raises(TxNotFound):
        store.set_locked([b"\x05" * 32], True)


def test_all_data_carrier_tx_is_prunable_once_mined(store: UtxoStore) -> None:
    from chain.build import build_tx

    store.set_block_height(100)
    f = funding(1)
    t = build_tx([f.inputs[0]], [(0, b"\x6a\x01x")])
    store.create(t, 100, [BlockInfo(1, 100)])
    assert store.get(t.txid).delete_at_height == 100 + RET


def test_query_old_unmined(store: UtxoStore) -> None:
    a, b, c = funding(), funding(), funding()
    store.create(a, 10)
    store.create(b, 20)
    store.create(c, 30, [BlockInfo(1, 30)])
    assert store.query_old_unmined(15) == [a.txid]
    assert store.query_old_unmined(30) == [a.txid, b.txid]


def test_delete_expired_removes_only_records_still_due(store: UtxoStore) -> None:
    store.set_block_height(100)
    f, g = funding(1), funding(1)
    created(store, f, g, mined=True)
    (sf,) = store.spend(child((f, 0)), 100)
    store.spend(child((g, 0)), 100)
    due = store.query_dah(100 + RET)
    assert set(due) == {f.txid, g.txid}
    store.unspend([sf])  # a reorg takes f's spend back after the pruner listed it
    assert store.delete_expired(due, 100 + RET - 1) == 0  # not due yet at that height
    assert store.delete_expired([*due, b"\x03" * 32], 100 + RET) == 1
    with pytest.raises(TxNotFound):
        store.get(g.txid)
    assert store.get_output((f.txid, 0)) is not None  # f kept its unspent output
    assert store.get(f.txid).delete_at_height is None



def test_block_height_persists(store: UtxoStore, store_url: str) -> None:
    from stores.utxo import open_utxo_store

    store.set_block_height(4242)
    other = open_utxo_store(store_url)
    try:
        assert other.block_height == 4242
        with pytest.raises(ProcessingError):
            other.set_block_height(-1)
    finally:
        other.close()


def test_get_spend_statuses(store: UtxoStore) -> None:
    store.set_block_height(1000)
    f = funding(3)
    created(store, f)
    assert store.get_spend((f.txid, 0), uhash(f, 0)) == SpendInfo(SpendStatus.OK)
    c = child((f, 0))
    store.spend(c, 1000)
    assert store.get_spend((f.txid, 0), uhash(f, 0)) == SpendInfo(SpendStatus.SPENT, c.txid, 0)
    store.freeze([((f.txid, 1), uhash(f, 1))])
    assert store.get_spend((f.txid, 1), uhash(f, 1)).status is SpendStatus.FROZEN
    with pytest.raises(UtxoMismatch):  # Teranode: an error, not NOT_FOUND
        store.get_spend((f.txid, 2), b"\x00" * 32)
    assert store.get_spend((f.txid, 9), uhash(f, 2)).status is SpendStatus.NOT_FOUND
    assert store.get_spend((b"\x01" * 32, 0), uhash(f, 2)).status is SpendStatus.NOT_FOUND
    cb = coinbase(990)
    store.create(cb, 990, [BlockInfo(1, 990)])
    imm = store.get_spend((cb.txid, 0), uhash(cb, 0))
    assert imm.status is SpendStatus.IMMATURE and imm.until == 1090
    locked = funding(1)
    store.create(locked, 1000, locked=True)
    assert store.get_spend((locked.txid, 0), uhash(locked, 0)).status is SpendStatus.LOCKED
    bad = funding(1)
    store.create(bad, 1000, conflicting=True)
    assert store.get_spend((bad.txid, 0), uhash(bad, 0)).status is SpendStatus.CONFLICTING


def test_a_store_of_another_schema_is_refused_clearly(store: UtxoStore, store_url: str) -> None:
    from stores.utxo import StorageError, open_utxo_store

    if store_url.startswith("aerospike://"):
        store._set_meta(schema="utxoflow-sql-1")  # type: ignore[attr-defined]
    else:
        store.db.write(  # type: ignore[attr-defined]
            "test", lambda cur: cur.execute("UPDATE meta SET value = 'utxoflow-sql-1' WHERE key = 'schema'")
        )
    with pytest.raises(StorageError, match="schema 'utxoflow-sql-1'"):
        open_utxo_store(store_url)


def test_storage_failures_are_storage_errors(tmp_path: object) -> None:
    from stores.utxo import StorageError, open_utxo_store

    with pytest.raises(StorageError, match="PostgreSQL"):
        open_utxo_store("postgresql://postgres@127.0.0.1:1/nowhere")
    blocked = f"{tmp_path}/file"
    open(blocked, "w").close()
    with pytest.raises(StorageError):
        open_utxo_store(f"sqlite:///{blocked}/sub/utxo.db")
    with pytest.raises(ValueError, match="unknown UTXO store URL scheme"):
        open_utxo_store("mysql://x")
    with pytest.raises(StorageError, match=r"cannot reach the Aerospike cluster at aerospike://127\.0\.0\.1:1/"):
        open_utxo_store("aerospike://127.0.0.1:1/test?timeout_ms=500")
    with pytest.raises(ValueError, match="must name one namespace"):
        open_utxo_store("aerospike://127.0.0.1:3000/")


def test_dah_counts_from_the_higher_of_caller_and_store_height(store: UtxoStore) -> None:
    store.set_block_height(100)  # this process's view; another worker has moved on to 500
    f = funding(1)
    created(store, f, mined=True)
    store.spend(child((f, 0)), 500)
    assert store.get(f.txid).delete_at_height == 500 + RET
    assert store.query_dah(500) == []


def test_unset_off_the_longest_chain_keeps_unmined_since_as_it_was(store: UtxoStore) -> None:
    """Teranode's setMined(unset) off the longest chain leaves `unminedSince` alone while the
    record is still in a block; a reorg marks the record off the chain first."""
    store.set_block_height(100)
    f, g = funding(), funding()
    created(store, f, g)
    for t in (f, g):
        store.set_mined_multi([t.txid], 9, 100, on_longest_chain=False)  # a side block
        store.set_mined_multi([t.txid], 7, 100)  # the best block
    assert store.get(f.txid).unmined_since is None
    store.set_mined_multi([f.txid], 7, 100, unset=True, on_longest_chain=False)
    got = store.get(f.txid)
    assert got.block_ids == [9] and got.unmined_since is None
    store.mark_on_longest_chain([g.txid], False)
    store.set_mined_multi([g.txid], 7, 100, unset=True, on_longest_chain=False)
    got = store.get(g.txid)
    assert got.block_ids == [9] and got.unmined_since == 100
    assert {u.txid for u in store.iter_utxos()} == {f.txid}


def test_a_spent_record_mined_only_on_a_fork_is_scheduled_once_marked_onto_the_longest_chain(
    store: UtxoStore,
) -> None:
    """Mined only in a side block, fully spent: no DAH (the rule wants the longest chain). Its block
    joins the longest chain by a mark, with nothing else changing: the rule is applied again (from
    the tip's next block, as set-mined counts), else it would never be pruned. Teranode's
    markTransactionsOnLongestChain leaves the DAH alone (deliberately different: see the kernel);
    marked off, it is left alone here too (the reorg's unset-mined clears it)."""
    store.set_block_height(100)
    f = funding(1)
    created(store, f)
    store.spend(child((f, 0)), 100)
    store.set_mined_multi([f.txid], 9, 100, on_longest_chain=False)
    assert store.get(f.txid).delete_at_height is None
    store.set_block_height(104)
    store.mark_on_longest_chain([f.txid], True)
    got = store.get(f.txid)
    assert got.unmined_since is None and got.delete_at_height == 105 + RET
    store.mark_on_longest_chain([f.txid], False)
    got = store.get(f.txid)
    assert got.unmined_since == 104 and got.delete_at_height == 105 + RET
    store.preserve_transactions([f.txid], 5000)  # a preserved record keeps what it has: none
    store.mark_on_longest_chain([f.txid], True)
    assert store.get(f.txid).delete_at_height is None


def test_mark_on_longest_chain_overwrites_unmined_since(store: UtxoStore) -> None:
    """Teranode's markTransactionsOnLongestChain: "on" unsets `unmined_since` (a block or not),
    "off" overwrites it with the tip; nothing else changes (a record in no block gets no DAH)."""
    f = funding()
    created(store, f, height=42)
    store.mark_on_longest_chain([f.txid], True)
    assert store.get(f.txid).unmined_since is None
    assert store.query_old_unmined(42) == []
    assert list(store.iter_utxos()) == []  # in no block: not confirmed
    store.set_block_height(50)
    store.mark_on_longest_chain([f.txid], False)
    assert store.get(f.txid).unmined_since == 50
    store.set_block_height(60)
    store.mark_on_longest_chain([f.txid], False)
    assert store.get(f.txid).unmined_since == 60 and store.query_old_unmined(60) == [f.txid]


def test_set_locked_with_a_missing_txid_changes_nothing(store: UtxoStore) -> None:
    f = funding()
    created(store, f)
    with pytest.raises(TxNotFound):
        store.set_locked([f.txid, b"\x05" * 32], True)
    assert not store.get(f.txid).locked


def test_bad_arguments_are_processing_errors(store: UtxoStore) -> None:
    from stores.utxo import Spend

    f = funding(3)
    created(store, f)
    bad_calls = [
        lambda: store.set_mined_multi([f.txid], True, 100),  # type: ignore[arg-type]
        lambda: store.set_mined_multi([f.txid], 1.5, 100),  # type: ignore[arg-type]
        lambda: store.set_mined_multi([f.txid], 1, -1),
        lambda: store.preserve_transactions([f.txid], 2**70),
        lambda: store.query_dah(2**70),
        lambda: store.query_old_unmined(-3),
        lambda: store.create(funding(), 2**70),
        lambda: store.spend(child((f, 0)), -1),
        lambda: store.freeze([((f.txid, -2), uhash(f, 1))]),
        lambda: store.get_output((f.txid, -1)),
        lambda: store.get_spend((f.txid, -2), uhash(f, 1)),
        lambda: store.get(b"short"),
        lambda: store.unspend([Spend(f.txid, -1, uhash(f, 0), b"\x01" * 32, 0)]),
        lambda: store.set_block_height(0),
    ]
    for call in bad_calls:
        with pytest.raises(ProcessingError):
            call()
    # nothing was stored by any of them: the record reads back as created
    got = store.get(f.txid)
    assert got.block_ids == [] and got.preserve_until is None and got.spent_utxos == 0
    assert all(store.get_output((f.txid, v)).state == "unspent" for v in range(3))  # type: ignore[union-attr]


def test_a_lost_postgresql_connection_is_retried_on_a_new_one(pg_url: str) -> None:
    """A connection terminated between units: the next unit (a write, a read) runs on a new one,
    once; a unit that cannot run twice (retry off) leaves as a StorageError naming it."""
    import psycopg

    from stores.utxo import StorageError, open_utxo_store

    store = open_utxo_store(pg_url)

    def terminate() -> None:
        pid = store.db.backend_pid()  # type: ignore[attr-defined]
        with psycopg.connect(pg_url, autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(%s)", (pid,))

    try:
        f = funding(1)
        created(store, f)
        terminate()
        c = child((f, 0))
        store.spend(c, 101)
        terminate()
        assert store.get_output((f.txid, 0)).spending_txid == c.txid  # type: ignore[union-attr]
        terminate()
        with pytest.raises(StorageError, match=r"once only failed .*AdminShutdown"):
            store.db.write("once only", lambda cur: cur.execute("SELECT 1"), retry=False)  # type: ignore[attr-defined]
        assert store.get(f.txid).spent_utxos == 1  # and the store goes on
    finally:
        store.close()


@pytest.mark.parametrize("conflicting", [False, True])
@pytest.mark.parametrize("preserved", [False, True])
@pytest.mark.parametrize("all_spent", [False, True])
@pytest.mark.parametrize("locked", [False, True])
def test_first_mining_agrees_with_the_dah_rule(
    store: UtxoStore, conflicting: bool, preserved: bool, all_spent: bool, locked: bool
) -> None:
    """set_mined's no-read path writes DAH in SQL (`dah.first_mining_sql`); it must equal the
    kernel's set-mined exactly."""
    from stores.utxo.kernel import dah, marks

    store.set_block_height(100)
    f = funding(2)
    store.create(f, 100, conflicting=conflicting, locked=locked)
    if preserved:
        store.preserve_transactions([f.txid], 5000)
    if all_spent and not conflicting and not locked:
        store.spend_many([child((f, 0)), child((f, 1))], 100)
    model = as_record(store.get(f.txid))
    marks.set_mined(model, (3, 100, 0), True, dah.mining_height(100, 100), RET)
    assert store.set_mined_multi([f.txid], 3, 100) == [[3]]
    after = store.get(f.txid)
    assert after.delete_at_height == model.delete_at_height
    assert after.block_ids == [3] and after.unmined_since is None and not after.locked


def test_mining_a_batch_with_one_record_already_mined_takes_the_general_path(store: UtxoStore) -> None:
    a, b = funding(), funding()
    created(store, a, b)
    store.set_mined_multi([a.txid], 1, 100)
    assert store.set_mined_multi([a.txid, b.txid, b"\x07" * 32], 2, 101)[:2] == [[1, 2], [2]]
    assert store.get(a.txid).block_ids == [1, 2] and store.get(b.txid).block_ids == [2]


@pytest.mark.parametrize("mined", [False, True])
@pytest.mark.parametrize("preserved", [False, True])
@pytest.mark.parametrize("last", [False, True])
def test_spend_agrees_with_the_dah_rule(
    store: UtxoStore, mined: bool, preserved: bool, last: bool
) -> None:
    """spend's fast path must leave the DAH the kernel's rule gives."""
    from stores.utxo.kernel.dah import due

    store.set_block_height(100)
    f = funding(2)
    created(store, f, mined=mined)
    if preserved:
        store.preserve_transactions([f.txid], 5000)
    if last:
        store.spend(child((f, 1)), 100)
    before = store.get(f.txid)
    store.spend(child((f, 0)), 100)
    after = store.get(f.txid)
    assert after.spent_utxos == before.spent_utxos + 1
    model = as_record(before)
    model.spent_utxos += 1
    assert after.delete_at_height == due(model, 100, RET)

