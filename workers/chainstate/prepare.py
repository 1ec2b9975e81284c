"""Work done on blocks ahead of the chain's tip by a worker that does not hold the chain, so
that the holder does less (docs/architecture.md, "The pipeline": workers that do not hold the chain
prepare the next blocks). Today that is each block's change to the UTXO-set commitment
(`workers.chainstate.commitment.block_delta`: the MuHash of the coins it creates over those it spends),
about a fifth of what applying a block costs its holder; the holder takes a prepared delta
instead of computing it (`Sequencer._apply`).

Invariants:
- A block's delta is a function of the block and its ancestry (the coins it spends were made by
  its ancestors, at their heights), so it stays right for that block whatever else happens —
  but for the heights, which follow from the chain's base. It is stored with its `basis` (the
  base and the block's height), and the holder takes it only while both still hold; otherwise,
  or when there is none, the holder computes the delta itself, as it always could. A prepared
  delta only ever saves work: one lost or never made changes nothing but speed.
- The preparer walks the best chain upward from the tip, lowest first, only while the tip is
  the fork point (no reorg pending), at most AHEAD_TXS transactions (and AHEAD blocks) above
  it, one preparer at a time (the `prepare` lease), once for each block message a worker finds
  the chain held for.
- A spent coin comes from the coins of the blocks this process prepared (kept with their
  elements, each with the block that made it), used only when that block is below it on the
  walk or applied at or below the walk's tip, both seen in one epoch (so an ancestor: heights
  never change but with the base, and a change of base forgets every kept coin). Else from the
  UTXO store, read between two looks at the chain that find the same epoch (nothing taken off
  the chain meanwhile: `Sequencer` bumps it before any such change) and the tip an ancestor of
  the block, and taken only at or below the first look's tip, so that every height read is an
  ancestor's (above it, the store may already hold blocks the state store does not show yet).
  A coin found in neither makes no delta (the holder finds out why: a missing input, a block
  to refuse).
- The holder takes no delta for a block some of whose inputs it skipped as missing (missing
  inputs allowed): the preparer may have found those coins before their records were pruned.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field

from chain import Block
from chain.muhash import MuHash, coin_bytes, elements
from stores.errors import StorageError
from stores.state import BlockEntry, BlockStatus, PreparedDelta, StateStore
from stores.utxo import UtxoStore
from workers.chainstate import commitment

log = logging.getLogger("utxoflow.prepare")

LEASE = "prepare"
EPOCH = "epoch"  # state meta: bumped before anything is taken off the chain (`Sequencer`)
# Blocks above the tip prepared at most: the holder applies them within seconds, and their
# coins must stay kept (`Coins`: ~90,000 at 64 MB) for the blocks above them that spend them.
AHEAD, AHEAD_TXS = 64, 40_000
Outpoint = tuple[bytes, int]
_ENTRY = 700  # a kept coin: its element (a 3072-bit number), key, creator and the dict's slot


class _Moved(Exception):
    """The chain moved under a read of the UTXO store: what it read may not be the block's
    ancestors'."""


def basis(base_hex: str | None, height: int | None) -> str:
    """What a block's delta holds for: the chain's base and the block's height."""
    return f"{base_hex}:{height}"


