"""Pruning on Aerospike: deleting the records whose delete-at-height has come (Teranode's pruner
service, phase 2), expired preservations and old unmined transactions. The rules are the kernel's
(`kernel.dah.is_due`, `spenders`, `stable_spender`; `kernel.marks.add_deleted_child` and
`expire_preservation` as the Lua module's `add_child` and `set_state`); this module finds, reads and
removes. There is no lock across records: each step below is atomic per record, and the order of the
steps is what keeps a crash or a race harmless.

Invariants:
- Due records are found by the secondary index on `deleteAtHeight` (only masters carry it) and
  walked in (delete-at-height, txid) order; the cursor is the last pair a page returned, so a
  run meets each due record once, whatever the query's own order.
- A record goes only if it is due when read, and its master is removed only if it is still due
  then (a remove filtered on `deleteAtHeight`, atomic on the server): a DAH cleared since the
  query keeps it (`not_due`).
- Per record, in this order: its blob (a failure other than "missing" keeps the record for the
  next run), a note of it on each parent that stays (`deletedChildren` on the master and each of
  its pages, which spends of page outputs check), its child pages, its master last. A crash
  anywhere leaves a master that is still due and names what is left, and the next run redoes
  each step idempotently (a missing blob or page is fine, a note is listed once). A parent
  removed in the same call needs no note.
- A DAH cleared between the read and the master's filtered remove (only a reorg or a
  preservation does that: the pruner runs neither during a reorg nor beside its own preserve
  phase) keeps a master whose blob or pages may already be gone, listed on its parents.
- Defensive mode keeps a record while any spender of its outputs is unmined, or mined in a
  block above the stable height; a spender that is gone counts as stable only when the record
  lists it as pruned. Spenders are read as they are (see the SQL backend's prune module).
- An expired preservation is expired by a Lua call filtered on `preserveUntil` at or below the
  height, so a preservation renewed since the query stays.
"""

from __future__ import annotations

import heapq
import logging
from collections.abc import Iterator, Sequence
from typing import Any

from chain import hash_to_hex
from stores.errors import StorageError
from stores.utxo import validate
from stores.utxo.aerospike import codec
from stores.utxo.aerospike.client import Key, chunked
from stores.utxo.aerospike.create import CreateMixin
from stores.utxo.kernel import dah
from stores.utxo.kernel.record import Record
from stores.utxo.values import PruneResult

log = logging.getLogger("utxoflow.store")

Cursor = tuple[int, bytes]  # (delete-at-height, txid) of the last record a page returned
# a filtered batch operation: ("remove", key, [], policy) or (Lua function, key, args, policy)
FilteredOp = tuple[str, Key, list[Any], dict[str, Any]]
FILTERED_OUT = 27  # a batch operation's result code when its filter expression is false
# What a prune reads of a record it may delete; in defensive mode also what `Record.mined` and
# `dah.spenders` need (a due record may be the spender of another in the same call).
_DUE = ("txid", "deleteAtHeight", "external", "totalExtraRecs", "inpoints", "deletedChildren")
_DEFENSIVE = (*_DUE, "utxos", "unminedSince", *codec.BLOCK_BINS)
_SPENDER = ("txid", "unminedSince", *codec.BLOCK_BINS)


def _at_most(bin_name: str, value: int) -> Any:
    """The compiled filter `bin <= value` (false for a record without the bin)."""
    from aerospike_helpers.expressions import base as exp

    return exp.LE(exp.IntBin(bin_name), value).compile()


