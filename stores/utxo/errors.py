"""The UTXO store's verdicts on records: a small hierarchy with stable codes (Teranode's).

Every error names what it is about (`txid`, or `outpoint` as (txid, vout)), in internal byte
order, and its message shows hashes as Bitcoin shows them. `code` is stable: callers and the CLI
match on it, never on message text. `StorageError` (the backend failed) is every store's, from
`stores.errors`, and re-exported here for the UTXO store's callers.
"""

from __future__ import annotations

from typing import ClassVar

from chain import hash_to_hex
from stores import errors as base
from stores.errors import StorageError as StorageError  # re-exported: the UTXO store raises it
from stores.errors import StoreError

Outpoint = tuple[bytes, int]


def fmt_outpoint(op: Outpoint) -> str:
    return f"{hash_to_hex(op[0])}:{op[1]}"


class UtxoError(StoreError):
    code: ClassVar[str] = "UTXO_ERROR"

    def __init__(self, message: str, *, txid: bytes | None = None, outpoint: Outpoint | None = None) -> None:
        super().__init__(message)
        self.txid = txid
        self.outpoint = outpoint

    def to_json(self) -> dict[str, object]:
        d = super().to_json()
        if self.txid is not None:
            d["txid"] = hash_to_hex(self.txid)
        if self.outpoint is not None:
            d["outpoint"] = fmt_outpoint(self.outpoint)
        return d


class TxExists(UtxoError):
    code = "TX_EXISTS"


class TxNotFound(UtxoError):
    code = "TX_NOT_FOUND"


class UtxoNotFound(TxNotFound):
    """The parent record exists but has no such output (out of range, or a data carrier)."""

    code = "UTXO_NOT_FOUND"


class UtxoSpent(UtxoError):
    code = "UTXO_SPENT"

    def __init__(self, message: str, *, outpoint: Outpoint, spending_txid: bytes, spending_vin: int) -> None:
        super().__init__(message, outpoint=outpoint)
        self.spending_txid = spending_txid
        self.spending_vin = spending_vin


class InvalidSpend(UtxoError):
    """The spender is a child that was pruned (the parent lists it in `deleted_children`): a
    replay of a transaction that was mined and deleted long ago."""

    code = "INVALID_SPEND"


class UtxoFrozen(UtxoError):
    code = "UTXO_FROZEN"

    def __init__(self, message: str, *, outpoint: Outpoint, until: int | None = None) -> None:
        super().__init__(message, outpoint=outpoint)
        self.until = until  # None: frozen outright; else spendable from this height on


class UtxoAlreadyFrozen(UtxoError):
    code = "UTXO_ALREADY_FROZEN"


class UtxoNotFrozen(UtxoError):
    code = "UTXO_NOT_FROZEN"


class TxLocked(UtxoError):
    code = "TX_LOCKED"


class TxCreating(TxLocked):
    """The master record still has `creating` set: a multi-record creation is unfinished."""

    code = "TX_CREATING"


class TxConflicting(UtxoError):
    code = "TX_CONFLICTING"


class TxCoinbaseImmature(UtxoError):
    code = "TX_COINBASE_IMMATURE"

    def __init__(self, message: str, *, outpoint: Outpoint, spendable_at: int) -> None:
        super().__init__(message, outpoint=outpoint)
        self.spendable_at = spendable_at


class UtxoMismatch(UtxoError):
    code = "UTXO_HASH_MISMATCH"


class ProcessingError(UtxoError, base.ProcessingError):
    """A request the store cannot carry out as asked (bad argument, invalid state change)."""

    code = "PROCESSING_ERROR"


class SpendRejected(ProcessingError):
    """A transaction's spend failed; `errors` lists (input index, error) for every failed input.

    None of that transaction's spends remain in the store.
    """

    code = "SPEND_REJECTED"

    LISTED = 5  # failed inputs the message names; the rest are counted (`errors` has them all)

    def __init__(self, txid: bytes, errors: list[tuple[int, UtxoError]]) -> None:
        detail = "; ".join(f"input {vin}: [{e.code}] {e}" for vin, e in errors[: self.LISTED])
        if len(errors) > self.LISTED:  # a tx may fail thousands: a log line, a task result stay short
            detail += f"; and {len(errors) - self.LISTED} more of its inputs"
        super().__init__(f"tx {hash_to_hex(txid)} cannot spend: {detail}", txid=txid)
        self.errors = errors

    @property
    def first(self) -> UtxoError:
        return self.errors[0][1]

    def to_json(self) -> dict[str, object]:
        d = super().to_json()
        d["inputs"] = [{"vin": vin, **e.to_json()} for vin, e in self.errors]
        return d