@dataclass
class Coins:
    """Coins of the blocks this process prepared: outpoint → (element, satoshis, the block that
    made it), bounded by memory in two generations (as `commitment.RecentCoins`). The blocks
    whose coins each generation holds are kept beside it, so that `makers` and a `keep_only`
    that forgets nothing (every walk's) cost the number of blocks, not of coins."""

    max_coins: int = (64 << 20) // _ENTRY
    _young: dict[Outpoint, tuple[int, int, bytes]] = field(default_factory=dict)
    _old: dict[Outpoint, tuple[int, int, bytes]] = field(default_factory=dict)
    _young_makers: set[bytes] = field(default_factory=set)
    _old_makers: set[bytes] = field(default_factory=set)

    def clear(self) -> None:
        self._young, self._old = {}, {}
        self._young_makers, self._old_makers = set(), set()

    def get(self, op: Outpoint) -> tuple[int, int, bytes] | None:
        c = self._young.get(op)
        return c if c is not None else self._old.get(op)

    def add(self, coins: dict[Outpoint, tuple[int, int, bytes]]) -> None:
        half = max(self.max_coins // 2, 1)
        if len(self._young) + len(coins) > half:
            self._old, self._young = self._young, {}
            self._old_makers, self._young_makers = self._young_makers, set()
        self._young.update(coins)
        self._young_makers.update(c[2] for c in coins.values())

    def makers(self) -> set[bytes]:
        """The blocks some of whose coins are kept (a block whose coins span both generations
        is in both sets; one whose last coins went with the old generation, in neither)."""
        return self._young_makers | self._old_makers

    def keep_only(self, makers: set[bytes]) -> None:
        """Forget the coins of every block but `makers`."""
        for d, kept in ((self._young, self._young_makers), (self._old, self._old_makers)):
            if kept <= makers:
                continue
            for op in [op for op, c in d.items() if c[2] not in makers]:
                del d[op]
            kept &= makers


class Preparer:
    def __init__(
        self,
        state: StateStore,
        utxo: UtxoStore,
        genuine: Callable[[bytes], Block],
        lease: Callable[[str, float], AbstractContextManager[bool]],
        base: Callable[[], str | None],
    ) -> None:
        """`genuine(hash)` gives a block whose transactions match its header; `lease(name, ttl)`
        holds a named lease while inside; `base()` is the chain's base (hex)."""
        self.state = state
        self.utxo = utxo
        self.genuine = genuine
        self.lease = lease
        self.base = base
        self.coins = Coins()
        self._base: str | None = None
        # blocks this process prepared (their coins kept), or found a coin missing for: not again
        self._done: set[bytes] = set()
        self._entries: dict[bytes, BlockEntry] = {}  # the last walk's blocks
        self._applied: dict[bytes, int] = {}  # makers of kept coins found applied in `_epoch`: heights
        self._epoch: str | None = None

    def ahead(self, budget_s: float) -> int:
        """Prepare the blocks above the tip that have no delta yet (see the module), for up to
        `budget_s`; how many were made. Returns at once when another worker prepares, or
        nothing is ahead. (One walk a call: a worker calls it for each block message it finds
        the chain held for, and between them takes its other messages — helpers' units,
        pruner runs — rather than wait here for the holder to move.)"""
        deadline = time.monotonic() + budget_s
        with self.lease(LEASE, max(30.0, 2 * budget_s)) as mine:
            if not mine:
                return 0
            epoch, base = self.state.get_meta(EPOCH), self.base()
            if base != self._base:  # heights follow the base: every kept coin and entry is stale
                self.coins.clear()
                self._done.clear()
                self._entries.clear()
                self._base = base
            if epoch != self._epoch:  # blocks left the chain: which makers are applied, again
                self._applied.clear()
                self._epoch = epoch
            tip, best = self.state.tip(), self.state.best_candidate()
            if tip is None or best is None or best.hash == tip.hash or tip.height is None:
                return 0
            path = self._path(tip, best)
            if not path:
                return 0
            self._forget_off_chain(path, tip.height)
            if self.state.get_meta(EPOCH) != epoch or self.base() != base:
                return 0  # the chain moved while the walk was being laid out: the next one
            return self._walk(tip, path, deadline)

    def _walk(self, tip: BlockEntry, path: list[BlockEntry], deadline: float) -> int:
        """Prepare the blocks of `path` (above `tip`) that need it; how many were made."""
        on_path = {e.hash for e in path}
        made = 0
        for k, e in enumerate(path):
            if time.monotonic() > deadline:
                break
            if e.hash in self._done:
                continue
            try:
                delta = self._prepare(e, {tip.hash, *(p.hash for p in path[:k])}, on_path)
            except _Moved:  # the chain moved under the read: the next walk tries again
                continue
            self._done.add(e.hash)
            if delta is not None:
                self.state.commit(deltas={e.hash: delta})
                made += 1
        return made

    def _path(self, tip: BlockEntry, best: BlockEntry) -> list[BlockEntry]:
        """The best chain's blocks above the tip, lowest first (at most AHEAD blocks and about
        AHEAD_TXS transactions); none while the tip is not their fork point (a reorg is
        pending) or one of them is not pending. Entries read before are taken again from
        memory: a block's parent and size never change, and its height only with the base."""
        up: list[BlockEntry] = []
        b: BlockEntry | None = best
        while b is not None and b.hash != tip.hash:
            if b.status is not BlockStatus.PENDING or (up and len(up) > 4 * AHEAD):
                return []
            up.append(b)
            b = self._entries.get(b.parent) or self.state.get_block(b.parent)
        if b is None:
            return []
        up.reverse()
        self._entries = {e.hash: e for e in up}
        out: list[BlockEntry] = []
        txs = 0
        for e in up[:AHEAD]:
            txs += e.n_txs
            if out and txs > AHEAD_TXS:
                break
            out.append(e)
        return out

    def _forget_off_chain(self, path: list[BlockEntry], tip_height: int) -> None:
        """Keep only the coins of the walk's blocks and of the tip's ancestors: blocks applied
        at or below the tip's height, in the epoch the walk began in (`ahead` checks it did not
        move: then the applied blocks form one chain that only grew, through the tip). A block
        applied above the tip's height may be another branch's, applied meanwhile."""
        on_path = {e.hash for e in path}
        keep = set()
        for maker in self.coins.makers():
            height = self._applied.get(maker)
            if height is None and maker not in on_path:
                e = self.state.get_block(maker)
                if e is not None and e.status is BlockStatus.APPLIED and e.height is not None:
                    height = self._applied[maker] = e.height  # (applied in this epoch: stays so)
            if maker in on_path or (height is not None and height <= tip_height):
                keep.add(maker)
        self.coins.keep_only(keep)
        self._done &= keep

    def _prepare(self, e: BlockEntry, below: set[bytes], on_path: set[bytes]) -> PreparedDelta | None:
        """Block `e`'s delta (its coins kept for the blocks above it), or None when a coin it
        spends could not be found as the module says. `below`: the walk's tip and its blocks
        under `e` (kept coins of the walk's other blocks are not its ancestors'; the others kept
        are applied)."""
        block = self.genuine(e.hash)
        assert e.height is not None
        made = self._created(block, e)
        self.coins.add(made)
        spent: list[int] = []
        sats = -sum(v for _el, v, _m in made.values())
        read: list[Outpoint] = []
        for op in commitment.outside_inputs(block):
            c = self.coins.get(op)
            if c is not None and (c[2] in below or c[2] not in on_path):
                spent.append(c[0])
                sats += c[1]
            else:
                read.append(op)
        if read:
            found = self._read(below, read)
            if found is None:
                return None
            spent += found[0]
            sats += found[1]
        h = MuHash()
        h.update_elements((el for el, _v, _m in made.values()), spent)
        return PreparedDelta(basis(self._base, e.height), h.to_bytes(), len(made) - len(spent), -sats)

    def _created(self, block: Block, e: BlockEntry) -> dict[Outpoint, tuple[int, int, bytes]]:
        """The coins the block adds to the set (as `commitment.block_delta` counts them), each
        with its element, satoshis and the block's hash."""
        assert e.height is not None
        return {op: (el, v, e.hash) for op, (el, v) in commitment.created_coins(block, e.height).items()}

    def _read(self, below: set[bytes], ops: list[Outpoint]) -> tuple[list[int], int] | None:
        """The elements and satoshis of coins read from the UTXO store (see the module), or
        None when one is missing or made above the tip; _Moved when the chain moved off the
        walk meanwhile (`below`: the walk's tip and blocks under the block: where the tip may
        be)."""
        epoch = self.state.get_meta(EPOCH)
        tip = self.state.tip()
        if tip is None or tip.hash not in below or tip.height is None:
            raise _Moved()
        infos = self.utxo.get_outputs(ops)
        now = self.state.tip()
        if self.state.get_meta(EPOCH) != epoch or now is None or now.hash not in below:
            raise _Moved()
        datas: list[bytes] = []
        sats = 0
        for op in ops:
            info = infos.get(op)
            if info is None or info.height is None or info.height > tip.height:
                return None
            datas.append(coin_bytes(op[0], op[1], info.height, info.coinbase, info.satoshis, info.script))
            sats += info.satoshis
        return elements(datas), sats


def prepared_for(
    state: StateStore, e: BlockEntry, base_hex: str | None
) -> tuple[PreparedDelta | None, PreparedDelta | None]:
    """(the delta stored for `e`, if any; it again if it holds for the chain as it is — its
    basis — else None)."""
    try:
        d = state.get_delta(e.hash)
    except StorageError as err:  # only a saving: the holder computes it
        log.warning("block %s: its prepared delta could not be read (%s)", e.hash[::-1].hex(), err)
        return None, None
    return d, (d if d is not None and d.basis == basis(base_hex, e.height) else None)
