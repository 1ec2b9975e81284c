"""Conformance: creating records and reading them back (every backend)."""

from __future__ import annotations

from pathlib import Path

import pytest

from chain import Tx
from chain.build import build_tx
from stores.utxo import (
    BlockInfo,
    ProcessingError,
    TxExists,
    TxNotFound,
    Utxo,
    UtxoStore,
    open_utxo_store,
)
from tests.stores.helpers import child, coinbase, created, funding, script, uhash


def test_create_returns_metadata_and_get_reads_it_back(store: UtxoStore) -> None:
    f = funding(3)
    meta = store.create(f, 100)
    assert meta.txid == f.txid
    assert meta.fee == 1000
    assert meta.size_in_bytes == len(f.raw)
    assert not meta.is_coinbase
    assert meta.inpoints == [(f.inputs[0].prev_txid, 0)]
    assert meta.unmined_since == 100 and not meta.block_ids
    assert meta.total_utxos == 3 and meta.spent_utxos == 0
    got = store.get(f.txid)
    assert got.fee == 1000 and got.unmined_since == 100 and got.total_utxos == 3
    assert got.tx is not None and got.tx.raw == f.raw and got.tx.txid == f.txid
    assert got.inpoints == meta.inpoints
    assert not (got.locked or got.creating or got.conflicting or got.external)
    assert got.delete_at_height is None and got.preserve_until is None


def test_duplicate_create_is_tx_exists_and_changes_nothing(store: UtxoStore) -> None:
    f = funding()
    store.create(f, 100)
    with pytest.raises(TxExists) as e:
        store.create(f, 200, [BlockInfo(7, 200)])
    assert e.value.txid == f.txid and e.value.code == "TX_EXISTS"
    got = store.get(f.txid)
    assert got.unmined_since == 100 and got.block_ids == []


def test_create_many_reports_per_tx_and_keeps_the_rest(store: UtxoStore) -> None:
    a, b = funding(), funding()
    store.create(a, 100)
    res = store.create_many([a, b, b], 100)
    assert isinstance(res[0], TxExists)
    assert not isinstance(res[1], Exception) and res[1].txid == b.txid
    assert isinstance(res[2], TxExists)
    assert store.get(b.txid).total_utxos == 2


def test_created_with_mined_block_infos_is_mined(store: UtxoStore) -> None:
    f = funding()
    meta = store.create(f, 100, [BlockInfo(5, 100, 3)])
    assert meta.unmined_since is None
    got = store.get(f.txid)
    assert (got.block_ids, got.block_heights, got.subtree_idxs) == ([5], [100], [3])


def test_coinbase_matures_at_height_plus_100(store: UtxoStore) -> None:
    cb = coinbase(500)
    meta = store.create(cb, 500, [BlockInfo(1, 500)])
    assert meta.is_coinbase and meta.fee == 0 and meta.spending_height == 600


def test_no_outputs_is_refused(store: UtxoStore) -> None:
    f = funding()
    empty = build_tx([f.inputs[0]], [])
    with pytest.raises(ProcessingError):
        store.create(empty, 100)
    with pytest.raises(TxNotFound):
        store.get(empty.txid)


def test_data_carriers_get_no_utxo_slot(store: UtxoStore) -> None:
    f = funding(1)
    tx = build_tx(
        [f.inputs[0]],
        [(0, b"\x6a\x04data"), (1000, script()), (0, b"\x00\x6a\x02hi"), (0, script())],
    )
    meta = store.create(tx, 100)
    assert meta.total_utxos == 2  # the zero-value P2PKH is odd but a real slot; carriers are not
    assert store.get_output((tx.txid, 0)) is None
    assert store.get_output((tx.txid, 2)) is None
    assert store.get_output((tx.txid, 1)) is not None
    assert store.get_output((tx.txid, 3)) is not None


def test_fee_of_a_standard_tx_comes_from_the_store_or_the_batch(store: UtxoStore) -> None:
    f = funding(2, value=10_000)
    created(store, f)
    a = child((f, 0), fee=300)
    # strip the extended data: the store must look the parent output up itself
    for i in a.inputs:
        i.prev_satoshis = None
        i.prev_script = None
    b = child((a, 0), fee=200)
    for i in b.inputs:
        i.prev_satoshis = None
        i.prev_script = None
    orphan = child((funding(1), 0), fee=100)
    for i in orphan.inputs:
        i.prev_satoshis = None
        i.prev_script = None
    res = store.create_many([a, b, orphan], 100)
    assert [r.fee for r in res] == [300, 200, None]  # type: ignore[union-attr]


def _standard(tx: Tx) -> Tx:
    for i in tx.inputs:
        i.prev_satoshis = None
        i.prev_script = None
    return tx


