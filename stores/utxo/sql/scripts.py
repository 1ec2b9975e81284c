"""The script index's entries on SQL (`stores.utxo.scripts`; table `script_utxos`): made and
ended in the write unit of the record change that makes or ends the output.

Invariants:
- An entry is (key, record id, vout): the key comes from the record's `script_keys`, so no
  change needs the transaction's bytes.
- Inserting an entry that exists, or deleting one that does not, is no error: a unit is retried
  whole, and Celery delivers a task more than once.
- A record's live slots (unspent or frozen) are exactly its entries; a spent slot has none.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Sequence
from typing import Any

from stores.utxo import slots
from stores.utxo.kernel.record import Record
from stores.utxo.records import Spend
from stores.utxo.sql.base import SqlBase

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


class ScriptIndexMixin(SqlBase):
    def _index_new(self, cur: Any, recs: Iterable[Record]) -> None:
        """Entries for new records (their ids set), masters with any pages they carry."""
        size = self.batch_size
        rows: list[Entry] = []
        unpack = _KEY.iter_unpack
        for rec in recs:
            if (not rec.pages and not rec.total_extra_recs and not rec.spent_utxos
                    and rec.total_utxos << 3 == len(rec.script_keys)):
                # (live_entries' common case, inlined: a block's create call makes thousands)
                rid = rec.id
                rows += [(k, rid, v) for v, (k,) in enumerate(unpack(rec.script_keys))]
                continue
            rows += live_entries(rec, rec, 0)
            for k, pg in rec.pages.items():
                rows += live_entries(rec, pg, k * size)
        self._index_rows(cur, rows)

    def _index_rows(self, cur: Any, rows: list[Entry]) -> None:
        if rows:
            cur.executemany(self.db.q(_INSERT), rows)

    def _entries(self, parents: dict[bytes, Record], spends: Iterable[Spend]) -> list[Entry]:
        size = self.batch_size
        out: list[Entry] = []
        key_at = _KEY.unpack_from
        for s in spends:
            p = parents.get(s.txid)
            if p is None:
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
        rows = self._entries(parents, spent)
        if rows:
            cur.executemany(self.db.q(_DELETE), rows)

    def _index_unspent(self, cur: Any, parents: dict[bytes, Record], freed: Sequence[Spend]) -> None:
        """Spends taken back: their outputs' entries come back."""
        rows = self._entries(parents, freed)
        if rows:
            cur.executemany(self.db.q(_INSERT), rows)

    def _unindex_gone(self, cur: Any, gone: Sequence[Record]) -> None:
        """Records about to be deleted: the entries of whatever they still hold unspent (read
        here: a pruned record is spent whole and has none, but a refused block's or a conflicting
        one may)."""
        ids = [r.id for r in gone]
        if not ids:
            return
        rows: list[Entry] = []
        live = {}
        for r in self.db.select_in(
            cur, "SELECT id, txid, utxos, script_keys, total_extra_recs FROM txs "
            "WHERE spent_utxos < total_utxos AND id", ids,
        ):
            rec = Record(bytes(r[1]), bytearray(r[2]), 0, 0, id=r[0], script_keys=bytes(r[3]))
            rows += live_entries(rec, rec, 0)
            if r[4]:
                live[rec.txid] = rec
        if live:
            for r in self.db.select_in(cur, "SELECT txid, page, utxos, script_keys FROM tx_pages WHERE txid",
                                       sorted(live)):
                pg = Record(bytes(r[0]), bytearray(r[2]), 0, 0, page=r[1], script_keys=bytes(r[3]))
                rows += live_entries(live[pg.txid], pg, pg.page * self.batch_size)
        if rows:
            cur.executemany(self.db.q(_DELETE), rows)