class PruneMixin(CreateMixin):
    # -- finding ---------------------------------------------------------------------------------
    def _due(self, height: int, after: Cursor | None) -> Iterator[Cursor]:
        """(delete-at-height, txid) of every master due at `height` after the cursor, unordered."""
        from aerospike import predicates

        lo = 0 if after is None else after[0]
        if lo > height:
            return
        where = predicates.between("deleteAtHeight", lo, height)
        for b in self._query("finding due records", ["txid", "deleteAtHeight"], where=where):
            row = (int(b["deleteAtHeight"]), bytes(b["txid"]))
            if after is None or row > after:
                yield row

    def query_dah(self, height: int, limit: int = 1000) -> list[bytes]:
        return self.due_page(height, None, limit)[0]

    def due_page(
        self, height: int, after: Cursor | None = None, limit: int = 1000
    ) -> tuple[list[bytes], Cursor | None]:
        """Txids of records due at `height`, in (delete-at-height, txid) order, after the cursor
        `after`; and the cursor to go on from (None: none is left). Each page queries afresh
        and keeps only the `limit` smallest (the query itself is unordered)."""
        validate.height("height", height)
        validate.number("limit", limit)
        rows = heapq.nsmallest(limit, self._due(height, after))
        return [t for _d, t in rows], (rows[-1] if rows else None)

    def parents_of(self, txids: Sequence[bytes]) -> set[bytes]:
        """The txids these records spend from (their inpoints' parents; missing records have none)."""
        validate.txids(txids)
        recs = self._masters(txids, ["txid", "inpoints"])
        return set().union(*(rec.parent_txids() for rec in recs.values()))

    def query_old_unmined(self, cutoff: int) -> list[bytes]:
        validate.height("cutoff", cutoff)
        old = _at_most("unminedSince", cutoff)
        found = self._query("finding old unmined records", ["txid", "unminedSince"], expression=old)
        return [t for _h, t in sorted((int(b["unminedSince"]), bytes(b["txid"])) for b in found)]

    # -- pruning -----------------------------------------------------------------------------------
    def delete_expired(self, txids: Sequence[bytes], height: int) -> int:
        """Prune those of these records that are due at `height` (see `prune`); how many went."""
        return self.prune(txids, height).deleted

    def prune_next(
        self, height: int, after: Cursor | None, limit: int, stable_at: int | None = None
    ) -> tuple[PruneResult, Cursor | None]:
        """`prune` of the next `limit` records due at `height` after the cursor `after`; the
        result and the cursor to go on from (None: none is left). No lock to find them under:
        `prune` reads each afresh."""
        validate.height("height", height)
        validate.number("limit", limit)
        if stable_at is not None:
            validate.height("stable_at", stable_at)
        page, cursor = self.due_page(height, after, limit)
        if not page:
            return PruneResult(), None
        return self.prune(page, height, stable_at), cursor

    def prune(self, txids: Sequence[bytes], height: int, stable_at: int | None = None) -> PruneResult:
        """Delete those of `txids` whose delete-at-height is at or below `height` (see the
        invariants); `stable_at` set turns defensive mode on, spenders counting as stable when
        mined at or below it."""
        validate.height("height", height)
        validate.txids(txids)
        if stable_at is not None:
            validate.height("stable_at", stable_at)
        out = PruneResult()
        if not txids:
            return out
        wanted = sorted(set(txids))
        recs = self._masters(wanted, _DEFENSIVE if stable_at is not None else _DUE)
        due = [recs[t] for t in wanted if t in recs and dah.is_due(recs[t], height)]
        out.not_due = len(wanted) - len(due)
        if stable_at is not None and due:
            due = self._defensive(due, stable_at, out)
        going: list[Record] = []
        for rec in due:
            if rec.external:
                try:
                    self.external.delete(rec.txid)
                except StorageError as e:
                    out.blob_kept += 1
                    log.warning("tx %s stays until its blob can be removed: %s", hash_to_hex(rec.txid), e)
                    continue
                out.blobs_deleted += 1
            going.append(rec)
        if not going:
            return out
        self._note_deleted(going)
        self._remove([self.key(r.txid, k) for r in going for k in range(1, r.total_extra_recs + 1)])
        still_due = {"expressions": _at_most("deleteAtHeight", height)}
        masters: list[FilteredOp] = [("remove", self.key(r.txid), [], still_due) for r in going]
        removed = self._filtered("deleting records", masters)
        out.deleted = sum(removed)
        out.not_due += len(going) - out.deleted
        return out

    def _defensive(self, due: list[Record], stable_at: int, out: PruneResult) -> list[Record]:
        """Those of `due` whose every spender is stable (see the invariants)."""
        paged = [(r, k) for r in due for k in range(1, r.total_extra_recs + 1)]
        pages = self._read_bins([self.key(r.txid, k) for r, k in paged], ["txid", "page", "utxos"])
        for (rec, k), bins in zip(paged, pages):
            # a page already gone went with a run that judged the record and crashed before
            # its master: its spenders were stable then
            if bins is not None:
                rec.pages[k] = codec.from_bins(bins)
        found: dict[bytes, Record] = {rec.txid: rec for rec in due}
        kids = {rec.txid: dah.spenders(rec) for rec in due}
        wanted = set().union(*kids.values()) - found.keys()
        if wanted:
            found.update(self._masters(sorted(wanted), _SPENDER))
        keep: list[Record] = []
        for rec in due:
            pruned = set(rec.children("deleted_children"))
            if all(k in pruned or dah.stable_spender(found.get(k), stable_at) for k in kids[rec.txid]):
                keep.append(rec)
            else:
                out.defensive_kept += 1
        return keep

    def _note_deleted(self, going: Sequence[Record]) -> None:
        """List each record that goes on its parents that stay: their masters and every page
        (`add_child` lists a txid once, so a run after a crash may list it again)."""
        gone = {rec.txid for rec in going}
        parents = self._masters(
            sorted(set().union(*(rec.parent_txids() for rec in going)) - gone), ["txid", "totalExtraRecs"]
        )
        calls: list[tuple[Key, str, list[Any]]] = [
            (self.key(p, k), "add_child", ["deleted", rec.txid])
            for rec in going
            for p in sorted(rec.parent_txids())
            if p in parents
            for k in range(parents[p].total_extra_recs + 1)
        ]
        self._apply_each(calls)  # a parent (or page) gone meanwhile answers TX_NOT_FOUND: nothing to note

    def _filtered(self, what: str, ops: Sequence[FilteredOp]) -> list[bool]:
        """Batch operations that each carry a filter (`policy["expressions"]`), checked by the
        server under the record's lock. Per operation, whether it ran: False when the record is
        missing or no longer passes the filter."""
        from aerospike import exception as aex
        from aerospike_helpers.batch import records as br

        def batch_op(fn: str, key: Key, args: list[Any], policy: dict[str, Any]) -> Any:
            if fn == "remove":
                return br.Remove(key, policy=policy)
            return br.Apply(key, self.conn.module, fn, args, policy=policy)

        out: list[bool] = []
        try:
            for part in chunked(ops):
                done = self.conn.client.batch_write(br.BatchRecords([batch_op(*op) for op in part]))
                for r in done.batch_records:
                    if r.result not in (0, 2, FILTERED_OUT):  # 2: not found
                        raise StorageError(f"{what} on {self.url_safe} failed: result code {r.result}")
                    bins = r.record[2] if r.record is not None else None
                    if bins and "FAILURE" in bins:
                        raise StorageError(f"{what} on {self.url_safe} failed: {bins['FAILURE']}")
                    out.append(r.result == 0)
        except aex.AerospikeError as e:
            raise self._fail(what, e) from e
        return out

    # -- preservations and outright deletion -------------------------------------------------------
    def process_expired_preservations(self, height: int) -> int:
        """Every record whose preservation ran out by `height` may go at height + retention."""
        validate.height("height", height)
        ran_out = {"expressions": _at_most("preserveUntil", height)}
        found = self._query("finding expired preservations", ["txid"], expression=ran_out["expressions"])
        txids = sorted({bytes(b["txid"]) for b in found})
        args: list[Any] = ["expire", 0, height, self.retention]
        self._filtered("expiring preservations", [("set_state", self.key(t), args, ran_out) for t in txids])
        return len(txids)

    def delete_txs(self, txids: Sequence[bytes]) -> int:
        """Remove these records outright, with their pages and blobs: the undo of creations
        that must not remain (a block refused whole). Returns how many existed. Pages before
        the master, blobs last (as SQL: a record never names a missing blob)."""
        validate.txids(txids)
        if not txids:
            return 0
        recs = self._masters(txids, ["txid", "totalExtraRecs", "external"])
        self._remove([self.key(t, k) for t, r in recs.items() for k in range(1, r.total_extra_recs + 1)])
        n = self._remove([self.key(t) for t in recs])
        for rec in recs.values():
            if rec.external:
                try:
                    self.external.delete(rec.txid)
                except StorageError as e:
                    log.warning("removed tx %s, but its blob stays: %s", hash_to_hex(rec.txid), e)
        return n
