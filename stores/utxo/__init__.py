"""The UTXO store: the record kernel (`kernel/`, every rule of the data model), the Protocol,
errors, records, and backends chosen by URL (`open_utxo_store(url)`; `sqlite.py`, `postgresql.py`).
"""

from stores.utxo.errors import (
    InvalidSpend,
    ProcessingError,
    SpendRejected,
    StorageError,
    TxCoinbaseImmature,
    TxConflicting,
    TxCreating,
    TxExists,
    TxLocked,
    TxNotFound,
    UtxoAlreadyFrozen,
    UtxoError,
    UtxoFrozen,
    UtxoMismatch,
    UtxoNotFound,
    UtxoNotFrozen,
    UtxoSpent,
)
from stores.utxo.factory import open_utxo_store
from stores.utxo.kernel.spend import Ignore
from stores.utxo.protocol import UtxoStore
from stores.utxo.records import (
    BlockInfo,
    OutputInfo,
    Spend,
    SpendInfo,
    SpendStatus,
    Standing,
    TxMeta,
    Utxo,
    UtxoStats,
)

__all__ = [
    "BlockInfo",
    "Ignore",
    "InvalidSpend",
    "OutputInfo",
    "ProcessingError",
    "Spend",
    "SpendInfo",
    "SpendRejected",
    "SpendStatus",
    "Standing",
    "StorageError",
    "TxCoinbaseImmature",
    "TxConflicting",
    "TxCreating",
    "TxExists",
    "TxLocked",
    "TxMeta",
    "TxNotFound",
    "Utxo",
    "UtxoAlreadyFrozen",
    "UtxoError",
    "UtxoFrozen",
    "UtxoMismatch",
    "UtxoNotFound",
    "UtxoNotFrozen",
    "UtxoSpent",
    "UtxoStats",
    "UtxoStore",
    "open_utxo_store",
]
