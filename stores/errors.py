"""Errors every store raises (UTXO, blob, state), with stable codes.

- `StorageError`: the backing store failed (connection, disk, server). Retryable, and never a
  verdict on the data: whatever the call was doing is either done whole or not at all.
- `ProcessingError`: a request the store cannot carry out as asked (a bad argument, a value the
  database refuses, an invalid state change). Retrying the same request cannot help.

The UTXO store's verdicts on records (`stores.utxo.errors`) are StoreErrors too, so a caller
that only needs "did the store refuse or fail" catches `StoreError`. `code` is stable: callers
and the CLI match on it, never on message text.
"""

from __future__ import annotations

from typing import ClassVar


class StoreError(Exception):
    code: ClassVar[str] = "STORE_ERROR"

    def to_json(self) -> dict[str, object]:
        return {"code": self.code, "message": str(self)}


class StorageError(StoreError):
    """The backing store failed: retryable, never a verdict on data."""

    code = "STORAGE_ERROR"


class ProcessingError(StoreError):
    """A request the store cannot carry out as asked (bad argument, invalid state change)."""

    code = "PROCESSING_ERROR"
