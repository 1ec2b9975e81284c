"""A mempool transaction applied to the UTXO store: its inputs spent as the next block would
spend them, then its record created unmined — what the `utxoflow.tx.arrived` task does and what
the recovery manager does again for a tx whose record never appeared.

Invariants: both steps are idempotent (the same spender again succeeds; a second create is
TxExists), so applying a tx twice, or after a crash between the steps, ends the same; a refused
spend leaves none of the tx's spends behind (the store's all-or-nothing spend) — but for the
spends an earlier attempt left on a store without multi-record transactions (Aerospike) when it
died between its per-record calls: the attempt after it finds them its own. Whoever learns that
the tx is refused for good (its task, the recovery manager) frees those (`release_leftovers`):
a tx refused for good with no record can own no spend.
"""

from __future__ import annotations

import logging

from chain import Tx
from stores.errors import StoreError
from stores.utxo import SpendRejected, TxExists, TxLocked, TxNotFound, UtxoError, UtxoStore
from stores.utxo.records import Spend

log = logging.getLogger("utxoflow.mempool")


def apply_tx(utxo: UtxoStore, tx: Tx) -> UtxoError | None:
    """Spend `tx`'s inputs and create its record; the spend's refusal, or None when the tx is
    in the store. Raises StorageError when the store fails (nothing is then known)."""
    height = utxo.current_height()  # unmined since the tip; it spends as the next block would
    (spent,) = utxo.spend_many([tx], height + 1) if not tx.is_coinbase else ([],)
    if isinstance(spent, UtxoError):
        return spent
    (made,) = utxo.create_many([tx], height)
    if isinstance(made, StoreError) and not isinstance(made, TxExists):
        raise made
    return None


def release_leftovers(utxo: UtxoStore, tx: Tx) -> int:
    """Free the spends `tx` still holds although it is refused for good and has no record (see
    the module); how many. Only its own are taken back (`unspend(own=True)`): an output that
    another has spent since stays spent."""
    if tx.is_coinbase or utxo.existing([tx.txid]):
        return 0
    ops = [(i.prev_txid, i.prev_vout) for i in tx.inputs]
    outs = utxo.get_outputs(ops)
    mine = [
        Spend(op[0], op[1], o.utxo_hash, tx.txid, vin)
        for vin, op in enumerate(ops)
        if (o := outs.get(op)) is not None and o.spending_txid == tx.txid and o.spending_vin == vin
    ]
    if not mine:
        return 0
    done = sum(r is None for r in utxo.unspend(mine, own=True))
    log.warning("tx %s, refused for good, held %d spend(s) an earlier attempt left: freed", tx.txid_hex, done)
    return done


def waiting_for_parents(refused: UtxoError) -> bool:
    """Whether a refusal may pass by itself: a parent not in the store yet, or locked a moment
    (a block's conflict swap) — not a double spend or a bad input."""
    return isinstance(refused, SpendRejected) and all(
        isinstance(e, (TxNotFound, TxLocked)) for _v, e in refused.errors
    )
