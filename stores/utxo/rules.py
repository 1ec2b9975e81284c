"""Record rules shared by every backend: the spend checks and the delete-at-height rule.

Pure functions over plain values, so SQL backends (read under lock, decide here, write back) and
tests use exactly one statement of each rule.

Invariants:
- Spend checks run in the fixed order of `check_spend`; the first failing rule names the error.
- delete_at_height (DAH) is never set while `preserve_until` is set; a conflicting record gets it
  at once; otherwise only a record that is mined on the longest chain, not locked, and has every
  UTXO spent. An existing DAH is kept (not pushed later) while its rule still holds.
"""

from __future__ import annotations

from chain import hash_to_hex
from stores.utxo.errors import (
    Outpoint,
    TxCoinbaseImmature,
    TxConflicting,
    TxCreating,
    TxLocked,
    TxNotFound,
    UtxoError,
    UtxoFrozen,
    UtxoMismatch,
    UtxoNotFound,
    UtxoSpent,
    fmt_outpoint,
)

COINBASE_MATURITY = 100
REASSIGN_DELAY = 1000


def next_dah(
    *,
    current: int | None,
    conflicting: bool,
    locked: bool,
    preserve_until: int | None,
    spent: int,
    utxos: int,
    mined_on_longest: bool,
    height: int,
    retention: int,
) -> int | None:
    """The delete-at-height a record should carry after a change."""
    if preserve_until is not None:
        return None
    if conflicting:
        return current if current is not None else height + retention
    if locked:
        return None
    if spent >= utxos and mined_on_longest:
        return current if current is not None else height + retention
    return None


def check_spend(
    outpoint: Outpoint,
    expected_hash: bytes | None,
    spender: tuple[bytes, int],
    block_height: int,
    parent: tuple[bool, bool, bool, bool, int] | None,
    output: tuple[bytes, bytes | None, int | None, bool, int | None] | None,
) -> UtxoError | None:
    """Decide one input's spend. None means OK (a new spend, or the same spender again).

    parent: (creating, conflicting, locked, is_coinbase, spending_height) or None if missing.
    output: (utxo_hash, spending_txid, spending_vin, frozen, spendable_in) or None if missing.
    """
    name = fmt_outpoint(outpoint)
    if parent is None:
        return TxNotFound(f"parent tx of {name} not found", outpoint=outpoint)
    creating, conflicting, locked, is_coinbase, spending_height = parent
    if creating:
        return TxCreating(f"parent tx of {name} is still being created", outpoint=outpoint)
    if conflicting:
        return TxConflicting(f"parent tx of {name} is conflicting", outpoint=outpoint)
    if locked:
        return TxLocked(f"parent tx of {name} is locked", outpoint=outpoint)
    if is_coinbase and block_height < spending_height:
        return TxCoinbaseImmature(
            f"coinbase output {name} is spendable from height {spending_height}, not {block_height}",
            outpoint=outpoint,
            spendable_at=spending_height,
        )
    if output is None:
        return UtxoNotFound(f"output {name} does not exist", outpoint=outpoint)
    utxo_hash, spending_txid, spending_vin, frozen, spendable_in = output
    if expected_hash is not None and expected_hash != utxo_hash:
        return UtxoMismatch(
            f"output {name}: utxo hash {hash_to_hex(expected_hash)} does not match the stored "
            f"{hash_to_hex(utxo_hash)} (wrong script or value)",
            outpoint=outpoint,
        )
    if spendable_in is not None and block_height < spendable_in:
        return UtxoFrozen(
            f"output {name} is frozen until height {spendable_in}", outpoint=outpoint, until=spendable_in
        )
    if spending_txid is not None and spending_txid == spender[0] and spending_vin == spender[1]:
        return None
    if frozen:
        return UtxoFrozen(f"output {name} is frozen", outpoint=outpoint)
    if spending_txid is not None:
        assert spending_vin is not None
        return UtxoSpent(
            f"output {name} is already spent by {hash_to_hex(spending_txid)}:{spending_vin}",
            outpoint=outpoint,
            spending_txid=spending_txid,
            spending_vin=spending_vin,
        )
    return None
