"""Record-level state on Aerospike: block membership, the longest chain, locked, conflicting and
preservation — each a kernel rule (`kernel.marks`) run by the Lua module on each record, the
same call on a batch of records at once.

Invariants:
- Set-mined finishes any creation left half done among its records before it records the block
  there (it is a recovery path of two-phase creation) and never clears `creating` by itself: the
  module answers TX_CREATING for a master still creating and leaves it as it is, the creation
  is finished, and the master is asked again. No record is read first: a block's records are
  nearly always whole, and a read of each cost about a tenth of set-mined.
- Child pages mirror their master's locked and conflicting flags: every change of those on a
  master is made on its pages too (set-mined's unlock included), masters first.
- Set-locked and set-conflicting change nothing when a txid is not stored (TxNotFound); a
  conflicting tx is listed on each parent it has that is still stored.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from chain import hash_to_hex
from stores.errors import StoreError
from stores.utxo import validate
from stores.utxo.aerospike.rules import mined_result
from stores.utxo.aerospike.spend import SpendMixin
from stores.utxo.errors import TxNotFound, UtxoError
from stores.utxo.gcpause import gc_paused
from stores.utxo.kernel import dah

log = logging.getLogger("utxoflow.store")


class StateMixin(SpendMixin):
    @gc_paused
    def set_mined_multi(
        self,
        txids: Sequence[bytes],
        block_id: int,
        block_height: int,
        subtree_idx: int = 0,
        on_longest_chain: bool = True,
        unset: bool = False,
    ) -> list[list[int] | UtxoError]:
        """Add (or remove) a block in each record's block list; each record's block ids after
        the change, or TxNotFound."""
        validate.number("block_id", block_id)
        validate.height("block_height", block_height)
        validate.number("subtree_idx", subtree_idx)
        validate.txids(txids)
        height = dah.mining_height(self.height_for(), block_height)
        wanted = list(dict.fromkeys(txids))
        args = [
            block_id,
            block_height,
            subtree_idx,
            int(on_longest_chain),
            int(unset),
            height,
            self.retention,
        ]
        # a master still creating answers TX_CREATING unchanged (no record is read first): its
        # creation is finished, then it is asked again, this time whatever it holds
        keys = [self.key(t) for t in wanted]
        found = dict(zip(wanted, map(mined_result, self._apply_all(keys, "set_mined", [*args, int(unset)]))))
        if not unset:
            todo = self._half_created({t: r["code"] for t, r in found.items() if "blocks" not in r})
            for t in todo:
                try:
                    self.complete_creation(t, block_height)
                except StoreError as e:  # this one stays as it is (creating, or not found); the rest go on
                    log.warning("set-mined could not finish the creation of tx %s: %s", hash_to_hex(t), e)
            if todo:
                again = self._apply_all([self.key(t) for t in todo], "set_mined", [*args, 1])
                found.update(zip(todo, map(mined_result, again)))
        # a multi-record tx's pages are unlocked too, every time (a call that died between the
        # master and its pages left them locked; the next delivery must not skip them)
        paged = [t for t, r in found.items() if r.get("extra")]
        if paged:
            self._mirror(paged, "locked", 0, height)
        missing = {t: TxNotFound(f"tx {hash_to_hex(t)} not found", txid=t) for t, r in found.items()
                   if "blocks" not in r}  # fmt: skip
        return [missing[t] if t in missing else list(found[t]["blocks"]) for t in txids]

    def _half_created(self, refused: dict[bytes, str]) -> list[bytes]:
        """Of the txids set-mined refused (with their codes), those whose creation was left half
        done: a master still `creating`, or no record but the lock record of a creator that died
        (whose blob holds the transaction)."""
        todo = [t for t, code in refused.items() if code == "TX_CREATING"]
        unknown = [t for t, code in refused.items() if code == "TX_NOT_FOUND"]
        if unknown and self.external.configured:
            locks = self._read_bins([self.lock_key(t) for t in unknown], ["expiresAt"])
            todo += [t for t, b in zip(unknown, locks) if b is not None]
        return todo

    def _mirror(self, txids: Sequence[bytes], what: str, value: int, height: int) -> None:
        """A mirrored flag's change on the child pages of these masters."""
        found = self._masters(txids, ["totalExtraRecs", "txid"])
        pages = [self.key(t, k) for t, rec in found.items() for k in range(1, rec.total_extra_recs + 1)]
        self._apply_all(pages, "set_state", [what, value, height, 0])

    def _require(self, txids: Sequence[bytes]) -> list[bytes]:
        """The distinct txids, all stored; else TxNotFound for the first that is not."""
        validate.txids(txids)
        wanted = list(dict.fromkeys(txids))
        for t, there in zip(wanted, self._exists([self.key(t) for t in wanted])):
            if not there:
                raise TxNotFound(f"tx {hash_to_hex(t)} not found", txid=t)
        return wanted

    def mark_on_longest_chain(self, txids: Sequence[bytes], on: bool) -> None:
        validate.txids(txids)
        tip = self.height_for()
        keys = [self.key(t) for t in dict.fromkeys(txids)]
        self._apply_all(keys, "set_state", ["longest", int(on), tip, self.retention])

    def set_locked(self, txids: Sequence[bytes], value: bool) -> None:
        wanted = self._require(txids)
        self._set_flag(wanted, "locked", int(value), self.height_for())

    def set_conflicting(self, txids: Sequence[bytes], value: bool) -> None:
        """Set or clear `conflicting`; a conflicting tx is listed on each parent it has."""
        wanted = self._require(txids)
        self._set_flag(wanted, "conflicting", int(value), self.height_for())
        if value:
            recs = self._masters(wanted, ["inpoints", "txid"])
            calls = [
                (self.key(p), "add_child", ["conflicting", t])
                for t in wanted
                for p in dict.fromkeys(op for op, _v in recs[t].inpoint_list())
            ]
            self._apply_each(calls)  # a parent already pruned has nothing to record

    def preserve_transactions(self, txids: Sequence[bytes], until: int) -> None:
        validate.height("until", until)
        validate.txids(txids)
        keys = [self.key(t) for t in dict.fromkeys(txids)]
        self._apply_all(keys, "set_state", ["preserve", until, self.height_for(), self.retention])
