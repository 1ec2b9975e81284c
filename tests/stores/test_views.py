"""Conformance: the confirmed-UTXO view and its totals (every backend)."""

from __future__ import annotations

from stores.utxo import BlockInfo, UtxoStore
from tests.stores.helpers import child, created, funding


def _keys(store: UtxoStore, **kw: object) -> set[tuple[bytes, int]]:
    return {(u.txid, u.vout) for u in store.iter_utxos(**kw)}  # type: ignore[arg-type]


def test_confirmed_view_follows_the_contract(store: UtxoStore) -> None:
    mined = funding(3)
    unmined = funding(1)
    created(store, mined, height=50, mined=True)
    created(store, unmined, height=50)
    by_mined = child((mined, 0))
    by_unmined = child((mined, 1))
    created(store, by_mined, by_unmined, height=51)
    store.spend_many([by_mined, by_unmined], 51)
    store.set_mined_multi([by_mined.txid], 2, 51)
    confirmed = _keys(store)
    # spent by a mined tx: gone; spent by an unmined tx: still confirmed; unmined outputs: absent
    assert confirmed == {(mined.txid, 1), (mined.txid, 2), (by_mined.txid, 0)}
    utxo = {(u.txid, u.vout): u for u in store.iter_utxos()}
    assert utxo[(mined.txid, 2)].height == 50 and not utxo[(mined.txid, 2)].coinbase
    assert utxo[(by_mined.txid, 0)].height == 51
    assert utxo[(mined.txid, 2)].satoshis == mined.outputs[2].satoshis
    assert utxo[(mined.txid, 2)].script == mined.outputs[2].script
    everything = _keys(store, confirmed=False)
    assert everything == {(mined.txid, 2), (unmined.txid, 0), (by_mined.txid, 0), (by_unmined.txid, 0)}
    s = store.stats()
    assert s.utxos == 3 and s.txs == 2
    assert s.satoshis == mined.outputs[1].satoshis + mined.outputs[2].satoshis + by_mined.outputs[0].satoshis


def test_conflicting_and_unset_mined_leave_the_view(store: UtxoStore) -> None:
    a, b = funding(1), funding(1)
    store.create(a, 10, [BlockInfo(1, 10)])
    store.create(b, 10, [BlockInfo(1, 10)])
    store.set_conflicting([a.txid], True)
    store.set_mined_multi([b.txid], 1, 10, unset=True)
    assert _keys(store) == set()
    store.set_mined_multi([b.txid], 2, 11)
    assert _keys(store) == {(b.txid, 0)}


def test_filter_by_script(store: UtxoStore) -> None:
    f = funding(3)
    created(store, f, mined=True)
    target = f.outputs[1].script
    assert [(u.txid, u.vout) for u in store.iter_utxos(script=target)] == [(f.txid, 1)]
    assert list(store.iter_utxos(script=b"\x00\x01")) == []


def test_view_streams_many_utxos_in_order(store: UtxoStore) -> None:
    txs = [funding(50) for _ in range(40)]
    created(store, *txs, mined=True)
    seen = [(u.txid, u.vout) for u in store.iter_utxos()]
    assert len(seen) == 2000 and len(set(seen)) == 2000
    assert {t for t, _v in seen} == {t.txid for t in txs}
    assert store.stats().utxos == 2000


def test_a_pruned_spender_still_counts_as_confirmed(store: UtxoStore) -> None:
    store.set_block_height(10)
    p = funding(2)
    store.create(p, 10, [BlockInfo(1, 10)])
    c = child((p, 0))
    store.create(c, 11, [BlockInfo(2, 11)])
    store.spend(c, 11)
    d = child((c, 0))
    store.create(d, 12, [BlockInfo(3, 12)])
    store.spend(d, 12)
    due = store.query_dah(12 + 288)
    assert due == [c.txid]  # c is fully spent and mined: prunable before its partly spent parent
    assert store.delete_expired(due, 12 + 288) == 1
    assert {(u.txid, u.vout) for u in store.iter_utxos()} == {(p.txid, 1), (d.txid, 0)}
    assert store.stats().utxos == 2


def test_in_memory_sqlite_lists_too() -> None:
    from stores.utxo import open_utxo_store

    s = open_utxo_store("sqlite:///:memory:")
    f = funding(2)
    created(s, f, mined=True)
    assert len(list(s.iter_utxos())) == 2
    s.close()


def test_a_spender_the_store_does_not_hold_yet_confirms_nothing(store: UtxoStore) -> None:
    """A mempool transaction is spent before its record is written (and a worker may die between
    the two): until a block mines it, the output it spends stays in the confirmed set."""
    p = funding(2)
    created(store, p, height=10, mined=True)
    c = child((p, 0))
    store.spend(c, 11)  # spent; c's record not written (yet)
    assert _keys(store) == {(p.txid, 0), (p.txid, 1)}
    assert _keys(store, confirmed=False) == {(p.txid, 1)}
    created(store, c, height=11)  # written, unmined
    assert _keys(store) == {(p.txid, 0), (p.txid, 1)}
    store.set_mined_multi([c.txid], 2, 12)
    assert _keys(store) == {(p.txid, 1), (c.txid, 0)}
