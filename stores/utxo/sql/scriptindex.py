"""The script index's entries on SQL (`stores.utxo.scriptindex`; table `script_utxos`): made and
ended in the write unit of the record change that makes or ends the output.

Invariants:
- An entry is (key, record id, vout): the key comes from the record's `script_keys`, so no
  change needs the transaction's bytes.
- Inserting an entry that exists, or deleting one that does not, is no error: a unit is retried
  whole, and Celery delivers a task more than once.
- The table holds exactly the live slots (unspent or frozen) of the records up to the id in meta
  `script_index_at` that are not being created (a multi-record tx's entries come when its
  creation completes). With `index_lag` 0 (PostgreSQL) that is every record, kept as each
  changes. With a lag (SQLite: one writer at a time, so the mark cannot pass a record still
  being written), the newest records — up to `index_lag` of them — are left out: a query scans
  them (`tail_entries`), and every create unit that finds more moves the mark on by half the
  lag, writing the entries of what is still live then. So an output spent within ~lag/2
  records of its making (most are) never touches the table, and a query costs what the script
  owns plus a bounded scan, whatever the store holds.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from stores.utxo import slots
from stores.utxo.kernel.record import Record
from stores.utxo.sql.base import SqlBase
from stores.utxo.values import Spend

SLOT = slots.SLOT
_INSERT = "INSERT INTO script_utxos (sh, rid, vout) VALUES (?, ?, ?) ON CONFLICT DO NOTHING"
_DELETE = "DELETE FROM script_utxos WHERE sh = ? AND rid = ? AND vout = ?"
Entry = tuple[int, int, int]  # (key, record id, vout)
_KEY = struct.Struct("<q")  # a script key as `Record.script_keys` packs it


def live_entries(master: Record, rec: Record, first: int) -> list[Entry]:
    """The entries of the live slots of `rec` (the master itself, or one of its pages, whose
    first output is `first`)."""
    utxos, keys, rid = rec.utxos, rec.script_keys, master.id
    n = len(keys) >> 3
    if rec.page == 0 and not rec.total_extra_recs and rec.total_utxos == n and not rec.spent_utxos:
        # a new one-record tx without data carriers, the common case: every slot is live
        return [(k, rid, v) for v, (k,) in enumerate(_KEY.iter_unpack(keys))]
    live = slots.is_live
    return [
        (_KEY.unpack_from(keys, i * 8)[0], rid, first + i)
        for i, off in enumerate(range(0, len(utxos), SLOT)) if live(utxos, off)
    ]


AT = "script_index_at"


def _aligned(keys: bytes, packed: bytes) -> Iterator[int]:
    """The slots whose key in `keys` (8 bytes each) is `packed`."""
    at = keys.find(packed)
    while at != -1:
        if not at & 7:  # (a match across two keys is none)
            yield at >> 3
        at = keys.find(packed, at + 1)


def tail_entries(
    db: Any, cur: Any, packed: bytes, start: int, size: int, pos: tuple[int, int]
) -> list[tuple[int, int]]:
    """The live outputs with key `packed` of the records from id `start` on (those past the
    mark: see the module), after `pos`, in order — by a scan of those records' keys, pages
    included."""
    found: list[tuple[int, int]] = []
    cur.execute(db.q("SELECT id, utxos, script_keys FROM txs WHERE id >= ? AND instr(script_keys, ?) > 0"),
                (start, packed))
    for rid, utxos, keys in cur.fetchall():
        found += [(rid, i) for i in _aligned(bytes(keys), packed) if slots.is_live(utxos, i * SLOT)]
    cur.execute(
        db.q("SELECT t.id, p.page, p.utxos, p.script_keys FROM txs t JOIN tx_pages p ON p.txid = t.txid "
             "WHERE t.id >= ? AND t.total_extra_recs > 0 AND instr(p.script_keys, ?) > 0"),
        (start, packed),
    )
    for rid, page, utxos, keys in cur.fetchall():
        found += [(rid, page * size + i) for i in _aligned(bytes(keys), packed)
                  if slots.is_live(utxos, i * SLOT)]
    return sorted(e for e in found if e > pos)


class ScriptIndexMixin(SqlBase):
    index_lag: int

    def _indexed_to(self, cur: Any) -> int | None:
        """The highest record id the table holds entries for; None: every record (no lag)."""
        if not self.index_lag:
            return None
        return int(self._meta(cur, AT) or 0)

    def _index_new(self, cur: Any, recs: Iterable[Record]) -> None:
        """Entries for new records (their ids set), masters with any pages they carry — or,
        with a lag, none yet: the mark moves on instead when the unindexed records are too many."""
        if self.index_lag:
            self._catch_up(cur)
            return
        rows: list[Entry] = []
        for rec in recs:
            rows += live_entries(rec, rec, 0)
            for k, pg in rec.pages.items():
                rows += live_entries(rec, pg, k * self.batch_size)
        self._index_rows(cur, rows)

    def _index_rows(self, cur: Any, rows: list[Entry]) -> None:
        if rows:
            self._insert_entries(cur, rows)

    def _insert_entries(self, cur: Any, rows: list[Entry]) -> None:
        cur.executemany(self.db.q(_INSERT), rows)

    def _delete_entries(self, cur: Any, rows: list[Entry]) -> None:
        cur.executemany(self.db.q(_DELETE), rows)

    def _catch_up(self, cur: Any) -> None:
        """Move the mark on by half the lag once more than `index_lag` records are past it, the
        records it passes entering the table with the slots still live now."""
        at = self._indexed_to(cur) or 0
        cur.execute("SELECT COALESCE(MAX(id), 0) FROM txs")
        top = int(cur.fetchone()[0])
        if top - at <= self.index_lag:
            return
        to = top - self.index_lag // 2
        cur.execute(
            self.db.q("SELECT id, txid, utxos, script_keys, total_extra_recs, total_utxos, spent_utxos "
                      "FROM txs WHERE id > ? AND id <= ? AND creating = 0 AND spent_utxos < total_utxos"),
            (at, to),
        )
        rows: list[Entry] = []
        paged: list[Record] = []
        for rid, txid, utxos, keys, extra, total, spent in cur.fetchall():
            rec = Record(bytes(txid), bytearray(utxos), total, spent, id=rid, total_extra_recs=extra,
                         script_keys=bytes(keys))
            rows += live_entries(rec, rec, 0)
            if extra:
                paged.append(rec)
        self._index_rows(cur, rows)
        for rec in paged:
            self._index_pages(cur, rec)
        self._set_meta(cur, AT, str(to))

    def _index_pages(self, cur: Any, master: Record) -> None:
        """The entries of a multi-record tx's child pages, written a page at a time."""
        for rows in self._page_entries(cur, master):
            self._index_rows(cur, rows)

    def _page_entries(self, cur: Any, master: Record) -> Iterator[list[Entry]]:
        """The live entries of each of a multi-record tx's child pages, read one page at a time
        (a million outputs are 50 pages)."""
        sql = self.db.q(
            "SELECT page, utxos, script_keys FROM tx_pages WHERE txid = ? AND page > ? ORDER BY page LIMIT 1"
        )
        at = 0
        while True:
            cur.execute(sql, (master.txid, at))
            r = cur.fetchone()
            if r is None:
                return
            at = r[0]
            pg = Record(master.txid, bytearray(r[1]), 0, 0, page=at, script_keys=bytes(r[2]))
            yield live_entries(master, pg, at * self.batch_size)

    def _entries(
        self, parents: dict[bytes, Record], spends: Iterable[Spend], at: int | None
    ) -> list[Entry]:
        """The entries of these spent (or freed) outputs that the table covers (`at`: the mark)."""
        size = self.batch_size
        out: list[Entry] = []
        key_at = _KEY.unpack_from
        for s in spends:
            p = parents.get(s.txid)
            if p is None or (at is not None and p.id > at):
                continue
            vout = s.vout
            if not p.total_extra_recs:  # (the common case, without `locate`: the slot is there)
                out.append((key_at(p.script_keys, vout << 3)[0], p.id, vout))
                continue
            loc = p.locate(vout, size)
            if loc is not None:
                out.append((p.script_key(*loc), p.id, vout))
        return out

    def _unindex_spent(self, cur: Any, parents: dict[bytes, Record], spent: Iterable[Spend]) -> None:
        """Spends made (or made again): their outputs' entries go."""
        rows = self._entries(parents, spent, self._indexed_to(cur))
        if rows:
            self._delete_entries(cur, rows)

    def _index_unspent(self, cur: Any, parents: dict[bytes, Record], freed: Sequence[Spend]) -> None:
        """Spends taken back: their outputs' entries come back."""
        self._index_rows(cur, self._entries(parents, freed, self._indexed_to(cur)))

    def _unindex_gone(self, cur: Any, gone: Sequence[Record]) -> None:
        """Records about to be deleted: the entries of whatever they still hold unspent (read
        here: a pruned record is spent whole and has none, but a refused block's or a conflicting
        one may)."""
        at = self._indexed_to(cur) if gone else None
        ids = [r.id for r in gone if at is None or r.id <= at]
        if not ids:
            return
        rows: list[Entry] = []
        paged: list[Record] = []
        for r in self.db.select_in(
            cur, "SELECT id, txid, utxos, script_keys, total_extra_recs FROM txs "
            "WHERE spent_utxos < total_utxos AND id", ids,
        ):
            rec = Record(bytes(r[1]), bytearray(r[2]), 0, 0, id=r[0], script_keys=bytes(r[3]))
            rows += live_entries(rec, rec, 0)
            if r[4]:
                paged.append(rec)
        for rec in paged:
            for page_rows in self._page_entries(cur, rec):
                rows += page_rows
        if rows:
            self._delete_entries(cur, rows)
