"""What becomes of one claimed recovery entry (run by the `utxoflow.recovery.handle` task, or
inline by `utxo recover --once`): the store is looked at, whatever was left half done is done,
and the entry is released with its outcome.

A tx entry (`tx:<txid>`, a mempool tx enqueued) ends
- `confirmed` once its record is mined on the best chain (the store's `unmined_since` is clear
  and it has a block);
- `deleted` when its record is gone after its task made it (pruned or taken back), or once
  UTXO_RECOVERY_NOT_FOUND_GRACE seconds have passed since it was enqueued with its record
  conflicting or applying it again refused (a double spend): until then such a tx is checked
  again at every scan (outcomes `conflicting`, `refused`), as a block may still mine it (it
  lost a mempool race its rival later lost to the chain) or a refused block give it back (0:
  final at once);
- `orphan` when neither its record nor a way to make it (its blob, its parents, its coinbase
  mature) has been found for UTXO_RECOVERY_NOT_FOUND_GRACE seconds since it was enqueued (0:
  never);
- and stays pending otherwise (unmined, or not found yet), checked again at a later scan.
An unmined record's inputs are checked to be its own at every scan (`mempool.hold_inputs`: a
check its task never finished), and a tx found `orphan` frees what a dead attempt of it left.
A tx with no record whose bytes are kept (workers/runtime/txsource.py) and that was never
accepted is applied again here (workers/chainstate/mempool.py: idempotent). A master still
`creating` is finished first.

A creation entry (`creation:<txid>`) is finished from its blob (`complete_creation`); a lapsed
lock that left neither a record nor a blob is cleared. Either way the entry goes (`done`).

Invariants: every step here is idempotent, so an entry handled twice (a lease that ran out
under a slow handler, a task delivered twice) ends the same; the outcome's text before any
colon is the word its count is kept under.
"""

from __future__ import annotations

import logging
import time
from typing import Any, NamedTuple

from chain import hex_to_hash
from stores.errors import StorageError, StoreError
from stores.state.recovery import DONE, PENDING, RecoveryEntry
from stores.utxo import SpendRejected, TxCoinbaseImmature, TxLocked, TxNotFound
from workers.chainstate.mempool import apply_tx, give_up, hold_inputs, waiting_for_parents
from workers.ops import metrics
from workers.runtime.services import Services
from workers.runtime.txsource import Settled, Unread, load_txs

log = logging.getLogger("utxoflow.recovery")


class Verdict(NamedTuple):
    status: str
    outcome: str
    seen: bool = False  # the tx's record was there (from now on its absence means it was removed)


def handle(svc: Services, entry: RecoveryEntry) -> Verdict:
    """The entry's new status and its outcome (see the module). Raises StorageError when a
    store fails: the caller releases the entry as failed, for a later scan."""
    if entry.kind == "creation":
        return _creation(svc, hex_to_hash(entry.key))
    return _tx(svc, entry)


def _tx(svc: Services, entry: RecoveryEntry) -> Verdict:
    txid = hex_to_hash(entry.key)
    verdict = _by_record(svc, entry, txid)
    if verdict is not None:
        return verdict
    if entry.accepted:
        return Verdict("deleted", "deleted: its record was removed after it was made")
    (tx,) = load_txs(svc, [txid])
    if isinstance(tx, Settled) or (isinstance(tx, Unread) and tx.missing):  # (they may yet come:
        return _not_found(svc, entry, "no record and no bytes kept")  # the tx enqueued again)
    if isinstance(tx, Unread):
        return Verdict("deleted", f"deleted: {tx.why}")
    applied = apply_tx(svc.utxo, tx)  # (the refusal, or whether this call made the record)
    if not isinstance(applied, StoreError):
        svc.registry.done(entry.ident, accepted=True)
        return _by_record(svc, entry, txid) or Verdict(PENDING, "processed again: accepted", True)
    if _may_pass(applied):
        verdict = _not_found(svc, entry, f"its parents are not in the store or not spendable yet ({applied})")
        if verdict.status == "orphan":  # final now: what a dead attempt of it left is freed
            give_up(svc.utxo, tx, applied)
        return verdict
    svc.registry.done(entry.ident)
    return _after_grace(svc, entry, "refused", str(applied))


