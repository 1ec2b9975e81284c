"""Spending an output, taking a spend back (whoever made it, or only a given spender's), and
what `get_spend` says of an output: the rules of Teranode's spend / unspend UDFs and GetSpend,
over records read under lock.

A spend at `height` (the height of the block it is in: the store's tip + 1 for a mempool spend)
checks, in this order; the first that fails names the input's error:
  record:  missing → TxNotFound; creating → TxCreating (never ignored); conflicting → TxConflicting
           and locked → TxLocked (each unless ignored: `Ignore`); a coinbase whose
           `spending_height` > height → TxCoinbaseImmature
  output:  no such slot → UtxoNotFound (a child page still creating → TxCreating); a UTXO hash
           that differs from the one the input's previous output gives → UtxoMismatch; a
           reassigned output while its `spendable_in` >= height → UtxoFrozen (until);
           spent by the same spender → success, unless the parent lists the spender among its
           deleted (pruned) children → InvalidSpend; frozen → UtxoFrozen; spent by another →
           UtxoSpent naming it. Otherwise the spend is written.

Invariants:
- A transaction's spend is all or nothing (stricter than Teranode, which keeps the inputs that
  passed): either every input is recorded or none, and a rejected spend lists every failed
  input. A later transaction of the same batch sees the earlier ones' spends.
- An input whose parent record is gone is skipped (not recorded, no error) when the spending
  transaction's own record exists and is not conflicting — its spends were made long ago and
  its parent pruned since (Teranode's "already blessed") — or when the caller allows missing
  parents; a caller that created the transaction just now tells the two apart by the inputs
  missing from the result.
- `spend_txs` holds the rule's fast form: an input whose parent needs no record-level rule and
  whose slot is unspent with the expected hash is decided without the full walk. A test holds
  the fast form to the full one (`fast=False`) on random record states.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from chain import Tx, spent_hashes, utxo_hash
from stores.utxo import slots
from stores.utxo.errors import Outpoint, SpendRejected, UtxoError
from stores.utxo.kernel import verdicts
from stores.utxo.kernel.outputs import verified_slot
from stores.utxo.kernel.record import NO_SPENDABLE, Record
from stores.utxo.values import Spend, SpendInfo, SpendStatus

SLOT = slots.SLOT
NO_HASH, UNSPENT, FROZEN = slots.NO_HASH, slots.UNSPENT, slots.FROZEN
SPENT_COLS = ("utxos", "spent_utxos")  # what a spend touches


@dataclass(frozen=True, slots=True)
class Ignore:
    """Record-level rules a spend may skip (Teranode's IgnoreFlags): the swap of a conflict
    spends the winner although its parents are locked, or it is itself still conflicting."""

    conflicting: bool = False
    locked: bool = False


NO_IGNORE = Ignore()


def blesses(spender: Record | None) -> bool:
    """Whether the spending tx's own record vouches for its inputs whose parent is gone (see
    the module's invariants): it exists, and its spends were not taken back (not conflicting)."""
    return spender is not None and not spender.conflicting


def expected_hash(tx: Tx, vin: int) -> bytes | None:
    """The UTXO hash input `vin` spends, when the transaction carries its previous output
    (extended format); None: the stored hash is taken as it is."""
    i = tx.inputs[vin]
    if i.prev_script is None or i.prev_satoshis is None:
        return None
    return utxo_hash(i.prev_txid, i.prev_vout, i.prev_script, i.prev_satoshis)


def record_error(
    parent: Record | None, op: Outpoint, height: int, ignore: Ignore = NO_IGNORE
) -> UtxoError | None:
    """The record-level rules of a spend of `op` at `height` (None: they pass)."""
    if parent is None:
        return verdicts.tx_not_found(op, parent=True)
    if parent.creating:
        return verdicts.tx_creating(op, parent=True)
    if parent.conflicting and not ignore.conflicting:
        return verdicts.tx_conflicting(op)
    if parent.locked and not ignore.locked:
        return verdicts.tx_locked(op)
    if parent.is_coinbase and parent.spending_height > height:
        return verdicts.coinbase_immature(op, parent.spending_height, height)
    return None


def output_error(
    parent: Record, op: Outpoint, want: bytes | None, spender: bytes, height: int, batch_size: int
) -> tuple[UtxoError | None, tuple[Record, int] | None]:
    """The output-level rules of a spend of `op` by `spender` (spending data: txid ‖ vin):
    (error or None, where its slot is). A None error with a slot already holding `spender` is
    the same spend again."""
    loc = parent.locate(op[1], batch_size)
    if loc is None:
        return verdicts.utxo_not_found(op), None
    rec, off = loc
    if rec.creating:  # a child page still being created (its master normally says so first)
        return verdicts.page_creating(op), None
    u = rec.utxos
    if want is not None and not u.startswith(want, off):
        return verdicts.mismatch(op, want, bytes(u[off : off + 32]), spend=True), None
    if parent.spendable_in != NO_SPENDABLE:
        until = parent.spendable().get(op[1])
        if until is not None and until >= height:
            return verdicts.reassigned(op, until), None
    data = bytes(u[off + 32 : off + SLOT])
    if data == UNSPENT:
        return None, loc
    if data == spender:
        if spender[:32] in parent.children("deleted_children"):
            return verdicts.invalid_spend(op, spender[:32]), None
        return None, loc
    if data == FROZEN:
        return verdicts.frozen(op), None
    return verdicts.spent(op, data[:32], int.from_bytes(data[32:], "little")), None


def spend_tx(
    tx: Tx,
    parents: Mapping[bytes, Record],
    height: int,
    batch_size: int,
    ignore: Ignore = NO_IGNORE,
    skip_missing: bool = False,
) -> list[Spend] | SpendRejected:
    """Spend every input of `tx` (all or nothing), every rule walked. `skip_missing`: an input
    whose parent record is gone is left out instead of failing (see the module's invariants)."""
    txid = tx.txid
    spends: list[Spend] = []
    fresh: list[tuple[Record, Record, int, bytes]] = []  # (master, record, offset, spending data)
    errors: list[tuple[int, UtxoError]] = []
    seen: dict[tuple[bytes, int], int] = {}
    for vin, i in enumerate(tx.inputs):
        op = (i.prev_txid, i.prev_vout)
        parent = parents.get(op[0])
        if parent is None and skip_missing:
            continue
        mine = txid + vin.to_bytes(4, "little")
        err = record_error(parent, op, height, ignore)
        loc = None
        if err is None:
            assert parent is not None
            err, loc = output_error(parent, op, expected_hash(tx, vin), mine, height, batch_size)
        if err is None and (first := seen.setdefault(op, vin)) != vin:
            err = verdicts.spent_twice(op, txid, first, vin)
        if err is not None:
            errors.append((vin, err))
            continue
        assert parent is not None and loc is not None
        rec, off = loc
        spends.append(Spend(op[0], op[1], bytes(rec.utxos[off : off + 32]), txid, vin))
        if rec.utxos[off + 32 : off + SLOT] == UNSPENT:
            fresh.append((parent, rec, off, mine))
    if errors:
        return SpendRejected(txid, errors)
    for parent, rec, off, mine in fresh:
        parent.set_spending(rec, off, mine, 1)
    return spends


def spend_txs(
    txs: Sequence[Tx],
    parents: Mapping[bytes, Record],
    height: int,
    batch_size: int,
    *,
    ignore: Ignore = NO_IGNORE,
    missing_ok: bool = False,
    blessed: Collection[bytes] = (),
    fast: bool = True,
) -> list[list[Spend] | UtxoError]:
    """Spend each of `txs` in turn against `parents` (changed in place). `blessed`: txids whose
    own record `blesses` them: an input of theirs whose parent is gone is skipped."""
    # The fast form's records: no record-level rule can refuse a spend of theirs at this height.
    plain = (
        {
            t: p
            for t, p in parents.items()
            if not (p.creating or p.conflicting or p.locked or p.total_extra_recs)
            and p.spendable_in == NO_SPENDABLE
            and not (p.is_coinbase and p.spending_height > height)
        }
        if fast
        else {}
    )
    get = plain.get
    new = tuple.__new__
    results: list[list[Spend] | UtxoError] = []
    for tx in txs:
        txid = tx.txid
        ins = tx.inputs
        if tx.is_coinbase:
            results.append([])  # a coinbase spends nothing
            continue
        spends: list[Spend] = []
        picked: list[tuple[Record, int, int]] = []
        for vin, (i, h) in enumerate(zip(ins, spent_hashes(ins))):
            p = get(i.prev_txid)
            if p is None:
                break
            u, vout = p.utxos, i.prev_vout
            off = vout * SLOT
            if not u.startswith(UNSPENT, off + 32):  # spent, frozen or no slot there
                break
            if h is not None:
                if not u.startswith(h, off):
                    break
            else:
                h = bytes(u[off : off + 32])
                if h == NO_HASH:
                    break
            spends.append(new(Spend, (i.prev_txid, vout, h, txid, vin)))
            picked.append((p, off, vin))
        else:
            n = len(picked)
            # no outpoint twice in one tx (the general path names that error)
            if n < 2 or (
                (picked[0][0] is not picked[1][0] or picked[0][1] != picked[1][1])
                if n == 2
                else len({(id(p), off) for p, off, _v in picked}) == n
            ):
                for p, off, vin in picked:
                    p.utxos[off + 32 : off + SLOT] = txid + vin.to_bytes(4, "little")
                    p.spent_utxos += 1
                    if "spent_utxos" not in p.dirty:
                        p.dirty.update(SPENT_COLS)
                results.append(spends)
                continue
        results.append(spend_tx(tx, parents, height, batch_size, ignore, missing_ok or txid in blessed))
    return results


def unspend(parent: Record | None, op: Outpoint, want: bytes, batch_size: int) -> UtxoError | None:
    """Take back the spend of `op`, whoever made it, if its UTXO hash is `want` (Teranode's
    unspend): missing → TxNotFound / UtxoNotFound; another hash → UtxoMismatch; frozen →
    UtxoFrozen; unspent already → nothing to do."""
    loc = verified_slot(parent, op, want, batch_size, creating_ok=True)
    if isinstance(loc, UtxoError):
        return loc
    assert parent is not None
    rec, off = loc
    data = rec.utxos[off + 32 : off + SLOT]
    if data == FROZEN:
        return verdicts.frozen(op, unspend=True)
    if data != UNSPENT:
        parent.set_spending(rec, off, UNSPENT, -1)
    return None


def take_back(parent: Record | None, op: Outpoint, spender: bytes, vin: int, batch_size: int) -> bool:
    """Free `op` only while its slot holds input `vin` of `spender`: an exact take-back (what an
    attempt of a tx with no record left; a block freeing a rival's spend). A slot another
    spender or nobody holds, a spender the parent lists among its deleted children (mined and
    pruned: that spend stands for good), or a record or output that is gone, is left alone;
    True when freed. (The Lua module's `take_back` is its port, and keeps a slot a block's
    spend call marked unless told otherwise.)"""
    loc = parent.locate(op[1], batch_size) if parent is not None else None
    if loc is None:
        return False
    assert parent is not None
    rec, off = loc
    if rec.utxos[off + 32 : off + SLOT] != slots.spending_data(spender, vin):
        return False
    if spender in parent.children("deleted_children"):
        return False
    parent.set_spending(rec, off, UNSPENT, -1)
    return True


def spend_status(parent: Record | None, op: Outpoint, want: bytes, tip: int, batch_size: int) -> SpendInfo:
    """What a spend of `op` in the next block (tip + 1) would meet, as Teranode's GetSpend has
    it: LOCKED > CONFLICTING > FROZEN > IMMATURE (reassigned) > SPENT > IMMATURE (coinbase) >
    OK; NOT_FOUND for a missing record or output. Raises UtxoMismatch for another hash."""
    if parent is None:
        return SpendInfo(SpendStatus.NOT_FOUND)
    if parent.creating:
        return SpendInfo(SpendStatus.LOCKED)
    loc = parent.locate(op[1], batch_size)
    if loc is None:
        return SpendInfo(SpendStatus.NOT_FOUND)
    rec, off = loc
    if rec.creating:
        return SpendInfo(SpendStatus.LOCKED)
    if not rec.utxos.startswith(want, off):
        raise verdicts.mismatch(op, want, bytes(rec.utxos[off : off + 32]))
    if parent.locked:
        return SpendInfo(SpendStatus.LOCKED)
    if parent.conflicting:
        return SpendInfo(SpendStatus.CONFLICTING)
    data = bytes(rec.utxos[off + 32 : off + SLOT])
    if data == FROZEN:
        return SpendInfo(SpendStatus.FROZEN, FROZEN[:32], op[1])
    until = parent.spendable().get(op[1]) if parent.spendable_in != NO_SPENDABLE else None
    if until is not None and until > tip:
        return SpendInfo(SpendStatus.IMMATURE, until=until + 1)
    if data != UNSPENT:
        return SpendInfo(SpendStatus.SPENT, data[:32], int.from_bytes(data[32:], "little"))
    if parent.is_coinbase and parent.spending_height > tip + 1:
        return SpendInfo(SpendStatus.IMMATURE, until=parent.spending_height)
    return SpendInfo(SpendStatus.OK)
