"""The blob store Protocol and the key rules every backend shares.

Invariants every backend keeps (the conformance suite in tests/blobs checks each):
- put_if_absent never overwrites and is atomic: of racing writers of one key exactly one wins,
  and no reader ever sees a partial blob.
- A failure of the store (server down, permission denied, disk full) raises StorageError naming
  the key, and leaves nothing half-written under that key.
- Keys are relative paths of [A-Za-z0-9._-] segments; their extension names the kind
  (`.tx`, `.outputs`, `.block`). Each blob may carry a delete-at-height mark.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from typing import Protocol, runtime_checkable

from chain import hash_to_hex
from stores.errors import ProcessingError, StoreError

KINDS = ("tx", "outputs", "block")
_KEY = re.compile(r"^[A-Za-z0-9_-][A-Za-z0-9._-]*(/[A-Za-z0-9_-][A-Za-z0-9._-]*)*$")


class BlobNotFound(StoreError):
    code = "BLOB_NOT_FOUND"

    def __init__(self, key: str) -> None:
        super().__init__(f"blob {key} not found")
        self.key = key


def check_key(key: str) -> str:
    """A key as the stores accept it, or ProcessingError naming what is wrong."""
    if not isinstance(key, str) or not _KEY.match(key) or ".." in key.split("/") or len(key) > 512:
        raise ProcessingError(f"bad blob key {key!r}: relative path of [A-Za-z0-9._-] segments expected")
    return key


def blob_key(hash_: bytes, kind: str) -> str:
    """The key of a block or transaction blob: two-character shard, display hex, kind extension."""
    if kind not in KINDS:
        raise ProcessingError(f"unknown blob kind {kind!r} (known: {', '.join(KINDS)})")
    h = hash_to_hex(hash_)
    return f"{h[:2]}/{h}.{kind}"


@runtime_checkable
class BlobStore(Protocol):
    url: str

    def put_if_absent(self, key: str, data: bytes) -> bool:
        """Store `data` under `key` unless something is there: True if this call wrote it."""

    def put_many_if_absent(self, items: Sequence[tuple[str, bytes]]) -> list[bool]:
        """`put_if_absent` of each (key, data), in their order, as one call whose writes may
        overlap (a batch of transactions): each keeps the single call's guarantees, and every
        blob this call wrote is durable when it returns. A failure is a StorageError naming a
        key; every other blob of the call is then whole under its key or absent (call again)."""

    def get(self, key: str, start: int = 0, end: int | None = None) -> bytes:
        """The blob, or bytes [start, end) of it; BlobNotFound if absent."""

    def exists(self, key: str) -> bool: ...

    def delete(self, key: str) -> None:
        """Remove the blob and its mark; a missing blob is not an error."""

    def list(self, prefix: str = "") -> Iterator[str]:
        """Keys that start with `prefix`, in no particular order."""

    def set_dah(self, key: str, height: int | None) -> None:
        """Mark the blob for deletion at `height` (None clears the mark); BlobNotFound if absent."""

    def get_dah(self, key: str) -> int | None: ...

    def close(self) -> None: ...
