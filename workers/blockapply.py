"""Applying one block to the UTXO store, and taking it back (ARCHITECTURE "Applying a block").

A block is applied in three phases, each over chunks of its transactions: create the
transactions the store does not hold yet (unmined), spend every input, then mark every
transaction mined in this block. The chunks of a phase are independent, so the pipeline runs
them as parallel tasks; here they run in turn.

Invariants:
- The undo record (the txids this block creates) is written before the first change, so a
  refused or half-applied block can always be taken back, by this process or another.
- A refused block leaves nothing: its spends are cleared, its new records deleted; records that
  existed before it (mempool transactions) keep what they had.
- A spend that meets an output already spent by a transaction *not* mined on this chain (a
  mempool transaction, or one a reorg left unmined) wins: that spender becomes conflicting with
  every descendant, and its spends are released. Spent by a transaction mined on this chain (or
  by another transaction of the same block) the block is refused.
- Disconnecting a block (a reorg) only unsets its mining: its transactions stay, unmined, with
  their spends, as mempool transactions would.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from chain import Block, Tx, hash_to_hex
from stores.utxo import (
    SpendRejected,
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
)
from stores.utxo.records import Spend

log = logging.getLogger("utxoflow.blocks")
NO_HASH = b"\x00" * 32


class BlockRefused(Exception):
    """The block breaks a chain rule; `reason` says which, naming the transaction."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def chunks(seq: Sequence[Any], size: int) -> Iterable[Sequence[Any]]:
    for i in range(0, len(seq), size):
        yield seq[i : i + size]


def spends_of(tx: Tx) -> list[Spend]:
    """The spends a transaction makes (unspend matches on the spender, not on the hash)."""
    if tx.is_coinbase:
        return []
    return [Spend(i.prev_txid, i.prev_vout, NO_HASH, tx.txid, vin) for vin, i in enumerate(tx.inputs)]


