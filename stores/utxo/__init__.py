"""The UTXO store: records, errors, the Protocol, and backends chosen by URL.

`open_utxo_store(url)` is the entry point; `sqlite.py` and `postgresql.py` are the backends.
"""

from stores.utxo.errors import (
    ProcessingError,
    SpendRejected,
    StorageError,
    TxCoinbaseImmature,
    TxConflicting,
    TxCreating,
    TxExists,
    TxLocked,
    TxNotFound,
    UtxoError,
    UtxoFrozen,
    UtxoMismatch,
    UtxoNotFound,
    UtxoSpent,
)
from stores.utxo.factory import open_utxo_store
from stores.utxo.protocol import UtxoStore
from stores.utxo.records import (
    BlockInfo,
    OutputInfo,
    Spend,
    SpendInfo,
    SpendStatus,
    TxMeta,
    Utxo,
    UtxoStats,
)

__all__ = [
    "BlockInfo",
    "OutputInfo",
    "ProcessingError",
    "Spend",
    "SpendInfo",
    "SpendRejected",
    "SpendStatus",
    "StorageError",
    "TxCoinbaseImmature",
    "TxConflicting",
    "TxCreating",
    "TxExists",
    "TxLocked",
    "TxMeta",
    "TxNotFound",
    "Utxo",
    "UtxoError",
    "UtxoFrozen",
    "UtxoMismatch",
    "UtxoNotFound",
    "UtxoSpent",
    "UtxoStats",
    "UtxoStore",
    "open_utxo_store",
]
