"""Applying one block to the UTXO store, and taking it back (docs/architecture.md, "The pipeline").

A block is applied in three phases, each over units of its transactions: create the
transactions the store does not hold yet (already mined in this block, so that each new record
is written once for its mining; a multi-record one, unmined, its child pages units of their
own), spend every input, then mark mined in this block every transaction it did not create
mined (those the store held before: mempool transactions, or the block's own after a reorg). The units
of a phase are independent: a `Fanout` runs them, in turn here (`LocalFanout`) or shared with
other workers as tasks (`workers.chainstate.fanout.TaskFanout`).

Invariants:
- The undo record (the txids this block creates) is written before the first change, so a
  refused or half-applied block can always be taken back, by this process or another.
- A refused block leaves nothing: its spends are cleared, its new records deleted; records that
  existed before it (mempool transactions) keep what they had.
- A spend that meets an output already spent by a transaction *not* mined on this chain wins
  (`workers.chainstate.conflicts`); spent by a transaction mined on this chain (or by another transaction
  of the same block) the block is refused. A spender with no record is the chain's only when
  the output's parent lists it as pruned; otherwise it is a mempool transaction between its
  spend and its record (or whose attempt died there), and the block takes the outputs it
  needs over (`workers.chainstate.conflicts.take_over`) rather than be refused or wait.
- An input whose parent record is gone fails a transaction this block creates ("spends a
  missing output", unless missing inputs are allowed); one of a transaction the store held
  already spent it long ago (the store leaves such an input out of its spends).
- Disconnecting a block (a reorg) marks its transactions off the longest chain, then unsets its
  mining: they stay, unmined, with their spends, as mempool transactions would.
- An applied block leaves its change to the confirmed set in `delta` (`workers.chainstate.commitment`),
  the outputs it spends read from the store after its checks and before its first write.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from collections.abc import Callable, Collection, Iterator
from typing import Any

from chain import Block, Tx, hash_to_hex
from chain.muhash import MuHash
from stores.errors import StoreError
from stores.state import PreparedDelta
from stores.utxo import (
    BlockInfo,
    OutputInfo,
    SpendRejected,
    Standing,
    StorageError,
    TxCoinbaseImmature,
    TxConflicting,
    TxCreating,
    TxExists,
    TxNotFound,
    UtxoError,
    UtxoFrozen,
    UtxoMismatch,
    UtxoSpent,
    UtxoStore,
    twophase,
)
from workers.chainstate import commitment
from workers.chainstate.conflicts import BLOCK_SPEND, Conflicts, chunks
from workers.chainstate.fanout import Fanout, LocalFanout, Result
from workers.ops import metrics

log = logging.getLogger("utxoflow.blocks")
MAX_UNITS = 64  # units per phase at most: enough for as many workers, few enough to stay cheap
MISSING_OUTPUT = "spends a missing output"
NOT_ON_CHAIN = "which is not mined on this chain"
# Refusals that blocks not seen yet may answer (the outputs made, the parent mined, below the
# chain's first block): provisional while the chain's start is unknown (`workers.chainstate.sequencer`).
UNSEEN = (MISSING_OUTPUT, NOT_ON_CHAIN)


class BlockRefused(Exception):
    """The block breaks a chain rule; `reason` says which, naming the transaction."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def outside_parents(block: Block) -> set[bytes]:
    """The transactions the block's inputs spend from, but for its own."""
    in_block = {t.txid for t in block.txs}
    return {
        i.prev_txid for t in block.txs if not t.is_coinbase
        for i in t.inputs if i.prev_txid not in in_block
    }