@dataclasses.dataclass
class BlockApplier:
    utxo: UtxoStore
    allow_missing_inputs: bool = False
    chunk: int = 2000
    _undo: dict[str, Any] | None = None
    _save: Callable[[dict[str, Any]], None] | None = None

    # -- apply ---------------------------------------------------------------------------------
    def plan(self, block: Block) -> dict[str, Any]:
        """The undo record: which of the block's transactions are new to the store."""
        txids = [t.txid for t in block.txs]
        have = self.utxo.existing(txids)
        return {"created": [t.hex() for t in txids if t not in have]}

    def apply(
        self,
        block: Block,
        height: int,
        block_id: int,
        undo: dict[str, Any],
        save: Callable[[dict[str, Any]], None] | None = None,
    ) -> dict[str, int]:
        """Apply the block (its undo record already written; `save` writes it again when it
        grows: the mempool transactions made conflicting are added before they are). Raises
        BlockRefused, after taking back what it did, when the block breaks a rule;
        StorageError leaves it for a retry."""
        self._undo, self._save = undo, save
        created = {bytes.fromhex(h) for h in undo["created"]}
        try:
            self.check_known(block, created)
            self.create_phase([t for t in block.txs if t.txid in created], height)
            skipped = self.spend_phase(block, height)
        except BlockRefused:
            self.rollback(block, undo)
            raise
        self.mine_phase(block, height, block_id)
        self.utxo.set_block_height(height)
        return {"txs": len(block.txs), "created": len(created), "missing_inputs": skipped}

    def check_known(self, block: Block, created: set[bytes]) -> None:
        """Rules that need the store before anything changes: a tx of the block must not be
        mined on this chain already, and every input must spend a tx of this block or one
        mined on this chain (not a mempool tx the block does not mine)."""
        again = self.utxo.mined([t.txid for t in block.txs if t.txid not in created])
        if again:
            raise BlockRefused(f"tx {hash_to_hex(min(again))} is already mined on this chain")
        in_block = {t.txid for t in block.txs}
        parents = sorted({
            i.prev_txid for t in block.txs if not t.is_coinbase
            for i in t.inputs if i.prev_txid not in in_block
        })
        if not parents:
            return
        unmined = self.utxo.existing(parents) - self.utxo.mined(parents)
        if not unmined:
            return
        conflicting = self.utxo.existing(sorted(unmined), conflicting=True)
        for t in block.txs:
            if t.is_coinbase:
                continue
            for vin, i in enumerate(t.inputs):
                if i.prev_txid in unmined:
                    what = "conflicting tx" if i.prev_txid in conflicting else "tx"
                    raise BlockRefused(
                        f"tx {t.txid_hex} input {vin}: spends an output of {what} "
                        f"{hash_to_hex(i.prev_txid)}, which is not mined on this chain"
                    )

    def create_phase(self, txs: Sequence[Tx], height: int) -> None:
        for part in chunks(txs, self.chunk):
            for tx, r in zip(part, self.utxo.create_many(list(part), height)):
                if isinstance(r, TxExists):
                    continue  # a redelivered chunk, or a tx that arrived meanwhile: fine
                if isinstance(r, StorageError):
                    raise r
                if isinstance(r, UtxoError):
                    raise BlockRefused(f"tx {tx.txid_hex}: {r}")

    def spend_phase(self, block: Block, height: int) -> int:
        """Spend every input; returns how many were skipped as missing (allow-missing mode)."""
        in_block = {t.txid for t in block.txs}
        txs = [t for t in block.txs if not t.is_coinbase]
        skipped = 0
        for part in chunks(txs, self.chunk):
            pending = list(part)
            for _round in range(len(pending) + 1):
                results = self.utxo.spend_many(pending, height, missing_ok=self.allow_missing_inputs)
                retry = []
                for tx, r in zip(pending, results):
                    if isinstance(r, list):
                        skipped += len(tx.inputs) - len(r)
                        continue
                    if self._resolve(tx, r, in_block):
                        retry.append(tx)
                if not retry:
                    break
                pending = retry
        return skipped

    def _resolve(self, tx: Tx, err: UtxoError, in_block: set[bytes]) -> bool:
        """Decide a failed spend: True when the conflict was resolved and the tx should try
        again; raises BlockRefused for a rule the block breaks."""
        errors = err.errors if isinstance(err, SpendRejected) else [(0, err)]
        retry = False
        for vin, e in errors:
            where = f"tx {tx.txid_hex} input {vin}"
            if isinstance(e, UtxoSpent):
                spender = e.spending_txid
                if spender in in_block:
                    raise BlockRefused(f"{where}: double spend within the block ({e})")
                if self._mined(spender):
                    raise BlockRefused(f"{where}: spends an output already spent on this chain ({e})")
                self.make_conflicting([spender])
                retry = True
            elif isinstance(e, TxCreating):
                if e.outpoint is None or not self.utxo.complete_creation(e.outpoint[0]):
                    raise StorageError(f"{where}: its parent's creation cannot be finished yet")
                retry = True
            elif isinstance(e, TxCoinbaseImmature):
                raise BlockRefused(f"{where}: spends an immature coinbase ({e})")
            elif isinstance(e, TxNotFound):  # the parent, or the output, does not exist
                raise BlockRefused(f"{where}: spends a missing output ({e})")
            elif isinstance(e, (TxConflicting, UtxoFrozen, UtxoMismatch)):
                raise BlockRefused(f"{where}: {e}")
            elif isinstance(e, StorageError):
                raise e
            else:
                raise BlockRefused(f"{where}: {e}")
        return retry

    def _mined(self, txid: bytes) -> bool:
        try:
            m = self.utxo.get(txid, ["unmined_since", "block_ids"])
        except TxNotFound:
            return True  # pruned: only records mined on the chain are ever pruned
        return m.unmined_since is None and bool(m.block_ids)

    def make_conflicting(self, txids: Sequence[bytes]) -> None:
        """Mark these transactions and every descendant conflicting and release their spends,
        so that the outputs they spent can be spent by the chain's transaction. Each is noted
        in the undo record first: a block refused later gives them back what they had."""
        todo = list(txids)
        seen: set[bytes] = set()
        while todo:
            t = todo.pop(0)  # parents before their descendants: the order `restore` replays
            if t in seen:
                continue
            seen.add(t)
            try:
                meta = self.utxo.get(t)
            except TxNotFound:
                continue
            if meta.conflicting:
                continue
            if self._undo is not None:
                self._undo.setdefault("conflicted", []).append(t.hex())
                if self._save is not None:
                    self._save(self._undo)
            if meta.tx is not None:
                self.utxo.unspend(spends_of(meta.tx))
                outs = self.utxo.get_outputs([(t, v) for v in range(len(meta.tx.outputs))])
                todo += [o.spending_txid for o in outs.values() if o.spending_txid is not None]
            self.utxo.set_conflicting([t], True)
            log.info("tx %s is conflicting with the chain", hash_to_hex(t))

    def mine_phase(self, block: Block, height: int, block_id: int) -> None:
        txids = [t.txid for t in block.txs]
        # A tx that a reorg made conflicting and this block mines again is no longer conflicting.
        again = self.utxo.existing(txids, conflicting=True)
        if again:
            self.utxo.set_conflicting(sorted(again), False)
        for part in chunks(txids, self.chunk):
            for t, r in zip(part, self.utxo.set_mined_multi(list(part), block_id, height)):
                if isinstance(r, UtxoError):
                    raise StorageError(f"setting tx {hash_to_hex(t)} mined failed: {r}")

    # -- take back -----------------------------------------------------------------------------
    def rollback(self, block: Block, undo: dict[str, Any]) -> None:
        """Take back a block that was refused part-way (or whose worker died): clear the spends
        of the transactions it created, delete those records, unset its mining if it got that
        far. Idempotent."""
        created = {bytes.fromhex(h) for h in undo["created"]}
        new = [t for t in block.txs if t.txid in created]
        spends = [s for t in new for s in spends_of(t)]
        for part in chunks(spends, self.chunk * 2):
            self.utxo.unspend(list(part))
        self.utxo.delete_txs([t.txid for t in new])
        block_id = undo.get("block_id")
        if block_id is not None:
            old = [t.txid for t in block.txs if t.txid not in created]
            if old:
                self.utxo.set_mined_multi(old, block_id, undo["height"], unset=True)
        self.restore([bytes.fromhex(h) for h in undo.get("conflicted", [])], undo.get("height", 0))

    def restore(self, txids: Sequence[bytes], height: int) -> None:
        """Give mempool transactions that a refused block made conflicting back their state:
        not conflicting, their inputs spent again (parents first)."""
        for t in txids:
            try:
                meta = self.utxo.get(t)
            except TxNotFound:
                continue
            self.utxo.set_conflicting([t], False)
            if meta.tx is not None and not meta.tx.is_coinbase:
                (r,) = self.utxo.spend_many([meta.tx], height)
                if isinstance(r, UtxoError):
                    log.warning("tx %s could not spend its inputs again: %s", hash_to_hex(t), r)

    def disconnect(self, block: Block, height: int, block_id: int) -> None:
        """A reorg takes this applied block off the best chain: its transactions stay, unmined."""
        txids = [t.txid for t in block.txs]
        for part in chunks(txids, self.chunk):
            self.utxo.set_mined_multi(list(part), block_id, height, unset=True)
