"""Reads: records, spend status, outputs, the UTXO views and their totals.

Invariants:
- Reads take no locks and never change anything; every row of `txs` is read as a `Record`
  (`codec`), and every verdict on one is the kernel's (`kernel.spend.spend_status`).
- The confirmed view is exactly CONTRACT.md's: outputs of transactions mined on the best chain
  (and not conflicting) that no transaction mined on the best chain has spent. Records are
  streamed in id order and spenders looked up a chunk at a time, so memory stays constant
  however many UTXOs there are.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from chain import Tx, hash_to_hex, parse_tx
from stores.utxo import scriptindex, slots, validate
from stores.utxo.errors import Outpoint, ProcessingError, TxNotFound
from stores.utxo.kernel import spend
from stores.utxo.kernel.record import MINED_SQL, Record, meta_of, spenders
from stores.utxo.scriptindex import ScriptUtxo
from stores.utxo.sql import codec
from stores.utxo.sql.prune import PruneMixin
from stores.utxo.sql.scriptindex import tail_entries
from stores.utxo.values import OutputInfo, Spenders, SpendInfo, Standing, TxMeta
from stores.utxo.view import Segment, UtxoView, record_outputs

FIELDS = frozenset(TxMeta._fields)
SELECT_TX = f"SELECT {codec.FULL.select}, raw_format, raw FROM txs"
# A record whose multi-record creation is unfinished lists nothing until it is complete.
_CONFIRMED = f"{MINED_SQL} AND conflicting = 0 AND creating = 0"
class ReadMixin(PruneMixin, UtxoView, scriptindex.ScriptBalance):
    def get(self, txid: bytes, fields: Sequence[str] | None = None) -> TxMeta:
        validate.hash32("txid", txid)
        if fields is not None:
            unknown = set(fields) - FIELDS
            if unknown:
                raise ProcessingError(f"unknown record fields: {', '.join(sorted(unknown))}")
        with_tx = fields is None or "tx" in fields
        rows = self.db.read("get", lambda cur: self.db.select_in(cur, f"{SELECT_TX} WHERE txid", [txid]))
        if not rows:
            raise TxNotFound(f"tx {hash_to_hex(txid)} not found", txid=txid)
        r = rows[0]
        rec = codec.record(r)
        tx: Tx | None = None
        if with_tx:
            raw_format, raw = r[len(codec.RECORD_COLS)], r[len(codec.RECORD_COLS) + 1]
            if raw_format == codec.RAW_TX:
                tx = parse_tx(bytes(raw))
            elif rec.external:
                tx = self._external_tx(txid)
        return meta_of(rec, tx)

    def _outputs_of(
        self, rec: Record, raw_format: int, raw: bytes | None, vouts: list[int]
    ) -> dict[int, tuple[int, bytes]]:
        if rec.external:
            return self._external_outputs(rec.txid, vouts)
        return record_outputs(raw_format, raw)

    def existing(self, txids: Sequence[bytes], conflicting: bool = False) -> set[bytes]:
        """Those of `txids` the store holds a record of (only conflicting ones, if asked)."""
        return self._those("existing", txids, "conflicting = 1" if conflicting else "1 = 1")

    def mined(self, txids: Sequence[bytes]) -> set[bytes]:
        """Those of `txids` mined on the longest chain (`Record.mined`)."""
        return self._those("mined", txids, MINED_SQL)

    def standing(self, txids: Sequence[bytes]) -> dict[bytes, Standing]:
        validate.txids(txids)
        sql = f"SELECT txid, CASE WHEN {MINED_SQL} THEN 1 ELSE 0 END, conflicting FROM txs WHERE txid"
        keys = sorted(set(txids))
        return self.db.read("standing", lambda cur: {
            bytes(r[0]): Standing(bool(r[1]), bool(r[2])) for r in self.db.select_in(cur, sql, keys)
        })

    def _those(self, what: str, txids: Sequence[bytes], where: str) -> set[bytes]:
        """Those of `txids` whose record meets the condition `where`."""
        validate.txids(txids)
        sql = f"SELECT txid FROM txs WHERE {where} AND txid"
        return self.db.read(
            what, lambda cur: {bytes(r[0]) for r in self.db.select_in(cur, sql, sorted(set(txids)))}
        )

    def snapshot_block(self) -> tuple[int, bytes] | None:
        """(height, hash) of the block a UTXO snapshot was imported at, if one was."""
        r = self.db.read("snapshot_block", lambda cur: self._meta(cur, "snapshot_block"))
        if r is None:
            return None
        height, hexhash = r.split(":", 1)
        return int(height), bytes.fromhex(hexhash)[::-1]

    def _read_records(
        self, what: str, wanted: dict[bytes, list[int]]
    ) -> tuple[list[Any], dict[bytes, Record]]:
        """(rows with raw, their records with the pages that hold the wanted vouts)."""

        def q(cur: Any) -> tuple[list[Any], dict[bytes, Record]]:
            rows = self.db.select_in(cur, f"{SELECT_TX} WHERE txid", sorted(wanted))
            recs = {bytes(r[1]): codec.record(r) for r in rows}
            size = self.batch_size
            keys = {
                (t, v // size)
                for t, rec in recs.items()
                if rec.total_extra_recs
                for v in wanted[t]
                if v >= size
            }
            for (t, k), pg in self._pages(cur, keys, lock=False).items():
                recs[t].pages[k] = pg
            return rows, recs

        return self.db.read(what, q)

    def get_outputs(self, outpoints: Sequence[Outpoint]) -> dict[Outpoint, OutputInfo]:
        validate.outpoints(outpoints)
        wanted: dict[bytes, list[int]] = {}
        for t, v in outpoints:
            wanted.setdefault(t, []).append(v)
        rows, recs = self._read_records("get_outputs", wanted)
        n = len(codec.RECORD_COLS)
        out: dict[Outpoint, OutputInfo] = {}
        for r in rows:
            rec = recs[bytes(r[1])]
            spendable = rec.spendable()
            outputs: dict[int, tuple[int, bytes]] | None = None
            for vout in wanted[rec.txid]:
                loc = rec.locate(vout, self.batch_size)
                if loc is None:
                    continue
                h, sp_txid, sp_vin, frozen = slots.decode(bytes(loc[0].utxos[loc[1] : loc[1] + slots.SLOT]))
                assert h is not None
                if outputs is None:
                    outputs = self._outputs_of(rec, r[n], r[n + 1], wanted[rec.txid])
                sats, script = outputs.get(vout, (0, b""))
                out[(rec.txid, vout)] = OutputInfo(
                    rec.txid, vout, h, sats, script, sp_txid, sp_vin, frozen, spendable.get(vout),
                    rec.height(), rec.is_coinbase,
                )
        return out

    def spenders(self, outpoints: Sequence[Outpoint]) -> Spenders:
        validate.outpoints(outpoints)
        want = sorted(set(outpoints))
        recs = self.db.read("spenders", lambda cur: self._records(
            cur, {t for t, _v in want}, lock=False, want=want, proj=codec.SPENDS
        ))
        return spenders(recs, want, self.batch_size)

    def get_output(self, outpoint: Outpoint) -> OutputInfo | None:
        return self.get_outputs([outpoint]).get(outpoint)

    def get_spend(self, outpoint: Outpoint, utxo_hash: bytes) -> SpendInfo:
        """What a spend of the output in the next block would meet (`kernel.spend.spend_status`),
        judged at the store's current height, read afresh (another process may have moved it)."""
        validate.outpoints([outpoint])
        validate.hash32("utxo_hash", utxo_hash)

        def q(cur: Any) -> tuple[Record | None, int]:
            recs = self._records(cur, [outpoint[0]], lock=False, want=[outpoint], proj=codec.SPENDS)
            return recs.get(outpoint[0]), self._stored_height(cur)

        rec, height = self.db.read("get_spend", q)
        return spend.spend_status(rec, outpoint, utxo_hash, self.height_for(height), self.batch_size)

    def _segments(self, confirmed: bool) -> Iterator[Segment]:
        """A record's master, then each of its child pages, read one at a time (UtxoView)."""
        where = _CONFIRMED if confirmed else "conflicting = 0 AND creating = 0"
        sql = f"{SELECT_TX} WHERE {where} ORDER BY id"
        size = self.batch_size
        n = len(codec.RECORD_COLS)
        for r in self.db.stream("listing UTXOs", sql):
            rec = codec.record(r)
            yield rec, r[n + 1], r[n], 0, bytes(rec.utxos)
            if rec.total_extra_recs:
                for k, page in self._page_slots(rec.txid):
                    yield rec, r[n + 1], r[n], k * size, page

    def _confirming(self, txids: set[bytes]) -> set[bytes]:
        """Those spenders the store holds mined on the best chain (`UtxoView`)."""
        return self._those("spender lookup", sorted(txids), MINED_SQL)

    # -- the script index ------------------------------------------------------------------------
    def script_utxos(
        self, scripthash: bytes, *, after: str | None = None, limit: int = 1000, confirmed: bool = False
    ) -> tuple[list[ScriptUtxo], str | None]:
        """A page of the unspent outputs of the script with this hash (`stores.utxo.scriptindex`),
        and the cursor after it (None: the last page)."""
        validate.hash32("scripthash", scripthash)
        scriptindex.check_limit(limit)
        key, pos = scriptindex.script_key(scripthash), scriptindex.parse_cursor(after)
        out: list[ScriptUtxo] = []
        while len(out) < limit:
            want = limit - len(out)

            def page(cur: Any, at: tuple[int, int] = pos, n: int = want) -> list[tuple[int, int]]:
                return self._script_entries(cur, key, scripthash[:8], at, n)

            entries = self.db.read("script index", page)
            out += self._script_listed(entries, scripthash, confirmed)
            if len(entries) < want:
                return out, None
            pos = entries[-1]
        return out, scriptindex.cursor(pos)

    def _script_entries(
        self, cur: Any, key: int, packed: bytes, pos: tuple[int, int], n: int
    ) -> list[tuple[int, int]]:
        """Up to `n` entries (record id, vout) after `pos`, in order: the table's, then — with a
        lag — those of the newest records, found by a scan of them (one read: the mark cannot
        move between the two)."""
        at = self._indexed_to(cur)
        cur.execute(
            self.db.q("SELECT rid, vout FROM script_utxos WHERE sh = ? AND (rid > ? OR (rid = ? AND "
                      "vout > ?)) ORDER BY rid, vout LIMIT ?"),
            (key, pos[0], pos[0], pos[1], n),
        )
        got = [(int(r[0]), int(r[1])) for r in cur.fetchall()]
        if at is None or len(got) >= n:
            return got
        tail = tail_entries(self.db, cur, packed, max(at + 1, pos[0]), self.batch_size, pos)
        return got + tail[: n - len(got)]

    def _script_listed(
        self, entries: list[tuple[int, int]], scripthash: bytes, confirmed: bool
    ) -> list[ScriptUtxo]:
        """What these entries show (`scriptindex.listed`), in their order, read from their records."""
        if not entries:
            return []
        rows = self.db.read("script index records", lambda cur: self.db.select_in(
            cur, f"{SELECT_TX} WHERE id", sorted({rid for rid, _v in entries})
        ))
        n = len(codec.RECORD_COLS)
        recs = {int(r[0]): (codec.record(r), r[n], r[n + 1]) for r in rows}
        vouts: dict[int, list[int]] = {}
        for rid, v in entries:
            vouts.setdefault(rid, []).append(v)
        outputs = {
            rid: self._outputs_of(rec, fmt, raw, vouts[rid]) for rid, (rec, fmt, raw) in recs.items()
            if not (rec.conflicting or rec.creating)
        }
        out: list[ScriptUtxo] = []
        for rid, v in entries:
            got = recs.get(rid)
            u = scriptindex.listed(
                got and got[0], v, outputs.get(rid, {}).get(v), scripthash, scriptindex.cursor((rid, v)),
                self.batch_size,
            )
            if u is not None and (u.confirmed or not confirmed):
                out.append(u)
        return out

