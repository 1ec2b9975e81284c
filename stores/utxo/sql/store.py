"""The SQL UTXO store: every concern of the Protocol over one `stores.sqldb.Database`, each in
its own module, layered (each may use those below it):

    snapshot.py   seeding from a UTXO snapshot
    create.py     creating records (one-record, external, multi-record)
    spend.py      spends, unspends, freeze / unfreeze / reassign
    read.py       records, outputs, GetSpend, the UTXO views
    marks.py      block membership, longest chain, locked, conflicting, preservation, pruning
    paged.py      the record-level calls of two-phase creation
    locks.py      creation lock rows
    base.py       records under lock, written back; the store's height and schema
    codec.py      the one mapping between rows and `Record`s

A backend module (`sqlite.py`, `postgresql.py`) adds what its database does its own way: the
schema's options and how `txs.id` values are reserved.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import Any

from stores.blob.protocol import BlobStore
from stores.errors import StorageError
from stores.sqldb import Database
from stores.utxo.errors import ProcessingError
from stores.utxo.external import ExternalTxs
from stores.utxo.prevouts import RecentOutputs
from stores.utxo.sql.snapshot import SnapshotMixin


class SqlUtxoStore(SnapshotMixin):
    """Implements `stores.utxo.protocol.UtxoStore`; a backend module supplies its dialect."""

    pragmas: Sequence[str] = ()
    # newest records the script index may leave to the query's scan of them (`sql/scriptindex.py`):
    # only where one writer works at a time (SQLite); 0 is an index kept as records change
    default_index_lag = 0

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
        index_lag: int | None = None,
    ) -> None:
        """`create=False` opens an existing store only (for readers): a URL that names no store
        is then a StorageError, instead of a new, empty store appearing there.

        External transactions go to `blobs`, or to the blob store at `blob_url`; with neither,
        a transaction that must be external is refused with a StorageError. `batch_size` is
        fixed when the store is created (it decides where outputs live); `retention` 0 means
        records are never pruned."""
        if batch_size <= 0:
            raise ValueError(f"batch_size must be positive, got {batch_size}")
        if retention < 0:
            raise ValueError(f"retention must be 0 (never prune) or more, got {retention}")
        self.url = url
        self.retention = retention
        self.batch_size = batch_size
        self.max_tx_size_in_store = max_tx_size_in_store
        self.externalize_all = externalize_all
        self.lock_base_ttl = lock_base_ttl
        self.lock_per_record_ttl = lock_per_record_ttl
        self.lock_max_ttl = lock_max_ttl
        self.may_create = create
        self.index_lag = self.default_index_lag if index_lag is None else index_lag
        if self.index_lag and not self.default_index_lag:
            raise ValueError(f"index_lag needs one writer at a time (SQLite), not {url.split(':', 1)[0]}")
        self.block_height = 0
        self.recent = RecentOutputs()
        self.db = Database(
            url, what="UTXO store", create=create, pragmas=self.pragmas, invalid=ProcessingError
        )
        self.fuses = self.db.dialect == "sqlite"  # `fused`: one writer at a time, one transaction
        try:
            self.db.write("create schema", self._schema, idempotent=True)  # IF NOT EXISTS, throughout
            self.block_height = self.db.read("read block height", self._stored_height)
        except BaseException:
            self.db.close()
            raise
        self.external = ExternalTxs(blobs, external_cache_bytes, blob_url)

    def _schema(self, cur: Any) -> None:
        raise NotImplementedError  # the backend's: DDL with its options, then `_check_schema`

    def _no_store(self) -> StorageError:
        return StorageError(f"no UTXO store at {self.url_safe}")

    @property
    def concurrent_writers(self) -> bool:
        return self.db.dialect != "sqlite"

    def fused(self) -> AbstractContextManager[None]:
        """Everything inside in one write transaction where the database has one writer at a
        time (SQLite: `Database.held`); elsewhere a no-op."""
        return self.db.held()

    def close(self) -> None:
        self.db.close()
        self.external.close()