def _may_pass(refused: StoreError) -> bool:
    """A refusal that may pass with time: parents not in the store yet or locked a moment
    (`mempool.waiting_for_parents`), or coinbases not mature yet (valid some blocks later)."""
    return isinstance(refused, SpendRejected) and all(
        isinstance(e, (TxCoinbaseImmature, TxNotFound, TxLocked)) for _v, e in refused.errors
    )


def _after_grace(
    svc: Services, entry: RecoveryEntry, word: str, detail: str = "", seen: bool = False
) -> Verdict:
    """`deleted` (for `word`: refused, conflicting) once UTXO_RECOVERY_NOT_FOUND_GRACE has
    passed since the tx was enqueued (or the grace is 0); until then pending, under the outcome
    `word`, to be checked again (see the module)."""
    grace = svc.settings.recovery_not_found_grace
    why = f" ({detail})" if detail else ""
    if grace <= 0 or time.time() - entry.stored_at >= grace:
        return Verdict("deleted", f"deleted: {word}{why}", seen)
    return Verdict(PENDING, f"{word}: checked again until {grace:.0f} s after it came{why}", seen)


def _by_record(svc: Services, entry: RecoveryEntry, txid: bytes) -> Verdict | None:
    """The verdict its record gives (None: no record)."""
    try:
        meta = svc.utxo.get(txid)
        if meta.creating:
            svc.utxo.complete_creation(txid)
            meta = svc.utxo.get(txid)
    except TxNotFound:
        return None
    if meta.conflicting:
        return _after_grace(svc, entry, "conflicting", seen=True)
    if meta.block_ids and meta.unmined_since is None:
        return Verdict("confirmed", f"confirmed: mined at height {max(meta.block_heights, default=0)}", True)
    if meta.tx is not None:  # its inputs still its own (workers/chainstate/mempool.py: a check cut short)
        held = hold_inputs(svc.utxo, meta.tx, svc.utxo.current_height())
        if held is not None and not waiting_for_parents(held):
            return _after_grace(svc, entry, "conflicting", str(held), seen=True)
    return Verdict(PENDING, "unmined: in the store, not mined yet", True)


def _not_found(svc: Services, entry: RecoveryEntry, why: str) -> Verdict:
    grace = svc.settings.recovery_not_found_grace
    if grace > 0 and time.time() - entry.stored_at >= grace:
        return Verdict("orphan", f"orphan: not found for {grace:.0f} s: {why}")
    return Verdict(PENDING, f"not found: {why}")


def _creation(svc: Services, txid: bytes) -> Verdict:
    store = svc.utxo
    if store.get_creation_lock(txid) is not None:
        return Verdict(PENDING, "under way: a live creator holds its lock")
    if store.complete_creation(txid):
        return Verdict(DONE, "finished")
    if store.creation_state(txid) is not None:
        return Verdict(PENDING, "failed: its records are there but clearing `creating` failed again")
    lock = store.acquire_creation_lock(txid, 1)  # takes the lapsed one over, so as to remove it
    if lock is not None:
        store.release_creation_lock(lock)
    return Verdict(DONE, "abandoned: no record and no blob to make it from; its lapsed lock cleared")


def release_all(svc: Services, entries: list[RecoveryEntry]) -> list[dict[str, Any]]:
    """Handle each entry and release it; what became of each (`released` False: its claim was
    no longer this holder's, so nothing was recorded)."""
    out = []
    for e in entries:
        try:
            status, outcome, seen = handle(svc, e)
        except StorageError as err:
            status, outcome, seen = Verdict(PENDING, f"failed: {err}")
        except Exception as err:  # one bad entry must not stop the rest: logged, retried later
            log.exception("recovering %s failed", e.ident)
            status, outcome, seen = Verdict(PENDING, f"failed: {type(err).__name__}: {err}")
        released = svc.state.recovery_release(e.ident, e.holder, outcome, status, accepted=seen)
        metrics.recovery_claim(e.kind, status if released else "lost")
        if released and e.kind == "tx" and status not in (PENDING, DONE):
            svc.registry.done(e.ident)  # its message, if still pending, has nothing left to do
        out.append({"ident": e.ident, "status": status, "outcome": outcome, "released": released})
    return out
