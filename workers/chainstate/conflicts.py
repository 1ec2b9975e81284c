"""Conflicts on the way of a block: making mempool transactions conflicting (a block's spend
wins over theirs), giving a refused block's conflicting transactions their spends back, and
taking back exactly the spends a transaction made. Mixed into `workers.chainstate.blockapply.BlockApplier`.

Invariants:
- A spend that meets an output already spent by a transaction *not* mined on this chain (a
  mempool transaction, or one a reorg left unmined) wins: that spender becomes conflicting with
  every descendant, and its spends are released while their parents are locked (noted in the
  undo record first), so that no mempool transaction takes the outputs meanwhile; the block's
  spends ignore that lock. The parents are unlocked once the phase has succeeded, or by the
  take-back after it has given the conflicting transactions their spends back.
- A spend takes back only what a transaction itself spent: an output is freed only while its
  stored spender is that transaction, checked in the write itself (the store's exact unspend),
  and never where the parent lists it as pruned.
- A spender with no record (a mempool tx between its spend and its record, or a dead attempt
  whose delivery was refused) loses the outputs a block spends the same way (`take_over`); if
  its record appears, it is made conflicting, by the block or by its own delivery, which reads
  its inputs again after making the record.
- Everything is idempotent: a swap cut short by a crash is found again from the same roots
  and finished.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from chain import Tx, hash_to_hex
from stores.utxo import Ignore, TxNotFound, UtxoError, UtxoStore
from stores.utxo.values import Spend

log = logging.getLogger("utxoflow.blocks")
# A block is authoritative over `locked`: its spends go through parents a conflict swap locked.
BLOCK_SPEND = Ignore(locked=True)


def chunks(seq: Sequence[Any], size: int) -> Iterable[Sequence[Any]]:
    for i in range(0, len(seq), size):
        yield seq[i : i + size]


class Conflicts:
    """The conflict handling of a block applier (its `utxo`, `chunk` and undo noting)."""

    utxo: UtxoStore
    chunk: int
    _undo: dict[str, Any] | None
    _save: Callable[[dict[str, Any]], None] | None

    def _note(self, locked: Sequence[bytes], conflicted: bytes | None = None) -> None:
        """Note in the undo record, before the change, the parents about to be locked and a tx
        about to be made conflicting (each once), and write it again if it grew (where there
        is one)."""
        if self._undo is None:
            return
        grew = False
        marked, noted = self._undo.get("conflicted", []), self._undo.get("locked", [])
        if conflicted is not None and conflicted.hex() not in marked:
            self._undo["conflicted"], grew = [*marked, conflicted.hex()], True
        if new := [p.hex() for p in dict.fromkeys(locked) if p.hex() not in noted]:
            self._undo["locked"], grew = [*noted, *new], True
        if grew:
            self._keep_undo()

    def _keep_undo(self) -> None:
        """Write the undo record again, grown by a note (where there is one to write)."""
        if self._undo is not None and self._save is not None:
            self._save(self._undo)

    def make_conflicting(self, txids: Sequence[bytes], lock: bool = True) -> None:
        """Mark these transactions and every descendant conflicting and release their spends,
        locking the parents (those not locked already are noted in the undo record first, and
        unlocked by `unlock_swapped`), so that the outputs they spent go to the chain's
        transaction and to no one else meanwhile. Each is noted in the undo record first: a
        block refused later gives them back what they had.

        The whole tree is marked first (parents first), then the spends are released leaves
        first: until the end, the roots hold the outputs they were found by, so a swap cut
        short by a crash is found again from the same roots and finished. Idempotent: one
        found conflicting already is not noted again (a refused block leaves it conflicting,
        without the spends a crash left it), but its spends are released and its descendants
        walked all the same. A descendant of one this walk marked is noted even if it is
        conflicting already: it marked itself meanwhile, finding its parent conflicting
        (`workers.chainstate.mempool.hold_inputs`), and is this block's to give back; so is one found with
        no record yet (a spender between its spend and its record), which marks itself once
        its record comes (`restore` passes over it if none ever does)."""
        todo = list(txids)
        seen: set[bytes] = set()
        marked: list[Tx] = []
        fresh: set[bytes] = set()  # spenders of the outputs of a tx this walk marked
        while todo:
            t = todo.pop(0)  # parents before their descendants: the order `restore` replays
            if t in seen:
                continue
            seen.add(t)
            try:
                meta = self.utxo.get(t)
            except TxNotFound:
                if t in fresh:  # a child between its spend and its record: when the record comes,
                    self._note([], t)  # it marks itself; a refused block gives it back too
                continue
            tx = meta.tx
            parents: list[bytes] = []
            if tx is not None and not tx.is_coinbase and lock and (not meta.conflicting or self._holds(tx)):
                parents = self._unlocked(sorted({i.prev_txid for i in tx.inputs}))
            self._note(parents, None if meta.conflicting and t not in fresh else t)
            self._mark(t, meta.conflicting)  # (its spends still held: released at the end)
            if tx is not None:
                marked.append(tx)
                outs = self.utxo.get_outputs([(t, v) for v in range(len(tx.outputs))])
                kids = [o.spending_txid for o in outs.values() if o.spending_txid is not None]
                if not meta.conflicting or t in fresh:
                    fresh.update(kids)
                todo += kids
        for tx in reversed(marked):
            self.release([tx], lock=lock)

    def _mark(self, t: bytes, already: bool) -> None:
        """One tx of a swap's tree made conflicting (noted in the undo record before)."""
        if not already:
            self.utxo.set_conflicting([t], True)
            log.info("tx %s is conflicting with the chain", hash_to_hex(t))

    def _holds(self, tx: Tx) -> bool:
        """`tx` is the stored spender of one of its inputs at least."""
        outs = self.utxo.get_outputs([(i.prev_txid, i.prev_vout) for i in tx.inputs])
        return any(o.spending_txid == tx.txid for o in outs.values())

    def release(self, txs: Sequence[Tx], lock: bool = False) -> None:
        """Take back the spends these transactions made, and only theirs: an output is freed
        while its stored spender is the transaction (`_free`) and not one its parent lists as
        pruned (a replay of a pruned tx has the pruned one's txid: the spend there is the old
        one's). `lock` locks the parents it frees outputs of."""
        by: dict[tuple[bytes, int], set[tuple[bytes, int]]] = {}  # outpoint → who may have spent it
        for t in txs:
            if not t.is_coinbase:
                for vin, i in enumerate(t.inputs):
                    by.setdefault((i.prev_txid, i.prev_vout), set()).add((t.txid, vin))
        for part in chunks(sorted(by), self.chunk * 2):
            outs = self.utxo.get_outputs(list(part))
            self._free([
                Spend(op[0], op[1], o.utxo_hash, o.spending_txid, o.spending_vin)
                for op, o in sorted(outs.items())
                if o.spending_txid is not None and o.spending_vin is not None
                and (o.spending_txid, o.spending_vin) in by[op]
            ], lock)

    def _free(self, mine: list[Spend], lock: bool) -> None:
        """Take these spends back (read just before) exactly: each only while its slot still
        holds its spender, and never one its parent lists as pruned (a replay of it: the spend
        there is for good) — `kernel.spend.take_back`. Between the read and the write, the slot
        may have been freed and taken by another, whose spend must stand. (An exact take-back
        refuses nothing: a slot no longer its spender's is left as it is.)"""
        if mine:
            self.utxo.unspend(mine, lock_parents=lock, exact=True)

    def take_over(self, spender: bytes, outpoints: Sequence[tuple[bytes, int]]) -> None:
        """The block spends `outpoints`, which `spender` holds with no record of its own: a
        mempool tx between its spend and its record, or whose attempt died there and whose
        delivery was then refused (on a store whose spend is not one unit across records,
        nothing else ever frees those). The block wins as over any mempool tx: the outputs are
        freed while still held by it, their parents locked (noted in the undo record first,
        as `make_conflicting` does). Then, if its record has appeared meanwhile, it is made
        conflicting; the mempool side reads its inputs again after making its record
        (`workers.chainstate.mempool.apply_tx`), so one of the two sees the other."""
        self._note(self._unlocked(sorted({p for p, _v in outpoints})))
        outs = self.utxo.get_outputs(list(outpoints))
        held = [
            Spend(op[0], op[1], o.utxo_hash, spender, o.spending_vin)
            for op, o in sorted(outs.items())
            if o.spending_txid == spender and o.spending_vin is not None
        ]
        self._free(held, lock=True)
        if held:
            log.info("tx %s, with no record, held %d output(s) a block spends: taken over",
                     hash_to_hex(spender), len(held))
        if self.utxo.existing([spender]):
            self.make_conflicting([spender])

    def _unlocked(self, txids: list[bytes]) -> list[bytes]:
        """Those of `txids` the store holds and that are not locked (a swap unlocks only what
        it locked)."""
        out = []
        for t in txids:
            try:
                if not self.utxo.get(t, ["locked"]).locked:
                    out.append(t)
            except TxNotFound:
                continue  # a parent pruned since: nothing to lock
        return out

    def unlock_swapped(self) -> None:
        """Unlock the parents that conflict swaps of this block locked (noted in its undo);
        one pruned since is nothing to unlock."""
        locked = [bytes.fromhex(h) for h in (self._undo or {}).get("locked", [])]
        present = self.utxo.existing(locked) if locked else set()
        if present:
            self.utxo.set_locked(sorted(present), False)

    def restore(self, txids: Sequence[bytes], height: int) -> None:
        """Give mempool transactions that a refused block made conflicting back their state:
        their inputs spent again (parents first; through the swap's locks, which are still on),
        then not conflicting. One whose inputs someone else spent meanwhile stays conflicting."""
        for t in txids:
            try:
                meta = self.utxo.get(t)
            except TxNotFound:
                continue
            if meta.tx is not None and not meta.tx.is_coinbase:
                (r,) = self.utxo.spend_many([meta.tx], height, ignore=BLOCK_SPEND)
                if isinstance(r, UtxoError):
                    log.warning("tx %s could not spend its inputs again, it stays conflicting: %s",
                                hash_to_hex(t), r)
                    continue
            self.utxo.set_conflicting([t], False)
