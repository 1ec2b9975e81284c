"""Spends on Aerospike: spend, unspend, freeze / unfreeze / reassign — each the kernel's rule run
by the Lua module on the records it touches (`rules.Rules`).

Invariants:
- A spend is judged at the caller's height (its block's); the delete-at-height counts from the
  higher of that and the store's (as on SQL).
- A transaction's spend is all or nothing across its parents (`rules.Rules.spend_tx`); the
  transactions of one call are spent in order, so a later one sees the earlier ones' spends.
- An input whose parent is gone is skipped when the call allows missing parents, or when the
  spending transaction's own record vouches for it (`kernel.spend.blesses`). The record is read
  only for a transaction whose spend did not go through at first (or that shares an outpoint
  with another of the call): a gone parent is rare, and a read of every parent before every
  spend cost more than the spend's own batch of calls.
"""

from __future__ import annotations

from collections.abc import Sequence

from chain import Tx
from stores.utxo import validate
from stores.utxo.aerospike.create import CreateMixin
from stores.utxo.errors import Outpoint, ProcessingError, UtxoError
from stores.utxo.gcpause import gc_paused
from stores.utxo.kernel import outputs, verdicts
from stores.utxo.kernel.spend import NO_IGNORE, Ignore, blesses
from stores.utxo.values import Spend

NO_HASH = b"\x00" * 32


class SpendMixin(CreateMixin):
    def spend(self, tx: Tx, block_height: int, ignore: Ignore = NO_IGNORE) -> list[Spend]:
        (r,) = self.spend_many([tx], block_height, ignore=ignore)
        if isinstance(r, UtxoError):
            raise r
        return r

    @gc_paused
    def spend_many(
        self,
        txs: Sequence[Tx],
        block_height: int,
        missing_ok: bool = False,
        ignore: Ignore = NO_IGNORE,
        by_block: bool = False,
    ) -> list[list[Spend] | UtxoError]:
        """Spend every input of each tx at `block_height`, all or nothing per tx. With
        `missing_ok`, an input whose parent record the store does not hold is left out;
        `by_block` marks the spends a block's (`rules.Rules.spend_txs`)."""
        validate.height("block_height", block_height)
        batch = list(txs)
        height = self.height_for(block_height)
        # missing parents: skipped for every tx when allowed, else for those their record vouches
        skip = {t.txid for t in batch} if missing_ok else ()
        vouch = None if missing_ok else self._vouched
        return self.rules.spend_txs(batch, block_height, height, ignore, skip, vouch, by_block)

    def _vouched(self, txids: list[bytes]) -> set[bytes]:
        """Those of `txids` whose own record vouches for their inputs whose parent is gone."""
        own = self._masters(txids, ["conflicting", "txid"])
        return {t for t, rec in own.items() if blesses(rec)}

    def unspend(
        self, spends: Sequence[Spend], lock_parents: bool = False, exact: bool = False
    ) -> list[UtxoError | None]:
        """Take back each spend of an output whose UTXO hash is the one given, whoever made it;
        `lock_parents` locks every parent touched (a conflict being swapped); `exact`: only while
        the slot holds that spend's own spender (the Lua `take_back`, whatever block token it
        carries: the caller is a block)."""
        validate.outpoints((s.txid, s.vout) for s in spends)
        for s in spends:
            validate.hash32("utxo_hash", s.utxo_hash)
        height = self.height_for()
        if lock_parents:  # first: no one may spend what is freed (unspend itself ignores locked)
            parents = list(dict.fromkeys(s.txid for s in spends))
            there = [p for p, ok in zip(parents, self._exists([self.key(p) for p in parents])) if ok]
            self._set_flag(there, "locked", 1, height)
        if exact:
            for s in spends:
                if s.spending_txid is not None and s.spending_vin is not None:
                    self.rules.take_back_input((s.txid, s.vout), s.spending_txid, s.spending_vin, height, -1)
            return [None] * len(spends)
        return [self.rules.unspend((s.txid, s.vout), s.utxo_hash, height) for s in spends]

    def take_back_dead(self, tx: Tx) -> int:
        """Free the inputs `tx` still holds while it has no record (the Lua `take_back`, the
        kernel's `take_back` ported): its record is looked for first; a slot a block's spend
        call marked is kept, so a block that made the record and spent for it meanwhile keeps
        its spends. How many were freed."""
        if tx.is_coinbase or self._exists([self.key(tx.txid)])[0]:
            return 0
        height = self.height_for()
        return sum(
            self.rules.take_back_input((i.prev_txid, i.prev_vout), tx.txid, vin, height)
            for vin, i in enumerate(tx.inputs)
        )

    def _set_flag(self, txids: Sequence[bytes], what: str, value: int, height: int) -> list[bool]:
        """`set_state` of the Lua module on each master, and on its child pages for the fields
        pages mirror (locked, conflicting); per txid, whether its record exists."""
        found = self._masters(txids, ["totalExtraRecs", "txid"])
        done = self._apply_all(
            [self.key(t) for t in txids], "set_state", [what, value, height, self.retention]
        )
        if what in ("locked", "conflicting"):
            pages = [self.key(t, k) for t, rec in found.items() for k in range(1, rec.total_extra_recs + 1)]
            self._apply_all(pages, "set_state", [what, value, height, 0])
        return [r == 0 for r in done]

    # -- freeze / unfreeze / reassign -----------------------------------------------------------
    def _per_output(self, what: str, items: Sequence[tuple[Outpoint, bytes]]) -> list[UtxoError | None]:
        validate.outpoints(op for op, _h in items)
        for _op, h in items:
            validate.hash32("utxo_hash", h)
        return [self.rules.alert(what, op, h) for op, h in items]

    def freeze(self, items: Sequence[tuple[Outpoint, bytes]]) -> list[UtxoError | None]:
        return self._per_output("freeze", items)

    def unfreeze(self, items: Sequence[tuple[Outpoint, bytes]]) -> list[UtxoError | None]:
        return self._per_output("unfreeze", items)

    def reassign(self, outpoint: Outpoint, utxo_hash: bytes, new_utxo_hash: bytes) -> None:
        validate.outpoints([outpoint])
        validate.hash32("utxo_hash", utxo_hash)
        validate.hash32("new_utxo_hash", new_utxo_hash)
        self.current_height()  # the delay counts from the store's tip: another worker may have moved it
        if self.block_height <= 0:
            raise ProcessingError("reassign needs the current block height (set_block_height)")
        if new_utxo_hash == NO_HASH:
            raise verdicts.no_new_hash(outpoint)
        err = self.rules.alert(
            "reassign", outpoint, utxo_hash, new_utxo_hash, self.block_height, outputs.REASSIGN_DELAY
        )
        if err is not None:
            raise err
