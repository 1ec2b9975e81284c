"""What the chain sequencer keeps between blocks (ARCHITECTURE "stores/state").

Invariants every backend keeps (tests/state checks each):
- A block is added once (create-only); its hash, parent and arrival order never change.
- `best_candidate` is the connected block of most cumulative work that is neither invalid nor
  an orphan; among equals, the first seen (lowest arrival order) wins, so ties keep the chain.
- An undo record is written before a block's first change and read back whole.
- A lease has at most one holder until it expires.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from chain import hash_to_hex


class BlockStatus(enum.StrEnum):
    PENDING = "pending"  # connected, on or off the best chain, not applied (yet)
    APPLIED = "applied"  # applied to the UTXO store: on the best chain, at or below the tip
    SIDE = "side"  # connected and valid so far, on a lighter branch (or reorganised away)
    ORPHAN = "orphan"  # its parent has not arrived
    INVALID = "invalid"  # refused whole (see `reason`), with every descendant


@dataclass(frozen=True, slots=True)
class BlockEntry:
    hash: bytes
    parent: bytes
    height: int | None  # None while an orphan
    work: int | None  # cumulative proof of work up to this block; None while an orphan
    status: BlockStatus
    reason: str | None
    block_id: int  # small integer naming the block in the UTXO store's block lists
    seq: int  # arrival order
    n_txs: int

    def to_json(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "hash": hash_to_hex(self.hash), "height": self.height, "status": self.status.value,
        }
        if self.reason:
            d["reason"] = self.reason
        return d


@runtime_checkable
class StateStore(Protocol):
    url: str

    def add_block(
        self, hash: bytes, parent: bytes, height: int | None, work: int | None, status: BlockStatus,
        n_txs: int, reason: str | None = None,
    ) -> BlockEntry:
        """Create-only: the stored entry (the existing one if the hash is known)."""

    def get_block(self, hash: bytes) -> BlockEntry | None: ...
    def update_block(
        self, hash: bytes, *, status: BlockStatus | None = None, reason: str | None = None,
        height: int | None = None, work: int | None = None,
    ) -> None: ...
    def children(self, parent: bytes) -> list[BlockEntry]: ...
    def best_candidate(self) -> BlockEntry | None: ...
    def tip(self) -> BlockEntry | None: ...
    def set_tip(self, hash: bytes | None) -> None: ...
    def is_empty(self) -> bool: ...
    def get_meta(self, key: str) -> str | None: ...
    def set_meta(self, key: str, value: str | None) -> None:
        """Set (None: remove) a small named value of the chain (e.g. the block being applied)."""
    def counts(self) -> dict[str, int]: ...

    def put_undo(self, hash: bytes, data: dict[str, Any]) -> None: ...
    def get_undo(self, hash: bytes) -> dict[str, Any] | None: ...
    def delete_undo(self, hash: bytes) -> None: ...

    def acquire_lease(self, name: str, holder: str, ttl_s: float) -> bool:
        """Take or renew the lease `name` for `holder`; False while another holds it."""

    def lease_holder(self, name: str) -> str | None: ...
    def release_lease(self, name: str, holder: str) -> None: ...
    def close(self) -> None: ...
