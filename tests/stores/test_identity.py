"""`UtxoStore.identity` on every backend: made on the first ask and kept for good (reopened, asked
by two processes' stores at once: one id), and another store's is another id. The state store
pairs with it (`workers.chainstate.pairing`: tests/pipeline/test_pairing.py). And what the store, not its
URL, tells the pipeline: whether `fused` is one transaction; its backend's own batch size."""

from __future__ import annotations

import threading
from pathlib import Path

from stores.utxo import UtxoStore, open_utxo_store


def test_identity_is_made_once_and_kept(store: UtxoStore, store_url: str, tmp_path: Path) -> None:
    others = [open_utxo_store(store_url, blob_url=f"file://{tmp_path}/blobs") for _ in range(4)]
    try:
        got: list[str] = []
        threads = [threading.Thread(target=lambda s=s: got.append(s.identity())) for s in others]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(set(got)) == 1 and len(got[0]) == 32, got  # racing first asks agree
        assert store.identity() == got[0]
    finally:
        for s in others:
            s.close()
    again = open_utxo_store(store_url, blob_url=f"file://{tmp_path}/blobs")
    try:
        assert again.identity() == got[0]
    finally:
        again.close()


def test_another_store_has_another_identity(store: UtxoStore, tmp_path: Path) -> None:
    other = open_utxo_store(f"sqlite:///{tmp_path}/other.db", blob_url=f"file://{tmp_path}/blobs")
    try:
        assert other.identity() != store.identity()
    finally:
        other.close()


def test_a_store_says_whether_fused_makes_one_transaction(store: UtxoStore, store_url: str) -> None:
    """The sequencer asks the store (`fuses`), never its URL, whether blocks can share one
    transaction: SQLite's single writer can; PostgreSQL's and Aerospike's `fused` is a no-op."""
    assert store.fuses is store_url.startswith("sqlite:")


def test_the_factory_gives_a_backends_own_batch_size() -> None:
    from stores.utxo.aerospike.codec import DEFAULT_BATCH_SIZE
    from stores.utxo.factory import default_batch_size
    from workers.settings import load_settings

    assert default_batch_size("aerospike://h:3000/ns") == DEFAULT_BATCH_SIZE
    assert default_batch_size("sqlite:///x.db") is None
    assert load_settings(store_url="aerospike://h:3000/ns").batch_size == DEFAULT_BATCH_SIZE
    assert load_settings(store_url="aerospike://h:3000/ns", batch_size=7).batch_size == 7
