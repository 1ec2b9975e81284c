"""Pruning on SQL: deleting the records whose delete-at-height has come (Teranode's pruner service,
phase 2), one chunk per write unit. The rules are the kernel's (`kernel.dah.is_due`, `spenders`,
`stable_spender`, `kernel.marks.add_deleted_child`); this module only loads, locks and writes.

Invariants:
- A record goes only if it is still due under lock: a DAH cleared between the query and the
  unit (a preservation, a reorg's unspend) keeps it.
- Each parent that stays learns of the deleted child (`deleted_children`) in the unit that
  deletes the child, so a replay of the child can never spend there again. A parent deleted in
  the same unit needs no note.
- A multi-record transaction goes whole: its pages (and any creation note) with its master.
- Crash-safe order for external records: the blob is removed first, while the record is locked
  and still due, and the record's deletion commits after. A failure to remove the blob (other
  than "missing") keeps the record for the next run. A crash between the two leaves a record
  that is still due and names a blob already gone: the next run finds the blob missing, which
  is fine, and deletes the record. The reverse order could leave a blob that nothing names, for
  ever.
- Defensive mode keeps a record while any spender of its outputs is unmined, or mined in a
  block above the stable height; a spender that is gone counts as stable only when the record
  lists it as pruned.
  Spenders are read without a lock: the pruner does not run during a reorg, and the retention
  is the first line of defence; this mode is the second.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any

from chain import hash_to_hex
from stores.errors import StorageError
from stores.utxo import validate
from stores.utxo.kernel import dah, marks
from stores.utxo.kernel.record import Record
from stores.utxo.sql import codec
from stores.utxo.sql.marks import StateMixin
from stores.utxo.values import PruneResult

log = logging.getLogger("utxoflow.store")

Cursor = tuple[int, int]  # (delete-at-height, id) of the last record a page or unit looked at
# due at a height, after a cursor, in cursor order (the `txs_dah_id` index: no sort), a page
_DUE_AFTER = (
    "delete_at_height IS NOT NULL AND delete_at_height <= ? "
    "AND (delete_at_height > ? OR (delete_at_height = ? AND id > ?)) ORDER BY delete_at_height, id LIMIT ?"
)


def _after(cursor: Cursor | None) -> tuple[int, int, int]:
    dah, rid = cursor if cursor is not None else (-1, -1)
    return dah, dah, rid

# What a prune reads of a record it may delete, of a parent that stays (it learns of the deleted
# child), and, in defensive mode, of a spender (enough for `Record.mined` and its block list).
# A due record is also read as a spender in defensive mode (a unit may hold parent and child).
_DUE = codec.Projection((
    "id", "txid", "delete_at_height", "external", "creating", "total_extra_recs", "inpoints",
    "deleted_children",
))  # fmt: skip
_DEFENSIVE = codec.Projection((*_DUE.cols, "unmined_since", "blocks", "utxos"))
_PARENT = codec.Projection(("id", "txid", "total_extra_recs", "deleted_children"))
_SPENDER = codec.Projection(("id", "txid", "unmined_since", "blocks", "total_extra_recs"))


class PruneMixin(StateMixin):
    def due_page(
        self, height: int, after: Cursor | None = None, limit: int = 1000
    ) -> tuple[list[bytes], Cursor | None]:
        """Txids of records due at `height`, in delete-at-height order, after the cursor `after`;
        and the cursor to go on from (None: none is left). A run pages through them, so records
        it keeps are not met again."""
        validate.height("height", height)
        validate.number("limit", limit)

        def q(cur: Any) -> tuple[list[bytes], Cursor | None]:
            cur.execute(self.db.q(f"SELECT txid, delete_at_height, id FROM txs WHERE {_DUE_AFTER}"),
                        (height, *_after(after), limit))
            rows = cur.fetchall()
            return [bytes(r[0]) for r in rows], ((int(rows[-1][1]), int(rows[-1][2])) if rows else None)

        return self.db.read("due_page", q)

    def parents_of(self, txids: Sequence[bytes]) -> set[bytes]:
        """The txids these records spend from (their inpoints' parents; missing records have none)."""
        validate.txids(txids)

        def q(cur: Any) -> set[bytes]:
            out: set[bytes] = set()
            rows = self.db.select_in(cur, "SELECT txid, inpoints FROM txs WHERE txid", sorted(set(txids)))
            for _t, blob in rows:
                blob = bytes(blob)
                out.update(blob[i : i + 32] for i in range(0, len(blob), 36))
            return out

        return self.db.read("parents_of", q) if txids else set()

    def delete_expired(self, txids: Sequence[bytes], height: int) -> int:
        """Prune those of these records that are due at `height` (see `prune`); how many went."""
        return self.prune(txids, height).deleted

    def prune(self, txids: Sequence[bytes], height: int, stable_at: int | None = None) -> PruneResult:
        """Delete those of `txids` whose delete-at-height is at or below `height`, in one unit
        (see the invariants); `stable_at` set turns defensive mode on, spenders counting as
        stable when mined at or below it."""
        validate.height("height", height)
        validate.txids(txids)
        if stable_at is not None:
            validate.height("stable_at", stable_at)
        if not txids:
            return PruneResult()
        return self.db.write("prune", lambda cur: self._prune_unit(cur, txids, height, stable_at))

    def prune_next(
        self, height: int, after: Cursor | None, limit: int, stable_at: int | None = None
    ) -> tuple[PruneResult, Cursor | None]:
        """`prune` of the next `limit` records due at `height` after the cursor `after`, found by
        the unit itself under its lock (one read fewer than `due_page` then `prune`); the result
        and the cursor to go on from (None: none is left)."""
        validate.height("height", height)
        validate.number("limit", limit)
        if stable_at is not None:
            validate.height("stable_at", stable_at)
        proj = _DEFENSIVE if stable_at is not None else _DUE

        def unit(cur: Any) -> tuple[PruneResult, Cursor | None]:
            cur.execute(
                self.db.q(f"SELECT {proj.select} FROM txs WHERE {_DUE_AFTER}{self.db.for_update}"),
                (height, *_after(after), limit),
            )
            recs = {rec.txid: rec for rec in map(proj.decode, cur.fetchall())}
            if not recs:
                return PruneResult(), None
            last = next(reversed(recs.values()))
            assert last.delete_at_height is not None
            result = self._prune_loaded(cur, recs, list(recs), height, stable_at)
            return result, (last.delete_at_height, last.id)

        return self.db.write("prune", unit)

    def _prune_unit(
        self, cur: Any, txids: Sequence[bytes], height: int, stable_at: int | None
    ) -> PruneResult:
        wanted = sorted(set(txids))
        # the records (with their slots only when defensive mode reads their spenders)
        recs = self._records(cur, wanted, proj=_DEFENSIVE if stable_at is not None else _DUE)
        return self._prune_loaded(cur, recs, wanted, height, stable_at)

    def _prune_loaded(
        self, cur: Any, recs: dict[bytes, Record], wanted: list[bytes], height: int, stable_at: int | None
    ) -> PruneResult:
        """The unit's work once the records asked for are loaded and locked."""
        out = PruneResult()
        # the parents that may stay (they learn of the deleted children): locked too
        parents = set().union(*(rec.parent_txids() for rec in recs.values())) - recs.keys()
        if parents:
            recs.update(self._records(cur, parents, proj=_PARENT))
        due = [recs[t] for t in wanted if t in recs and dah.is_due(recs[t], height)]
        out.not_due = len(wanted) - len(due)
        if stable_at is not None and due:
            due = self._defensive(cur, due, stable_at, out)
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
        gone = {rec.txid for rec in going}
        for rec in going:
            for p in rec.parent_txids():
                if p in recs and p not in gone:
                    marks.add_deleted_child(recs[p], rec.txid)
        self._write(cur, [r for t, r in recs.items() if t not in gone])
        self._delete(cur, going)
        cur.execute(self.db.q("DELETE FROM tx_locks WHERE expires_at <= ?"), (int(time.time() * 1000),))
        out.deleted = len(going)
        return out

    def _defensive(self, cur: Any, due: list[Record], stable_at: int, out: PruneResult) -> list[Record]:
        """Those of `due` whose every spender is stable (see the invariants)."""
        found: dict[bytes, Record] = {rec.txid: rec for rec in due}
        paged = [(r.txid, k) for r in due if r.total_extra_recs for k in range(1, r.total_extra_recs + 1)]
        for (t, _k), pg in self._pages(cur, paged).items():
            found[t].pages[pg.page] = pg
        kids = {rec.txid: dah.spenders(rec) for rec in due}
        wanted = set().union(*kids.values()) - found.keys()
        if wanted:
            found.update(self._records(cur, wanted, lock=False, proj=_SPENDER))
        keep: list[Record] = []
        for rec in due:
            pruned = set(rec.children("deleted_children"))
            if all(k in pruned or dah.stable_spender(found.get(k), stable_at) for k in kids[rec.txid]):
                keep.append(rec)
            else:
                out.defensive_kept += 1
        return keep
