"""The kernel's verdicts on one output, worded once: the rules (`spend`, `outputs`) decide which
applies, and so does each backend's port of them (Aerospike's Lua module returns a code and its
data; `stores.utxo.aerospike.rules` turns that into the same error through these).

`parent`: said of an input's parent (a spend) rather than of the transaction itself.
"""

from __future__ import annotations

from chain import hash_to_hex
from stores.utxo.errors import (
    InvalidSpend,
    Outpoint,
    ProcessingError,
    TxCoinbaseImmature,
    TxConflicting,
    TxCreating,
    TxLocked,
    TxNotFound,
    UtxoAlreadyFrozen,
    UtxoFrozen,
    UtxoMismatch,
    UtxoNotFound,
    UtxoNotFrozen,
    UtxoSpent,
    fmt_outpoint,
)


def _of(op: Outpoint, parent: bool) -> str:
    return f"{'parent tx' if parent else 'tx'} of {fmt_outpoint(op)}"


def tx_not_found(op: Outpoint, parent: bool = False) -> TxNotFound:
    return TxNotFound(f"{_of(op, parent)} not found", outpoint=op)


def tx_creating(op: Outpoint, parent: bool = False) -> TxCreating:
    return TxCreating(f"{_of(op, parent)} is still being created", outpoint=op)


def page_creating(op: Outpoint) -> TxCreating:
    """A child page still being created (its master normally says so first)."""
    return TxCreating(f"tx {hash_to_hex(op[0])} is still being created", outpoint=op)


def tx_conflicting(op: Outpoint) -> TxConflicting:
    return TxConflicting(f"{_of(op, True)} is conflicting", outpoint=op)


def tx_locked(op: Outpoint) -> TxLocked:
    return TxLocked(f"{_of(op, True)} is locked", outpoint=op)


def coinbase_immature(op: Outpoint, spendable_at: int, height: int) -> TxCoinbaseImmature:
    return TxCoinbaseImmature(
        f"coinbase output {fmt_outpoint(op)} is spendable from height {spendable_at}, not {height}",
        outpoint=op,
        spendable_at=spendable_at,
    )


def utxo_not_found(op: Outpoint) -> UtxoNotFound:
    return UtxoNotFound(f"output {fmt_outpoint(op)} does not exist", outpoint=op)


def mismatch(op: Outpoint, want: bytes, stored: bytes | None = None, spend: bool = False) -> UtxoMismatch:
    """`stored`: the hash the record has (named in a spend's and GetSpend's wording)."""
    text = f"output {fmt_outpoint(op)}: utxo hash {hash_to_hex(want)} does not match"
    if stored is not None:
        text += f" the stored {hash_to_hex(stored)}" + (" (wrong script or value)" if spend else "")
    return UtxoMismatch(text, outpoint=op)


def reassigned(op: Outpoint, until: int) -> UtxoFrozen:
    """A reassigned output whose `spendable_in` is `until` (spendable from until + 1)."""
    return UtxoFrozen(
        f"output {fmt_outpoint(op)} was reassigned: spendable from height {until + 1}",
        outpoint=op,
        until=until + 1,
    )


def invalid_spend(op: Outpoint, spender: bytes) -> InvalidSpend:
    return InvalidSpend(
        f"output {fmt_outpoint(op)}: its spender {hash_to_hex(spender)} was pruned; it cannot spend again",
        outpoint=op,
    )


def frozen(op: Outpoint, unspend: bool = False) -> UtxoFrozen:
    tail = ": there is no spend to take back" if unspend else ""
    return UtxoFrozen(f"output {fmt_outpoint(op)} is frozen{tail}", outpoint=op)


def spent(op: Outpoint, by: bytes, vin: int, freeze: bool = False) -> UtxoSpent:
    if freeze:
        text = f"output {fmt_outpoint(op)} is spent by {hash_to_hex(by)}:{vin}; only unspent ones are frozen"
    else:
        text = f"output {fmt_outpoint(op)} is already spent by {hash_to_hex(by)}:{vin}"
    return UtxoSpent(text, outpoint=op, spending_txid=by, spending_vin=vin)


def spent_twice(op: Outpoint, txid: bytes, first: int, vin: int) -> UtxoSpent:
    return UtxoSpent(
        f"output {fmt_outpoint(op)} is spent twice by the same tx (inputs {first} and {vin})",
        outpoint=op,
        spending_txid=txid,
        spending_vin=first,
    )


def already_frozen(op: Outpoint) -> UtxoAlreadyFrozen:
    return UtxoAlreadyFrozen(f"output {fmt_outpoint(op)} is already frozen", outpoint=op)


def not_frozen(op: Outpoint) -> UtxoNotFrozen:
    return UtxoNotFrozen(f"output {fmt_outpoint(op)} is not frozen", outpoint=op)


def no_new_hash(op: Outpoint) -> ProcessingError:
    """A reassign to the all-zero hash, which marks an empty slot."""
    return ProcessingError("the new UTXO hash must not be all zero (it marks an empty slot)", outpoint=op)
