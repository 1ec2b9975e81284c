"""Record-level state on SQL: block membership, the longest chain, locked, conflicting,
preservation, and pruning — each a kernel rule (`kernel.marks`, `kernel.dah`) applied to
records loaded under lock.

Invariants:
- Set-mined's common case — a block's records mined for the first time on the longest chain —
  is one UPDATE per record without a read, its DAH the rule's fast form (`dah.first_mining_sql`);
  a record it does not match (in a block already, creating, missing) sends the whole batch down
  the general path, which is idempotent.
- Set-mined finishes any creation left half done among its records first (it is a recovery path
  of two-phase creation) and never clears `creating` by itself.
- A pruned record is listed in each of its parents' `deleted_children` in the unit that deletes
  it, so that a replay of it cannot spend there again; its blob goes after that unit commits.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from chain import hash_to_hex
from stores.errors import StorageError, StoreError
from stores.sqldb import chunks
from stores.utxo import validate
from stores.utxo.errors import TxNotFound, UtxoError
from stores.utxo.gcpause import gc_paused
from stores.utxo.kernel import dah, marks
from stores.utxo.kernel.record import Record
from stores.utxo.sql.paged import PagedMixin

log = logging.getLogger("utxoflow.store")


class _NotFirst(Exception):
    """Some record of the batch is already in a block, or missing: take the general path."""


class StateMixin(PagedMixin):
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
        """Add (or remove) a block in each record's block list (`kernel.marks`); each record's
        block ids after the change, or TxNotFound."""
        validate.number("block_id", block_id)
        validate.height("block_height", block_height)
        validate.number("subtree_idx", subtree_idx)
        validate.txids(txids)
        height = dah.mining_height(self.height_for(), block_height)
        block = (block_id, block_height, subtree_idx)
        wanted = list(dict.fromkeys(txids))

        def first_mining(cur: Any) -> bool:
            sql = (
                f"UPDATE txs SET blocks = '[[{block_id},{block_height},{subtree_idx}]]', locked = 0, "
                f"unmined_since = NULL, delete_at_height = {dah.first_mining_sql(height, self.retention)} "
                "WHERE txid = ? AND blocks = '[]' AND creating = 0"
            )  # plain ints, validated above
            cur.executemany(self.db.q(sql), [(t,) for t in sorted(wanted)])
            if cur.rowcount != len(wanted):
                raise _NotFirst()  # roll this unit back: the general path does the whole batch
            return True

        if not unset and on_longest_chain and wanted:
            try:
                self.db.write("set_mined", first_mining)
                return [[block_id] for _t in txids]
            except _NotFirst:
                pass
        if not unset:
            self._finish_creations(wanted, block_height)

        def change(rec: Record) -> None:
            if unset:
                marks.unset_mined(rec, block_id, on_longest_chain, height, self.retention)
            else:
                marks.set_mined(rec, block, on_longest_chain, height, self.retention)

        def unit(cur: Any) -> dict[bytes, list[int]]:
            recs = self._records(cur, wanted)
            for rec in recs.values():
                change(rec)
            self._write(cur, recs.values())
            return {t: [b[0] for b in rec.block_list()] for t, rec in recs.items()}

        after = self.db.write("set_mined", unit)
        return [
            after[t] if t in after else TxNotFound(f"tx {hash_to_hex(t)} not found", txid=t) for t in txids
        ]

    def _finish_creations(self, txids: Sequence[bytes], block_height: int) -> None:
        """Finish every listed transaction whose creation was left half done — a master still
        `creating`, or no record but the lock row and blob of a creator that died."""

        def q(cur: Any) -> tuple[set[bytes], list[bytes]]:
            rows = self.db.select_in(cur, "SELECT txid, creating FROM txs WHERE txid", sorted(txids))
            return {bytes(r[0]) for r in rows}, [bytes(r[0]) for r in rows if r[1]]

        found, todo = self.db.read("set_mined", q)
        unknown = [t for t in txids if t not in found]
        if unknown and self.external.configured:
            todo += [
                bytes(r[0])
                for r in self.db.read(
                    "set_mined",
                    lambda cur: self.db.select_in(
                        cur, "SELECT txid FROM tx_locks WHERE txid", sorted(unknown)
                    ),
                )
            ]
        for t in todo:
            try:
                self.complete_creation(t, block_height)
            except StoreError as e:  # this one stays as it is (creating, or not found); the rest go on
                log.warning("set-mined could not finish the creation of tx %s: %s", hash_to_hex(t), e)

    def mark_on_longest_chain(self, txids: Sequence[bytes], on: bool) -> None:
        tip = self.height_for()
        ret = self.retention
        self._change("mark_on_longest_chain", txids,
                     lambda rec: marks.mark_on_longest_chain(rec, on, tip, ret))

    def set_locked(self, txids: Sequence[bytes], value: bool) -> None:
        height = self.height_for()
        self._change(
            "set_locked",
            txids,
            lambda rec: marks.set_locked(rec, value, height, self.retention),
            missing_ok=False,
        )

    def set_conflicting(self, txids: Sequence[bytes], value: bool) -> None:
        """Set or clear `conflicting`; a conflicting tx is listed on each parent it has."""
        validate.txids(txids)
        height = self.height_for()
        wanted = list(dict.fromkeys(txids))

        def unit(cur: Any) -> None:
            recs = self._records(cur, self._with_parents(cur, wanted))
            missing = [t for t in wanted if t not in recs]
            if missing:
                raise TxNotFound(f"tx {hash_to_hex(missing[0])} not found", txid=missing[0])
            for t in wanted:
                rec = recs[t]
                marks.set_conflicting(rec, value, height, self.retention)
                if value:
                    for p, _v in rec.inpoint_list():
                        if p in recs:  # a parent already pruned has nothing to record
                            marks.add_conflicting_child(recs[p], t)
            self._write(cur, recs.values())

        self.db.write("set_conflicting", unit)

    def _with_parents(self, cur: Any, txids: Sequence[bytes]) -> set[bytes]:
        """`txids` and their parents, found without locking (inpoints never change), so that
        every record is then locked in one pass in txid order, like every other unit."""
        rows = self.db.select_in(cur, "SELECT txid, inpoints FROM txs WHERE txid", sorted(set(txids)))
        out = set(txids)
        for _t, blob in rows:
            blob = bytes(blob)
            out.update(blob[i : i + 32] for i in range(0, len(blob), 36))
        return out

    def preserve_transactions(self, txids: Sequence[bytes], until: int) -> None:
        validate.height("until", until)
        self._change("preserve_transactions", txids, lambda rec: marks.preserve(rec, until))

    def process_expired_preservations(self, height: int) -> int:
        """Every record whose preservation ran out by `height` may go at height + retention."""
        validate.height("height", height)
        txids = self._txids_where(
            "process_expired_preservations", "preserve_until IS NOT NULL AND preserve_until <= ?", (height,)
        )

        def change(rec: Record) -> None:
            if rec.preserve_until is not None and rec.preserve_until <= height:
                marks.expire_preservation(rec, height, self.retention)

        for part in chunks(txids, 5000):
            self._change("process_expired_preservations", part, change)
        return len(txids)

    def query_old_unmined(self, cutoff: int) -> list[bytes]:
        validate.height("cutoff", cutoff)
        return self._txids_where(
            "query_old_unmined",
            "unmined_since IS NOT NULL AND unmined_since <= ? ORDER BY unmined_since, txid",
            (cutoff,),
        )

    def query_dah(self, height: int, limit: int = 1000) -> list[bytes]:
        validate.height("height", height)
        validate.number("limit", limit)
        return self._txids_where(
            "query_dah",
            "delete_at_height IS NOT NULL AND delete_at_height <= ? ORDER BY delete_at_height, txid LIMIT ?",
            (height, limit),
        )

    # -- deleting -------------------------------------------------------------------------------
    def delete_txs(self, txids: Sequence[bytes]) -> int:
        """Remove these records outright, with their pages and blobs: the undo of creations
        that must not remain (a block refused whole). Returns how many existed."""
        validate.txids(txids)

        def unit(cur: Any) -> list[Record]:
            gone = list(self._records(cur, txids).values())
            self._delete(cur, gone)
            return gone

        gone = self.db.write("delete_txs", unit) if txids else []
        self._delete_blobs(gone)
        return len(gone)

    def _delete(self, cur: Any, gone: Sequence[Record]) -> None:
        if gone:
            self._unindex_gone(cur, gone)
            # only a multi-record tx has pages, and only an unfinished creation a creation note
            keys = [(r.txid,) for r in gone if r.total_extra_recs or r.creating]
            if keys:
                cur.executemany(self.db.q("DELETE FROM tx_pages WHERE txid = ?"), keys)
                cur.executemany(self.db.q("DELETE FROM tx_creations WHERE txid = ?"), keys)
            cur.executemany(self.db.q("DELETE FROM txs WHERE id = ?"), [(r.id,) for r in gone])

    def _delete_blobs(self, gone: Sequence[Record]) -> None:
        """After the records' deletion commits (inside `fused`, at its end: a rollback would
        bring back a record naming its blob)."""

        def delete() -> None:
            for rec in gone:
                if rec.external:
                    try:
                        self.external.delete(rec.txid)
                    except StorageError as e:
                        log.warning("removed tx %s, but its blob stays: %s", hash_to_hex(rec.txid), e)

        if any(rec.external for rec in gone):
            self.db.after_commit(delete)
