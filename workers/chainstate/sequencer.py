"""The chain sequencer: applying the best chain, in order, whatever the order blocks arrived in
(docs/architecture.md, "The chain" and "The pipeline"). Which blocks are known and where they
stand is the block index's (`workers.chainstate.blockindex`); applying one block is
`workers.chainstate.blockapply`'s; the steps that take blocks off the chain are `unwind`'s, and an
operator's verdicts `verdicts`' (both mixed into the Sequencer, under its lease).

Invariants:
- Blocks are applied strictly in chain order, one at a time, by whoever holds the chain's
  lease; any number of workers may call `advance`, and all but one return at once. On SQLite
  consecutive blocks that are ready share one UTXO-store transaction, each block a savepoint
  of it (`workers.chainstate.batch`).
- The tip is the applied block of the best chain: the connected, not-invalid block of most
  cumulative work (first seen wins a tie). A heavier branch makes `advance` disconnect blocks
  back to the fork point, then apply the branch. A fork deeper than the retention is refused
  (the records it would need may be pruned).
- Every step of the chain's state commits in one state-store transaction: a block (or a
  batch of blocks) applied, their undo records marked, their commitments (`workers.chainstate.commitment`)
  written and the tip moved; a block disconnected
  and the tip moved down; a block refused with its descendants. The UTXO store's part of a step
  comes first; a worker that dies between the two leaves the `applying` mark (naming every
  block of a batch), and the next holder takes them back, the last first, and applies them
  again; or the `disconnecting` mark (written before a disconnection's first change), and the
  next holder finishes the disconnection. So the chain is never seen lower
  than where it was, nor an applied block above the tip, nor a block half off the chain.
- A rebase the index noted (a block arrived that the base descends from) is carried out before
  anything else: every applied block is taken back whole (its records were made at the old
  heights), and every block below the new base is placed again. It is idempotent: a worker
  that dies half way leaves the note, and the next holder does it again.
- A block whose ancestor is invalid is invalid; the best candidate is checked for that before it
  is applied, so a refusal is never retried without something new having arrived.
- Undo records of blocks more than the retention below the tip are deleted — once nothing can
  arrive below the base (`BlockIndex.start_known`); until then a rebase needs them all.
- A block is refused only while the UTXO store is the state store's own (`workers.chainstate.pairing`):
  found apart, the refusal is a StorageError, retried, and the block stays as it was.
- A block refused for spending outputs no block seen made, while the chain's start is unknown,
  says so in its reason, and is placed again when an earlier block arrives.
- A worker that finds the chain held leaves its block to the holder (tasks/blocks.py), which
  looks at the best chain once more after releasing the lease and goes on if anything is left:
  the block was indexed before its worker tried the lease, so before that look. No block waits
  for a worker to poll.
- `advance` stops after its time budget (`Unfinished`), between blocks (applied, disconnected or
  taken back by a rebase), so that a worker told to stop does so within seconds; whoever calls
  it again goes on from there.
- A worker that finds the chain held prepares the blocks ahead of it instead
  (`prepare_ahead`, `workers.chainstate.prepare`), and the holder takes a block's prepared commitment
  delta where its basis still holds. The chain's `epoch` (state meta) is bumped in the commit
  that starts taking a block off the chain (a disconnection, a rebase), before the UTXO store
  changes: a preparer's reads that straddle it are thrown away.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext

from chain import Block
from stores.blob.protocol import BlobStore
from stores.errors import StorageError
from stores.lease import holder_id
from stores.sqldb import same_sqlite_file
from stores.state import BlockChange, BlockEntry, BlockStatus, Commitment, StateStore
from stores.utxo import UtxoStore
from workers.chainstate import commitment
from workers.chainstate.batch import APPLYING, Applied, Batch, mark
from workers.chainstate.blockapply import UNSEEN, BlockApplier, BlockRefused
from workers.chainstate.blockindex import (
    BASE,
    REBASE,
    SNAPSHOT,
    START_UNKNOWN,
    BlockIndex,
    Blocks,
    CorruptBlock,
)
from workers.chainstate.chainlease import LEASE, ChainBusy, Unfinished
from workers.chainstate.fanout import Fanout, LocalFanout, settle_block
from workers.chainstate.pairing import apart
from workers.chainstate.prepare import EPOCH, Preparer, prepared_for
from workers.chainstate.unwind import DISCONNECTING, Unwinding
from workers.chainstate.verdicts import Verdicts
from workers.ops import activity, metrics

log = logging.getLogger("utxoflow.sequencer")

# How long the index lease is waited for by a block's indexing (it is held for milliseconds:
# longer means its holder is stuck; the task is then retried).
INDEX_WAIT_S = 10.0


class Sequencer(Verdicts, Unwinding):
    def __init__(
        self,
        utxo: UtxoStore,
        state: StateStore,
        blobs: BlobStore,
        *,
        allow_missing_inputs: bool = False,
        lease_s: float = 120.0,
        chunk_txs: int = 1000,
        fanout: Fanout | None = None,
    ) -> None:
        self.utxo = utxo
        self.state = state
        self.blobs = blobs
        self.blocks = Blocks(blobs)
        # the index lease is held for milliseconds at a time: its takers wait for it (a block
        # task rather than being retried and parsing its block again)
        self.index = BlockIndex(
            state, self.blocks, lambda name, ttl_s: self.lease(name, ttl_s, INDEX_WAIT_S), utxo.snapshot_block
        )
        self.applier = BlockApplier(
            utxo, allow_missing_inputs=allow_missing_inputs, chunk=chunk_txs, fanout=fanout or LocalFanout()
        )
        self.lease_s = lease_s
        self.retention = utxo.retention
        # Blocks in one UTXO-store transaction (`fused`, and batches of them: `batch`) where the
        # store has one (SQLite) and a block's units all run here — and not when the state store
        # is the same SQLite file: its writes during a block (undo notes, the lease) would wait
        # for the block's own transaction.
        self.fuse = (
            self.applier.fanout.local and utxo.fuses
            and not same_sqlite_file(utxo.url, state.url)
        )
        self.holder = holder_id(f"{id(self):x}")
        # told the height of the last block of each committed batch (the pruner's request)
        self.on_applied: Callable[[int], None] | None = None
        # blocks this worker's passes made final (applied, refused): their message ids go once
        # a pass ends with the chain at rest (`take_settled`), theirs or left to this worker
        self._settled: set[bytes] = set()
        # the last block this worker applied (hash, height) with its commitment: its child
        # continues from it even before the batch holding it commits. Forgotten, with the
        # applier's recent coins, at any break: see `_parent_commitment`
        self._last: tuple[bytes, int, Commitment] | None = None
        self._preparer: Preparer | None = None
        self._pass_base: str | None = None  # the chain's base during this pass (`_pass`)

    def prepare_ahead(self, budget_s: float) -> int:
        """Prepare blocks above the tip for the chain's holder (`workers.chainstate.prepare`): for a worker
        that found the chain held. How many deltas it made."""
        if self._preparer is None:
            self._preparer = Preparer(self.state, self.utxo, self.genuine, self.lease, self._base)
        made = self._preparer.ahead(budget_s)
        metrics.blocks_prepared(made)
        return made

    def _base(self) -> str | None:
        return self.state.get_meta(BASE)

    def _bump_epoch(self) -> dict[str, str | None]:
        """The meta change that bumps the chain's epoch (see the invariants)."""
        return {EPOCH: str(int(self.state.get_meta(EPOCH) or 0) + 1)}

    def take_settled(self) -> list[bytes]:
        """The blocks settled by this worker's passes since the last call (call it after an
        `advance` that returned: the chain was at rest)."""
        out, self._settled = sorted(self._settled), set()
        return out

    # -- arrival (the index's) -------------------------------------------------------------------
    def store_block(self, raw: bytes) -> Block:
        return self.blocks.store(raw)

    def accept(self, block: Block) -> BlockEntry | None:
        return self.index.accept(block)

    def load(self, h: bytes) -> Block:
        return self.blocks.load(h)

    def genuine(self, h: bytes) -> Block:
        return self.blocks.genuine(h)

    def submit(self, raw: bytes) -> BlockEntry:
        """Store, accept and apply what can be applied (in this process)."""
        block = self.store_block(raw)
        while self.accept(block) is None:
            time.sleep(0.05)
        while True:
            try:
                self.advance()
                break
            except (ChainBusy, Unfinished):
                time.sleep(0.05)
        return self.index.entry(block.hash)

    # -- the best chain --------------------------------------------------------------------------
    @contextmanager
    def lease(self, name: str = LEASE, ttl_s: float | None = None, wait_s: float = 0.0) -> Iterator[bool]:
        """Hold the lease `name` while inside (yields False when another worker holds it, still
        after `wait_s`; one that lapsed, or whose holder is a dead process of this host, is
        taken: `stores.lease`)."""
        deadline = time.monotonic() + wait_s
        delay = 0.005
        while not (got := self.state.acquire_lease(name, self.holder, ttl_s or self.lease_s)):
            if time.monotonic() >= deadline:
                break
            time.sleep(delay)
            delay = min(delay * 2, 0.1)
        try:
            yield got
        finally:
            if got:
                self.state.release_lease(name, self.holder)

    def advance(self, budget_s: float | None = None) -> BlockEntry | None:
        """Apply the best chain up to its tip, reorganising if a heavier branch appeared.
        Returns the tip (None: nothing applied yet); raises ChainBusy at once when another
        worker holds the chain, Unfinished when `budget_s` ran out first."""
        start = time.monotonic()

        def check_budget() -> None:  # after a step at least: every call gets somewhere
            if budget_s is not None and time.monotonic() - start > budget_s:
                raise Unfinished()

        while True:
            with self.lease() as mine:
                self.blocks.ahead = not mine
                if not mine:
                    # The holder's progress, for this worker's parsed blocks: those it applied
                    # go first, not the ones this worker will be asked to apply if it takes over.
                    try:
                        tip = self.state.tip()
                    except StorageError:  # only a hint: the block is left to the holder all the same
                        tip = None
                    if tip is not None and tip.height is not None:
                        self.blocks.passed(tip.height + 1)
                    raise ChainBusy()
                tip = self._pass(check_budget)
            # Let go; a block indexed meanwhile found the lease held and was left to this worker
            if chain_at_rest(self.state):
                return tip

    def _pass(self, check_budget: Callable[[], None]) -> BlockEntry | None:
        """Under the lease: finish what a dead worker left, rebase, then apply the best chain."""
        self._take_back_unfinished()
        self._rebase(check_budget)
        self._pass_base = self._base()  # (only this holder changes it, by a rebase: done above)
        while True:
            best = self.state.best_candidate()
            tip = self.state.tip()
            if best is None or (tip is not None and best.hash == tip.hash):
                if tip is not None and tip.work is not None:
                    self.state.demote_pending(tip.work)
                return tip
            path = self._path(tip, best)
            if path is None:
                continue  # the candidate was invalid by ancestry: marked so, choose again
            down, up = path
            if self.retention and len(down) > self.retention:
                self._invalidate(
                    up[0],
                    f"its branch forks {len(down)} blocks below the tip, deeper than the "
                    f"retention ({self.retention}): records it needs may be pruned",
                )
                continue
            for e in down:
                self._renew()
                self._disconnect(e)
                check_budget()
            with self._batched() as batch:
                for e in up:
                    self._renew()
                    if not self._apply(e, batch):
                        break  # refused: the best chain is another one now
                    check_budget()

    def _path(
        self, tip: BlockEntry | None, best: BlockEntry
    ) -> tuple[list[BlockEntry], list[BlockEntry]] | None:
        """(applied blocks to disconnect, tip first; blocks to apply, lowest first); None when
        `best` turned out to descend from an invalid block (it and its branch are marked)."""
        up: list[BlockEntry] = []
        b: BlockEntry | None = best
        while b is not None and b.status is not BlockStatus.APPLIED:
            if b.status in (BlockStatus.INVALID, BlockStatus.ORPHAN):
                self._invalidate_below(b) if b.status is BlockStatus.INVALID else self._orphan_below(b)
                return None
            up.append(b)
            b = self.state.get_block(b.parent)
        # b is the fork point: the highest applied ancestor of best (applied blocks form one
        # chain, from the base to the tip); None when best's branch has nothing applied.
        down: list[BlockEntry] = []
        a: BlockEntry | None = tip
        while a is not None and (b is None or a.hash != b.hash):
            if a.reason == SNAPSHOT:
                raise StorageError(
                    f"block {best.hash[::-1].hex()} does not descend from the snapshot's block"
                )
            down.append(a)
            a = self.state.get_block(a.parent)
        up.reverse()
        return down, up

    def _renew(self) -> None:
        if not self.state.acquire_lease(LEASE, self.holder, self.lease_s):
            raise StorageError("the chain lease was lost: another worker applies the chain now")

    def _apply(self, e: BlockEntry, batch: Batch) -> bool:
        """Apply one block of the best chain (in `batch`: its state-store step is committed
        with the batch's); False when it is refused."""
        assert e.height is not None
        t0 = time.perf_counter()  # (its time covers every phase: loading and planning too)
        self.blocks.passed(e.height)  # the blocks below are applied: parsed, they go first
        try:
            block = self.genuine(e.hash)
        except CorruptBlock as bad:  # the same bytes every time: refused as corrupt, until a good
            batch.flush()  # copy is enqueued (`BlockIndex._revive`); the blocks before it stand
            self._invalidate(e, str(bad))
            return False
        undo = self.state.get_undo(e.hash)
        if undo is not None and undo.get("state") == "applying":
            settle_block(self.state, e.hash, self.lease_s)
            self.applier.rollback(block, undo)  # left half applied (without its mark): start over
        undo = self.applier.plan(block) | {"state": "applying", "block_id": e.block_id, "height": e.height}
        parent = self._parent_commitment(e)
        batch.begin()  # its transaction, open from its first block on (the plan saw what is in it)
        self.state.commit(undo={e.hash: undo}, meta={APPLYING: mark([*batch.hashes, e.hash])})
        self.applier.heartbeat = self._renewer()
        # the whole block all or nothing where it can be (see __init__): a savepoint of the
        # batch's transaction, which a crash leaves unwritten whole (the `applying` mark's
        # take-back then finds nothing to undo)
        fused = self.utxo.fused() if self.fuse else nullcontext()
        found, prepared = prepared_for(self.state, e, self._pass_base)
        try:
            with fused:
                counts = self.applier.apply(
                    block, e.height, e.block_id, undo, lambda u: self.state.put_undo(e.hash, u), prepared
                )
        except BlockRefused as r:
            batch.flush(still=[e.hash])  # the blocks before it stand; the mark keeps this one
            problem = apart(self.state, self.utxo)  # a store fault is no reason to refuse a block
            if problem is not None:
                raise StorageError(f"block {e.hash[::-1].hex()} not applied: {problem}") from r
            unseen = any(u in r.reason for u in UNSEEN) and not self.index.start_known()
            self._invalidate(e, f"{r.reason} {START_UNKNOWN}" if unseen else r.reason)
            return False
        finally:
            self.applier.heartbeat = _no_beat
        assert self.applier.delta is not None
        made = commitment.advance(parent, self.applier.delta)
        self._last = (e.hash, e.height, made)
        seconds = time.perf_counter() - t0
        batch.add(Applied(e, undo, counts, seconds, len(block.txs), self.applier.timings, made,
                          prepared=self.applier.took_prepared, had_delta=found is not None))
        return True

    def _parent_commitment(self, e: BlockEntry) -> Commitment:
        """The confirmed set's commitment as `e`'s parent left it (see `workers.chainstate.commitment`).
        Where `e` does not continue the block this worker applied last (at the height it had
        then: a rebase moves heights), another worker applied blocks meanwhile, or this one
        went back: the recent coins may be another chain's, and go."""
        last = self._last
        if last is not None and last[0] == e.parent and e.height == last[1] + 1:
            return last[2]  # applied just before, its commit perhaps still in the batch
        self._forget()
        p = self.state.get_block(e.parent)
        if p is None or p.status is not BlockStatus.APPLIED:
            return commitment.EMPTY  # the chain's first block
        found = self.state.get_commitment(e.parent)
        if found is None:  # applied before commitments were kept: it is the tip, its set is the store's
            log.warning("block %s has no UTXO-set commitment: computing it from the store once",
                        e.parent[::-1].hex())
            found = commitment.of_utxos(self.utxo.iter_utxos(confirmed=True), tick=self._renew)
            self.state.commit(commitments={e.parent: found})
        return found

    @contextmanager
    def _batched(self) -> Iterator[Batch]:
        """Consecutive blocks in one UTXO-store transaction (see `workers.chainstate.batch`): committed, with
        their state-store step, when the batch is full, at the end, or when the budget runs
        out; rolled back on any other error (their `applying` mark then takes them back)."""
        batch = Batch(self)
        try:
            yield batch
        except Unfinished:
            batch.flush()
            raise
        except BaseException as exc:
            self._forget()  # (rolled back: what it applied is not in the store)
            batch.abort(exc)
            raise
        batch.flush()

    def _finish(self, done: list[Applied], still: list[bytes] | None = None) -> None:
        """The state-store step of blocks whose UTXO-store part is committed: applied, the tip
        on the last, their undo records marked, the `applying` mark gone (or naming `still`
        only: a block refused after them, until it is marked invalid) — one commit."""
        last = done[-1].entry
        assert last.height is not None
        # undo records are kept while a rebase may still take every block back whole
        keep = not self.retention or not self.index.start_known()
        self.state.commit(
            blocks=[BlockChange(a.entry.hash, status=BlockStatus.APPLIED) for a in done],
            tip=last.hash,
            undo={a.entry.hash: a.undo | {"state": "applied"} for a in done},
            meta={APPLYING: mark(still or [])},
            prune_undo_below=None if keep else last.height - self.retention,
            commitments={a.entry.hash: a.commitment for a in done},
            deltas={a.entry.hash: None for a in done if a.had_delta},  # (not needed again)
        )
        for a in done:
            self._settled.add(a.entry.hash)
            log.info("applied block %s at height %d: %s in %.2f s",
                     a.entry.hash[::-1].hex(), a.entry.height, a.counts, a.seconds,
                     extra={"block": a.entry.hash[::-1].hex(), "height": a.entry.height,
                            "phase": "applied", "duration_s": round(a.seconds, 4), "txs": a.txs,
                            "phases_s": {k: round(v, 4) for k, v in a.phases.items()},
                            "prepared": a.prepared})
            metrics.block_applied(a.seconds, a.txs, a.phases, a.prepared)
        activity.note("blocks", len(done))
        activity.note("block_txs", sum(a.txs for a in done))
        if self.on_applied is not None:
            self.on_applied(last.height)

    def _renewer(self) -> Callable[[], None]:
        """Renews the chain lease at most every quarter of its TTL while a block is applied
        (a phase may outlast the lease); StorageError when another worker has taken it."""
        last = time.monotonic()

        def renew() -> None:
            nonlocal last
            if time.monotonic() - last < self.lease_s / 4:
                return
            self._renew()
            last = time.monotonic()

        return renew

    def _forget(self) -> None:
        """Nothing applied before carries over: the last block's commitment, the recent coins."""
        self._last = None
        self.applier.coins.clear()



def chain_at_rest(state: StateStore) -> bool:
    """Nothing is being applied or taken off, no rebase is noted, and nothing is left to apply:
    the tip is the best candidate (or there is none)."""
    if any(state.get_meta(m) is not None for m in (APPLYING, DISCONNECTING, REBASE)):
        return False
    tip, best = state.tip(), state.best_candidate()
    return best is None or (tip is not None and tip.hash == best.hash)


def resume_message(state: StateStore) -> list[str] | None:
    """The arguments of a block message that takes up a chain not at rest (a block half
    applied or taken off, a rebase noted, or the best chain ahead of the tip): its best block
    and a fresh message id. None while the chain is at rest. (A worker starting sends it, and
    the recovery manager when nobody holds the chain's lease: the block task is idempotent.)"""
    best = state.best_candidate()
    if best is None or chain_at_rest(state):
        return None
    return [best.hash[::-1].hex(), f"resume:{uuid.uuid4().hex[:12]}"]


def _no_beat() -> None:
    pass
