"""Conformance: `fused` — every write inside one transaction where the backend has one writer
(SQLite), committed at the end or not at all; each call inside all-or-nothing as ever; a
no-op elsewhere (every backend: the observable results are the same, only atomicity differs)."""

from __future__ import annotations

from pathlib import Path

import pytest

from stores.utxo import TxExists, UtxoStore, open_utxo_store
from tests.stores.helpers import child, created, funding


def test_writes_inside_are_seen_inside_and_kept_after(store: UtxoStore) -> None:
    a, b = funding(), funding()
    c = child((a, 0))
    with store.fused():
        created(store, a)
        assert store.existing([a.txid]) == {a.txid}  # a read inside sees the write before it
        store.spend_many([c], 101)
        created(store, b)
    assert store.existing([a.txid, b.txid]) == {a.txid, b.txid}
    assert store.get_outputs([(a.txid, 0)])[(a.txid, 0)].spending_txid == c.txid


def test_a_refused_call_inside_changes_nothing_of_its_own(store: UtxoStore) -> None:
    a = funding()
    with store.fused():
        created(store, a)
        (again,) = store.create_many([a], 100)  # refused: the rest of the transaction stands
        assert isinstance(again, TxExists)
        created(store, funding())
    assert store.existing([a.txid]) == {a.txid}


def test_an_error_out_of_it_keeps_nothing_on_sqlite(store: UtxoStore, store_url: str) -> None:
    a, b = funding(), funding()
    created(store, a)
    with pytest.raises(RuntimeError), store.fused():
        created(store, b)
        store.spend_many([child((a, 0))], 101)
        raise RuntimeError("the worker dies here")
    if store_url.startswith("sqlite"):  # one transaction: none of it happened
        assert store.existing([a.txid, b.txid]) == {a.txid}
        assert store.get_outputs([(a.txid, 0)])[(a.txid, 0)].spending_txid is None
    else:  # a no-op: each call committed on its own
        assert store.existing([a.txid, b.txid]) == {a.txid, b.txid}


def test_nothing_inside_is_seen_by_another_sqlite_connection_before_the_end(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/utxo.db"
    store = open_utxo_store(url, retention=288, blob_url=f"file://{tmp_path}/blobs")
    other = open_utxo_store(url, retention=288, blob_url=f"file://{tmp_path}/blobs")
    try:
        a = funding()
        with store.fused():
            created(store, a)
            assert other.existing([a.txid]) == set()
        assert other.existing([a.txid]) == {a.txid}
    finally:
        other.close()
        store.close()
