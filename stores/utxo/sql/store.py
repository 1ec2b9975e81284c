"""The SQL UTXO store: the operations of every concern, over a dialect's hooks."""

from __future__ import annotations

from stores.blob.protocol import BlobStore
from stores.utxo.external import ExternalTxs
from stores.utxo.sql.create import ImportMixin, RecentOutputs
from stores.utxo.sql.locks import LockMixin
from stores.utxo.sql.read import ReadMixin
from stores.utxo.sql.spend import SpendMixin
from stores.utxo.sql.state import StateMixin


class SqlUtxoStore(ImportMixin, SpendMixin, StateMixin, ReadMixin, LockMixin):
    """Implements `stores.utxo.protocol.UtxoStore`; a backend module supplies the dialect hooks."""

    def __init__(
        self,
        url: str,
        *,
        retention: int = 288,
        batch_size: int = 20000,
        lock_base_ttl: float = 30.0,
        lock_per_record_ttl: float = 2.0,
        lock_max_ttl: float = 300.0,
        create: bool = True,
        blob_url: str | None = None,
        blobs: BlobStore | None = None,
        max_tx_size_in_store: int = 1 << 20,
        externalize_all: bool = False,
        external_cache_bytes: int = 64 << 20,
    ) -> None:
        """`create=False` opens an existing store only (for readers): a URL that names no store
        is then a StorageError, instead of a new, empty store appearing there.

        External transactions go to `blobs`, or to the blob store at `blob_url`; with neither,
        a transaction that must be external is refused with a StorageError. `batch_size` is
        fixed when the store is created (it decides where outputs live)."""
        if batch_size <= 0:
            raise ValueError(f"batch_size must be positive, got {batch_size}")
        self.url = url
        self.retention = retention
        self.batch_size = batch_size
        self.max_tx_size_in_store = max_tx_size_in_store
        self.externalize_all = externalize_all
        self.external = ExternalTxs(blobs, external_cache_bytes, blob_url)
        self.lock_base_ttl = lock_base_ttl
        self.lock_per_record_ttl = lock_per_record_ttl
        self.lock_max_ttl = lock_max_ttl
        self.may_create = create
        self.block_height = 0
        self.recent = RecentOutputs()

    def close_blobs(self) -> None:
        self.external.close()
