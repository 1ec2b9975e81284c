"""A mempool transaction applied to the UTXO store: its inputs spent as the next block would
spend them, then its record created unmined — what the `utxoflow.tx.arrived` task does and what
the recovery manager does again for a tx whose record never appeared.

Invariants:
- Both steps are idempotent (the same spender again succeeds; a second create is TxExists), so
  applying a tx twice, or after a crash between the steps, ends the same.
- A refused spend leaves none of its own new spends behind (the store's all-or-nothing spend;
  on Aerospike, but a slot a block's spend of the same tx holds meanwhile:
  stores/utxo/aerospike/rules.py). A spend refused for good, of a tx with no record, also frees
  what an earlier attempt that died left, between its spend and its record (or, on Aerospike,
  between two parents' records): `take_back_dead` frees only slots holding the tx's own spend,
  and only while it has no record. If its record appears meanwhile (a delivery beside this
  one), that record's inputs are held again as below.
- A tx whose record is made holds every input when this returns, or is conflicting, or the
  answer is a refusal that may pass (a parent locked by a block's swap: the task tries again): a
  block may take outputs from a spender with no record yet (`workers.chainstate.conflicts.take_over`,
  which looks for the record again after), so the inputs are read again once the record is
  there; one lost meanwhile is spent again, and if that is refused the tx is made conflicting.
  A refused delivery of a tx that has a record does the same.
- A tx whose record is made is conflicting if a parent is: `make_conflicting` marks every
  descendant it finds by record, so a child between its spend and its record is missed there;
  the child, reading its inputs (and their parents' flags, in the same read) after making its
  record, marks itself. Either the marking finds the record or the record's read sees the flag.
  A child that marks itself while the block's walk is still going is noted by the walk when it
  reaches it (`Conflicts.make_conflicting`), and a refused block gives it back its spends. One
  the walk found with no record yet (its spend made, as the spender of its parent's output) is
  noted all the same, so a refused block gives it back too once its record has come.
"""

from __future__ import annotations

from collections.abc import Sequence

from chain import Tx, hash_to_hex
from stores.errors import StorageError, StoreError
from stores.utxo import (
    Spenders,
    SpendRejected,
    TxConflicting,
    TxExists,
    TxLocked,
    TxNotFound,
    UtxoError,
    UtxoSpent,
    UtxoStore,
)
from workers.chainstate.conflicts import Conflicts


def apply_tx(utxo: UtxoStore, tx: Tx) -> StoreError | bool:
    """Spend `tx`'s inputs and create its record; the spend's refusal, or, the tx being in the
    store, whether this call made its record (False: it was there: a redelivery, a tx sent
    twice). A refusal for good frees what an attempt of it that died left, and holds the
    inputs of its record where there is one (see the module). Raises StorageError when the
    store fails (nothing is then known)."""
    return apply_txs(utxo, [tx])[0]


def apply_txs(utxo: UtxoStore, txs: Sequence[Tx]) -> list[StoreError | bool]:
    """`apply_tx` of each of `txs` (a batch: `utxoflow.txs.arrived`), its answer in their order:
    what applying them one at a time in that order answers, with a store call per step for a
    run of them instead of per tx. The batch goes in consecutive runs (`runs`), cut before a tx
    whose parent is in the run: a run's spends in one call, then its records in one, then the
    read of their inputs in one, so a parent's record is there before the run of its child, and
    a double spend is won by the first listed, as one at a time. A tx listed twice is applied
    once (the second answer: False, it was there). A tx the store refuses to make (not a
    StorageError) is refused alone, its spend taken back."""
    height = utxo.current_height()  # unmined since the tip; it spends as the next block would
    out: dict[bytes, StoreError | bool] = {}
    for run in runs(list({t.txid: t for t in txs}.values())):
        spending = [t for t in run if not t.is_coinbase]
        results = utxo.spend_many(spending, height + 1) if spending else []
        spent = dict(zip((t.txid for t in spending), results))
        ready = []
        for t in run:
            answer = spent.get(t.txid)
            if isinstance(answer, UtxoError):
                out[t.txid] = answer if waiting_for_parents(answer) else _refused(utxo, t, height, answer)
            else:
                ready.append(t)
        if ready:
            out.update(make_records(utxo, ready, height))
    seen: set[bytes] = set()
    answers: list[StoreError | bool] = []
    for t in txs:
        answers.append(False if t.txid in seen and out[t.txid] is True else out[t.txid])
        seen.add(t.txid)
    return answers


