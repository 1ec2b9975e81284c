"""An operator's verdicts on blocks (`utxo invalidate`, `utxo reconsider`), as Bitcoin Core's
invalidateblock and reconsiderblock, for the sequencer (`workers.chainstate.sequencer`).

Invariants:
- A verdict is given under the chain's lease (ChainBusy when another worker holds it past the
  wait), after whatever a dead worker left half done is finished, so it never meets a block
  half applied.
- Invalidating an applied block first takes it off the chain with every block above it, the
  tip first (a reorg down to its parent); the chain's base, and a block deeper below the tip
  than the retention, cannot be invalidated (there is nothing below to go back to, or the
  records it needs may be pruned).
- Reconsidering clears the verdict of a block, of its invalid ancestors and of their invalid
  descendants: they are placed again and checked again when they are the best chain's; their
  refusals leave the refusal log.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager

from stores.state import BlockEntry, BlockStatus, StateStore
from workers.chainstate.blockindex import SNAPSHOT, BlockIndex
from workers.chainstate.chainlease import ChainBusy


class Verdicts:
    """`invalidate` and `reconsider` (see the module)."""

    state: StateStore
    index: BlockIndex
    retention: int
    # the sequencer's
    lease: Callable[..., AbstractContextManager[bool]]
    _renew: Callable[[], None]
    _take_back_unfinished: Callable[[], None]
    _rebase: Callable[[Callable[[], None]], None]
    _disconnect: Callable[[BlockEntry], None]
    _invalidate: Callable[..., None]

    def invalidate(self, h: bytes, reason: str, wait_s: float = 30.0) -> BlockEntry:
        """Refuse block `h` and every descendant, as Bitcoin Core's invalidateblock: an applied
        one is first taken off the chain with every block above it (a reorg down to its parent),
        under the chain's lease (ChainBusy after `wait_s`). KeyError: not known; ValueError: it
        cannot be (the snapshot's block, or deeper below the tip than the retention)."""
        with self.lease(wait_s=wait_s) as mine:
            if not mine:
                raise ChainBusy()
            self._take_back_unfinished()
            self._rebase(lambda: None)
            e = self.state.get_block(h)
            if e is None:
                raise KeyError(h)
            if e.status is BlockStatus.APPLIED:
                tip = self.state.tip()
                assert tip is not None and tip.height is not None and e.height is not None
                base = self.index.base()
                if e.reason == SNAPSHOT or (base is not None and base.hash == e.hash):
                    raise ValueError(f"block {h[::-1].hex()} is the chain's base: there is nothing below "
                                     "it to go back to")
                depth = tip.height - e.height + 1
                if self.retention and depth > self.retention:
                    raise ValueError(f"block {h[::-1].hex()} is {depth} blocks below the tip, deeper than "
                                     f"the retention ({self.retention}): records it needs may be pruned")
                a: BlockEntry | None = tip
                while a is not None and a.status is BlockStatus.APPLIED:  # the tip first, down to e
                    self._renew()
                    self._disconnect(a)
                    a = None if a.hash == h else self.state.get_block(a.parent)
                e = self.state.get_block(h)
                assert e is not None
            self._invalidate(e, reason, logged=False)
            out = self.state.get_block(h)
            assert out is not None
            return out

    def reconsider(self, h: bytes, wait_s: float = 30.0) -> list[BlockEntry]:
        """Clear block `h` of its verdict, as Bitcoin Core's reconsiderblock: it, its invalid
        ancestors and their invalid descendants are placed again (`BlockIndex.reconsidered`),
        to be applied (and checked again) when they are the best chain's; under the chain's
        lease. The blocks placed, as they now stand. KeyError: not known."""
        with self.lease(wait_s=wait_s) as mine:
            if not mine:
                raise ChainBusy()
            e = self.state.get_block(h)
            if e is None:
                raise KeyError(h)
            root = e
            while root.status is BlockStatus.INVALID:
                p = self.state.get_block(root.parent)
                if p is None or p.status is not BlockStatus.INVALID:
                    break
                root = p
            if root.status is not BlockStatus.INVALID:
                return []
            changes = self.index.reconsidered(root)
            self.state.commit(blocks=changes)
            self.state.forget_refusals([f"block:{c.hash[::-1].hex()}" for c in changes])
        placed = [self.state.get_block(c.hash) for c in changes]
        return [b for b in placed if b is not None]
