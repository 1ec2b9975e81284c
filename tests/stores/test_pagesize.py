"""Conformance: a store keeps the page size (outputs per record, UTXO_BATCH_SIZE) it was created
with, on every backend. Opened again with another, it uses its own — a warning names both, never
an error — so that a reader or a worker need not know how the store was made
(stores/utxo/pagesize.py)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from stores.utxo import SpendStatus, open_utxo_store
from tests.aerospike_server import needs_aerospike
from tests.stores.conftest import PAGE
from tests.stores.helpers import child, uhash
from tests.stores.test_twophase import N_OUT, big_tx, real_vouts


@pytest.mark.parametrize("other", [PAGE + 3, 20000])
def test_a_store_opened_with_another_page_size_uses_its_own(
    store_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture, other: int
) -> None:
    blobs = f"file://{tmp_path}/blobs"
    store = open_utxo_store(store_url, batch_size=PAGE, blob_url=blobs)
    try:
        tx = big_tx(store)  # 10 outputs: three records of PAGE
        assert store.create(tx, 100).total_extra_recs == 2
    finally:
        store.close()
    with caplog.at_level(logging.WARNING, logger="utxoflow.store"):
        for create in (True, False):  # a worker's open, a reader's
            again = open_utxo_store(store_url, batch_size=other, blob_url=blobs, create=create)
            try:
                assert again.batch_size == PAGE
                outs = again.get_outputs([(tx.txid, v) for v in range(N_OUT)])
                assert sorted(v for _t, v in outs) == real_vouts(tx)
                assert all(outs[(tx.txid, v)].utxo_hash == uhash(tx, v) for v in real_vouts(tx))
            finally:
                again.close()
    warned = [r.getMessage() for r in caplog.records if r.name == "utxoflow.store"]
    # once per process, however often it opens the store (a worker reopens it; its log stays readable)
    assert len(warned) == 1 and f"UTXO_BATCH_SIZE={PAGE}" in warned[0] and str(other) in warned[0]

    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="utxoflow.store"):
        again = open_utxo_store(store_url, batch_size=other, blob_url=blobs)
        try:  # spends on the last record land where the store put the outputs
            spender = child((tx, 0), (tx, N_OUT - 1))
            assert [s.vout for s in again.spend(spender, 101)] == [0, N_OUT - 1]
            assert again.get_spend((tx.txid, N_OUT - 1), uhash(tx, N_OUT - 1)).status is SpendStatus.SPENT
            assert again.get(tx.txid).spent_utxos == 2
        finally:
            again.close()
        same = open_utxo_store(store_url, batch_size=PAGE, blob_url=blobs)
        same.close()
    assert not any("UTXO_BATCH_SIZE" in r.getMessage() for r in caplog.records)  # said once already


@pytest.mark.parametrize("store_url", [pytest.param("aerospike", marks=needs_aerospike)], indirect=True)
def test_aerospike_refuses_a_new_store_of_pages_it_cannot_hold(store_url: str, tmp_path: Path) -> None:
    """Its cap (a record holds batch_size 68-byte slots, under 1 MiB) binds a new store only: an
    existing one is opened with any setting (above)."""
    with pytest.raises(ValueError, match=r"UTXO_BATCH_SIZE.*1 to 8192 on Aerospike, got 8193"):
        open_utxo_store(store_url, batch_size=8193, blob_url=f"file://{tmp_path}/blobs")
    store = open_utxo_store(store_url, batch_size=8192, blob_url=f"file://{tmp_path}/blobs")
    try:  # (nothing of the refused one was left behind: this one is new, at the cap)
        assert store.batch_size == 8192
    finally:
        store.close()
