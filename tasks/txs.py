"""Transaction tasks (queue `txs`): mempool transactions, created and spent as unmined."""

from __future__ import annotations

import logging
from typing import Any

from celery import Task

from chain import hex_to_hash, parse_tx
from stores.blob.protocol import blob_key
from stores.errors import StorageError, StoreError
from stores.utxo import SpendRejected, TxExists, TxLocked, TxNotFound, UtxoError
from workers.app import app
from workers.services import services

log = logging.getLogger("utxoflow.tasks")
PARENT_RETRIES = 20  # a tx whose parents have not arrived waits this many times, then is reported


@app.task(name="utxoflow.tx.arrived", bind=True, max_retries=None)
def tx_arrived(self: Task, txid: str, ident: str) -> dict[str, Any]:
    """Spend the tx's inputs, then create its record (both idempotent). A tx whose parents
    are not in the store yet is retried, within a bound, then reported."""
    try:
        svc = services()  # (first call in a process: opens the stores, which may fail)
        tx = parse_tx(svc.blobs.get(blob_key(hex_to_hash(txid), "tx")))
        height = svc.utxo.current_height()  # unmined since the tip; it spends as the next block would
        (spent,) = svc.utxo.spend_many([tx], height + 1) if not tx.is_coinbase else ([],)
        if isinstance(spent, UtxoError):
            # a parent not here yet, or locked a moment (a block's conflict swap): try again
            waiting = isinstance(spent, SpendRejected) and all(
                isinstance(e, (TxNotFound, TxLocked)) for _v, e in spent.errors
            )
            if waiting and self.request.retries < PARENT_RETRIES:
                raise self.retry(countdown=min(0.5 * 2 ** self.request.retries, 30))
            log.warning("tx %s rejected: %s", txid, spent)
            svc.registry.done(ident)
            return {"txid": txid, "status": "rejected", "reason": str(spent)}
        (made,) = svc.utxo.create_many([tx], height)
        if isinstance(made, StoreError) and not isinstance(made, TxExists):
            raise made
    except StorageError as e:
        log.warning("tx %s: %s (will retry)", txid, e)
        raise self.retry(countdown=min(2 ** min(self.request.retries, 4), 10)) from e
    svc.registry.done(ident)
    return {"txid": txid, "status": "accepted"}
