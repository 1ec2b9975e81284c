"""Per-output states set by the alert system: freeze, unfreeze, reassign (Teranode's UDFs).

Each checks, in this order: the record (missing → TxNotFound; creating → TxCreating), the output
(no such slot → UtxoNotFound), its UTXO hash (another → UtxoMismatch), then its own state:
  freeze    unspent → frozen (spending data all 0xFF); frozen → UtxoAlreadyFrozen; spent →
            UtxoSpent naming the spender
  unfreeze  frozen → unspent; anything else → UtxoNotFrozen
  reassign  frozen → unspent under a new UTXO hash, spendable only after REASSIGN_DELAY blocks
            (`spendable_in` = tip + REASSIGN_DELAY: refused while that is >= the spend's
            height), the change logged in `reassignments`; anything else → UtxoNotFrozen

Invariants:
- None of them changes the spent count or the delete-at-height (Teranode's neither).
- A reassigned output counts one more UTXO in its record (Teranode's `recordUtxos + 1`), so the
  record is never "all spent" and never pruned: its reassignment log is kept for good.
"""

from __future__ import annotations

from chain import hash_to_hex
from stores.utxo import slots
from stores.utxo.errors import Outpoint, UtxoError
from stores.utxo.kernel import verdicts
from stores.utxo.kernel.record import Record

SLOT = slots.SLOT
REASSIGN_DELAY = 1000  # Teranode's ReAssignedUtxoSpendableAfterBlocks


def verified_slot(
    parent: Record | None, op: Outpoint, want: bytes, batch_size: int, *, creating_ok: bool = False
) -> tuple[Record, int] | UtxoError:
    """The record and offset of `op`'s slot, its UTXO hash `want`; else the error: TxNotFound,
    TxCreating (unless `creating_ok`), UtxoNotFound, UtxoMismatch."""
    if parent is None:
        return verdicts.tx_not_found(op)
    if parent.creating and not creating_ok:  # its creation is unfinished: outputs not settled
        return verdicts.tx_creating(op)
    loc = parent.locate(op[1], batch_size)
    if loc is None:
        return verdicts.utxo_not_found(op)
    rec, off = loc
    if not rec.utxos.startswith(want, off):
        return verdicts.mismatch(op, want)
    return loc


def freeze(parent: Record | None, op: Outpoint, want: bytes, batch_size: int) -> UtxoError | None:
    loc = verified_slot(parent, op, want, batch_size)
    if isinstance(loc, UtxoError):
        return loc
    assert parent is not None
    rec, off = loc
    data = bytes(rec.utxos[off + 32 : off + SLOT])
    if data == slots.FROZEN:
        return verdicts.already_frozen(op)
    if data != slots.UNSPENT:
        return verdicts.spent(op, data[:32], int.from_bytes(data[32:], "little"), freeze=True)
    parent.set_spending(rec, off, slots.FROZEN, 0)
    return None


def _frozen(
    parent: Record | None, op: Outpoint, want: bytes, batch_size: int
) -> tuple[Record, int] | UtxoError:
    loc = verified_slot(parent, op, want, batch_size)
    if isinstance(loc, UtxoError):
        return loc
    rec, off = loc
    if rec.utxos[off + 32 : off + SLOT] != slots.FROZEN:
        return verdicts.not_frozen(op)
    return loc


def unfreeze(parent: Record | None, op: Outpoint, want: bytes, batch_size: int) -> UtxoError | None:
    loc = _frozen(parent, op, want, batch_size)
    if isinstance(loc, UtxoError):
        return loc
    assert parent is not None
    parent.set_spending(loc[0], loc[1], slots.UNSPENT, 0)
    return None


def reassign(
    parent: Record | None, op: Outpoint, want: bytes, new_hash: bytes, tip: int, batch_size: int
) -> UtxoError | None:
    if new_hash == slots.NO_HASH:
        return verdicts.no_new_hash(op)
    loc = _frozen(parent, op, want, batch_size)
    if isinstance(loc, UtxoError):
        return loc
    assert parent is not None
    rec, off = loc
    rec.utxos[off : off + 32] = new_hash
    parent.set_spending(rec, off, slots.UNSPENT, 0)
    spendable = parent.spendable()
    spendable[op[1]] = tip + REASSIGN_DELAY
    parent.set_spendable(spendable)
    parent.add_reassignment(
        {
            "offset": op[1],
            "utxo_hash": hash_to_hex(want),
            "new_utxo_hash": hash_to_hex(new_hash),
            "block_height": tip,
        }
    )
    for r in {id(parent): parent, id(rec): rec}.values():  # the master counts the whole tx
        r.total_utxos += 1
        r.touch("total_utxos")
    return None