def runs(txs: Sequence[Tx]) -> list[list[Tx]]:
    """`txs` (distinct) cut into consecutive runs, a cut before each tx that spends an output of
    a tx in its run: no run holds a parent and its child."""
    out: list[list[Tx]] = []
    run: list[Tx] = []
    ids: set[bytes] = set()
    for t in txs:
        if any(i.prev_txid in ids for i in t.inputs):
            out.append(run)
            run, ids = [], set()
        run.append(t)
        ids.add(t.txid)
    if run:
        out.append(run)
    return out


def _refused(utxo: UtxoStore, tx: Tx, height: int, refusal: StoreError) -> StoreError:
    """A spend refused for good. Whatever of it a dead attempt left is freed while it has no
    record (only if it holds any: a double spend's refusal costs one read), and a record of it
    that exists (made before, or beside this delivery meanwhile) holds its inputs again or is
    made conflicting. The refusal, or one that may pass (a parent locked a moment) for a retry.
    (A record that holds every input again is still answered with the refusal: this delivery
    was refused; the record stands, and the recovery manager keeps checking it.)"""
    ops = [(i.prev_txid, i.prev_vout) for i in tx.inputs]
    if tx.txid in utxo.spenders(ops).values():
        utxo.take_back_dead(tx)
    if utxo.existing([tx.txid]):
        held = hold_inputs(utxo, tx, height)
        if held is not None and waiting_for_parents(held):
            return held
    return refusal


def rival(refusal: StoreError) -> str | None:
    """The transaction (display hex) that holds an output a refused spend wanted, if one does."""
    found = [e for _vin, e in refusal.errors] if isinstance(refusal, SpendRejected) else [refusal]
    spender = next((e.spending_txid for e in found if isinstance(e, UtxoSpent)), None)
    return None if spender is None else hash_to_hex(spender)


def give_up(utxo: UtxoStore, tx: Tx, refusal: StoreError) -> None:
    """A refusal that might have passed is final now (its parents never came, a lock never
    lifted): settle it as one for good — what a dead attempt of it left is freed, a record of
    it holds its inputs or is conflicting."""
    if not tx.is_coinbase:
        _refused(utxo, tx, utxo.current_height(), refusal)


def make_record(utxo: UtxoStore, tx: Tx, height: int) -> StoreError | bool:
    """The second half of `apply_tx`, its inputs spent: create the record, then make sure the
    tx holds its inputs (`hold_inputs`): its refusal when it lost one."""
    return make_records(utxo, [tx], height)[tx.txid]


def make_records(utxo: UtxoStore, txs: Sequence[Tx], height: int) -> dict[bytes, StoreError | bool]:
    """`make_record` of each of `txs` (distinct, their inputs spent), a store call per step: the
    records made in one, then every input read in one; only a tx that lost an input there, or
    whose parent is conflicting, goes on to `hold_inputs` by itself. A tx whose record the
    store refuses (a ProcessingError: not a failure of the store) is refused alone, its spend
    taken back (`_refused`); a StorageError ends the call (nothing is then known)."""
    if not txs:
        return {}
    made = utxo.create_many(txs, height, meta=False)
    for m in made:
        if isinstance(m, StorageError):
            raise m
    held = utxo.spenders([(i.prev_txid, i.prev_vout) for t in txs if not t.is_coinbase for i in t.inputs])
    out: dict[bytes, StoreError | bool] = {}
    for t, m in zip(txs, made):
        if isinstance(m, StoreError) and not isinstance(m, TxExists):
            out[t.txid] = m if t.is_coinbase else _refused(utxo, t, height, m)
            continue
        lost = None
        if not t.is_coinbase and _may_have_lost(t, held):
            lost = hold_inputs(utxo, t, height)
        out[t.txid] = lost if lost is not None else not isinstance(m, TxExists)
    return out


