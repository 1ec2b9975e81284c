"""Blocks applied in batches: consecutive blocks ready to apply share one UTXO-store transaction
(SQLite, `UtxoStore.fused`), and their state-store step is one commit after it
(`Sequencer._finish`).

Invariants:
- The `applying` mark (state meta APPLYING) names every block of the batch, in order, from
  before its first write until its state-store step is committed; a worker that dies at any
  point leaves them to the next holder, which takes them back the last first.
- Each block is all or nothing by itself within the transaction (a savepoint): a refused
  block's writes go, and the blocks before it are committed (the mark then naming the refused
  one alone) before it is marked invalid.
- The chain lease is renewed just before the commit: a holder that lost it rolls back.
- Where blocks are not fused (PostgreSQL, or units shared with other workers), every block is
  a batch of its own, committed as it is applied.
"""

from __future__ import annotations

from contextlib import ExitStack
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from stores.state import BlockEntry, Commitment, StateStore

if TYPE_CHECKING:
    from stores.utxo import UtxoStore

APPLYING = "applying"  # state meta: the blocks being applied now, in order (space-separated hashes)

# Consecutive blocks ready to apply share one UTXO-store transaction (SQLite, `fused`), up to
# this many blocks or transactions: each block's writes then land on pages the one before
# dirtied, and the commit's cost is shared. Small enough that a batch commits within a second
# or so (another process's writes wait for it; `utxo wait` sees blocks applied when it does).
BATCH_BLOCKS = 8
BATCH_TXS = 16_000


@dataclass
class Applied:
    """A block applied inside a batch, its state-store step still to commit."""

    entry: BlockEntry
    undo: dict[str, Any]
    counts: dict[str, int]
    seconds: float
    txs: int
    phases: dict[str, float]  # seconds of each phase of applying it (workers.ops.metrics.phase)
    commitment: Commitment  # the confirmed set as it leaves it (workers.chainstate.commitment)
    prepared: bool = False  # its commitment delta was prepared by another worker (workers.chainstate.prepare)
    had_delta: bool = False  # a prepared delta was stored for it (taken or not): it goes with the commit


class Holder(Protocol):
    """What a batch needs of the chain's holder (`workers.chainstate.sequencer.Sequencer`)."""

    fuse: bool  # blocks share one UTXO-store transaction
    utxo: UtxoStore

    def _renew(self) -> None: ...
    def _finish(self, done: list[Applied], still: list[bytes] | None = None) -> None: ...


class Batch:
    """Blocks applied in one UTXO-store transaction, in order, and their state-store step
    committed after it (see the module's invariants)."""

    def __init__(self, seq: Holder) -> None:
        self.seq = seq
        self.done: list[Applied] = []
        self.hashes: list[bytes] = []
        self._open: ExitStack | None = None

    def begin(self) -> None:
        """Before a block's first write: the batch's transaction, if it is not open yet."""
        if self._open is None and self.seq.fuse:
            stack = ExitStack()
            stack.enter_context(self.seq.utxo.fused())
            self._open = stack

    def add(self, applied: Applied) -> None:
        self.done.append(applied)
        self.hashes.append(applied.entry.hash)
        if (not self.seq.fuse or len(self.done) >= BATCH_BLOCKS
                or sum(a.txs for a in self.done) >= BATCH_TXS):
            self.flush()

    def flush(self, still: list[bytes] | None = None) -> None:
        """Commit the transaction, then the blocks' state-store step (`still`: blocks the mark
        keeps naming after it, see `Sequencer._finish`). The lease is renewed just before the
        commit: a holder that lost it meanwhile rolls back instead of committing blocks that
        the next holder is already taking back."""
        if self._open is not None:
            try:
                self.seq._renew()
            except BaseException as exc:
                self.abort(exc)
                raise
            stack, self._open = self._open, None
            stack.close()  # COMMIT (an error here leaves every block to its mark)
        done, self.done, self.hashes = self.done, [], []
        if done:
            self.seq._finish(done, still)

    def abort(self, exc: BaseException) -> None:
        """Roll the transaction back: the blocks' marks take them back."""
        stack, self._open = self._open, None
        self.done, self.hashes = [], []
        if stack is not None:
            stack.__exit__(type(exc), exc, exc.__traceback__)


def applying_blocks(state: StateStore) -> list[bytes]:
    """The blocks the `applying` mark names, in the order they were applied."""
    mark = state.get_meta(APPLYING)
    return [bytes.fromhex(h) for h in mark.split()] if mark else []


def mark(hashes: list[bytes]) -> str | None:
    return " ".join(h.hex() for h in hashes) or None