def test_fee_from_values_this_process_created_and_from_the_records(store: UtxoStore, store_url: str,
                                                                   tmp_path: Path) -> None:
    """A parent created earlier by this store object gives its values from memory (a block's
    txs spend the previous blocks'); one created by another process, from its record."""
    f = funding(2, value=10_000)
    created(store, f)
    assert store.create(_standard(child((f, 0), fee=300)), 100).fee == 300  # from memory
    other = open_utxo_store(store_url, retention=288, blob_url=f"file://{tmp_path}/blobs")
    try:
        assert other.create(_standard(child((f, 1), fee=70)), 100).fee == 70  # from the record
    finally:
        other.close()


def test_get_unknown_is_tx_not_found(store: UtxoStore) -> None:
    with pytest.raises(TxNotFound) as e:
        store.get(b"\x11" * 32)
    assert e.value.txid == b"\x11" * 32


def test_get_rejects_unknown_fields(store: UtxoStore) -> None:
    f = funding()
    created(store, f)
    assert store.get(f.txid, ["fee"]).fee == 1000
    with pytest.raises(ProcessingError):
        store.get(f.txid, ["no_such_field"])


def test_output_rows_carry_the_utxo_hash(store: UtxoStore) -> None:
    f = funding(2)
    created(store, f)
    out = store.get_output((f.txid, 1))
    assert out is not None
    assert out.utxo_hash == uhash(f, 1) and out.state == "unspent"
    assert out.satoshis == f.outputs[1].satoshis and out.script == f.outputs[1].script


def test_set_block_height_refuses_zero(store: UtxoStore) -> None:
    with pytest.raises(ProcessingError):
        store.set_block_height(0)
    store.set_block_height(1234)
    assert store.block_height == 1234


def _u(txid: bytes, vout: int, height: int = 5, coinbase: bool = False, sats: int = 1000) -> Utxo:
    return Utxo(txid, vout, sats, script(), height, coinbase)


def test_import_utxos_is_all_or_nothing(store: UtxoStore) -> None:
    assert store.is_empty()
    a, b = b"\x0a" * 32, b"\x0b" * 32
    assert store.import_utxos(iter([_u(a, 0), _u(a, 2), _u(b, 1, coinbase=True)])) == 3
    assert not store.is_empty()
    meta = store.get(a)
    assert meta.total_utxos == 2 and meta.block_heights == [5] and meta.unmined_since is None
    assert store.get_output((a, 1)) is None and store.get_output((a, 2)) is not None
    assert store.get(b).spending_height == 105
    c = b"\x0c" * 32
    with pytest.raises(TxExists):  # c is fine, but b exists: nothing of this call stays
        store.import_utxos([_u(c, 0), _u(b, 0)])
    with pytest.raises(TxNotFound):
        store.get(c)


def test_import_utxos_refuses_inconsistent_entries(store: UtxoStore) -> None:
    d = b"\x0d" * 32
    with pytest.raises(ProcessingError):
        store.import_utxos([_u(d, 0, height=5), _u(d, 1, height=6)])
    with pytest.raises(ProcessingError):
        store.import_utxos([_u(d, 0), _u(d, 0)])
    with pytest.raises(ProcessingError):
        store.import_utxos([_u(d, 2**32)])
    with pytest.raises(TxExists):  # the same txid again, further down the stream
        store.import_utxos([_u(d, 0), _u(b"\x0e" * 32, 0), _u(d, 1)])
    assert store.is_empty()


def test_import_sets_height_and_block_in_the_same_transaction(store: UtxoStore, store_url: str) -> None:
    from stores.utxo import open_utxo_store

    block = bytes(range(32))
    assert store.import_utxos([_u(b"\x0a" * 32, 0, height=90)], height=99, block_hash=block) == 1
    assert store.block_height == 99
    other = open_utxo_store(store_url)
    try:
        assert other.block_height == 99
    finally:
        other.close()
    with pytest.raises(TxExists):  # a failing import moves nothing, the height included
        store.import_utxos([_u(b"\x0b" * 32, 0), _u(b"\x0a" * 32, 1)], height=500, block_hash=block)
    again = open_utxo_store(store_url)
    try:
        assert again.block_height == 99
    finally:
        again.close()


def test_an_empty_snapshot_is_refused(store: UtxoStore) -> None:
    with pytest.raises(ProcessingError, match="no entries"):
        store.import_utxos([], height=10, block_hash=b"\x01" * 32)
    assert store.is_empty() and store.block_height == 0


def test_create_many_without_metadata_reports_errors_only(store: UtxoStore) -> None:
    """`meta=False` (block application's call): None per created tx, the error otherwise, and
    the records are the same as with metadata."""
    a, b = funding(2), funding(1)
    created(store, a)
    got = store.create_many([a, b, b], 100, meta=False)
    assert [type(r) for r in got] == [TxExists, type(None), TxExists]
    assert store.get(b.txid).total_utxos == 1 and store.get(b.txid).unmined_since == 100
