"""Transaction tasks (queue `txs`): mempool transactions, created and spent as unmined."""

from __future__ import annotations

import logging
from typing import Any

from celery import Task

from chain import hex_to_hash, parse_tx
from stores.blob.protocol import blob_key
from stores.errors import StorageError
from stores.utxo import UtxoError
from workers.chainstate.mempool import apply_tx, rival, waiting_for_parents
from workers.ops import activity, metrics
from workers.runtime.app import app
from workers.runtime.outcome import Refused
from workers.runtime.services import services

log = logging.getLogger("utxoflow.tasks")
PARENT_RETRIES = 20  # a tx whose parents have not arrived waits this many times, then is reported


@app.task(name="utxoflow.tx.arrived", bind=True, max_retries=None, throws=(Refused,))
def tx_arrived(self: Task, txid: str, ident: str) -> dict[str, Any]:
    """Spend the tx's inputs, then create its record (workers/chainstate/mempool.py). A tx whose parents
    are not in the store yet is retried, within a bound, then reported (the recovery manager
    keeps trying it until its grace period ends). A refused tx ends the task as Refused: logged
    with its rival, and shown failed in Flower."""
    try:
        svc = services()  # (first call in a process: opens the stores, which may fail)
        tx = parse_tx(svc.blobs.get(blob_key(hex_to_hash(txid), "tx")))
        made = apply_tx(svc.utxo, tx)
        if isinstance(made, UtxoError):
            if waiting_for_parents(made) and self.request.retries < PARENT_RETRIES:
                metrics.mempool_tx("waiting")  # (a store's error: count_retry, by its code)
                raise self.retry(countdown=min(0.5 * 2 ** self.request.retries, 30))
            log.warning("tx %s rejected: %s", txid, made)
            svc.registry.done(ident, refused=(str(made), rival(made)))
            metrics.mempool_tx("rejected")
            raise Refused(f"tx {txid} rejected: {made}")
    except StorageError as e:
        log.warning("tx %s: %s (will retry)", txid, e)
        raise self.retry(countdown=min(2 ** min(self.request.retries, 4), 10)) from e
    svc.registry.done(ident, accepted=True)
    if made:  # (not a redelivery, nor a tx sent twice: counted once)
        metrics.mempool_tx("accepted")
        activity.note("mempool_txs")
    else:
        metrics.mempool_tx("known")
    return {"txid": txid, "status": "accepted"}