def _may_have_lost(tx: Tx, held: Spenders) -> bool:
    """What `hold_inputs` looks for, in a read made after `tx`'s record: an input held by another
    tx, or a parent that is conflicting."""
    # (an outpoint not there: its parent was mined and pruned since, no loss; one unspent: freed)
    return any(((i.prev_txid, i.prev_vout) in held and held[(i.prev_txid, i.prev_vout)] != tx.txid)
               or i.prev_txid in held.conflicting for i in tx.inputs)


def hold_inputs(utxo: UtxoStore, tx: Tx, height: int) -> UtxoError | None:
    """`tx` has a record: read who holds its inputs. One that is not its own any more is spent
    again (freed meanwhile, taken by no one). When that is refused for good, the tx is made
    conflicting (its other spends released), and TxConflicting given; when it may pass (a
    parent locked by a block's swap), that refusal is given and nothing changed, for a retry
    (the swap ends with the output the block's, or free again). A tx whose parent is
    conflicting is made conflicting too: e.g. the parent was marked while this tx had a spend
    there but no record, so the marking could not reach it (it marks every descendant it
    finds by record). A record that is conflicting (its spends released on purpose) or mined
    on the chain (a block made it, and its spend phase, which makes rivals conflicting, holds
    its inputs) is left alone."""
    if tx.is_coinbase:
        return None
    ops = [(i.prev_txid, i.prev_vout) for i in tx.inputs]
    held = utxo.spenders(ops)  # (a parent gone since is no loss: it was mined and pruned)
    lost = any(op in held and held[op] != tx.txid for op in ops)
    if not lost and not held.conflicting:
        return None
    standing = utxo.standing([tx.txid]).get(tx.txid)
    if standing is None or standing.mined or standing.conflicting:
        return None  # gone since; the chain's (a block holds its inputs); released on purpose
    if held.conflicting:  # a descendant of a conflicting tx is conflicting (see the module)
        _Loser(utxo).make_conflicting([tx.txid], lock=False)
        names = ", ".join(sorted(hash_to_hex(t) for t in held.conflicting))
        return TxConflicting(f"tx {tx.txid_hex} spends conflicting tx {names}", txid=tx.txid)
    (again,) = utxo.spend_many([tx], height + 1)
    if not isinstance(again, UtxoError):
        return None
    if waiting_for_parents(again):
        return again
    _Loser(utxo).make_conflicting([tx.txid], lock=False)
    return TxConflicting(
        f"tx {tx.txid_hex} lost an input after its spend, to a block or another spender: {again}",
        txid=tx.txid,
    )


class _Loser(Conflicts):
    """Conflict marking outside a block: no undo record, no parents locked."""

    def __init__(self, utxo: UtxoStore) -> None:
        self.utxo, self.chunk, self._undo, self._save = utxo, 1000, None, None


def why_waiting(tx: Tx, refused: StoreError) -> str:
    """What a refusal that may pass waits for, in one short line (`utxo wait`, `utxo tx`):
    `waits for 5,569 missing parents (the first: <txid>)`, and inputs a block's swap holds."""
    errors = refused.errors if isinstance(refused, SpendRejected) else []
    missing = list(dict.fromkeys(tx.inputs[vin].prev_txid for vin, e in errors
                                 if isinstance(e, TxNotFound)))
    locked = sum(isinstance(e, TxLocked) for _vin, e in errors)
    parts = []
    if missing:
        parts.append(f"waits for {len(missing):,} missing parent{'s' if len(missing) > 1 else ''} "
                     f"(the first: {hash_to_hex(missing[0])})")
    if locked:
        parts.append(f"{locked:,} input{'s' if locked > 1 else ''} locked a moment by a block's swap")
    return "; ".join(parts) or str(refused)[:300]


def waiting_for_parents(refused: StoreError) -> bool:
    """Whether a refusal may pass by itself: a parent not in the store yet, or locked a moment
    (a block's conflict swap) — not a double spend or a bad input."""
    return isinstance(refused, SpendRejected) and all(
        isinstance(e, (TxNotFound, TxLocked)) for _v, e in refused.errors
    )
