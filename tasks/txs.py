"""Transaction tasks (queue `txs`): mempool transactions, created and spent as unmined: one by
one (`utxoflow.tx.arrived`: a message sent again, the recovery manager's) or a batch of them
(`utxoflow.txs.arrived`: what `utxo enqueue tx` sends). Each transaction keeps its own message id
in the registry, so `utxo wait`, the refusal log and the recovery manager see transactions, not
batches."""

from __future__ import annotations

import logging
from typing import Any

from celery import Task

from chain import Tx, hex_to_hash
from stores.errors import StorageError, StoreError
from stores.state import PendingDone
from workers.chainstate.mempool import apply_tx, apply_txs, rival, waiting_for_parents, why_waiting
from workers.ops import activity, metrics
from workers.runtime.app import app
from workers.runtime.outcome import Refused
from workers.runtime.services import services
from workers.runtime.txsource import Settled, Unread, load_txs

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
        (tx,) = load_txs(svc, [hex_to_hash(txid)])
        if isinstance(tx, Settled):  # a late copy of its message: nothing to do, nothing refused
            svc.registry.done(ident, accepted=tx.record)
            metrics.mempool_tx("known")
            return {"txid": txid, "status": "known"}
        if isinstance(tx, Unread):
            log.warning("tx %s rejected: %s", txid, tx.why)
            svc.registry.done(ident, refused=(tx.why, None))
            metrics.mempool_tx("rejected")
            raise Refused(f"tx {txid} rejected: {tx.why}")
        made = apply_tx(svc.utxo, tx)
        if isinstance(made, StoreError):
            if waiting_for_parents(made) and self.request.retries < PARENT_RETRIES:
                metrics.mempool_tx("waiting")  # (a store's error: count_retry, by its code)
                svc.registry.waits([(ident, why_waiting(tx, made))])
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


@app.task(name="utxoflow.txs.arrived", bind=True, max_retries=None, throws=(Refused,))
def txs_arrived(self: Task, txids: list[str], idents: list[str], refused_before: int = 0) -> dict[str, Any]:
    """A batch of transactions (`workers.chainstate.mempool.apply_txs`: as one at a time in
    their order). Those that are done (accepted, known, refused for good) leave the registry in one
    write; those whose parents are not in the store yet are retried as a smaller batch, within
    the bound a single tx has, then reported. The task ends as Refused when any was refused,
    in this attempt or an earlier one of it (`refused_before`), each with its reason in the
    refusal log and the log, so Flower shows the batch failed."""
    if not isinstance(txids, list) or not isinstance(idents, list) or len(txids) != len(idents):
        raise Refused(f"a batch of txs needs as many message ids as txids: {len(txids)} and {len(idents)}")
    try:
        keys = [hex_to_hash(t) for t in txids]
    except (TypeError, ValueError) as e:
        raise Refused(f"a batch of txs names a txid that is not one: {e}") from None
    try:
        svc = services()  # (first call in a process: opens the stores, which may fail)
        # (a tx whose stored bytes are gone or bad: refused alone; one settled already: done)
        loaded = load_txs(svc, keys)
        txs = {k: t for k, t in enumerate(loaded) if isinstance(t, Tx)}
        applied = iter(apply_txs(svc.utxo, list(txs.values())))
        answers: list[StoreError | bool | Unread | Settled] = [
            next(applied) if isinstance(t, Tx) else t for t in loaded]
    except StorageError as e:
        raise _again(self, len(txids), e) from e
    done: list[PendingDone] = []
    waiting: list[int] = []
    why: list[tuple[str, str]] = []  # (ident, what it waits for)
    refused: list[str] = []
    made = known = 0
    last_try = self.request.retries >= PARENT_RETRIES
    for k, (txid, ident, answer) in enumerate(zip(txids, idents, answers)):
        if isinstance(answer, Settled):
            done.append(PendingDone(ident, accepted=answer.record))
            known += 1
        elif isinstance(answer, Unread):
            log.warning("tx %s rejected: %s", txid, answer.why)
            done.append(PendingDone(ident, refused=(answer.why, None)))
            refused.append(f"{txid}: {answer.why}")
        elif isinstance(answer, StoreError):
            if waiting_for_parents(answer) and not last_try:
                waiting.append(k)
                why.append((ident, why_waiting(txs[k], answer)))
                continue
            log.warning("tx %s rejected: %s", txid, answer)
            done.append(PendingDone(ident, refused=(str(answer), rival(answer))))
            refused.append(f"{txid}: {answer}")
        else:
            done.append(PendingDone(ident, accepted=True))
            made, known = made + bool(answer), known + (not answer)
    try:
        svc.registry.done_many(done)
        svc.registry.waits(why)
    except StorageError as e:
        raise _again(self, len(txids), e) from e
    metrics.mempool_tx("accepted", made)
    metrics.mempool_tx("known", known)
    metrics.mempool_tx("rejected", len(refused))
    metrics.mempool_tx("waiting", len(waiting))
    if made:
        activity.note("mempool_txs", made)
    if waiting:  # a smaller batch: only those whose parents are not there yet
        raise self.retry(args=[[txids[k] for k in waiting], [idents[k] for k in waiting]],
                         kwargs={"refused_before": refused_before + len(refused)},
                         countdown=min(0.5 * 2 ** self.request.retries, 30))
    if refused or refused_before:
        raise Refused(f"{len(refused) + refused_before} txs of the batch rejected"
                      + (": " + "; ".join(refused[:3]) if refused else " in earlier attempts")
                      + (" …" if len(refused) > 3 else ""))
    return {"txs": len(txids), "accepted": made, "known": known}


def _again(task: Task, n: int, e: StorageError) -> BaseException:
    """A batch's step failed with the store: the whole batch again shortly (every step of it is
    idempotent); what the task raises."""
    log.warning("a batch of %d txs: %s (will retry)", n, e)
    return task.retry(countdown=min(2 ** min(task.request.retries, 4), 10))
