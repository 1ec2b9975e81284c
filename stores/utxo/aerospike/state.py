"""Record-level state on Aerospike: block membership, the longest chain, locked, conflicting and
preservation — each a kernel rule (`kernel.state`) run by the Lua module on each record, the
same call on a batch of records at once.

Invariants:
- Set-mined finishes any creation left half done among its records first (it is a recovery
  path of two-phase creation) and never clears `creating` by itself. Its commonest case (a
  record mined for the first time on the longest chain) is plain operations with the DAH rule
  as an expression (`dah_first_mining`), for the records whose state it holds for; the rest
  go through the Lua module.
- Child pages mirror their master's locked and conflicting flags: every change of those on a
  master is made on its pages too (set-mined's unlock included), masters first.
- Set-locked and set-conflicting change nothing when a txid is not stored (TxNotFound); a
  conflicting tx is listed on each parent it has that is still stored.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from chain import hash_to_hex
from stores.errors import StoreError
from stores.utxo import validate
from stores.utxo.aerospike.spend import SpendMixin
from stores.utxo.errors import TxNotFound, UtxoError

log = logging.getLogger("utxoflow.store")


def dah_first_mining(new: int) -> Any:
    """`kernel.dah.due` for a record mined for the first time on the longest chain, as an
    Aerospike expression of the delete-at-height (new = height + retention): kept while
    preserved, the earliest for a conflicting record, the later of its own and `new` when every
    UTXO is spent; otherwise no change, which is no delete-at-height here (the fast path's
    filter lets through only records whose delete-at-height the rule keeps). A test holds it to
    the Lua module's set-mined."""
    from aerospike_helpers import expressions as exp

    has, dah = exp.BinExists("deleteAtHeight"), exp.IntBin("deleteAtHeight")
    spent = exp.Cond(exp.BinExists("spentUtxos"), exp.IntBin("spentUtxos"), 0)
    conflicting = exp.And(exp.BinExists("conflicting"), exp.Eq(exp.IntBin("conflicting"), 1))
    return exp.Cond(
        exp.BinExists("preserveUntil"), exp.Unknown(),  # (keep)
        conflicting, exp.Cond(has, dah, new),
        exp.GE(spent, exp.IntBin("recordUtxos")), exp.Cond(exp.And(has, exp.GT(dah, new)), dah, new),
        exp.Unknown(),
    ).compile()  # fmt: skip


class StateMixin(SpendMixin):
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
        height = self.height_for(block_height)
        wanted = list(dict.fromkeys(txids))
        first: set[bytes] = set()
        if not unset and on_longest_chain:
            first = self._first_mining(wanted, (block_id, block_height, subtree_idx), height)
            if len(first) == len(wanted):
                return [[block_id] for _t in txids]
        wanted = [t for t in wanted if t not in first]
        if not unset:
            self._finish_creations(wanted, block_height)
        args = [
            block_id,
            block_height,
            subtree_idx,
            int(on_longest_chain),
            int(unset),
            height,
            self.retention,
        ]
        results = self._apply_all([self.key(t) for t in wanted], "set_mined", args)
        # a multi-record tx's pages are unlocked too, every time (a call that died between the
        # master and its pages left them locked; the next delivery must not skip them)
        paged = [t for t, r in zip(wanted, results) if isinstance(r, dict) and r.get("extra")]
        if paged:
            self._mirror(paged, "locked", 0, height)
        after = {
            t: list(r["blocks"]) for t, r in zip(wanted, results) if isinstance(r, dict) and "blocks" in r
        }
        after.update((t, [block_id]) for t in first)
        return [
            after[t] if t in after else TxNotFound(f"tx {hash_to_hex(t)} not found", txid=t) for t in txids
        ]

    def _first_mining(self, txids: Sequence[bytes], block: tuple[int, int, int], height: int) -> set[bytes]:
        """Set-mined's commonest case, a record in no block mined on the longest chain for the
        first time, as plain operations without a Lua call: the block list written, unmined-since
        and locked dropped, and the delete-at-height by `kernel.dah.due` in its fast form
        (`dah_first_mining`). Only records the form holds for go this way (the filter: in no
        block, not creating, one record, no page reports, and a delete-at-height only where the
        rule keeps one: conflicting or preserved); the txids it changed."""
        import aerospike
        from aerospike_helpers import expressions as exp
        from aerospike_helpers.batch import records as br
        from aerospike_helpers.operations import expression_operations as eo
        from aerospike_helpers.operations import operations as op

        def flag(name: str) -> Any:
            return exp.And(exp.BinExists(name), exp.Eq(exp.IntBin(name), 1))

        canonical = exp.And(
            exp.Not(exp.BinExists("blockIDs")),
            exp.Not(flag("creating")),
            exp.Not(exp.BinExists("totalExtraRecs")),
            exp.Not(exp.BinExists("pageSpent")),
            exp.Or(
                exp.Not(exp.BinExists("deleteAtHeight")), flag("conflicting"), exp.BinExists("preserveUntil")
            ),
        ).compile()
        ops = [
            op.write("blockIDs", [block[0]]),
            op.write("blockHeights", [block[1]]),
            op.write("subtreeIdxs", [block[2]]),
            op.write("unminedSince", aerospike.null()),
            op.write("locked", aerospike.null()),
        ]
        if self.retention > 0:
            flags = aerospike.EXP_WRITE_DEFAULT | aerospike.EXP_WRITE_EVAL_NO_FAIL
            ops.append(
                eo.expression_write("deleteAtHeight", dah_first_mining(height + self.retention), flags)
            )
        policy = {"expressions": canonical, "exists": aerospike.POLICY_EXISTS_UPDATE}
        done = self.conn.batch(
            "set_mined", lambda i: br.Write(self.key(txids[i]), ops, policy=policy), len(txids)
        )
        return {t for t, r in zip(txids, done) if r.result == 0}

    def _finish_creations(self, txids: Sequence[bytes], block_height: int) -> None:
        """Finish every listed transaction whose creation was left half done — a master still
        `creating`, or no record but the lock record and blob of a creator that died."""
        found = self._read_bins([self.key(t) for t in txids], ["creating"])
        todo = [t for t, b in zip(txids, found) if b is not None and b.get("creating") == 1]
        unknown = [t for t, b in zip(txids, found) if b is None]
        if unknown and self.external.configured:
            locks = self._read_bins([self.lock_key(t) for t in unknown], ["expiresAt"])
            todo += [t for t, b in zip(unknown, locks) if b is not None]
        for t in todo:
            try:
                self.complete_creation(t, block_height)
            except StoreError as e:  # this one stays as it is (creating, or not found); the rest go on
                log.warning("set-mined could not finish the creation of tx %s: %s", hash_to_hex(t), e)

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
        self._apply_all(
            [self.key(t) for t in dict.fromkeys(txids)], "set_state", ["longest", int(on), tip, 0]
        )

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
