"""A mempool transaction applied to the UTXO store: its inputs spent as the next block would
spend them, then its record created unmined — what the `utxoflow.tx.arrived` task does and what
the recovery manager does again for a tx whose record never appeared.

Invariants: both steps are idempotent (the same spender again succeeds; a second create is
TxExists), so applying a tx twice, or after a crash between the steps, ends the same; a refused
spend leaves none of its own new spends behind (the store's all-or-nothing spend; on
Aerospike, but a slot a block's spend of the same tx holds meanwhile, and what an attempt that
died between the store's per-record calls left: stores/utxo/aerospike/rules.py).
"""

from __future__ import annotations

from chain import Tx
from stores.errors import StoreError
from stores.utxo import SpendRejected, TxExists, TxLocked, TxNotFound, UtxoError, UtxoStore


def apply_tx(utxo: UtxoStore, tx: Tx) -> UtxoError | bool:
    """Spend `tx`'s inputs and create its record; the spend's refusal, or, the tx being in the
    store, whether this call made its record (False: it was there: a redelivery, a tx sent
    twice). Raises StorageError when the store fails (nothing is then known)."""
    height = utxo.current_height()  # unmined since the tip; it spends as the next block would
    (spent,) = utxo.spend_many([tx], height + 1) if not tx.is_coinbase else ([],)
    if isinstance(spent, UtxoError):
        return spent
    (made,) = utxo.create_many([tx], height)
    if isinstance(made, TxExists):
        return False
    if isinstance(made, StoreError):
        raise made
    return True


def waiting_for_parents(refused: UtxoError) -> bool:
    """Whether a refusal may pass by itself: a parent not in the store yet, or locked a moment
    (a block's conflict swap) — not a double spend or a bad input."""
    return isinstance(refused, SpendRejected) and all(
        isinstance(e, (TxNotFound, TxLocked)) for _v, e in refused.errors
    )
