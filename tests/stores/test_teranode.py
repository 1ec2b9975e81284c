"""Teranode's store tests, translated (every backend): the shared suite `stores/utxo/tests/tests.go`,
the Aerospike UDF tests that pin `teranode.lua`, and its alert-system and longest-chain tests.

Each test names the one it translates. Teranode's fixtures are kept: `ParentTx` (3 outputs),
`Tx` spending ParentTx:2 with 5 outputs, `spendTx` spending Tx:0, `spendTx2` spending it too;
retention 10. Two things differ by design: coinbase maturity is Bitcoin's 100 here (Teranode's
tests set 1), so heights move by 100 where theirs move by 1; and a spend is all or nothing per
transaction (docs/architecture.md). Heights a spend is made at are the block's: the store's
tip + 1, as Teranode's Aerospike store passes them.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from chain import Tx, TxIn
from chain.build import build_tx
from stores.utxo import (
    BlockInfo,
    InvalidSpend,
    ProcessingError,
    SpendRejected,
    SpendStatus,
    TxCoinbaseImmature,
    TxConflicting,
    TxExists,
    TxLocked,
    TxNotFound,
    UtxoFrozen,
    UtxoMismatch,
    UtxoNotFound,
    UtxoNotFrozen,
    UtxoSpent,
    UtxoStore,
    open_utxo_store,
)
from stores.utxo.values import Spend
from tests.stores.helpers import child, coinbase, funding, script, uhash

RETENTION = 10  # Teranode's GlobalBlockHeightRetention in its tests
FF = b"\xff" * 32


@pytest.fixture
def tn(store_url: str, tmp_path: Path) -> Iterator[UtxoStore]:
    s = open_utxo_store(store_url, retention=RETENTION, blob_url=f"file://{tmp_path}/blobs")
    yield s
    s.close()


class Fixture:
    """ParentTx, Tx (spends ParentTx:2, 5 outputs), spendTx and spendTx2 (both spend Tx:0)."""

    def __init__(self) -> None:
        self.parent = funding(3)
        self.tx = child((self.parent, 2), n_outputs=5)
        self.spend = child((self.tx, 0), n_outputs=2)
        self.spend2 = child((self.tx, 0), n_outputs=1)


@pytest.fixture
def fx() -> Fixture:
    return Fixture()


def only(e: SpendRejected) -> Exception:
    assert len(e.errors) == 1
    return e.errors[0][1]


def rejected(store: UtxoStore, tx: Tx, height: int) -> list[Exception]:
    (r,) = store.spend_many([tx], height)
    assert isinstance(r, SpendRejected), r
    return [e for _vin, e in r.errors]


# -- stores/utxo/tests/tests.go ------------------------------------------------------------------
def test_store(tn: UtxoStore, fx: Fixture) -> None:
    """tests.Store: create, read, create again (TxExists), spend, create again."""
    tn.create(fx.tx, 1000)
    assert tn.get(fx.tx.txid).txid == fx.tx.txid
    with pytest.raises(TxExists):
        tn.create(fx.tx, 1000)
    tn.spend(fx.spend, 1001)
    with pytest.raises(TxExists):
        tn.create(fx.tx, 1000)


def test_spend_names_the_first_spender(tn: UtxoStore, fx: Fixture) -> None:
    """tests.Spend: a second spender of Tx:0 gets UTXO_SPENT naming spendTx (ConflictingTxID)."""
    tn.create(fx.tx, 1000)
    tn.spend(fx.spend, 1001)
    assert tn.get(fx.tx.txid).spent_utxos == 1
    (err,) = rejected(tn, fx.spend2, 1001)
    assert isinstance(err, UtxoSpent) and err.spending_txid == fx.spend.txid and err.spending_vin == 0


def test_restore_unspends_whoever_the_spender_named(tn: UtxoStore, fx: Fixture) -> None:
    """tests.Restore (and Aerospike's aerospike_reset): Unspend with a dummy spender but the
    right UTXO hash clears the output. (Before: a silent False, nothing cleared.)"""
    tn.create(fx.tx, 1000)
    tn.spend(fx.spend, 1001)
    dummy = Spend(fx.tx.txid, 0, uhash(fx.tx, 0), bytes.fromhex("5e3b" + "00" * 28 + "87c7"), 0)
    assert tn.unspend([dummy]) == [None]
    out = tn.get_output((fx.tx.txid, 0))
    assert out is not None and out.state == "unspent" and tn.get(fx.tx.txid).spent_utxos == 0
    tn.spend(fx.spend2, 1001)


def test_freeze(tn: UtxoStore, fx: Fixture) -> None:
    """tests.Freeze: a frozen output refuses its spend; GetSpend says FROZEN with the all-0xFF
    txid and vin = vout; unfrozen, it is spent and GetSpend names the spender."""
    tn.set_block_height(1000)
    tn.create(fx.tx, 1000)
    assert tn.freeze([((fx.tx.txid, 0), uhash(fx.tx, 0))]) == [None]
    (err,) = rejected(tn, fx.spend, 1001)
    assert isinstance(err, UtxoFrozen)
    info = tn.get_spend((fx.tx.txid, 0), uhash(fx.tx, 0))
    assert (info.status, info.spending_txid, info.spending_vin) == (SpendStatus.FROZEN, FF, 0)
    assert tn.unfreeze([((fx.tx.txid, 0), uhash(fx.tx, 0))]) == [None]
    assert tn.get_spend((fx.tx.txid, 0), uhash(fx.tx, 0)).status is SpendStatus.OK
    tn.spend(fx.spend, 1001)
    info = tn.get_spend((fx.tx.txid, 0), uhash(fx.tx, 0))
    assert (info.status, info.spending_txid) == (SpendStatus.SPENT, fx.spend.txid)


def test_reassign(tn: UtxoStore, fx: Fixture) -> None:
    """tests.ReAssign: tip 101; reassigning an output that is not frozen fails; frozen, it is
    reassigned; GetSpend with the old hash is an error, with the new one IMMATURE; spends with
    either hash fail at the next block; at tip 1101 the new one spends. (Before: spendable one
    block early, and GetSpend said FROZEN.)"""
    tn.set_block_height(101)
    tn.create(fx.tx, 0)
    old = uhash(fx.tx, 0)
    new_script = script()
    value = fx.tx.outputs[0].satoshis
    from chain import utxo_hash

    new = utxo_hash(fx.tx.txid, 0, new_script, value)
    with pytest.raises(UtxoNotFrozen):
        tn.reassign((fx.tx.txid, 0), old, new)
    tn.freeze([((fx.tx.txid, 0), old)])
    tn.reassign((fx.tx.txid, 0), old, new)
    with pytest.raises(UtxoMismatch):
        tn.get_spend((fx.tx.txid, 0), old)
    info = tn.get_spend((fx.tx.txid, 0), new)
    assert info.status is SpendStatus.IMMATURE and info.spending_txid is None
    new_owner = build_tx(
        [TxIn(fx.tx.txid, 0, b"\x51", 0xFFFFFFFF, value, new_script)], [(value - 10, script())]
    )
    assert isinstance(rejected(tn, fx.spend, 102)[0], UtxoMismatch)
    assert isinstance(rejected(tn, new_owner, 102)[0], UtxoFrozen)
    tn.set_block_height(1100)
    assert isinstance(rejected(tn, new_owner, 1101)[0], UtxoFrozen)  # spendable_in 1101 >= 1101
    tn.set_block_height(1101)
    assert tn.get_spend((fx.tx.txid, 0), new).status is SpendStatus.OK
    assert tn.spend(new_owner, 1102)[0].utxo_hash == new


def test_set_mined(tn: UtxoStore, fx: Fixture) -> None:
    """tests.SetMined: blocks append with their heights and subtrees; unset removes one."""
    tn.set_block_height(101)
    tn.create(fx.tx, 0)
    assert tn.set_mined_multi([fx.tx.txid], 123, 101, 2) == [[123]]
    m = tn.get(fx.tx.txid)
    assert (m.block_ids, m.block_heights, m.subtree_idxs) == ([123], [101], [2])
    assert tn.set_mined_multi([fx.tx.txid], 124, 102, 1) == [[123, 124]]
    m = tn.get(fx.tx.txid)
    assert (m.block_ids, m.block_heights, m.subtree_idxs) == ([123, 124], [101, 102], [2, 1])
    assert tn.set_mined_multi([fx.tx.txid], 123, 101, 2, unset=True) == [[124]]
    m = tn.get(fx.tx.txid)
    assert (m.block_ids, m.block_heights, m.subtree_idxs) == ([124], [102], [1])


def test_conflicting(tn: UtxoStore, fx: Fixture) -> None:
    """tests.Conflicting: Tx created conflicting cannot be spent; the parent lists it among its
    conflicting children and is not conflicting itself. (Before: the parent's list was empty.)"""
    tn.create(fx.parent, 1000)
    tn.create(fx.tx, 1000, conflicting=True)
    assert isinstance(rejected(tn, fx.spend, 1001)[0], TxConflicting)
    m = tn.get(fx.tx.txid)
    assert m.conflicting and m.conflicting_children == []
    p = tn.get(fx.parent.txid)
    assert not p.conflicting and p.conflicting_children == [fx.tx.txid]


def test_sanity(tn: UtxoStore) -> None:
    """tests.Sanity: many txs created and spent; GetSpend names each one's spender."""
    parents = [funding(1) for _ in range(200)]
    spenders = [child((p, 0)) for p in parents]
    assert all(not isinstance(r, Exception) for r in tn.create_many(parents, 100))
    assert all(isinstance(r, list) for r in tn.spend_many(spenders, 101))
    for p, s in zip(parents, spenders):
        info = tn.get_spend((p.txid, 0), uhash(p, 0))
        assert (info.status, info.spending_txid, info.spending_vin) == (SpendStatus.SPENT, s.txid, 0)


def test_unspend_idempotent(tn: UtxoStore, fx: Fixture) -> None:
    """tests.UnspendIdempotent: unspending twice is no error either time."""
    tn.create(fx.tx, 1000)
    spends = tn.spend(fx.spend, 1001)
    assert tn.unspend(spends) == [None]
    assert tn.unspend(spends) == [None]
    assert tn.get(fx.tx.txid).spent_utxos == 0


def test_spend_error_types(tn: UtxoStore, fx: Fixture) -> None:
    """tests.SpendErrorTypes: a missing parent, a wrong previous script, an immature coinbase and
    a double spend each have their own error."""
    assert isinstance(rejected(tn, fx.spend, 1001)[0], TxNotFound)
    tn.create(fx.tx, 1000)
    o = fx.tx.outputs[1]
    wrong = build_tx([TxIn(fx.tx.txid, 1, b"\x51", 0xFFFFFFFF, o.satoshis, script())], [(100, script())])
    assert isinstance(rejected(tn, wrong, 1001)[0], UtxoMismatch)
    cb = coinbase(1000)
    tn.create(cb, 1000, [BlockInfo(1, 1000)])
    err = rejected(tn, child((cb, 0)), 1099)[0]  # maturity 100: first spendable at 1100
    assert isinstance(err, TxCoinbaseImmature) and err.spendable_at == 1100
    tn.spend(fx.spend, 1001)
    err = rejected(tn, fx.spend2, 1001)[0]
    assert isinstance(err, UtxoSpent) and err.spending_txid == fx.spend.txid


def test_get_spend_not_found(tn: UtxoStore) -> None:
    """tests.GetSpendNotFound: an unknown tx is NOT_FOUND, not an error."""
    assert tn.get_spend((b"\x42" * 32, 0), b"\x01" * 32).status is SpendStatus.NOT_FOUND


def test_set_block_height_zero(tn: UtxoStore) -> None:
    """tests.SetBlockHeightZero: height 0 is an invalid argument."""
    with pytest.raises(ProcessingError):
        tn.set_block_height(0)


def test_set_locked_behavior(tn: UtxoStore, fx: Fixture) -> None:
    """tests.SetLockedBehavior (and Aerospike's aerospike_set_locked): OK → locked → LOCKED and
    the spend refused → unlocked → OK and the spend made."""
    tn.set_block_height(1000)
    tn.create(fx.tx, 1000)
    assert tn.get_spend((fx.tx.txid, 0), uhash(fx.tx, 0)).status is SpendStatus.OK
    tn.set_locked([fx.tx.txid], True)
    assert tn.get_spend((fx.tx.txid, 0), uhash(fx.tx, 0)).status is SpendStatus.LOCKED
    assert isinstance(rejected(tn, fx.spend, 1001)[0], TxLocked)
    tn.set_locked([fx.tx.txid], False)
    assert tn.get_spend((fx.tx.txid, 0), uhash(fx.tx, 0)).status is SpendStatus.OK
    assert tn.spend(fx.spend, 1001)[0].spending_txid == fx.spend.txid


def test_set_conflicting_behavior(tn: UtxoStore, fx: Fixture) -> None:
    """tests.SetConflictingBehavior: GetSpend says CONFLICTING and the parent lists the tx."""
    tn.set_block_height(1000)
    tn.create(fx.parent, 1000)
    tn.create(fx.tx, 1000, conflicting=True)
    assert tn.get_spend((fx.tx.txid, 0), uhash(fx.tx, 0)).status is SpendStatus.CONFLICTING
    assert tn.get(fx.tx.txid).conflicting
    assert isinstance(rejected(tn, fx.spend, 1001)[0], TxConflicting)
    assert tn.get(fx.parent.txid).conflicting_children == [fx.tx.txid]


def test_set_mined_unmined_since(tn: UtxoStore, fx: Fixture) -> None:
    """tests.SetMinedUnminedSince: unmined since its creation height; mined on the longest chain,
    none; marked off it, set; marked on it, none."""
    tn.set_block_height(200)
    tn.create(fx.tx, 200)
    assert tn.get(fx.tx.txid).unmined_since == 200
    tn.set_mined_multi([fx.tx.txid], 500, 200, 1)
    assert tn.get(fx.tx.txid).unmined_since is None
    tn.mark_on_longest_chain([fx.tx.txid], False)
    assert tn.get(fx.tx.txid).unmined_since == 200
    tn.mark_on_longest_chain([fx.tx.txid], True)
    assert tn.get(fx.tx.txid).unmined_since is None


def test_spend_idempotent(tn: UtxoStore, fx: Fixture) -> None:
    """tests.SpendIdempotent: the same spend twice succeeds twice."""
    tn.create(fx.tx, 1000)
    assert tn.spend(fx.spend, 1001) == tn.spend(fx.spend, 1001)
    assert tn.get(fx.tx.txid).spent_utxos == 1


def test_set_mined_with_spent(tn: UtxoStore, fx: Fixture) -> None:
    """tests.SetMinedWithSpent: a tx whose outputs are all spent is mined, then mined again."""
    tn.set_block_height(300)
    tn.create(fx.tx, 300)
    for v in range(5):
        tn.spend(child((fx.tx, v)), 301)
    assert tn.set_mined_multi([fx.tx.txid], 600, 300, 0) == [[600]]
    assert tn.get(fx.tx.txid).unmined_since is None
    assert tn.set_mined_multi([fx.tx.txid], 601, 301, 1) == [[600, 601]]
    m = tn.get(fx.tx.txid)
    assert (m.block_heights, m.subtree_idxs) == ([300, 301], [0, 1])


def test_mined_then_spend_all_prunes(tn: UtxoStore, fx: Fixture) -> None:
    """tests.MinedThenSpendAllPrunes: mined on the longest chain and fully spent, it is pruned."""
    tn.set_block_height(100)
    tn.create(fx.tx, 100)
    tn.set_mined_multi([fx.tx.txid], 1, 100)
    for v in range(5):
        tn.spend(child((fx.tx, v)), 101)
    assert tn.query_dah(1_000_000) == [fx.tx.txid]
    assert tn.delete_expired([fx.tx.txid], 1_000_000) == 1
    with pytest.raises(TxNotFound):
        tn.get(fx.tx.txid)


# -- the Aerospike store's tests (they pin teranode.lua) ----------------------------------------
def test_aerospike_store_conflicting_has_a_dah_at_once(tn: UtxoStore, fx: Fixture) -> None:
    """aerospike_store_conflicting: a tx created conflicting gets its delete-at-height at once."""
    tn.create(fx.tx, 100, conflicting=True)
    m = tn.get(fx.tx.txid)
    assert m.conflicting and m.block_ids == [] and m.delete_at_height == 100 + RETENTION


def test_aerospike_store_fresh_record(tn: UtxoStore, fx: Fixture) -> None:
    """aerospike_store: a new record has every output unspent, no block, no DAH; creating it
    again is TxExists; one of its outputs then spends."""
    tn.create(fx.tx, 100)
    m = tn.get(fx.tx.txid)
    assert m.block_ids == [] and m.delete_at_height is None and m.spent_utxos == 0 and m.total_utxos == 5
    outs = tn.get_outputs([(fx.tx.txid, v) for v in range(5)])
    assert all(o.state == "unspent" for o in outs.values()) and len(outs) == 5
    with pytest.raises(TxExists):
        tn.create(fx.tx, 100)
    tn.spend(fx.spend, 101)


def test_aerospike_spend_all_and_expire(tn: UtxoStore, fx: Fixture) -> None:
    """aerospike_spend_all_and_expire: spent whole while unmined, no DAH; mined, the DAH is set;
    a later double spend names the original spender and changes nothing."""
    tn.create(fx.tx, 0)
    kids = [child((fx.tx, v)) for v in range(5)]
    for k in kids:
        tn.spend(k, 1)
    assert tn.get(fx.tx.txid).delete_at_height is None
    tn.set_mined_multi([fx.tx.txid], 1, 1)
    assert tn.get(fx.tx.txid).delete_at_height == 1 + RETENTION
    err = rejected(tn, child((fx.tx, 0), fee=7), 2)[0]
    assert isinstance(err, UtxoSpent) and err.spending_txid == kids[0].txid
    outs = tn.get_outputs([(fx.tx.txid, v) for v in range(5)])
    spenders = [(o.spending_txid, o.spending_vin) for _op, o in sorted(outs.items())]
    assert spenders == [(k.txid, 0) for k in kids]


def test_aerospike_spend_1_and_not_expire(tn: UtxoStore, fx: Fixture) -> None:
    """aerospike_1_record_spend_1_and_not_expire(_no_blockIDs): partly spent, or never mined,
    a record gets no DAH; mined and fully spent, it does."""
    mined, unmined = fx.tx, child((fx.parent, 1), n_outputs=5)
    tn.create(mined, 100, [BlockInfo(1, 100), BlockInfo(2, 100), BlockInfo(3, 100)])
    tn.create(unmined, 100)
    tn.spend(child((mined, 0)), 101)
    assert tn.get(mined.txid).delete_at_height is None
    for v in range(1, 5):
        tn.spend(child((mined, v)), 101)
    assert tn.get(mined.txid).delete_at_height == 101 + RETENTION
    for v in range(5):
        tn.spend(child((unmined, v)), 101)
    assert tn.get(unmined.txid).delete_at_height is None


def test_lua_spend_then_unspend_counts(tn: UtxoStore, fx: Fixture) -> None:
    """LUAScripts: a spend counts one spent UTXO, its unspend takes it back."""
    tn.create(fx.tx, 100)
    spends = tn.spend(fx.spend, 101)
    assert tn.get(fx.tx.txid).spent_utxos == 1
    tn.unspend(spends)
    assert tn.get(fx.tx.txid).spent_utxos == 0


def test_create_with_block_ids(tn: UtxoStore, fx: Fixture) -> None:
    """CreateWithBlockIDs: created in three blocks, it lists all three."""
    tn.create(fx.tx, 100, [BlockInfo(1, 100), BlockInfo(2, 101), BlockInfo(3, 102)])
    assert tn.get(fx.tx.txid).block_ids == [1, 2, 3]


def test_op_return_has_no_slot(tn: UtxoStore) -> None:
    """TestStoreOPReturn: a zero-satoshi OP_RETURN output keeps its position with no UTXO."""
    parent = funding(1)
    tx = build_tx([TxIn(parent.txid, 0, b"\x51", 0xFFFFFFFF)], [(0, b"\x6a\x04data"), (5000, script())])
    tn.create(tx, 100)
    assert tn.get(tx.txid).total_utxos == 1
    assert tn.get_output((tx.txid, 0)) is None and tn.get_output((tx.txid, 1)) is not None
    assert isinstance(rejected(tn, child((tx, 0), fee=0), 101)[0], UtxoNotFound)


def test_frozen_utxo_refuses_the_whole_spend(tn: UtxoStore, fx: Fixture) -> None:
    """FrozenUTXO: spending outputs 0 and 1 with 1 frozen fails with UTXO_FROZEN (and, all or
    nothing here, output 0 stays unspent)."""
    tn.create(fx.tx, 100)
    tn.freeze([((fx.tx.txid, 1), uhash(fx.tx, 1))])
    errs = rejected(tn, child((fx.tx, 0), (fx.tx, 1)), 101)
    assert [type(e) for e in errs] == [UtxoFrozen]
    assert tn.get_output((fx.tx.txid, 0)).state == "unspent"  # type: ignore[union-attr]


def test_coinbase_maturity(tn: UtxoStore) -> None:
    """TestCoinbase: a coinbase created at 2 is immature until its spending height (maturity 100
    here, 1 in Teranode's test)."""
    cb = coinbase(2)
    tn.create(cb, 2, [BlockInfo(1, 2)])
    assert tn.get(cb.txid).spending_height == 102
    assert isinstance(rejected(tn, child((cb, 0)), 101)[0], TxCoinbaseImmature)
    assert tn.spend(child((cb, 0)), 5000)


def test_spend_simple(tn: UtxoStore, fx: Fixture) -> None:
    """TestSpendSimple: one spend of five, no DAH."""
    tn.create(fx.tx, 100, [BlockInfo(1, 100)])
    tn.spend(fx.spend, 101)
    m = tn.get(fx.tx.txid)
    assert m.spent_utxos == 1 and m.delete_at_height is None


def test_respend_expired_child(tn: UtxoStore, fx: Fixture) -> None:
    """TestRespendExpiredChild: the same child spends again and again; once it is pruned (the
    parent lists it among its deleted children), its spend again is INVALID_SPEND. (Before: a
    success, so a replayed pruned tx could spend for good.)"""
    tn.set_block_height(100)
    tn.create(fx.tx, 100, [BlockInfo(1, 100)])
    kid = child((fx.tx, 0))
    for _ in range(3):
        tn.spend(kid, 101)
    tn.create(kid, 101, [BlockInfo(2, 101)])
    tn.spend(child((kid, 0)), 102)  # the child is mined and fully spent: due at 102 + 10
    assert tn.delete_expired([kid.txid], 200) == 1
    assert tn.get(fx.tx.txid).deleted_children == [kid.txid]
    (err,) = rejected(tn, kid, 201)
    assert isinstance(err, InvalidSpend)
    other = rejected(tn, fx.spend2, 201)[0]  # another spender still meets a plain UTXO_SPENT
    assert isinstance(other, UtxoSpent) and other.spending_txid == kid.txid


def test_deleted_children(tn: UtxoStore) -> None:
    """TestDeletedChildren: pruning a child lists it on its parent, exactly once."""
    tn.set_block_height(10)
    cb = coinbase(0)
    tn.create(cb, 0, [BlockInfo(1, 0)])
    parent = child((cb, 0), n_outputs=50)
    tn.create(parent, 101, [BlockInfo(2, 101)])
    tn.spend(parent, 101)
    kid = child((parent, 0), n_outputs=10)
    tn.spend(kid, 102)
    tn.create(kid, 102, [BlockInfo(3, 102)])
    tn.spend_many([child((kid, v)) for v in range(10)], 103)
    assert tn.get(kid.txid).delete_at_height == 103 + RETENTION
    assert tn.delete_expired([kid.txid], 113) == 1
    assert tn.get(parent.txid).deleted_children == [kid.txid]


def test_two_phase_commit_lock(tn: UtxoStore, fx: Fixture) -> None:
    """TestStore_AerospikeTwoPhaseCommit: created locked, it cannot be spent."""
    tn.create(fx.tx, 100, locked=True)
    assert tn.get(fx.tx.txid).locked
    assert isinstance(rejected(tn, fx.spend, 101)[0], TxLocked)


def test_respend_same_utxo(tn: UtxoStore, fx: Fixture) -> None:
    """TestRespendSameUTXO: child1's spend repeated always succeeds, child2's always fails."""
    tn.create(fx.tx, 100)
    tn.spend(fx.spend, 101)
    for _ in range(10):
        assert tn.spend(fx.spend, 101)[0].spending_txid == fx.spend.txid
        assert isinstance(rejected(tn, fx.spend2, 101)[0], UtxoSpent)


def test_unspend_then_respend(tn: UtxoStore, fx: Fixture) -> None:
    """TestStore_Unspend: after an unspend another tx may spend; unspending a never-spent output
    is fine and leaves it spendable."""
    tn.create(fx.tx, 100)
    spends = tn.spend(fx.spend, 101)
    tn.unspend(spends)
    tn.spend(fx.spend2, 101)
    never = Spend(fx.tx.txid, 3, uhash(fx.tx, 3), b"\x01" * 32, 0)
    assert tn.unspend([never]) == [None]
    tn.spend(child((fx.tx, 3)), 101)


def test_alert_system_reassign_log(tn: UtxoStore, fx: Fixture) -> None:
    """TestAlertSystem/ReAssignUTXO: the reassignment is logged (offset, both hashes, height),
    the output is spendable after 1000 blocks, and the record counts one more UTXO, so that it
    is never all spent and never pruned. (Before: no extra UTXO; the record could be pruned and
    its log lost.)"""
    tn.set_block_height(101)
    tn.create(fx.tx, 101, [BlockInfo(1, 101)])
    old, new = uhash(fx.tx, 0), b"\x77" * 32
    tn.freeze([((fx.tx.txid, 0), old)])
    tn.reassign((fx.tx.txid, 0), old, new)
    m = tn.get(fx.tx.txid)
    (entry,) = m.reassignments
    assert entry == {
        "offset": 0, "utxo_hash": old[::-1].hex(), "new_utxo_hash": new[::-1].hex(), "block_height": 101
    }
    assert tn.get_output((fx.tx.txid, 0)).spendable_in == 1101  # type: ignore[union-attr]
    assert m.total_utxos == 6
    tn.spend_many([child((fx.tx, v)) for v in range(1, 5)], 102)
    assert tn.get(fx.tx.txid).delete_at_height is None
    assert tn.query_dah(10**6) == []


def test_mark_transactions_on_longest_chain(tn: UtxoStore) -> None:
    """TestMarkTransactionsOnLongestChain: "on" clears unmined_since, "off" writes the tip,
    overwriting; only the marked txs change."""
    a, b = funding(), funding()
    tn.set_block_height(100)
    tn.create_many([a, b], 100)
    assert tn.get(a.txid).unmined_since == 100
    tn.mark_on_longest_chain([a.txid, b.txid], True)
    assert tn.get(a.txid).unmined_since is None
    tn.set_block_height(101)
    tn.mark_on_longest_chain([a.txid], False)
    assert tn.get(a.txid).unmined_since == 101
    tn.mark_on_longest_chain([a.txid], True)
    tn.set_block_height(200)
    tn.mark_on_longest_chain([a.txid], False)
    assert (tn.get(a.txid).unmined_since, tn.get(b.txid).unmined_since) == (200, None)


def test_spend_multi_record(store_url: str, tmp_path: Path) -> None:
    """TestStore_SpendMultiRecord: on a tx spanning records (batch size 1 there, 2 here) a spend
    repeats idempotently and another spender gets UTXO_SPENT naming the first; the master counts
    every page and only it is external."""
    s = open_utxo_store(store_url, retention=RETENTION, batch_size=2, blob_url=f"file://{tmp_path}/b")
    try:
        tx = child((funding(1), 0), n_outputs=5)
        s.create(tx, 100)
        m = s.get(tx.txid)
        assert (m.total_utxos, m.total_extra_recs, m.external) == (5, 2, True)
        first = child((tx, 3))
        assert s.spend(first, 101) == s.spend(first, 101)
        err = rejected(s, child((tx, 3), fee=9), 101)[0]
        assert isinstance(err, UtxoSpent) and err.spending_txid == first.txid
        s.spend(child((tx, 1)), 101)
        outs = s.get_outputs([(tx.txid, v) for v in range(5)])
        spent = [o.spending_txid is not None for _op, o in sorted(outs.items())]
        assert spent == [False, True, False, True, False]
        assert s.get(tx.txid).spent_utxos == 2
    finally:
        s.close()


# -- the divergences from teranode.lua found in this store, each pinned --------------------------
def test_retention_zero_means_never(store_url: str, tmp_path: Path) -> None:
    """setDeleteAtHeight does nothing at retention 0: no DAH for a mined, fully spent record, a
    conflicting one, or an expired preservation. (Before: DAH = height + 0, deleted at once.)"""
    s = open_utxo_store(store_url, retention=0, blob_url=f"file://{tmp_path}/b")
    try:
        s.set_block_height(100)
        a, b, c = funding(1), funding(1), funding(1)
        s.create_many([a, c], 100, [BlockInfo(1, 100)])
        s.create(b, 100, conflicting=True)
        s.spend(child((a, 0)), 101)
        s.preserve_transactions([c.txid], 150)
        s.process_expired_preservations(150)
        assert [s.get(t.txid).delete_at_height for t in (a, b, c)] == [None, None, None]
        assert s.query_dah(10**6) == []
    finally:
        s.close()


def test_dah_only_moves_later(tn: UtxoStore, fx: Fixture) -> None:
    """Mined again later (another block, say on another branch that becomes the best), a fully
    spent record's DAH moves to the later height; it never moves earlier. (Before: the earliest
    DAH was kept.)"""
    tn.set_block_height(100)
    tn.create(fx.tx, 100, [BlockInfo(1, 100)])
    tn.spend_many([child((fx.tx, v)) for v in range(5)], 101)
    assert tn.get(fx.tx.txid).delete_at_height == 101 + RETENTION
    tn.set_mined_multi([fx.tx.txid], 2, 150)
    assert tn.get(fx.tx.txid).delete_at_height == 150 + RETENTION
    tn.set_mined_multi([fx.tx.txid], 3, 120)  # an earlier height: the later DAH stays
    tn.set_block_height(120)
    assert tn.get(fx.tx.txid).delete_at_height == 150 + RETENTION


def test_mined_only_off_the_longest_chain_gets_no_dah(tn: UtxoStore, fx: Fixture) -> None:
    """A fully spent record mined only in a block off the longest chain stays unmined and is
    never due. (Before: it got a DAH.)"""
    tn.set_block_height(100)
    tn.create(fx.tx, 100)
    tn.spend_many([child((fx.tx, v)) for v in range(5)], 101)
    tn.set_mined_multi([fx.tx.txid], 9, 101, on_longest_chain=False)
    m = tn.get(fx.tx.txid)
    assert m.block_ids == [9] and m.unmined_since == 100 and m.delete_at_height is None


def test_expired_preservation_is_scheduled(tn: UtxoStore, fx: Fixture) -> None:
    """processExpiredPreservations gives every record whose preservation ran out DAH = height +
    retention (Teranode's). (Before: the preservation was only cleared, the record never due.)"""
    tn.set_block_height(100)
    tn.create(fx.tx, 100, [BlockInfo(1, 100)])
    tn.preserve_transactions([fx.tx.txid], 500)
    assert tn.process_expired_preservations(499) == 0
    assert tn.process_expired_preservations(500) == 1
    m = tn.get(fx.tx.txid)
    assert m.preserve_until is None and m.delete_at_height == 500 + RETENTION


def test_going_off_the_longest_chain_clears_the_dah(tn: UtxoStore, fx: Fixture) -> None:
    """A reorg that takes the record's block away (marked off the chain, then unset) clears its
    DAH: an unmined record is not pruned."""
    tn.set_block_height(100)
    tn.create(fx.tx, 100, [BlockInfo(1, 100)])
    tn.spend_many([child((fx.tx, v)) for v in range(5)], 101)
    assert tn.get(fx.tx.txid).delete_at_height == 101 + RETENTION
    tn.mark_on_longest_chain([fx.tx.txid], False)
    assert tn.get(fx.tx.txid).delete_at_height == 101 + RETENTION  # the mark leaves it (Teranode)
    tn.set_mined_multi([fx.tx.txid], 1, 100, unset=True, on_longest_chain=False)
    m = tn.get(fx.tx.txid)
    assert m.block_ids == [] and m.unmined_since is not None and m.delete_at_height is None


def test_unlocking_sets_the_dah_again(tn: UtxoStore, fx: Fixture) -> None:
    """Locking removes the DAH; unlocking applies the rule again. A deliberate difference from
    Teranode, whose unlock leaves it unset (docs/architecture.md): a fully spent mined record locked
    by a conflict swap and unlocked again would never be pruned."""
    tn.set_block_height(100)
    tn.create(fx.tx, 100, [BlockInfo(1, 100)])
    tn.spend_many([child((fx.tx, v)) for v in range(5)], 101)
    tn.set_locked([fx.tx.txid], True)
    assert tn.get(fx.tx.txid).delete_at_height is None
    tn.set_block_height(110)
    tn.set_locked([fx.tx.txid], False)
    assert tn.get(fx.tx.txid).delete_at_height == 110 + RETENTION


def test_get_spend_precedence(tn: UtxoStore, fx: Fixture) -> None:
    """GetSpend's precedence: LOCKED > CONFLICTING > FROZEN > IMMATURE (reassigned) > SPENT.
    (Before: a reassigned output said FROZEN.)"""
    tn.set_block_height(100)
    tn.create(fx.tx, 100)
    new = b"\x55" * 32
    tn.freeze([((fx.tx.txid, 0), uhash(fx.tx, 0)), ((fx.tx.txid, 1), uhash(fx.tx, 1))])
    tn.reassign((fx.tx.txid, 1), uhash(fx.tx, 1), new)
    tn.spend(child((fx.tx, 2)), 101)
    ask = [((fx.tx.txid, 0), uhash(fx.tx, 0)), ((fx.tx.txid, 1), new), ((fx.tx.txid, 2), uhash(fx.tx, 2))]

    def statuses() -> list[SpendStatus]:
        return [tn.get_spend(op, h).status for op, h in ask]

    assert statuses() == [SpendStatus.FROZEN, SpendStatus.IMMATURE, SpendStatus.SPENT]
    tn.set_conflicting([fx.tx.txid], True)
    assert statuses() == [SpendStatus.CONFLICTING] * 3
    tn.set_locked([fx.tx.txid], True)
    assert statuses() == [SpendStatus.LOCKED] * 3


def test_freezing_a_frozen_output_is_already_frozen(tn: UtxoStore, fx: Fixture) -> None:
    """freeze on a frozen output: ALREADY_FROZEN (before: success); unfreeze of an unfrozen one:
    UTXO_NOT_FROZEN."""
    from stores.utxo import UtxoAlreadyFrozen

    tn.create(fx.tx, 100)
    item = [((fx.tx.txid, 0), uhash(fx.tx, 0))]
    assert tn.freeze(item) == [None]
    (again,) = tn.freeze(item)
    assert isinstance(again, UtxoAlreadyFrozen) and again.code == "UTXO_ALREADY_FROZEN"
    assert tn.unfreeze(item) == [None]
    assert isinstance(tn.unfreeze(item)[0], UtxoNotFrozen)


def test_ignore_flags(tn: UtxoStore, fx: Fixture) -> None:
    """Spend's IgnoreFlags: ignoring conflicting (or locked) spends from a conflicting (or
    locked) parent; neither ignores a frozen output; `creating` is never ignored."""
    from stores.utxo import Ignore

    tn.create(fx.tx, 100, conflicting=True)
    assert isinstance(rejected(tn, fx.spend, 101)[0], TxConflicting)
    with pytest.raises(SpendRejected):
        tn.spend(fx.spend, 101, ignore=Ignore(locked=True))
    assert tn.spend(fx.spend, 101, ignore=Ignore(conflicting=True))[0].spending_txid == fx.spend.txid
    other = child((fx.parent, 0), n_outputs=2)
    tn.create(other, 100, locked=True)
    tn.freeze([((other.txid, 1), uhash(other, 1))])
    assert tn.spend(child((other, 0)), 101, ignore=Ignore(locked=True))
    with pytest.raises(SpendRejected) as e:
        tn.spend(child((other, 1)), 101, ignore=Ignore(conflicting=True, locked=True))
    assert isinstance(only(e.value), UtxoFrozen)


def test_unset_mined_clears_locked(tn: UtxoStore, fx: Fixture) -> None:
    """setMined clears `locked` whether it sets or unsets a block. (Before: unset kept it.)"""
    tn.create(fx.tx, 100, [BlockInfo(1, 100)])
    tn.set_locked([fx.tx.txid], True)
    tn.set_mined_multi([fx.tx.txid], 1, 100, unset=True)
    assert not tn.get(fx.tx.txid).locked


def test_a_spend_whose_parent_was_pruned_is_blessed(tn: UtxoStore, fx: Fixture) -> None:
    """Teranode's "already blessed": an input whose parent record is gone is no error when the
    spending tx's own record exists (it spent long ago, its parent was pruned since): the input
    is left out of the spends, the others are made. Without its own record, TxNotFound."""
    tn.set_block_height(100)
    tn.create(fx.tx, 100)
    old = child((fx.parent, 0), (fx.tx, 1))  # its first parent is not in the store
    tn.create(old, 100)
    spends = tn.spend(old, 101)
    assert [(s.txid, s.vout) for s in spends] == [(fx.tx.txid, 1)]
    stranger = child((fx.parent, 1), (fx.tx, 2))
    assert isinstance(rejected(tn, stranger, 101)[0], TxNotFound)
    tn.set_conflicting([old.txid], True)  # a conflicting record's spends were taken back: no blessing
    assert isinstance(rejected(tn, old, 101)[0], TxNotFound)


def test_a_blessed_spend_keeps_its_place_in_a_batch(tn: UtxoStore, fx: Fixture) -> None:
    """In one call, a blessed spend (a parent gone, its own record there) that shares an output
    with a later transaction still goes first and wins it; a transaction alone in the call is
    spent beside them, and one without a record of its own is refused for its gone parent."""
    tn.set_block_height(100)
    tn.create(fx.tx, 100)
    blessed = child((fx.parent, 0), (fx.tx, 1))  # fx.parent is not in the store
    tn.create(blessed, 100)
    later = child((fx.tx, 1), n_outputs=1)  # wants the output the blessed one spends
    alone = child((fx.tx, 3), n_outputs=1)
    stranger = child((fx.parent, 1), (fx.tx, 4))  # gone parent, no record of its own
    r = tn.spend_many([blessed, later, alone, stranger], 101)
    assert isinstance(r[0], list) and [(s.txid, s.vout) for s in r[0]] == [(fx.tx.txid, 1)]
    assert isinstance(r[1], SpendRejected)
    assert isinstance(r[2], list) and [(s.txid, s.vout) for s in r[2]] == [(fx.tx.txid, 3)]
    assert isinstance(r[3], SpendRejected)
    assert any(isinstance(e, TxNotFound) for _vin, e in r[3].errors)
    out = tn.get_output((fx.tx.txid, 4))
    assert out is not None and out.spending_txid is None  # the refused one took nothing
    assert tn.get_output((fx.tx.txid, 1)).spending_txid == blessed.txid  # type: ignore[union-attr]


def test_unspend_refuses_a_frozen_output(tn: UtxoStore, fx: Fixture) -> None:
    """unspend of a frozen output: UTXO_FROZEN; the output stays frozen."""
    tn.create(fx.tx, 100)
    tn.freeze([((fx.tx.txid, 0), uhash(fx.tx, 0))])
    (err,) = tn.unspend([Spend(fx.tx.txid, 0, uhash(fx.tx, 0), fx.spend.txid, 0)])
    assert isinstance(err, UtxoFrozen)
    assert tn.get_output((fx.tx.txid, 0)).frozen  # type: ignore[union-attr]
