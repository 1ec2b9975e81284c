"""Spends, unspends and the per-output states on SQL: lock the parents, let the kernel decide
(`kernel.spend`, `kernel.outputs`), write back what it touched.

Invariants:
- Each call is one write unit: what the kernel decided is written whole or not at all, with
  the script index entries it ends (a spend) or makes again (an unspend).
- The delete-at-height is applied after spends (at the spend's height) and unspends (at the
  store's), to every record they changed; freeze, unfreeze and reassign leave it alone.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

from chain import Tx
from stores.utxo import validate
from stores.utxo.errors import Outpoint, ProcessingError, UtxoError
from stores.utxo.gcpause import gc_paused
from stores.utxo.kernel import marks, outputs
from stores.utxo.kernel import spend as rules
from stores.utxo.kernel.dah import apply_dah
from stores.utxo.kernel.record import Record
from stores.utxo.sql import codec
from stores.utxo.sql.read import ReadMixin
from stores.utxo.values import Spend

NO_HASH = b"\x00" * 32


class SpendMixin(ReadMixin):
    def spend(self, tx: Tx, block_height: int, ignore: rules.Ignore = rules.NO_IGNORE) -> list[Spend]:
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
        ignore: rules.Ignore = rules.NO_IGNORE,
        by_block: bool = False,
    ) -> list[list[Spend] | UtxoError]:
        """Spend every input of each tx at `block_height`, all or nothing per tx (`kernel.spend`).
        With `missing_ok`, an input whose parent record the store does not hold is left out
        instead of failing (a chain imported from mid-history). `by_block` changes nothing
        here: a spend and its take-back are one unit, so no take-back can land after another
        spend of the same transaction."""
        validate.height("block_height", block_height)
        parent_ids = {i.prev_txid for tx in txs for i in tx.inputs}
        parent_ids.discard(NO_HASH)  # a coinbase's input names no parent
        height = self.height_for(block_height)

        def unit(cur: Any) -> list[list[Spend] | UtxoError]:
            parents = self._records(
                cur, parent_ids, want=((i.prev_txid, i.prev_vout) for tx in txs for i in tx.inputs),
                proj=codec.SPENDS,
            )
            blessed: set[bytes] = set()
            if not missing_ok and len(parents) < len(parent_ids):
                # Spenders of a parent that is gone: those whose own record exists spent it long
                # ago (Teranode's "already blessed"); their inputs there are left out.
                gone = {t.txid for t in txs if any(i.prev_txid not in parents for i in t.inputs)}
                own = self._records(cur, gone, lock=False, proj=codec.SPENDS)
                blessed = {t for t, rec in own.items() if rules.blesses(rec)}
            results = rules.spend_txs(
                txs,
                parents,
                block_height,
                self.batch_size,
                ignore=ignore,
                missing_ok=missing_ok,
                blessed=blessed,
            )
            self._apply_dah(parents.values(), height)
            self._write(cur, parents.values())
            self._unindex_spent(cur, parents, [s for r in results if isinstance(r, list) for s in r])
            return results

        return self.db.write("spend", unit)

    def _apply_dah(self, parents: Iterable[Record], height: int) -> None:
        """The DAH rule, for every record whose slots changed."""
        for p in parents:
            if "spent_utxos" in p.dirty:
                apply_dah(p, height, self.retention)

    def unspend(
        self, spends: Sequence[Spend], lock_parents: bool = False, exact: bool = False
    ) -> list[UtxoError | None]:
        """Take back each spend of an output whose UTXO hash is the one given, whoever made it
        (`kernel.spend.unspend`); per item, None or the error. `lock_parents` locks every parent
        touched (a conflict being swapped: no one may spend them meanwhile). `exact`: only the
        spends whose slot still holds their own spender (`kernel.spend.take_back`)."""
        validate.outpoints((s.txid, s.vout) for s in spends)
        for s in spends:
            validate.hash32("utxo_hash", s.utxo_hash)
        height = self.height_for()

        def unit(cur: Any) -> list[UtxoError | None]:
            parents = self._records(
                cur, {s.txid for s in spends}, want=((s.txid, s.vout) for s in spends), proj=codec.SPENDS
            )
            if exact:
                out: list[UtxoError | None] = [None] * len(spends)
                freed = [s for s in spends if s.spending_txid is not None and s.spending_vin is not None
                         and rules.take_back(parents.get(s.txid), (s.txid, s.vout), s.spending_txid,
                                             s.spending_vin, self.batch_size)]  # fmt: skip
            else:
                out = [
                    rules.unspend(parents.get(s.txid), (s.txid, s.vout), s.utxo_hash, self.batch_size)
                    for s in spends
                ]
                freed = [s for s, e in zip(spends, out) if e is None]
            self._apply_dah(parents.values(), height)
            if lock_parents:
                for p in parents.values():
                    marks.set_locked(p, True, height, self.retention)
            self._write(cur, parents.values())
            self._index_unspent(cur, parents, freed)
            return out

        return self.db.write("unspend", unit)

    def take_back_dead(self, tx: Tx) -> int:
        """Free the inputs `tx` still holds while it has no record (`kernel.spend.take_back`):
        the parents are locked first and the record looked for after, in the same unit, so a
        block's create and spend of it (which lock the same parents) come wholly before or
        wholly after. How many were freed."""
        if tx.is_coinbase:
            return 0
        ins = [((i.prev_txid, i.prev_vout), vin) for vin, i in enumerate(tx.inputs)]
        height = self.height_for()

        def unit(cur: Any) -> int:
            ops = [op for op, _v in ins]
            parents = self._records(cur, {t for t, _v in ops}, want=ops, proj=codec.SPENDS)
            if self._records(cur, [tx.txid], lock=False, proj=codec.SPENDS):
                return 0
            freed = [
                Spend(op[0], op[1], b"", tx.txid, vin) for op, vin in ins
                if rules.take_back(parents.get(op[0]), op, tx.txid, vin, self.batch_size)
            ]
            self._apply_dah(parents.values(), height)
            self._write(cur, parents.values())
            self._index_unspent(cur, parents, freed)
            return len(freed)

        return self.db.write("take_back_dead", unit)

    # -- freeze / unfreeze / reassign -----------------------------------------------------------
    def _per_output(
        self,
        what: str,
        items: Sequence[tuple[Outpoint, bytes]],
        act: Callable[[Record | None, Outpoint, bytes], UtxoError | None],
    ) -> list[UtxoError | None]:
        validate.outpoints(op for op, _h in items)
        for _op, h in items:
            validate.hash32("utxo_hash", h)

        def unit(cur: Any) -> list[UtxoError | None]:
            parents = self._records(cur, {op[0] for op, _h in items}, want=(op for op, _h in items))
            result = [act(parents.get(op[0]), op, h) for op, h in items]
            self._write(cur, parents.values())
            return result

        return self.db.write(what, unit)

    def freeze(self, items: Sequence[tuple[Outpoint, bytes]]) -> list[UtxoError | None]:
        return self._per_output("freeze", items, lambda p, op, h: outputs.freeze(p, op, h, self.batch_size))

    def unfreeze(self, items: Sequence[tuple[Outpoint, bytes]]) -> list[UtxoError | None]:
        return self._per_output(
            "unfreeze", items, lambda p, op, h: outputs.unfreeze(p, op, h, self.batch_size)
        )

    def reassign(self, outpoint: Outpoint, utxo_hash: bytes, new_utxo_hash: bytes) -> None:
        validate.hash32("new_utxo_hash", new_utxo_hash)

        def act(p: Record | None, op: Outpoint, h: bytes) -> UtxoError | None:
            return outputs.reassign(p, op, h, new_utxo_hash, self.block_height, self.batch_size)

        self.current_height()  # the delay counts from the store's tip: another worker may have moved it
        if self.block_height <= 0:
            raise ProcessingError("reassign needs the current block height (set_block_height)")
        (err,) = self._per_output("reassign", [(outpoint, utxo_hash)], act)
        if err is not None:
            raise err