@dataclasses.dataclass
class BlockApplier(Conflicts):
    utxo: UtxoStore
    allow_missing_inputs: bool = False
    chunk: int = 1000  # transactions per unit: big enough that per-unit overhead stays small
    fanout: Fanout = dataclasses.field(default_factory=LocalFanout)
    # Called by the coordinator between units and while it waits: renews its chain lease
    # (Sequencer._apply sets it for the block; StorageError when the lease was lost).
    heartbeat: Callable[[], None] = lambda: None
    _undo: dict[str, Any] | None = None
    _save: Callable[[dict[str, Any]], None] | None = None
    # What `plan` read of the store, for `check_known` of the same block (the same object) right
    # after: one read of the block's transactions and their parents instead of two.
    _planned: tuple[Block, dict[bytes, Standing]] | None = None
    timings: dict[str, float] = dataclasses.field(default_factory=dict)
    delta: commitment.Delta | None = None  # the last applied block's change to the confirmed set
    took_prepared: bool = False  # the last applied block's delta was a prepared one (`prepare`)
    # the coins of the blocks applied last (the sequencer clears it where the chain breaks off)
    coins: commitment.RecentCoins = dataclasses.field(default_factory=commitment.RecentCoins)

    # -- apply ---------------------------------------------------------------------------------
    def plan(self, block: Block) -> dict[str, Any]:
        """The undo record: which of the block's transactions are new to the store."""
        txids = [t.txid for t in block.txs]
        self.timings = {}  # (the block's phases, from here: see Applied)
        with metrics.phase("plan", self.timings):
            known = self.utxo.standing([*txids, *outside_parents(block)])
        self._planned = (block, known)
        return {"created": [t.hex() for t in txids if t not in known]}

    def apply(
        self,
        block: Block,
        height: int,
        block_id: int,
        undo: dict[str, Any],
        save: Callable[[dict[str, Any]], None] | None = None,
        prepared: PreparedDelta | None = None,
    ) -> dict[str, int]:
        """Apply the block (its undo record already written; `save` writes it again when it
        grows: the mempool transactions made conflicting are added before they are). Raises
        BlockRefused, after taking back what it did, when the block breaks a rule;
        StorageError leaves it for a retry. `prepared`: its commitment delta, worked out ahead
        by another worker (`workers.chainstate.prepare`), taken instead of computing it here."""
        created = {bytes.fromhex(h) for h in undo["created"]}
        ctx = {"height": height, "block_id": block_id}
        self.delta = None
        with self._noting(undo, save):
            try:
                with metrics.phase("check", self.timings):
                    conflicting = self.check_known(block, created)
                    # the coins it spends, for its commitment delta (they leave the recent
                    # coins whoever computes it: a coin a block spends is gone)
                    inputs = commitment.outside_inputs(block)
                    known, missing = self.coins.take(inputs)
                    spent: dict[commitment.Outpoint, OutputInfo] = {}
                    if missing and prepared is None:
                        spent = self.utxo.get_outputs(missing)
                with metrics.phase("create", self.timings):
                    made = self.create_phase(block, created, ctx)
                with metrics.phase("reclaim", self.timings):
                    self.reclaim(block, conflicting)
                with metrics.phase("spend", self.timings):
                    skipped = self.spend_phase(block, created, ctx)
            except BlockRefused:
                self.coins.clear()  # (it took the coins the block spends)
                self.rollback(block, undo)
                raise
        with metrics.phase("mine", self.timings):
            self.mine_phase(block, ctx, made)
        with metrics.phase("commit", self.timings):
            if prepared is not None and skipped:  # inputs skipped as missing: the preparer may
                prepared = None  # have found their coins before their records were pruned
                spent = self.utxo.get_outputs(missing) if missing else {}
            self.took_prepared = prepared is not None
            if prepared is None:
                self.delta, coins = commitment.block_delta(block, height, inputs, spent, known)
                self.coins.add(coins)
            else:
                self.delta = commitment.Delta(MuHash.from_bytes(prepared.muhash), prepared.utxos,
                                              prepared.satoshis)
        if height > 0:  # a base block without BIP34 is height 0, which no store height may be
            self.utxo.set_block_height(height)
        return {"txs": len(block.txs), "created": len(created), "missing_inputs": skipped}

    @contextlib.contextmanager
    def _noting(
        self, undo: dict[str, Any] | None, save: Callable[[dict[str, Any]], None] | None
    ) -> Iterator[None]:
        """Conflict swaps note themselves in `undo` (written again by `save`) while inside, and
        nowhere after: a disconnect, or the next block, never writes into this block's record."""
        self._undo, self._save = undo, save
        try:
            yield
        finally:
            self._undo, self._save = None, None

    def check_known(self, block: Block, created: set[bytes]) -> set[bytes]:
        """Rules that need the store before anything changes: a tx of the block must not be
        mined on this chain already, and every input must spend a tx of this block or one
        mined on this chain (not a mempool tx the block does not mine). Returns the block's
        transactions that are conflicting (for `reclaim`): all from one read of the store."""
        in_block = {t.txid for t in block.txs}
        parents = outside_parents(block)
        held = [t for t in in_block if t not in created]
        planned, self._planned = self._planned, None
        if planned is not None and planned[0] is block:
            known = planned[1]  # read by `plan` just before (created: what it did not find)
            # A parent missing then may have been created since (a mempool tx, by a tx worker,
            # before this block's write transaction began): read those again, here, where the
            # rule is checked — a valid block has none.
            unseen = [p for p in parents if p not in known]
            if unseen:
                known = {**known, **self.utxo.standing(unseen)}
        else:
            known = self.utxo.standing([*held, *parents])
        again = [t for t in held if t in known and known[t].mined]
        if again:
            raise BlockRefused(f"tx {hash_to_hex(min(again))} is already mined on this chain")
        unmined = {p for p in parents if p in known and not known[p].mined}
        for t in block.txs:
            if t.is_coinbase or not unmined:
                continue
            for vin, i in enumerate(t.inputs):
                if i.prev_txid in unmined:
                    what = "conflicting tx" if known[i.prev_txid].conflicting else "tx"
                    raise BlockRefused(
                        f"tx {t.txid_hex} input {vin}: spends an output of {what} "
                        f"{hash_to_hex(i.prev_txid)}, {NOT_ON_CHAIN}"
                    )
        return {t for t in held if t in known and known[t].conflicting}

    # -- the phases, as units a fanout runs ------------------------------------------------------
    def _run(
        self, block: Block, phase: str, ctx: dict[str, int], specs: list[dict[str, Any]]
    ) -> list[Result]:
        results = self.fanout.run(self, block, phase, ctx, specs)
        for r in results:
            if "refused" in r:
                raise BlockRefused(r["refused"])
        return results

    def _size(self, n: int) -> int:
        """Transactions per unit for a phase over `n`: `chunk`, or more for a huge block, so
        that a phase has at most MAX_UNITS units (each costs two state-store writes)."""
        return max(self.chunk, -(-n // MAX_UNITS))

    def _ranges(self, start: int, end: int) -> list[dict[str, Any]]:
        size = self._size(end - start)
        return [{"start": i, "end": min(i + size, end)} for i in range(start, end, size)]

    def create_phase(self, block: Block, created: set[bytes], ctx: dict[str, int]) -> set[int]:
        """Create the block's new transactions: the one-record ones in chunks of `chunk`, mined
        in the block already; a multi-record one begun here (lock, blob, master), its child
        pages as units of their own, so that several workers write them, then finished here.
        Returns the indexes of the transactions created mined (the mine phase passes them)."""
        b = self.utxo.batch_size
        new = [i for i, t in enumerate(block.txs) if t.txid in created]
        small = [i for i in new if len(block.txs[i].outputs) <= b]
        specs: list[dict[str, Any]] = [{"txs": list(p)} for p in chunks(small, self._size(len(small)))]
        begun: list[twophase.Creation] = []
        try:
            for i in new:
                tx = block.txs[i]
                if len(tx.outputs) <= b:
                    continue
                try:
                    c = self.utxo.begin_paged(tx, ctx["height"], block.txs)
                except TxExists:
                    if self.utxo.creation_state(tx.txid) is None:  # a creator holds only its lock
                        raise StorageError(f"tx {tx.txid_hex} is being created by another worker "
                                           "that has not written it yet: the block waits") from None
                    continue  # it exists, or is half made: the spend phase finishes it if need be
                except StorageError:
                    raise
                except StoreError as e:
                    raise BlockRefused(f"tx {tx.txid_hex}: {e}") from e
                begun.append(c)
                per_unit = max(1, -(-len(c.missing) // MAX_UNITS))  # a page a unit, MAX_UNITS at most
                specs += [{"tx": i, "pages": list(p), "frozen": c.frozen}
                          for p in chunks(c.missing, per_unit)]
            results = self._run(block, "create", ctx, specs)
            there = {i for r in results for i in r.get("exists", [])}  # arrived meanwhile: unmined
            made = set(small) - there
            self._not_created({block.txs[i].txid for i in there})
            for c in begun:
                try:
                    twophase.end_creation(self.utxo, c)
                except StoreError as e:  # the lock lapses by itself; recovery clears the flags
                    log.warning("finishing the creation of tx %s: %s", hash_to_hex(c.txid), e)
            begun = []
            return made
        finally:
            for c in begun:  # the phase failed: release the locks only (a rollback may follow)
                try:
                    self.utxo.release_creation_lock(c.lock)
                except StoreError as e:
                    log.warning("releasing the creation lock of tx %s: %s", hash_to_hex(c.txid), e)

    def _not_created(self, txids: set[bytes]) -> None:
        """Transactions the undo record lists as new that another worker created between the
        plan and the create phase (mempool arrivals): the block did not make them, so a
        take-back must not delete them. Noted in the undo record at once."""
        if not txids or self._undo is None:
            return
        gone = {t.hex() for t in txids}
        self._undo["created"] = [h for h in self._undo["created"] if h not in gone]
        self._keep_undo()

    def spend_phase(self, block: Block, created: set[bytes], ctx: dict[str, int]) -> int:
        """Spend every input; returns how many were skipped as missing (allow-missing mode).
        Spends that meet a mempool spender are left by the units and resolved here, one
        process making the conflicts (their undo notes must not race). The parents the swaps
        locked are unlocked once the phase has succeeded; a phase that fails leaves them to the
        take-back, which gives the conflicting transactions their spends back first."""
        specs = self._ranges(0, len(block.txs))
        for spec in specs:  # which txs of the unit the block creates: their inputs must exist
            spec["new"] = [i for i in range(spec["start"], spec["end"]) if block.txs[i].txid in created]
        results = self._run(block, "spend", ctx, specs)
        skipped = sum(r.get("skipped", 0) for r in results)
        deferred = sorted(i for r in results for i in r.get("defer", []))
        if deferred:
            txs = [block.txs[i] for i in deferred]
            new = {t.txid for t in txs} & created
            skipped += self._spend(block, txs, ctx["height"], new, resolve=True)[0]
        self.unlock_swapped()
        return skipped

    def reclaim(self, block: Block, again: set[bytes]) -> None:
        """The block mines transactions a losing branch made conflicting: they win now
        (Teranode's ProcessConflicting). In block order, parents first: the current spenders of
        each one's inputs (its rivals) become conflicting with their descendants, their spends
        released and the parents locked (`make_conflicting`); then it is no longer conflicting,
        so that it spends in the spend phase and its children spend from it. Each is noted in
        the undo record first: a take-back makes it conflicting again. `again`: the block's
        transactions that are conflicting, as `check_known` found them (only a block changes
        that, and this worker applies the chain)."""
        in_block = {t.txid for t in block.txs}
        for tx in block.txs:
            if tx.txid not in again:
                continue
            ops = [(i.prev_txid, i.prev_vout) for i in tx.inputs] if not tx.is_coinbase else []
            held = {  # each rival, and the parent of an output it holds
                o.spending_txid: o.txid for o in self.utxo.get_outputs(ops).values()
                if o.spending_txid is not None and o.spending_txid != tx.txid
            }
            rivals = sorted(held)
            for r in rivals:
                detail = f"its inputs are spent by {hash_to_hex(r)}"
                self._refuse_if_ours(f"tx {tx.txid_hex}", r, held[r], in_block, detail)
            self.make_conflicting(rivals)
            if self._undo is not None:
                self._undo.setdefault("reclaimed", []).append(tx.txid.hex())
                self._keep_undo()
            self.utxo.set_conflicting([tx.txid], False)
            log.info("tx %s, conflicting until now, wins: this block mines it", tx.txid_hex)

    def mine_phase(self, block: Block, ctx: dict[str, int], made: Collection[int] = ()) -> None:
        """Mark mined in the block every transaction but those created mined (`made`)."""
        todo = [i for i in range(len(block.txs)) if i not in made]
        self._run(block, "mine", ctx, [{"txs": list(p)} for p in chunks(todo, self._size(len(todo)))])

    def execute(self, block: Block, phase: str, ctx: dict[str, int], spec: dict[str, Any]) -> Result:
        """Run one unit (whichever worker claimed it): {} or counts when done, `refused` with
        the reason when the block breaks a rule; StorageError propagates."""
        height = ctx["height"]
        try:
            if phase == "create":
                if "tx" in spec:
                    twophase.write_pages(self.utxo, block.txs[spec["tx"]], spec["pages"], spec["frozen"])
                    return {}
                txs = [block.txs[i] for i in spec["txs"]]
                mined_in = [BlockInfo(ctx["block_id"], height)]
                exists = []
                for i, made in zip(spec["txs"], self.utxo.create_many(txs, height, mined_in, meta=False)):
                    if isinstance(made, TxExists):  # a redelivered unit, or a tx that arrived
                        exists.append(i)  # meanwhile (the mine phase mines it, idempotently)
                    elif isinstance(made, StorageError):
                        raise made
                    elif isinstance(made, StoreError):
                        raise BlockRefused(f"tx {block.txs[i].txid_hex}: {made}")
                return {"exists": exists}
            if phase == "mine":
                txids = [block.txs[i].txid for i in spec["txs"]]
                for t, m in zip(txids, self.utxo.set_mined_multi(txids, ctx["block_id"], height)):
                    if isinstance(m, UtxoError):
                        raise StorageError(f"setting tx {hash_to_hex(t)} mined failed: {m}")
                return {}
            part = block.txs[spec["start"] : spec["end"]]
            if phase == "spend":
                new = {block.txs[i].txid for i in spec.get("new", [])}
                skipped, defer = self._spend(block, [t for t in part if not t.is_coinbase], height, new)
                index = {t.txid: spec["start"] + k for k, t in enumerate(part)}
                return {"skipped": skipped, "defer": [index[t.txid] for t in defer]}
        except BlockRefused as r:
            return {"refused": r.reason}
        raise ValueError(f"unknown block phase {phase!r}")

    def _spend(
        self, block: Block, txs: list[Tx], height: int, new: set[bytes], resolve: bool = False
    ) -> tuple[int, list[Tx]]:
        """Spend these transactions' inputs (`new`: those the block creates): (inputs skipped
        as missing, transactions left for the coordinator because a mempool tx spent an output
        first — or, with `resolve`, that spender made conflicting and the spend done)."""
        in_block = {t.txid for t in block.txs}
        skipped = 0
        deferred: list[Tx] = []
        pending = txs
        for _round in range(len(pending) + 1):
            if not pending:
                break
            results = self.utxo.spend_many(
                pending, height, missing_ok=self.allow_missing_inputs, ignore=BLOCK_SPEND, by_block=True
            )
            retry: list[Tx] = []
            for tx, r in zip(pending, results):
                if isinstance(r, list):
                    left_out = len(tx.inputs) - len(r)
                    if left_out and tx.txid in new:  # its parent record is gone
                        if not self.allow_missing_inputs:
                            spent = {(s.txid, s.vout) for s in r}
                            vin, i = next((k, i) for k, i in enumerate(tx.inputs)
                                          if (i.prev_txid, i.prev_vout) not in spent)
                            raise BlockRefused(f"tx {tx.txid_hex} input {vin}: {MISSING_OUTPUT} "
                                               f"(parent tx {hash_to_hex(i.prev_txid)} not found)")
                        skipped += left_out
                    continue
                verdict = self._resolve(tx, r, in_block, resolve)
                (retry if verdict == "retry" else deferred).append(tx)
            pending = retry
        if pending:  # (each round resolves at least one conflict: this is a safety net)
            raise StorageError(f"spends of {len(pending)} txs still conflict after every round")
        return skipped, deferred

    def _resolve(self, tx: Tx, err: UtxoError, in_block: set[bytes], conflicts: bool) -> str:
        """Decide a failed spend: "retry" when resolved and the tx should try again, "defer"
        when a mempool tx holds an output (and `conflicts` is off); raises BlockRefused for a
        rule the block breaks."""
        errors = err.errors if isinstance(err, SpendRejected) else [(0, err)]
        verdict = "retry"
        for vin, e in errors:
            where = f"tx {tx.txid_hex} input {vin}"
            if isinstance(e, UtxoSpent):
                spender = e.spending_txid
                parent = e.outpoint[0] if e.outpoint is not None else tx.inputs[vin].prev_txid
                self._refuse_if_ours(where, spender, parent, in_block, str(e))
                if conflicts and self.utxo.existing([spender]):
                    self.make_conflicting([spender])
                elif conflicts:  # no record: nothing to mark, the outputs are taken over
                    self.take_over(spender, [e.outpoint or (parent, tx.inputs[vin].prev_vout)])
                else:
                    verdict = "defer"
            elif isinstance(e, TxCreating):
                if e.outpoint is None or not self.utxo.complete_creation(e.outpoint[0]):
                    raise StorageError(f"{where}: its parent's creation cannot be finished yet")
            elif isinstance(e, TxCoinbaseImmature):
                raise BlockRefused(f"{where}: spends an immature coinbase ({e})")
            elif isinstance(e, TxNotFound):  # the parent, or the output, does not exist
                raise BlockRefused(f"{where}: {MISSING_OUTPUT} ({e})")
            elif isinstance(e, (TxConflicting, UtxoFrozen, UtxoMismatch)):
                raise BlockRefused(f"{where}: {e}")
            else:
                raise BlockRefused(f"{where}: {e}")
        return verdict

    def _refuse_if_ours(
        self, where: str, spender: bytes, parent: bytes, in_block: set[bytes], detail: str
    ) -> None:
        """An output of `parent` the block spends is spent by `spender`: a refusal when that is
        a tx of the block (a double spend within it) or one mined on this chain; a spender
        that is neither is the one made conflicting (a spend, or a reclaim)."""
        if spender in in_block:
            raise BlockRefused(f"{where}: double spend within the block ({detail})")
        if self._mined(spender, parent):
            raise BlockRefused(f"{where}: spends an output already spent on this chain ({detail})")

    def _mined(self, txid: bytes, parent: bytes) -> bool:
        """Mined on this chain, or pruned after it was: only records mined on the chain are
        pruned, and the pruner lists each on its parents' deleted children. A spender with no
        record that `parent` does not list is a mempool transaction between its spend and its
        record (or whose attempt died there): not the chain's, and never a reason to refuse a
        block (`take_over` frees what it holds)."""
        if self.utxo.mined([txid]):
            return True
        if self.utxo.existing([txid]):
            return False
        try:
            return txid in self.utxo.get(parent, ["deleted_children"]).deleted_children
        except TxNotFound:  # the parent went meanwhile: the block's next try will say
            return False

    # -- take back -----------------------------------------------------------------------------
    def rollback(self, block: Block, undo: dict[str, Any]) -> None:
        """Take back a block that was refused part-way (or whose worker died): clear the spends
        of the transactions it created, delete those records, unset its mining where it got that
        far, give the transactions it made conflicting back their spends, then unlock what its
        conflict swaps locked (so that no one took the outputs meanwhile). Idempotent."""
        created = {bytes.fromhex(h) for h in undo["created"]}
        new = [t for t in block.txs if t.txid in created]
        self.release(new)
        self.utxo.delete_txs([t.txid for t in new])
        block_id = undo.get("block_id")
        if block_id is not None:  # the records that existed before it and that it mined
            old = [t.txid for t in block.txs if t.txid not in created]
            mined = [t for t in old if block_id in self._block_ids(t)]
            if mined:
                self.utxo.mark_on_longest_chain(mined, False)
                self.utxo.set_mined_multi(mined, block_id, undo["height"], unset=True, on_longest_chain=False)
        with self._noting(undo, None):
            reclaimed = [bytes.fromhex(h) for h in undo.get("reclaimed", [])]
            for t in reversed(reclaimed):  # conflicting again, their spends given back to the rivals
                try:
                    meta = self.utxo.get(t)
                except TxNotFound:
                    continue  # expired since: nothing to give back
                if meta.tx is not None:
                    self.release([meta.tx])
                self.utxo.set_conflicting([t], True)
            self.restore([bytes.fromhex(h) for h in undo.get("conflicted", [])], undo.get("height", 0))
            self.unlock_swapped()

    def _block_ids(self, txid: bytes) -> list[int]:
        try:
            return list(self.utxo.get(txid, ["block_ids"]).block_ids)
        except TxNotFound:
            return []

    def disconnect(self, block: Block, height: int, block_id: int) -> None:
        """A reorg takes this applied block off the best chain: its transactions are marked off
        the longest chain, then its mining is unset; they stay, unmined (Teranode's order: the
        mark first, so that the unset applies the delete-at-height rule to an unmined record)."""
        txids = [t.txid for t in block.txs]
        for part in chunks(txids, self.chunk):
            self.utxo.mark_on_longest_chain(list(part), False)
            self.utxo.set_mined_multi(list(part), block_id, height, unset=True, on_longest_chain=False)
        # Its coinbase is off the chain for good (only its block mines it): whatever spends it
        # becomes conflicting, with its descendants (made whole again if the block comes back).
        cb = block.txs[0]
        outs = self.utxo.get_outputs([(cb.txid, v) for v in range(len(cb.outputs))])
        spenders = sorted({o.spending_txid for o in outs.values() if o.spending_txid is not None})
        if spenders:
            self.make_conflicting(spenders, lock=False)
