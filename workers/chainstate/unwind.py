"""Taking blocks off the chain, for the sequencer (`workers.chainstate.sequencer`, whose lease every
step here runs under): a reorg's disconnections, a block taken back whole by its undo record, a
block refused with its descendants, what a dead worker left half done, and a rebase.

Invariants:
- A disconnection writes the `disconnecting` mark (with a new chain epoch: preparers' reads
  from then on are thrown away) before its first change to the UTXO store, and clears it in the
  commit that moves the tip down; a worker that dies in between leaves the mark, and the next
  holder finishes the disconnection before anything else (`_take_back_unfinished`).
- The `applying` mark names every block of a batch whose UTXO part may be written and whose
  state-store step is not: the next holder takes them back, the last first, each by its undo
  record, before anything else; the mark shrinks in the commit that ends each take-back.
- A refused block and every descendant turn invalid in one commit, with its undo record and
  its prepared delta gone; a refusal the chain made (not an operator's) goes to the refusal log.
- A rebase takes every applied block back whole (their records were made at the old heights),
  then places the new base under the index lease; a worker that dies half way leaves the note,
  and the next holder does it again.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from contextlib import AbstractContextManager

from chain import Block, block_work
from stores.errors import StorageError
from stores.state import BlockChange, BlockEntry, BlockStatus, StateStore
from workers.chainstate.batch import APPLYING, applying_blocks, mark
from workers.chainstate.blockapply import BlockApplier
from workers.chainstate.blockindex import BASE, INDEX_LEASE, REBASE, SNAPSHOT, BlockIndex, Blocks, base_height
from workers.chainstate.fanout import settle_block
from workers.ops import metrics

log = logging.getLogger("utxoflow.sequencer")

DISCONNECTING = "disconnecting"  # state meta: the block being taken off the chain now
REBASE_INDEX_WAIT_S = 30.0  # a rebase waits this long for the index lease (then fails, retried)


class Unwinding:
    """The sequencer's steps that take blocks off the chain (see the module)."""

    state: StateStore
    index: BlockIndex
    blocks: Blocks
    applier: BlockApplier
    lease_s: float
    _settled: set[bytes]
    # the sequencer's
    lease: Callable[[str, float | None, float], AbstractContextManager[bool]]
    load: Callable[[bytes], Block]
    _renew: Callable[[], None]
    _forget: Callable[[], None]
    _bump_epoch: Callable[[], dict[str, str | None]]

    def _take_back_unfinished(self) -> None:
        """A worker died while disconnecting a block (the `disconnecting` mark names it): finish
        that. One died while applying a block (the `applying` mark): take back what it did,
        whether or not that block is still on the best chain. Before anything else."""
        d = self.state.get_meta(DISCONNECTING)
        if d is not None:
            e = self.state.get_block(bytes.fromhex(d))
            if e is not None and e.status is BlockStatus.APPLIED:
                log.warning("finishing the disconnection of block %s, left half done", e.hash[::-1].hex())
                self._disconnect(e)
            else:
                self.state.commit(meta={DISCONNECTING: None})
        marked = applying_blocks(self.state)
        if not marked:
            return
        self._forget()
        for k in reversed(range(len(marked))):  # the last applied first: each on what was before it
            block_hash = marked[k]
            undo = self.state.get_undo(block_hash)
            if undo is not None and undo.get("state") == "applying":
                log.warning("taking back block %s, left half applied", block_hash[::-1].hex())
                settle_block(self.state, block_hash, self.lease_s)  # its units: none may still write
                self.applier.rollback(self.load(block_hash), undo)
                self.state.commit(undo={block_hash: None}, meta={APPLYING: mark(marked[:k])})
        self.state.commit(meta={APPLYING: None})

    def _invalidate_below(self, bad: BlockEntry) -> None:
        """Descendants of an invalid block that are not marked so yet (indexed while it was
        being refused) are invalid."""
        changes = self.index.rederive(bad, lambda e: e.status is not BlockStatus.INVALID)
        self.state.commit(blocks=changes)
        self._settled.update(c.hash for c in changes)

    def _orphan_below(self, e: BlockEntry) -> None:
        changes = self.index.rederive(e, lambda k: k.status is not BlockStatus.ORPHAN)
        self.state.commit(blocks=changes)
        self._settled.update(c.hash for c in changes)

    def _disconnect(self, e: BlockEntry) -> None:
        """A reorg takes this applied block off the best chain: its transactions stay, unmined."""
        assert e.height is not None
        self._forget()
        block = self.load(e.hash)
        # from here on it is finished; preparers' reads from now on are thrown away
        self.state.commit(meta={DISCONNECTING: e.hash.hex(), **self._bump_epoch()})
        self.applier.disconnect(block, e.height, e.block_id)
        self._off_chain(e, meta={DISCONNECTING: None})
        log.info("disconnected block %s at height %d", block.hash_hex, e.height,
                 extra={"block": block.hash_hex, "height": e.height, "phase": "disconnected"})

    def _take_back(self, e: BlockEntry) -> None:
        """Take an applied block back whole, by its undo record (its new records deleted, its
        spends cleared), as if it had never been applied; the tip goes to its parent. Without
        an undo record (deleted below the retention) only its mining is unset."""
        undo = self.state.get_undo(e.hash)
        if undo is None:
            self._disconnect(e)
            return
        self._forget()
        self.applier.rollback(self.load(e.hash), undo)
        self._off_chain(e)

    def _off_chain(self, e: BlockEntry, meta: dict[str, str | None] | None = None) -> None:
        """Commit `e` off the chain (its UTXO part done): side, its undo record gone, the tip at
        its parent if that is applied (the base has none); `meta` in the same commit."""
        p = self.state.get_block(e.parent)
        below = p.hash if p is not None and p.status is BlockStatus.APPLIED else None
        self.state.commit(
            blocks=[BlockChange(e.hash, status=BlockStatus.SIDE)],
            tip=below,
            undo={e.hash: None},
            meta=meta or {},
        )
        metrics.block_disconnected()

    def _invalidate(self, e: BlockEntry, reason: str, logged: bool = True) -> None:
        """Refuse a block: it and every descendant are invalid (one commit), nothing of it stays;
        `logged`: in the refusal log too (not an operator's own verdict, `invalidate`)."""
        log.warning("block %s is invalid: %s", e.hash[::-1].hex(), reason,
                    extra={"block": e.hash[::-1].hex(), "height": e.height, "phase": "refused"})
        bad = BlockEntry(
            e.hash, e.parent, e.height, e.work, BlockStatus.INVALID, reason, e.block_id, e.seq, e.n_txs
        )
        changes = [
            BlockChange(e.hash, status=BlockStatus.INVALID, reason=reason),
            *self.index.rederive(bad, lambda k: k.status is not BlockStatus.INVALID),
        ]
        self.state.commit(blocks=changes, undo={e.hash: None}, meta={APPLYING: None}, deltas={e.hash: None})
        if logged:
            hexed = e.hash[::-1].hex()
            self.state.note_refusal(f"block:{hexed}", "block", hexed, reason)  # (before its message goes)
        self._settled.update(c.hash for c in changes)
        metrics.blocks_refused(len(changes))

    def _rebase(self, check_budget: Callable[[], None]) -> None:
        """Carry out a rebase the index noted (see the invariants)."""
        if self.state.get_meta(REBASE) is None:
            return
        tip = self.state.tip()
        if tip is not None and tip.reason != SNAPSHOT:  # blocks leave the chain: preparers' reads go
            self.state.commit(meta=self._bump_epoch())
        while tip is not None and tip.reason != SNAPSHOT:
            self._renew()
            self._take_back(tip)
            check_budget()
            tip = self.state.tip()
        # the heights change under the index's feet; the holder waits for the index lease rather
        # than leave the pass (the worker indexing would leave its block to this pass)
        with self.lease(INDEX_LEASE, 30.0, REBASE_INDEX_WAIT_S) as mine:
            if not mine:
                raise StorageError("the index lease has been held for too long: the chain waits")
            root = self.index.rebase_root()  # (ancestors that arrived since the note count)
            if root is None:
                self.state.commit(meta={REBASE: None})
                return
            root_hash = root.hash
            block = self.load(root_hash)
            reason = self.blocks.check(block)
            status = BlockStatus.INVALID if reason else BlockStatus.PENDING
            work = 0 if reason else block_work(block.header.bits)
            change = BlockChange(
                root_hash, status=status, reason=reason or "", height=base_height(block), work=work
            )
            now = BlockEntry(
                root.hash,
                root.parent,
                change.height,
                work,
                status,
                reason,
                root.block_id,
                root.seq,
                root.n_txs,
            )
            self.state.commit(
                blocks=[change, *self.index.rederive(now)], meta={BASE: root_hash.hex(), REBASE: None}
            )
        log.warning(
            "block %s is the chain's base now (height %d): the chain is applied again from it",
            root_hash[::-1].hex(),
            change.height or 0,
        )
