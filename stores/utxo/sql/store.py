"""The SQL UTXO store: the operations of every concern, over a dialect's hooks."""

from __future__ import annotations

from stores.utxo.sql.create import ImportMixin
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
    ) -> None:
        """`create=False` opens an existing store only (for readers): a URL that names no store
        is then a StorageError, instead of a new, empty store appearing there."""
        self.url = url
        self.retention = retention
        self.batch_size = batch_size
        self.lock_base_ttl = lock_base_ttl
        self.lock_per_record_ttl = lock_per_record_ttl
        self.lock_max_ttl = lock_max_ttl
        self.may_create = create
        self.block_height = 0
